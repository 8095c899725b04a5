"""Scale-out with torchrun: agents placed on ranks, and replicas of an agent splitting the rows of a step.

    torchrun --standalone --nproc-per-node 2 -m comlrl train CONFIG.yaml    # or: comlrl train CONFIG.yaml --nproc 2

The trainer calls :func:`setup` at construction. Outside torchrun (or with WORLD_SIZE=1) it returns None and
nothing here runs. Under torchrun every process builds the same trainer; :class:`DistTeam` then decides:

* **Placement** (:func:`resolve_placement`): agent i lives on the ranks ``placement.ranks[i]`` (one per replica).
  Default: round-robin (agent i on rank i % world) when world <= num_agents; otherwise ``world = num_agents x R``
  and rank = replica * num_agents + agent. A rank loads, generates and updates only its own agents.
* **Rollout**: the step's root nodes (and every later turn's nodes) are split into R contiguous shards; replica r
  of every agent generates shard r. Sampling is keyed per row (:mod:`comlrl.engine.sampling`), so a row's random
  draws do not depend on which process generates it or with which other rows; its tokens do not either as long as
  the engine's logits for a row do not depend on its batch (tested on CPU). vLLM on a GPU breaks that: its kernels
  are not batch invariant, a row's logits change in their last bits with the rows batched beside it, so where two
  tokens nearly tie a multi-rank run can sample another token than one process (docs/distributed.md). Every
  (agent, shard) piece is all-gathered, so **every rank holds the full episode**, tensor for tensor what one
  process would have built from the same completions.
* **Scoring once**: rewards and multi-turn transitions run on rank 0 only (a code reward runs a sandbox; running
  it on every rank would repeat the work) and are broadcast; an exception there is broadcast too and raised on
  every rank, so a failing reward stops the whole job with its own message.
* **Update**: each replica computes its agent's loss on its shard's rows only, with per-token weights normalized
  over the *whole* step (every rank has every completion mask, so the token/sequence counts of ``loss_weights``
  are already global), then the replicas' gradients are **summed** with an all-reduce over the agent's subgroup
  (``dist.new_group``). The sum of the shards' gradients is the full-batch gradient, so every replica applies the
  single-process update (up to float summation order).
* **Files**: metrics, the run's shared files and each agent's folder are written once: metrics and shared files
  by rank 0, an agent by its first replica's rank. Checkpoints keep the atomic write-then-rename of
  :mod:`comlrl.checkpoint`: rank 0 renames only after every rank has written and fsynced its agents.

Backend (:func:`backend_for`): NCCL when the process's device is a GPU (``cuda:LOCAL_RANK``), gloo on CPU; with
FSDP's ``offload`` on a GPU, NCCL for GPU tensors and gloo for CPU ones (the offloaded shards' gradients are in CPU
memory). Python objects (texts, rewards, metrics) always travel on a gloo group. Every collective has ``dist_timeout`` seconds: a dead or hung
rank makes the others raise :class:`DistributedError` instead of waiting forever (torchrun also stops the job
when any worker exits with an error).
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import pickle
import shlex
import shutil
import sys
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any, Callable, Iterator

import torch
import torch.distributed as dist
import torch.nn.functional as F

from . import checkpoint as ck
from . import sharding
from .accel.shapes import pad_tokens
from .engine.generation import select_engine
from .engine.rollout import Samples
from .errors import ComlrlError, ConfigError

log = logging.getLogger(__name__)

DEFAULT_TIMEOUT_S = 1800.0


class DistributedError(ComlrlError):
    """A collective failed: another rank died, raised, or did not arrive within ``dist_timeout``."""


# --- the environment torchrun sets -------------------------------------------------------------------


def world() -> tuple[int, int, int]:
    """(rank, world size, local rank) from torchrun's environment variables ((0, 1, 0) outside torchrun)."""
    return int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1)), int(os.environ.get("LOCAL_RANK", 0))


def launched() -> bool:
    """True in a process started by torchrun with more than one process in the job."""
    return world()[1] > 1


def is_main() -> bool:
    """True on rank 0 and in a single-process run: the process that writes run-level files."""
    return not (dist.is_available() and dist.is_initialized()) or dist.get_rank() == 0


def device_for(name: str = "auto") -> torch.device:
    """This process's device: 'auto'/'cuda' -> cuda:LOCAL_RANK when a GPU is visible, else cpu; others as given."""
    local_rank = world()[2]
    if name in ("auto", "cuda"):
        if torch.cuda.is_available():
            return torch.device("cuda", local_rank % torch.cuda.device_count())
        if name == "cuda":
            raise ConfigError("device='cuda' but no GPU is visible to this process.")
        return torch.device("cpu")
    return torch.device(name)


def backend_for(device_type: str, offload: bool = False) -> str:
    """The process group backend of a job on ``device_type``: gloo on CPU; NCCL on a GPU, plus gloo for CPU tensors
    when FSDP offloads the shards (``offload``): their gradient norm and gathers are collectives on CPU tensors."""
    if device_type != "cuda":
        return "gloo"
    return "cuda:nccl,cpu:gloo" if offload else "nccl"


def has_cpu_backend(backend: str) -> bool:
    """True when a process group of ``backend`` (a name or a "device:name,..." map) runs collectives on CPU tensors."""
    return backend == "gloo" or any(part.strip().startswith("cpu:") for part in backend.split(","))


def init(timeout_s: float | None = None, device: torch.device | str = "auto", offload: bool = False) -> bool:
    """Initialize the default process group once (:func:`backend_for` the device); False outside torchrun.

    ``timeout_s`` bounds every collective (default :data:`DEFAULT_TIMEOUT_S`); ``device``: a device or a config
    name for :func:`device_for`; ``offload``: FSDP keeps the shards in CPU memory. Called by the trainer and the
    CLI; a second call is a no-op, except that a GPU group without a CPU backend is refused under ``offload``. The
    group is destroyed at interpreter exit.
    """
    if not launched():
        return False
    device = device_for(device) if isinstance(device, str) else device
    backend = backend_for(device.type, offload)
    if dist.is_initialized():
        if offload and device.type == "cuda" and not has_cpu_backend(str(dist.get_backend())):
            raise ConfigError(
                f"fsdp offload: the process group ({dist.get_backend()}) has no CPU backend, and the offloaded "
                f"shards' gradients are in CPU memory; initialize it with backend={backend!r} (or let comlrl do it)."
            )
        return True
    if device.type == "cuda":
        torch.cuda.set_device(device)
    dist.init_process_group(backend, timeout=timedelta(seconds=timeout_s or DEFAULT_TIMEOUT_S))
    atexit.register(shutdown)
    rank, size, local = world()
    log.info(
        "process group up: rank %d of %d (local rank %d), backend %s, device %s", rank, size, local, backend, device
    )
    return True


def run_once(fn: Callable, *args: Any) -> Any:
    """``fn(*args)`` on rank 0 only (or simply called outside torchrun); every rank gets its result or its exception."""
    if not (dist.is_available() and dist.is_initialized()):
        return fn(*args)
    group = None if dist.get_backend() == "gloo" else dist.new_group(backend="gloo")  # (objects travel on gloo)
    return _run_once(fn, args, group, dist.get_rank(), lambda what, exc: DistributedError(f"{what} failed: {exc}"))


def _run_once(fn: Callable, args: tuple, group: Any, rank: int, fail: Callable) -> Any:
    result, error = None, None
    if rank == 0:
        try:
            result = fn(*args)
        except Exception as exc:  # noqa: BLE001 -- re-raised below, on every rank
            error = exc
    what = f"share {getattr(fn, '__name__', 'result')} from rank 0"
    box = [(result, _portable(error)) if rank == 0 else None]
    try:
        dist.broadcast_object_list(box, src=0, group=group)
    except (RuntimeError, dist.DistError) as exc:
        raise fail(what, exc) from exc
    result, shared = box[0]
    if error is not None:
        raise error
    if shared is not None:
        shared.add_note(f"(raised on rank 0 in {getattr(fn, '__name__', 'a function')}; this is rank {rank})")
        raise shared
    return result


def shutdown() -> None:
    """Destroy the process group (idempotent)."""
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


# --- placement and sharding (pure) ---------------------------------------------------------------


@dataclass(frozen=True)
class Placement:
    """Which ranks hold which agent: ``ranks[i]`` = the ranks of agent i's replicas, replica 0 first."""

    ranks: tuple[tuple[int, ...], ...]
    world_size: int

    @property
    def num_agents(self) -> int:
        return len(self.ranks)

    @property
    def replicas(self) -> int:
        return len(self.ranks[0])

    def agents_on(self, rank: int) -> list[int]:
        return [i for i, rs in enumerate(self.ranks) if rank in rs]

    def replica_of(self, rank: int) -> int | None:
        """The replica index of every agent on ``rank`` (None if it holds none)."""
        agents = self.agents_on(rank)
        return self.ranks[agents[0]].index(rank) if agents else None

    def describe(self) -> str:
        lines = []
        for rank in range(self.world_size):
            agents = self.agents_on(rank)
            held = ", ".join(f"agent {i}" for i in agents) or "no agent"
            replica = f" (replica {self.replica_of(rank)})" if agents and self.replicas > 1 else ""
            lines.append(f"rank {rank}: {held}{replica}")
        return "; ".join(lines)


def resolve_placement(num_agents: int, world_size: int, placement: dict | None = None) -> Placement:
    """The placement of ``num_agents`` agents on ``world_size`` ranks (``placement``: agent -> rank or ranks).

    Default: world <= agents: agent i on rank i % world (agent parallelism, several agents per rank when
    world < agents); world = agents x R: agent i on ranks r * agents + i, r < R (data parallelism, R replicas).
    """
    n, w = num_agents, world_size
    if placement is None:
        if w <= n:
            return Placement(tuple((i % w,) for i in range(n)), w)
        if w % n:
            raise ConfigError(
                f"placement: {w} processes for {n} agents; with more processes than agents the world size must be a "
                f"multiple of num_agents (R replicas per agent: {n * (w // n)} or {n * (w // n + 1)} processes), or "
                "give training.placement explicitly."
            )
        return Placement(tuple(tuple(r * n + i for r in range(w // n)) for i in range(n)), w)
    try:
        table = {int(k): [int(v)] if isinstance(v, (int, str)) else [int(x) for x in v] for k, v in placement.items()}
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"placement={placement!r}: expected agent index -> rank or list of ranks ({exc}).") from exc
    if sorted(table) != list(range(n)):
        raise ConfigError(f"placement must place every agent 0..{n - 1} exactly once; it has keys {sorted(table)}.")
    for i, ranks in table.items():
        if not ranks or len(set(ranks)) != len(ranks) or any(not 0 <= r < w for r in ranks):
            raise ConfigError(f"placement[{i}]={ranks}: needs distinct ranks in 0..{w - 1} (world size {w}).")
    counts = {len(r) for r in table.values()}
    if len(counts) > 1:
        raise ConfigError(
            f"placement: every agent needs the same number of replicas (rows are split into that many "
            f"shards); got {[len(table[i]) for i in range(n)]}."
        )
    out = Placement(tuple(tuple(table[i]) for i in range(n)), w)
    for rank in range(w):
        agents = out.agents_on(rank)
        replicas = {out.ranks[i].index(rank) for i in agents}
        if len(replicas) > 1:
            raise ConfigError(
                f"placement: rank {rank} holds agents {agents} as different replicas {sorted(replicas)}; "
                "a rank generates one shard of rows, so all its agents must be the same replica."
            )
        if not agents:
            log.warning("placement: rank %d holds no agent; it only takes part in the collectives", rank)
    return out


# Gradients under this size are all-reduced in coalesced buckets of about this size. Measured with gloo, 2 ranks on
# CPU: 420 LoRA factors (16 x 576) 125-240 ms one by one, 23 ms in 1 MB buckets; a SmolLM2-sized full model (273
# tensors) 265-300 ms either way (4 MB buckets: slower, 320 ms, the copies outweigh the saved calls).
BUCKET_BYTES = 1 << 20


def grad_buckets(tensors: list[torch.Tensor], cap_bytes: int = BUCKET_BYTES) -> list[list[torch.Tensor]]:
    """``tensors`` in order, grouped for coalesced collectives: consecutive tensors of one dtype and device fill a
    bucket up to ``cap_bytes``; a tensor of ``cap_bytes`` or more is a bucket of its own."""
    out: list[list[torch.Tensor]] = []
    current: list[torch.Tensor] = []
    size = 0
    for t in tensors:
        nbytes = t.numel() * t.element_size()
        alone = nbytes >= cap_bytes
        if current and (
            alone or t.dtype != current[0].dtype or t.device != current[0].device or size + nbytes > cap_bytes
        ):
            out.append(current)
            current, size = [], 0
        if alone:
            out.append([t])
            continue
        current.append(t)
        size += nbytes
    if current:
        out.append(current)
    return out


def shard_bounds(n: int, parts: int) -> list[tuple[int, int]]:
    """Split range(n) into ``parts`` contiguous shards whose sizes differ by at most one (earlier ones larger)."""
    base, extra = divmod(n, parts)
    bounds, lo = [], 0
    for p in range(parts):
        hi = lo + base + (p < extra)
        bounds.append((lo, hi))
        lo = hi
    return bounds


def concat_samples(parts: list[Samples], pad_id: int) -> Samples:
    """One agent's shards, in row order, re-padded to common widths: prompts left-, completions right-padded.

    The result is what one ``generate`` call over all rows returns (its widths are the maxima over the rows).
    """
    if len(parts) == 1:
        return parts[0]
    p_width = max(p.prompt_ids.shape[1] for p in parts)
    c_width = max(p.completion_ids.shape[1] for p in parts)
    prompts = [
        pad_tokens(p.prompt_ids, p.prompt_mask, left=True, multiple=1, pad_id=pad_id, width=p_width) for p in parts
    ]
    completions = [
        pad_tokens(p.completion_ids, p.completion_mask, left=False, multiple=1, pad_id=pad_id, width=c_width)
        for p in parts
    ]
    logp = (
        None
        if any(p.rollout_logprobs is None for p in parts)
        else torch.cat([F.pad(p.rollout_logprobs, (0, c_width - p.rollout_logprobs.shape[1])) for p in parts])
    )
    return Samples(
        *(torch.cat(column) for column in (*zip(*prompts), *zip(*completions))),
        [t for p in parts for t in p.texts],
        torch.cat([p.truncated for p in parts]),
        logp,
    )


# --- the runtime -------------------------------------------------------------------------------------


def setup(args: Any, num_agents: int) -> DistTeam | None:
    """The trainer's view of the job: None outside torchrun; else init the process group and place the agents."""
    if not launched():
        return None
    device = device_for(getattr(args, "device", "auto"))
    timeout = float(getattr(args, "dist_timeout", DEFAULT_TIMEOUT_S))
    plan = sharding.sharding_plan(getattr(args, "fsdp", None), getattr(args, "fsdp_config", None))
    init(timeout, device, offload=plan is not None and plan.offload_params)
    placement = resolve_placement(num_agents, dist.get_world_size(), getattr(args, "placement", None))
    return DistTeam(placement, device, timeout, plan)


class DistTeam:
    """This process's part of a torchrun job: rank, device, agents, replica, and the collectives the trainer needs."""

    def __init__(
        self,
        placement: Placement,
        device: torch.device,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        plan: sharding.ShardingPlan | None = None,
    ) -> None:
        self.rank, self.world_size = dist.get_rank(), dist.get_world_size()
        if placement.world_size != self.world_size:
            raise ConfigError(f"placement is for {placement.world_size} ranks but the job has {self.world_size}.")
        self.placement, self.device, self.timeout_s, self.plan = placement, device, timeout_s, plan
        self.local_agents = placement.agents_on(self.rank)
        self.replica = placement.replica_of(self.rank)
        timeout = timedelta(seconds=timeout_s)
        cpu_default = dist.get_backend() == "gloo"
        # Python objects travel on gloo (no GPU copies of pickles); gradients on the device's backend.
        self.objects = None if cpu_default else dist.new_group(backend="gloo", timeout=timeout)
        self.grad_groups: dict[int, Any] = {}
        self.object_groups: dict[int, Any] = {}
        for i, ranks in enumerate(placement.ranks):  # every rank creates every group, in the same order
            if len(ranks) < 2:
                continue
            backend = backend_for(device.type, plan is not None and plan.offload_params)
            self.grad_groups[i] = dist.new_group(list(ranks), backend=backend, timeout=timeout)
            self.object_groups[i] = (
                self.grad_groups[i]
                if backend == "gloo"
                else dist.new_group(list(ranks), backend="gloo", timeout=timeout)
            )
        # with fsdp: an agent on several ranks is sharded over them (a device mesh each, built by every rank in order)
        self.meshes: dict[int, Any] = {}
        self.world_mesh = None  # MAAC's centralized critic, on every rank: built when it is sharded (critic_mesh)
        self.ranks_per_node = int(os.environ.get("LOCAL_WORLD_SIZE", self.world_size))
        if plan is not None:
            for i, ranks in enumerate(placement.ranks):
                if len(ranks) > 1:
                    self.meshes[i] = sharding.agent_mesh(ranks, plan, device.type, self.ranks_per_node)
        if self.is_main:
            log.info(
                "torchrun placement (%d ranks, %d agents, %d replica(s)): %s",
                self.world_size,
                placement.num_agents,
                placement.replicas,
                placement.describe(),
            )

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    # --- sharding (fsdp) ----------------------------------------------------------------------------
    def shard_agents(self, agents: list, bf16: bool) -> None:
        """Shard each of ``agents`` placed on several ranks over them (and its KL reference); the agents' ``params``
        are set to the sharded parameters. Agents sharing one LoRA base must share its ranks."""
        if self.plan is None:
            return
        by_model: dict[int, list] = {}
        for a in agents:
            if a.index in self.meshes:
                by_model.setdefault(id(a.model), []).append(a)
        for team in by_model.values():
            rank_sets = {self.placement.ranks[a.index] for a in team}
            if len(rank_sets) > 1:
                raise ConfigError(
                    f"fsdp: agents {[a.index for a in team]} share one LoRA base but are placed on different ranks "
                    f"{sorted(rank_sets)}; place them on the same ranks (training.placement) or set share_base=False."
                )
            mesh = self.meshes[team[0].index]
            adapters = {p for a in team if a.adapter is not None for p in a.params}
            sharding.shard_model(team[0].model, mesh, self.plan, bf16, ignored=adapters)
            for a in team:
                if a.ref_model is not None:
                    sharding.shard_model(a.ref_model, mesh, self.plan, bf16)
                if a.adapter is None:
                    a.params = [p for p in a.model.parameters() if p.requires_grad]
        if self.is_main and self.meshes:
            log.info(
                "fsdp: %s",
                "; ".join(f"agent {i} sharded over ranks {self.placement.ranks[i]}" for i in sorted(self.meshes)),
            )

    def sharded(self, agent: Any) -> bool:
        """True when ``agent``'s trainable weights are FSDP shards (their gradients are reduced by FSDP)."""
        return agent.index in self.meshes and sharding.fully_sharded(agent.model, agent.adapter)

    def lockstep_passes(self, agent: Any, passes: int) -> int:
        """How many forward/backward passes each rank of ``agent`` runs this update: the most any of them needs
        when the agent is sharded (every pass is a collective over its mesh), else ``passes``."""
        if agent.index not in self.meshes:
            return passes
        return max(self.all_gather(passes, f"count passes of agent {agent.index}", self.object_groups[agent.index]))

    def critic_mesh(self, reads: int | None) -> Any:
        """The mesh a critic is sharded over (agent ``reads``'s, or every rank for the centralized one); None when
        it is not sharded. The first call for the centralized critic builds its mesh: every rank makes it."""
        if reads is not None:
            return self.meshes.get(reads)
        if self.world_mesh is None and self.plan is not None:
            ranks = tuple(range(self.world_size))
            self.world_mesh = sharding.agent_mesh(ranks, self.plan, self.device.type, self.ranks_per_node)
        return self.world_mesh

    def shard_critic(self, backbone: Any, reads: int | None, bf16: bool) -> None:
        """Shard a critic's own backbone like its agent (a LoRA critic: the frozen base; its adapters and the value
        head stay whole and have their gradients summed)."""
        mesh = self.critic_mesh(reads)
        if mesh is None:
            return
        adapters = {p for p in backbone.parameters() if p.requires_grad} if hasattr(backbone, "peft_config") else set()
        sharding.shard_model(backbone, mesh, self.plan, bf16, ignored=adapters)

    def critic_group(self, reads: int | None) -> Any:
        """The process group of a critic's copies: agent ``reads``'s ranks, or every rank (None: the default group)."""
        return self.grad_groups.get(reads) if reads is not None else None

    def lockstep_critic_passes(self, reads: int | None, passes: int) -> int:
        """:meth:`lockstep_passes` for the critic that reads ``reads`` (the most passes any rank of its mesh runs)."""
        if self.critic_mesh(reads) is None:
            return passes
        group = self.object_groups.get(reads) if reads is not None else self.objects
        return max(self.all_gather(passes, f"count passes of critic {reads}", group))

    def owns(self, agent: Any) -> bool:
        """True on the rank that writes ``agent`` to disk: the rank of its replica 0."""
        return self.placement.ranks[agent.index][0] == self.rank

    def owns_critic(self, agent: int | None) -> bool:
        """True on the rank that writes agent ``agent``'s critic (the centralized one: ``agent`` None) to disk."""
        return self.placement.ranks[agent][0] == self.rank if agent is not None else self.is_main

    # --- collectives with a clear error --------------------------------------------------------------
    def _fail(self, what: str, exc: BaseException) -> DistributedError:
        return DistributedError(
            f"rank {self.rank}/{self.world_size}: collective '{what}' failed: another rank died, raised, or did not "
            f"arrive within dist_timeout={self.timeout_s:g}s ({type(exc).__name__}: {str(exc).splitlines()[0][:300]})"
        )

    def all_gather(self, obj: Any, what: str, group: Any = None) -> list[Any]:
        out: list[Any] = [None] * dist.get_world_size(group if group is not None else self.objects)
        try:
            dist.all_gather_object(out, obj, group=group if group is not None else self.objects)
        except (RuntimeError, dist.DistError) as exc:
            raise self._fail(what, exc) from exc
        return out

    def sync(self, what: str, error: BaseException | None = None) -> None:
        """A barrier that fails everywhere when ``error`` was raised on any rank (raised as is where it happened)."""
        errors = self.all_gather(None if error is None else f"{type(error).__name__}: {error}", what)
        if error is not None:
            raise error
        failed = [(r, e) for r, e in enumerate(errors) if e is not None]
        if failed:
            raise DistributedError(f"{what} failed on rank {failed[0][0]}: {failed[0][1]}")

    def run_once(self, fn: Callable, *args: Any) -> Any:
        """``fn(*args)`` on rank 0 only; every rank returns its result or raises its exception."""
        return _run_once(fn, args, self.objects, self.rank, self._fail)

    # --- rollout ------------------------------------------------------------------------------------
    def generate_team(
        self,
        agents: list,
        nodes: list,
        g: int,
        settings: Any,
        autocast_dtype: Any = None,
        seed: int | None = None,
        *,
        generate_team: Callable[..., list[Samples]],
    ) -> list[Samples]:
        """Generate this rank's agents on its replica's shard of ``nodes`` with ``generate_team`` (the loop's own,
        :func:`comlrl.trainers.episode.generate_team`); return every agent's samples, all nodes."""
        mine: dict[int, tuple[Samples, int]] = {}
        # Sharded agents, on every rank of their mesh (rows or not): an engine with its own copy of the weights (vLLM)
        # receives them weight by weight; the others decode from the module, its full weights gathered meanwhile.
        sharded = [a.model for a in agents if a.index in self.meshes]
        streamed = [m for m in sharded if getattr(select_engine(settings, m), "holds_weights", False)]
        for model in streamed:
            select_engine(settings, model).prepare(model, settings, autocast_dtype)
        with sharding.gathered([m for m in sharded if m not in streamed]):
            if agents and self.replica is not None:
                lo, hi = shard_bounds(len(nodes), self.placement.replicas)[self.replica]
                if hi > lo:
                    out = generate_team(agents, nodes[lo:hi], g, settings, autocast_dtype, seed=seed, row_offset=lo * g)
                    mine = {a.index: (s, a.tokenizer.pad_token_id) for a, s in zip(agents, out)}
        gathered = self.all_gather(mine, "gather completions")
        team = []
        for i, ranks in enumerate(self.placement.ranks):
            parts = [gathered[r][i] for r in ranks if i in gathered[r]]  # replica order = row order
            team.append(concat_samples([s for s, _ in parts], parts[0][1]))
        return team

    # --- update -------------------------------------------------------------------------------------
    def local_rows(self, batches: list, weights: list[torch.Tensor], num_generations: int) -> tuple[list, list]:
        """This replica's rows of each (samples, advantages) batch and its weights (empty shards dropped)."""
        if self.placement.replicas == 1:
            return batches, weights
        out_b, out_w = [], []
        for (samples, adv), w in zip(batches, weights):
            nodes = samples.completion_ids.shape[0] // num_generations
            lo, hi = shard_bounds(nodes, self.placement.replicas)[self.replica]
            rows = slice(lo * num_generations, hi * num_generations)
            if hi > lo:
                out_b.append((samples.rows(rows.start, rows.stop), adv[rows]))
                out_w.append(w[rows])
        return out_b, out_w

    def reduce_gradients(self, agent: Any, sums: dict[str, float]) -> dict[str, float]:
        """Sum the agent's gradients (and loss-metric sums) over its replicas; a no-op for a single replica.

        Summed, not averaged: each replica's loss already carries the global normalizer (``loss_weights``
        over the whole step), so the sum of the shards' gradients is the full-batch gradient.
        """
        group = self.grad_groups.get(agent.index)
        if group is None:
            return sums
        if self.sharded(agent):  # FSDP reduced them already, as a mean over the agent's ranks
            sharding.scale_gradients(agent.params, len(self.placement.ranks[agent.index]))
            return self.sum_metrics(sums, self.object_groups[agent.index], f"agent {agent.index}")
        return self.sum_gradients(agent.params, sums, group, self.object_groups[agent.index], f"agent {agent.index}")

    def sum_gradients(
        self, params: list, sums: dict[str, float], group: Any, object_group: Any, what: str
    ) -> dict[str, float]:
        """Sum ``params``' gradients over the ranks of ``group`` (in place) and the metric ``sums`` over
        ``object_group`` (gloo, the same ranks); returns the summed metrics."""
        # A parameter without a gradient on every replica keeps grad=None (AdamW then skips it, as in one process).
        has = torch.tensor([p.grad is not None for p in params], dtype=torch.float32, device=self.device)
        try:
            dist.all_reduce(has, op=dist.ReduceOp.MAX, group=group)
            for p, h in zip(params, has.tolist()):
                if h and p.grad is None:
                    p.grad = torch.zeros_like(p)
            grads = [p.grad for p, h in zip(params, has.tolist()) if h]
            # small gradients (LoRA factors, norms) travel coalesced: one collective per ~1 MB instead of one each
            flats = [
                (bucket, torch.cat([g.reshape(-1) for g in bucket]) if len(bucket) > 1 else bucket[0])
                for bucket in grad_buckets(grads, BUCKET_BYTES)
            ]
            works = [dist.all_reduce(flat, op=dist.ReduceOp.SUM, group=group, async_op=True) for _, flat in flats]
            for work in works:
                work.wait()
            for bucket, flat in flats:
                if len(bucket) > 1:
                    for g, part in zip(bucket, flat.split([g.numel() for g in bucket])):
                        g.copy_(part.view_as(g))
        except (RuntimeError, dist.DistError) as exc:
            raise self._fail(f"all-reduce gradients of {what}", exc) from exc
        return self.sum_metrics(sums, object_group, what)

    def sum_metrics(self, sums: dict[str, float], object_group: Any, what: str) -> dict[str, float]:
        """The metric ``sums`` added up over the ranks of ``object_group`` (a key missing on a rank counts 0)."""
        every = self.all_gather(sums, f"sum loss metrics of {what}", object_group)
        keys = list(dict.fromkeys(k for s in every for k in s))
        return {k: sum(s.get(k, 0.0) for s in every) for k in keys}

    def critic_shard(self, agent: int | None) -> tuple[int, int, Any, Any]:
        """(shard index, shard count, gradient group, object group) of a critic's data-parallel update: agent
        ``agent``'s critic (IAC) lives on that agent's replicas; the centralized one (``agent`` None, MAAC) on every
        rank. The groups are None when the critic has a single copy."""
        if agent is not None:
            return (
                self.replica or 0,
                self.placement.replicas,
                self.grad_groups.get(agent),
                self.object_groups.get(agent),
            )
        return self.rank, self.world_size, dist.group.WORLD, self.objects

    def merge_metrics(self, metrics: dict[str, Any]) -> dict[str, Any]:
        """Every rank's metrics in one dict (per-agent keys come from the agent's rank; shared keys from rank 0)."""
        merged: dict[str, Any] = {}
        for part in self.all_gather(metrics, "gather metrics"):
            for k, v in part.items():
                merged.setdefault(k, v)
        return merged


def _portable(error: BaseException | None) -> BaseException | None:
    """``error`` if it survives pickling (to be raised on other ranks), else a DistributedError with its text."""
    if error is None:
        return None
    try:
        return pickle.loads(pickle.dumps(error))
    except Exception:  # noqa: BLE001 -- exceptions with custom constructors may not unpickle
        return DistributedError(f"{type(error).__name__}: {error}")


@contextlib.contextmanager
def saving_on_this_rank(model: Any) -> Iterator[None]:
    """Let ``model.save_pretrained`` write on this rank: transformers >= 5 writes only on torch.distributed rank 0,
    but here each agent is written by the rank that holds it."""
    if not (dist.is_available() and dist.is_initialized()) or not hasattr(model, "should_save_on_this_rank"):
        yield
        return
    model.should_save_on_this_rank = lambda is_main_process=True: is_main_process
    try:
        yield
    finally:
        del model.should_save_on_this_rank


class NullTracker:
    """The metric sink of ranks other than 0: metrics are written once, by rank 0."""

    def log(self, metrics: dict[str, Any], step: int) -> None:
        pass

    def log_samples(self, samples: list[dict], step: int, tag: str | None = None) -> None:
        pass

    def close(self) -> None:
        pass


# --- checkpoints ---------------------------------------------------------------------------------


def rng_file(rank: int) -> str:
    """Rank 0's RNG state is the single-process ``rng_state.pt``; other ranks add their own file."""
    return ck.RNG_FILE if rank == 0 else f"rng_state.rank{rank}.pt"


def save_checkpoint(trainer: Any, output_dir: str | os.PathLike | None = None) -> Path:
    """:func:`comlrl.checkpoint.save_checkpoint` for a torchrun job, with its writer (same layout, loadable by one
    process).

    Rank 0 makes the temporary folder; every rank writes and fsyncs the agents and critics it owns and its RNG state;
    after a barrier that fails everywhere if any rank failed, rank 0 publishes it: a checkpoint is never published
    half-written.
    """
    team: DistTeam = trainer.dist
    rng = ck.rng_state()  # first: nothing below may move a generator before it is captured
    root = Path(output_dir or trainer.args.output_dir)
    step = trainer.state["step"]
    tmp = Path(team.run_once(ck.make_tmp, root, step))
    error = None
    try:
        ck.write_parts(trainer, tmp, rng, team.rank, team.owns, team.owns_critic)
    except Exception as exc:  # noqa: BLE001 -- shared with every rank by sync()
        error = exc
    try:
        team.sync(f"write checkpoint-{step}", error)
    except BaseException:
        if team.is_main:
            shutil.rmtree(tmp, ignore_errors=True)
        raise
    return Path(team.run_once(ck.publish, trainer, tmp, root, step))


def load_checkpoint(trainer: Any, path: str | os.PathLike) -> dict:
    """Every rank restores its own agents (and its RNG state); only rank 0 rewrites metrics.jsonl."""
    team: DistTeam = trainer.dist
    path = Path(path)
    # Ranks other than 0 point the metrics truncation at the checkpoint folder, which has no metrics file.
    meta = ck.load_checkpoint(trainer, path, metrics_dir=None if team.is_main else path)
    own = path / rng_file(team.rank)
    if team.rank and own.is_file():  # rank 0's state was restored from rng_state.pt by load_checkpoint
        ck.set_rng_state(torch.load(own, weights_only=False))
    team.sync(f"load {path.name}")
    return meta


# --- launching -----------------------------------------------------------------------------------


def torchrun_command(nproc: int, args: list[str]) -> list[str]:
    """The single-node torchrun command that runs ``python -m comlrl ARGS`` in ``nproc`` processes."""
    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        f"--nproc-per-node={nproc}",
        "-m",
        "comlrl",
        *args,
    ]


def exec_torchrun(nproc: int, args: list[str]) -> None:
    """Replace this process with torchrun (``comlrl train --nproc K``); torchrun's exit code becomes ours."""
    cmd = torchrun_command(nproc, args)
    log.info("exec: %s", shlex.join(cmd))
    sys.stdout.flush()
    sys.stderr.flush()
    os.execv(cmd[0], cmd)
