"""Log-probs of labels under an output layer without a full fp32 copy of the logits (same values and gradients)."""

from __future__ import annotations

import contextlib
from typing import Iterator

import torch
import torch.nn.functional as F

from ..algorithms.losses import token_entropy
from .shapes import pad_rows


class _HeadLogprobs(torch.autograd.Function):
    """log softmax(h W^T + b)[label] per row; fp32 softmax statistics ``chunk`` rows at a time.

    With ``entropy``, also each row's entropy of softmax(logits) (no gradient), from the same chunks of logits.

    Backward needs softmax(logits). When the (N, V) logits fit in ``keep_bytes`` (in the matmul dtype) they are
    computed in one matmul and kept; backward turns them into d logp / d logits in place and runs one matmul per
    gradient. Otherwise each chunk's logits are recomputed in backward (one more output-layer matmul, no (N, V) tensor).
    """

    @staticmethod
    def forward(
        ctx,
        hidden: torch.Tensor,
        weight: torch.Tensor,
        bias: torch.Tensor | None,
        labels: torch.Tensor,
        dtype: torch.dtype,
        chunk: int,
        keep_bytes: int,
        entropy: bool,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        ctx.save_for_backward(hidden, weight, bias, labels)
        ctx.dtype, ctx.chunk = dtype, chunk
        n = hidden.shape[0]
        w, b = weight.to(dtype), None if bias is None else bias.to(dtype)
        acc = torch.promote_types(dtype, torch.float32)  # softmax statistics: fp32 (fp64 for fp64 inputs)
        out = torch.empty(n, dtype=acc, device=hidden.device)
        lse = torch.empty(n, dtype=acc, device=hidden.device)
        ent = torch.empty(n if entropy else 0, dtype=acc, device=hidden.device)
        keep = n * weight.shape[0] * torch.finfo(dtype).bits // 8 <= keep_bytes
        with torch.autocast(hidden.device.type, enabled=False):
            kept = F.linear(hidden.to(dtype), w, b) if keep else None  # (N, V)
            for lo in range(0, n, chunk):
                logits = kept[lo : lo + chunk] if keep else F.linear(hidden[lo : lo + chunk].to(dtype), w, b)
                wide = logits.to(acc)
                lse[lo : lo + chunk] = wide.logsumexp(-1)
                out[lo : lo + chunk] = wide.gather(-1, labels[lo : lo + chunk, None])[:, 0] - lse[lo : lo + chunk]
                if entropy:
                    ent[lo : lo + chunk] = token_entropy(wide)
        ctx.kept, ctx.lse = kept, lse
        ctx.mark_non_differentiable(ent)
        return out, ent

    @staticmethod
    def backward(ctx, grad: torch.Tensor, _entropy_grad: torch.Tensor):
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
        return (
            grad_h,
            None if grad_w is None else grad_w.to(weight.dtype),
            None if grad_b is None else grad_b.to(bias.dtype),
            None,
            None,
            None,
            None,
            None,
        )


def head_logprobs(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    *,
    bias: torch.Tensor | None,
    labels: torch.Tensor,
    dtype: torch.dtype | None = None,
    chunk: int | None = None,
    keep_bytes: int = 64 << 20,
    entropy: bool = False,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """log p(labels) under an output layer: (N, H) hidden states, (V, H) weight, (N,) labels -> (N,) fp32 (fp64 if
    ``dtype`` is fp64).

    Same values and gradients as ``token_logprobs(F.linear(hidden, weight, bias), labels)`` (matmuls in ``dtype``,
    softmax statistics in fp32), without a full fp32 copy of the logits: fp32 temporaries exist ``chunk`` rows at a
    time. ``dtype``: compute dtype of the matmuls (default: the weight's); ``chunk``: default ~16 MB of fp32 logits.
    Logits are kept for backward (in ``dtype``) if they fit in ``keep_bytes``, else recomputed chunk by chunk
    (memory bounded whatever N). ``entropy``: also return each row's entropy of softmax(logits) (N,), detached,
    computed from each chunk's logits where the forward has them (no further matmul):
    :func:`comlrl.algorithms.losses.token_entropy`.
    """
    dtype = dtype or weight.dtype
    # 16 MB, not 32: glibc serves blocks near its 32 MB mmap-threshold ceiling from fresh pages, and faulting them in
    # made each chunk temporary ~10x slower (SmolLM2, V=49k: 170-row chunks 32 ms a subtraction, 160-row 3.7 ms).
    chunk = chunk or max(1, (16 << 20) // (4 * weight.shape[0]))
    n = hidden.shape[0]  # rows in a few buckets: every new matmul shape costs a cached CPU kernel (comlrl.accel.shapes)
    out, ent = _HeadLogprobs.apply(pad_rows(hidden), weight, bias, pad_rows(labels), dtype, chunk, keep_bytes, entropy)
    return (out[:n], ent[:n]) if entropy else out[:n]


@contextlib.contextmanager
def contiguous_head_input(model: torch.nn.Module) -> Iterator[None]:
    """Make the output projection's input contiguous while the block runs.

    Why: with ``logits_to_keep`` HF models feed the LM head a strided slice of the hidden states, and ``F.linear`` on a
    non-contiguous 3-D input falls back to a batched matmul over a copy of the (V, H) weight per row -- measured on
    CPU for SmolLM2 (V=49k) at 4 rows: 0.4 s of weight copies per forward+backward, a quarter of the loss time.
    """
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    if head is None:
        yield
        return
    handle = head.register_forward_pre_hook(lambda module, args: (args[0].contiguous(), *args[1:]))
    try:
        yield
    finally:
        handle.remove()
