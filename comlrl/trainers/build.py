"""Building a team: where each agent lives, and one model, tokenizer, formatter and optimizer per agent
(:class:`~comlrl.rollout.agent.Agent`), with input checks. :func:`build_team` is the trainer's construction."""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase, get_scheduler

from ..engine.models import check_vocab, copy_model, disable_dropout, load_model, load_tokenizer
from ..engine.process import default_bf16, limit_heap_fragmentation, native_bf16
from ..engine.team import adapter_parameters, build_lora_team
from ..errors import ConfigError, FormatterError
from ..parallel import distributed, job, sharding
from ..parallel.job import ProcessTeam
from ..parallel.sharding import is_shard
from ..rollout.agent import Agent, Formatter
from ..rollout.episode import check_transition
from ..rollout.sampling import derive_seed
from ..rollout.topology import Topology, needs_transition, resolve_topology
from ..tracking import fresh_output_dir

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


def check_inputs(
    args: Any,
    *,
    model: Any,
    agent_model: Any,
    num_agents: int | None,
    reward_func: Any,
    reward_required: bool,
    external_transition: Callable | None,
) -> tuple[Any, int | None]:
    """The model source and team size given (``model`` / ``agent_model``, ``num_agents`` / ``args.num_agents``),
    checked with the reward (``reward_required``: the trainer scores rollouts) and the multi-turn transition."""
    if model is not None and agent_model is not None and model is not agent_model:
        raise ConfigError("model= and agent_model= are the same argument; pass only one.")
    if num_agents is not None and args.num_agents not in (None, num_agents):
        raise ConfigError(f"num_agents={num_agents} disagrees with args.num_agents={args.num_agents}.")
    if reward_required and (reward_func is None or not callable(reward_func)):
        raise ConfigError("reward_func= is required: a callable (*agent_completions, **extras) -> list[float].")
    topology = getattr(args, "topology", "parallel")
    if args.num_turns > 1 and external_transition is None and needs_transition(topology, args.num_turns):
        raise ConfigError(
            f"num_turns={args.num_turns} needs external_transition= to build later turns' prompts"
            + (
                "."
                if topology == "parallel"
                else f" (topology={topology!r} shows no answer of a turn in the next one)."
            )
        )
    if external_transition is not None:
        check_transition(external_transition)
    return (model if model is not None else agent_model), (num_agents if num_agents is not None else args.num_agents)


def team_topology(args: Any, num_agents: int, hooks: Any) -> Topology:
    """``args.topology`` resolved for a team of ``num_agents``, refused with the reference library's hooks
    (``hooks``: :class:`comlrl.compat.keywords.CompatHooks`), which read turns in which every agent answers."""
    field = f"{type(args).__name__}.topology"
    value = getattr(args, "topology", "parallel")
    topology = resolve_topology(value, num_agents, field=field)
    if not topology.is_parallel and (hooks.compat_style or hooks.eval_logger or hooks.metrics_callback):
        raise ConfigError(
            f"{field}={value!r}: the reference library's hooks (compat-style configs, eval_logger, metrics_callback) "
            "read turns in which every agent answers; use topology='parallel' with them."
        )
    return topology


def source_groups(sources: list, devices: Sequence[Any] | None = None) -> list[int]:
    """Group id per agent: agents whose model source is the same (same string or same object) share an id;
    ``devices`` (one per agent): only agents on the same device do (a shared model lives on one device)."""
    keys: dict[Any, int] = {}
    places = [str(d) for d in devices] if devices is not None else [""] * len(sources)
    return [
        keys.setdefault((("obj", id(s)) if isinstance(s, PreTrainedModel) else ("str", str(s)), place), len(keys))
        for s, place in zip(sources, places)
    ]


def resolve_agent_devices(names: Sequence[str] | None, num_agents: int) -> list[torch.device] | None:
    """Each agent's device from ``agent_devices`` (one name per agent), checked against the team and the machine;
    None when not set (every agent then on the trainer's device). Under torchrun :func:`comlrl.parallel.job.setup`
    refuses it."""
    if names is None:
        return None
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
    sources: list, *, share: bool = False, dtype: Any = None, devices: Sequence[Any] | None = None
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


def build_optimizer(params: list, args: Any, *, lr: float, total_updates: int) -> tuple[torch.optim.Optimizer, Any]:
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


@dataclass(kw_only=True)
class Team:
    """A trainer's team: where every agent lives and this process's agents (each with its model, tokenizer,
    formatter, optimizer and schedule, :class:`~comlrl.rollout.agent.Agent`)."""

    sources: list  # every agent's model source, also those on other ranks
    dist: ProcessTeam  # this process's part: a LocalTeam in one process, a DistTeam under torchrun
    device: torch.device  # the trainer's device
    agent_devices: list[torch.device]  # agent index -> the device of its model, optimizer state, reference and critic
    output_dir_named: bool  # whether the config named output_dir (else a fresh folder was picked)
    agents: list[Agent] = field(default_factory=list)  # this process's agents, in agent order

    @property
    def local(self) -> list[int]:
        """The indices of the agents whose weights live in this process (every agent outside torchrun)."""
        return self.dist.local_agents


def build_team(
    args: Any,
    *,
    sources: list,
    formatters: list[Formatter],
    tokenizer: Any,
    peft_config: Any,
    updates: int,
    ref_model: bool,
    trainer: str,
    distributed_ok: bool = True,
    agent_devices_ok: bool = True,
    special_tokens: dict | None = None,
    prepare_models: Callable[[Team, list, Any], None] | None = None,
) -> Team:
    """Place the team (torchrun's ranks, ``agent_devices``), load this process's models and tokenizers, wrap them in
    LoRA adapters (``peft_config``), and give each agent a frozen reference model (``ref_model``, unless it is an adapter)
    and an optimizer with its schedule over ``updates`` optimizer steps.

    ``args`` is the trainer's own copy of its config: its defaults that depend on the placement are resolved in place
    (``bf16``, ``output_dir``, ``gradient_checkpointing`` under an activation-checkpointing FSDP plan).
    ``trainer``: the trainer's class name, for errors and the fresh output folder. ``prepare_models``: called with the
    placed team (no agents yet), the loaded models and ``peft_config`` before any LoRA wrapping.
    """
    n = len(sources)
    if args.agent_devices is not None and not agent_devices_ok:
        raise ConfigError(f"{trainer} does not take agent_devices yet; set device= for the team.")
    dist = job.setup(args, n)  # under torchrun this rank holds only the agents placed on it
    if not distributed_ok:
        dist.require_one_process(f"{trainer} does not run under torchrun yet; launch it as one process.")
    named_devices = resolve_agent_devices(args.agent_devices, n)
    plan = sharding.sharding_plan(args.fsdp, args.fsdp_config)
    if plan is not None and plan.activation_checkpointing:
        args.gradient_checkpointing = True
    named = args.output_dir is not None
    if not named:  # one fresh folder per run, the same on every rank
        args.output_dir = distributed.run_once(fresh_output_dir, trainer.removesuffix("Trainer").lower())
        log.info("output_dir not set: this run writes to %s", args.output_dir)
    team = Team(
        sources=sources,
        dist=dist,
        device=dist.device,
        agent_devices=named_devices or [dist.device] * n,
        output_dir_named=named,
    )
    used = list(dict.fromkeys(team.agent_devices))  # the devices that hold models, in agent order
    resolve_bf16(args, used)
    if any(d.type == "cpu" for d in used):
        limit_heap_fragmentation(args.malloc_mmap_threshold_kb)
    local = team.local
    local_sources = [sources[i] for i in local]
    local_devices = [team.agent_devices[i] for i in local]
    share = peft_config is not None and args.share_base
    models = build_models(local_sources, share=share, devices=local_devices)
    if peft_config is not None and args.bf16:  # a frozen LoRA base is only ever read in bf16: store it so
        models = [m.to(torch.bfloat16) for m in models]  # (half the memory, no casts per forward); adapters fp32
    tokenizers = build_tokenizers(tokenizer, sources, local)
    for tok in tokenizers if special_tokens else ():  # the reference's model_config special_tokens
        tok.add_special_tokens(special_tokens)
    # one tokenizer object given for the whole team: a vocabulary mismatch asks for one per agent
    shared_by = n if tokenizer is not None and not isinstance(tokenizer, (list, tuple)) else 1
    chats = chat_flags(args.apply_chat_template, n)
    groups = source_groups(local_sources, local_devices) if share else list(range(len(local)))
    if prepare_models is not None:
        prepare_models(team, models, peft_config)
    lora_seeds = [derive_seed(args.seed, "lora", i) for i in local]  # an adapter's init does not depend on placement
    wrapped = (
        build_lora_team(models, groups, peft_config, agents=local, seeds=lora_seeds)
        if peft_config is not None
        else [(m, None) for m in models]
    )
    for i, (m, adapter), tok in zip(local, wrapped, tokenizers):
        check_vocab(m, tok, i, shared_by)
        prepare_for_training(m, adapter, args)
        m.to(team.agent_devices[i])
        if args.disable_dropout:
            disable_dropout(m)
        agent = Agent(
            index=i,
            model=m,
            tokenizer=tok,
            formatter=formatters[i],
            chat=chats[i],
            adapter=adapter,
            params=adapter_parameters(m, adapter),
        )
        team.agents.append(agent)
    for a in team.agents:
        if ref_model and a.adapter is None:
            a.ref_model = copy_model(a.model).train(False).requires_grad_(False)
    dist.shard_agents(team.agents, bool(args.bf16))  # with fsdp: an agent on several ranks is sharded over them
    for a in team.agents:
        a.optimizer, a.scheduler = build_optimizer(a.params, args, lr=args.learning_rate, total_updates=updates)
    return team


def resolve_bf16(args: Any, devices: list[torch.device]) -> None:
    """``bf16=None``: bf16 when every device that holds a model computes it fast; ``bf16=True`` on a device without
    native bf16 warns (its matmuls are emulated)."""
    if args.bf16 is None:
        args.bf16 = all(default_bf16(d) for d in devices)
        names, native = ", ".join(map(str, devices)), ", ".join(str(native_bf16(d)) for d in devices)
        log.info("bf16=None -> %s on %s (native bf16: %s)", args.bf16, names, native)
    elif args.bf16 and not all(native_bf16(d) for d in devices):
        log.warning(
            "bf16=True on %s, which has no native bf16: its matmuls are emulated, often many times slower "
            "than fp32 (bf16=None picks the faster)",
            ", ".join(str(d) for d in devices if not native_bf16(d)),
        )


def prepare_for_training(model: Any, adapter: str | None, args: Any) -> None:
    """Gradient checkpointing when ``args.gradient_checkpointing`` (once per model: LoRA agents share a base)."""
    if not args.gradient_checkpointing or getattr(model, "_comlrl_checkpointing", False):
        return
    model._comlrl_checkpointing = True
    # transformers >= 5.x names it activation checkpointing (the old name warns); PEFT forwards both
    enable = getattr(model, "activation_checkpointing_enable", None) or model.gradient_checkpointing_enable
    enable()
    model.config.use_cache = False
    if adapter is not None:
        model.enable_input_require_grads()  # frozen embeddings: checkpointed blocks still need grad inputs
