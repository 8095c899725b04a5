"""A run's report: PNG plots of the metrics and a one-page Markdown summary with sample completions.

``write_report(run_dir)`` reads ``metrics.jsonl``, ``config.yaml``, ``run.json``, ``eval_before.json`` /
``eval_after.json`` and ``samples/*.jsonl`` from a run directory (a Python-API run has no ``config.yaml`` or
``run.json``: its trainer, settings and start come from the tracker's ``run_info.json``) and writes::

    report/reward.png    team reward per step (raw and smoothed) and evaluation points
    report/levels.png    the mean score of each reward level per step (smoothed)
    report/length.png    each agent's mean completion length in tokens
    report/loss.png      each agent's policy loss (and KL to the reference when beta > 0)
    report/rounds.png    preference rounds (MADPO, MARLHF): each round's candidate rewards, team vs comparator
    report.md            the summary, linking the plots (and the table of compare/, written with evaluation.compare)
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any

from .errors import ComlrlError
from .plots import DPI, FIGSIZE, pyplot
from .tracking import SAMPLES_DIR, read_metrics, read_run_info


def smooth(values: list[float], alpha: float | None = None) -> list[float]:
    """Exponential moving average (bias-corrected, as TensorBoard does); alpha from the series length by default."""
    if not values:
        return []
    alpha = alpha if alpha is not None else min(0.9, max(0.0, 1.0 - 5.0 / max(len(values), 1)))
    out, avg = [], 0.0
    for i, v in enumerate(values, start=1):
        avg = alpha * avg + (1 - alpha) * v
        out.append(avg / (1 - alpha**i) if alpha > 0 else v)
    return out


def _series(rows: list[dict], key: str) -> tuple[list[int], list[float]]:
    pts = [
        (r["step"], float(r[key]))
        for r in rows
        if key in r and isinstance(r[key], (int, float)) and math.isfinite(float(r[key]))
    ]
    return [p[0] for p in pts], [p[1] for p in pts]


def _keys(rows: list[dict], prefix: str, suffix: str = "") -> list[str]:
    return sorted({k for r in rows for k in r if k.startswith(prefix) and k.endswith(suffix)})


def _figure() -> tuple[Any, Any]:
    fig, ax = pyplot().subplots(figsize=FIGSIZE, dpi=DPI)
    ax.grid(alpha=0.3)
    ax.set_xlabel("step")
    return fig, ax


def _save(fig: Any, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=DPI)  # no bbox_inches="tight": every plot keeps the fixed size
    pyplot().close(fig)
    return path


def plot_reward(rows: list[dict], path: Path, before: dict | None = None, after: dict | None = None) -> Path | None:
    steps, values = _series(rows, "reward/mean")
    if not steps:
        return None
    fig, ax = _figure()
    ax.plot(steps, values, color="tab:blue", alpha=0.3, label="reward/mean (train batch)")
    ax.plot(steps, smooth(values), color="tab:blue", label="smoothed")
    es, ev = _series(rows, "eval/reward/mean")
    points = ([(0, before["eval/reward/mean"])] if before and "eval/reward/mean" in before else []) + list(zip(es, ev))
    if after and "eval/reward/mean" in after:
        points.append((steps[-1], after["eval/reward/mean"]))
    if points:
        ax.plot(
            [p[0] for p in points], [p[1] for p in points], "o--", color="tab:orange", label="eval (held-out, greedy)"
        )
    ax.set_ylabel("team reward")
    ax.set_title("Team reward")
    ax.legend(loc="best", fontsize=8)
    return _save(fig, path)


def plot_lines(
    rows: list[dict], keys: list[str], *, path: Path, title: str, ylabel: str, smoothed: bool = False
) -> Path | None:
    series = [(k, *_series(rows, k)) for k in keys]
    series = [s for s in series if s[1]]
    if not series:
        return None
    fig, ax = _figure()
    for key, steps, values in series:
        ax.plot(steps, smooth(values) if smoothed else values, label=key)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.legend(loc="best", fontsize=8)
    return _save(fig, path)


def plot_loss(rows: list[dict], path: Path) -> Path | None:
    loss_keys = _keys(rows, "agent/", "/policy/pg_loss")
    kl_keys = [k for k in _keys(rows, "agent/", "/policy/kl") if any(r.get(k) for r in rows)]
    if not any(_series(rows, k)[0] for k in loss_keys + kl_keys):
        return None
    fig, ax = _figure()
    for key in loss_keys:
        ax.plot(*_series(rows, key), label=key)
    ax.set_ylabel("policy-gradient loss")
    ax.set_title("Loss" + (" and KL" if kl_keys else ""))
    handles, labels = ax.get_legend_handles_labels()
    if kl_keys:
        ax2 = ax.twinx()
        for key in kl_keys:
            ax2.plot(*_series(rows, key), linestyle="--", label=key)
        ax2.set_ylabel("KL to reference")
        h2, l2 = ax2.get_legend_handles_labels()
        handles, labels = handles + h2, labels + l2
    ax.legend(handles, labels, loc="best", fontsize=8)
    return _save(fig, path)


def plot_rounds(path: Path, out: Path, max_panels: int = 8) -> Path | None:
    """Histograms of each preference round's candidate team rewards, the team's beside the comparator's (at most
    ``max_panels`` rounds, evenly spaced, always the first and the last)."""
    if not path.is_file():
        return None
    rounds = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    if not rounds:
        return None
    if len(rounds) > max_panels:
        picks = sorted({round(i * (len(rounds) - 1) / (max_panels - 1)) for i in range(max_panels)})
        rounds = [rounds[i] for i in picks]
    values = [v for r in rounds for key in ("team_rewards", "comparator_rewards") for v in r.get(key, [])]
    lo, hi = min(values), max(values)
    bins = 12 if hi > lo else 1
    cols = min(4, len(rounds))
    rows_n = math.ceil(len(rounds) / cols)
    fig, axes = pyplot().subplots(rows_n, cols, figsize=FIGSIZE, dpi=DPI, squeeze=False, sharex=True)
    for ax, r in zip(axes.flat, rounds):
        ax.hist(r["team_rewards"], bins=bins, range=(lo, hi or lo + 1), alpha=0.6, label="team", color="tab:blue")
        if r.get("comparator_rewards"):
            ax.hist(
                r["comparator_rewards"],
                bins=bins,
                range=(lo, hi or lo + 1),
                alpha=0.6,
                label="comparator",
                color="tab:orange",
            )
        ax.set_title(f"round {r['round']}", fontsize=8)
        ax.tick_params(labelsize=7)
    for ax in list(axes.flat)[len(rounds) :]:
        ax.axis("off")
    axes.flat[0].legend(fontsize=7)
    fig.suptitle("Candidate team rewards per round", fontsize=10)
    return _save(fig, out)


def _read_json(path: Path) -> Any:
    return json.loads(path.read_text()) if path.is_file() else None


def _read_samples(run_dir: Path) -> list[tuple[str, list[dict]]]:
    """(tag, samples) of the final evaluation, else the latest evaluation during training, else 'before'."""
    folder = run_dir / SAMPLES_DIR
    if not folder.is_dir():
        return []
    files = {p.stem: p for p in folder.glob("*.jsonl")}
    during = sorted(k for k in files if k.startswith("eval-step"))
    order = [k for k in ("eval-after",) if k in files] or during[-1:] or [k for k in ("eval-before",) if k in files]
    out = []
    for tag in order:
        out.append((tag, [json.loads(line) for line in files[tag].read_text().splitlines() if line.strip()]))
    return out


def write_report(run_dir: str | os.PathLike, num_samples: int = 3) -> dict[str, Any]:
    """Write the plots and ``report.md`` into ``run_dir``; returns their paths."""
    import yaml

    run_dir = Path(run_dir)
    rows = [r for r in read_metrics(run_dir) if "step" in r]
    if not rows:
        raise ComlrlError(f"{run_dir}: no metrics.jsonl with logged steps; is this a comlrl run directory?")
    out = run_dir / "report"
    out.mkdir(exist_ok=True)
    before, after = _read_json(run_dir / "eval_before.json"), _read_json(run_dir / "eval_after.json")
    plots = [
        plot_reward(rows, out / "reward.png", before, after),
        plot_lines(
            rows,
            _keys(rows, "reward/level/"),
            path=out / "levels.png",
            title="Reward levels (smoothed)",
            ylabel="level score",
            smoothed=True,
        ),
        plot_lines(
            rows,
            _keys(rows, "agent/", "/completion/mean_length"),
            path=out / "length.png",
            title="Completion length",
            ylabel="tokens",
        ),
        plot_loss(rows, out / "loss.png"),
        plot_rounds(run_dir / "pairs" / "rounds.jsonl", out / "rounds.png"),
    ]
    plots = [p for p in plots if p is not None]
    config = yaml.safe_load((run_dir / "config.yaml").read_text()) if (run_dir / "config.yaml").is_file() else {}
    run_info = read_run_info(run_dir)
    info = (_read_json(run_dir / "run.json") or {}).get("starts") or [run_info]
    if not config:  # a Python-API run: the tracker's config, a run config or the trainer's flat arguments
        given = run_info.get("config") or {}
        config = given if "training" in given else {"training": given}
    text = _markdown(
        run_dir,
        rows,
        config=config,
        starts=info,
        before=before,
        after=after,
        plots=plots,
        samples=_read_samples(run_dir),
        num_samples=num_samples,
        algorithm=_algorithm(config, run_info),
    )
    md = run_dir / "report.md"
    md.write_text(text)
    return {"markdown": md, "plots": plots}


def _algorithm(config: dict, run_info: dict) -> str:
    """The run config's ``algorithm``; else the registered name of the trainer class in ``run_info.json``."""
    if config.get("algorithm"):
        return str(config["algorithm"])
    trainer = run_info.get("trainer")
    if not trainer:
        return "?"
    from .runconfig import ALGORITHMS

    names = [a.name for a in ALGORITHMS.values() if a.trainer.rpartition(":")[2] == trainer]
    return f"{names[0]} ({trainer})" if len(names) == 1 else str(trainer)


def _team(config: dict, rows: list[dict]) -> str:
    if config.get("agents"):
        return str(config["agents"])
    if config.get("model"):
        return f"{config['model']} x {config.get('num_agents') or 2}"
    # else: the agents the metrics name
    n = (
        config.get("num_agents")
        or (config.get("training") or {}).get("num_agents")
        or len({k.split("/")[1] for k in _keys(rows, "agent/")})
    )
    return f"{n} agents" if n else "?"


def contribution_table(metrics: dict) -> list[str]:
    """Markdown lines of each agent's contribution (``eval/contribution/agent_<i>/<kind>``, with its ``_low`` /
    ``_high`` interval) in ``metrics``; none when the evaluation did not measure them."""
    prefix = "eval/contribution/"
    agents = sorted(
        {k[len(prefix) :].split("/")[0] for k in metrics if k.startswith(prefix)}, key=lambda a: int(a.split("_")[-1])
    )
    if not agents:
        return []

    def cell(key: str) -> str:
        if key not in metrics:
            return "-"
        low, high = metrics.get(f"{key}_low"), metrics.get(f"{key}_high")
        interval = f" [{low:.3f}, {high:.3f}]" if low is not None and high is not None else ""
        return f"{metrics[key]:.3f}{interval}"

    lines = [
        "## Who did what",
        "",
        "Each agent's contribution: the drop in held-out team reward when its answer is replaced by the untrained "
        "model's answer or by an empty one (mean over rows, 95% bootstrap interval).",
        "",
        "| agent | replaced by untrained | replaced by empty |",
        "|---|---|---|",
    ]
    for agent in agents:
        lines.append(f"| {agent} | {cell(prefix + agent + '/untrained')} | {cell(prefix + agent + '/empty')} |")
    return lines + [""]


def comparison_section(run_dir: Path) -> list[str]:
    """Markdown lines of the run's comparison (``compare/summary.json``, written with ``evaluation.compare``): the
    trained team, the untrained team and the baselines with their intervals; none when the run has no comparison."""
    from .compare_output import markdown_table
    from .run_comparison import FOLDER

    data = _read_json(run_dir / FOLDER / "summary.json")
    if not data:
        return []
    s = data["settings"]
    pct = f"{s['level'] * 100:g}%"
    return [
        "## Comparison",
        "",
        f"The trained team against the untrained team and the baselines on the {s['rows']} held-out rows "
        f"({s['decoding']}, {s['samples']} answer(s) per row): the team reward's mean with its {pct} bootstrap "
        f"interval over rows, and the paired difference to {data['control']} with its interval. Details: "
        f"[{FOLDER}/results.md]({FOLDER}/results.md).",
        "",
        markdown_table(data["conditions"], data["control"], s["level"]),
        "",
        f"![comparison]({FOLDER}/compare.png)",
        "",
    ]


def _fmt(v: Any) -> str:
    return f"{v:.4g}" if isinstance(v, float) else str(v)


def _markdown(
    run_dir: Path,
    rows: list[dict],
    *,
    config: dict,
    starts: list[dict],
    before: dict | None,
    after: dict | None,
    plots: list[Path],
    samples: list[tuple[str, list[dict]]],
    num_samples: int,
    algorithm: str,
) -> str:
    training = config.get("training") or {}
    first = starts[0] if starts else {}
    env = (config.get("env") or {}).get("name")  # a Python-API run names no environment
    lines = [f"# Run report: {run_dir.name}", ""]
    lines += [
        f"- algorithm: **{algorithm}**, "
        + (f"environment: **{env}**, " if env else "")
        + f"team: {_team(config, rows)}",
        f"- steps: {rows[-1]['step']}, seed: {training.get('seed', first.get('seed'))}, "
        f"git: {(first.get('git') or {}).get('commit')}{' (dirty)' if (first.get('git') or {}).get('dirty') else ''}, "
        f"started: {first.get('started', '?')}" + (f", resumed {len(starts) - 1}x" if len(starts) > 1 else ""),
        "- settings: "
        + ", ".join(
            f"{k}={_fmt(training[k])}"
            for k in (
                "learning_rate",
                "per_device_train_batch_size",
                "num_generations",
                "max_new_tokens",
                "temperature",
                "max_steps",
                "beta",
                "joint_mode",
                "advantage_mode",
            )
            if k in training
        ),
        "",
    ]
    rewards = [r["reward/mean"] for r in rows if "reward/mean" in r]
    if rewards:
        k = max(1, len(rewards) // 10)
        lines += [
            "## Reward",
            "",
            f"Training-batch team reward: first {k} step(s) {sum(rewards[:k]) / k:.3f}, last {k} step(s) "
            f"{sum(rewards[-k:]) / k:.3f}, max {max(rewards):.3f}.",
            "",
        ]
    if before or after:
        keys = sorted(k for k in (after or before) if k == "eval/reward/mean" or k.startswith("eval/reward/level/"))
        lines += ["| held-out evaluation | before | after |", "|---|---|---|"]
        for key in keys:
            cells = [f"{d[key]:.3f}" if d and key in d else "-" for d in (before, after)]
            lines.append(f"| {key.removeprefix('eval/')} | {cells[0]} | {cells[1]} |")
        lines.append("")
    lines += comparison_section(run_dir)
    lines += contribution_table(after or before or {})
    lines += ["## Plots", ""] + [f"![{p.stem}](report/{p.name})" for p in plots] + [""]
    for tag, items in samples:
        lines += [f"## Sample completions ({tag})", ""]
        for s in items[:num_samples]:
            lines.append(f"**row {s.get('row')}**, team reward {s.get('reward', float('nan')):.3f}")
            lines.append("")
            prompts = s.get("prompts") or []
            if prompts:
                lines += [
                    "<details><summary>prompt (agent 0)</summary>",
                    "",
                    "```text",
                    str(prompts[0])[:1500],
                    "```",
                    "",
                    "</details>",
                    "",
                ]
            for i, text in enumerate(s.get("completions", [])):
                lines += [f"agent {i}:", "", "```text", str(text)[:1500], "```", ""]
    return "\n".join(lines)
