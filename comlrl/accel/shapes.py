"""Token counts rounded up to a few buckets, so that a run's matmuls come in a few shapes.

Why: on CPU, oneDNN (bf16 matmuls) compiles and caches a kernel with its workspace per matmul shape, and keeps up
to 1024 of them. Rollouts give every step new prompt and completion lengths, hence new shapes. Measured with
SmolLM2-135M's projection shapes in bf16: resident memory grew ~4.7 MB per new row count until the cache filled
(+0.6 GB); a 2-agent LoRA team over 40 steps of 40 distinct prompts peaked at 2.06 GB, 1.83 GB with the buckets
(4 agents: 2.26 -> 1.96 GB), at the same speed. Padding is masked out: values are unchanged.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

TOKENS = 8  # prompt and completion lengths: multiples of this (at most 7 padding tokens each)
ROWS = 32  # rows of the output layer's log-prob pass: multiples of this


def round_up(n: int, multiple: int) -> int:
    """The smallest multiple of ``multiple`` that is >= n."""
    return -(-n // multiple) * multiple


def pad_tokens(
    ids: torch.Tensor, mask: torch.Tensor, *, left: bool, multiple: int = TOKENS, pad_id: int = 0, width: int = 0
) -> tuple[torch.Tensor, torch.Tensor]:
    """(ids, mask) of (B, T) widened to (B, round_up(max(T, width), multiple)) with masked ``pad_id`` columns on the
    left (``left``: prompts) or the right (completions)."""
    extra = round_up(max(ids.shape[1], width), multiple) - ids.shape[1]
    if extra == 0:
        return ids, mask
    pad = (extra, 0) if left else (0, extra)
    return F.pad(ids, pad, value=pad_id), F.pad(mask, pad, value=0)


def pad_rows(x: torch.Tensor, multiple: int = ROWS) -> torch.Tensor:
    """x with zero rows appended to its first dim up to a multiple of ``multiple`` (gradients flow to x's rows)."""
    extra = round_up(x.shape[0], multiple) - x.shape[0]
    if extra == 0:
        return x
    return torch.cat([x, x.new_zeros((extra, *x.shape[1:]))])
