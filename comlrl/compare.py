"""``comlrl compare``: several conditions evaluated on the same held-out rows, with intervals.

A condition is a trained team (a run directory, or one of its checkpoints), the untrained team of a config, or one of
the env's baselines (:mod:`comlrl.envs.core.baselines`) with a config's or a run's models. Every condition answers
the same rows (the first ``rows`` evaluation rows of the scoring config: ``config``, default the first condition's),
with the same decoding (greedy, or plain sampling at one temperature: no top-p, top-k or repetition penalty) and the
same number of samples per row, and every answer is scored by the scoring config's env. A condition keeps its own
prompts and ``max_new_tokens`` (a single agent writing every part may be given more tokens than each agent of a team).

The summary per condition: the team reward's mean with a 95% percentile bootstrap interval over rows, the paired
difference to the control (the condition the others are compared to) with its interval
(:mod:`comlrl.algorithms.bootstrap`), each reward level's mean, the env's task metric (pass@1 and pass@k where the env
reports ``metric/pass``, accuracy where it reports one), tokens and seconds per joint answer, and the
``eval/contribution/...`` metrics of evaluate() when it reports them.

Condition syntax (``[NAME=]KIND:TARGET``)::

    run:DIR            the run's final models (DIR@STEP: its checkpoint-STEP); a run with num_agents=1 is a trained
                       single agent: its answers are split into the roles by the env's split_single
    untrained:CONFIG   the config's models, untrained
    baseline:MODE@TARGET   baseline MODE (single, parallel, sequential, discussion, centralized) with the models of
                       TARGET (a config, untrained, or a run directory, trained)
    mix:SOURCE,...     cross-play: one source per agent, in agent order (:mod:`comlrl.crossplay`): run:DIR or DIR
                       (agent i of the run), untrained (agent i's model of the scoring config), untrained:CONFIG;
                       SOURCE#J takes agent J of the source as agent i (mix:DIR#1,DIR#0 swaps a team's two agents)
    DIR | CONFIG       a bare run directory is run:DIR, a bare file untrained:CONFIG
    NAME=...           the condition's label (default: the run directory's name, 'untrained', the mode, or the
                       mix's sources joined by '+')
"""

from __future__ import annotations

import gc
import hashlib
import json
import logging
import math
import re
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator, Sequence

from .algorithms.bootstrap import LEVEL, NUM_RESAMPLES, bootstrap_mean, paired_difference, row_values
from .compare_output import Comparison, Condition
from .errors import ComlrlError
from .runs import strip_step

log = logging.getLogger(__name__)

KINDS = ("run", "untrained", "baseline", "mix")
#: score keys that are the env's task metric: metric/pass gives pass@1 (and pass@k with k samples), the others accuracy
TASK_METRICS = {"metric/pass": "pass", "metric/accuracy": "accuracy", "metric/bfcl_accuracy": "accuracy"}
CONTRIBUTION_PREFIX = "eval/contribution/"


def parse_condition(text: str) -> Condition:
    """A :class:`Condition` from ``[NAME=]KIND:TARGET`` (or a bare run directory / config path)."""
    from .runs import BASELINES

    spec, name = text.strip(), None
    labelled = re.match(r"^([^=:/\\]+)=(.+)$", spec)
    if labelled:
        name, spec = labelled.group(1).strip(), labelled.group(2).strip()
    kind, sep, rest = spec.partition(":")
    if not sep or kind not in KINDS:
        kind, rest = ("run" if Path(strip_step(spec)[0]).is_dir() else "untrained"), spec
    if not rest and kind != "mix":
        raise ComlrlError(f"condition {text!r}: {kind}: needs a target, e.g. {kind}:{_EXAMPLES[kind]}.")
    if kind == "baseline":
        mode, at, target = rest.partition("@")
        if not at or mode not in BASELINES or not target:
            raise ComlrlError(
                f"condition {text!r}: a baseline is baseline:MODE@TARGET with MODE one of {', '.join(BASELINES)} "
                "and TARGET a config or a run directory (e.g. baseline:single@configs/tldr_magrpo.yaml)."
            )
        return Condition(name=name or mode, kind=kind, target=target, mode=mode)
    if kind == "mix":
        from .crossplay import mix_target, parse_agents

        agents = parse_agents(rest, text)
        return Condition(
            name=name or "+".join(a.label() for a in agents), kind=kind, target=mix_target(agents), agents=agents
        )
    if kind == "run":
        target, step = strip_step(rest)
        if not Path(target).is_dir():
            raise ComlrlError(f"condition {text!r}: {target} is not a run directory (written by comlrl train).")
        return Condition(
            name=name or (Path(target).name + (f"@{step}" if step is not None else "")),
            kind=kind,
            target=target,
            step=step,
        )
    if not Path(rest).is_file():
        raise ComlrlError(f"condition {text!r}: {rest} is not a file; untrained:CONFIG takes a YAML run config.")
    return Condition(name=name or "untrained", kind=kind, target=rest)


_EXAMPLES = {"run": "runs/quickstart-...", "untrained": "configs/quickstart.yaml", "baseline": "single@CONFIG.yaml"}


# --- scoring ------------------------------------------------------------------------------------------------------


class SingleAnswerReward:
    """The team reward of one model's whole answers: each answer is split into the roles by ``env.split_single`` and
    scored by ``env.reward_func``. How a trained single agent (a run with num_agents=1: one model writes every part)
    is scored beside the teams; an env whose single-agent answers need another split overrides ``split_single``."""

    batched = True

    def __init__(self, env: Any) -> None:
        self.env = env
        self.__name__ = f"{env.name}_single_answer_reward"

    def score(self, *agent_completions: Sequence[str], batch_items: Sequence[dict] | None = None, **_: Any) -> list:
        if len(agent_completions) != 1:
            raise ComlrlError(f"a single agent's reward takes one list of answers, got {len(agent_completions)}.")
        answers = list(agent_completions[0])
        rows = list(batch_items) if batch_items is not None else [{}] * len(answers)
        parts = [self.env.split_single(a, r) for a, r in zip(answers, rows)]
        per_agent = [[p[i] for p in parts] for i in range(self.env.num_agents)]
        return self.env.reward_func.score(*per_agent, batch_items=rows)

    def __call__(self, *agent_completions: Sequence[str], batch_items: Sequence[dict] | None = None, **_: Any) -> list:
        return [d["reward"] for d in self.score(*agent_completions, batch_items=batch_items)]


def scoring_reward(trainer: Any, env: Any, name: str) -> Any:
    """The reward that scores ``trainer``'s answers with ``env``'s team reward: as is for a team of the env's size,
    role-split for a centralized trainer, split by ``env.split_single`` for a single agent."""
    from .trainers.centralized import RoleSplitReward

    current = getattr(trainer, "eval_reward_func", None)
    if isinstance(current, RoleSplitReward):
        return RoleSplitReward(env.reward_func, current.formatters)
    if trainer.num_agents == env.num_agents:
        return env.reward_func
    if trainer.num_agents == 1:
        return SingleAnswerReward(env)
    raise ComlrlError(
        f"condition {name!r}: a team of {trainer.num_agents} agents cannot be scored by {env.name} with "
        f"{env.num_agents} agents; compare teams of the scoring config's size, or single agents."
    )


def compare(
    conditions: Sequence[str | Condition],
    *,
    rows: int | None = None,
    samples: int = 1,
    control: str | None = None,
    temperature: float = 0.0,
    seed: int = 0,
    out: str | Path | None = None,
    config: str | Path | None = None,
    overrides: Sequence[str] = (),
    num_resamples: int = NUM_RESAMPLES,
    progress: bool = True,
) -> Comparison:
    """Evaluate ``conditions`` on the same ``rows`` held-out rows, ``samples`` answers per row (greedy when
    ``temperature`` is 0, else sampled at it), each against ``control`` (default: the first condition); write the
    outputs to ``out`` when given. ``config``: the run config (or run directory) whose env scores every answer and
    whose evaluation rows are used (default: the first condition's); ``overrides``: ``--set`` values for every config.
    """
    from tqdm.auto import tqdm

    from .crossplay import open_mix, plan_mix

    conds = [c if isinstance(c, Condition) else parse_condition(c) for c in conditions]
    if not conds:
        raise ComlrlError("compare needs at least one condition.")
    names = [c.name for c in conds]
    for name in names:
        if names.count(name) > 1:
            raise ComlrlError(f"two conditions are named {name!r}; label them NAME=CONDITION (e.g. {name}-b=...).")
    control = control or names[0]
    if control not in names:
        raise ComlrlError(f"control {control!r} is not a condition; the conditions: {', '.join(names)}.")
    if samples < 1:
        raise ComlrlError(f"samples must be >= 1, got {samples}.")
    if temperature < 0:
        raise ComlrlError(f"temperature must be >= 0 (0: greedy), got {temperature}.")
    if samples > 1 and temperature == 0:
        raise ComlrlError(f"{samples} samples per row need sampling: greedy answers repeat (set a temperature > 0).")

    if config is None and not conds[0].target:
        raise ComlrlError(
            f"condition {conds[0].name!r} takes its models from the scoring config: name a config (config= / "
            "--config), or put a condition with a run or a config first."
        )
    env, eval_rows, scoring = _scoring_env(config if config is not None else conds[0].target, overrides)
    mixes = {c.models: plan_mix(c, scoring, env, overrides) for c in conds if c.kind == "mix"}  # checked up front
    n = len(eval_rows) if rows is None else rows
    if not 1 <= n <= len(eval_rows):
        raise ComlrlError(
            f"rows={rows}: {scoring} has {len(eval_rows)} evaluation rows (data.eval_limit); ask for 1 to "
            f"{len(eval_rows)}, or raise it with --set data.eval_limit=N."
        )
    dataset = eval_rows.select(range(n))
    row_info = [{"row": i, "key": row_key(dataset[i])} for i in range(n)]
    settings = {
        "env": env.name,
        "scoring_config": str(scoring),
        "rows": n,
        "samples": samples,
        "decoding": "greedy" if temperature == 0 else f"sampling at temperature {temperature:g}",
        "temperature": temperature,
        "seed": seed,
        "level": LEVEL,
        "num_resamples": num_resamples,
    }
    last_use = {c.models: i for i, c in enumerate(conds)}
    opened: dict[tuple[str, int | None], tuple[Any, Any, dict]] = {}
    records: list[dict] = []
    timing: dict[str, dict[str, Any]] = {}
    descriptions: dict[str, str] = {}
    bar = tqdm(total=len(conds) * n, desc="compare", unit="row", disable=not progress)
    try:
        for i, cond in enumerate(conds):
            bar.set_postfix(condition=cond.name)
            if cond.models not in opened:
                opened[cond.models] = open_mix(mixes[cond.models]) if cond.kind == "mix" else _open(cond, overrides)
            trainer, cond_env, models = opened[cond.models]
            if cond_env.name != env.name:
                raise ComlrlError(
                    f"condition {cond.name!r} is a {cond_env.name} team; the comparison scores {env.name} "
                    f"({scoring}): compare conditions of one env."
                )
            descriptions[cond.name] = _describe(cond, models)
            _set_decoding(trainer, temperature, seed)
            start = time.perf_counter()
            if cond.kind == "baseline":
                rec, extra = _run_baseline(
                    cond, trainer, cond_env=cond_env, env=env, dataset=dataset, samples=samples, seed=seed
                )
                bar.update(n)
            else:
                rec, extra = _run_team(cond, trainer, env=env, dataset=dataset, samples=samples, bar=bar)
            seconds = time.perf_counter() - start
            for r in rec:
                r["key"] = row_info[r["row"]]["key"]
            records += [{"condition": cond.name, **r} for r in rec]
            timing[cond.name] = {"seconds": seconds, "extra": extra}
            if last_use[cond.models] == i:  # free the models as soon as no later condition needs them
                del opened[cond.models], trainer
                gc.collect()
    finally:
        bar.close()
    summary = summarize(
        records,
        names=names,
        control=control,
        row_ids=[r["row"] for r in row_info],
        samples=samples,
        seconds={k: v["seconds"] for k, v in timing.items()},
        extras={k: v["extra"] for k, v in timing.items()},
        num_resamples=num_resamples,
        seed=seed,
    )
    for cond in conds:
        summary[cond.name]["kind"] = cond.kind
        summary[cond.name]["description"] = descriptions[cond.name]
    result = Comparison(
        conditions=conds,
        control=control,
        rows=row_info,
        records=records,
        summary=summary,
        settings=settings,
        descriptions=descriptions,
    )
    if out is not None:
        result.write(out)
    return result


def row_key(row: dict) -> str:
    """A short hash of a row's content: the same key in every condition means the same row."""
    return hashlib.sha256(json.dumps(dict(row), sort_keys=True, default=str).encode()).hexdigest()[:12]


def _scoring_env(target: str | Path, overrides: Sequence[str]) -> tuple[Any, Any, Path]:
    from . import runconfig
    from .runs import load_data, make_env, run_config_file

    path = Path(target)
    cfg_path = run_config_file(path) if path.is_dir() else path
    cfg = runconfig.load_config(cfg_path, list(overrides))
    if not cfg.data.eval_limit:
        raise ComlrlError(
            f"{cfg_path}: compare needs evaluation rows: set data.eval_limit > 0 (e.g. --set data.eval_limit=40)."
        )
    env = make_env(cfg)
    _, rows = load_data(cfg, env)
    # an env's single-agent form (env.format: single) holds its team, whose reward scores every condition
    return getattr(env, "team", None) or env, rows, cfg_path


def _open(cond: Condition, overrides: Sequence[str]) -> tuple[Any, Any, dict]:
    from .runs import open_evaluation

    trainer, env, _, models = open_evaluation(cond.target, cond.step, list(overrides))
    return trainer, env, models


def _describe(cond: Condition, models: dict) -> str:
    if cond.kind == "baseline":
        return f"baseline '{cond.mode}' with {models['description']}"
    return models["description"]


def _core(trainer: Any) -> Any:
    """The trainer that evaluates (a MARLHF trainer's stage-3 trainer, else the trainer itself)."""
    return getattr(trainer, "rl", trainer)


def _set_decoding(trainer: Any, temperature: float, seed: int) -> None:
    """Every condition decodes alike: greedy, or plain sampling at ``temperature`` (no top-p, top-k or penalty), and
    answers each row with K joint answers (sample k of every agent: a cross-trained team is not scored on K^N)."""
    from .configs.fields import own_field

    args = _core(trainer).args
    args.eval_do_sample = temperature > 0
    args.eval_temperature = temperature if temperature > 0 else 1.0
    args.top_p, args.top_k, args.repetition_penalty = 1.0, 0, 1.0
    args.seed = seed
    if own_field(args, "joint_mode", "align") != "align":
        args.joint_mode = "align"


@contextmanager
def _counting_rows(trainer: Any, bar: Any) -> Iterator[None]:
    """Advance ``bar`` by each rollout's rows while the trainer evaluates."""
    rollout = trainer.rollout

    def counted(rows: list[dict], *args: Any, **kwargs: Any) -> Any:
        episode = rollout(rows, *args, **kwargs)
        bar.update(len(rows))
        return episode

    trainer.rollout = counted
    try:
        yield
    finally:
        del trainer.rollout


def _run_team(
    cond: Condition, trainer: Any, *, env: Any, dataset: Any, samples: int, bar: Any
) -> tuple[list[dict], dict[str, float]]:
    """The team's evaluate() on the rows, every joint answer kept: (records, evaluate()'s contribution metrics)."""
    core = _core(trainer)
    core.eval_reward_func = scoring_reward(core, env, cond.name)
    with _counting_rows(core, bar):
        metrics = trainer.evaluate(dataset, num_generations=samples, max_rows=len(dataset))
    extra = {k: float(v) for k, v in metrics.items() if k.startswith(CONTRIBUTION_PREFIX)}
    return episode_records(core.last_eval_episodes), extra


def episode_records(episodes: Sequence[Any]) -> list[dict]:
    """One record per row and joint answer of an evaluation's episodes (a trainer's ``last_eval_episodes``), from the
    first scored stage (the first turn's joint answers, under any topology): ``row``, ``sample``, ``reward``, its
    levels, ``tokens`` and ``completions``. ``tokens``: generated (up to and including the first EOS) by the joint
    answer's own samples at that stage, plus an even share of the row's other tokens (earlier stages of a chain,
    later turns) over the row's joint answers."""
    from .rollout.episode import joint_answers, joint_indices

    records = []
    for episode in episodes:
        first = episode.scored[0]
        n = len(first.samples)
        acting = list(range(n)) if first.acting is None else list(first.acting)
        g = len(first.samples[acting[0]].texts) // len(first.nodes)
        width = first.rewards.shape[1]
        combos = joint_indices(len(acting), g, "align" if width == g else "cross")
        # generated tokens of each agent's samples, per stage
        lengths = [[t.samples[i].completion_mask.sum(dim=1).tolist() for i in range(n)] for t in episode.turns]
        s = episode.turns.index(first)
        other: dict[int, float] = {}  # a row's tokens at every other stage
        for t, turn in enumerate(episode.turns):
            for m, node in enumerate(turn.nodes):
                made = sum(sum(lengths[t][i][m * g : (m + 1) * g]) for i in range(n)) if t != s else 0
                other[node.row_id] = other.get(node.row_id, 0.0) + made
        answers_of_row: dict[int, int] = {}
        for node in first.nodes:
            answers_of_row[node.row_id] = answers_of_row.get(node.row_id, 0) + width
        numbered: dict[int, int] = {}  # a row's joint answers so far (a chain's row has several nodes at the stage)
        for m, node in enumerate(first.nodes):
            for j, combo in enumerate(combos):
                sample = numbered[node.row_id] = numbered.get(node.row_id, -1) + 1
                made = float(sum(lengths[s][i][m * g + combo[p]] for p, i in enumerate(acting)))
                shared = other[node.row_id] / answers_of_row[node.row_id]
                levels = first.levels[m * width + j] if first.levels else {}
                records.append(
                    {
                        "row": node.row_id,
                        "sample": sample,
                        "reward": float(first.rewards[m, j]),
                        **{k: float(v) for k, v in levels.items()},
                        "tokens": made + shared,
                        "completions": joint_answers(node, first.samples, acting, m * g, combo),
                    }
                )
    return records


def _run_baseline(
    cond: Condition, trainer: Any, *, cond_env: Any, env: Any, dataset: Any, samples: int, seed: int
) -> tuple[list[dict], dict[str, float]]:
    """The baseline on the rows, each row asked ``samples`` times: (records, the mode's own metrics)."""
    from .envs.core.baselines import baseline_rows
    from .rollout.sampling import derive_seed
    from .runs import make_generate

    if cond_env.num_agents != env.num_agents:
        raise ComlrlError(
            f"condition {cond.name!r}: its config's team has {cond_env.num_agents} agents, the scoring env "
            f"{env.num_agents}; a baseline answers for the scoring team's roles."
        )
    core = _core(trainer)
    rows = [dict(dataset[r]) for r in range(len(dataset)) for _ in range(samples)]
    calls: list[list[int]] = []  # the tokens each generate call made per prompt; every call sends one per row
    generate = make_generate(core, seed=derive_seed(seed, "compare-baseline", cond.mode), tokens=calls)
    result = baseline_rows(cond_env, cond.mode, generate=generate, rows=rows, reward_func=env.reward_func)
    return baseline_records(result, calls, samples), dict(result.metrics)


def baseline_records(result: Any, calls: Sequence[Sequence[int]], samples: int) -> list[dict]:
    """One record per row and sample of a baseline's :class:`~comlrl.envs.core.baselines.BaselineRows` (asked for
    each row ``samples`` times in a row); ``calls``: the tokens each generate call made per prompt."""
    tokens = [sum(call[j] for call in calls) for j in range(len(result.scores))]
    records = []
    for j, score in enumerate(result.scores):
        records.append(
            {
                "row": j // samples,
                "sample": j % samples,
                "reward": float(score["reward"]),
                **{k: float(v) for k, v in score.items() if k != "reward"},
                "tokens": float(tokens[j]),
                "completions": [answers[j] for answers in result.answers],
            }
        )
    return records


# --- summary -------------------------------------------------------------------------------------------------------


def summarize(
    records: list[dict],
    *,
    names: Sequence[str],
    control: str,
    row_ids: Sequence[int],
    samples: int,
    seconds: dict[str, float] | None = None,
    extras: dict[str, dict[str, float]] | None = None,
    num_resamples: int = NUM_RESAMPLES,
    seed: int = 0,
) -> dict[str, dict[str, Any]]:
    """Each condition's summary from the per-sample ``records`` (``condition``, ``row``, ``reward``, ``level/*``,
    ``metric/*``, ``tokens``): the reward's mean and interval over rows, the paired difference to ``control``, the
    level means, the task metric, tokens and seconds per joint answer. Every condition must hold every row."""
    by_row: dict[str, dict[int, list[dict]]] = {name: {} for name in names}
    for r in records:
        by_row[r["condition"]].setdefault(r["row"], []).append(r)
    for name in names:
        missing = [i for i in row_ids if i not in by_row[name]]
        if missing:
            raise ComlrlError(
                f"condition {name!r} has no answer for rows {missing[:5]}: every condition scores every row."
            )
    rewards = {name: row_values([[r["reward"] for r in by_row[name][i]] for i in row_ids]) for name in names}
    out: dict[str, dict[str, Any]] = {}
    for name in names:
        rec = [r for i in row_ids for r in by_row[name][i]]
        keys = list(dict.fromkeys(k for r in rec for k in r))
        levels = {k: _mean([r.get(k, 0.0) for r in rec]) for k in keys if k.startswith("level/")}
        task: dict[str, float] = {}
        for key, metric in TASK_METRICS.items():
            if key not in keys:
                continue
            if metric == "pass":
                task["pass@1"] = _mean([r.get(key, 0.0) for r in rec])
                if samples > 1:  # pass@k with k = n samples: a row passes when one of its samples does
                    task[f"pass@{samples}"] = _mean([max(r.get(key, 0.0) for r in by_row[name][i]) for i in row_ids])
            else:
                task[metric] = _mean([r.get(key, 0.0) for r in rec])
        stats = dict(num_resamples=num_resamples, seed=seed)
        out[name] = {
            "reward": bootstrap_mean(rewards[name], **stats).as_dict(),
            "difference": paired_difference(rewards[name], rewards[control], **stats).as_dict(),
            "levels": levels,
            "task": task,
            "tokens_per_answer": _mean([r.get("tokens", 0.0) for r in rec]),
            "seconds_per_answer": (seconds or {}).get(name, math.nan) / len(rec),
            "extra": dict((extras or {}).get(name, {})),
        }
    return out


def _mean(values: Sequence[float]) -> float:
    return float(sum(values) / len(values)) if values else math.nan
