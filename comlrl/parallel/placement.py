"""Where agents live in a torchrun job and how rows and gradients are split: pure functions of sizes and tensors."""

from __future__ import annotations

import logging
from dataclasses import dataclass

import torch

from ..errors import ConfigError

log = logging.getLogger(__name__)


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
