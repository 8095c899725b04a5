"""Parallel function calling by a team of two: ``bfcl`` (Berkeley Function Calling Leaderboard v4).

Data: BFCL v4's ``parallel`` (one function, called several times) and ``parallel_multiple`` (several
functions) categories, 200 + 200 requests with their possible answers, read from the files the PyPI
package ``bfcl-eval`` ships (``pip install --no-deps bfcl-eval``; its own dependencies are not needed,
and nothing is downloaded), or a local JSON/JSONL file with the same fields.

Roles. The request needs n calls (the possible answer's ground truth, in its order). Agent 1 makes
the first ceil(n/2) of them, agent 2 the rest; each prompt names its part (positions and function
names) and says the teammate makes the other calls. Each agent replies with a JSON list of calls,
``[{"name": "f", "arguments": {"a": 1}}, ...]``; the team's answer is the union (agent 1's calls,
then agent 2's). With one agent (the single-agent baseline) it makes every call.

Reading an answer (:func:`parse_calls`): the first JSON list of calls in the text, inside a markdown
fence or after prose, or a single call object that starts the reply (or a fence); a call is
``{"name", "arguments"}`` (also ``"parameters"``/``"args"``, arguments as a JSON string, OpenAI's
``{"function": {...}}``, or BFCL's ``{"f": {"a": 1}}``). An empty reply reads as no calls; a reply with
no readable list, or a list holding anything but calls, does not parse. A function name with ``_`` for
``.`` (``spotify_play``) is read as the documented name.

Argument matching is BFCL's (its Python AST checker, :func:`check_call`, ported in :mod:`.bfcl_checker`):
a value matches when it is one of the possible answer's alternatives (strings compared without case,
spaces and ``,./-_*^``; ints accepted for floats; lists and dicts element-wise); an argument whose
alternatives include ``""`` may be omitted; a missing required argument or one the answer does not list
is wrong.

Team reward (tiered, maximum 5.0). The union's calls are assigned one-to-one to the needed calls of
the same function so that the argument scores add up to the most (:func:`best_assignment`); for
``level/part`` each agent's own calls are assigned the same way to the needed calls of its own part:

===============  ======  =================================================================================
level key        points  value
===============  ======  =================================================================================
level/format     0.5     fraction of agents whose reply parses (an empty reply parses, as no calls)
level/names      0.5     F1 of the union's function names against the needed ones (multisets); stop at 0
level/args       1.0     sum over needed calls of the assigned call's argument score, / n; a call's score
                         is 1 when BFCL accepts it, else the fraction of its arguments that are right
level/part       2.0     mean over agents of its own part's F1: 2 x (argument scores of its calls
                         assigned to its part) / (calls in its part + calls it makes); 1 for an agent
                         with no part that makes no call
level/count      0.5     1 - |calls - n| / n, at least 0
level/exact      0.5     every agent made exactly its part: as many calls, each accepted by BFCL
                         (so the union is exactly the needed set)
level/duplicate  -1.0    min(1, calls that repeat an earlier agent's call / n) (same name and arguments)
level/empty      -0.5    fraction of the agents with a part that make no call (an empty reply or ``[]``)
===============  ======  =================================================================================

Levels after ``level/names`` are 0 when it is 0; the two penalties always count, so a team that
answers nothing (empty or malformed replies) scores 0. The maximum needs each agent to make its own
part: one agent making every call scores at most 3.05 on the 400 packaged rows (2.92 when n = 4) with a
silent, empty or prose-writing teammate, 2.17 when the teammate repeats every call; swapped parts lose
``level/part`` and ``level/exact`` (2.5 when no call of one part is partly right for the other). With one
agent its part is every call. Other score keys: ``metric/bfcl_accuracy``
(BFCL's own parallel checker on the union: its greedy, order-free matching), ``metric/names_precision``,
``metric/names_recall``, ``metric/calls_correct`` (needed calls matched by an accepted call, / n),
``metric/n_calls``, ``metric/n_expected``, ``metric/n_duplicates``, ``metric/split_followed`` (each
agent called exactly its part's functions). ``evaluate`` adds ``bfcl/accuracy`` and
``bfcl/accuracy/<category>``.

Multi-turn (``transition="feedback"``, the default): the next prompt repeats the request, shows the
agent's previous reply and names the team's missing calls (by function), wrong calls (which argument
is missing, unexpected or has a wrong value, never the right value), calls not needed, calls made
by both agents, the calls of the agent's own part it did not make (by position and function) and its
calls outside its part; ``transition="plain"`` only asks for a revision.
"""

from __future__ import annotations

import json
from importlib import resources
from importlib.util import find_spec
from typing import Any

import datasets

from .bfcl_checker import PY_TYPES, CallCheck, check_call, check_value, standardize_string  # noqa: F401 (re-exported)
from .bfcl_reward import (  # noqa: F401 (re-exported)
    LEVELS,
    MAX_CALLS,
    MAX_REWARD,
    WEIGHTS,
    BfclJudgement,
    BfclReward,
    BfclTask,
    Call,
    best_assignment,
    bfcl_accepts,
    calls_json,
    feedback_text,
    judge,
    oracle_replies,
    parse_calls,
    part_text,
    task_from_row,
)
from .core.base import Env, Formatter, agent_formatters, check_choices, summarize_scores
from .core.feedback import MAX_PREVIOUS
from .core.loaders import DatasetError, load_rows
from .core.registry import register

CATEGORIES = ("parallel", "parallel_multiple")
TRANSITIONS = ("feedback", "plain")
BFCL_FILE = "BFCL_v4_{category}.json"
INSTALL_HINT = "pip install --no-deps bfcl-eval (scripts/setup.sh installs it)"

EXAMPLE = '[{"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}]'

# --- data ----------------------------------------------------------------------------------------


def _package_rows(category: str) -> list[dict]:
    """The raw rows of one category: the question file joined with its possible answers by ``id``."""
    if find_spec("bfcl_eval") is None:
        raise DatasetError(
            f"bfcl: the offline data comes from the bfcl-eval package, which is not installed: {INSTALL_HINT}; "
            "or pass a local JSON/JSONL file with question, function and ground_truth fields."
        )
    root = resources.files("bfcl_eval") / "data"
    name = BFCL_FILE.format(category=category)
    try:
        questions = [json.loads(line) for line in (root / name).read_text(encoding="utf-8").splitlines() if line]
        answers = [
            json.loads(line)
            for line in (root / "possible_answer" / name).read_text(encoding="utf-8").splitlines()
            if line
        ]
    except FileNotFoundError as exc:
        raise DatasetError(
            f"bfcl: the installed bfcl-eval package has no {name} (BFCL v4); reinstall it: {INSTALL_HINT}."
        ) from exc
    truth = {a["id"]: a["ground_truth"] for a in answers}
    return [{**q, "category": category, "ground_truth": truth[q["id"]]} for q in questions if q["id"] in truth]


def _question_text(question: Any) -> str:
    if isinstance(question, str):
        return question
    turns = question if isinstance(question, list) else [question]
    messages = [m for turn in turns for m in (turn if isinstance(turn, list) else [turn])]
    users = [str(m.get("content", "")) for m in messages if isinstance(m, dict) and m.get("role", "user") == "user"]
    if not users:
        raise ValueError("the question has no user message")
    return "\n".join(users)


def _json_field(value: Any, what: str) -> str:
    parsed = json.loads(value) if isinstance(value, str) else value
    if not isinstance(parsed, list) or not parsed or not all(isinstance(v, dict) for v in parsed):
        raise ValueError(f"'{what}' must be a non-empty list of objects")
    return json.dumps(parsed, ensure_ascii=False)


def normalize_row(row: dict, index: int) -> dict:
    """A raw BFCL row (``question``, ``function`` or ``functions``, ``ground_truth``) in this env's schema."""
    functions = _json_field(row.get("function", row.get("functions")), "function")
    ground_truth = _json_field(row["ground_truth"], "ground_truth")
    for call in json.loads(ground_truth):
        if len(call) != 1 or not isinstance(next(iter(call.values())), dict):
            raise ValueError("each ground_truth call must be {function name: {argument: [alternatives]}}")
    task_id = str(row.get("id") or index)
    category = str(row.get("category") or task_id.rsplit("_", 1)[0])
    return {
        "id": task_id,
        "category": category,
        "question": _question_text(row["question"]),
        "functions": functions,
        "ground_truth": ground_truth,
    }


SPLITS = ("train", "test", "all")


def split_rows(rows: list[dict], split: str) -> list[dict]:
    """``all``; ``test``: every 5th row (index % 5 == 0); ``train``: the others."""
    if split not in SPLITS:
        raise DatasetError(f"bfcl: unknown split '{split}'; choose one of {', '.join(SPLITS)}.")
    if split == "all":
        return rows
    return [r for i, r in enumerate(rows) if (i % 5 == 0) == (split == "test")]


# --- the environment -----------------------------------------------------------------------------


def _docs_text(task: BfclTask) -> str:
    return "\n".join(json.dumps(f, ensure_ascii=False) for f in task.functions)


@register("bfcl")
class BfclEnv(Env):
    """BFCL v4 parallel function calling: agent 1 makes the first half of the needed calls, agent 2 the rest."""

    name = "bfcl"
    description = "BFCL v4 parallel function calling: agent 1 the first half of the calls, agent 2 the rest"
    defaults = {"max_new_tokens": 256, "num_turns": 1}
    agent_counts = (1, 2)
    default_data = (
        "BFCL v4 parallel + parallel_multiple (400 requests, interleaved) from the bfcl-eval package "
        "(pip install --no-deps bfcl-eval); splits train (320), test (every 5th row, 80), all"
    )

    def __init__(
        self,
        num_agents: int = 2,
        *,
        categories: tuple[str, ...] | list[str] | str = CATEGORIES,
        transition: str = "feedback",
    ) -> None:
        """``categories``: which BFCL categories ``load_dataset()`` reads (``parallel``, ``parallel_multiple``);
        ``transition``: ``feedback`` (name the missing / wrong / duplicated calls) or ``plain``."""
        super().__init__(num_agents)
        self.categories = check_choices(self.name, "categories", categories, CATEGORIES)
        [self.transition] = check_choices(self.name, "transition", [transition], TRANSITIONS)
        self.reward_func = BfclReward(num_agents, self.name)
        self.external_transition = self._transition

    # --- prompts ---------------------------------------------------------------------------------
    def roles(self) -> list[str]:
        if self.num_agents == 1:
            return ["every needed function call"]
        return ["the first half of the needed calls", "the rest of the needed calls"]

    def _prompt(self, row: dict, agent: int | None) -> str:
        task = task_from_row(row)
        n = len(task.needed)
        if agent is None:
            names = ", ".join(f"`{name}`" for name, _ in task.needed)
            intro = (
                f"Answer the user's request by calling functions. The request needs {n} function calls, in the "
                f"order it asks for them: {names}. Make all of them."
            )
            what = "all the calls"
        else:
            mine, other = task.parts(2)[agent], task.parts(2)[1 - agent]
            theirs = f"your teammate makes {part_text(other, task)}" if other else "your teammate makes none"
            intro = (
                "You and a teammate answer the user's request together by calling functions; the team's answer "
                f"is all the calls you both make. The request needs {n} function calls, in the order it asks for "
                f"them. You make {part_text(mine, task) if mine else 'no call'}; {theirs}. Make only your part."
            )
            what = "your calls"
        return (
            f"{intro}\n\nAvailable functions (JSON schema):\n{_docs_text(task)}\n\nUser request: {task.question}\n\n"
            f'Reply with only a JSON list of {what}, each as {{"name": "<function name>", "arguments": '
            f'{{"<argument>": <value>, ...}}}}, for example:\n{EXAMPLE}'
        )

    def formatters(self) -> list[Formatter]:
        return agent_formatters(self._prompt, self.num_agents)

    def single_formatter(self) -> Formatter:
        return lambda row: self._prompt(row, None)

    def split_single(self, answer: str, row: dict) -> list[str]:
        """One model's calls -> agent 1 the first ceil(n/2) of them (n needed calls), agent 2 the rest;
        a reply that does not parse goes to both as it is (both parts fail ``level/format``)."""
        if self.num_agents == 1:
            return [answer]
        calls = parse_calls(answer)
        if calls is None:  # the team answer does not parse: neither part does
            return [answer, answer]
        k = len(task_from_row(row).parts(2)[0])
        return [calls_json(calls[:k]), calls_json(calls[k:])]

    # --- multi-turn and metrics ------------------------------------------------------------------
    def _transition(self, *, batch_item: dict, agent_completions: list[str], turn: int = 1, **kwargs: Any) -> list[str]:
        """Next prompt of each agent: its prompt, its previous reply and what is missing / wrong / duplicated."""
        [j] = self.reward_func.judge([[c] for c in agent_completions], [batch_item])
        prompts = []
        for i, fmt in enumerate(self.formatters()):
            previous = agent_completions[i].strip() or "(empty)"
            if len(previous) > MAX_PREVIOUS:
                previous = previous[:MAX_PREVIOUS] + "\n..."
            parts = [fmt(batch_item).rstrip(), f"Your previous reply:\n{previous}"]
            if self.transition == "feedback":
                parts.append(f"Feedback on the team's calls:\n{feedback_text(j, i)}")
            parts.append("Reply with the complete, corrected JSON list of your calls.")
            prompts.append("\n\n".join(parts))
        return prompts

    def evaluate(self, agent_completions: list[list[str]], batch_items: list[dict]) -> dict[str, float]:
        """``summarize_scores`` plus ``bfcl/accuracy`` (BFCL's checker on the union) overall and per category."""
        scores = self.reward_func.score(*agent_completions, batch_items=batch_items)
        out = summarize_scores(scores)
        out["bfcl/accuracy"] = out.get("metric/bfcl_accuracy", 0.0)
        by_category: dict[str, list[float]] = {}
        for row, s in zip(batch_items if len(batch_items) == len(scores) else [{}] * len(scores), scores):
            by_category.setdefault(str(row.get("category") or "unknown"), []).append(s["metric/bfcl_accuracy"])
        for category, values in sorted(by_category.items()):
            out[f"bfcl/accuracy/{category}"] = sum(values) / len(values)
        return out

    def load_dataset(self, source: Any = None, split: str = "train", limit: int | None = None) -> datasets.Dataset:
        """BFCL rows. ``source`` None: the ``parallel`` and ``parallel_multiple`` files of the installed
        ``bfcl-eval`` package (the env's ``categories``), joined with their possible answers and interleaved
        (parallel_0, parallel_multiple_0, parallel_1, ...); never the network. Else a local JSON/JSONL file
        (or rows) with ``question`` (BFCL's message lists or a string), ``function`` (or ``functions``) and
        ``ground_truth``. Splits of either: ``test`` every 5th row, ``train`` the others, ``all``."""

        def default(split: str) -> list[dict]:
            per_category = [_package_rows(c) for c in self.categories]
            rows = [r for group in _interleave(per_category) for r in group]
            return split_rows(rows, split)

        if source is None:
            return load_rows(
                None,
                split=split,
                limit=limit,
                required=["question", ("function", "functions"), "ground_truth"],
                normalize=normalize_row,
                default=default,
                default_label=f"bfcl-eval package data ({', '.join(self.categories)})",
                env_name=self.name,
            )
        rows = load_rows(
            source,
            split=split,
            limit=None,
            required=["question", ("function", "functions"), "ground_truth"],
            normalize=normalize_row,
            env_name=self.name,
        )
        picked = split_rows([dict(r) for r in rows], split)
        if limit is not None:
            picked = picked[:limit]
        if not picked:
            raise DatasetError(f"bfcl: no rows in split '{split}' of {source}.")
        return datasets.Dataset.from_list(picked)


def _interleave(groups: list[list[dict]]) -> list[list[dict]]:
    out = []
    for i in range(max((len(g) for g in groups), default=0)):
        out.append([g[i] for g in groups if i < len(g)])
    return out
