"""Evaluation baselines for the built-in tasks, written against an abstract generator.

``generate(agent_index, prompts) -> completions`` produces one completion per prompt with agent
``agent_index``'s model (so the baselines need no trainer). Where one completion holds every agent's answer
(``single``, ``centralized``) a ``generate`` that takes a ``parts`` keyword is called with ``parts=num_agents``: it
gives that completion the team's joint token budget (``parts`` x ``max_new_tokens``), as the equal-budget single
agent has. Modes:

* ``single``: agent 0 alone writes the whole team answer from a single-agent prompt (both parts with a
  marker line for writing; the whole program for code); ``env.split_single`` splits it into the roles.
* ``parallel``: every agent answers its own prompt independently; the answers are combined as usual.
* ``sequential``: the 'chain' topology untrained: agent k's prompt also shows the answers of agents 0..k-1.
* ``discussion``: the 'debate' topology untrained, two turns: agents answer in parallel, then each sees every
  agent's first answer (its own included) under its prompt and answers again; the second answers are scored.
  Both compose prompts as a trainer under that topology does (:func:`comlrl.rollout.topology.compose_prompt`).
* ``centralized``: agent 0 alone answers every agent's prompt at once, each answer in ``<agent_i>...</agent_i>``
  tags (:func:`comlrl.algorithms.preference.centralized_prompt`); the tags are split into the roles
  (:func:`~comlrl.algorithms.preference.split_roles`), a reply that does not parse scores N empty answers and counts
  in ``centralized/parse_failure_rate``. The untrained counterpart of ``CentralizedMAGRPOTrainer``.

``run_baseline`` returns the environment's evaluation metrics (``reward/mean``, per-level means,
``pass@1`` for code, ...) plus ``tokens/per_task`` (tokens generated per task, over all calls;
whitespace tokens unless ``count_tokens`` is given) and ``num_tasks``; ``baseline_rows`` returns each row's
answers, score and tokens instead (what ``comlrl compare`` pairs over rows). ``format_table`` renders
several results as a markdown table.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

from ...algorithms.preference import centralized_prompt, split_roles
from ...rollout.topology import builtin, compose_prompt, visible_answers
from .base import Env

Generate = Callable[[int, list[str]], list[str]]
MODES = ("single", "parallel", "sequential", "discussion", "centralized")
_FIRST_COLUMNS = ("reward/mean", "pass@1", "aux/usage_rate", "centralized/parse_failure_rate")


class _Generator:
    """Calls ``generate`` and counts the tokens of what it returns."""

    def __init__(self, generate: Generate, count_tokens: Callable[[str], int] | None) -> None:
        self.generate = generate
        self.count = count_tokens or (lambda text: len(text.split()))
        self.row_tokens: list[int] = []  # per row, over all calls (each call sends one prompt per row)
        self.metrics: dict[str, float] = {}  # a mode's own metrics, added to the result

    def __call__(self, agent: int, prompts: list[str], parts: int = 1) -> list[str]:
        # parts > 1: one completion holds every agent's answer (single, centralized), so it gets the joint answer's
        # token budget; a generate that takes no ``parts`` keeps its own budget
        takes_parts = parts > 1 and "parts" in inspect.signature(self.generate).parameters
        out = list(self.generate(agent, prompts, parts=parts) if takes_parts else self.generate(agent, prompts))
        if len(out) != len(prompts):
            raise ValueError(f"generate(agent {agent}) returned {len(out)} completions for {len(prompts)} prompts.")
        for i, text in enumerate(out):
            if not isinstance(text, str):
                raise TypeError(f"generate(agent {agent}) returned {type(text).__name__} for prompt {i}, expected str.")
        counts = [self.count(t) for t in out]
        if not self.row_tokens:
            self.row_tokens = [0] * len(out)
        if len(counts) != len(self.row_tokens):
            raise ValueError(f"baseline call for agent {agent} sent {len(out)} prompts, expected one per row.")
        self.row_tokens = [a + b for a, b in zip(self.row_tokens, counts)]
        return out


def _formatted(env: Env, rows: list[dict]) -> list[list[str]]:
    return [[fmt(r) for r in rows] for fmt in env.formatters()]


def _parallel(env: Env, gen: _Generator, rows: list[dict]) -> list[list[str]]:
    return [gen(i, prompts) for i, prompts in enumerate(_formatted(env, rows))]


def _topology(name: str, turns: int) -> Callable[[Env, _Generator, list[dict]], list[list[str]]]:
    """A baseline that plays the built-in topology ``name`` untrained for ``turns`` turns: stage by stage, each
    acting agent's prompt composed as a trainer under that topology composes it (:mod:`comlrl.rollout.topology`);
    every agent's latest answer is scored."""

    def run(env: Env, gen: _Generator, rows: list[dict]) -> list[list[str]]:
        n, prompts = env.num_agents, _formatted(env, rows)
        topology = builtin(name, n)
        previous: list[list[str | None]] = [[None] * n for _ in rows]
        latest: list[list[str]] = [[""] * n for _ in rows]
        for t in range(turns):
            graph = topology.turn(t)
            this_turn: list[list[str | None]] = [[None] * n for _ in rows]
            for stage in graph.stages():
                for k in stage:
                    shown = [
                        compose_prompt(
                            prompts[k][j], visible_answers(graph, k, this_turn[j], previous[j], t + 1), k, t + 1
                        )
                        for j in range(len(rows))
                    ]
                    for j, answer in enumerate(gen(k, shown)):
                        this_turn[j][k] = latest[j][k] = answer
            previous = this_turn
        return [[latest[j][k] for j in range(len(rows))] for k in range(n)]

    return run


def _single(env: Env, gen: _Generator, rows: list[dict]) -> list[list[str]]:
    answers = gen(0, [env.single_formatter()(r) for r in rows], parts=env.num_agents)
    split = [env.split_single(a, r) for a, r in zip(answers, rows)]
    return [[parts[i] for parts in split] for i in range(env.num_agents)]


def _centralized(env: Env, gen: _Generator, rows: list[dict]) -> list[list[str]]:
    n = env.num_agents
    prompts = [centralized_prompt(list(role_prompts)) for role_prompts in zip(*_formatted(env, rows))]
    split = [split_roles(answer, n) for answer in gen(0, prompts, parts=n)]
    gen.metrics["centralized/parse_failure_rate"] = sum(not ok for _, ok in split) / len(split)
    return [[outputs[i] for outputs, _ in split] for i in range(n)]


_RUNNERS = {
    "single": _single,
    "parallel": _parallel,
    "sequential": _topology("chain", 1),
    "discussion": _topology("debate", 2),
    "centralized": _centralized,
}


@dataclass(kw_only=True)
class BaselineRows:
    """A baseline's per-row results: ``answers[i][j]`` is agent i's answer to row j, ``scores[j]`` row j's score dict
    (``reward``, ``level/*``, ``metric/*``), ``tokens[j]`` the tokens generated for row j over all calls, ``metrics``
    the mode's own metrics (``centralized/parse_failure_rate``)."""

    answers: list[list[str]]
    scores: list[dict[str, float]]
    tokens: list[int]
    metrics: dict[str, float] = field(default_factory=dict)


def baseline_answers(
    env: Env, mode: str, *, generate: Generate, rows: Sequence[dict], count_tokens: Callable[[str], int] | None = None
) -> tuple[list[list[str]], list[int], dict[str, float]]:
    """Each agent's answer to each row under baseline ``mode``, the tokens generated per row (every call of the mode
    sends one prompt per row, in row order) and the mode's own metrics."""
    if mode not in _RUNNERS:
        raise ValueError(f"unknown baseline mode '{mode}'; choose one of {', '.join(MODES)}.")
    rows = [dict(r) for r in rows]
    if not rows:
        raise ValueError("run_baseline: no rows to evaluate.")
    gen = _Generator(generate, count_tokens)
    per_agent = _RUNNERS[mode](env, gen, rows)
    return per_agent, gen.row_tokens, gen.metrics


def baseline_rows(
    env: Env,
    mode: str,
    *,
    generate: Generate,
    rows: Sequence[dict],
    count_tokens: Callable[[str], int] | None = None,
    reward_func: Any = None,
) -> BaselineRows:
    """Run baseline ``mode`` on ``rows`` and score each row (``reward_func``: a team reward with ``score()``;
    default ``env.reward_func``)."""
    per_agent, tokens, metrics = baseline_answers(env, mode, generate=generate, rows=rows, count_tokens=count_tokens)
    reward = reward_func if reward_func is not None else env.reward_func
    scores = reward.score(*per_agent, batch_items=[dict(r) for r in rows])
    return BaselineRows(answers=per_agent, scores=[dict(s) for s in scores], tokens=tokens, metrics=dict(metrics))


def run_baseline(
    env: Env, mode: str, *, generate: Generate, rows: Sequence[dict], count_tokens: Callable[[str], int] | None = None
) -> dict[str, float]:
    """Run baseline ``mode`` on ``rows`` and return ``env.evaluate`` metrics + ``tokens/per_task``, ``num_tasks``."""
    rows = [dict(r) for r in rows]
    per_agent, tokens, own = baseline_answers(env, mode, generate=generate, rows=rows, count_tokens=count_tokens)
    metrics = env.evaluate(per_agent, rows)
    metrics.update(own)
    metrics["tokens/per_task"] = sum(tokens) / len(rows)
    metrics["num_tasks"] = float(len(rows))
    return metrics


def format_table(results: dict[str, dict[str, float]], columns: Sequence[str] | None = None) -> str:
    """A markdown table: one row per result (e.g. per mode), one column per metric.

    Default columns: ``reward/mean``, ``pass@1``, ``aux/usage_rate``, ``centralized/parse_failure_rate`` (when
    present), the ``level/*`` metrics, then ``tokens/per_task``.
    """
    if not results:
        return ""
    keys = [k for r in results.values() for k in r]
    if columns is None:
        present = list(dict.fromkeys(keys))
        columns = [c for c in _FIRST_COLUMNS if c in present]
        columns += [k for k in present if k.startswith("level/")]
        columns += [k for k in ("tokens/per_task",) if k in present]
    header = "| baseline | " + " | ".join(columns) + " |"
    rule = "|---|" + "|".join("---:" for _ in columns) + "|"
    lines = [header, rule]
    for name, metrics in results.items():
        cells = [_cell(metrics.get(c)) for c in columns]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _cell(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value:.1f}" if abs(value) >= 10 else f"{value:.3f}"
