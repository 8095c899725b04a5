"""The ``comlrl`` command line: train, eval, report, envs.

    comlrl train configs/quickstart.yaml                      # train; run dir runs/<name>-<timestamp>
    comlrl train CONFIG --set training.max_steps=4 --set model=./my-model
    comlrl train CONFIG --set output_dir=runs/a --resume      # continue a killed run from its newest checkpoint
    comlrl eval RUN_DIR [--checkpoint N]                     # the run's trained models -> RUN_DIR/eval_final.json
    comlrl eval CONFIG [--baseline single|parallel|sequential|discussion|centralized ...]  # config's model, untrained
    comlrl compare run:RUN_DIR baseline:single@CONFIG ... --rows 40 --out DIR  # conditions on the same rows
    comlrl report RUN_DIR                                     # plots + report.md from a run directory
    comlrl envs                                               # the environments, their options and defaults

The config schema is in :mod:`comlrl.runconfig`; ``--set a.b=value`` parses ``value`` as YAML.
"""

from __future__ import annotations

import argparse
import json
import logging
import re
import sys
import time
from pathlib import Path
from typing import Any

from . import runconfig
from .cli_eval import cmd_compare, cmd_evaluate
from .errors import ComlrlError
from .runs import BASELINES, build_trainer, load_data, make_env

log = logging.getLogger("comlrl.cli")


def run_directory(cfg: runconfig.RunConfig) -> Path:
    """output_dir, or runs/<name>-<timestamp> (when resuming: the newest existing runs/<name>-*)."""
    if cfg.output_dir:
        return Path(cfg.output_dir)
    if cfg.resume:
        stamped = re.compile(rf"^{re.escape(cfg.name)}-\d{{8}}-\d{{6}}$")
        previous = sorted(p for p in Path("runs").glob(f"{cfg.name}-*") if p.is_dir() and stamped.match(p.name))
        if previous:
            return previous[-1]
    return Path("runs") / f"{cfg.name}-{time.strftime('%Y%m%d-%H%M%S')}"


# --- train -----------------------------------------------------------------------------------------


def cmd_train(ns: argparse.Namespace) -> int:
    from .parallel import distributed, sharding

    if getattr(ns, "nproc", 0):  # the same command under torchrun, one process per rank (docs/distributed.md)
        args = ["-v"] * bool(getattr(ns, "verbose", False)) + ["train", ns.config]
        args += [a for s in ns.set for a in ("--set", s)] + ["--resume"] * bool(ns.resume)
        distributed.exec_torchrun(ns.nproc, args)
    cfg = runconfig.load_config(ns.config, ns.set)
    cfg.resume = cfg.resume or ns.resume
    # Under torchrun (a no-op otherwise): rank 0 picks and prepares the run directory, every rank uses it.
    plan = sharding.sharding_plan(cfg.training.get("fsdp"), cfg.training.get("fsdp_config"))
    offload = plan is not None and plan.offload_params
    distributed.init(cfg.training.get("dist_timeout"), cfg.training.get("device", "auto"), offload=offload)
    run_dir, resume_from = distributed.run_once(_open_run, cfg)
    rank = distributed.world()[0]
    handler = _log_to_file(run_dir / ("train.log" if distributed.is_main() else f"train.rank{rank}.log"))
    try:
        return _train(cfg, run_dir, resume_from)
    finally:
        logging.getLogger("comlrl").removeHandler(handler)
        handler.close()


def _open_run(cfg: runconfig.RunConfig) -> tuple[Path, Path | None]:
    """The run directory and the checkpoint to continue from (None: start over)."""
    run_dir = run_directory(cfg)
    return run_dir, _prepare_run_dir(run_dir, cfg.resume)


def _train(cfg: runconfig.RunConfig, run_dir: Path, resume_from: Path | None) -> int:
    from . import report, tracking
    from .parallel import distributed

    main = distributed.is_main()  # under torchrun, run files are written by rank 0 only
    env = make_env(cfg)
    train, evaluation = load_data(cfg, env)
    resolved = runconfig.resolved(cfg, output_dir=str(run_dir))
    if main:
        (run_dir / "config.yaml").write_text(runconfig.dump(resolved))
    info = tracking.run_info(resolved["training"]["seed"], sys.argv)
    info["resumed_from"] = str(resume_from) if resume_from else None
    if main:
        _append_start(run_dir / "run.json", info)
    log.info(
        "run %s: seed %s, git %s, %d train / %d eval rows",
        run_dir,
        info["seed"],
        info["git"]["commit"],
        len(train),
        len(evaluation or []),
    )
    log.info("resolved config: %s", run_dir / "config.yaml")
    log.debug("resolved config:\n%s", runconfig.dump(resolved))  # console with -v; always in train.log

    trainer = build_trainer(cfg, env, train=train, evaluation=evaluation, output_dir=str(run_dir))
    # _open_run has refused a used run directory unless resuming, so the tracker may append to its metrics
    trainer.tracker = (
        tracking.Tracker(
            run_dir,
            trainer.args.report_to,
            run_name=run_dir.name,
            config=resolved,
            trainer=type(trainer).__name__,
            resume=cfg.resume,
        )
        if main
        else distributed.NullTracker()
    )
    comparison = None
    if evaluation is not None and cfg.evaluation.compare:
        from .run_comparison import RunComparison

        comparison = RunComparison(cfg, run_dir, env, trainer)
    before = (
        _evaluate(trainer, run_dir, tag="before", comparison=comparison)
        if evaluation is not None and cfg.evaluation.before
        else None
    )
    if comparison is not None:  # the baselines answer with the untrained models: before training
        comparison.run_baselines(trainer)
    trainer.train(resume_from_checkpoint=str(resume_from) if resume_from else None)
    trainer.save_model(str(run_dir / "final"))
    after = (
        _evaluate(trainer, run_dir, tag="after", fresh=True, comparison=comparison)
        if evaluation is not None and cfg.evaluation.after
        else None
    )
    trainer.tracker.close()
    if not main:
        return 0
    samples = trainer.last_eval_samples if after else []
    print(summary(before, after, samples=samples, num_samples=cfg.evaluation.num_samples, run_dir=run_dir))
    if comparison is not None:
        print(comparison.write().table())
        print(f"comparison: {comparison.folder / 'results.md'}")
    if cfg.report:
        paths = report.write_report(run_dir)
        print(f"report: {paths['markdown']}")
    return 0


def _prepare_run_dir(run_dir: Path, resume: bool) -> Path | None:
    """Create the run directory; on resume return the checkpoint to continue from (None: start over)."""
    from . import tracking
    from .parallel import checkpoint

    has_run = (run_dir / tracking.METRICS_FILE).exists() or bool(checkpoint.checkpoints(run_dir))
    if has_run and not resume:
        raise ComlrlError(
            f"{run_dir} already holds a run; pass --resume to continue it, or set another output_dir "
            "(unset, every run gets a fresh runs/<name>-<timestamp>). The command line never deletes a "
            "run: training.overwrite_output_dir applies to the Python API only."
        )
    run_dir.mkdir(parents=True, exist_ok=True)
    if not resume:
        return None
    checkpoint.clean_partial(run_dir)
    found = checkpoint.latest_checkpoint(run_dir)
    if found is None:
        log.warning("resume: no complete checkpoint in %s; training starts from step 0", run_dir)
        tracking.truncate_metrics(run_dir / tracking.METRICS_FILE, 0)
    return found


def _evaluate(trainer: Any, run_dir: Path, *, tag: str, fresh: bool = False, comparison: Any = None) -> dict:
    """Evaluate once per run and tag (a resumed run reuses the saved 'before' numbers, when ``comparison`` is given
    only with its saved per-row results); ``comparison`` (a RunComparison) keeps the evaluation's per-row results."""
    path = run_dir / f"eval_{tag}.json"
    if path.is_file() and not fresh and (comparison is None or comparison.has(tag)):
        return json.loads(path.read_text())
    start = time.perf_counter()
    metrics = trainer.evaluate()
    if comparison is not None:
        comparison.add_team(tag, trainer, time.perf_counter() - start)
    trainer.tracker.log_samples(trainer.last_eval_samples, trainer.state["step"], tag=f"eval-{tag}")
    if trainer.dist.is_main:
        path.write_text(json.dumps(metrics, indent=2))
    return metrics


def _append_start(path: Path, info: dict) -> None:
    starts = json.loads(path.read_text())["starts"] if path.is_file() else []
    path.write_text(json.dumps({"starts": starts + [info]}, indent=2))


def summary(before: dict | None, after: dict | None, *, samples: list[dict], num_samples: int, run_dir: Path) -> str:
    """Before/after evaluation rewards (mean and every level) and a few sample completions."""
    lines = [f"run directory: {run_dir}"]
    if before is None and after is None:
        return lines[0]
    keys = sorted(k for k in (after or before) if k == "eval/reward/mean" or k.startswith("eval/reward/level/"))
    lines.append(f"{'evaluation (held-out rows)':<32}{'before':>10}{'after':>10}{'change':>10}")
    for key in keys:
        b = (before or {}).get(key)
        a = (after or {}).get(key)
        cells = [f"{v:10.3f}" if v is not None else f"{'-':>10}" for v in (b, a)]
        change = f"{a - b:+10.3f}" if a is not None and b is not None else f"{'':>10}"
        lines.append(f"{key.removeprefix('eval/'):<32}{''.join(cells)}{change}")
    for s in samples[:num_samples]:
        lines.append(f"--- row {s['row']} (reward {s['reward']:.3f})")
        for i, text in enumerate(s["completions"]):
            lines.append(f"  agent {i}: {_short(text)}")
    return "\n".join(lines)


def _short(text: str, n: int = 160) -> str:
    text = " ".join(text.split())
    return text if len(text) <= n else text[: n - 1] + "…"


# --- report and envs -------------------------------------------------------------------------------


def cmd_report(ns: argparse.Namespace) -> int:
    from . import report

    paths = report.write_report(ns.run_dir)
    for kind, path in paths.items():
        if kind != "plots":
            print(f"{kind}: {path}")
    for path in paths["plots"]:
        print(f"plot: {path}")
    return 0


def cmd_envs(ns: argparse.Namespace) -> int:
    from . import envs

    described = []
    for name in envs.list_envs():
        info = envs.make(name).describe()
        info["options"] = {k: v for k, v in envs.env_options(name).items()}
        described.append(info)
    if ns.json:
        print(json.dumps(described, indent=2, default=str))
        return 0
    for info in described:
        print(f"{info['name']}: {info['description']}")
        print(f"  agents: {info['num_agents']} (default)   max reward: {info['max_reward']}")
        print(f"  options: {_kv(info['options']) or 'none'}")
        print(f"  data (no source): {info.get('data') or 'none'}")
        print(f"  defaults: {_kv(info['defaults']) or 'none'}")
        if info.get("levels"):
            print(f"  reward levels: {', '.join(map(str, info['levels']))}")
    return 0


def _kv(d: dict) -> str:
    return ", ".join(f"{k}={v}" for k, v in d.items())


# --- parser ----------------------------------------------------------------------------------------


def _schema_epilog() -> str:
    lines = ["config keys (YAML):"]
    for section, keys in runconfig.schema().items():
        for key, text in keys.items():
            name = f"{section}.{key}" if section else key
            lines.append(f"  {name:<22} {text}")
    lines.append("  training.<field>        any field of the algorithm's config class (comlrl.configs)")
    lines.append(f"algorithms: {', '.join(runconfig.ALGORITHMS)}")
    return "\n".join(lines)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="comlrl", description="Train teams of LLMs with cooperative multi-agent RL.")
    parser.add_argument("-v", "--verbose", action="store_true", help="Debug logging.")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    raw = argparse.RawDescriptionHelpFormatter
    setting = dict(
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="Override a config key (dotted path; the value is parsed as YAML). Repeatable.",
    )

    p = sub.add_parser(
        "train",
        help="Train a team from a YAML config.",
        formatter_class=raw,
        epilog=_schema_epilog(),
        description="Train, evaluate before/after on held-out rows, save final models and write a report.",
    )
    p.add_argument("config", help="YAML run config (see configs/).")
    p.add_argument("--set", **setting)
    p.add_argument(
        "--resume",
        action="store_true",
        help="Continue from the newest complete checkpoint of the run directory (same as resume: auto).",
    )
    p.add_argument(
        "--nproc",
        type=int,
        default=0,
        metavar="K",
        help="Run under torchrun with K processes on this machine (agents placed on ranks / GPUs; "
        "see docs/distributed.md). For several machines call torchrun yourself.",
    )
    p.set_defaults(func=cmd_train)

    p = sub.add_parser(
        "eval",
        help="Evaluate a trained run's team, a config's (untrained) team, or baselines.",
        description="RUN_DIR: the run's trained models (final/, or --checkpoint N) under its resolved "
        "config.yaml; results also go to RUN_DIR/eval_final.json (eval_checkpoint-N.json). "
        "CONFIG: the model(s) the YAML config names, untrained. Without --baseline: the "
        "team's greedy evaluation (trainer.evaluate) on the config's evaluation rows. With "
        "it: the baselines of comlrl.envs.core.baselines with those models, as a table.",
    )
    p.add_argument(
        "target",
        metavar="RUN_DIR|CONFIG",
        help="A run directory of comlrl train (its trained models), or a YAML run config (its model, "
        "untrained); the config's data section picks the evaluation rows.",
    )
    p.add_argument(
        "--checkpoint",
        type=int,
        metavar="N",
        help="With RUN_DIR: evaluate RUN_DIR/checkpoint-N instead of the final models.",
    )
    p.add_argument(
        "--baseline",
        action="append",
        choices=BASELINES,
        default=[],
        help="single, parallel, sequential, discussion or centralized (agent 0 answers every role in "
        "<agent_i> tags) (repeatable).",
    )
    p.add_argument("--set", **setting)
    p.add_argument("--output", help="Also write the results as JSON to this file.")
    p.set_defaults(func=cmd_evaluate)

    p = sub.add_parser(
        "compare",
        help="Evaluate conditions (trained runs, untrained teams, baselines, cross-play teams) on the same rows, with "
        "intervals.",
        formatter_class=raw,
        description="Every condition answers the same held-out rows (the first --rows evaluation rows of the "
        "first condition's config, or of --config), with the same decoding and --samples answers per row, scored "
        "by that config's env. Writes OUT/results.md (a table: team reward with a 95% bootstrap interval over "
        "rows, the paired difference to --control, each reward level, the task metric, tokens and seconds per "
        "joint answer), results.csv, compare.png, samples.jsonl and summary.json.",
        epilog="""conditions ([NAME=]KIND:TARGET):
  run:DIR                the run's final models; run:DIR@STEP its checkpoint-STEP (a run with num_agents=1:
                         a trained single agent, its answers split into the roles by the env)
  untrained:CONFIG       the config's models, untrained
  baseline:MODE@TARGET   MODE in single, parallel, sequential, discussion, centralized, with the models of
                         TARGET (a config: untrained; a run directory: trained)
  mix:SOURCE,SOURCE,...  cross-play: one source per agent, in agent order; a SOURCE is run:DIR or DIR (agent i
                         of the run; DIR@STEP its checkpoint), untrained (agent i's model of the scoring config)
                         or untrained:CONFIG; SOURCE#J takes agent J of the source as agent i
  DIR | CONFIG           a bare run directory is run:DIR, a bare file untrained:CONFIG
  NAME=CONDITION         the label in the table (default: the run directory's name, 'untrained', the mode, or
                         a mix's sources joined by '+')
examples:
  comlrl compare team=run:runs/tldr-a untrained:configs/tldr_magrpo.yaml \\
      baseline:single@configs/tldr_magrpo.yaml --rows 40 --samples 4 --temperature 0.7 --out compare/tldr
  comlrl compare team=run:runs/tldr-a swap=mix:runs/tldr-a#1,runs/tldr-a#0 \\
      half=mix:runs/tldr-a,untrained seeds=mix:runs/tldr-a,runs/tldr-b --rows 40 --out compare/cross-play""",
    )
    p.add_argument("conditions", nargs="+", metavar="CONDITION", help="What to evaluate (syntax below).")
    p.add_argument("--rows", type=int, metavar="N", help="The first N evaluation rows (default: all of them).")
    p.add_argument("--samples", type=int, default=1, metavar="K", help="Answers per row (K > 1 needs --temperature).")
    p.add_argument("--control", metavar="NAME", help="The condition the others are compared to (default: first).")
    p.add_argument("--out", required=True, metavar="DIR", help="The folder the results are written to.")
    p.add_argument(
        "--temperature",
        type=float,
        default=0.0,
        metavar="T",
        help="Sample at temperature T (plain sampling: no top-p, top-k or penalty); 0 (default): greedy.",
    )
    p.add_argument("--seed", type=int, default=0, metavar="S", help="Sampling and bootstrap seed (default 0).")
    p.add_argument("--resamples", type=int, default=2000, metavar="B", help="Bootstrap resamples (default 2000).")
    p.add_argument(
        "--config",
        metavar="CONFIG|RUN_DIR",
        help="Whose env scores every answer and whose evaluation rows are used (default: the first condition's).",
    )
    p.add_argument("--set", **{**setting, "help": "Override a key of every condition's config. Repeatable."})
    p.set_defaults(func=cmd_compare)

    p = sub.add_parser(
        "report",
        help="Plots and a Markdown summary of a run directory.",
        description="Write report/*.png and report.md into RUN_DIR from its metrics and samples.",
    )
    p.add_argument("run_dir", help="A run directory (has metrics.jsonl).")
    p.set_defaults(func=cmd_report)

    p = sub.add_parser("envs", help="List the environments with their options and suggested settings.")
    p.add_argument("--json", action="store_true", help="Machine-readable output.")
    p.set_defaults(func=cmd_envs)
    return parser


def _log_to_file(path: Path) -> logging.Handler:
    handler = logging.FileHandler(path)
    handler.setLevel(logging.DEBUG)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    logging.getLogger("comlrl").addHandler(handler)
    return handler


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    ns = parser.parse_args(argv)
    root = logging.getLogger("comlrl")
    console = [h for h in root.handlers if getattr(h, "_comlrl_console", False)]
    if not console:
        console = [logging.StreamHandler()]
        console[0].setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))
        console[0]._comlrl_console = True
        root.addHandler(console[0])
    console[0].setLevel(logging.DEBUG if ns.verbose else logging.INFO)
    root.setLevel(logging.DEBUG)
    try:
        return ns.func(ns)
    except ComlrlError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
