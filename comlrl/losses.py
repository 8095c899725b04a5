"""Token log-probs and policy-gradient losses: pure functions with explicit masks.

Shapes: B sequences, C completion positions. ``mask`` is 1 on tokens the agent generated
(up to and including its EOS), 0 on padding; prompt tokens never enter these tensors.
"""

from __future__ import annotations

import torch


def token_logprobs(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """log p(labels) from logits: (B, C, V), (B, C) -> (B, C), without storing a full log-softmax."""
    logits = logits.float()
    picked = logits.gather(-1, labels.unsqueeze(-1)).squeeze(-1)  # (B, C)
    return picked - torch.logsumexp(logits, dim=-1)


def loss_weights(masks: list[torch.Tensor], loss_type: str) -> list[torch.Tensor]:
    """Per-token weights w such that loss = sum(w * per_token_loss) over all batches.

    Computed over *all* sequences of an update (several batches, e.g. turns or accumulated steps),
    so splitting the update into micro-batches does not change it.
    token_mean: 1/total tokens. seq_mean_token_mean: 1/(n_seq * len_seq). seq_sum: 1/n_seq.
    """
    masks = [m.float() for m in masks]
    n_seq = max(sum(m.shape[0] for m in masks), 1)
    if loss_type == "token_mean":
        total = max(float(sum(m.sum() for m in masks)), 1.0)
        return [m / total for m in masks]
    if loss_type == "seq_mean_token_mean":
        return [m / (m.sum(dim=1, keepdim=True).clamp(min=1.0) * n_seq) for m in masks]
    if loss_type == "seq_sum":
        return [m / n_seq for m in masks]
    raise ValueError(f"unknown loss_type '{loss_type}'; valid: token_mean, seq_mean_token_mean, seq_sum")


def policy_loss(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    advantages: torch.Tensor,
    weights: torch.Tensor,
    epsilon: float = 0.2,
    ref_logp: torch.Tensor | None = None,
    beta: float = 0.0,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Clipped policy-gradient loss (PPO/GRPO objective) summed with per-token ``weights``.

    logp, old_logp, weights: (B, C); advantages: (B,). With old_logp == logp.detach() the ratio is 1 and the
    gradient is the REINFORCE estimator -sum_t w_t * A * grad log p_t.
    KL to the reference uses the k3 estimator exp(ref - logp) - (ref - logp) - 1 (Schulman 2020).
    Returns (loss, metrics) where metrics are weighted sums over this batch (detached).
    """
    adv = advantages.unsqueeze(1)  # (B, 1)
    ratio = torch.exp(logp - old_logp)
    pg1 = -adv * ratio
    pg2 = -adv * torch.clamp(ratio, 1.0 - epsilon, 1.0 + epsilon)
    per_token = torch.maximum(pg1, pg2)
    metrics = {
        "pg_loss": (per_token * weights).sum().detach(),
        "clip_frac": ((pg2 > pg1).float() * weights).sum().detach(),
        "approx_kl_old": ((old_logp - logp) * weights).sum().detach(),
    }
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
