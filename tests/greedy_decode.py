"""Greedy decoding of a fixed prompt batch both ways, model.generate and comlrl's fast_generate, for the tests that
check that the two pick the same tokens."""

from __future__ import annotations

import torch

from comlrl.accel.fastgen import fast_generate

# token ids of the tiny vocab, BOS first, of different lengths (left-padded when batched)
PROMPTS = [[1, 5, 6, 7, 8, 9, 10, 11], [1, 20, 21], [1, 30, 31, 32, 33, 34], [1, 40], [1, 50, 51, 52]]


def hf_greedy(model, ids, mask, pad, eos, new_tokens, **kw) -> torch.Tensor:
    """The new tokens of model.generate's greedy decoding (``kw``: more generate arguments)."""
    out = model.generate(
        input_ids=ids,
        attention_mask=mask,
        max_new_tokens=new_tokens,
        do_sample=False,
        temperature=None,
        top_p=None,
        top_k=None,
        pad_token_id=pad,
        eos_token_id=eos,
        **kw,
    )
    return out[:, ids.shape[1] :]


def greedy(model, ids, mask, pad, eos, new_tokens, **kw) -> torch.Tensor:
    """The new tokens of fast_generate's greedy decoding (``kw``: more fast_generate arguments)."""
    return fast_generate(
        model, ids, mask, max_new_tokens=new_tokens, eos_token_ids=eos, pad_token_id=pad, do_sample=False, **kw
    )
