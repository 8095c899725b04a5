"""The method paper's comparison (arXiv 2508.04652) in one command: a MAGRPO LoRA team against the untrained team,
the env's four baselines and the equal-budget single agent, on the same held-out rows, with paired intervals.

What it runs (every step through comlrl's own command line and Python API):

* tldr, for each reward (``strict``, the default, and ``published``: ``env.options.reward``) and training seed:
  ``comlrl train configs/tldr_magrpo.yaml`` as a LoRA team (the quick start's LoRA, learning rate, batch, samples
  and temperature) and ``comlrl train configs/tldr_single_grpo.yaml`` (one model writes every part, the same steps,
  rows, samples and twice the team's per-agent new tokens: the same tokens per joint answer), then
  ``comlrl.compare.compare`` on the held-out posts: untrained team (the control), the trained team (with each
  agent's contribution, ``eval_contributions``), the trained single agent, and the baselines single, parallel,
  sequential and discussion with the untrained models. A later seed compares only its trained conditions with the
  untrained team: the baselines' answers do not depend on the training seed.
* cross-play on tldr, the first reward and seed: each trained agent beside an untrained partner, the two trained
  agents swapped (agent 1's model answering agent 0's prompt and back), and with two or more seeds agent 0 of the
  first seed's team beside agent 1 of the second's: conventions that hold only inside one trained team show here.
* a code task (mbpp, pass@k), the first seed only: a LoRA team and its single agent trained the same way, against
  the untrained team and the single and parallel baselines.

Everything is written under ``--out``: ``runs/`` (the training runs), ``compare/`` (one folder per comparison:
results.md, results.csv, compare.png, samples.jsonl, summary.json) and ``summary.md`` (the tables, per-level
breakdowns, contributions, the team against each condition, two sample answers per condition, the command, the git
commit and the machine), ready for docs/results.md. A step whose output is complete is reused when the command is run
again with the same ``--out`` (an interrupted run continues).

    python benchmarks/paper_comparison.py --out results/paper            # the default run (about 90 minutes)
    python benchmarks/paper_comparison.py --out results/paper --dry-run  # only the plan and its estimated time
    python benchmarks/paper_comparison.py --out /tmp/smoke --smoke       # the whole pipeline on a tiny model
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import platform
import shlex
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import yaml

ROOT = Path(__file__).resolve().parent.parent
CONFIGS = ROOT / "configs"
BASELINES = ("single", "parallel", "sequential", "discussion")
CODE_BASELINES = ("single", "parallel")
CONTROL = "untrained"
TEAM, SINGLE_AGENT = "team", "single-grpo"
#: cross-play conditions: (name, sources per agent); TEAM / TEAM2 stand for the first / second seed's team run
CROSSPLAY = (
    ("trained0+untrained1", "TEAM,untrained"),
    ("untrained0+trained1", "untrained,TEAM"),
    ("swapped", "TEAM#1,TEAM#0"),
)
CROSSPLAY_SEEDS = ("seed1-agent0+seed2-agent1", "TEAM,TEAM2")
BUDGET_MINUTES = 90

# Seconds measured on the 2-core CI machine class with the embedded SmolLM2-135M (benchmarks/README.md, "The paper's
# comparison") at 1 torch thread while other jobs kept the load at 3-4: the plan's estimate, pessimistic for a quiet
# machine. Per training step: 2 rows x 4 samples. Per joint answer: one row's answer of every agent (every call of a
# baseline), scored; measured over 32 answers per condition, so it includes the condition's model loading.
COST = {
    "train_start": 8.0,  # a training run's set-up and saving
    "tldr": {"team_step": 19.0, "single_step": 18.0, "untrained": 1.1, "team": 1.9, "single-grpo": 1.0,
             "single": 1.25, "parallel": 1.4, "sequential": 1.9, "discussion": 4.0, "crossplay": 1.5},
    "mbpp": {"team_step": 32.0, "single_step": 35.0, "untrained": 2.0, "team": 3.2, "single-grpo": 2.4,
             "single": 2.4, "parallel": 2.4},
}  # fmt: skip


@dataclass(frozen=True, kw_only=True)
class Sizes:
    """The experiment's size: training steps, held-out rows, samples per row and new tokens, per task."""

    steps: int = 20
    rows: int = 40
    samples: int = 4
    new_tokens: int = 48
    code_steps: int = 4
    code_rows: int = 12
    code_samples: int = 2
    code_new_tokens: int = 96
    temperature: float = 0.7
    seeds: tuple[int, ...] = (1,)
    crossplay_samples: int = 2
    rewards: tuple[str, ...] = ("strict", "published")
    code: bool = True


#: the whole pipeline in well under a minute: a tiny random model (one torch thread), one step, two rows
SMOKE = Sizes(
    steps=1, rows=2, samples=2, new_tokens=8, code_steps=1, code_rows=2, code_samples=2, code_new_tokens=8,
    crossplay_samples=1,
)  # fmt: skip


@dataclass(frozen=True, kw_only=True)
class Train:
    """One ``comlrl train`` run."""

    name: str
    task: str
    role: str  # "team_step" or "single_step"
    config: Path
    sets: tuple[str, ...]
    steps: int


@dataclass(frozen=True, kw_only=True)
class Compare:
    """One ``compare`` call: its conditions (name -> condition) on one task, reward and seed."""

    name: str
    task: str
    title: str
    conditions: tuple[tuple[str, str], ...]
    rows: int
    samples: int
    untrained_from: str  # the training run whose resolved config, untrained, is the control team
    rescore_from: str | None = None  # a comparison whose baselines' answers this one re-scores with its own reward
    rescore: tuple[str, ...] = ()


# --- the plan -----------------------------------------------------------------------------------------------------


def shared_sets(out: Path, *, steps: int, seed: int, eval_rows: int, extra: Sequence[str] = ()) -> list[str]:
    """The ``--set`` overrides of every training run: LoRA, learning rate, batch, samples and temperature of
    configs/quickstart.yaml, no evaluation or report during training (compare evaluates), no checkpoints."""
    return [
        "lora.r=16",
        "lora.lora_alpha=32",
        "lora.lora_dropout=0.0",
        "lora.target_modules=all-linear",
        "training.learning_rate=5.0e-4",
        "training.bf16=null",
        "training.per_device_train_batch_size=2",
        "training.num_generations=4",
        "training.temperature=0.8",
        f"training.max_steps={steps}",
        f"training.seed={seed}",
        "training.eval_steps=0",
        "training.save_steps=0",
        "training.logging_steps=1",
        "data.limit=null",
        f"data.eval_limit={eval_rows}",
        "evaluation.before=false",
        "evaluation.after=false",
        "report=false",
        f"output_dir={out}",
        *extra,
    ]


def build_plan(out: Path, sizes: Sizes, model_sets: Sequence[str] = ()) -> tuple[list[Train], list[Compare]]:
    """The training runs and comparisons ``sizes`` asks for, in the order they run."""
    trains: list[Train] = []
    compares: list[Compare] = []
    runs = out / "runs"

    def pair(task: str, tag: str, *, seed: int, steps: int, rows: int, tokens: int, env_sets: list[str]) -> tuple:
        stem = f"{task}-{tag}" if tag else task
        team, single = f"{stem}-team-s{seed}", f"{stem}-single-s{seed}"
        common = [*model_sets, *env_sets]
        trains.append(
            Train(
                name=team,
                task=task,
                role="team_step",
                config=CONFIGS / f"{task}_magrpo.yaml",
                sets=tuple(
                    shared_sets(
                        runs / team,
                        steps=steps,
                        seed=seed,
                        eval_rows=rows,
                        extra=[f"training.max_new_tokens={tokens}", "training.eval_contributions=true", *common],
                    )
                ),
                steps=steps,
            )
        )
        trains.append(
            Train(
                name=single,
                task=task,
                role="single_step",
                config=CONFIGS / f"{task}_single_grpo.yaml",
                sets=tuple(
                    shared_sets(
                        runs / single,
                        steps=steps,
                        seed=seed,
                        eval_rows=rows,
                        extra=[f"training.max_new_tokens={2 * tokens}", *common],
                    )
                ),
                steps=steps,
            )
        )
        return team, single

    for reward in sizes.rewards:
        for k, seed in enumerate(sizes.seeds):
            team, single = pair(
                "tldr",
                reward,
                seed=seed,
                steps=sizes.steps,
                rows=sizes.rows,
                tokens=sizes.new_tokens,
                env_sets=[f"env.options.reward={reward}"],
            )
            conds = [(TEAM, f"run:{runs / team}"), (SINGLE_AGENT, f"run:{runs / single}")]
            # the baselines' answers depend on neither the training seed nor the reward (the same untrained models,
            # prompts and sampling seed): the first reward's comparison generates them, the others re-score them
            first = reward == sizes.rewards[0]
            if k == 0 and first:
                conds += [(mode, f"baseline:{mode}@UNTRAINED") for mode in BASELINES]
            compares.append(
                Compare(
                    name=f"tldr-{reward}-s{seed}",
                    task="tldr",
                    title=f"tldr, {reward} reward, training seed {seed}",
                    conditions=((CONTROL, "untrained:UNTRAINED"), *conds),
                    rows=sizes.rows,
                    samples=sizes.samples,
                    untrained_from=team,
                    rescore_from=None if first or k else f"tldr-{sizes.rewards[0]}-s{seed}",
                    rescore=() if first or k else BASELINES,
                )
            )
    if sizes.crossplay_samples:
        compares.append(crossplay_compare(runs, sizes))
    if sizes.code:
        seed = sizes.seeds[0]
        team, single = pair(
            "mbpp",
            "",
            seed=seed,
            steps=sizes.code_steps,
            rows=sizes.code_rows,
            tokens=sizes.code_new_tokens,
            env_sets=[],
        )
        compares.append(
            Compare(
                name=f"mbpp-s{seed}",
                task="mbpp",
                title=f"mbpp, training seed {seed}",
                conditions=(
                    (CONTROL, "untrained:UNTRAINED"),
                    (TEAM, f"run:{runs / team}"),
                    (SINGLE_AGENT, f"run:{runs / single}"),
                    *((mode, f"baseline:{mode}@UNTRAINED") for mode in CODE_BASELINES),
                ),
                rows=sizes.code_rows,
                samples=sizes.code_samples,
                untrained_from=team,
            )
        )
    return trains, compares


def crossplay_compare(runs: Path, sizes: Sizes) -> Compare:
    """Cross-play on tldr with the first reward's team of the first seed (and the second seed's, when there is one)
    against the untrained team and that team itself."""
    reward, seed = sizes.rewards[0], sizes.seeds[0]
    team = f"tldr-{reward}-team-s{seed}"
    pairs = [*CROSSPLAY, *([CROSSPLAY_SEEDS] if len(sizes.seeds) > 1 else [])]
    second = runs / f"tldr-{reward}-team-s{sizes.seeds[-1]}"
    mixes = [
        (name, "mix:" + sources.replace("TEAM2", str(second)).replace("TEAM", str(runs / team)))
        for name, sources in pairs
    ]
    return Compare(
        name=f"tldr-{reward}-s{seed}-crossplay",
        task="tldr",
        title=f"tldr, {reward} reward, training seed {seed}: cross-play",
        conditions=((CONTROL, "untrained:UNTRAINED"), (TEAM, f"run:{runs / team}"), *mixes),
        rows=sizes.rows,
        samples=sizes.crossplay_samples,
        untrained_from=team,
    )


def estimate(trains: Sequence[Train], compares: Sequence[Compare]) -> dict[str, float]:
    """Estimated seconds of each step of the plan (from :data:`COST`)."""
    est = {t.name: COST["train_start"] + t.steps * COST[t.task][t.role] for t in trains}
    for c in compares:
        cost = COST[c.task]
        est[c.name] = sum(
            c.rows * c.samples * (cost[name] if name in cost else cost["crossplay"]) for name, _ in c.conditions
        )
    return est


def plan_text(trains: Sequence[Train], compares: Sequence[Compare], sizes: Sizes, scale: float = 1.0) -> str:
    """The plan: each training run and comparison with its size and estimated minutes, and the total."""
    est = estimate(trains, compares)
    lines = ["plan:"]
    for t in trains:
        lines.append(
            f"  train   {t.name:<28} {t.steps:>4} steps x 2 rows x 4 samples   ~{est[t.name] * scale / 60:5.1f} min"
        )
    for c in compares:
        what = f"{len(c.conditions)} conditions x {c.rows} rows x {c.samples} samples"
        lines.append(f"  compare {c.name:<28} {what:<36} ~{est[c.name] * scale / 60:5.1f} min")
        lines.append(f"          {', '.join(name for name, _ in c.conditions)}")
        if c.rescore:
            lines.append(f"          + {', '.join(c.rescore)}: the answers of {c.rescore_from}, re-scored")
    total = sum(est.values()) * scale / 60
    lines.append(f"  estimated total: {total:.0f} min (budget {BUDGET_MINUTES} min on 2 CPU cores)")
    if scale == 1.0 and total > BUDGET_MINUTES:
        lines.append(f"  warning: the estimate is over the {BUDGET_MINUTES}-minute budget")
    return "\n".join(lines)


# --- running it ---------------------------------------------------------------------------------------------------


def train(job: Train) -> dict[str, Any]:
    """Run ``comlrl train`` (in this process: the command line's own code path), unless its run is complete."""
    from comlrl.cli import main as comlrl_main

    run_dir = Path(next(s for s in job.sets if s.startswith("output_dir=")).partition("=")[2])
    info_path = run_dir / "paper_comparison.json"
    if (run_dir / "final").is_dir() and info_path.is_file():
        print(f"train {job.name}: complete in {run_dir}, reused")
        return json.loads(info_path.read_text())
    if run_dir.exists():
        raise SystemExit(f"{run_dir} holds an unfinished run: delete it (or pick another --out) and run again.")
    argv = ["train", str(job.config), *(a for s in job.sets for a in ("--set", s))]
    print(f"train {job.name}: comlrl {' '.join(shlex.quote(a) for a in argv)}", flush=True)
    start = time.perf_counter()
    rc = comlrl_main(argv)
    if rc != 0:
        raise SystemExit(f"comlrl train for {job.name} failed (exit status {rc}); its log: {run_dir / 'train.log'}")
    info = {"name": job.name, "seconds": time.perf_counter() - start, "steps": job.steps, **training_curve(run_dir)}
    info_path.write_text(json.dumps(info, indent=2))
    return info


def training_curve(run_dir: Path) -> dict[str, float]:
    """The training reward of the first and last fifth of the steps (each a mean over those steps)."""
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    values = [r["reward/mean"] for r in rows if "reward/mean" in r]
    if not values:
        return {}
    k = max(1, len(values) // 5)
    return {"train_reward_first": sum(values[:k]) / k, "train_reward_last": sum(values[-k:]) / k}


def untrained_config(run_dir: Path, out: Path) -> Path:
    """The run's resolved config with its models untrained and no contributions: the control team and the models
    of the baselines (the same model, prompts, tokens and data as the trained team)."""
    cfg = yaml.safe_load((run_dir / "config.yaml").read_text())
    cfg.setdefault("training", {})["eval_contributions"] = False
    cfg["output_dir"] = str(out / "scratch")
    path = out / "configs" / f"{run_dir.name}-untrained.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(cfg, sort_keys=False))
    return path


def run_compare(job: Compare, out: Path, temperature: float) -> Path:
    """``comlrl.compare.compare`` on the job's conditions, unless its folder is complete; the folder."""
    from comlrl.compare import compare

    folder = out / "compare" / job.name
    if (folder / "summary.json").is_file() and (folder / "samples.jsonl").is_file():
        print(f"compare {job.name}: complete in {folder}, reused")
        return folder
    untrained = untrained_config(out / "runs" / job.untrained_from, out)
    conditions = [f"{name}={spec.replace('UNTRAINED', str(untrained))}" for name, spec in job.conditions]
    print(f"compare {job.name}: {len(conditions)} conditions x {job.rows} rows x {job.samples} samples", flush=True)
    start = time.perf_counter()
    compare(
        conditions,
        rows=job.rows,
        samples=job.samples,
        control=CONTROL,
        temperature=temperature,
        seed=0,
        out=folder,
    )
    if job.rescore:
        rescore(job, folder, out / "compare" / job.rescore_from, untrained)
    (folder / "paper_comparison.json").write_text(json.dumps({"seconds": time.perf_counter() - start}))
    return folder


def _records(folder: Path) -> list[dict]:
    return [json.loads(line) for line in (folder / "samples.jsonl").read_text().splitlines() if line.strip()]


def rescore(job: Compare, folder: Path, source: Path, config: Path) -> None:
    """The baselines' answers of the ``source`` comparison scored by this comparison's env (``config``'s), into
    ``folder/rescored.jsonl``; ``folder/rescored.json`` says whether both comparisons' untrained teams gave the same
    answers (the condition for the re-scored answers to be what this comparison would have generated)."""
    from comlrl import runconfig
    from comlrl.runs import load_data, make_env

    cfg = runconfig.load_config(config)
    env = make_env(cfg)
    _, rows = load_data(cfg, env)
    env = getattr(env, "team", None) or env
    theirs, ours = _records(source), _records(folder)
    key = lambda r: (r["row"], r["sample"])  # noqa: E731
    same = {key(r): r["completions"] for r in theirs if r["condition"] == CONTROL} == {
        key(r): r["completions"] for r in ours if r["condition"] == CONTROL
    }
    picked = [r for r in theirs if r["condition"] in job.rescore]
    batch = [dict(rows[r["row"]]) for r in picked]
    scores = env.reward_func.score(*zip(*(r["completions"] for r in picked)), batch_items=batch)
    with (folder / "rescored.jsonl").open("w") as fh:
        for r, score in zip(picked, scores):
            kept = {k: v for k, v in r.items() if not k.startswith(("level/", "metric/")) and k != "reward"}
            fh.write(json.dumps({**kept, "reward": float(score["reward"]), **_floats(score)}) + "\n")
    (folder / "rescored.json").write_text(json.dumps({"source": source.name, "untrained_answers_identical": same}))


def _floats(score: dict) -> dict[str, float]:
    return {k: float(v) for k, v in score.items() if k != "reward" and isinstance(v, (int, float))}


# --- the summary --------------------------------------------------------------------------------------------------


def machine() -> dict[str, Any]:
    """CPU model, cores, memory and library versions of this machine."""
    import torch
    import transformers

    model = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.partition(":")[2].strip()
                break
    except OSError:
        pass
    memory = None
    try:
        kb = next(line for line in Path("/proc/meminfo").read_text().splitlines() if line.startswith("MemTotal"))
        memory = round(int(kb.split()[1]) / 2**20, 1)
    except (OSError, StopIteration, ValueError):
        pass
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return {
        "cpu": model,
        "cores": cores,
        "memory_gib": memory,
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "python": platform.python_version(),
        "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
    }


def git_commit() -> str:
    """The checkout's commit, marked when the tree has uncommitted changes."""
    try:
        commit = subprocess.run(
            ["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True, text=True, check=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "-C", str(ROOT), "status", "--porcelain", "--untracked-files=no"], capture_output=True, text=True
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown (not a git checkout)"
    return commit + (" (with uncommitted changes)" if dirty else "")


def _num(v: float | None) -> str:
    return "-" if v is None or (isinstance(v, float) and math.isnan(v)) else f"{v:.3f}"


def _ci(i: dict) -> str:
    return f"{_num(i['mean'])} [{_num(i['low'])}, {_num(i['high'])}]"


def _beyond(i: dict) -> str:
    return "yes" if i["low"] > 0 or i["high"] < 0 else "no"


def _short(text: str, n: int = 400) -> str:
    text = " ".join(text.split())
    return text if len(text) <= n else text[: n - 1] + "…"


def comparison_section(job: Compare, folder: Path, out: Path, sample_rows: int = 2) -> str:
    """One comparison's tables (results, per level, the team against each condition, contributions) and samples."""
    from comlrl.algorithms.bootstrap import paired_difference, row_values
    from comlrl.compare import summarize

    data = json.loads((folder / "summary.json").read_text())
    s, summary, ref = data["settings"], data["conditions"], data["control"]
    records = _records(folder)
    note = ""
    if (folder / "rescored.jsonl").is_file():
        extra = [json.loads(line) for line in (folder / "rescored.jsonl").read_text().splitlines() if line.strip()]
        info = json.loads((folder / "rescored.json").read_text())
        source = json.loads((folder.parent / info["source"] / "summary.json").read_text())["conditions"]
        added = list(dict.fromkeys(r["condition"] for r in extra))
        records += extra
        row_ids = sorted({r["row"] for r in records if r["condition"] == ref})
        both = summarize(records, names=[*summary, *added], control=ref, row_ids=row_ids, samples=s["samples"],
                         num_resamples=s["num_resamples"], seed=s["seed"])  # fmt: skip
        for name in added:
            summary[name] = {**both[name], "seconds_per_answer": source[name]["seconds_per_answer"]}
        note = (
            f"The baselines ({', '.join(added)}) are the answers of `{info['source']}` (the same untrained models, "
            "prompts and sampling seed) scored by this comparison's reward; both comparisons' untrained teams gave "
            + ("the same answers." if info["untrained_answers_identical"] else "DIFFERENT answers, so these are not "
               "what this comparison would have generated.")
        )  # fmt: skip
    names = list(summary)
    task = list(dict.fromkeys(k for c in summary.values() for k in c["task"]))
    levels = list(dict.fromkeys(k for c in summary.values() for k in c["levels"]))
    lines = [
        f"### {job.title}",
        "",
        f"{s['rows']} held-out rows x {s['samples']} samples, {s['decoding']}, sampling and bootstrap seed "
        f"{s['seed']}; {s['num_resamples']} bootstrap resamples over rows, {s['level'] * 100:g}% intervals. "
        f"Files: `{folder.relative_to(out)}/` (results.md, results.csv, compare.png, samples.jsonl).",
        "",
        f"| condition | team reward [95% CI] | vs {ref} [95% CI] | "
        + "".join(f"{k} | " for k in task)
        + "tokens / answer | s / answer |",
        "|---|---:|---:|" + "---:|" * len(task) + "---:|---:|",
    ]
    for name in names:
        c = summary[name]
        diff = "(control)" if name == ref else _ci(c["difference"])
        cells = [name, _ci(c["reward"]), diff, *(_num(c["task"].get(k)) for k in task)]
        cells += [f"{c['tokens_per_answer']:.1f}", f"{c['seconds_per_answer']:.2f}"]
        lines.append("| " + " | ".join(cells) + " |")
    lines += ["", f"![{job.name}]({folder.relative_to(out)}/compare.png)", ""]
    if note:
        lines += [note, ""]
    if levels:
        lines += ["Per level (the mean fraction of each level's points earned):", ""]
        lines.append("| condition | " + " | ".join(k.removeprefix("level/") for k in levels) + " |")
        lines.append("|---|" + "---:|" * len(levels))
        for name in names:
            lines.append(f"| {name} | " + " | ".join(_num(summary[name]["levels"].get(k)) for k in levels) + " |")
        lines.append("")
    by: dict[str, dict[int, list[float]]] = {name: {} for name in names}
    for r in records:
        by[r["condition"]].setdefault(r["row"], []).append(r["reward"])
    rows = sorted(by[names[0]])
    values = {name: row_values([by[name][i] for i in rows]) for name in names}
    if TEAM in names:
        lines += [f"The trained team against each condition (paired over the {len(rows)} rows):", ""]
        lines += ["| condition | team - condition [95% CI] | interval excludes 0 |", "|---|---:|:---:|"]
        for name in names:
            if name == TEAM:
                continue
            d = paired_difference(values[TEAM], values[name], num_resamples=s["num_resamples"], seed=s["seed"])
            lines.append(f"| {name} | {_ci(d.as_dict())} | {_beyond(d.as_dict())} |")
        lines.append("")
    for name in names:
        extra = summary[name]["extra"]
        keys = sorted({k.removeprefix("eval/contribution/").rsplit("/", 1)[0] for k in extra if "contribution/" in k})
        if not keys:
            continue
        lines += [
            f"Contributions of the {name} condition's agents (team reward minus the team reward with the agent's "
            "answer replaced; 95% CI over rows):",
            "",
            "| agent | replaced by the untrained model's answer | replaced by an empty answer |",
            "|---|---:|---:|",
        ]
        for agent in keys:
            cells = []
            for kind in ("untrained", "empty"):
                key = f"eval/contribution/{agent}/{kind}"
                cells.append(
                    _ci({"mean": extra.get(key), "low": extra.get(f"{key}_low"), "high": extra.get(f"{key}_high")})
                    if key in extra
                    else "-"
                )
            lines.append(f"| {agent} | {cells[0]} | {cells[1]} |")
        lines.append("")
    lines += [f"Sample answers (rows {', '.join(str(i) for i in rows[:sample_rows])}, first sample):", ""]
    for name in names:
        for i in rows[:sample_rows]:
            rec = next(r for r in records if r["condition"] == name and r["row"] == i and r["sample"] == 0)
            lines.append(f"* **{name}**, row {i}, team reward {rec['reward']:.3f}:")
            for a, text in enumerate(rec["completions"]):
                lines.append(f"    * agent {a}: `{_short(text).replace('`', chr(39))}`")
    lines.append("")
    return "\n".join(lines)


def write_summary(
    out: Path,
    *,
    sizes: Sizes,
    trains: Sequence[Train],
    compares: Sequence[Compare],
    train_info: dict[str, dict],
    timing: dict[str, Any],
    argv: Sequence[str],
    smoke: bool,
) -> Path:
    """summary.md: the command, commit, machine, settings, training runs and every comparison's section."""
    m = machine()
    est = estimate(trains, compares)
    command = "python benchmarks/paper_comparison.py " + " ".join(shlex.quote(a) for a in argv)
    lines = [
        "# The paper's comparison: results",
        "",
        f"* command: `{command}`",
        f"* commit: {git_commit()}",
        f"* machine: {m['cpu']}, {m['cores']} cores, {m['memory_gib']} GiB memory, "
        f"{'GPU ' + m['gpu'] if m['gpu'] else 'no GPU'}; torch {m['torch']} ({timing['threads']} threads), "
        f"transformers {m['transformers']}, Python {m['python']}",
        f"* started {timing['started']}, took {timing['seconds'] / 60:.1f} min (estimated "
        f"{sum(est.values()) / 60:.0f}); load average (1, 5, 15 min) {timing['load_start']} at the start, "
        f"{timing['load_end']} at the end: this run alone keeps about {timing['threads']} busy, more means other jobs "
        "shared the cores and the times are inflated",
        f"* model: {'a tiny random Llama (--smoke: the pipeline, not a result)' if smoke else 'the embedded SmolLM2-135M-Instruct'}",
        "",
        "## Settings",
        "",
        f"Training (every run): LoRA r=16 (alpha 32, all linear layers), learning rate 5e-4, 2 rows x 4 samples per "
        f"step, temperature 0.8, training seeds {', '.join(map(str, sizes.seeds))}. tldr: {sizes.steps} steps, "
        f"{sizes.new_tokens} new tokens per agent (the single agent {2 * sizes.new_tokens}), rewards "
        f"{', '.join(sizes.rewards)}, trained and scored on the same reward; evaluation: the last {sizes.rows} posts "
        f"(held out of training), {sizes.samples} samples per post."
        + (
            f" mbpp: {sizes.code_steps} steps, {sizes.code_new_tokens} new tokens per agent (the single agent "
            f"{2 * sizes.code_new_tokens}); evaluation: the first {sizes.code_rows} test tasks, {sizes.code_samples} "
            "samples per task."
            if sizes.code
            else ""
        ),
        f"Evaluation: plain sampling at temperature {sizes.temperature:g} for every condition. The conditions: "
        f"`{CONTROL}` (the team's models before training, the control), `{TEAM}` (the MAGRPO LoRA team), "
        f"`{SINGLE_AGENT}` (one model trained with GRPO on the same reward, writing every part: the equal-budget "
        "control) and the baselines with the untrained model (`single`: one model writes the whole answer; "
        "`parallel`: the agents answer independently; `sequential`: each sees the earlier agents' answers; "
        "`discussion`: one round of revision after seeing the others' first answers).",
        "",
        "## Training runs",
        "",
        "| run | steps | minutes | training reward, first fifth of the steps | last fifth |",
        "|---|---:|---:|---:|---:|",
    ]
    for t in trains:
        info = train_info[t.name]
        first, last = info.get("train_reward_first"), info.get("train_reward_last")
        lines.append(f"| {t.name} | {t.steps} | {info['seconds'] / 60:.1f} | {_num(first)} | {_num(last)} |")
    lines += ["", "## Comparisons", ""]
    for job in compares:
        lines.append(comparison_section(job, out / "compare" / job.name, out))
    path = out / "summary.md"
    path.write_text("\n".join(lines))
    return path


# --- the smoke model and the command ------------------------------------------------------------------------------


def tiny_model_dir(out: Path) -> Path:
    """A tiny random Llama with the embedded model's tokenizer, saved under ``out`` (offline, built from a config)."""
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    from comlrl.engine.models import embedded_model_dir

    path = out / "tiny-model"
    if (path / "config.json").is_file():
        return path
    tokenizer = AutoTokenizer.from_pretrained(embedded_model_dir())
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=4096,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        tie_word_embeddings=True,
    )
    LlamaForCausalLM(config).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    d = Sizes()
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", required=True, type=Path, help="The folder everything is written to.")
    p.add_argument("--steps", type=int, default=d.steps, help=f"tldr training steps (default {d.steps}).")
    p.add_argument("--rows", type=int, default=d.rows, help=f"tldr held-out posts (default {d.rows}).")
    p.add_argument("--samples", type=int, default=d.samples, help=f"Samples per post (default {d.samples}).")
    p.add_argument("--new-tokens", type=int, default=d.new_tokens, help="tldr new tokens per agent.")
    p.add_argument("--code-steps", type=int, default=d.code_steps, help="mbpp training steps.")
    p.add_argument("--code-rows", type=int, default=d.code_rows, help="mbpp test tasks evaluated.")
    p.add_argument("--code-samples", type=int, default=d.code_samples, help="Samples per mbpp task (pass@k).")
    p.add_argument("--code-new-tokens", type=int, default=d.code_new_tokens, help="mbpp new tokens per agent.")
    p.add_argument("--no-code", action="store_true", help="Leave out the code task.")
    p.add_argument(
        "--crossplay-samples",
        type=int,
        default=d.crossplay_samples,
        help=f"Samples per post of the cross-play comparison (default {d.crossplay_samples}; 0 leaves it out).",
    )
    p.add_argument(
        "--rewards",
        nargs="+",
        choices=["strict", "published"],
        help="tldr rewards, each trained on and scored by (default: both).",
    )
    p.add_argument("--seeds", nargs="+", type=int, default=list(d.seeds), help="Training seeds, each reported apart.")
    p.add_argument("--temperature", type=float, default=d.temperature, help="Evaluation sampling temperature.")
    p.add_argument(
        "--threads",
        type=int,
        help="torch threads (default: torch's, one per core; --smoke: 1). On cores other jobs share, 1 avoids the stalls of "
        "threads waiting for each other (about 10x slower generation at 2 threads on 2 busy cores).",
    )
    p.add_argument("--dry-run", action="store_true", help="Print the plan and its estimated time, run nothing.")
    p.add_argument("--smoke", action="store_true", help="The whole pipeline on a tiny random model, tiny sizes.")
    return p.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    ns = parse_args(argv)
    if ns.smoke:
        sizes = dataclasses.replace(
            SMOKE, seeds=tuple(ns.seeds), code=not ns.no_code, crossplay_samples=min(ns.crossplay_samples, 1)
        )
    else:
        sizes = Sizes(
            steps=ns.steps,
            rows=ns.rows,
            samples=ns.samples,
            new_tokens=ns.new_tokens,
            code_steps=ns.code_steps,
            code_rows=ns.code_rows,
            code_samples=ns.code_samples,
            code_new_tokens=ns.code_new_tokens,
            temperature=ns.temperature,
            seeds=tuple(ns.seeds),
            crossplay_samples=ns.crossplay_samples,
            code=not ns.no_code,
        )
    if ns.rewards:
        sizes = dataclasses.replace(sizes, rewards=tuple(dict.fromkeys(ns.rewards)))
    out = ns.out.resolve()
    model_sets = [f"model={out / 'tiny-model'}"] if ns.smoke else []
    trains, compares = build_plan(out, sizes, model_sets)
    print(plan_text(trains, compares, sizes))
    if ns.smoke:
        print("  (--smoke: a tiny random model; the estimate is for the embedded model)")
    else:
        print("  the estimate comes from a machine whose cores other jobs shared; a quiet machine is faster")
    if ns.dry_run:
        return 0
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    import torch

    threads = torch.get_num_threads()
    ns.threads = ns.threads or (1 if ns.smoke else None)
    if ns.threads:
        torch.set_num_threads(ns.threads)
    out.mkdir(parents=True, exist_ok=True)
    if ns.smoke:
        tiny_model_dir(out)
    started, load_start, start = time.strftime("%Y-%m-%d %H:%M:%S"), _load(), time.perf_counter()
    try:
        train_info = {t.name: train(t) for t in trains}
        for job in compares:
            run_compare(job, out, sizes.temperature)
    finally:
        torch.set_num_threads(threads)  # a caller in the same process (a test) keeps its own
    timing = {
        "started": started,
        "seconds": time.perf_counter() - start,
        "load_start": load_start,
        "load_end": _load(),
        "threads": ns.threads or threads,
    }
    path = write_summary(
        out,
        sizes=sizes,
        trains=trains,
        compares=compares,
        train_info=train_info,
        timing=timing,
        argv=argv,
        smoke=ns.smoke,
    )
    print(f"summary: {path} ({timing['seconds'] / 60:.1f} min)")
    return 0


def _load() -> str:
    try:
        return ", ".join(f"{v:.1f}" for v in os.getloadavg())
    except OSError:
        return "unknown"


if __name__ == "__main__":
    sys.exit(main())
