"""Fast batched sampling for rollouts: one prefill, then a tight decode loop over a preallocated KV cache.

Why: at rollout batch sizes a decode step is bound by streaming the weights through the matmuls (on the 2-core CPU
this was measured on, fp32 SmolLM2-135M matmuls move ~4.5 GB/s of weights, about the machine's memory bandwidth), and
HF ``generate`` adds per-step machinery on top: ``DynamicCache`` concatenation (the whole cache copied every step),
mask building, ``torch.multinomial`` (~25 ms per step at B=16, V=49k on CPU), and a prefill of every row although
rollouts repeat each prompt G times. Two paths share the sampler and the loop:

* Llama-layout models (``llama``, ``mistral``, ``qwen2``; plain or PEFT-LoRA): our own decoder over a snapshot of the
  weights -- the model's own tensors in its dtype (zero copy), or with ``dtype=torch.bfloat16`` a bf16 copy with
  q/k/v and gate/up fused and prepacked for oneDNN (half the bytes per step, AMX kernels) -- a preallocated KV cache
  written in place, and a prefill of the distinct prompts only (``_LlamaDecoder``).
* Any other decoder-only HF causal LM: the model's own forward with its own cache, driven by the same loop
  (``_HFDecoder``); this drops only ``generate``'s per-step machinery.

In the model's dtype the Llama path computes what ``generate`` computes op for op, so greedy outputs are identical.
Sampling matches ``generate``'s distribution: fp32 logits, temperature, then top-k, then top-p (HF's warper
semantics), then one draw from the softmax (by inverse CDF rather than ``torch.multinomial``: same distribution,
different random stream); greedy is ``argmax``. After a row emits an EOS id its later tokens are ``pad_token_id``, and
the loop stops as soon as every row has finished.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import weakref
from dataclasses import dataclass
from typing import Callable, Protocol

import torch
import torch.nn.functional as F
from torch import nn

from .lean import rms_norm_values
from .modules import model_device, unwrap_peft
from .shapes import pad_tokens

# Decoder-layer layouts _LlamaDecoder reproduces exactly: pre-norm RMSNorm, q/k/v/o projections (optional bias),
# RoPE from the model's own rotary module, gated MLP. Qwen3 (q/k norms), Gemma (scaled embeddings), etc. are not.
LLAMA_LAYOUTS = ("llama", "mistral", "qwen2")

# Generation-config fields that make HF ``generate`` apply extra logits processors we do not reproduce.
_EXTRA_PROCESSOR_FIELDS = {
    "repetition_penalty": (None, 1.0),
    "no_repeat_ngram_size": (None, 0),
    "bad_words_ids": (None,),
    "min_length": (None, 0),
    "min_new_tokens": (None, 0),
    "suppress_tokens": (None,),
    "begin_suppress_tokens": (None,),
    "forced_bos_token_id": (None,),
    "forced_eos_token_id": (None,),
    "sequence_bias": (None,),
    "encoder_repetition_penalty": (None, 1.0),
    "exponential_decay_length_penalty": (None,),
    "min_p": (None,),
    "typical_p": (None, 1.0),
    "epsilon_cutoff": (None, 0.0),
    "eta_cutoff": (None, 0.0),
    "top_h": (None,),
    "renormalize_logits": (None, False),
    "watermarking_config": (None,),
}


class _Unsupported(Exception):
    """The Llama fast path cannot reproduce this model exactly (the generic path or ``generate`` must be used)."""


class _Decoder(Protocol):
    def prefill(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor: ...

    def step(self, tokens: torch.Tensor, t: int) -> torch.Tensor: ...


# ---------------------------------------------------------------------------------------------------------------------
# Public API


def supports_fast_generate(model: nn.Module) -> bool:
    """Whether ``fast_generate`` reproduces ``model.generate`` for this model (else call ``generate``).

    True for decoder-only HF causal LMs (PEFT-wrapped too, except prompt-learning PEFT types, which need
    ``generate``'s virtual-token handling) whose forward takes an attention mask, position ids and a cache, and whose
    generation config adds no logits processors beyond temperature/top-k/top-p.
    """
    peft_config = getattr(model, "active_peft_config", None)
    if peft_config is not None and getattr(peft_config, "is_prompt_learning", False):
        return False
    base = unwrap_peft(model)
    config = getattr(base, "config", None)
    if config is None or getattr(config, "is_encoder_decoder", False):
        return False
    if not hasattr(base, "get_output_embeddings") or _cache_kwarg(base) is None:
        return False
    params = inspect.signature(base.forward).parameters
    if "attention_mask" not in params or "position_ids" not in params:
        return False
    return not _has_extra_processors(getattr(base, "generation_config", None))


@torch.no_grad()
def fast_generate(
    model: nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    *,
    max_new_tokens: int,
    eos_token_ids: list[int],
    pad_token_id: int,
    do_sample: bool = True,
    temperature: float = 1.0,
    top_p: float = 1.0,
    top_k: int = 0,
    generator: torch.Generator | None = None,
    dtype: torch.dtype | None = None,
    sample_fn: Callable[[torch.Tensor], torch.Tensor] | None = None,
    adapter_names: list[str] | None = None,
    backend: str = "auto",
    logprobs: bool = False,
    repetition_penalty: float = 1.0,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Completion ids (B, <=max_new_tokens) for left-padded prompts, right-padded with ``pad_token_id`` after EOS;
    with ``logprobs``, also each sampled token's log-prob under the decode's own logits divided by ``temperature``
    (no top-k / top-p filtering: the policy the loss scores, as this decode computes it), (B, same width) fp32, 0
    after EOS.

    ``input_ids``/``attention_mask``: (B, P), left-padded as ``rollout.left_pad`` builds them. ``dtype``: compute
    dtype for the decode (e.g. ``torch.bfloat16`` casts a copy of the weights; ``None`` keeps the model's dtype).
    ``generator`` seeds sampling (``None``: the global RNG, like ``generate``). ``sample_fn``: replaces the built-in
    sampler (and ``do_sample``/``temperature``/``top_k``/``top_p``/``generator``): fp32 logits (B, V) -> tokens (B,),
    called once per step on every row, finished rows included, as ``generate`` calls its logits processors -- e.g.
    ``lambda logits: RowSeededSampler(...)(None, logits).argmax(-1)`` for per-row seeded sampling.
    ``adapter_names`` (B,): PEFT adapter per row, as ``generate(adapter_names=...)``: one pass over the shared base
    weights plus each row's own low-rank delta (PEFT's unmerged mixed-batch math); the frozen base's cast copy is
    kept between calls. Without it the model's active adapters are folded into the snapshot.
    Stops early once every row has emitted one of ``eos_token_ids``. Sampling never applies dropout (the generic path
    runs the model in eval mode and restores its mode afterwards). ``backend``: ``"auto"`` (Llama fast path when the layout allows, else generic),
    ``"llama"`` (raise if it cannot be used) or ``"generic"`` (the model's own forward and cache).
    ``repetition_penalty``: transformers' penalty on the tokens of each row's prompt and completion so far, applied
    to the logits before sampling (before ``sample_fn``); the recorded log-probs do not include it.
    """
    device = model_device(model)
    input_ids, attention_mask = input_ids.to(device), attention_mask.to(device)
    batch = input_ids.shape[0]
    if adapter_names is not None and len(adapter_names) != batch:
        raise ValueError(f"adapter_names has {len(adapter_names)} names for {batch} rows")
    if max_new_tokens <= 0:
        ids = torch.empty((batch, 0), dtype=torch.long, device=device)
        return (ids, torch.empty((batch, 0), device=device)) if logprobs else ids
    # prompt lengths in a few buckets: every new prefill shape costs a cached CPU kernel (comlrl.accel.shapes)
    input_ids, attention_mask = pad_tokens(input_ids, attention_mask, left=True, pad_id=pad_token_id)
    prompt_len = input_ids.shape[1]
    decoder = _make_decoder(model, batch, prompt_len + max_new_tokens, dtype, backend, adapter_names)
    # The generic path runs the model's forward: eval mode (no dropout) for the call. The Llama path only reads
    # weights, so it skips the switch (~30 ms each way over a 6000-module PEFT model).
    generic, was_training = isinstance(decoder, _HFDecoder), model.training
    if generic:
        model.train(False)
    try:
        logits = decoder.prefill(input_ids, attention_mask)  # (B, V) fp32
        sample = sample_fn or _sampler(do_sample, temperature, top_k, top_p, generator)
        seen = None
        if repetition_penalty != 1.0:  # (B, V): tokens of each row's real prompt
            seen = torch.zeros(logits.shape, device=device).scatter_add_(1, input_ids, attention_mask.float()) > 0
        ids, logp = _decode_loop(
            decoder,
            logits,
            sample,
            max_new_tokens,
            eos_token_ids,
            pad_token_id,
            logprobs,
            temperature,
            seen,
            repetition_penalty,
        )
        return (ids, logp) if logprobs else ids
    finally:
        if generic:
            model.train(was_training)


def sample_tokens(
    logits: torch.Tensor,
    do_sample: bool = True,
    temperature: float = 1.0,
    top_k: int = 0,
    top_p: float = 1.0,
    generator: torch.Generator | None = None,
) -> torch.Tensor:
    """Next tokens (B,) from fp32 logits (B, V) with HF ``generate``'s semantics (temperature -> top-k -> top-p)."""
    return _sampler(do_sample, temperature, top_k, top_p, generator)(logits)


# ---------------------------------------------------------------------------------------------------------------------
# Sampling and the decode loop


def _sampler(
    do_sample: bool, temperature: float, top_k: int, top_p: float, generator: torch.Generator | None
) -> Callable[[torch.Tensor], torch.Tensor]:
    """A function logits (B, V) fp32 -> tokens (B,); the warpers that are no-ops are left out entirely."""
    if not do_sample:
        return lambda logits: logits.argmax(dim=-1)

    def sample(logits: torch.Tensor) -> torch.Tensor:
        if temperature != 1.0:
            logits = logits / temperature
        if top_k and top_k < logits.shape[-1]:
            # HF TopKLogitsWarper: drop everything strictly below the k-th largest (ties at the k-th are kept).
            kth = torch.topk(logits, top_k, dim=-1).values[..., -1:]  # (B, 1)
            logits = logits.masked_fill(logits < kth, float("-inf"))
        if top_p < 1.0:
            logits = _top_p_filter(logits, top_p)
        return _inverse_cdf_sample(logits.softmax(dim=-1), generator)

    return sample


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


def _top_p_filter(logits: torch.Tensor, top_p: float) -> torch.Tensor:
    """HF TopPLogitsWarper: keep the tokens whose higher-ranked mass is < top_p (always the top one); -inf the rest.

    HF phrases it ascending (drop where the ascending cumulative mass <= 1 - top_p); that is the same set as
    "mass strictly above the token < top_p" in descending order. If a row's top-K candidates already hold >= top_p
    mass, no token outside them can be kept, so filtering within them is exact; other rows take HF's full sort.
    """
    k = min(_TOP_P_CANDIDATES, logits.shape[-1])
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


def _decode_loop(
    decoder: _Decoder,
    logits: torch.Tensor,
    sample: Callable[[torch.Tensor], torch.Tensor],
    max_new_tokens: int,
    eos_token_ids: list[int],
    pad_token_id: int,
    logprobs: bool = False,
    temperature: float = 1.0,
    seen: torch.Tensor | None = None,
    repetition_penalty: float = 1.0,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Sample, record, stop rows at EOS, feed the token back; returns ids (B, steps taken) and, with ``logprobs``,
    the sampled tokens' log-probs under logits / ``temperature`` (same shape, 0 once a row is done).
    ``seen`` (B, V) bool: tokens already in each row, penalized by ``repetition_penalty`` before sampling and
    updated with every sampled token."""
    batch = logits.shape[0]
    device = logits.device
    out = torch.full((batch, max_new_tokens), pad_token_id, dtype=torch.long, device=device)  # (B, C)
    logp = torch.zeros((batch, max_new_tokens), device=device) if logprobs else None  # (B, C)
    unfinished = torch.ones(batch, dtype=torch.bool, device=device)  # (B,)
    eos = torch.tensor(eos_token_ids, dtype=torch.long, device=device)
    pad = torch.tensor(pad_token_id, dtype=torch.long, device=device)
    for t in range(max_new_tokens):
        scores = logits if seen is None else penalize_repetitions(logits, seen, repetition_penalty)
        tokens = torch.where(unfinished, sample(scores), pad)  # (B,)
        out[:, t] = tokens
        if seen is not None:
            seen[torch.arange(batch, device=device), tokens] |= unfinished
        if logp is not None:
            scored = logits.float() if temperature == 1.0 else logits.float() / temperature
            picked = scored.gather(1, tokens[:, None])[:, 0] - scored.logsumexp(dim=-1)
            logp[:, t] = picked.where(unfinished, 0.0)
        if eos.numel():
            unfinished &= ~torch.isin(tokens, eos)
        # One host sync per step; on CPU it is free, on GPU it is what generate does too.
        if t + 1 == max_new_tokens or not bool(unfinished.any()):
            return out[:, : t + 1], None if logp is None else logp[:, : t + 1]
        logits = decoder.step(tokens, t)
    return out, logp


# ---------------------------------------------------------------------------------------------------------------------
# Model inspection


def _cache_kwarg(model: nn.Module) -> str | None:
    """Name of the forward's KV-cache argument: ``cache`` (transformers >= 5.2x) or ``past_key_values`` (older)."""
    params = inspect.signature(model.forward).parameters
    for name in ("cache", "past_key_values"):
        if name in params:
            return name
    return None


def _has_extra_processors(gen_config: object | None) -> bool:
    """True when the model's generation config would make ``generate`` apply processors we do not implement."""
    if gen_config is None:
        return False
    for name, neutral in _EXTRA_PROCESSOR_FIELDS.items():
        value = getattr(gen_config, name, None)
        if value not in neutral and not (isinstance(value, (list, dict)) and not value):
            return True
    return False


def _make_decoder(
    model: nn.Module,
    batch: int,
    max_len: int,
    dtype: torch.dtype | None,
    backend: str = "auto",
    adapter_names: list[str] | None = None,
) -> _Decoder:
    """The Llama fast decoder when the model and adapters allow it (and ``backend`` permits), else the generic one."""
    if backend not in ("auto", "llama", "generic"):
        raise ValueError(f"backend must be 'auto', 'llama' or 'generic', got {backend!r}")
    if backend != "generic":
        try:
            if adapter_names is not None and set(adapter_names) != {BASE_ADAPTER}:  # base pass + per-row LoRA deltas
                return _LlamaDecoder(unwrap_peft(model), batch, max_len, dtype, BASE_ADAPTER, routed=adapter_names)
            adapter = adapter_names[0] if adapter_names else None
            return _LlamaDecoder(unwrap_peft(model), batch, max_len, dtype, adapter)
        except _Unsupported as exc:
            if backend == "llama":
                raise ValueError(f"the Llama fast path does not support this model: {exc}") from exc
    return _HFDecoder(model, batch, max_len, dtype, adapter_names)


def _prompt_positions(attention_mask: torch.Tensor) -> torch.Tensor:
    """Position ids (B, P) of a left-padded prompt, as ``generate`` builds them: cumsum - 1, pads at 1."""
    pos = attention_mask.long().cumsum(-1) - 1
    return pos.masked_fill(attention_mask == 0, 1)


# ---------------------------------------------------------------------------------------------------------------------
# Generic path: the model's own forward and cache


class _HFDecoder:
    """Drives any decoder-only HF causal LM's forward with an HF cache; only the loop and the sampler are ours."""

    def __init__(
        self, model: nn.Module, batch: int, max_len: int, dtype: torch.dtype | None, adapter_names: list[str] | None
    ) -> None:
        self.model = model
        self.adapter_names = adapter_names
        base = unwrap_peft(model)
        self.cache_kwarg = _cache_kwarg(base) or "past_key_values"
        self.keep_logits = "logits_to_keep" in inspect.signature(base.forward).parameters
        self.device = model_device(model)
        model_dtype = next(model.parameters()).dtype
        # Autocast is the only dtype switch that needs no weight copy here; it is skipped when it would be a no-op.
        self.autocast = dtype is not None and dtype != model_dtype
        self.dtype = dtype
        self.mask = torch.ones((batch, max_len), dtype=torch.long, device=self.device)  # (B, T) grows via slicing
        self.cache: object | None = _static_cache(base, max_len)
        self.next_pos: torch.Tensor | None = None  # (B, 1)
        self.prompt_len = 0

    def _forward(self, ids: torch.Tensor, mask: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        kwargs = {"input_ids": ids, "attention_mask": mask, "position_ids": pos, "use_cache": True}
        if self.cache is not None:
            kwargs[self.cache_kwarg] = self.cache
        if self.keep_logits:
            kwargs["logits_to_keep"] = 1
        if self.adapter_names is not None:
            kwargs["adapter_names"] = self.adapter_names
        with torch.autocast(self.device.type, dtype=self.dtype or torch.bfloat16, enabled=self.autocast):
            out = self.model(**kwargs)
        self.cache = out.get("cache", None) if "cache" in out else out.get("past_key_values", None)
        return out.logits[:, -1].float()  # (B, V)

    def prefill(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        self.prompt_len = input_ids.shape[1]
        self.mask[:, : self.prompt_len] = attention_mask
        self.next_pos = attention_mask.long().sum(-1, keepdim=True)  # (B, 1): first generated token's position
        return self._forward(input_ids, attention_mask, _prompt_positions(attention_mask))

    def step(self, tokens: torch.Tensor, t: int) -> torch.Tensor:
        mask = self.mask[:, : self.prompt_len + t + 1]  # (B, P+t+1)
        return self._forward(tokens[:, None], mask, self.next_pos + t)


def _static_cache(base: nn.Module, max_len: int) -> object | None:
    """A preallocated HF ``StaticCache`` when the model declares it compile/static-cache ready, else None (the model
    then makes its own dynamic cache). Why: a static cache writes K/V in place instead of concatenating the whole
    cache every step (~5-15% per step for SmolLM2 on CPU)."""
    if not getattr(base, "_can_compile_fullgraph", False):
        return None
    try:
        from transformers import StaticCache

        return StaticCache(config=base.config, max_cache_len=max_len)
    except (ImportError, TypeError, ValueError, AttributeError):  # signature or config it cannot size: dynamic cache
        return None


# ---------------------------------------------------------------------------------------------------------------------
# Llama fast path: weight snapshot, static KV cache, our own layer math


BASE_ADAPTER = "__base__"  # PEFT's adapter name for "no adapter" in ``adapter_names``


def _linear_weight(module: nn.Module, adapter: str | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(weight, bias) this projection actually applies: plain ``nn.Linear``, or a PEFT LoRA layer with its deltas added.

    PEFT semantics mirrored: ``adapter`` None -> adapters disabled or merged: the base layer alone, else base + every
    active adapter's ``get_delta_weight`` (dropout is the identity in eval mode); ``adapter`` given (one name for the
    whole batch, as ``adapter_names`` routes it) -> base + that adapter's delta, or the base for ``"__base__"``.
    DoRA, LoRA bias and other PEFT layer types raise ``_Unsupported``.
    """
    if type(module) is nn.Linear:
        return module.weight, module.bias
    base = getattr(module, "base_layer", None)
    if type(base) is not nn.Linear or not hasattr(module, "lora_A") or not hasattr(module, "get_delta_weight"):
        raise _Unsupported(f"projection {type(module).__name__}")
    disabled, merged = bool(getattr(module, "disable_adapters", False)), bool(getattr(module, "merged", False))
    if adapter is not None:
        if merged:
            raise _Unsupported("adapter_names with merged adapters")  # PEFT refuses this too
        names = [] if adapter == BASE_ADAPTER else [adapter]
    elif disabled and merged:
        raise _Unsupported("disabled but merged adapters")
    else:
        names = [] if disabled or merged else list(module.active_adapters)
    weight = base.weight
    for name in names:
        if name not in module.lora_A:
            continue
        if getattr(module, "use_dora", {}).get(name) or getattr(module, "lora_bias", {}).get(name):
            raise _Unsupported("DoRA / LoRA bias")
        weight = weight + module.get_delta_weight(name).to(weight.dtype)
    return weight, base.bias


class _Routing:
    """Which rows of the current forward go through which LoRA adapter (shared by every projection of a decoder).

    ``slots`` (B,): each batch row's adapter index into ``names`` (-1: the base alone). ``use`` sets the rows of the
    forward being run (the B rows when decoding, the distinct rows during prefill). A projection stacks every
    adapter's factors, A (sum R, in) and B (sum R, out), and keeps each row's own columns with a 0/1 mask, so all
    adapters cost two small matmuls per projection whatever the batch's mix.
    """

    def __init__(self, adapter_names: list[str], device: torch.device) -> None:
        self.names = sorted({n for n in adapter_names if n != BASE_ADAPTER})
        index = {n: j for j, n in enumerate(self.names)}
        self.slots = torch.tensor([index.get(n, -1) for n in adapter_names], dtype=torch.long, device=device)  # (B,)
        self.use(self.slots)

    def use(self, slots: torch.Tensor) -> None:
        """Route the next forwards' rows by ``slots`` (one adapter index per input row)."""
        self.rows = slots
        self._masks: dict[tuple, torch.Tensor] = {}
        # Rows in equal contiguous blocks, one per adapter in order (a LoRA team's rollout): rows per block, else None.
        n, k = len(self.names), len(slots) // max(len(self.names), 1)
        blocks = torch.arange(n, device=slots.device).repeat_interleave(k)
        self.block_rows = k if n and k * n == len(slots) and torch.equal(slots, blocks) else None

    def mask(self, ranks: tuple[int, ...]) -> torch.Tensor:
        """(N, sum ranks) fp32 0/1: row n keeps the columns of its own adapter (ranks[j] columns for adapter j)."""
        if ranks not in self._masks:
            device = self.rows.device
            cols = torch.repeat_interleave(torch.arange(len(ranks), device=device), torch.tensor(ranks, device=device))
            self._masks[ranks] = (self.rows[:, None] == cols[None, :]).float()
        return self._masks[ranks]


@dataclass
class _LoRA:
    """Every adapter's factors of one (possibly fused) projection, stacked: rows routed to adapter j get
    x A_j^T B_j (the scaling folded into B), as PEFT's unmerged mixed-batch forward adds lora_B(lora_A(x)) * scaling.

    The factors stay fp32 whatever the decode dtype: at these shapes (a few rows x rank 16) fp32 matmuls are ~5x
    faster than bf16 ones on CPU (measured 5-7 us vs 24-33 us), and the delta is added onto the base output.
    """

    a: torch.Tensor  # (in, sum R) fp32 (A transposed: x @ a beats F.linear(x, A) ~2x at these shapes)
    b: torch.Tensor  # (sum R, out) fp32
    ranks: tuple[int, ...]  # R_j per adapter slot (0: that adapter does not touch this projection)
    routing: _Routing

    def __post_init__(self) -> None:
        # Per-adapter views (n, in, R) / (n, R, out) for rows in adapter blocks: two bmm, no mask, half the FLOPs
        # (measured 52 vs 63 us per projection at 8 rows; the LoRA deltas were ~24% of a routed decode step).
        r, n = self.ranks[0], len(self.ranks)
        same = r > 0 and all(rank == r for rank in self.ranks)
        self.a_blocks = self.a.view(self.a.shape[0], n, r).permute(1, 0, 2).contiguous() if same else None
        self.b_blocks = self.b.view(n, r, self.b.shape[1]) if same else None

    def add_to(self, y: torch.Tensor, x: torch.Tensor) -> None:
        """y (N, S, out) += each row's own low-rank delta of x (N, S, in), in place."""
        k = self.routing.block_rows
        if k is not None and self.a_blocks is not None and y.is_contiguous():
            n, seq = len(self.ranks), x.shape[1]
            xs = x.reshape(n, k * seq, x.shape[-1]).float()  # (n adapters, rows*S, in)
            y.view(n, k * seq, -1).add_(torch.bmm(torch.bmm(xs, self.a_blocks), self.b_blocks))
            return
        xa = torch.matmul(x.float(), self.a) * self.routing.mask(self.ranks)[:, None, :]  # (N, S, sum R)
        y.add_(torch.matmul(xa, self.b))


@dataclass
class _Linear:
    """One projection y = x W^T + b in compute dtype; W may be prepacked into oneDNN's blocked layout; ``lora`` adds
    per-row adapter deltas on top."""

    weight: torch.Tensor | None  # (out, in); None when only the packed copy is kept
    bias: torch.Tensor | None  # (out,)
    packed: torch.Tensor | None = None  # opaque oneDNN weight, same values as ``weight``
    lora: _LoRA | None = None
    weight_first: bool = False  # compute (W x^T)^T: the weight as gemm's first operand

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if self.packed is not None:
            # The oneDNN kernel reads x by its dense layout, ignoring strides: a non-contiguous x gives wrong results.
            y = torch.ops.mkldnn._linear_pointwise(x.contiguous(), self.packed, self.bias, "none", [], "")
        elif self.weight_first:
            y = torch.mm(self.weight, x.reshape(-1, x.shape[-1]).T).T.contiguous().view(*x.shape[:-1], -1)
            if self.bias is not None:
                y = y + self.bias
        else:
            y = F.linear(x, self.weight, self.bias)
        if self.lora is not None:
            self.lora.add_to(y, x)
        return y


def _can_prepack(dtype: torch.dtype, device: torch.device) -> bool:
    """Whether weights in ``dtype`` can be fused and prepacked for oneDNN (x86 CPU builds with mkldnn).

    Why: at decode shapes (a few rows) oneDNN's kernels on a blocked weight layout stream weights much faster than
    ``F.linear``. bf16: bitwise equal to ``F.linear`` and ~15-30% faster per decode step. fp32: MKL's sgemm at 4
    rows streamed ~11 GB/s against oneDNN's ~39 GB/s on the (V, H) output layer; a 64-token rollout of SmolLM2-135M
    at batch 4 went 4.23 -> 3.41 s (median of 5 interleaved, the per-call fused copy included). fp32 results differ
    from ``F.linear`` in summation order only (~1e-7 relative).
    """
    return (
        dtype in (torch.bfloat16, torch.float32)
        and device.type == "cpu"
        and torch.backends.mkldnn.is_available()
        and hasattr(torch.ops.mkldnn, "_reorder_linear_weight")
        and (dtype != torch.bfloat16 or _mkldnn_bf16_supported())
    )


@functools.cache
def _mkldnn_bf16_supported() -> bool:
    """Whether this CPU has oneDNN's bf16 kernels (AVX-512 BF16 / AMX / AVX-NE-CONVERT); an AVX2-only CPU does
    not, and the packed bf16 path raises there."""
    check = getattr(torch.ops.mkldnn, "_is_mkldnn_bf16_supported", None)
    return bool(check is not None and check())


def _projections(
    mods: list[nn.Module],
    dtype: torch.dtype,
    adapter: str | None,
    pack_rows: int,
    routing: _Routing | None = None,
    output_layer: bool = False,
) -> list[_Linear]:
    """Projections that read the same input, in ``dtype``: fused into one when a copy is made anyway, prepacked for
    oneDNN when possible (``pack_rows``: the batch size to tune the packing for). ``routing``: add each row's own
    LoRA adapter on top of the base weights (``adapter`` is then ``BASE_ADAPTER``)."""
    linears = _base_projections(mods, dtype, adapter, pack_rows, output_layer)
    if routing is not None:
        groups = [[m] for m in mods] if len(linears) == len(mods) else [mods]
        for linear, group in zip(linears, groups):
            linear.lora = _stacked_lora(group, routing)
    return linears


@torch.no_grad()
def _stacked_lora(mods: list[nn.Module], routing: _Routing) -> _LoRA | None:
    """Every routed adapter's factors over projections fused on their output dim, fp32: adapter j's A rows
    stacked, its B block-diagonal over the fused outputs with the scaling folded in. None if no adapter applies."""
    a_parts, b_parts, ranks = [], [], []
    outs = [_linear_weight(m, BASE_ADAPTER)[0].shape[0] for m in mods]
    for name in routing.names:
        rank = 0
        for k, m in enumerate(mods):
            if name not in getattr(m, "lora_A", {}):
                continue
            if getattr(m, "use_dora", {}).get(name) or getattr(m, "lora_bias", {}).get(name):
                raise _Unsupported("DoRA / LoRA bias")
            a, b = m.lora_A[name].weight, m.lora_B[name].weight  # (r, in), (out_k, r)
            block = b.new_zeros(a.shape[0], sum(outs))  # (r, sum out): zero outside projection k's outputs
            block[:, sum(outs[:k]) : sum(outs[: k + 1])] = (b * m.scaling[name]).T
            a_parts.append(a)
            b_parts.append(block)
            rank += a.shape[0]
        ranks.append(rank)
    if not a_parts:
        return None
    return _LoRA(torch.cat(a_parts).float().T.contiguous(), torch.cat(b_parts).float(), tuple(ranks), routing)


# Cast/fused/prepacked copies of frozen weights (a LoRA team's shared base), reused by later calls while the weights
# are unchanged: building them costs ~0.2 s per call for SmolLM2-135M in bf16, ~7% of a 64-token rollout.
_SNAPSHOTS: "weakref.WeakKeyDictionary[nn.Module, tuple[tuple, list[_Linear]]]" = weakref.WeakKeyDictionary()


def _base_projections(
    mods: list[nn.Module], dtype: torch.dtype, adapter: str | None, pack_rows: int, output_layer: bool = False
) -> list[_Linear]:
    """The projections' weights (LoRA deltas of ``adapter`` folded in) in ``dtype``, fused/prepacked as above
    (``output_layer``: the vocabulary projection)."""
    pairs = [_linear_weight(m, adapter) for m in mods]
    own = [getattr(m, "base_layer", m) for m in mods]
    frozen = all(w is o.weight and b is o.bias and not w.requires_grad for (w, b), o in zip(pairs, own))
    if pairs[0][0].dtype == dtype and not _can_prepack(dtype, pairs[0][0].device):
        return [_Linear(w, b) for w, b in pairs]  # the model's own tensors (or merged LoRA weights), no copy
    if (
        dtype == torch.float32
        and not output_layer
        and all(w.dtype == dtype for w, _ in pairs)
        and sum(w.shape[0] for w, _ in pairs) >= pairs[0][0].shape[1]
    ):
        # fp32 projections with at least as many outputs as inputs (q/k/v, o, gate/up): the weights as they are, as
        # gemm's first operand. At decode rows (4, one thread) MKL streams them at 11-15 GB/s this way, about as fast
        # as oneDNN's packed copy (gate 0.64 vs 0.89 ms, q/k/v-sized 0.15 vs 0.13 ms), and no fp32 copy of them is
        # made (2 agents' full fine-tune decoding at once: peak 4.55 -> 4.37-4.39 GB, same rollout time). The down
        # projection and the output layer stream ~1.5-2x faster packed (0.22 vs 0.50 ms, 6.0 vs 8.8 ms): copied.
        return [_Linear(w, b, weight_first=True) for w, b in pairs]
    # Frozen weights: the copy is made once and cached -- except in fp32, where a kept copy would double the weights'
    # resident memory; there it lives for one call (a transient ~1x of the weights, ~0.15 s for SmolLM2-135M).
    cache = frozen and dtype != torch.float32
    key = (dtype, pack_rows, tuple((t.data_ptr(), t._version) for w, b in pairs for t in (w, b) if t is not None))
    if cache and mods[0] in _SNAPSHOTS and _SNAPSHOTS[mods[0]][0] == key:
        return [dataclasses.replace(linear) for linear in _SNAPSHOTS[mods[0]][1]]
    linears = _copied_projections(pairs, dtype, pack_rows)
    if cache:
        _SNAPSHOTS[mods[0]] = (key, linears)
        linears = [dataclasses.replace(linear) for linear in linears]
    return linears


def _copied_projections(
    pairs: list[tuple[torch.Tensor, torch.Tensor | None]], dtype: torch.dtype, pack_rows: int
) -> list[_Linear]:
    """One projection over the (weight, bias) pairs concatenated on the output dim, cast to ``dtype``."""
    if len(pairs) == 1:
        weight = pairs[0][0].to(dtype)
    else:
        weight = _cat_cast([w for w, _ in pairs], dtype)  # (sum out, in)
    bias = None
    if any(b is not None for _, b in pairs):
        bias = torch.cat(
            [b.to(dtype) if b is not None else torch.zeros(w.shape[0], dtype=dtype, device=w.device) for w, b in pairs]
        )
    if _can_prepack(dtype, weight.device):
        return [_Linear(None, bias, torch.ops.mkldnn._reorder_linear_weight(weight, pack_rows))]
    return [_Linear(weight, bias)]


def _cat_cast(tensors: list[torch.Tensor], dtype: torch.dtype) -> torch.Tensor:
    """``torch.cat`` along dim 0 into ``dtype`` in one pass (cast-then-cat would write every weight twice)."""
    out = torch.empty((sum(t.shape[0] for t in tensors), *tensors[0].shape[1:]), dtype=dtype, device=tensors[0].device)
    offset = 0
    for t in tensors:
        out[offset : offset + t.shape[0]].copy_(t)
        offset += t.shape[0]
    return out


def _linears(x: torch.Tensor, projections: list[_Linear]) -> torch.Tensor:
    """Outputs of the (possibly fused) projections of x, concatenated on the last dim."""
    if len(projections) == 1:
        return projections[0](x)
    return torch.cat([proj(x) for proj in projections], dim=-1)


Projections = list[_Linear]


@dataclass
class _LayerWeights:
    """One decoder layer's weights in compute dtype; ``qkv``/``gate_up`` outputs are concatenated in that order."""

    ln1: torch.Tensor  # (H,)
    ln1_eps: float
    qkv: Projections  # -> (..., (Hq + 2 Hkv) * D)
    o: Projections  # -> (..., H)
    ln2: torch.Tensor  # (H,)
    ln2_eps: float
    gate_up: Projections  # -> (..., 2 I)
    down: Projections  # -> (..., H)
    act: Callable[[torch.Tensor], torch.Tensor]


def _check_llama_layout(base: nn.Module, max_len: int) -> None:
    """Raise ``_Unsupported`` unless ``base`` is a Llama-layout causal LM we reproduce exactly at this length."""
    config = getattr(base, "config", None)
    if config is None or getattr(config, "model_type", None) not in LLAMA_LAYOUTS:
        raise _Unsupported(f"model_type {getattr(config, 'model_type', None)}")
    if window_exceeded(config, max_len):
        raise _Unsupported("sliding-window attention longer than the window")
    inner = getattr(base, "model", None)
    if inner is None or type(getattr(inner, "embed_tokens", None)) is not nn.Embedding:
        raise _Unsupported("embedding")
    for layer in inner.layers:
        attn = layer.self_attn
        extra = {n for n, _ in attn.named_children()} - {"q_proj", "k_proj", "v_proj", "o_proj"}
        if extra or not hasattr(layer.mlp, "gate_proj"):
            raise _Unsupported(f"attention/mlp submodules {sorted(extra)}")
    if any(not _harmless_hooks(h) for h in base.modules()):
        raise _Unsupported("forward hooks")


def window_exceeded(config: object, length: int) -> bool:
    """Whether a Llama-layout model's sliding-window attention would act on sequences of ``length`` tokens (the
    window is a no-op while the whole sequence fits in it). Mistral windows every layer, Qwen2 only the layers its
    ``layer_types`` mark as sliding."""
    window = getattr(config, "sliding_window", None)
    layer_types = getattr(config, "layer_types", None) or []
    windowed = getattr(config, "model_type", None) == "mistral" or any(k != "full_attention" for k in layer_types)
    return bool(windowed and window is not None and length > window)


def _harmless_hooks(module: nn.Module) -> bool:
    """Whether the module's forward hooks (if any) leave its outputs' values alone: the only one known to is the
    ``requires_grad`` switch transformers puts on the input embeddings for gradient checkpointing / PEFT."""
    hooks = [*module._forward_hooks.values(), *module._forward_pre_hooks.values()]
    return all(getattr(h, "__name__", "") == "make_inputs_require_grads" for h in hooks)


class _LlamaDecoder:
    """Llama-layout forward over a weight snapshot and a static KV cache; the whole batch advances in lockstep."""

    def __init__(
        self,
        base: nn.Module,
        batch: int,
        max_len: int,
        dtype: torch.dtype | None,
        adapter: str | None = None,
        routed: list[str] | None = None,
    ) -> None:
        _check_llama_layout(base, max_len)
        self.adapter, self.batch = adapter, batch
        config = base.config
        inner = base.model
        self.routing = _Routing(routed, inner.embed_tokens.weight.device) if routed is not None else None
        self.dtype = dtype or inner.embed_tokens.weight.dtype
        self.n_heads = config.num_attention_heads
        self.n_kv = getattr(config, "num_key_value_heads", None) or self.n_heads
        self.head_dim = getattr(config, "head_dim", None) or config.hidden_size // self.n_heads
        self.scaling = inner.layers[0].self_attn.scaling
        self.rotary = inner.rotary_emb
        self.embed = inner.embed_tokens.weight  # (V, H): rows are gathered then cast, no full copy
        self.lm_head = _projections([base.lm_head], self.dtype, adapter, batch, self.routing, output_layer=True)
        self.norm_w = inner.norm.weight.to(self.dtype)
        self.norm_eps = inner.norm.variance_epsilon
        self.layers = [self._layer_weights(layer) for layer in inner.layers]
        n_layers, device = len(self.layers), self.embed.device
        shape = (n_layers, batch, self.n_kv, max_len, self.head_dim)
        self.k_cache = torch.zeros(shape, dtype=self.dtype, device=device)  # (L, B, Hkv, T, D)
        self.v_cache = torch.zeros(shape, dtype=self.dtype, device=device)
        # Additive key mask (0 / -inf) shared by all layers: SDPA would otherwise convert a bool mask once per layer.
        self.key_bias = torch.zeros((batch, 1, 1, max_len), dtype=self.dtype, device=device)  # (B, 1, 1, T)
        self.next_pos: torch.Tensor | None = None  # (B, 1)
        self.prompt_len = 0

    def _layer_weights(self, layer: nn.Module) -> _LayerWeights:
        attn, mlp = layer.self_attn, layer.mlp
        ln1, ln2 = layer.input_layernorm, layer.post_attention_layernorm
        return _LayerWeights(
            ln1=ln1.weight.to(self.dtype),
            ln1_eps=ln1.variance_epsilon,
            qkv=_projections(
                [attn.q_proj, attn.k_proj, attn.v_proj], self.dtype, self.adapter, self.batch, self.routing
            ),
            o=_projections([attn.o_proj], self.dtype, self.adapter, self.batch, self.routing),
            ln2=ln2.weight.to(self.dtype),
            ln2_eps=ln2.variance_epsilon,
            gate_up=_projections([mlp.gate_proj, mlp.up_proj], self.dtype, self.adapter, self.batch, self.routing),
            down=_projections([mlp.down_proj], self.dtype, self.adapter, self.batch, self.routing),
            act=mlp.act_fn,
        )

    def prefill(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """Run the prompts once per *distinct* row, fill every row's cache; logits (B, V) of the last position.

        Rollouts repeat each prompt G times, so prefilling only the distinct (ids, mask) rows cuts the prefill --
        a compute-bound pass over B * P tokens -- by G; the rows' K/V and logits are then gathered back to B.
        """
        self.prompt_len = input_ids.shape[1]
        self.next_pos = attention_mask.long().sum(-1, keepdim=True)  # (B, 1)
        self.key_bias[:, 0, 0, : self.prompt_len] = additive_mask(attention_mask.bool(), self.dtype)
        rows = torch.cat([input_ids, attention_mask.to(input_ids.dtype)], dim=1)  # (B, 2P)
        if self.routing is not None:  # rows of different adapters are distinct rows; slot first keeps them grouped
            rows = torch.cat([self.routing.slots[:, None].to(rows.dtype), rows], dim=1)  # (B, 1+2P)
        uniq, inverse = torch.unique(rows, dim=0, return_inverse=True)  # (U, [1+]2P), (B,)
        if self.routing is not None:
            self.routing.use(uniq[:, 0])
            uniq = uniq[:, 1:]
        ids, mask = uniq[:, : self.prompt_len], uniq[:, self.prompt_len :]  # (U, P) each
        real = mask.bool()
        plen = self.prompt_len
        causal = torch.ones((plen, plen), dtype=torch.bool, device=real.device).tril()  # (P, P)
        # Pad queries attend to themselves so their rows never become all-masked NaNs (their K/V are masked anyway,
        # but a NaN value would still poison real rows through 0 * NaN in the value matmul).
        eye = torch.eye(plen, dtype=torch.bool, device=real.device)
        bias = additive_mask((causal & real[:, None, None, :]) | eye, self.dtype)  # (U, 1, P, P)
        logits = self._forward(ids, _prompt_positions(mask), bias, start=0, rows=inverse)  # (U, V)
        if self.routing is not None:
            self.routing.use(self.routing.slots)  # decoding runs all B rows
        return logits[inverse]  # (B, V)

    def step(self, tokens: torch.Tensor, t: int) -> torch.Tensor:
        start = self.prompt_len + t
        bias = self.key_bias[..., : start + 1]  # (B, 1, 1, start+1)
        return self._forward(tokens[:, None], self.next_pos + t, bias, start=start)

    def _forward(
        self, ids: torch.Tensor, pos: torch.Tensor, bias: torch.Tensor, start: int, rows: torch.Tensor | None = None
    ) -> torch.Tensor:
        """Run all layers on ids (N, S) at cache slots [start, start+S); return last-position logits (N, V) fp32.

        ``rows`` (B,): prefill of distinct rows only -- cache row b receives the K/V of input row ``rows[b]``.
        """
        x = F.embedding(ids, self.embed).to(self.dtype)  # (N, S, H)
        cos, sin = self.rotary(x, pos)  # (N, S, D) each, already in x.dtype with the rope attention scaling
        half = self.head_dim // 2
        # rotate_half(x) * sin == roll(x, D/2) * [-sin_lo, sin_hi]: one roll instead of slice/neg/cat (exact: only a
        # sign moves between factors).
        sin = torch.cat([-sin[..., :half], sin[..., half:]], dim=-1)
        cos, sin = cos[:, :, None, :], sin[:, :, None, :]  # (N, S, 1, D)
        for i, w in enumerate(self.layers):
            x = x + self._attention(i, w, rms_norm_values(x, w.ln1, w.ln1_eps), cos, sin, bias, start, rows)
            h = _linears(rms_norm_values(x, w.ln2, w.ln2_eps), w.gate_up)  # (N, S, 2I)
            gate, up = h.chunk(2, dim=-1)
            x = x + _linears(w.act(gate) * up, w.down)
        x = rms_norm_values(x[:, -1], self.norm_w, self.norm_eps)  # (N, H)
        return _linears(x, self.lm_head).float()  # (N, V)

    def _attention(
        self,
        i: int,
        w: _LayerWeights,
        h: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        bias: torch.Tensor,
        start: int,
        rows: torch.Tensor | None,
    ) -> torch.Tensor:
        """Self-attention of h (N, S, H) for layer i, writing its K/V into the cache; returns (N, S, H)."""
        n, seq, _ = h.shape
        nq, nkv, d = self.n_heads, self.n_kv, self.head_dim
        qkv = _linears(h, w.qkv).view(n, seq, nq + 2 * nkv, d)  # (N, S, Hq+2Hkv, D)
        qk = qkv[:, :, : nq + nkv]
        qk = qk * cos + qk.roll(d // 2, dims=-1) * sin  # RoPE on q and k heads at once, (N, S, Hq+Hkv, D)
        keys = qk[:, :, nq:].transpose(1, 2)  # (N, Hkv, S, D)
        values = qkv[:, :, nq + nkv :].transpose(1, 2)
        end = start + seq
        if rows is None:
            self.k_cache[i, :, :, start:end] = keys
            self.v_cache[i, :, :, start:end] = values
            keys, values = self.k_cache[i, :, :, :end], self.v_cache[i, :, :, :end]  # (B, Hkv, T, D)
        else:
            self.k_cache[i, :, :, start:end] = keys[rows]
            self.v_cache[i, :, :, start:end] = values[rows]
        if seq == 1:
            # Decode: the n_rep query heads sharing a KV head become n_rep "query positions" of that head (HF's
            # pack_gqa), so no K/V repeat is materialised.
            q = qk[:, 0, :nq].reshape(n, nkv, nq // nkv, d)  # (N, Hkv, n_rep, D)
            out = F.scaled_dot_product_attention(q, keys, values, attn_mask=bias, scale=self.scaling)
            out = out.reshape(n, 1, nq * d)
        else:
            # Prefill: repeat K/V like HF's sdpa path does for masked GQA, so the kernel and its rounding match.
            rep = nq // nkv
            keys, values = keys.repeat_interleave(rep, dim=1), values.repeat_interleave(rep, dim=1)  # (N, Hq, S, D)
            q = qk[:, :, :nq].transpose(1, 2)  # (N, Hq, S, D)
            out = F.scaled_dot_product_attention(q, keys, values, attn_mask=bias, scale=self.scaling)
            out = out.transpose(1, 2).reshape(n, seq, nq * d)
        return _linears(out, w.o)


def additive_mask(allowed: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Bool mask -> additive attention bias in ``dtype``: 0 where attending is allowed, -inf elsewhere."""
    return torch.zeros(allowed.shape, dtype=dtype, device=allowed.device).masked_fill_(~allowed, float("-inf"))
