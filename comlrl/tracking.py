"""Where metrics go: always a JSONL file in the run directory; TensorBoard and Weights & Biases when asked.

``metrics.jsonl`` has one JSON object per logged step: ``step`` plus the metric keys the trainer emits (every
key, what it measures and when it is logged: the Metrics page of the documentation, ``docs/metrics.md``). Evaluation samples go to ``samples/<tag>.jsonl``. ``run_info.json`` names the trainer
class and holds the ``config`` the tracker was given, so a report can name a Python-API run's algorithm.

One directory holds one run's metrics: a tracker refuses a directory whose ``metrics.jsonl`` already has lines
(another run's) unless told to resume that run (``resume=True``: it appends; the checkpoint loader has already
dropped the lines after the checkpoint's step) or to overwrite it (``overwrite=True``: the previous
``metrics.jsonl``, ``samples/``, ``tensorboard/`` and ``run_info.json`` are removed before the first write;
checkpoints and saved models are left alone).

The optional sinks are imported only when ``report_to`` names them; a sink that is asked for but not
installed logs a warning once and is skipped, never stopping a run.
"""

from __future__ import annotations

import itertools
import json
import logging
import math
import os
import platform
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Iterable

from .errors import ConfigError, suggest

log = logging.getLogger(__name__)

SINKS = ("tensorboard", "wandb")
METRICS_FILE = "metrics.jsonl"
SAMPLES_DIR = "samples"
RUN_INFO_FILE = "run_info.json"
TENSORBOARD_DIR = "tensorboard"


class Tracker:
    """Metric sinks of one run directory: JSONL always, plus the ``report_to`` sinks that are installed."""

    def __init__(
        self,
        output_dir: str | os.PathLike,
        report_to: Iterable[str] = (),
        *,
        run_name: str | None = None,
        config: dict | None = None,
        trainer: str | None = None,
        overwrite: bool = False,
        resume: bool = False,
        wandb_init: dict | None = None,
    ) -> None:
        """``trainer``: the trainer's class name, written to ``run_info.json`` (with ``config``) on the first write.
        ``wandb_init``: keyword arguments of ``wandb.init`` (project, entity, name, dir, tags, config, ...) over ours.
        ``resume``: continue the run whose metrics are in ``output_dir`` (append). ``overwrite``: replace them.
        With neither, a directory that already holds metric lines raises :class:`ConfigError`, checked here, before
        any training. ``resume`` wins over ``overwrite``: a resumed run keeps its lines up to the checkpoint."""
        self.dir = Path(output_dir)
        self.report_to = [r for r in report_to if r not in ("none", "jsonl")]
        for name in self.report_to:
            if name not in SINKS:
                raise ConfigError(
                    f"report_to: unknown sink '{name}'.{suggest(name, list(SINKS))} Available: {', '.join(SINKS)}."
                )
        self.run_name = run_name or self.dir.name
        self.config = config or {}
        self.trainer = trainer
        self.wandb_init = dict(wandb_init or {})
        self.resume, self.overwrite = resume, overwrite and not resume
        if not (resume or overwrite):
            _check_unused(self.dir)
        self._started = False
        self._sinks: dict[str, Any] | None = None

    @property
    def metrics_path(self) -> Path:
        return self.dir / METRICS_FILE

    def _start(self) -> None:
        """Before the first write: clear a previous run's files (overwrite) and write ``run_info.json``."""
        if self._started:
            return
        self._started = True
        if self.overwrite:
            _remove_previous(self.dir)
        info = self.dir / RUN_INFO_FILE
        if self.trainer is not None and not (self.resume and info.is_file()):
            self.dir.mkdir(parents=True, exist_ok=True)
            info.write_text(
                json.dumps(
                    {
                        "trainer": self.trainer,
                        "run_name": self.run_name,
                        "git": git_info(),
                        "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                        "config": self.config,
                    },
                    indent=2,
                    default=str,
                )
            )

    def _open(self) -> dict[str, Any]:
        self._start()
        if self._sinks is None:
            self._sinks = {}
            for name in self.report_to:
                sink = _open_sink(
                    name, out=self.dir, run_name=self.run_name, config=self.config, wandb_init=self.wandb_init
                )
                if sink is not None:
                    self._sinks[name] = sink
        return self._sinks

    def log(self, metrics: dict[str, Any], step: int) -> None:
        """Append one JSONL line and send the numeric values to the open sinks."""
        self._start()
        self.dir.mkdir(parents=True, exist_ok=True)
        with open(self.metrics_path, "a") as fh:
            fh.write(json.dumps(metrics) + "\n")
        scalars = {
            k: float(v)
            for k, v in metrics.items()
            if k != "step" and isinstance(v, (int, float)) and not isinstance(v, bool)
        }
        for name, sink in self._open().items():
            if name == "tensorboard":
                for k, v in scalars.items():
                    sink.add_scalar(k, v, step)
                sink.flush()
            elif name == "wandb":
                sink.log(scalars, step=step)

    def log_samples(self, samples: list[dict], step: int, tag: str | None = None) -> Path:
        """Write evaluation samples to ``samples/<tag>.jsonl`` (default tag ``eval-step<step>``)."""
        self._start()
        tag = tag or f"eval-step{step:06d}"
        out = self.dir / SAMPLES_DIR / f"{tag}.jsonl"
        out.parent.mkdir(parents=True, exist_ok=True)
        with open(out, "w") as fh:
            for s in samples:
                fh.write(json.dumps({"step": step, **s}) + "\n")
        for name, sink in self._open().items():
            text = "\n\n".join(_sample_text(s) for s in samples[:4])
            if name == "tensorboard":
                sink.add_text(f"samples/{tag}", text.replace("\n", "  \n"), step)
            elif name == "wandb":
                import wandb

                table = wandb.Table(columns=["row", "reward", "completions"])
                for s in samples:
                    table.add_data(s.get("row"), s.get("reward"), json.dumps(s.get("completions")))
                sink.log({f"samples/{tag}": table}, step=step)
        return out

    def close(self) -> None:
        for name, sink in (self._sinks or {}).items():
            try:
                sink.close() if name == "tensorboard" else sink.finish()
            except Exception as exc:  # a sink failing to close must not fail a finished run
                log.warning("closing %s failed: %s", name, exc)
        self._sinks = None


def _check_unused(folder: Path) -> None:
    """Raise when ``folder`` already holds another run's metric lines (a new run would append to them)."""
    path = folder / METRICS_FILE
    if not path.is_file() or path.stat().st_size == 0:  # empty: e.g. a resume that found no checkpoint truncated it
        return
    rows = read_metrics(path)
    steps = [r["step"] for r in rows if isinstance(r.get("step"), int)]
    what = f"{len(rows)} line(s)" + (f", steps {min(steps)}-{max(steps)}" if steps else "")
    raise ConfigError(
        f"{folder} already holds {METRICS_FILE} from a previous run ({what}); this run would append its metrics to "
        f"them. Use a new output_dir, pass overwrite_output_dir=True to replace them, or resume_from_checkpoint= "
        f"to continue that run."
    )


def _remove_previous(folder: Path) -> None:
    """Delete what a tracker writes (metrics, samples, TensorBoard events, run info); checkpoints and models stay."""
    files = [folder / name for name in (METRICS_FILE, RUN_INFO_FILE) if (folder / name).exists()]
    dirs = [folder / name for name in (SAMPLES_DIR, TENSORBOARD_DIR) if (folder / name).is_dir()]
    if not files and not dirs:
        return
    log.warning("overwrite: replacing a previous run's %s in %s", ", ".join(p.name for p in files + dirs), folder)
    for path in files:
        path.unlink()
    for path in dirs:
        shutil.rmtree(path)


def fresh_output_dir(name: str, root: str | os.PathLike = "output") -> str:
    """A new, empty run folder ``root/<name>-<YYYYmmdd-HHMMSS>`` (``-2``, ``-3``... when that one exists), created
    here so that two runs started in the same second still get their own."""
    stamp = time.strftime("%Y%m%d-%H%M%S")
    Path(root).mkdir(parents=True, exist_ok=True)
    for n in itertools.count(1):
        folder = Path(root) / (f"{name}-{stamp}" if n == 1 else f"{name}-{stamp}-{n}")
        try:
            folder.mkdir()
        except FileExistsError:
            continue
        return str(folder)
    raise AssertionError("unreachable")


def read_run_info(run_dir: str | os.PathLike) -> dict[str, Any]:
    """``run_info.json`` of a run directory (trainer class name, config, start time), or {} when there is none."""
    path = Path(run_dir) / RUN_INFO_FILE
    try:
        return json.loads(path.read_text()) if path.is_file() else {}
    except json.JSONDecodeError:
        return {}


def _open_sink(name: str, *, out: Path, run_name: str, config: dict, wandb_init: dict | None = None) -> Any:
    try:
        if name == "tensorboard":
            from torch.utils.tensorboard import SummaryWriter

            return SummaryWriter(log_dir=str(out / "tensorboard"))
        import wandb

        init = {"project": os.environ.get("WANDB_PROJECT", "comlrl"), "name": run_name, "dir": str(out)}
        init.update({k: v for k, v in (wandb_init or {}).items() if v is not None})
        init["config"] = {**config, **(wandb_init or {}).get("config", {})}
        return wandb.init(**init, reinit=True)
    except ImportError:
        package = "tensorboard" if name == "tensorboard" else "wandb"
        log.warning(
            "report_to includes '%s' but it is not installed (pip install %s); metrics go to %s only.",
            name,
            package,
            out / METRICS_FILE,
        )
    except Exception as exc:  # e.g. wandb without login: the run goes on with the JSONL file
        log.warning(
            "report_to '%s' could not start (%s: %s); metrics go to %s only.",
            name,
            type(exc).__name__,
            exc,
            out / METRICS_FILE,
        )
    return None


def _sample_text(sample: dict) -> str:
    parts = [f"row {sample.get('row')} reward {sample.get('reward'):.3f}"]
    for i, c in enumerate(sample.get("completions", [])):
        parts.append(f"agent {i}: {c}")
    return "\n".join(parts)


def read_metrics(path: str | os.PathLike) -> list[dict]:
    """The JSONL metric lines (a final partial line, as a killed run may leave, is ignored)."""
    path = Path(path)
    if path.is_dir():
        path = path / METRICS_FILE
    if not path.is_file():
        return []
    out = []
    for line in path.read_text().splitlines():
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return out


def truncate_metrics(path: str | os.PathLike, last_step: int) -> int:
    """Keep only lines with ``step <= last_step`` (and drop partial lines); returns how many were dropped.

    A resumed run replays the steps after its checkpoint; without this the file would hold them twice.
    """
    path = Path(path)
    if not path.is_file():
        return 0
    lines = path.read_text().splitlines()
    keep = []
    for line in lines:
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            continue
        if row.get("step", math.inf) <= last_step:
            keep.append(line)
    tmp = path.with_suffix(".jsonl.tmp")
    tmp.write_text("".join(line + "\n" for line in keep))
    os.replace(tmp, path)
    return len(lines) - len(keep)


def git_info() -> dict[str, Any]:
    """Commit hash and dirty flag of the comlrl source checkout (None outside a git checkout)."""
    root = Path(__file__).resolve().parent.parent
    try:
        commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True, timeout=10)
        if commit.returncode != 0:
            return {"commit": None, "dirty": None}
        status = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=root,
            capture_output=True,
            text=True,
            timeout=10,
        )
        return {"commit": commit.stdout.strip(), "dirty": bool(status.stdout.strip())}
    except (OSError, subprocess.SubprocessError):
        return {"commit": None, "dirty": None}


def run_info(seed: int, argv: list[str] | None = None) -> dict[str, Any]:
    """What a run records at its start: seed, git hash, versions, command line, time."""
    import torch
    import transformers

    from . import __version__

    return {
        "seed": seed,
        "git": git_info(),
        "comlrl": __version__,
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "python": platform.python_version(),
        "argv": list(argv if argv is not None else sys.argv),
        "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }
