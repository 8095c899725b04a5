"""Building a team: one model, tokenizer, formatter and optimizer per agent (:class:`~comlrl.rollout.agent.Agent`), with
input checks."""

from __future__ import annotations

import logging
import math
from typing import Any, Sequence

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase, get_scheduler

from ..engine.models import copy_model, load_model, load_tokenizer
from ..errors import ConfigError, FormatterError
from ..parallel.sharding import is_shard
from ..rollout.agent import Formatter

log = logging.getLogger(__name__)


def team_sources(model: Any, agents: Sequence | None, num_agents: int | None, formatters: Any) -> list:
    """One model source per agent, checking that every count given agrees."""
    if model is not None and agents is not None:
        raise ConfigError("pass either model= (copied into every agent) or agents= (one per agent), not both.")
    if model is None and agents is None:
        raise ConfigError("no model: pass model='embedded', a hub id / local path / loaded model, or agents=[...].")
    counts = {}
    if agents is not None:
        counts["agents"] = len(agents)
    if num_agents is not None:
        counts["num_agents"] = num_agents
    if isinstance(formatters, (list, tuple)):
        counts["formatters"] = len(formatters)
    if len(set(counts.values())) > 1:
        raise ConfigError("the number of agents disagrees: " + ", ".join(f"{k}={v}" for k, v in counts.items()) + ".")
    n = next(iter(counts.values()), 2)
    if n < 1:
        raise ConfigError(f"num_agents={n}: a team needs at least one agent.")
    return list(agents) if agents is not None else [model] * n


def source_groups(sources: list, devices: Sequence[Any] | None = None) -> list[int]:
    """Group id per agent: agents whose model source is the same (same string or same object) share an id;
    ``devices`` (one per agent): only agents on the same device do (a shared model lives on one device)."""
    keys: dict[Any, int] = {}
    places = [str(d) for d in devices] if devices is not None else [""] * len(sources)
    return [
        keys.setdefault((("obj", id(s)) if isinstance(s, PreTrainedModel) else ("str", str(s)), place), len(keys))
        for s, place in zip(sources, places)
    ]


def resolve_agent_devices(names: Sequence[str] | None, num_agents: int, launched: bool) -> list[torch.device] | None:
    """Each agent's device from ``agent_devices`` (one name per agent), checked against the team, torchrun
    (``launched``) and the machine; None when not set (every agent then on the trainer's device)."""
    if names is None:
        return None
    if launched:
        raise ConfigError(
            f"agent_devices={list(names)} places agents in one process; under torchrun (WORLD_SIZE > 1) each rank "
            "holds its own agents: set placement (agent index -> rank) and leave agent_devices None."
        )
    if len(names) != num_agents:
        raise ConfigError(f"agent_devices has {len(names)} entries for {num_agents} agents: give one device per agent.")
    devices = [torch.device(n) for n in names]
    for i, d in enumerate(devices):
        if d.type != "cuda":
            continue
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if (d.index or 0) >= count:
            raise ConfigError(
                f"agent_devices[{i}]={names[i]!r}: agent {i}'s device does not exist here ({count} CUDA device(s) "
                "visible; check CUDA_VISIBLE_DEVICES)."
            )
        if d.index is None:  # 'cuda' is the current one: agents on 'cuda' and 'cuda:0' then share it (and a base)
            devices[i] = torch.device("cuda", torch.cuda.current_device())
    return devices


def build_models(
    sources: list, share: bool = False, dtype: Any = None, devices: Sequence[Any] | None = None
) -> list[PreTrainedModel]:
    """Load each agent's model; a source repeated across agents is loaded once, then copied (or shared, among the
    agents on one device when ``devices`` gives each agent's)."""
    models: list[PreTrainedModel] = []
    groups = source_groups(sources, devices if share else None)
    for i, (src, group) in enumerate(zip(sources, groups)):
        first = groups.index(group)
        if first < i:
            models.append(models[first] if share else copy_model(models[first]))
        else:
            models.append(load_model(src, dtype=dtype))
    return models


def build_tokenizers(
    tokenizer: Any, sources: list, indices: Sequence[int] | None = None
) -> list[PreTrainedTokenizerBase]:
    """One tokenizer per agent: the one given, one per agent given, or loaded from each model source.

    ``indices``: only these agents' tokenizers (the agents of this process under torchrun); default all.
    """
    n = len(sources)
    idx = list(range(n)) if indices is None else list(indices)
    if isinstance(tokenizer, (list, tuple)):
        if len(tokenizer) != n:
            raise ConfigError(f"tokenizer= has {len(tokenizer)} entries for {n} agents.")
        toks = [load_tokenizer(tokenizer[i]) for i in idx]
    elif tokenizer is not None:
        toks = [load_tokenizer(tokenizer)] * len(idx)
    else:
        toks = [load_tokenizer(sources[i]) for i in idx]
    return toks


def build_formatters(formatters: Any, n: int) -> list[Formatter]:
    """One formatter per agent; default reads the 'prompt' column."""
    if formatters is None:
        return [lambda row: row["prompt"]] * n
    if callable(formatters):
        return [formatters] * n
    fmts = list(formatters)
    for i, f in enumerate(fmts):
        if not callable(f):
            raise FormatterError(f"formatters[{i}] (agent {i}) is {type(f).__name__}, not a callable row -> str.")
    return fmts


def check_batch_size(dataset_len: int, batch_size: int, name: str = "train_dataset") -> None:
    """Warn when ``per_device_train_batch_size`` exceeds the dataset: each step then holds every row once, fewer
    than asked for (the batches are slices of one epoch's order), which changes the effective batch silently."""
    if 0 < dataset_len < batch_size:
        log.warning(
            "per_device_train_batch_size=%d is larger than %s (%d rows): each step uses only those %d rows. Set "
            "per_device_train_batch_size <= %d, or add rows.",
            batch_size,
            name,
            dataset_len,
            dataset_len,
            dataset_len,
        )


def chat_flags(value: bool | list, n: int) -> list[bool]:
    """apply_chat_template as one bool per agent."""
    if isinstance(value, bool):
        return [value] * n
    flags = list(value)
    if len(flags) != n:
        raise ConfigError(f"apply_chat_template has {len(flags)} entries for {n} agents.")
    return [bool(f) for f in flags]


def build_optimizer(params: list, args: Any, lr: float, total_updates: int) -> tuple[torch.optim.Optimizer, Any]:
    """AdamW over an agent's trainable parameters, and the LR schedule over ``total_updates`` optimizer steps."""
    if not params:
        raise ConfigError("an agent has no trainable parameters (all requires_grad=False).")
    # FSDP shards (DTensors) and whole tensors (a sharded critic's value head) cannot share a fused/foreach kernel call
    shards = [p for p in params if is_shard(p)]
    groups = [{"params": shards}, {"params": [p for p in params if not is_shard(p)]}]
    opt = torch.optim.AdamW(
        groups if 0 < len(shards) < len(params) else params,
        lr=lr,
        betas=(args.adam_beta1, args.adam_beta2),
        eps=args.adam_epsilon,
        weight_decay=args.weight_decay,
        fused=_fused_ok(params) or None,
    )
    opt.register_step_post_hook(count_parameter_writes)
    warmup = args.warmup_steps or int(math.ceil(args.warmup_ratio * total_updates))
    sched = get_scheduler(
        args.lr_scheduler_type, opt, num_warmup_steps=warmup, num_training_steps=max(total_updates, 1)
    )
    return opt, sched


def count_parameter_writes(optimizer: torch.optim.Optimizer, *_: Any) -> None:
    """Raise the in-place version counter of every parameter a step updated: the fused kernels write parameters
    without raising it, and the vLLM engine tells which weights to push again by it."""
    torch.autograd.graph.increment_version([p for group in optimizer.param_groups for p in group["params"]])


def _fused_ok(params: list) -> bool:
    """Whether torch's fused AdamW kernel takes these parameters (one device, CPU or CUDA, floating point).

    Why: the fused kernel updates each tensor in one pass; the default foreach path allocates parameter-sized
    temporaries (measured on 2 CPU cores for 135M fp32 parameters: 0.10 s vs 0.43 s per step, 0.5 GB less peak).
    """
    devices = {p.device for p in params}
    return (
        len(devices) == 1
        and next(iter(devices)).type in ("cpu", "cuda")
        and all(p.dtype in (torch.float32, torch.float16, torch.bfloat16) for p in params)
    )
