"""Scale-out with torchrun: agents placed on ranks, and replicas of an agent splitting the rows of a step.

    torchrun --standalone --nproc-per-node 2 -m comlrl train CONFIG.yaml    # or: comlrl train CONFIG.yaml --nproc 2

The trainer calls :func:`comlrl.parallel.job.setup` at construction. Outside torchrun (or with WORLD_SIZE=1) it
returns a :class:`~comlrl.parallel.job.LocalTeam`: the same interface, every agent and row local, its collectives
identities. Under torchrun every process builds the same trainer; :class:`~comlrl.parallel.job.DistTeam` then decides:

* **Placement** (:func:`comlrl.parallel.placement.resolve_placement`): agent i lives on the ranks ``placement.ranks[i]`` (one per replica).
  Default: round-robin (agent i on rank i % world) when world <= num_agents; otherwise ``world = num_agents x R``
  and rank = replica * num_agents + agent. A rank loads, generates and updates only its own agents.
* **Rollout**: the step's root nodes (and every later turn's nodes) are split into R contiguous shards; replica r
  of every agent generates shard r. Sampling is keyed per row (:mod:`comlrl.rollout.sampling`), so a row's random
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
  :mod:`comlrl.parallel.checkpoint`: rank 0 renames only after every rank has written and fsynced its agents.

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
import sys
from datetime import timedelta
from typing import Any, Callable, Iterator

import torch
import torch.distributed as dist

from ..errors import ComlrlError, ConfigError

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


def require_one_process(message: str) -> None:
    """Refuse what runs in one process only, before any process group: raise ConfigError(``message``) under torchrun."""
    if launched():
        raise ConfigError(message)


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


def run_once(fn: Callable, *args: Any, **kwargs: Any) -> Any:
    """``fn(*args, **kwargs)`` on rank 0 only (or simply called outside torchrun); every rank gets its result or its
    exception."""
    if not (dist.is_available() and dist.is_initialized()):
        return fn(*args, **kwargs)
    group = None if dist.get_backend() == "gloo" else dist.new_group(backend="gloo")  # (objects travel on gloo)
    return run_on_rank0(fn, args, kwargs, group=group, rank=dist.get_rank(), fail=_failed)


def _failed(what: str, exc: BaseException) -> DistributedError:
    return DistributedError(f"{what} failed: {exc}")


def run_on_rank0(fn: Callable, args: tuple, kwargs: dict, *, group: Any, rank: int, fail: Callable) -> Any:
    """``fn(*args, **kwargs)`` on rank 0, its result or exception broadcast over ``group``; ``fail(what, exc)`` makes
    the error of a failed broadcast."""
    result, error = None, None
    if rank == 0:
        try:
            result = fn(*args, **kwargs)
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


# --- errors that cross ranks, files written per rank -------------------------------------------------


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
