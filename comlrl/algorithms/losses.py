"""Token log-probs and policy-gradient losses: pure functions with explicit masks.

Shapes: B sequences, C completion positions. ``mask`` is 1 on tokens the agent generated
(up to and including its EOS), 0 on padding; prompt tokens never enter these tensors.
"""

from __future__ import annotations

import torch

# loss_type -> the normalization it names (TRL's names beside comlrl's)
LOSS_NORMALIZATIONS = {
    "token_mean": "token_mean",
    "dapo": "token_mean",
    "seq_mean_token_mean": "seq_mean_token_mean",
    "grpo": "seq_mean_token_mean",
    "seq_sum": "seq_sum",
    "dr_grpo": "dr_grpo",
    "bnpo": "bnpo",
}


def token_logprobs(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """log p(labels) from logits: (B, C, V), (B, C) -> (B, C), without storing a full log-softmax."""
    logits = logits.float()
    picked = logits.gather(-1, labels.unsqueeze(-1)).squeeze(-1)  # (B, C)
    return picked - torch.logsumexp(logits, dim=-1)


def token_entropy(logits: torch.Tensor) -> torch.Tensor:
    """Entropy in nats of the categorical softmax(logits) at each position: (..., V) -> (...), fp32.

    H = -sum_v p_v log p_v = logsumexp(z) - sum_v p_v z_v; a -inf logit (a token with probability 0) adds 0.
    """
    z = logits.float()
    logp = z - torch.logsumexp(z, dim=-1, keepdim=True)
    p = logp.exp()
    return -torch.where(p > 0, p * logp, torch.zeros_like(p)).sum(dim=-1)


def loss_weights(
    masks: list[torch.Tensor], loss_type: str, groups: list | None = None, max_completion_length: int | None = None
) -> list[torch.Tensor]:
    """Per-token weights w such that loss = sum(w * per_token_loss) over all batches.

    Computed over *all* sequences of an update (several batches, e.g. turns or accumulated rollouts), so splitting
    the update into micro-batches does not change it. token_mean / dapo: 1/total tokens. seq_mean_token_mean / grpo:
    1/(n_seq * len_seq). seq_sum: 1/n_seq. dr_grpo: 1/(n_seq * max_completion_length). bnpo: token_mean within each
    group, groups averaged (needs ``groups``).
    ``groups``: one key per batch; each group's batches are normalized among themselves and every group weighs
    1/number of groups in total (e.g. the turns of a step, to weigh each turn alike).
    """
    if loss_type not in LOSS_NORMALIZATIONS:
        raise ValueError(f"unknown loss_type '{loss_type}'; valid: {', '.join(LOSS_NORMALIZATIONS)}")
    kind = LOSS_NORMALIZATIONS[loss_type]
    if groups is not None:
        if len(groups) != len(masks):
            raise ValueError(f"{len(groups)} group keys for {len(masks)} batches")
        keys = list(dict.fromkeys(groups))
        out: list[torch.Tensor] = [torch.empty(0)] * len(masks)
        for key in keys:
            idx = [i for i, g in enumerate(groups) if g == key]
            inner = "token_mean" if kind == "bnpo" else loss_type
            for i, w in zip(idx, loss_weights([masks[i] for i in idx], inner, None, max_completion_length)):
                out[i] = w / len(keys)
        return out
    if kind == "bnpo":
        raise ValueError("loss_type 'bnpo' normalizes within groups of batches: pass groups=")
    masks = [m.float() for m in masks]
    n_seq = max(sum(m.shape[0] for m in masks), 1)
    if kind == "token_mean":
        total = max(float(sum(m.sum() for m in masks)), 1.0)
        return [m / total for m in masks]
    if kind == "seq_mean_token_mean":
        return [m / (m.sum(dim=1, keepdim=True).clamp(min=1.0) * n_seq) for m in masks]
    if kind == "dr_grpo":
        if not max_completion_length:
            raise ValueError("loss_type 'dr_grpo' needs max_completion_length")
        return [m / (n_seq * max_completion_length) for m in masks]
    return [m / n_seq for m in masks]  # seq_sum


def policy_loss(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    advantages: torch.Tensor,
    *,
    weights: torch.Tensor,
    epsilon: float = 0.2,
    ref_logp: torch.Tensor | None = None,
    beta: float = 0.0,
    rollout_logp: torch.Tensor | None = None,
    is_cap: float = 2.0,
    epsilon_high: float | None = None,
    sampler_logp: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Clipped policy-gradient loss (PPO/GRPO objective) summed with per-token ``weights``.

    logp, old_logp, weights: (B, C); advantages: (B,). With old_logp == logp.detach() the ratio is 1 and the
    gradient is the REINFORCE estimator -sum_t w_t * A * grad log p_t.
    KL to the reference uses the k3 estimator exp(ref - logp) - (ref - logp) - 1 (Schulman 2020).
    ``rollout_logp`` (B, C): the log-probs the tokens were sampled with, when that policy differs numerically from
    the one ``old_logp`` scores (e.g. a bf16 rollout of fp32 weights): each token's policy term is weighted by the
    truncated importance weight min(exp(old_logp - rollout_logp), is_cap) (Yao et al. 2025, "TIS").
    ``sampler_logp`` (B, C): old_logp's policy as the rollout sampled from it (repetition penalty, top-k, top-p,
    renormalized over the kept tokens; -inf where they drop the token), when ``rollout_logp`` is under that
    processing too: the weight is then min(exp(sampler_logp - rollout_logp), is_cap), 0 for a dropped token
    (metric ``rollout_is_filtered``, left out of ``rollout_kl``). None: old_logp (no processing but the temperature).
    ``epsilon_high``: the ratio's upper clip is 1 + epsilon_high (DAPO's asymmetric clip-higher); None: epsilon.
    Returns (loss, metrics) where metrics are weighted sums over this batch (detached).
    """
    adv = advantages.unsqueeze(1)  # (B, 1)
    ratio = torch.exp(logp - old_logp)
    pg1 = -adv * ratio
    high = epsilon if epsilon_high is None else epsilon_high
    pg2 = -adv * torch.clamp(ratio, 1.0 - epsilon, 1.0 + high)
    per_token = torch.maximum(pg1, pg2)
    metrics = {
        "clip_frac": ((pg2 > pg1).float() * weights).sum().detach(),
        "approx_kl_old": ((old_logp - logp) * weights).sum().detach(),
    }
    if rollout_logp is not None:
        # Both sides under one processing: a filtered rollout's log-prob against the trainer's full softmax would
        # weigh every token by its nucleus mass, and rollout_kl would measure the filter, not the engines' mismatch.
        train = (old_logp if sampler_logp is None else sampler_logp).detach()
        raw = torch.exp(train - rollout_logp).detach()
        is_weight = raw.clamp(max=is_cap)
        per_token = per_token * is_weight
        metrics["rollout_is_weight"] = (is_weight * weights).sum()
        metrics["rollout_is_capped"] = ((raw > is_cap).float() * weights).sum()
        kept = torch.isfinite(train)
        log_ratio = torch.where(kept, rollout_logp - train, torch.zeros_like(train))
        metrics["rollout_kl"] = (log_ratio * weights).sum().detach()  # KL(rollout || train), k1
        if sampler_logp is not None:
            metrics["rollout_is_filtered"] = ((~kept).float() * weights).sum()
    metrics["pg_loss"] = (per_token * weights).sum().detach()
    if ref_logp is not None and beta > 0:
        delta = ref_logp - logp
        kl = torch.exp(delta) - delta - 1.0
        per_token = per_token + beta * kl
        metrics["kl"] = (kl * weights).sum().detach()
    return (per_token * weights).sum(), metrics


def value_loss(
    values: torch.Tensor, old_values: torch.Tensor, targets: torch.Tensor, clip: float | None = None
) -> torch.Tensor:
    """0.5 * mean (V - target)^2, optionally PPO-clipped around the values before the update.

    values, old_values, targets: same shape (broadcastable). With ``clip``:
    0.5 * mean max((V - T)^2, (V_old + clamp(V - V_old, -clip, clip) - T)^2).
    """
    err = (values - targets) ** 2
    if clip is not None:
        clipped = old_values + torch.clamp(values - old_values, -clip, clip)
        err = torch.maximum(err, (clipped - targets) ** 2)
    return 0.5 * err.mean()
