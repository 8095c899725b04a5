"""What ``comlrl compare`` returns (:class:`Comparison`, over :class:`Condition` s) and its outputs: the summary as a
markdown table, results.md, results.csv, compare.png (bars with interval whiskers), samples.jsonl (every answer) and
summary.json (:meth:`Comparison.write`)."""

from __future__ import annotations

import csv
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .algorithms.bootstrap import LEVEL
from .plots import DPI, FIGSIZE, pyplot

if TYPE_CHECKING:
    from .crossplay import AgentSource


@dataclass(frozen=True, kw_only=True)
class Condition:
    """One condition of a comparison (the syntax :func:`comlrl.compare.parse_condition` reads is in
    :mod:`comlrl.compare`)."""

    name: str
    kind: str
    target: str
    step: int | None = None
    mode: str | None = None
    agents: tuple[AgentSource, ...] = ()  # a mix's source of each agent

    @property
    def models(self) -> tuple[str, int | None]:
        """What the condition loads: (run directory or config, checkpoint step); conditions sharing it share models."""
        if self.kind == "mix":
            return "mix:" + ",".join(a.key for a in self.agents), None
        return str(Path(self.target).resolve()), self.step


@dataclass(kw_only=True)
class Comparison:
    """What :func:`comlrl.compare.compare` returns: the settings, the rows, every sample's result and each condition's summary."""

    conditions: list[Condition]
    control: str  # the condition the others are compared to
    rows: list[dict[str, Any]]  # {"row": id, "key": a hash of the row's content}
    records: list[dict[str, Any]]  # one per condition, row and sample
    summary: dict[str, dict[str, Any]]  # per condition name
    settings: dict[str, Any]
    descriptions: dict[str, str] = field(default_factory=dict)

    def table(self) -> str:
        """The summary as a markdown table."""
        return markdown_table(self.summary, self.control, self.settings.get("level", LEVEL))

    def write(self, out: str | Path) -> dict[str, Path]:
        """results.md, results.csv, compare.png, samples.jsonl and summary.json in ``out``."""
        return write_outputs(self, Path(out))


def _columns(summary: dict[str, dict]) -> tuple[list[str], list[str], list[str]]:
    """The level, task and extra columns any condition has, in first-seen order."""
    levels, task, extra = ({}, {}, {})
    for s in summary.values():
        levels.update(dict.fromkeys(s["levels"]))
        task.update(dict.fromkeys(s["task"]))
        extra.update(dict.fromkeys(s["extra"]))
    return list(levels), list(task), list(extra)


def _num(v: Any) -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "-"
    return f"{v:.1f}" if abs(v) >= 100 else f"{v:.3f}"


def _ci(i: dict) -> str:
    return f"{_num(i['mean'])} [{_num(i['low'])}, {_num(i['high'])}]"


def markdown_table(summary: dict[str, dict], control: str, level: float = LEVEL) -> str:
    """One row per condition: team reward [CI], the difference to the control [CI], levels, task metric, tokens and
    seconds per joint answer, and any evaluate() contribution metrics."""
    levels, task, extra = _columns(summary)
    pct = f"{level * 100:g}%"
    header = [
        "condition",
        f"team reward [{pct} CI]",
        f"vs {control} [{pct} CI]",
        *levels,
        *task,
        "tokens / answer",
        "s / answer",
        *(k.removeprefix("eval/") for k in extra),
    ]
    lines = ["| " + " | ".join(header) + " |", "|---|" + "|".join("---:" for _ in header[1:]) + "|"]
    for name, s in summary.items():
        cells = [
            name,
            _ci(s["reward"]),
            "(control)" if name == control else _ci(s["difference"]),
            *(_num(s["levels"].get(k)) for k in levels),
            *(_num(s["task"].get(k)) for k in task),
            _num(s["tokens_per_answer"]),
            _num(s["seconds_per_answer"]),
            *(_num(s["extra"].get(k)) for k in extra),
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def write_outputs(result: Comparison, out: Path) -> dict[str, Path]:
    """results.md, results.csv, compare.png, samples.jsonl (every answer) and summary.json in ``out``."""
    out.mkdir(parents=True, exist_ok=True)
    paths = {
        "markdown": out / "results.md",
        "csv": out / "results.csv",
        "plot": out / "compare.png",
        "samples": out / "samples.jsonl",
        "summary": out / "summary.json",
    }
    s = result.settings
    lines = [
        "# Comparison",
        "",
        f"{s['rows']} held-out rows of {s['env']} (from {s['scoring_config']}), {s['samples']} answer(s) per row, "
        f"{s['decoding']}, seed {s['seed']}. Intervals: {s['level'] * 100:g}% percentile bootstrap over rows "
        f"({s['num_resamples']} resamples); differences are paired over rows, against {result.control}.",
        "",
        result.table(),
        "",
        "Conditions:",
        "",
        *(f"* {name}: {text}" for name, text in result.descriptions.items()),
        "",
        "![comparison](compare.png)",
        "",
    ]
    paths["markdown"].write_text("\n".join(lines))
    _write_csv(result, paths["csv"])
    plot(result.summary, result.control, paths["plot"])
    with paths["samples"].open("w") as fh:
        for r in result.records:
            fh.write(json.dumps(r, default=str) + "\n")
    paths["summary"].write_text(
        json.dumps({"settings": s, "control": result.control, "conditions": result.summary}, indent=2, default=str)
    )
    return paths


def _write_csv(result: Comparison, path: Path) -> None:
    levels, task, extra = _columns(result.summary)
    header = [
        "condition",
        "kind",
        "reward_mean",
        "reward_low",
        "reward_high",
        "difference_mean",
        "difference_low",
        "difference_high",
        *levels,
        *task,
        "tokens_per_answer",
        "seconds_per_answer",
        *extra,
    ]
    with path.open("w", newline="") as fh:
        writer = csv.writer(fh)
        writer.writerow(header)
        for name, s in result.summary.items():
            writer.writerow(
                [
                    name,
                    s.get("kind", ""),
                    *(s["reward"][k] for k in ("mean", "low", "high")),
                    *(s["difference"][k] for k in ("mean", "low", "high")),
                    *(s["levels"].get(k, "") for k in levels),
                    *(s["task"].get(k, "") for k in task),
                    s["tokens_per_answer"],
                    s["seconds_per_answer"],
                    *(s["extra"].get(k, "") for k in extra),
                ]
            )


def plot(summary: dict[str, dict], control: str, path: Path) -> Path:
    """Bars of each condition's team reward and of its difference to the control, with interval whiskers."""
    plt = pyplot()
    names = list(summary)
    fig, axes = plt.subplots(1, 2, figsize=(max(FIGSIZE[0], 1.2 * len(names) + 3), FIGSIZE[1]), dpi=DPI)
    for ax, (key, title) in zip(axes, (("reward", "team reward"), ("difference", f"difference to {control}"))):
        means = [summary[n][key]["mean"] for n in names]
        errs = [
            [max(m - summary[n][key]["low"], 0.0) for n, m in zip(names, means)],
            [max(summary[n][key]["high"] - m, 0.0) for n, m in zip(names, means)],
        ]
        colors = ["tab:gray" if n == control else "tab:blue" for n in names]
        ax.bar(range(len(names)), means, yerr=errs, capsize=4, color=colors)
        ax.set_xticks(range(len(names)), names, rotation=30, ha="right")
        ax.set_title(title)
        if key == "difference":
            ax.axhline(0.0, color="black", linewidth=0.8)
        ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=DPI)
    plt.close(fig)
    return path
