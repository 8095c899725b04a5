"""FSDP2 sharding of an agent over its ranks under torchrun (``fsdp="full_shard"``; see docs/fsdp.md).

Without ``fsdp`` an agent placed on k ranks is replicated k times (:mod:`comlrl.parallel.distributed`). With it, the agent's
ranks form a device mesh and ``torch.distributed.fsdp.fully_shard`` splits its parameters, gradients and AdamW state
over them, each decoder layer and the root being one unit (a 2-D mesh, replicate x shard, with ``hybrid_shard``).
The rows of a step are still split over the agent's ranks as for replicas; what changes:

* **Rollout**: :func:`gathered` all-gathers the full weights (plain tensors again) for generation, so each rank
  decodes its own rows at its own pace with the same decode path as an unsharded model, then frees them.
* **Update**: every rank of an agent must run the same number of forward/backward passes (each pass all-gathers and
  reduce-scatters over the mesh); ranks with fewer row chunks run zero-weight passes. FSDP *averages* gradients over
  the mesh; our losses carry the whole step's normalizer and want the *sum*, so the gradients are scaled by the mesh
  size after backward (gloo has no pre-multiplied sum to ask FSDP for it).
* **LoRA on a sharded base**: the frozen base is sharded; the adapters stay out of FSDP (``ignored_params``), are
  replicated and summed like a replicated agent's gradients: they are small, and their optimizer state with them.
* **Checkpoints**: the model and optimizer state of a fully sharded agent go through ``torch.distributed.checkpoint``
  (each rank writes its shards); DCP reshards on load, so a checkpoint resumes on any number of ranks, one
  process included. :func:`full_state_dict` gathers a consolidated copy for ``save_model``.
"""

from __future__ import annotations

import contextlib
import logging
import types
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

import torch
from torch import nn

from ..errors import ConfigError

log = logging.getLogger(__name__)

FSDP_OPTIONS = ("full_shard", "shard_grad_op", "hybrid_shard", "offload", "auto_wrap")
FSDP_CONFIG_KEYS = (
    "reshard_after_forward",
    "hybrid_shard_size",
    "mixed_precision",
    "offload_params",
    "activation_checkpointing",
    "version",
)
SHARDED_DIR = "sharded"  # a checkpoint's agent folder: DCP shards of the model and optimizer state


@dataclass(frozen=True, kw_only=True)
class ShardingPlan:
    """How agents on several ranks are sharded (parsed from ``fsdp`` / ``fsdp_config``)."""

    hybrid: bool = False  # shard within groups of ``shard_size`` ranks, replicate across groups
    shard_size: int | None = None  # hybrid: ranks per shard group (None: the agent's ranks on one node)
    reshard_after_forward: bool = True  # free gathered weights after each unit's forward (False: keep for backward)
    mixed_precision: bool | None = None  # bf16 compute, fp32 gradient reduction (None: when bf16 is on)
    offload_params: bool = False  # keep the shards and optimizer state in CPU memory (GPU runs)
    activation_checkpointing: bool = False  # same as gradient_checkpointing


def sharding_plan(fsdp: str | list | bool | None, fsdp_config: dict | None = None) -> ShardingPlan | None:
    """The plan for ``fsdp`` (TRL / transformers' option string, e.g. "full_shard auto_wrap") and ``fsdp_config``;
    None when ``fsdp`` is off. Unknown options and keys raise a ConfigError naming them."""
    if fsdp in (None, False, "", []):
        if fsdp_config:
            raise ConfigError("fsdp_config is set but fsdp is off: set fsdp='full_shard' (or 'hybrid_shard').")
        return None
    words = ["full_shard"] if fsdp is True else fsdp.split() if isinstance(fsdp, str) else [str(w) for w in fsdp]
    unknown = [w for w in words if w not in FSDP_OPTIONS]
    if unknown:
        raise ConfigError(f"fsdp={fsdp!r}: unknown option(s) {unknown}; known: {list(FSDP_OPTIONS)}.")
    modes = [w for w in words if w in ("full_shard", "shard_grad_op", "hybrid_shard")]
    if len(modes) > 1:
        raise ConfigError(f"fsdp={fsdp!r}: choose one of full_shard, shard_grad_op, hybrid_shard (got {modes}).")
    cfg = dict(fsdp_config or {})
    bad = [k for k in cfg if k not in FSDP_CONFIG_KEYS]
    if bad:
        raise ConfigError(f"fsdp_config has unknown key(s) {bad}; known: {list(FSDP_CONFIG_KEYS)}.")
    if cfg.get("version", 2) != 2:
        raise ConfigError(f"fsdp_config.version={cfg['version']!r}: comlrl shards with FSDP2 (version 2) only.")
    size = cfg.get("hybrid_shard_size")
    if size is not None and (not isinstance(size, int) or size < 1):
        raise ConfigError(f"fsdp_config.hybrid_shard_size={size!r}: must be a number of ranks >= 1.")
    mode = modes[0] if modes else "full_shard"
    if size is not None and mode != "hybrid_shard":
        raise ConfigError("fsdp_config.hybrid_shard_size needs fsdp='hybrid_shard'.")
    return ShardingPlan(
        hybrid=mode == "hybrid_shard",
        shard_size=size,
        reshard_after_forward=bool(cfg.get("reshard_after_forward", mode != "shard_grad_op")),
        mixed_precision=cfg.get("mixed_precision"),
        offload_params=bool(cfg.get("offload_params", "offload" in words)),
        activation_checkpointing=bool(cfg.get("activation_checkpointing", False)),
    )


def mesh_layout(ranks: Sequence[int], plan: ShardingPlan, ranks_per_node: int) -> list[list[int]]:
    """The device mesh of an agent on ``ranks`` as rows of ranks: one row (the ranks as placed) fully sharded; with
    ``hybrid_shard`` one row per replica, each row a shard group of consecutive ranks (in rank order).

    The default shard group is the agent's own ranks on one node (rank // ``ranks_per_node``), not the node's size:
    under the default placement agents interleave, so an agent holds fewer ranks of each node, and a node-sized
    group would span nodes and leave no replica. Every node must then hold the same number of the agent's ranks.
    """
    ranks = list(ranks)
    if not plan.hybrid:
        return [ranks]
    ordered = sorted(ranks)
    size = plan.shard_size
    if size is None:
        per_node = [0] * (max(ordered) // ranks_per_node + 1)
        for r in ordered:
            per_node[r // ranks_per_node] += 1
        counts = [c for c in per_node if c]
        if len(set(counts)) > 1:
            divisors = [d for d in range(1, len(ranks) + 1) if len(ranks) % d == 0]
            raise ConfigError(
                f"fsdp='hybrid_shard': an agent on ranks {ordered} holds {counts} of them on its nodes "
                f"({ranks_per_node} ranks a node); the default shard group (the agent's ranks on one node) needs the "
                f"same number on each node: set fsdp_config.hybrid_shard_size (one of {divisors}) or training.placement."
            )
        size = counts[0]
    if len(ranks) % size:
        raise ConfigError(
            f"fsdp='hybrid_shard': an agent on {len(ranks)} ranks cannot be split into shard groups of {size} ranks "
            "(fsdp_config.hybrid_shard_size must divide the number of ranks each agent is placed on)."
        )
    return [ordered[i : i + size] for i in range(0, len(ordered), size)]


def mesh_shape(ranks: Sequence[int], plan: ShardingPlan, ranks_per_node: int) -> tuple[int, ...]:
    """The shape of :func:`mesh_layout`: (number of ranks,) fully sharded, or (replicas, shard size)."""
    rows = mesh_layout(ranks, plan, ranks_per_node)
    return (len(rows), len(rows[0])) if plan.hybrid else (len(rows[0]),)


def agent_mesh(ranks: tuple[int, ...], plan: ShardingPlan, device_type: str, ranks_per_node: int) -> Any:
    """The agent's device mesh over ``ranks`` (every rank of the job must build every agent's mesh, in order)."""
    from torch.distributed.device_mesh import DeviceMesh

    rows = mesh_layout(ranks, plan, ranks_per_node)
    if plan.hybrid:
        return DeviceMesh(device_type, torch.tensor(rows), mesh_dim_names=("replicate", "shard"))
    return DeviceMesh(device_type, torch.tensor(rows[0]), mesh_dim_names=("shard",))


def shard_units(model: nn.Module) -> list[nn.Module]:
    """The model's FSDP units besides the root: its decoder layers (the classes of ``_no_split_modules``)."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    names = set(getattr(base, "_no_split_modules", None) or [])
    units = [m for m in model.modules() if type(m).__name__ in names]
    if not units:  # not a transformers model: every block of a ModuleList
        units = [m for lst in model.modules() if isinstance(lst, nn.ModuleList) for m in lst]
    return units


def shard_model(
    model: nn.Module, mesh: Any, *, plan: ShardingPlan, bf16: bool, ignored: set[nn.Parameter] | None = None
) -> None:
    """``fully_shard`` each decoder layer of ``model``, then the root, on ``mesh`` (in place); ``ignored``: parameters
    FSDP leaves alone (LoRA adapters)."""
    from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, fully_shard, register_fsdp_forward_method

    kwargs: dict[str, Any] = {"mesh": mesh, "reshard_after_forward": plan.reshard_after_forward}
    if plan.mixed_precision if plan.mixed_precision is not None else bf16:
        kwargs["mp_policy"] = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    if plan.offload_params:
        if mesh.device_type == "cpu":
            log.info("fsdp offload_params: the agent already lives in CPU memory; nothing to offload")
        else:
            kwargs["offload_policy"] = CPUOffloadPolicy()
    if ignored:
        kwargs["ignored_params"] = set(ignored)
    for unit in shard_units(model):
        fully_shard(unit, **kwargs)
    fully_shard(model, **kwargs)
    # Our log-prob pass calls the decoder and the LM head directly, not model.forward: a registered method runs the
    # root's hooks (gather the embeddings/norm/head, wait for the gradient reductions in backward) around it.
    model._comlrl_forward = types.MethodType(lambda self, fn, *args, **kwargs: fn(*args, **kwargs), model)
    register_fsdp_forward_method(model, "_comlrl_forward")
    # The root must know it is the root before the first rollout runs its layers outside any root forward.
    model._get_fsdp_state()._lazy_init()


def forward(model: nn.Module, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """``fn(*args, **kwargs)`` as a forward of ``model``: for a sharded model, inside its root's FSDP hooks."""
    if is_sharded(model):
        return model._comlrl_forward(fn, *args, **kwargs)
    return fn(*args, **kwargs)


def is_sharded(model: nn.Module) -> bool:
    """True when ``model`` was sharded by :func:`shard_model`."""
    from torch.distributed.fsdp import FSDPModule

    return isinstance(model, FSDPModule)


def fully_sharded(model: nn.Module, adapter: str | None) -> bool:
    """True when the agent's trainable weights are FSDP shards (a sharded full model, not LoRA on a sharded base)."""
    return adapter is None and is_sharded(model)


@contextlib.contextmanager
def gathered(models: list[nn.Module]) -> Iterator[None]:
    """Hold the full weights of every sharded model in ``models`` (plain tensors) inside the block; reshard after.

    A collective: every rank of each model's mesh must enter it together.
    """
    from torch.distributed.fsdp import FSDPModule

    roots = [m for m in dict.fromkeys(models) if is_sharded(m)]
    units = [u for root in roots for u in root.modules() if isinstance(u, FSDPModule)]
    kept = {}
    for unit in units:
        state = unit._get_fsdp_state()._fsdp_param_group
        kept[id(unit)] = state.post_forward_mesh_info if state is not None else None
        unit.set_reshard_after_forward(False, recurse=False)  # forwards inside the block keep the weights
    handles = [u.unshard(async_op=True) for u in units]
    for h in handles:
        if h is not None:
            h.wait()
    try:
        yield
    finally:
        for unit in units:
            unit.reshard()
            group = unit._get_fsdp_state()._fsdp_param_group
            if group is not None:  # as it was: FSDP keeps the root's weights gathered between forward and backward
                group.post_forward_mesh_info = kept[id(unit)]


def scale_gradients(params: list[torch.Tensor], factor: float) -> None:
    """Multiply every gradient in place (turns FSDP's mesh average back into the sum our losses are built for)."""
    for p in params:
        if p.grad is not None:
            p.grad.mul_(factor)


def is_shard(t: torch.Tensor) -> bool:
    """True for a parameter FSDP split over a mesh (a DTensor)."""
    return hasattr(t, "full_tensor")


def clip_grad_norm_(params: list[torch.Tensor], max_norm: float | None) -> float:
    """The gradients' total 2-norm (over whole tensors: a shard's norm is combined over its mesh), and with
    ``max_norm`` the gradients scaled in place to at most that; for a mix of sharded and whole parameters."""
    norms = []
    for p in params:
        if p.grad is not None:
            n = torch.linalg.vector_norm(p.grad.detach(), dtype=torch.float32)
            norms.append(n.full_tensor() if is_shard(n) else n)
    if not norms:
        return 0.0
    total = torch.linalg.vector_norm(torch.stack([n.to(norms[0].device) for n in norms]))
    if max_norm:
        coef = float(torch.clamp(max_norm / (total + 1e-6), max=1.0))
        for p in params:
            if p.grad is not None:
                p.grad.mul_(coef)
    return float(total)


def local_bytes(model: nn.Module, optimizer: torch.optim.Optimizer | None = None) -> dict[str, int]:
    """Bytes this rank holds of ``model``'s parameters, their gradients and the optimizer's state (local shards)."""

    def nbytes(t: Any) -> int:
        t = t.to_local() if hasattr(t, "to_local") else t
        return t.numel() * t.element_size() if isinstance(t, torch.Tensor) else 0

    params = list(dict.fromkeys(model.parameters()))
    out = {
        "params": sum(nbytes(p) for p in params),
        "grads": sum(nbytes(p.grad) for p in params if p.grad is not None),
        "optimizer": 0,
    }
    if optimizer is not None:
        out["optimizer"] = sum(nbytes(v) for state in optimizer.state.values() for v in state.values())
    return out


def full_state_dict(model: nn.Module, keep: bool) -> dict[str, torch.Tensor]:
    """The consolidated state dict of a sharded model on the rank where ``keep`` (CPU tensors; empty elsewhere).

    A collective over the model's mesh: every rank gathers each tensor in turn, so no rank ever holds more than one
    full tensor beyond the result.
    """
    from torch.distributed.tensor import DTensor

    out = {}
    for name, t in model.state_dict().items():
        full = t.full_tensor() if isinstance(t, DTensor) else t
        if keep:
            out[name] = full.detach().to("cpu", copy=True)
    return out


def save_sharded(model: nn.Module, optimizer: torch.optim.Optimizer, folder: Path, group: Any) -> None:
    """Write the model and optimizer state to ``folder`` through DCP: each rank of ``group`` its own shards."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict

    model_state, optim_state = get_state_dict(model, optimizer)
    dcp.save({"model": model_state, "optimizer": optim_state}, checkpoint_id=str(folder), process_group=group)


def load_sharded(model: nn.Module, optimizer: torch.optim.Optimizer, folder: Path, group: Any) -> None:
    """Read :func:`save_sharded`'s folder into ``model`` and ``optimizer`` in place, whatever their sharding now
    (DCP reshards; ``group`` None with a plain model: this process alone reads it)."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    model_state, optim_state = get_state_dict(model, optimizer)
    saved = dcp.FileSystemReader(str(folder)).read_metadata().state_dict_metadata
    missing = [k for k in model_state if f"model.{k}" not in saved]
    if missing:
        raise ValueError(f"{folder}: the saved model has no {missing[:5]} ({len(missing)} weights missing)")
    state = {"model": model_state, "optimizer": optim_state}
    alone = group is None and not any(is_shard(p) for p in model.parameters())  # this process reads it alone
    # partial: a weight that never had a gradient (a critic backbone's LM head) has no optimizer state to restore
    planner = dcp.DefaultLoadPlanner(allow_partial_load=True)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")  # one process reading: intended
        dcp.load(state, checkpoint_id=str(folder), process_group=group, no_dist=alone, planner=planner)
    set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optimizer"])


def save_consolidated(model: nn.Module, folder: Path, state: dict[str, torch.Tensor] | None) -> None:
    """Write a sharded model's gathered ``state`` (:func:`full_state_dict`) as a ``from_pretrained`` folder, or only
    its config when ``state`` is None (a checkpoint: the weights are in DCP shards)."""
    folder.mkdir(parents=True, exist_ok=True)
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    # FSDP2 renames the class (FSDPLlamaForCausalLM); the folder must name the model's own architecture
    arch = [type(base).__name__.removeprefix("FSDP")]
    config = base.config
    saved, config.architectures = config.architectures, arch
    try:
        if state is None:
            config.save_pretrained(folder)
        else:
            model.save_pretrained(folder, state_dict=state, is_main_process=True)
    finally:
        config.architectures = saved
