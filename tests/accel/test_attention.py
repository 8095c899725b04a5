"""Slot attention over packed shared-prompt rows: same values and gradients as masked attention over the whole row."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from tiny import grouped_batch, tiny_model

from comlrl.accel import attention
from comlrl.accel.fastgen import additive_mask
from comlrl.engine import logprobs


def _packed_mask(prompt_mask: torch.Tensor, slot_masks: torch.Tensor) -> torch.Tensor:
    """The (U, 1, L, L) bool mask shared_prompt_layout builds: prompt_mask (U, P), slot_masks (U, K, C)."""
    u, k, c = slot_masks.shape
    p = prompt_mask.shape[1]
    length = p + k * c
    valid = torch.cat([prompt_mask.bool(), slot_masks.reshape(u, k * c).bool()], dim=1)  # (U, L)
    segment = torch.cat([torch.full((p,), -1), torch.arange(k).repeat_interleave(c)])
    idx = torch.arange(length)
    same = (segment[None, :] == -1) | (segment[None, :] == segment[:, None])
    allowed = (same & (idx[None, :] <= idx[:, None]))[None] & valid[:, None, :]
    return (allowed | torch.eye(length, dtype=torch.bool))[:, None]


def _eager(q, k, v, bias, scaling):
    """transformers' eager attention (GQA by repeating K/V) over the whole row: (U, L, Hq, D)."""
    rep = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
    probs = F.softmax((q @ k.transpose(-1, -2)) * scaling + bias, dim=-1, dtype=torch.float32).to(q.dtype)
    return (probs @ v).transpose(1, 2)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_slot_attention_matches_masked_attention_over_the_packed_row(dtype):
    """GQA (4 query heads on 2 K/V heads), 2 packed rows of 3 slots, a left-padded prompt and a completion cut short:
    values and q/k/v gradients equal masked attention over the whole row."""
    torch.manual_seed(0)
    u, hq, hkv, d, p, k, c = 2, 4, 2, 8, 5, 3, 4
    length = p + k * c
    prompt_mask = torch.ones(u, p)
    prompt_mask[1, :2] = 0
    slot_masks = torch.ones(u, k, c)
    slot_masks[0, 1, 2:] = 0
    bias = additive_mask(_packed_mask(prompt_mask, slot_masks), dtype)
    q = torch.randn(u, hq, length, d, dtype=dtype, requires_grad=True)
    kv = [torch.randn(u, hkv, length, d, dtype=dtype, requires_grad=True) for _ in range(2)]
    weights = torch.randn(u, length, hq, d, dtype=dtype)
    results = []
    for fn in (
        lambda: attention.slot_attention_values(q, *kv, layout=attention.slot_layout(bias, p, k, c), scaling=0.35),
        lambda: _eager(q, *kv, bias, 0.35),
    ):
        out = fn()
        grads = torch.autograd.grad((out * weights).sum(), [q, *kv])
        results.append((out, *grads))
    tol = dict(atol=2e-6, rtol=1e-5) if dtype == torch.float32 else dict(atol=2e-2, rtol=2e-2)
    for ours, theirs in zip(*results):
        torch.testing.assert_close(ours, theirs, **tol)
    assert results[0][0].shape == (u, length, hq, d)


def test_slot_layout_refuses_a_mask_that_crosses_slots():
    prompt_mask, slot_masks = torch.ones(1, 3), torch.ones(1, 2, 4)
    allowed = _packed_mask(prompt_mask, slot_masks)
    attention.slot_layout(additive_mask(allowed, torch.float32), 3, 2, 4)  # the packed layout itself is fine
    crossing = allowed.clone()
    crossing[0, 0, 3 + 4 + 1, 3] = True  # slot 1's second token sees slot 0's first
    with pytest.raises(ValueError, match="own completion slot"):
        attention.slot_layout(additive_mask(crossing, torch.float32), 3, 2, 4)
    with pytest.raises(ValueError, match="not a packed row"):
        attention.slot_layout(additive_mask(allowed, torch.float32), 3, 3, 4)


@pytest.mark.parametrize("attn", ["eager", "sdpa"])
def test_packed_forward_runs_slot_attention_and_restores_the_implementation(attn, monkeypatch):
    """completion_logprobs on rows sharing a prompt goes through slot attention when the model attends eagerly (the
    same log-probs as the separate rows), keeps SDPA's own kernel otherwise, and leaves the model's attention
    implementation as it was; the function refuses to run outside."""
    model = tiny_model(seed=6, hidden=64)
    model.set_attn_implementation(attn)
    calls = []
    original = attention.slot_attention_values
    monkeypatch.setattr(attention, "slot_attention_values", lambda *a, **kw: calls.append(1) or original(*a, **kw))
    tensors = grouped_batch()
    packed = logprobs.completion_logprobs(model, *tensors)
    layers = model.config.num_hidden_layers if attn == "eager" else 0
    assert len(calls) == layers
    assert model.config._attn_implementation == attn
    monkeypatch.setattr(logprobs, "shared_prompt_layout", lambda *args, **kwargs: None)
    torch.testing.assert_close(packed, logprobs.completion_logprobs(model, *tensors), atol=1e-5, rtol=1e-5)
    assert len(calls) == layers  # separate rows: the model's own attention
    q = torch.zeros(1, 4, 3, 8)
    with pytest.raises(RuntimeError, match="only inside"):
        attention._attention_forward(model.model.layers[0].self_attn, q, q, q, None, 1.0)


def test_slot_attention_is_left_out_under_activation_checkpointing_dropout_and_sdpa():
    model = tiny_model(seed=6, hidden=64)
    model.set_attn_implementation("eager")
    assert attention.slot_attention_fits(model.model)
    model.gradient_checkpointing_enable()
    assert not attention.slot_attention_fits(model.model)
    model.gradient_checkpointing_disable()
    model.config.attention_dropout = 0.1
    assert not attention.slot_attention_fits(model.model)
    model.config.attention_dropout = 0.0
    model.set_attn_implementation("sdpa")
    assert not attention.slot_attention_fits(model.model)
