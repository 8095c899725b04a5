"""The decode loop's token sampler: transformers' ``generate`` semantics (fp32 logits, temperature, then top-k, then
top-p, as its warpers), one draw per row by inverse CDF, and transformers' repetition penalty.

Same distribution as ``generate``, a different random stream: ``torch.multinomial`` is replaced by an inverse-CDF draw
(:func:`inverse_cdf_pick`), and top-p filters inside each row's top-K logits first (:func:`top_p_filter`).
:func:`sampler_logprobs` scores a token under the distribution it was drawn from, for the rollout and the trainer
alike (the importance weight of :func:`comlrl.algorithms.losses.policy_loss` compares the two).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch


@dataclass(frozen=True, kw_only=True)
class SamplerSettings:
    """What shapes the distribution a sampled token is drawn from, in the order applied: the repetition penalty on
    the raw logits, the temperature, top-k, top-p (vLLM's order and transformers' alike)."""

    temperature: float = 1.0
    top_k: int = 0  # 0: off
    top_p: float = 1.0
    repetition_penalty: float = 1.0  # 1: off

    @property
    def filters(self) -> bool:
        """Whether the drawn distribution differs from softmax(logits / temperature): a filter or a penalty is on."""
        return bool(self.top_k) or self.top_p < 1.0 or self.repetition_penalty != 1.0


def token_sampler(
    do_sample: bool, *, temperature: float, top_k: int, top_p: float, generator: torch.Generator | None
) -> Callable[[torch.Tensor], torch.Tensor]:
    """A function logits (B, V) fp32 -> tokens (B,); the warpers that are no-ops are left out entirely."""
    if not do_sample:
        return lambda logits: logits.argmax(dim=-1)

    def sample(logits: torch.Tensor) -> torch.Tensor:
        survivors = top_k_survivors(logits, temperature, top_k, top_p)
        if survivors is not None:
            idx, probs = survivors
            return idx.gather(-1, _inverse_cdf_sample(probs, generator)[:, None]).squeeze(1)
        return _inverse_cdf_sample(warp_logits(logits, temperature, top_k, top_p).softmax(dim=-1), generator)

    return sample


def top_k_survivors(
    logits: torch.Tensor, temperature: float, top_k: int, top_p: float
) -> tuple[torch.Tensor, torch.Tensor] | None:
    """Each row's top-k survivors of :func:`warp_logits` in vocabulary order: the token ids of its 2k highest logits
    (B, 2k) and their probabilities (B, 2k), 0 for those top-k or top-p drops. An inverse-CDF draw over them with a
    uniform u picks the token the draw over the whole vocabulary picks with u, up to the rounding of the
    probabilities' sums and to which of the logits tied at top-p's boundary it keeps. None when top-k is off or above
    ``_TOP_P_CANDIDATES``, or when in some row the logits that tie at the k-th (top-k keeps them all) may run past the
    2k candidates: the caller draws over the vocabulary.

    Why: every pass over the (B, V) logits costs; at B = 8, V = 49k a draw over the survivors takes ~1 ms where the
    masks, sorts, softmax and cumulative sums over V take ~4-7 ms per decode step."""
    if not 0 < top_k <= _TOP_P_CANDIDATES or top_k >= logits.shape[-1]:
        return None
    scaled = logits / temperature if temperature != 1.0 else logits
    # 2k candidates: logits that tie at the k-th (common in bf16) are kept by top-k, so they must be among them
    width = min(2 * top_k, logits.shape[-1])
    values, idx = torch.topk(scaled, width, dim=-1)  # (B, 2k) descending
    kth = values[:, top_k - 1 : top_k]
    if width < logits.shape[-1] and bool((values[:, -1:] >= kth).any()):
        return None  # ties may run past the candidates
    values = values.masked_fill(values < kth, float("-inf"))
    if top_p < 1.0:  # as top_p_filter: keep where the mass strictly above is < top_p, always the top one
        probs = values.softmax(dim=-1)
        keep = (probs.cumsum(dim=-1) - probs) < top_p
        keep[:, 0] = True
        values = values.masked_fill(~keep, float("-inf"))
    order = idx.argsort(dim=-1)  # vocabulary order, as the full path's cumulative sum runs
    return idx.gather(-1, order), values.gather(-1, order).softmax(dim=-1)


def warp_logits(logits: torch.Tensor, temperature: float, top_k: int, top_p: float) -> torch.Tensor:
    """fp32 logits (B, V) after the temperature, top-k and top-p, -inf outside the kept tokens: what the sampler
    draws from (its softmax)."""
    if temperature != 1.0:
        logits = logits / temperature
    if top_k and top_k < logits.shape[-1]:
        # HF TopKLogitsWarper: drop everything strictly below the k-th largest (ties at the k-th are kept).
        kth = torch.topk(logits, top_k, dim=-1).values[..., -1:]  # (B, 1)
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p < 1.0:
        # after top-k the nucleus lies within the k survivors (or, with ties at the k-th logit, the fallback sorts)
        logits = top_p_filter(logits, top_p, candidates=top_k or _TOP_P_CANDIDATES)
    return logits


def sampler_logprobs(
    logits: torch.Tensor, tokens: torch.Tensor, settings: SamplerSettings, seen: torch.Tensor | None = None
) -> torch.Tensor:
    """log-probs (N,) of ``tokens`` (N,) under the distribution the sampler draws them from, given raw logits (N, V):
    the repetition penalty on the ``seen`` (N, V) tokens, the temperature, top-k and top-p, renormalized over the
    kept tokens (vLLM's ``processed_logprobs``); -inf for a token the filters drop."""
    logits = logits.float()
    if seen is not None and settings.repetition_penalty != 1.0:
        logits = penalize_repetitions(logits, seen, settings.repetition_penalty)
    warped = warp_logits(logits, settings.temperature, settings.top_k, settings.top_p)
    return warped.gather(-1, tokens[:, None])[:, 0] - warped.logsumexp(dim=-1)


def completion_sampler_logprobs(
    logits_at: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
    *,
    prompt_ids: torch.Tensor,
    prompt_mask: torch.Tensor,
    completion_ids: torch.Tensor,
    completion_mask: torch.Tensor,
    settings: SamplerSettings,
    vocab: int,
    chunk_bytes: int = 1 << 25,
) -> torch.Tensor:
    """:func:`sampler_logprobs` of every completion token (B, C), 0 on padding: position t's penalized tokens are the
    row's real prompt tokens and its completion before t, as a rollout penalizes them.

    ``logits_at(rows, cols)``: the raw logits (n, ``vocab``) before completion positions (rows, cols), asked for
    about ``chunk_bytes`` of fp32 logits at a time, so no (B, C, V) tensor needs to exist.
    """
    device = completion_ids.device
    out = torch.zeros(completion_ids.shape, dtype=torch.float32, device=device)
    rows, cols = completion_mask.bool().nonzero(as_tuple=True)
    penalized = settings.repetition_penalty != 1.0
    if penalized:  # (B, V): each row's real prompt tokens
        prompt_seen = torch.zeros((len(prompt_ids), vocab), device=device)
        prompt_seen = prompt_seen.scatter_add_(1, prompt_ids, prompt_mask.float()) > 0
    positions = torch.arange(completion_ids.shape[1], device=device)
    step = max(1, chunk_bytes // (4 * vocab))
    for lo in range(0, len(rows), step):
        r, c = rows[lo : lo + step], cols[lo : lo + step]
        seen = None
        if penalized:  # the prompt's tokens and the completion's before each position
            before = (positions[None] < c[:, None]).float()  # (n, C)
            counts = torch.zeros((len(r), vocab), device=device).scatter_add_(1, completion_ids[r], before)
            seen = prompt_seen[r] | (counts > 0)
        out[r, c] = sampler_logprobs(logits_at(r, c), completion_ids[r, c], settings, seen)
    return out


def _inverse_cdf_sample(probs: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
    """One draw per row of probs (B, V) by inverse CDF: the first token whose cumulative mass exceeds u ~ U[0, total).

    Why not ``torch.multinomial``: on CPU it draws V exponentials per row (a log each), ~25 ms per step at B=16 and
    V=49k -- a third of a bf16 decode step; cumsum + one uniform per row + a binary search is ~1 ms. Zero-probability
    tokens own empty intervals of the CDF, so they are never drawn.
    """
    u = torch.rand((probs.shape[0], 1), generator=generator, device=probs.device, dtype=probs.dtype)
    return inverse_cdf_pick(probs, u)


def inverse_cdf_pick(probs: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """Tokens (B,): in each row of probs (B, V), the first token whose cumulative mass exceeds u * total, for
    uniforms u (B, 1) in [0, 1) -- an exact draw from the row's distribution (zero-mass tokens are never picked)."""
    cdf = probs.cumsum(dim=-1)  # (B, V) non-decreasing
    total = cdf[:, -1:]  # (B, 1), ~1 up to rounding
    u = u.to(cdf.dtype) * total
    u = torch.minimum(u, torch.nextafter(total, torch.zeros_like(total)))  # keep u < total even after rounding
    return torch.searchsorted(cdf, u, right=True).squeeze(1).clamp_(max=probs.shape[-1] - 1)


# Top-p looks for each row's nucleus inside its top-K logits first: topk(1024) costs ~10 ms where sorting all 49k
# logits of 16 rows costs ~100-130 ms per step; only rows whose nucleus is wider than K are sorted in full. (SmolLM2
# at temperature 1: the 0.9-nucleus fits in 1024 tokens for ~95% of rows, the 0.99-nucleus for ~50%.)
_TOP_P_CANDIDATES = 1024


def top_p_filter(logits: torch.Tensor, top_p: float, *, candidates: int = _TOP_P_CANDIDATES) -> torch.Tensor:
    """HF TopPLogitsWarper: keep the tokens whose higher-ranked mass is < top_p (always the top one); -inf the rest.

    HF phrases it ascending (drop where the ascending cumulative mass <= 1 - top_p); that is the same set as
    "mass strictly above the token < top_p" in descending order. If a row's top-K candidates (K = ``candidates``)
    already hold >= top_p mass, no token outside them can be kept, so filtering within them is exact; other rows take
    HF's full sort. After top-k, K = k finds every row's nucleus at a fraction of the default K's cost (topk(1024)
    over 49k logits of 8 rows: ~4 ms per decode step).
    """
    k = min(candidates, logits.shape[-1])
    values, idx = torch.topk(logits, k, dim=-1)  # (B, K) descending
    probs = (values - logits.logsumexp(dim=-1, keepdim=True)).exp()  # (B, K)
    cum = probs.cumsum(dim=-1)
    keep = (cum - probs) < top_p  # mass strictly above each candidate
    keep[:, 0] = True
    out = torch.full_like(logits, float("-inf")).scatter_(1, idx, values.masked_fill(~keep, float("-inf")))
    wide = (cum[:, -1] < top_p).nonzero().squeeze(1)  # rows whose nucleus may extend past the K candidates
    if k < logits.shape[-1] and wide.numel():
        out[wide] = _top_p_filter_sorted(logits[wide], top_p)
    return out


def _top_p_filter_sorted(logits: torch.Tensor, top_p: float) -> torch.Tensor:
    """HF TopPLogitsWarper's own recipe (full ascending sort) on logits (N, V)."""
    sorted_logits, sorted_idx = torch.sort(logits, descending=False)  # (N, V) ascending
    remove_sorted = sorted_logits.softmax(dim=-1).cumsum(dim=-1) <= (1 - top_p)
    remove_sorted[..., -1:] = False
    remove = remove_sorted.scatter(1, sorted_idx, remove_sorted)
    return logits.masked_fill(remove, float("-inf"))


def penalize_repetitions(logits: torch.Tensor, seen: torch.Tensor, penalty: float) -> torch.Tensor:
    """transformers' repetition penalty: logits (B, V) of the ``seen`` (B, V) tokens divided by ``penalty`` where
    positive, multiplied where negative (Keskar et al. 2019)."""
    penalized = torch.where(logits > 0, logits / penalty, logits * penalty)
    return torch.where(seen, penalized, logits)
