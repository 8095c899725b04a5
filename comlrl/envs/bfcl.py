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

import functools
import json
import math
import re
from collections import Counter
from dataclasses import dataclass, field
from importlib import resources
from importlib.util import find_spec
from typing import Any

import datasets

from .bfcl_checker import PY_TYPES, CallCheck, check_call, check_value, standardize_string  # noqa: F401 (re-exported)
from .core.base import Env, Formatter, TeamReward, agent_formatters, check_choices, summarize_scores
from .core.feedback import MAX_PREVIOUS
from .core.loaders import DatasetError, load_rows
from .core.registry import register

CATEGORIES = ("parallel", "parallel_multiple")
TRANSITIONS = ("feedback", "plain")
BFCL_FILE = "BFCL_v4_{category}.json"
INSTALL_HINT = "pip install --no-deps bfcl-eval (scripts/setup.sh installs it)"
MAX_CALLS = 32  # calls read per reply (more are ignored)

LEVELS = (
    "level/format",
    "level/names",
    "level/args",
    "level/part",
    "level/count",
    "level/exact",
    "level/duplicate",
    "level/empty",
)
WEIGHTS = {
    "level/format": 0.5,
    "level/names": 0.5,
    "level/args": 1.0,
    "level/part": 2.0,
    "level/count": 0.5,
    "level/exact": 0.5,
    "level/duplicate": -1.0,
    "level/empty": -0.5,
}
MAX_REWARD = sum(w for w in WEIGHTS.values() if w > 0)

EXAMPLE = '[{"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}]'

# --- reading replies ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Call:
    """One function call of a reply: the name as written and its arguments."""

    name: str
    args: dict = field(hash=False, compare=True)


_FENCE = re.compile(r"```[A-Za-z]*[ \t]*\n?(.*?)```", re.S)
_LIST = re.compile(r"\[")
_ARG_KEYS = ("arguments", "parameters", "args")


def _as_call(item: Any) -> Call | None:
    if not isinstance(item, dict):
        return None
    if isinstance(item.get("function"), dict) and "name" not in item:  # OpenAI tool-call style
        item = item["function"]
    if isinstance(item.get("name"), str):
        args: Any = {}
        for key in _ARG_KEYS:
            if key in item:
                args = item[key]
                break
        if isinstance(args, str):
            try:
                args = json.loads(args) if args.strip() else {}
            except json.JSONDecodeError:
                return None
        return Call(item["name"], args) if isinstance(args, dict) else None
    if len(item) == 1:  # BFCL's own {"f": {"a": 1}}
        [(name, args)] = item.items()
        if isinstance(args, dict) and name not in ("name", *_ARG_KEYS):
            return Call(name, args)
    return None


def _as_calls(value: Any) -> list[Call] | None:
    if isinstance(value, dict):
        call = _as_call(value)
        return None if call is None else [call]
    if isinstance(value, list):
        calls = [_as_call(v) for v in value]
        return None if any(c is None for c in calls) else calls[:MAX_CALLS]
    return None


def _decode(text: str) -> list[Call] | None:
    """A single call object that is the whole text's start, or the first JSON list in it that holds calls."""
    decoder = json.JSONDecoder()
    body = text.strip()
    if body.startswith("{"):
        try:
            calls = _as_calls(decoder.raw_decode(body)[0])
        except json.JSONDecodeError:
            calls = None
        if calls is not None:
            return calls
    pos = 0
    while (match := _LIST.search(body, pos)) is not None:
        try:
            value, end = decoder.raw_decode(body, match.start())
        except json.JSONDecodeError:  # not JSON from here (a truncated list): try the next "["
            pos = match.start() + 1
            continue
        calls = _as_calls(value) if isinstance(value, list) else None
        if calls is not None:
            return calls
        pos = end


def parse_calls(text: str) -> list[Call] | None:
    """The calls of a reply; ``[]`` for an empty reply; None when it does not parse (module docstring)."""
    stripped = text.strip()
    if not stripped:
        return []
    for body in [m.group(1) for m in _FENCE.finditer(stripped)] + [stripped]:
        calls = _decode(body)
        if calls is not None:
            return calls
    return None


def calls_json(calls: list[Call]) -> str:
    """A list of calls in the reply format."""
    return json.dumps([{"name": c.name, "arguments": c.args} for c in calls], ensure_ascii=False)


# --- tasks and scoring -----------------------------------------------------------------------------


@dataclass(frozen=True)
class BfclTask:
    """A request: its functions' docs and the needed calls (name, possible arguments), in order."""

    id: str
    category: str
    question: str
    functions: tuple[dict, ...] = field(hash=False)
    needed: tuple[tuple[str, dict], ...] = field(hash=False)

    @functools.cached_property
    def docs(self) -> dict[str, dict]:
        return {f["name"]: f for f in self.functions}

    def canonical(self, name: str) -> str:
        """The documented name for ``name`` (``a_b`` reads as ``a.b`` when only that is documented)."""
        if name in self.docs:
            return name
        for doc_name in self.docs:
            if doc_name.replace(".", "_") == name:
                return doc_name
        return name

    def parts(self, num_agents: int) -> list[list[int]]:
        """Indices of the needed calls each agent makes: agent 1 the first ceil(n/2), agent 2 the rest."""
        n = len(self.needed)
        if num_agents == 1:
            return [list(range(n))]
        k = math.ceil(n / 2)
        return [list(range(k)), list(range(k, n))]


@functools.lru_cache(maxsize=4096)
def _task(task_id: str, category: str, question: str, functions: str, ground_truth: str) -> BfclTask:
    needed = []
    for call in json.loads(ground_truth):
        [(name, possible)] = call.items()
        needed.append((name, possible))
    return BfclTask(task_id, category, question, tuple(json.loads(functions)), tuple(needed))


def task_from_row(row: dict) -> BfclTask:
    """The task of a normalised row (``id``, ``category``, ``question``, ``functions``, ``ground_truth``)."""
    return _task(
        str(row.get("id", "")),
        str(row.get("category", "")),
        str(row["question"]),
        row["functions"],
        row["ground_truth"],
    )


def best_assignment(weights: list[list[float | None]], n_needed: int) -> tuple[float, list[tuple[int, int]]]:
    """The one-to-one assignment of calls (rows) to needed calls (columns) with the largest total weight.

    ``weights[t][g]`` is None where call t cannot stand for needed call g. Returns (total, [(t, g), ...])."""
    best: dict[int, tuple[float, tuple]] = {0: (0.0, ())}
    for t, row in enumerate(weights):
        grown = dict(best)
        for mask, (value, pairs) in best.items():
            for g, w in enumerate(row):
                if w is None or mask >> g & 1:
                    continue
                key = mask | 1 << g
                if key not in grown or grown[key][0] < value + w:
                    grown[key] = (value + w, pairs + ((t, g),))
        best = grown
    value, pairs = max(best.values(), key=lambda v: v[0])
    return value, list(pairs)


def bfcl_accepts(task: BfclTask, calls: list[Call]) -> bool:
    """BFCL's ``parallel_function_checker_no_order``: as many calls as needed, each needed call (in order)
    matched by the first unmatched call that it accepts."""
    if len(calls) != len(task.needed):
        return False
    matched: set[int] = set()
    for name, possible in task.needed:
        for i, call in enumerate(calls):
            if i not in matched and task.canonical(call.name) == name:
                if check_call(task.docs.get(name), call.args, possible).valid:
                    matched.add(i)
                    break
        else:
            return False
    return True


def _canonical_args(value: Any) -> Any:
    if isinstance(value, dict):
        return tuple(sorted((k, _canonical_args(v)) for k, v in value.items()))
    if isinstance(value, (list, tuple)):
        return tuple(_canonical_args(v) for v in value)
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return " ".join(value.split()) if isinstance(value, str) else value


def _call_key(task: BfclTask, call: Call) -> tuple:
    return task.canonical(call.name), _canonical_args(call.args)


@dataclass
class BfclJudgement:
    """Everything known about one joint answer."""

    task: BfclTask
    per_agent: list[list[Call] | None]  # None: the reply did not parse
    calls: list[tuple[int, Call]]  # (agent, call) of the union, agent 1's first
    checks: dict[tuple[int, int], CallCheck]  # (call index, needed index) -> check
    pairs: list[tuple[int, int]]  # the best assignment (call index, needed index)
    parts: list[list[int]]  # the needed calls (indices) each agent makes
    part_pairs: list[list[tuple[int, int]]]  # per agent: the best assignment of its calls to its part
    duplicates: list[int]  # union indices of calls that repeat an earlier agent's call
    levels: dict[str, float]
    metrics: dict[str, float]

    @property
    def reward(self) -> float:
        return sum(WEIGHTS[k] * v for k, v in self.levels.items())

    def scores(self) -> dict[str, float]:
        return {"reward": self.reward, **self.levels, **self.metrics}


def _weights(task: BfclTask, calls: list[tuple[int, Call]], checks: dict) -> list[list[float | None]]:
    """The argument score of each call (rows) for each needed call (columns); None where it cannot stand for it
    (another function, or no argument right). Fills ``checks`` ((call index, needed index) -> check)."""
    weights: list[list[float | None]] = []
    for t, (_, call) in enumerate(calls):
        row: list[float | None] = []
        for g, (name, possible) in enumerate(task.needed):
            if task.canonical(call.name) != name:
                row.append(None)
                continue
            checks[(t, g)] = check_call(task.docs.get(name), call.args, possible)
            row.append(checks[(t, g)].score or None)  # no argument right: not this needed call
        weights.append(row)
    return weights


def judge(task: BfclTask, replies: list[str]) -> BfclJudgement:
    """Score one joint answer (module docstring)."""
    num_agents = len(replies)
    per_agent = [parse_calls(r) for r in replies]
    calls = [(i, c) for i, cs in enumerate(per_agent) for c in (cs or [])]
    n, n_calls = len(task.needed), len(calls)
    parts = task.parts(num_agents)
    levels = {k: 0.0 for k in LEVELS}
    levels["level/format"] = sum(cs is not None for cs in per_agent) / num_agents
    owners = [cs for cs, part in zip(per_agent, parts) if part]  # an agent with no call to make may stay silent
    levels["level/empty"] = sum(cs == [] for cs in owners) / max(1, len(owners))
    # the same call (name and arguments) made by an earlier agent
    seen: dict[tuple, int] = {}
    duplicates = []
    for index, (agent, call) in enumerate(calls):
        key = _call_key(task, call)
        if key in seen and seen[key] < agent:
            duplicates.append(index)
        seen.setdefault(key, agent)
    levels["level/duplicate"] = min(1.0, len(duplicates) / n) if n else 0.0

    needed_names = Counter(name for name, _ in task.needed)
    call_names = Counter(task.canonical(c.name) for _, c in calls)
    overlap = sum((needed_names & call_names).values())
    levels["level/names"] = 2 * overlap / (n + n_calls) if n + n_calls else 0.0
    checks: dict[tuple[int, int], CallCheck] = {}
    pairs: list[tuple[int, int]] = []
    part_pairs: list[list[tuple[int, int]]] = [[] for _ in parts]
    correct = 0
    if levels["level/names"] > 0:
        weights = _weights(task, calls, checks)
        total, pairs = best_assignment(weights, n)
        valid = [[1.0 if w == 1.0 else None for w in row] for row in weights]
        correct = round(best_assignment(valid, n)[0])
        levels["level/args"] = total / n
        levels["level/count"] = max(0.0, 1.0 - abs(n_calls - n) / n)
        # each agent's own calls against its own part: a soft F1, 2 x (argument scores) / (|part| + its calls)
        own, exact = [], []
        for agent, part in enumerate(parts):
            mine = [t for t, (a, _) in enumerate(calls) if a == agent]
            value, local = best_assignment([[weights[t][g] for g in part] for t in mine], len(part))
            part_pairs[agent] = [(mine[i], part[j]) for i, j in local]
            own.append(2 * value / (len(part) + len(mine)) if part or mine else 1.0)
            accepted = sum(checks[p].valid for p in part_pairs[agent])
            exact.append(len(mine) == len(part) == accepted)
        levels["level/part"] = sum(own) / len(own)
        levels["level/exact"] = float(all(exact))
    split_followed = all(
        cs is not None
        and Counter(task.canonical(c.name) for c in cs) == Counter(task.needed[g][0] for g in part)
        and len(cs) == len(part)
        for cs, part in zip(per_agent, parts)
    )
    metrics = {
        "metric/bfcl_accuracy": float(bfcl_accepts(task, [c for _, c in calls])),
        "metric/names_precision": overlap / n_calls if n_calls else 0.0,
        "metric/names_recall": overlap / n if n else 0.0,
        "metric/calls_correct": correct / n if n else 0.0,
        "metric/n_calls": float(n_calls),
        "metric/n_expected": float(n),
        "metric/n_duplicates": float(len(duplicates)),
        "metric/split_followed": float(split_followed),
    }
    return BfclJudgement(task, per_agent, calls, checks, pairs, parts, part_pairs, duplicates, levels, metrics)


def oracle_replies(task: BfclTask, num_agents: int = 2) -> list[str]:
    """A reply per agent that reaches the maximum: each needed call of its part with the first listed
    alternative of every argument (optional ones omitted when that alternative is ``""``)."""
    replies = []
    for part in task.parts(num_agents):
        calls = []
        for g in part:
            name, possible = task.needed[g]
            props = ((task.docs.get(name) or {}).get("parameters") or {}).get("properties") or possible
            args = {k: _first(v) for k, v in possible.items() if k in props and v and not _is_omitted(v[0])}
            calls.append(Call(name, args))
        replies.append(calls_json(calls))
    return replies


def _is_omitted(value: Any) -> bool:
    return type(value) is str and value == ""


def _first(alternatives: list) -> Any:
    """The first alternative as a value: a dict's (or list of dicts') entries are alternatives themselves."""
    value = alternatives[0]
    if isinstance(value, dict):
        return {k: _first(v) for k, v in value.items() if isinstance(v, list) and v and not _is_omitted(v[0])}
    if isinstance(value, list) and value and all(isinstance(v, dict) for v in value):
        return [_first([v]) for v in value]
    return value


def _short(call: Call, limit: int = 160) -> str:
    text = f"{call.name}({json.dumps(call.args, ensure_ascii=False)})"
    return text if len(text) <= limit else text[: limit - 3] + "..."


def feedback_text(j: BfclJudgement, agent: int) -> str:
    """What the next prompt tells ``agent`` about the team's calls (never the right values)."""

    def who(a: int) -> str:
        return "your" if a == agent else "your teammate's"

    lines = []
    for i, cs in enumerate(j.per_agent):
        if cs is None:
            lines.append(f"- {who(i).capitalize()} reply is not a JSON list of calls.")
        elif not cs:
            lines.append(f"- {'You' if i == agent else 'Your teammate'} made no call.")
    assigned = {t: g for t, g in j.pairs}
    for t, (a, call) in enumerate(j.calls):
        if t in j.duplicates:
            lines.append(f"- Made by both agents: {_short(call)} ({who(a)} copy is extra).")
        elif t not in assigned:
            lines.append(f"- Not needed: {who(a)} call {_short(call)}.")
        else:
            check = j.checks.get((t, assigned[t]))
            if check is not None and not check.valid:
                lines.append(f"- Wrong: {who(a)} call {_short(call)}: {'; '.join(check.errors)}.")
    matched = set(assigned.values())
    missing = Counter(name for g, (name, _) in enumerate(j.task.needed) if g not in matched)
    for name, count in missing.items():
        lines.append(f"- Missing: {count} call{'s' if count > 1 else ''} to `{name}`.")
    if len(j.parts) > 1:  # the agent's own part: its needed calls it did not make, its calls outside it
        own = dict(j.part_pairs[agent])
        absent = [g for g in j.parts[agent] if g not in own.values()]
        if absent:
            lines.append(f"- Missing from your part: {_part_text(absent, j.task)}.")
        others = [p for a, p in enumerate(j.parts) if a != agent and p]
        theirs = f"; your teammate makes {_part_text(others[0], j.task)}" if others else ""
        for t, (a, call) in enumerate(j.calls):
            if a == agent and t not in own and t in assigned and t not in j.duplicates:
                lines.append(f"- Outside your part: your call {_short(call)}{theirs}.")
    if not lines:
        return "The team's calls are all correct."
    n_ok = round(j.metrics["metric/calls_correct"] * len(j.task.needed))
    return f"The team made {len(j.calls)} call(s); {n_ok} of the {len(j.task.needed)} needed are right.\n" + "\n".join(
        lines
    )


class BfclReward(TeamReward):
    """The tiered function-calling reward (module docstring)."""

    level_names = LEVELS
    max_reward = MAX_REWARD

    def judge(self, agent_completions: list[list[str]], rows: list[dict]) -> list[BfclJudgement]:
        return [judge(task_from_row(row), [c[j] for c in agent_completions]) for j, row in enumerate(rows)]

    def score_batch(self, agent_completions: list[list[str]], rows: list[dict]) -> list[dict[str, float]]:
        return [j.scores() for j in self.judge(agent_completions, rows)]


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


def _part_text(indices: list[int], task: BfclTask) -> str:
    names = ", ".join(f"`{task.needed[g][0]}`" for g in indices)
    if len(indices) == 1:
        return f"call {indices[0] + 1} ({names})"
    if indices == list(range(indices[0], indices[-1] + 1)):
        return f"calls {indices[0] + 1}-{indices[-1] + 1} ({names})"
    return f"calls {', '.join(str(g + 1) for g in indices)} ({names})"


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
            theirs = f"your teammate makes {_part_text(other, task)}" if other else "your teammate makes none"
            intro = (
                "You and a teammate answer the user's request together by calling functions; the team's answer "
                f"is all the calls you both make. The request needs {n} function calls, in the order it asks for "
                f"them. You make {_part_text(mine, task) if mine else 'no call'}; {theirs}. Make only your part."
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
