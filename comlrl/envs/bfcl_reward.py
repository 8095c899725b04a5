"""Reading a ``bfcl`` reply's function calls and judging a team's calls: the tiered reward of :mod:`.bfcl`.

:func:`parse_calls` reads the JSON list of calls in a reply; :func:`judge` assigns the team's calls to the needed
ones (:func:`best_assignment`, arguments checked by BFCL's checker in :mod:`.bfcl_checker`) and scores the reward
levels; :func:`feedback_text` says what is missing or wrong for the next turn. The levels and their weights are
described in the docstring of :mod:`.bfcl`.
"""

from __future__ import annotations

import functools
import json
import math
import re
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from .bfcl_checker import CallCheck, check_call
from .core.base import TeamReward

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
    """The calls of a reply; ``[]`` for an empty reply; None when it does not parse (docstring of :mod:`.bfcl`)."""
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


@dataclass(frozen=True, kw_only=True)
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
def _task(*, task_id: str, category: str, question: str, functions: str, ground_truth: str) -> BfclTask:
    needed = []
    for call in json.loads(ground_truth):
        [(name, possible)] = call.items()
        needed.append((name, possible))
    return BfclTask(
        id=task_id, category=category, question=question, functions=tuple(json.loads(functions)), needed=tuple(needed)
    )


def task_from_row(row: dict) -> BfclTask:
    """The task of a normalised row (``id``, ``category``, ``question``, ``functions``, ``ground_truth``)."""
    return _task(
        task_id=str(row.get("id", "")),
        category=str(row.get("category", "")),
        question=str(row["question"]),
        functions=row["functions"],
        ground_truth=row["ground_truth"],
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


@dataclass(kw_only=True)
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
    """Score one joint answer (docstring of :mod:`.bfcl`)."""
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
    return BfclJudgement(
        task=task,
        per_agent=per_agent,
        calls=calls,
        checks=checks,
        pairs=pairs,
        parts=parts,
        part_pairs=part_pairs,
        duplicates=duplicates,
        levels=levels,
        metrics=metrics,
    )


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


def part_text(indices: list[int], task: BfclTask) -> str:
    """Needed calls by position and function name: ``calls 1-2 (`f`, `f`)``."""
    names = ", ".join(f"`{task.needed[g][0]}`" for g in indices)
    if len(indices) == 1:
        return f"call {indices[0] + 1} ({names})"
    if indices == list(range(indices[0], indices[-1] + 1)):
        return f"calls {indices[0] + 1}-{indices[-1] + 1} ({names})"
    return f"calls {', '.join(str(g + 1) for g in indices)} ({names})"


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
            lines.append(f"- Missing from your part: {part_text(absent, j.task)}.")
        others = [p for a, p in enumerate(j.parts) if a != agent and p]
        theirs = f"; your teammate makes {part_text(others[0], j.task)}" if others else ""
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
    """The tiered function-calling reward (docstring of :mod:`.bfcl`)."""

    level_names = LEVELS
    max_reward = MAX_REWARD

    def judge(self, agent_completions: list[list[str]], rows: list[dict]) -> list[BfclJudgement]:
        return [judge(task_from_row(row), [c[j] for c in agent_completions]) for j, row in enumerate(rows)]

    def score_batch(self, agent_completions: list[list[str]], rows: list[dict]) -> list[dict[str, float]]:
        return [j.scores() for j in self.judge(agent_completions, rows)]
