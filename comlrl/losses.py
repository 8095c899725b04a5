"""Token log-probs and policy-gradient losses: pure functions with explicit masks.

Shapes: B sequences, C completion positions. ``mask`` is 1 on tokens the agent generated
(up to and including its EOS), 0 on padding; prompt tokens never enter these tensors.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from .shapes import pad_rows

# loss_type -> the normalization it names (TRL's names beside comlrl's)
LOSS_NORMALIZATIONS = {
    "token_mean": "token_mean", "dapo": "token_mean", "seq_mean_token_mean": "seq_mean_token_mean",
    "grpo": "seq_mean_token_mean", "seq_sum": "seq_sum", "dr_grpo": "dr_grpo", "bnpo": "bnpo",
}


def token_logprobs(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """log p(labels) from logits: (B, C, V), (B, C) -> (B, C), without storing a full log-softmax."""
    logits = logits.float()
    picked = logits.gather(-1, labels.unsqueeze(-1)).squeeze(-1)  # (B, C)
    return picked - torch.logsumexp(logits, dim=-1)


class _HeadLogprobs(torch.autograd.Function):
    """log softmax(h W^T + b)[label] per row; fp32 softmax statistics ``chunk`` rows at a time.

    Backward needs softmax(logits). When the (N, V) logits fit in ``keep_bytes`` (in the matmul dtype) they are
    computed in one matmul and kept; backward turns them into d logp / d logits in place and runs one matmul per
    gradient. Otherwise each chunk's logits are recomputed in backward (one more output-layer matmul, no (N, V) tensor).
    """

    @staticmethod
    def forward(ctx, hidden: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, labels: torch.Tensor,
                dtype: torch.dtype, chunk: int, keep_bytes: int) -> torch.Tensor:
        ctx.save_for_backward(hidden, weight, bias, labels)
        ctx.dtype, ctx.chunk = dtype, chunk
        n = hidden.shape[0]
        w, b = weight.to(dtype), None if bias is None else bias.to(dtype)
        acc = torch.promote_types(dtype, torch.float32)  # softmax statistics: fp32 (fp64 for fp64 inputs)
        out = torch.empty(n, dtype=acc, device=hidden.device)
        lse = torch.empty(n, dtype=acc, device=hidden.device)
        keep = n * weight.shape[0] * torch.finfo(dtype).bits // 8 <= keep_bytes
        with torch.autocast(hidden.device.type, enabled=False):
            kept = F.linear(hidden.to(dtype), w, b) if keep else None  # (N, V)
            for lo in range(0, n, chunk):
                logits = kept[lo : lo + chunk] if keep else F.linear(hidden[lo : lo + chunk].to(dtype), w, b)
                wide = logits.to(acc)
                lse[lo : lo + chunk] = wide.logsumexp(-1)
                out[lo : lo + chunk] = wide.gather(-1, labels[lo : lo + chunk, None])[:, 0] - lse[lo : lo + chunk]
        ctx.kept, ctx.lse = kept, lse
        return out

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        hidden, weight, bias, labels = ctx.saved_tensors
        dtype, chunk, kept, lse = ctx.dtype, ctx.chunk, ctx.kept, ctx.lse
        ctx.kept = None  # overwritten below: a second backward (retain_graph) recomputes the logits instead
        need_h, need_w, need_b = ctx.needs_input_grad[:3]
        w, b = weight.to(dtype), None if bias is None else bias.to(dtype)
        acc = torch.promote_types(dtype, torch.float32)
        grad_h = torch.empty_like(hidden) if need_h and kept is None else None
        grad_w = grad_b = None  # accumulated in ``acc`` over chunks when recomputing
        with torch.autocast(hidden.device.type, enabled=False):
            for lo in range(0, hidden.shape[0], chunk):
                g = grad[lo : lo + chunk, None].to(acc)  # (n, 1)
                if kept is not None:
                    probs = (kept[lo : lo + chunk].to(acc) - lse[lo : lo + chunk, None]).exp_()
                else:
                    h = hidden[lo : lo + chunk].to(dtype)
                    probs = torch.softmax(F.linear(h, w, b).to(acc), dim=-1)
                # d logp / d logits = onehot(label) - softmax(logits)
                dz = probs.mul_(-g).scatter_add_(-1, labels[lo : lo + chunk, None], g)  # (n, V)
                if kept is not None:
                    kept[lo : lo + chunk] = dz  # in place: the kept logits become d logp / d logits
                    continue
                dz = dz.to(dtype)
                if need_h:
                    grad_h[lo : lo + chunk] = dz @ w
                if need_w:
                    part = dz.T @ h  # (V, H)
                    grad_w = part.to(acc) if grad_w is None else grad_w.add_(part)
                if need_b:
                    part = dz.to(acc).sum(0)
                    grad_b = part if grad_b is None else grad_b.add_(part)
            if kept is not None:
                h = hidden.to(dtype)
                grad_h = (kept @ w).to(hidden.dtype) if need_h else None
                grad_w = kept.T @ h if need_w else None
                grad_b = kept.to(acc).sum(0) if need_b else None
        return (grad_h, None if grad_w is None else grad_w.to(weight.dtype),
                None if grad_b is None else grad_b.to(bias.dtype), None, None, None, None)


def head_logprobs(hidden: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, labels: torch.Tensor,
                  dtype: torch.dtype | None = None, chunk: int | None = None, keep_bytes: int = 64 << 20) -> torch.Tensor:
    """log p(labels) under an output layer: (N, H) hidden states, (V, H) weight, (N,) labels -> (N,) fp32 (fp64 if
    ``dtype`` is fp64).

    Same values and gradients as ``token_logprobs(F.linear(hidden, weight, bias), labels)`` (matmuls in ``dtype``,
    softmax statistics in fp32), without a full fp32 copy of the logits: fp32 temporaries exist ``chunk`` rows at a
    time. ``dtype``: compute dtype of the matmuls (default: the weight's); ``chunk``: default ~16 MB of fp32 logits.
    Logits are kept for backward (in ``dtype``) if they fit in ``keep_bytes``, else recomputed chunk by chunk
    (memory bounded whatever N).
    """
    dtype = dtype or weight.dtype
    # 16 MB, not 32: glibc serves blocks near its 32 MB mmap-threshold ceiling from fresh pages, and faulting them in
    # made each chunk temporary ~10x slower (SmolLM2, V=49k: 170-row chunks 32 ms a subtraction, 160-row 3.7 ms).
    chunk = chunk or max(1, (16 << 20) // (4 * weight.shape[0]))
    n = hidden.shape[0]  # rows in a few buckets: every new matmul shape costs a cached CPU kernel (comlrl.shapes)
    out = _HeadLogprobs.apply(pad_rows(hidden), weight, bias, pad_rows(labels), dtype, chunk, keep_bytes)
    return out[:n]


def loss_weights(masks: list[torch.Tensor], loss_type: str, groups: list | None = None,
                 max_completion_length: int | None = None) -> list[torch.Tensor]:
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
    weights: torch.Tensor,
    epsilon: float = 0.2,
    ref_logp: torch.Tensor | None = None,
    beta: float = 0.0,
    rollout_logp: torch.Tensor | None = None,
    is_cap: float = 2.0,
    epsilon_high: float | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Clipped policy-gradient loss (PPO/GRPO objective) summed with per-token ``weights``.

    logp, old_logp, weights: (B, C); advantages: (B,). With old_logp == logp.detach() the ratio is 1 and the
    gradient is the REINFORCE estimator -sum_t w_t * A * grad log p_t.
    KL to the reference uses the k3 estimator exp(ref - logp) - (ref - logp) - 1 (Schulman 2020).
    ``rollout_logp`` (B, C): the log-probs the tokens were sampled with, when that policy differs numerically from
    the one ``old_logp`` scores (e.g. a bf16 rollout of fp32 weights): each token's policy term is weighted by the
    truncated importance weight min(exp(old_logp - rollout_logp), is_cap) (Yao et al. 2025, "TIS").
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
        raw = torch.exp(old_logp - rollout_logp).detach()
        is_weight = raw.clamp(max=is_cap)
        per_token = per_token * is_weight
        metrics["rollout_is_weight"] = (is_weight * weights).sum()
        metrics["rollout_is_capped"] = ((raw > is_cap).float() * weights).sum()
        metrics["rollout_kl"] = ((rollout_logp - old_logp) * weights).sum().detach()  # KL(rollout || train), k1
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
