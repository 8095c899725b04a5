"""Fast batched sampling for rollouts: one prefill, then a tight decode loop over a preallocated KV cache.

Why: at rollout batch sizes a decode step is bound by streaming the weights through the matmuls (on the 2-core CPU
this was measured on, fp32 SmolLM2-135M matmuls move ~4.5 GB/s of weights, about the machine's memory bandwidth), and
HF ``generate`` adds per-step machinery on top: ``DynamicCache`` concatenation (the whole cache copied every step),
mask building, ``torch.multinomial`` (~25 ms per step at B=16, V=49k on CPU), and a prefill of every row although
rollouts repeat each prompt G times. Two paths share the sampler and the loop:

* Llama-layout models (``llama``, ``mistral``, ``qwen2``; plain or PEFT-LoRA): our own decoder over a snapshot of the
  weights -- the model's own tensors in its dtype (zero copy), or with ``dtype=torch.bfloat16`` a bf16 copy with
  q/k/v and gate/up fused and prepacked for oneDNN (half the bytes per step, AMX kernels) -- a preallocated KV cache
  written in place, and a prefill of the distinct prompts only (:class:`comlrl.accel.llama_decoder.LlamaDecoder`,
  its weights from :mod:`comlrl.accel.decode_weights`).
* Any other decoder-only HF causal LM: the model's own forward with its own cache, driven by the same loop
  (``_HFDecoder``, here); this drops only ``generate``'s per-step machinery.

In the model's dtype the Llama path computes what ``generate`` computes op for op, so greedy outputs are identical.
Sampling matches ``generate``'s distribution: fp32 logits, temperature, then top-k, then top-p (HF's warper
semantics), then one draw from the softmax (by inverse CDF rather than ``torch.multinomial``: same distribution,
different random stream; :mod:`comlrl.accel.sampler`); greedy is ``argmax``. After a row emits an EOS id its later
tokens are ``pad_token_id``, and the loop stops as soon as every row has finished.
"""

from __future__ import annotations

import inspect
from typing import Callable, Protocol

import torch
from torch import nn

# LLAMA_LAYOUTS, additive_mask, window_exceeded and inverse_cdf_pick are importable from here too (re-exported)
from .decode_weights import BASE_ADAPTER, Unsupported, WeightLoan
from .llama_decoder import LLAMA_LAYOUTS, LlamaDecoder, additive_mask, prompt_positions, window_exceeded  # noqa: F401
from .modules import model_device, unwrap_peft
from .sampler import (  # noqa: F401
    SamplerSettings,
    inverse_cdf_pick,
    penalize_repetitions,
    sampler_logprobs,
    token_sampler,
)
from .shapes import pad_tokens

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
    lend_weights: bool = False,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Completion ids (B, <=max_new_tokens) for left-padded prompts, right-padded with ``pad_token_id`` after EOS;
    with ``logprobs``, also each sampled token's log-prob under the distribution it was drawn from, as this decode
    computes it: the repetition penalty, ``temperature``, ``top_k`` and ``top_p`` applied and renormalized over the
    kept tokens (:func:`comlrl.accel.sampler.sampler_logprobs`, vLLM's ``processed_logprobs``; greedy: the
    temperature and penalty only), (B, same width) fp32, 0 after EOS.

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
    to the logits before sampling (before ``sample_fn``) and in the recorded log-probs.
    ``lend_weights``: on the Llama path in fp32, the decode holds the model's weights packed for oneDNN in place of
    its own tensors during the call (faster, no copy; :class:`comlrl.accel.decode_weights.WeightLoan`) and restores
    them bit for bit before returning: nothing else may use the model, from another thread, meanwhile.
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
    loan = WeightLoan() if lend_weights else None
    generic = was_training = False
    try:
        decoder = _make_decoder(
            model,
            batch=batch,
            max_len=prompt_len + max_new_tokens,
            dtype=dtype,
            backend=backend,
            adapter_names=adapter_names,
            loan=loan,
        )
        # The generic path runs the model's forward: eval mode (no dropout) for the call. The Llama path only reads
        # weights, so it skips the switch (~30 ms each way over a 6000-module PEFT model).
        generic, was_training = isinstance(decoder, _HFDecoder), model.training
        if generic:
            model.train(False)
        logits = decoder.prefill(input_ids, attention_mask)  # (B, V) fp32
        sample = sample_fn or token_sampler(
            do_sample, temperature=temperature, top_k=top_k, top_p=top_p, generator=generator
        )
        seen = None
        if repetition_penalty != 1.0:  # (B, V): tokens of each row's real prompt
            seen = torch.zeros(logits.shape, device=device).scatter_add_(1, input_ids, attention_mask.float()) > 0
        ids, logp = _decode_loop(
            decoder,
            logits,
            sample,
            max_new_tokens=max_new_tokens,
            eos_token_ids=eos_token_ids,
            pad_token_id=pad_token_id,
            logprobs=logprobs,
            scoring=SamplerSettings(temperature=temperature, top_k=top_k, top_p=top_p)
            if do_sample
            else SamplerSettings(temperature=temperature),
            seen=seen,
            repetition_penalty=repetition_penalty,
        )
        return (ids, logp) if logprobs else ids
    finally:
        if loan is not None:  # also when building the decoder failed half-way
            loan.give_back()
        if generic:
            model.train(was_training)


def sample_tokens(
    logits: torch.Tensor,
    *,
    do_sample: bool = True,
    temperature: float = 1.0,
    top_k: int = 0,
    top_p: float = 1.0,
    generator: torch.Generator | None = None,
) -> torch.Tensor:
    """Next tokens (B,) from fp32 logits (B, V) with HF ``generate``'s semantics (temperature -> top-k -> top-p)."""
    return token_sampler(do_sample, temperature=temperature, top_k=top_k, top_p=top_p, generator=generator)(logits)


# ---------------------------------------------------------------------------------------------------------------------
# The decode loop


def _decode_loop(
    decoder: _Decoder,
    logits: torch.Tensor,
    sample: Callable[[torch.Tensor], torch.Tensor],
    *,
    max_new_tokens: int,
    eos_token_ids: list[int],
    pad_token_id: int,
    logprobs: bool = False,
    scoring: SamplerSettings | None = None,
    seen: torch.Tensor | None = None,
    repetition_penalty: float = 1.0,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Sample, record, stop rows at EOS, feed the token back; returns ids (B, steps taken) and, with ``logprobs``,
    the sampled tokens' log-probs under the penalized logits processed as ``scoring`` says (its temperature, top-k,
    top-p; None: none of them; same shape, 0 once a row is done).
    ``seen`` (B, V) bool: tokens already in each row, penalized by ``repetition_penalty`` before sampling and
    updated with every sampled token."""
    batch = logits.shape[0]
    device = logits.device
    out = torch.full((batch, max_new_tokens), pad_token_id, dtype=torch.long, device=device)  # (B, C)
    logp = torch.zeros((batch, max_new_tokens), device=device) if logprobs else None  # (B, C)
    unfinished = torch.ones(batch, dtype=torch.bool, device=device)  # (B,)
    eos = torch.tensor(eos_token_ids, dtype=torch.long, device=device)
    pad = torch.tensor(pad_token_id, dtype=torch.long, device=device)
    scoring = scoring or SamplerSettings()
    for t in range(max_new_tokens):
        scores = logits if seen is None else penalize_repetitions(logits, seen, repetition_penalty)
        tokens = torch.where(unfinished, sample(scores), pad)  # (B,)
        out[:, t] = tokens
        if seen is not None:
            seen[torch.arange(batch, device=device), tokens] |= unfinished
        if logp is not None:
            logp[:, t] = sampler_logprobs(scores, tokens, scoring).where(unfinished, 0.0)
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
    *,
    batch: int,
    max_len: int,
    dtype: torch.dtype | None,
    backend: str = "auto",
    adapter_names: list[str] | None = None,
    loan: WeightLoan | None = None,
) -> _Decoder:
    """The Llama fast decoder when the model and adapters allow it (and ``backend`` permits), else the generic one
    (``loan``: see :class:`comlrl.accel.decode_weights.WeightLoan`; only the Llama decoder takes weights on it)."""
    if backend not in ("auto", "llama", "generic"):
        raise ValueError(f"backend must be 'auto', 'llama' or 'generic', got {backend!r}")
    if backend != "generic":
        try:
            if adapter_names is not None and set(adapter_names) != {BASE_ADAPTER}:  # base pass + per-row LoRA deltas
                return LlamaDecoder(
                    unwrap_peft(model),
                    batch=batch,
                    max_len=max_len,
                    dtype=dtype,
                    adapter=BASE_ADAPTER,
                    routed=adapter_names,
                    loan=loan,
                )
            adapter = adapter_names[0] if adapter_names else None
            return LlamaDecoder(
                unwrap_peft(model), batch=batch, max_len=max_len, dtype=dtype, adapter=adapter, loan=loan
            )
        except Unsupported as exc:
            if backend == "llama":
                raise ValueError(f"the Llama fast path does not support this model: {exc}") from exc
    return _HFDecoder(model, batch, max_len, dtype, adapter_names)


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
        return self._forward(input_ids, attention_mask, prompt_positions(attention_mask))

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
