"""What a rollout engine takes and returns: the settings of a generate call, a batch of prompt token ids, the
completions, and the :class:`RolloutEngine` interface every engine (:mod:`.generation`, :mod:`.vllm_engine`)
implements."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch
from transformers import PreTrainedModel

AUTO = "auto"


@dataclass(kw_only=True)
class VLLMOptions:
    """How the vLLM engines of a run are set up (the trainer config's ``vllm_*`` fields, TRL's names)."""

    mode: str = "colocate"
    gpu_memory_utilization: float = 0.3
    tensor_parallel_size: int = 1
    enable_sleep_mode: bool = False
    max_model_length: int | None = None
    server_host: str = "0.0.0.0"
    server_port: int = 8000
    server_timeout: float = 240.0
    seed: int = 0
    server_adapter_dir: str | None = None  # server mode: where adapter versions are written (None: TMPDIR)


@dataclass(kw_only=True)
class GenerationSettings:
    """Sampling settings for one generate call."""

    max_new_tokens: int = 128
    do_sample: bool = True
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    max_prompt_length: int | None = None
    fast: bool = True  # engine "auto": comlrl.accel.fastgen's decode loop when the model supports it (else generate)
    concurrent: bool = True  # several models' calls decode at once on CPU (generate_concurrently)
    logprobs: bool = False  # record Samples.rollout_logprobs
    repetition_penalty: float = 1.0  # transformers' penalty on tokens already in the row (1: off)
    engine: str = AUTO  # a name of ROLLOUT_ENGINES, or "auto" (see select_engine)
    vllm: VLLMOptions | None = None  # engine "vllm": how its engines are set up (None: VLLMOptions' defaults)


@dataclass(kw_only=True)
class PromptBatch:
    """What an engine samples from: the prompt of every completion row as token ids, and how rows end."""

    prompt_ids: torch.Tensor  # (R, P) left-padded with pad_id, one row per completion (a prompt's G rows repeat it)
    prompt_mask: torch.Tensor  # (R, P) 1 on prompt tokens
    stop_ids: list[int]  # token ids that end a completion (every EOS id of the tokenizer and the model)
    pad_id: int
    row_seeds: list[int] | None = None  # (R,) row r samples from its own stream (comlrl.rollout.sampling); None: global
    adapter_names: list[str] | None = None  # (R,) the LoRA adapter each row decodes through; None: the active ones

    @property
    def rows(self) -> int:
        """Completions to sample: R."""
        return self.prompt_ids.shape[0]


@dataclass
class Completions:
    """What an engine returns for a :class:`PromptBatch`, on CPU."""

    ids: torch.Tensor  # (R, C) long, right-padded; what follows a row's first stop id is ignored
    # (R, C) fp32: each sampled token's log-prob under the distribution it was drawn from (repetition penalty,
    # temperature, top-k, top-p, renormalized: comlrl.accel.sampler.sampler_logprobs)
    logprobs: torch.Tensor | None = None
    truncated: torch.Tensor | None = None  # (R,) bool: hit a length limit without a stop id; None: from the stop ids


class RolloutEngine(Protocol):
    """Turns prompt token ids, sampling settings and per-row seeds into completion token ids.

    ``runs_in_threads``: whether calls for distinct models may run at once in threads of this process, sharing its
    cores (:func:`comlrl.rollout.rollout.generate_concurrently`).
    """

    name: str
    runs_in_threads: bool

    def supports(self, model: PreTrainedModel) -> bool:
        """Whether this engine samples from ``model`` with the settings' semantics."""
        ...

    # Optional: ``holds_weights = True`` and ``prepare(model, settings, autocast_dtype)`` for an engine that keeps its
    # own copy of the weights (vLLM): prepare brings it up to date before a rollout. Engines without them read the
    # module's weights in sample() (a sharded model's are gathered around the call: comlrl.parallel.sharding.gathered).

    def sample(
        self,
        model: PreTrainedModel,
        batch: PromptBatch,
        settings: GenerationSettings,
        autocast_dtype: torch.dtype | None = None,
    ) -> Completions:
        """Completions of every row of ``batch``: ``settings.max_new_tokens`` at most, greedy unless
        ``settings.do_sample``, the sampled tokens' log-probs when ``settings.logprobs``; ``autocast_dtype``: the
        decode's compute dtype (None: the model's own)."""
        ...
