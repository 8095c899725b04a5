"""Crash-safe checkpoints: everything needed to continue a run bitwise where it stopped.

Layout of ``<output_dir>/checkpoint-<step>/``::

    agent_<i>/                model (or LoRA adapter) and tokenizer, as trainer.save_model writes them
    agent_<i>/training_state.pt   optimizer and LR-scheduler state
    agent_<i>/sharded/        an agent sharded with fsdp: its model and optimizer state as DCP shards (the folder
                              then holds no weights, and training_state.pt only the scheduler)
    rng_state.pt              python, numpy, torch (and CUDA) generator states at the checkpoint moment
    trainer_state.json        step, epoch, batch_in_epoch, trainer class, args, seed, git hash
    history.json              the trainer's per-step metrics so far
    critics.pt                actor-critic trainers: each critic's trainable weights, optimizer and scheduler
    config.yaml               the run's resolved config (when the run directory has one)
    manifest.json             sha256 and size of every file above; written last

Writing is atomic: files go to a hidden temporary directory, each is fsynced, the manifest is
written last, and only then is the directory renamed to ``checkpoint-<step>``. A directory without
a manifest, or whose files do not match it, is incomplete or corrupt and is skipped on resume with a
warning that names it.

Checkpoints are taken only after an optimizer step (the gradient-accumulation buffer is empty), so
the rollouts of a half-accumulated update never need saving.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import random
import re
import shutil
import tempfile
from pathlib import Path
from typing import Any, Iterator

import numpy as np
import torch

from ..errors import ComlrlError
from ..tracking import METRICS_FILE, git_info, truncate_metrics
from . import sharding

log = logging.getLogger(__name__)

PREFIX = "checkpoint-"
RNG_FILE = "rng_state.pt"
MANIFEST = "manifest.json"
FORMAT = 1
_NAME = re.compile(rf"^{PREFIX}(\d+)$")


class CheckpointError(ComlrlError):
    """A checkpoint cannot be written or read."""


# --- writing ---------------------------------------------------------------------------------------


def save_checkpoint(trainer: Any, output_dir: str | os.PathLike | None = None) -> Path:
    """Write ``checkpoint-<step>`` atomically under ``output_dir`` (default ``trainer.args.output_dir``)."""
    rng = rng_state()  # first: nothing below may move a generator before it is captured
    root = Path(output_dir or trainer.args.output_dir)
    step = trainer.state["step"]
    tmp = Path(make_tmp(root, step))
    try:
        write_parts(trainer, tmp, rng=rng)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return Path(publish(trainer, tmp, root, step))


def make_tmp(root: Path, step: int) -> str:
    """The hidden temporary folder a checkpoint is written into before its atomic rename."""
    root.mkdir(parents=True, exist_ok=True)
    return tempfile.mkdtemp(prefix=f".{PREFIX}{step}.tmp-", dir=root)


def write_parts(
    trainer: Any, tmp: Path, *, rng: dict, rank: int = 0, owns_agent: Any = None, owns_critic: Any = None
) -> None:
    """What process ``rank`` writes into ``tmp`` and fsyncs: its agents (weights or adapters, optimizer and scheduler
    states), its critics (``critics.rank<rank>.pt``, joined by :func:`publish`) and its RNG state.
    ``owns_agent(agent)`` / ``owns_critic(reads)``: which of the process's agents and critics it writes (default all)."""
    with _quiet_transformers():  # one from_pretrained-loadable folder (or LoRA adapter) per agent it owns
        trainer.save_model(str(tmp), gather_sharded=False)
    team = getattr(trainer, "dist", None)
    for agent in trainer.agents:
        sharded = team is not None and team.sharded(agent)
        if sharded:  # every rank of the agent writes its shards
            sharding.save_sharded(
                agent.model, agent.optimizer, tmp / agent.name / sharding.SHARDED_DIR, team.grad_groups[agent.index]
            )
            _sync_tree(tmp / agent.name / sharding.SHARDED_DIR)
        if owns_agent is None or owns_agent(agent):
            state = {"scheduler": agent.scheduler.state_dict()}
            if not sharded:
                state["optimizer"] = agent.optimizer.state_dict()
            torch.save(state, tmp / agent.name / "training_state.pt")
            _sync_tree(tmp / agent.name)
    for critic in getattr(trainer, "critics", []):
        if _critic_sharded(critic):  # every rank of its mesh writes its shards
            folder = tmp / f"critic_{critic.index}" / sharding.SHARDED_DIR
            sharding.save_sharded(critic.model, critic.optimizer, folder, team.critic_group(critic.reads))
            _sync_tree(folder)
    critics = [c for c in getattr(trainer, "critics", []) if owns_critic is None or owns_critic(c.reads)]
    if critics:
        part = tmp / f"critics.rank{rank}.pt"
        torch.save({c.index: _critic_state(c) for c in critics}, part)
        _fsync_file(part)
    name = RNG_FILE if rank == 0 else f"rng_state.rank{rank}.pt"
    torch.save(rng, tmp / name)
    _fsync_file(tmp / name)


def publish(trainer: Any, tmp: Path, root: Path, step: int) -> str:
    """The shared files (trainer state, history, run config, the critics joined), the manifest last, the atomic
    rename and pruning; ``tmp`` is removed if any of it fails. Run by one process (rank 0 of a torchrun job)."""
    try:
        meta = {
            "format": FORMAT,
            "state": dict(trainer.state),
            "trainer": type(trainer).__name__,
            "num_agents": trainer.num_agents,
            "seed": trainer.args.seed,
            "git": git_info(),
            "args": trainer.args.to_dict(),
        }
        world_size = getattr(getattr(trainer, "dist", None), "world_size", 1)
        if world_size > 1:  # a one-process checkpoint names no world size
            meta["world_size"] = world_size
        _write_text(tmp / "trainer_state.json", json.dumps(meta, indent=2, default=str))
        _write_text(tmp / "history.json", json.dumps(trainer.history))
        if (root / "config.yaml").is_file():
            _write_text(tmp / "config.yaml", (root / "config.yaml").read_text())
        if (tmp / "comlrl_config.json").is_file():  # the team config save_model wrote
            _fsync_file(tmp / "comlrl_config.json")
        _join_critics(tmp, getattr(trainer, "num_critics", 0))
        _write_manifest(tmp, step)
        final = root / f"{PREFIX}{step}"
        _replace_dir(tmp, final)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    prune(root, trainer.args.save_total_limit)
    log.info("saved %s", final)
    return str(final)


def _join_critics(tmp: Path, count: int) -> None:
    """The critics' writers left ``critics.rank<r>.pt`` ({critic index: state}); one ``critics.pt`` (a list in critic
    order) replaces them."""
    parts = sorted(tmp.glob("critics.rank*.pt"))
    if not count and not parts:
        return
    states: dict[int, Any] = {}
    for part in parts:
        states.update(torch.load(part, map_location="cpu", weights_only=False))
    if sorted(states) != list(range(count)):
        raise CheckpointError(f"checkpoint: the writers saved critics {sorted(states)}, expected 0..{count - 1}.")
    torch.save([states[i] for i in range(count)], tmp / "critics.pt")
    _fsync_file(tmp / "critics.pt")
    for part in parts:
        part.unlink()


@contextlib.contextmanager
def _quiet_transformers() -> Iterator[None]:
    """No 'Writing model shards' bars inside the training bar."""
    from transformers.utils import logging as hf_logging

    was = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if was:
            hf_logging.enable_progress_bar()


def _write_text(path: Path, text: str) -> None:
    with open(path, "w") as fh:
        fh.write(text)
        fh.flush()
        os.fsync(fh.fileno())
    _file_written(path)


def _file_written(path: Path) -> None:
    """Called after each file reaches the disk (tests pause here to kill a run mid-write)."""


def _fsync_file(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    _file_written(path)


def _sync_tree(folder: Path) -> None:
    for path in sorted(p for p in folder.rglob("*") if p.is_file()):
        _fsync_file(path)


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:  # some platforms cannot open directories
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _write_manifest(folder: Path, step: int) -> None:
    files = {}
    for path in sorted(p for p in folder.rglob("*") if p.is_file()):
        rel = path.relative_to(folder).as_posix()
        files[rel] = {"sha256": sha256(path), "size": path.stat().st_size}
    _write_text(folder / MANIFEST, json.dumps({"format": FORMAT, "step": step, "files": files}, indent=1))
    for sub in sorted(p for p in folder.rglob("*") if p.is_dir()):
        _fsync_dir(sub)
    _fsync_dir(folder)


def _replace_dir(tmp: Path, final: Path) -> None:
    """Rename ``tmp`` to ``final``; an existing ``final`` (a re-run step) is moved aside first."""
    old = None
    if final.exists():
        old = final.with_name(f".{final.name}.old-{os.getpid()}")
        os.rename(final, old)
    os.rename(tmp, final)
    _fsync_dir(final.parent)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def prune(root: Path, keep: int | None) -> list[Path]:
    """Delete the oldest complete checkpoints beyond ``keep`` (None keeps all); returns the deleted ones."""
    if keep is None or keep <= 0:
        return []
    done = [p for _, p in checkpoints(root) if (p / MANIFEST).is_file()]
    removed = done[:-keep]
    for path in removed:
        shutil.rmtree(path, ignore_errors=True)
    return removed


def clean_partial(root: str | os.PathLike) -> list[Path]:
    """Remove temporary directories left by a run killed while writing a checkpoint."""
    root = Path(root)
    if not root.is_dir():
        return []
    stale = [p for p in root.iterdir() if p.is_dir() and p.name.startswith(f".{PREFIX}")]
    for path in stale:
        log.warning("removing %s: a checkpoint whose writing was interrupted", path)
        shutil.rmtree(path, ignore_errors=True)
    return stale


# --- finding and verifying ---------------------------------------------------------------------------


def checkpoints(root: str | os.PathLike) -> list[tuple[int, Path]]:
    """``(step, path)`` of every ``checkpoint-<step>`` directory, oldest first (complete or not)."""
    root = Path(root)
    if not root.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in root.iterdir() if p.is_dir() and (m := _NAME.match(p.name))]
    return sorted(found)


def verify(path: str | os.PathLike) -> str | None:
    """None when the checkpoint is complete and intact, else why not."""
    path = Path(path)
    manifest = path / MANIFEST
    if not manifest.is_file():
        return "no manifest.json (incomplete: the run stopped while writing it)"
    try:
        data = json.loads(manifest.read_text())
        files = data["files"]
    except (json.JSONDecodeError, KeyError, TypeError) as exc:
        return f"unreadable manifest.json ({exc})"
    for rel, meta in files.items():
        f = path / rel
        if not f.is_file():
            return f"missing file {rel}"
        if f.stat().st_size != meta["size"]:
            return f"{rel} has {f.stat().st_size} bytes, the manifest says {meta['size']} (truncated)"
        if sha256(f) != meta["sha256"]:
            return f"{rel} does not match its sha256 in the manifest (corrupt)"
    return None


def latest_checkpoint(root: str | os.PathLike) -> Path | None:
    """The newest complete, intact checkpoint under ``root``; broken ones are skipped with a warning."""
    for _, path in reversed(checkpoints(root)):
        problem = verify(path)
        if problem is None:
            return path
        log.warning("skipping checkpoint %s: %s", path, problem)
    return None


# --- reading -----------------------------------------------------------------------------------------


def load_checkpoint(trainer: Any, path: str | os.PathLike, metrics_dir: str | os.PathLike | None = None) -> dict:
    """Restore weights, optimizer, scheduler, RNG, data position and history from ``path``.

    Metric lines after the checkpoint's step are removed from ``metrics_dir/metrics.jsonl`` (default
    the trainer's output_dir), so a resumed run's metrics file equals an uninterrupted run's.
    """
    path = Path(path)
    problem = verify(path)
    if problem is not None:
        raise CheckpointError(f"checkpoint {path} cannot be used: {problem}.")
    meta = json.loads((path / "trainer_state.json").read_text())
    if meta["num_agents"] != trainer.num_agents:
        raise CheckpointError(f"checkpoint {path} has {meta['num_agents']} agents, the trainer {trainer.num_agents}.")
    team = getattr(trainer, "dist", None)
    for agent in trainer.agents:
        folder = path / agent.name
        sharded = team is not None and team.sharded(agent)
        # the optimizer state straight onto the agent's device (agent_devices); a sharded agent's is in its DCP shards
        device = "cpu" if sharded or not agent.params else agent.params[0].device
        states = torch.load(folder / "training_state.pt", map_location=device, weights_only=False)
        if (folder / sharding.SHARDED_DIR).is_dir():  # DCP reshards to this run's ranks (or one whole model)
            group = team.grad_groups[agent.index] if sharded else None
            sharding.load_sharded(agent.model, agent.optimizer, folder / sharding.SHARDED_DIR, group)
        elif sharded:
            raise CheckpointError(
                f"{folder}: agent {agent.index} was saved unsharded and is sharded in this run (fsdp); resume it "
                "without fsdp, or start from its weights (model=...)."
            )
        else:
            load_weights(agent.model, folder, getattr(agent, "adapter", None))
            agent.optimizer.load_state_dict(states["optimizer"])
        agent.scheduler.load_state_dict(states["scheduler"])
    critics = getattr(trainer, "critics", None) or []  # under torchrun: the critics on this rank
    expected = getattr(trainer, "num_critics", 0)
    if expected or (path / "critics.pt").is_file():
        saved = (
            torch.load(path / "critics.pt", map_location="cpu", weights_only=False)
            if (path / "critics.pt").is_file()
            else []
        )
        if len(saved) != expected:
            raise CheckpointError(f"checkpoint {path} has {len(saved)} critic(s), the trainer {expected}.")
        for critic in critics:
            state = saved[critic.index]
            if state.get("sharded"):  # DCP reshards to this run's ranks (or one whole critic)
                group = team.critic_group(critic.reads) if _critic_sharded(critic) else None
                folder = path / f"critic_{critic.index}" / sharding.SHARDED_DIR
                sharding.load_sharded(critic.model, critic.optimizer, folder, group)
                load_scheduler(critic.scheduler, state["scheduler"])
            elif _critic_sharded(critic):
                raise CheckpointError(f"{path}: critic {critic.index} was saved unsharded and is sharded in this run.")
            else:
                _load_critic(critic, state)
    trainer.state = dict(meta["state"])
    # checkpoints of format 1 counted rollouts as steps
    trainer.state.setdefault("rollouts", trainer.state["step"] * trainer.args.gradient_accumulation_steps)
    trainer.history = json.loads((path / "history.json").read_text())
    set_rng_state(torch.load(path / RNG_FILE, weights_only=False))
    dropped = truncate_metrics(Path(metrics_dir or trainer.args.output_dir) / METRICS_FILE, trainer.state["step"])
    log.info("resumed from %s (step %d; %d later metric line(s) dropped)", path, trainer.state["step"], dropped)
    return meta


def load_weights(model: torch.nn.Module, folder: Path, adapter: str | None = None) -> None:
    """Copy saved weights (a full model, or the LoRA adapter ``adapter``) into ``model`` in place."""
    from safetensors.torch import load_file

    files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise CheckpointError(f"{folder}: no .safetensors weights.")
    state: dict[str, torch.Tensor] = {}
    for f in files:
        state.update(load_file(str(f)))
    if hasattr(model, "peft_config"):
        from peft import set_peft_model_state_dict

        result = set_peft_model_state_dict(model, state, adapter_name=adapter or "default")
        if getattr(result, "unexpected_keys", None):
            raise CheckpointError(f"{folder}: adapter weights do not fit the model: {result.unexpected_keys[:5]}")
        return
    missing, unexpected = model.load_state_dict(state, strict=False)
    # Tied weights (e.g. lm_head = embed_tokens) are saved once; a missing key must share storage with a loaded one.
    ptrs = {name: t.data_ptr() for name, t in model.state_dict().items()}
    loaded = {ptrs[k] for k in state if k in ptrs}
    untied = [k for k in missing if ptrs.get(k) not in loaded]
    if unexpected or untied:
        raise CheckpointError(
            f"{folder}: weights do not fit the model (missing {untied[:5]}, unexpected {unexpected[:5]})."
        )


def _optimized_params(optimizer: torch.optim.Optimizer) -> list[torch.Tensor]:
    return [p for group in optimizer.param_groups for p in group["params"]]


def _critic_state(critic: Any) -> dict[str, Any]:
    """A critic's trainable weights (exactly those its optimizer updates, in its order) and optimizer/scheduler.

    The frozen parts (a LoRA critic's base, an actor backbone under a value head) are rebuilt from the
    model sources when the trainer is constructed, so they are not saved again.
    """
    if _critic_sharded(critic):  # the weights and optimizer state are in critic_<index>/sharded/
        return {"sharded": True, "scheduler": critic.scheduler.state_dict()}
    params = [p.detach().cpu().clone() for p in _optimized_params(critic.optimizer)]
    return {"params": params, "optimizer": critic.optimizer.state_dict(), "scheduler": critic.scheduler.state_dict()}


def load_scheduler(scheduler: Any, state: dict[str, Any]) -> None:
    """Restore an LR schedule whose optimizer may have another number of parameter groups than when it was saved (a
    sharded critic keeps its shards and its whole value head in two groups, one process in one); every group
    follows one schedule, so a per-group list of equal values is resized."""
    groups = len(scheduler.optimizer.param_groups)
    state = dict(state)
    for key, value in state.items():
        if isinstance(value, list) and value and len(value) != groups and all(v == value[0] for v in value):
            state[key] = value[:1] * groups
    scheduler.load_state_dict(state)


def _critic_sharded(critic: Any) -> bool:
    """Whether a critic's trainable weights include FSDP shards (its own backbone sharded with fsdp)."""
    return any(sharding.is_shard(p) for p in _optimized_params(critic.optimizer))


def _load_critic(critic: Any, state: dict[str, Any]) -> None:
    params = _optimized_params(critic.optimizer)
    if len(params) != len(state["params"]) or any(p.shape != q.shape for p, q in zip(params, state["params"])):
        raise CheckpointError("the saved critic's parameters do not fit the trainer's critic.")
    with torch.no_grad():
        for p, q in zip(params, state["params"]):
            p.copy_(q)
    critic.optimizer.load_state_dict(state["optimizer"])
    critic.scheduler.load_state_dict(state["scheduler"])


def rng_state() -> dict[str, Any]:
    state = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
