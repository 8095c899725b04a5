"""Attention over a packed shared-prompt row (:func:`comlrl.engine.packing.shared_prompt_layout`) by blocks.

A packed row is [prompt (P), completion slot 1 (C), ..., slot K (C)]: a completion token attends to the prompt and to
its own slot only. Eager or SDPA attention over the whole row computes (P + K C)^2 score pairs and masks most of them;
here each slot attends to [prompt; own slot], K C (P + C) + P^2 pairs (~3x fewer for 4 samples of 64 tokens after a
40-token prompt), with eager attention's masked-softmax math. Masked pairs carry exactly zero probability in both,
so the outputs agree up to summation order.

Only for models that attend eagerly (comlrl's bf16 CPU training forward does): against SDPA's fused kernel, which
keeps no probabilities for backward, block-wise SDPA measured no faster in a 2 x SmolLM2-135M fp32 fine-tune and
~0.03 GB more peak memory.
"""

from __future__ import annotations

import contextlib
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any, Iterator

import torch
import torch.nn as nn
import torch.nn.functional as F
from transformers import AttentionInterface

from .modules import is_checkpointing, unwrap_peft

IMPLEMENTATION = "comlrl_slots"  # the name under which transformers' AttentionInterface knows slot_attention


@dataclass(frozen=True, kw_only=True)
class SlotLayout:
    """Where a packed row's blocks are, with their additive masks (0 / -inf) cut from the row's (U, 1, L, L) mask."""

    prompt: int  # P
    slots: int  # K
    width: int  # C
    prompt_bias: torch.Tensor  # (U, 1, P, P): prompt queries x prompt keys
    slot_bias: torch.Tensor  # (U, 1, K, C, P + C): slot queries x [prompt keys; own slot keys]


def slot_layout(bias: torch.Tensor, prompt: int, slots: int, width: int) -> SlotLayout:
    """The blocks of a packed row's additive mask ``bias`` (U, 1, P + K C, P + K C) that slot attention reads.

    Raises ValueError if the mask lets a token see anything outside those blocks (a prompt token a completion, or a
    completion another slot): slot attention would silently drop it."""
    p, k, c = prompt, slots, width
    if bias.shape[-1] != p + k * c or bias.shape[-2] != p + k * c:
        raise ValueError(f"mask of shape {tuple(bias.shape)} is not a packed row of {p} + {k} x {c} tokens")
    rows = bias[:, :, p:].unflatten(2, (k, c))  # (U, 1, K, C, L)
    own = torch.stack([rows[:, :, j, :, p + j * c : p + (j + 1) * c] for j in range(k)], dim=2)  # (U, 1, K, C, C)
    seen = torch.isfinite(bias)
    seen[:, :, :p, :p] = False
    seen[:, :, p:, :p] = False
    for j in range(k):
        seen[:, :, p + j * c : p + (j + 1) * c, p + j * c : p + (j + 1) * c] = False
    if bool(seen.any()):
        raise ValueError("mask lets tokens attend outside the prompt and their own completion slot")
    return SlotLayout(
        prompt=p, slots=k, width=c, prompt_bias=bias[:, :, :p, :p], slot_bias=torch.cat([rows[..., :p], own], dim=-1)
    )


def slot_attention_values(
    query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, *, layout: SlotLayout, scaling: float
) -> torch.Tensor:
    """softmax(q k^T * scaling + mask) v over a packed row, block by block; (U, Hq, L, D), (U, Hkv, L, D) x 2 ->
    (U, L, Hq, D). Same op sequence per block as transformers' eager attention (scores in the input dtype, softmax in
    fp32, probabilities cast back); query heads share key/value heads in groups (GQA) without repeating K/V."""
    u, hq, _, d = query.shape
    hkv = key.shape[1]
    rep, p, k, c = hq // hkv, layout.prompt, layout.slots, layout.width
    kp, vp = key[:, :, :p], value[:, :, :p]  # (U, Hkv, P, D)
    # each slot's keys/values [prompt; own slot], slots as a batch dim
    keys = torch.cat([kp[:, :, None].expand(u, hkv, k, p, d), key[:, :, p:].view(u, hkv, k, c, d)], dim=3)
    values = torch.cat([vp[:, :, None].expand(u, hkv, k, p, d), value[:, :, p:].view(u, hkv, k, c, d)], dim=3)
    # prompt queries x prompt keys, the rep query heads of a K/V head stacked as rows
    qp = query[:, :, :p].reshape(u, hkv, rep * p, d)
    scores = (qp @ kp.transpose(-1, -2)).view(u, hkv, rep, p, p) * scaling + layout.prompt_bias[:, :, None]
    probs = F.softmax(scores, dim=-1, dtype=torch.float32).to(query.dtype)
    out_p = (probs.view(u, hkv, rep * p, p) @ vp).view(u, hq, p, d)
    qc = query[:, :, p:].reshape(u, hkv, rep, k, c, d).transpose(2, 3).reshape(u, hkv, k, rep * c, d)
    scores = (qc @ keys.transpose(-1, -2)).view(u, hkv, k, rep, c, p + c) * scaling + layout.slot_bias[:, :, :, None]
    probs = F.softmax(scores, dim=-1, dtype=torch.float32).to(query.dtype)
    out_c = (probs.view(u, hkv, k, rep * c, p + c) @ values).view(u, hkv, k, rep, c, d)
    out_c = out_c.permute(0, 1, 3, 2, 4, 5).reshape(u, hq, k * c, d)
    return torch.cat([out_p, out_c], dim=2).transpose(1, 2).contiguous()  # (U, L, Hq, D)


_LAYOUT: ContextVar[SlotLayout | None] = ContextVar("comlrl_slot_layout", default=None)


def _attention_forward(
    module: nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float | None = None,
    dropout: float = 0.0,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """transformers' attention-function signature around :func:`slot_attention_values` (inside :func:`slot_attention`
    only)."""
    layout = _LAYOUT.get()
    if layout is None:
        raise RuntimeError(
            f"attention implementation {IMPLEMENTATION!r} runs only inside comlrl.accel.attention.slot_attention"
        )
    if dropout and module.training:
        raise ValueError("slot attention has no attention dropout; set the model's attention_dropout to 0")
    scale = scaling if scaling is not None else query.shape[-1] ** -0.5
    return slot_attention_values(query, key, value, layout=layout, scaling=scale), None


AttentionInterface.register(IMPLEMENTATION, _attention_forward)


@contextlib.contextmanager
def slot_attention(model: nn.Module, layout: SlotLayout) -> Iterator[None]:
    """Run the block's forwards of ``model`` (a transformers model with eager attention) with slot attention over
    ``layout``'s packed rows; the model's attention implementation is restored after."""
    config = getattr(model, "config", None)
    previous = getattr(config, "_attn_implementation", None)
    if previous != "eager" or not hasattr(model, "set_attn_implementation"):
        raise ValueError(f"slot attention needs a transformers model with eager attention, got {previous!r}")
    token = _LAYOUT.set(layout)
    model.set_attn_implementation(IMPLEMENTATION)
    try:
        yield
    finally:
        model.set_attn_implementation(previous)
        _LAYOUT.reset(token)


def slot_attention_fits(decoder: nn.Module) -> bool:
    """Whether a packed forward of ``decoder`` can run its attention by blocks (:mod:`comlrl.accel.attention`) and compute
    what the model's own would: eager attention (as in bf16 CPU training, :func:`training_attention`) without dropout,
    and no activation checkpointing (its recompute in backward runs outside the forward's context and must see the same
    attention)."""
    config = getattr(decoder, "config", None)
    return (
        getattr(config, "_attn_implementation", None) == "eager"
        and not getattr(config, "attention_dropout", 0)
        and not is_checkpointing(decoder)
        and hasattr(decoder, "set_attn_implementation")
    )


@contextlib.contextmanager
def training_attention(model: nn.Module) -> Iterator[None]:
    """Run the block's attention eagerly when it trains in bf16 on CPU (a model set to ``sdpa``); else leave it.

    Why: torch's CPU flash-attention backward is slow in bf16 at RL shapes. Measured on SmolLM2-135M, 4 x 104 tokens,
    2 cores: 11.5 ms per layer against ~2.5 ms for eager attention's matmuls + softmax; a forward+backward went
    1.58 -> 1.28 s (LoRA on a bf16 base) and 1.86 -> 1.47 s (full fine-tune, bf16 autocast). fp32 gained nothing,
    and no-grad forwards keep SDPA (its forward is the fast part).
    """
    inner = unwrap_peft(model)
    config = getattr(inner, "config", None)
    param = next(inner.parameters(), None)
    bf16 = param is not None and (
        param.dtype == torch.bfloat16
        or (torch.is_autocast_enabled("cpu") and torch.get_autocast_dtype("cpu") == torch.bfloat16)
    )
    # Gradient checkpointing re-runs the forward during backward, outside this block: it must see the same attention.
    if (
        not bf16
        or config is None
        or getattr(config, "_attn_implementation", None) != "sdpa"
        or not torch.is_grad_enabled()
        or param.device.type != "cpu"
        or not hasattr(inner, "set_attn_implementation")
        or is_checkpointing(inner)
    ):
        yield
        return
    inner.set_attn_implementation("eager")
    try:
        yield
    finally:
        inner.set_attn_implementation("sdpa")
