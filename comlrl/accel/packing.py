"""Rows that share a prompt packed into one sequence per distinct prompt (same math, fewer prompt tokens through
every weight)."""

from __future__ import annotations

import torch

from .llama_decoder import window_exceeded


def shared_prompt_layout(
    prompt_ids: torch.Tensor,
    prompt_mask: torch.Tensor,
    *,
    completion_ids: torch.Tensor,
    completion_mask: torch.Tensor,
    position_ids: torch.Tensor,
    config: object,
    groups: torch.Tensor | None = None,
    blocked: bool = False,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor] | None:
    """Pack rows that share a prompt into one sequence per distinct prompt, or None when that would not pay.
    ``groups`` (B,): rows of different groups never share a packed row (e.g. different LoRA adapters); packed rows
    are ordered by group. ``blocked``: the forward will run its attention by blocks (:mod:`comlrl.accel.attention`), each
    slot over [prompt; slot] -- fewer score pairs than the separate rows, so packing always pays.

    Returns ``ids`` (U, L) = [prompt (P), completion slot 1 (C), ..., slot K (C)] with L = P + K C (K: the most rows
    of one prompt; unused slots are padding), ``positions`` (U, L) as the separate rows have them, ``allowed``
    (U, 1, L, L) bool (a prompt token sees the real prompt tokens before it, a completion token the real prompt
    tokens and its own slot's real tokens before it; every token sees itself, so padding rows stay finite), and
    ``gather`` (B, C): the index into the flattened (U L) positions of the state before each completion token.

    Packing trades (k - 1) P tokens through every weight for longer attention rows (L^2 against k (P + C)^2 score
    pairs, unless ``blocked``); it is used when the body's matmul FLOPs saved exceed the attention FLOPs added.
    """
    b, p = prompt_ids.shape
    c = completion_ids.shape[1]
    # a custom mask replaces the sliding window; flash kernels take no 4-D mask
    if window_exceeded(config, p + c) or getattr(config, "_attn_implementation", None) not in ("eager", "sdpa"):
        return None
    keys = [prompt_ids, prompt_mask.to(prompt_ids.dtype)]
    if groups is not None:
        keys.insert(0, groups[:, None].to(prompt_ids.dtype))
    uniq, inverse = torch.unique(torch.cat(keys, dim=1), dim=0, return_inverse=True)  # (U, [1+]2P), (B,)
    uniq = uniq[:, uniq.shape[1] - 2 * p :]
    u = len(uniq)
    if u == b:
        return None
    counts = torch.bincount(inverse, minlength=u)  # (U,)
    k = int(counts.max())
    length = p + k * c
    hidden, layers = getattr(config, "hidden_size", 0), getattr(config, "num_hidden_layers", 0)
    intermediate = getattr(config, "intermediate_size", 4 * hidden)
    per_token = 2 * layers * (4 * hidden * hidden + 3 * hidden * intermediate)  # body matmuls, approx. (q/k/v/o, MLP)
    per_pair = 4 * hidden * layers  # scores + weighted values
    saved = (b - u) * p * per_token
    added = (u * length * length - b * (p + c) ** 2) * per_pair
    if saved <= added and not blocked:
        return None
    # slot of each row within its prompt's group: rank among the rows with the same prompt, in row order
    order = torch.argsort(inverse, stable=True)  # rows grouped by prompt
    starts = torch.cumsum(counts, 0) - counts  # (U,)
    slot = torch.empty_like(inverse)
    slot[order] = torch.arange(b, device=inverse.device) - starts[inverse[order]]
    first = order[starts]  # (U,): a row of each distinct prompt
    device = prompt_ids.device
    ids = torch.zeros((u, length), dtype=prompt_ids.dtype, device=device)
    positions = torch.zeros((u, length), dtype=position_ids.dtype, device=device)
    valid = torch.zeros((u, length), dtype=torch.bool, device=device)
    ids[:, :p], positions[:, :p], valid[:, :p] = uniq[:, :p], position_ids[first, :p], prompt_mask[first].bool()
    cols = p + slot[:, None] * c + torch.arange(c, device=device)  # (B, C) packed column of each completion token
    ids[inverse[:, None], cols] = completion_ids
    positions[inverse[:, None], cols] = position_ids[:, p:]
    valid[inverse[:, None], cols] = completion_mask.bool()
    segment = torch.full((length,), -1, dtype=torch.long, device=device)  # -1: prompt, j: completion slot j
    segment[p:] = torch.arange(k, device=device).repeat_interleave(c)
    idx = torch.arange(length, device=device)
    same = (segment[None, :] == -1) | (segment[None, :] == segment[:, None])  # (L, L) key in prompt or in own slot
    allowed = (same & (idx[None, :] <= idx[:, None]))[None] & valid[:, None, :]  # (U, L, L)
    allowed |= torch.eye(length, dtype=torch.bool, device=device)
    before = torch.cat([torch.full((b, 1), p - 1, device=device), cols[:, :-1]], dim=1)  # (B, C)
    gather = inverse[:, None] * length + before
    return ids, positions, allowed[:, None], gather
