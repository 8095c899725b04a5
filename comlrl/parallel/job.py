"""This process's part of a team, one interface (:class:`ProcessTeam`) in one process and under torchrun: its agents,
their collectives and sharding, the rollout split across replicas, and checkpoints. In one process
(:class:`LocalTeam`) every agent and row is local and every collective an identity; under torchrun
(:class:`DistTeam`, see :mod:`comlrl.parallel.distributed`) every rank writes its part of a checkpoint."""

from __future__ import annotations

import logging
import os
import shutil
from datetime import timedelta
from pathlib import Path
from typing import Any, Callable, Protocol, runtime_checkable

import torch
import torch.distributed as dist

from ..engine.process import resolve_device
from ..errors import ConfigError
from ..rollout.generation import select_engine
from ..rollout.rollout import Samples, concat_samples
from . import checkpoint as ck
from . import distributed, sharding
from .distributed import DEFAULT_TIMEOUT_S, DistributedError, backend_for, run_on_rank0
from .placement import BUCKET_BYTES, Placement, grad_buckets, resolve_placement, shard_bounds

log = logging.getLogger(__name__)


def setup(args: Any, num_agents: int) -> ProcessTeam:
    """The trainer's view of the job: a :class:`LocalTeam` outside torchrun; else init the process group and place
    the agents (:class:`DistTeam`). ``agent_devices`` is refused under torchrun before the process group waits."""
    plan = sharding.sharding_plan(getattr(args, "fsdp", None), getattr(args, "fsdp_config", None))
    if not distributed.launched():
        if plan is not None:
            log.info("fsdp=%r outside torchrun: one process holds each whole agent (nothing to shard)", args.fsdp)
        return LocalTeam(resolve_device(getattr(args, "device", "auto")), num_agents)
    names = getattr(args, "agent_devices", None)
    if names is not None:
        raise ConfigError(
            f"agent_devices={list(names)} places agents in one process; under torchrun (WORLD_SIZE > 1) each rank "
            "holds its own agents: set placement (agent index -> rank) and leave agent_devices None."
        )
    device = distributed.device_for(getattr(args, "device", "auto"))
    timeout = float(getattr(args, "dist_timeout", DEFAULT_TIMEOUT_S))
    distributed.init(timeout, device, offload=plan is not None and plan.offload_params)
    placement = resolve_placement(num_agents, dist.get_world_size(), getattr(args, "placement", None))
    return DistTeam(placement, device, timeout, plan)


@runtime_checkable
class ProcessTeam(Protocol):
    """What the trainer asks of this process's part of the team, the same in one process (:class:`LocalTeam`) and
    under torchrun (:class:`DistTeam`): which agents and rows it holds, the collectives among the processes that
    hold an agent, and which process writes what."""

    rank: int  # this process's rank (0 in one process)
    world_size: int  # the job's processes (1 in one process)
    placement: Placement  # agent i on the ranks placement.ranks[i], replica 0 first
    device: torch.device  # the trainer's device
    timeout_s: float  # every collective's limit
    plan: sharding.ShardingPlan | None  # the FSDP plan in effect (None: nothing is sharded)
    local_agents: list[int]  # the agents whose weights live in this process
    replica: int | None  # the replica of this process's agents, which picks their rows (None: it holds none)
    objects: Any  # the process group Python objects travel on (None: the default one)
    grad_groups: dict[int, Any]  # agent index -> the process group of its replicas' gradients (several only)
    object_groups: dict[int, Any]  # agent index -> the gloo group of its replicas (several only)
    meshes: dict[int, Any]  # agent index -> the device mesh it is sharded over (fsdp, several ranks only)
    world_mesh: Any  # the centralized critic's mesh, when it is sharded
    ranks_per_node: int  # the processes of one machine

    @property
    def is_main(self) -> bool: ...  # the process that writes run-level files and metrics

    @property
    def team_forward(self) -> bool: ...  # whether agents on one LoRA base may run their losses as one routed pass

    def shard_agents(self, agents: list, bf16: bool) -> None: ...
    def sharded(self, agent: Any) -> bool: ...
    def lockstep_passes(self, agent: Any, passes: int) -> int: ...
    def critic_mesh(self, reads: int | None) -> Any: ...
    def shard_critic(self, backbone: Any, reads: int | None, bf16: bool) -> None: ...
    def critic_group(self, reads: int | None) -> Any: ...
    def lockstep_critic_passes(self, reads: int | None, passes: int) -> int: ...
    def owns(self, agent: Any) -> bool: ...
    def owns_critic(self, agent: int | None) -> bool: ...
    def all_gather(self, obj: Any, what: str, group: Any = None) -> list[Any]: ...
    def sync(self, what: str, error: BaseException | None = None) -> None: ...
    def run_once(self, fn: Callable, *args: Any, **kwargs: Any) -> Any: ...
    def require_one_process(self, message: str) -> None: ...
    def generate_team(
        self,
        agents: list,
        nodes: list,
        g: int,
        *,
        settings: Any,
        autocast_dtype: Any = None,
        seed: int | None = None,
        generate_team: Callable[..., list[Samples]],
        acting: list[int] | None = None,
    ) -> list[Samples]: ...
    def local_rows(self, batches: list, weights: list[torch.Tensor], num_generations: int) -> tuple[list, list]: ...
    def reduce_gradients(self, agent: Any, sums: dict[str, float]) -> dict[str, float]: ...
    def sum_gradients(
        self, params: list, sums: dict[str, float], *, group: Any, object_group: Any, what: str
    ) -> dict[str, float]: ...
    def sum_metrics(self, sums: dict[str, float], object_group: Any, what: str) -> dict[str, float]: ...
    def critic_shard(self, agent: int | None) -> tuple[int, int, Any, Any]: ...
    def merge_metrics(self, metrics: dict[str, Any]) -> dict[str, Any]: ...
    def save_checkpoint(self, trainer: Any, output_dir: str | os.PathLike | None = None) -> Path: ...
    def load_checkpoint(self, trainer: Any, path: str | os.PathLike) -> dict: ...


class LocalTeam:
    """The whole team in one process: every agent and every row are local, one replica, nothing sharded; its
    collectives are identities and it writes everything (a one-process :class:`DistTeam`, without a process group)."""

    def __init__(self, device: torch.device, num_agents: int) -> None:
        self.rank, self.world_size = 0, 1
        self.placement, self.device = resolve_placement(num_agents, 1), device
        self.timeout_s, self.plan = DEFAULT_TIMEOUT_S, None
        self.local_agents, self.replica = list(range(num_agents)), 0
        self.objects, self.world_mesh, self.ranks_per_node = None, None, 1
        self.grad_groups: dict[int, Any] = {}
        self.object_groups: dict[int, Any] = {}
        self.meshes: dict[int, Any] = {}

    @property
    def is_main(self) -> bool:
        return True

    @property
    def team_forward(self) -> bool:
        """True: agents on one LoRA base may run their losses as one routed pass."""
        return True

    # --- sharding: one process holds each whole agent -----------------------------------------------
    def shard_agents(self, agents: list, bf16: bool) -> None:
        """Nothing to shard."""

    def sharded(self, agent: Any) -> bool:
        return False

    def lockstep_passes(self, agent: Any, passes: int) -> int:
        return passes

    def critic_mesh(self, reads: int | None) -> Any:
        return None

    def shard_critic(self, backbone: Any, reads: int | None, bf16: bool) -> None:
        """Nothing to shard."""

    def critic_group(self, reads: int | None) -> Any:
        return None

    def lockstep_critic_passes(self, reads: int | None, passes: int) -> int:
        return passes

    def owns(self, agent: Any) -> bool:
        return True

    def owns_critic(self, agent: int | None) -> bool:
        return True

    # --- collectives of one process -------------------------------------------------------------------
    def all_gather(self, obj: Any, what: str, group: Any = None) -> list[Any]:
        return [obj]

    def sync(self, what: str, error: BaseException | None = None) -> None:
        """Raise ``error`` when given (the barrier of one process)."""
        if error is not None:
            raise error

    def run_once(self, fn: Callable, *args: Any, **kwargs: Any) -> Any:
        return fn(*args, **kwargs)

    def require_one_process(self, message: str) -> None:
        """Nothing to refuse in one process."""

    # --- rollout and update ---------------------------------------------------------------------------
    def generate_team(
        self,
        agents: list,
        nodes: list,
        g: int,
        *,
        settings: Any,
        autocast_dtype: Any = None,
        seed: int | None = None,
        generate_team: Callable[..., list[Samples]],
        acting: list[int] | None = None,
    ) -> list[Samples]:
        """``generate_team`` on every node: the samples of every agent (``acting``: of those agents only)."""
        if acting is None:
            return generate_team(agents, nodes, g, settings=settings, autocast_dtype=autocast_dtype, seed=seed)
        return generate_team(
            agents, nodes, g, settings=settings, autocast_dtype=autocast_dtype, seed=seed, acting=acting
        )

    def local_rows(self, batches: list, weights: list[torch.Tensor], num_generations: int) -> tuple[list, list]:
        return batches, weights

    def reduce_gradients(self, agent: Any, sums: dict[str, float]) -> dict[str, float]:
        return sums

    def sum_gradients(
        self, params: list, sums: dict[str, float], *, group: Any, object_group: Any, what: str
    ) -> dict[str, float]:
        return sums

    def sum_metrics(self, sums: dict[str, float], object_group: Any, what: str) -> dict[str, float]:
        return sums

    def critic_shard(self, agent: int | None) -> tuple[int, int, Any, Any]:
        """Every row in one shard, no group to sum over."""
        return 0, 1, None, None

    def merge_metrics(self, metrics: dict[str, Any]) -> dict[str, Any]:
        return metrics

    # --- checkpoints ----------------------------------------------------------------------------------
    def save_checkpoint(self, trainer: Any, output_dir: str | os.PathLike | None = None) -> Path:
        """:func:`comlrl.parallel.checkpoint.save_checkpoint`."""
        return ck.save_checkpoint(trainer, output_dir)

    def load_checkpoint(self, trainer: Any, path: str | os.PathLike) -> dict:
        """:func:`comlrl.parallel.checkpoint.load_checkpoint`."""
        return ck.load_checkpoint(trainer, path)


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

    @property
    def team_forward(self) -> bool:
        """False: under torchrun each agent's passes are counted and its gradients reduced agent by agent."""
        return False

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
            sharding.shard_model(team[0].model, mesh, plan=self.plan, bf16=bf16, ignored=adapters)
            for a in team:
                if a.ref_model is not None:
                    sharding.shard_model(a.ref_model, mesh, plan=self.plan, bf16=bf16)
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
        sharding.shard_model(backbone, mesh, plan=self.plan, bf16=bf16, ignored=adapters)

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

    def run_once(self, fn: Callable, *args: Any, **kwargs: Any) -> Any:
        """``fn(*args, **kwargs)`` on rank 0 only; every rank returns its result or raises its exception."""
        return run_on_rank0(fn, args, kwargs, group=self.objects, rank=self.rank, fail=self._fail)

    def require_one_process(self, message: str) -> None:
        """Refuse what runs in one process only: raise ConfigError(``message``)."""
        raise ConfigError(message)

    # --- rollout ------------------------------------------------------------------------------------
    def generate_team(
        self,
        agents: list,
        nodes: list,
        g: int,
        *,
        settings: Any,
        autocast_dtype: Any = None,
        seed: int | None = None,
        generate_team: Callable[..., list[Samples]],
        acting: list[int] | None = None,
    ) -> list[Samples]:
        """Generate this rank's agents on its replica's shard of ``nodes`` with ``generate_team`` (the loop's own,
        :func:`comlrl.rollout.episode.generate_team`); return every agent's samples, all nodes. ``acting``: only those
        agents act (on every rank, the same), and only their samples are returned, in agent order."""
        if acting is not None:  # this rank's acting agents; a rank none of whose agents act only gathers
            agents = [a for a in agents if a.index in acting]
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
                    out = generate_team(
                        agents,
                        nodes[lo:hi],
                        g,
                        settings=settings,
                        autocast_dtype=autocast_dtype,
                        seed=seed,
                        row_offset=lo * g,
                    )
                    mine = {a.index: (s, a.tokenizer.pad_token_id) for a, s in zip(agents, out)}
        gathered = self.all_gather(mine, "gather completions")
        team = []
        for i, ranks in enumerate(self.placement.ranks):
            if acting is not None and i not in acting:
                continue
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
        return self.sum_gradients(
            agent.params, sums, group=group, object_group=self.object_groups[agent.index], what=f"agent {agent.index}"
        )

    def sum_gradients(
        self, params: list, sums: dict[str, float], *, group: Any, object_group: Any, what: str
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

    # --- checkpoints: every rank writes its part ------------------------------------------------------
    def save_checkpoint(self, trainer: Any, output_dir: str | os.PathLike | None = None) -> Path:
        """:func:`comlrl.parallel.checkpoint.save_checkpoint` for a torchrun job (the same layout, loadable by one
        process).

        Rank 0 makes the temporary folder; every rank writes and fsyncs the agents and critics it owns and its RNG
        state; after a barrier that fails everywhere if any rank failed, rank 0 publishes it: a checkpoint is never
        published half-written.
        """
        rng = ck.rng_state()  # first: nothing below may move a generator before it is captured
        root = Path(output_dir or trainer.args.output_dir)
        step = trainer.state["step"]
        tmp = Path(self.run_once(ck.make_tmp, root, step))
        error = None
        try:
            ck.write_parts(trainer, tmp, rng=rng, rank=self.rank, owns_agent=self.owns, owns_critic=self.owns_critic)
        except Exception as exc:  # noqa: BLE001 -- shared with every rank by sync()
            error = exc
        try:
            self.sync(f"write checkpoint-{step}", error)
        except BaseException:
            if self.is_main:
                shutil.rmtree(tmp, ignore_errors=True)
            raise
        return Path(self.run_once(ck.publish, trainer, tmp, root, step))

    def load_checkpoint(self, trainer: Any, path: str | os.PathLike) -> dict:
        """Every rank restores its own agents (and its RNG state); only rank 0 rewrites metrics.jsonl."""
        path = Path(path)
        # Ranks other than 0 point the metrics truncation at the checkpoint folder, which has no metrics file.
        meta = ck.load_checkpoint(trainer, path, metrics_dir=None if self.is_main else path)
        own = path / rng_file(self.rank)
        if self.rank and own.is_file():  # rank 0's state was restored from rng_state.pt by load_checkpoint
            ck.set_rng_state(torch.load(own, weights_only=False))
        self.sync(f"load {path.name}")
        return meta


def rng_file(rank: int) -> str:
    """Rank 0's RNG state is the single-process ``rng_state.pt``; other ranks add their own file."""
    return ck.RNG_FILE if rank == 0 else f"rng_state.rank{rank}.pt"
