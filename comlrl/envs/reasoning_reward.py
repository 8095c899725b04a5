"""Reading and scoring the ``reasoning`` environment's answers: the ``Answer:`` line, the work lines, the team reward.

An answer is the reply's last non-empty line, ``Answer: <value>`` (``answer`` in any case, markdown ``*``, ``_``,
backticks around it allowed). It counts when the reply has exactly one such line and the value parses: a number
(``-4``, ``1,234``, ``3.5``; a trailing period, ``$`` and markdown marks are dropped) or, for countdown, an arithmetic
expression of numbers, ``+ - * /`` and parentheses (only such text reaches the package's verifier).

A work line (the solver's, in solver_verifier) is a line before the Answer line holding a true equation
``e1 = e2 [= ...]`` with an operation in it, that uses a number of the question as an operand and whose value is not
a number of the question: ``35 × 3 = 105`` on a question with 35 and 3. Each side is read after dropping words, a
label up to a colon and a list marker (``-``, ``*``, ``•``, ``1.``); ``×``/``x``/``·`` multiply and ``÷`` divides.
The question's numbers echoed (``12, 7, 3`` or ``12 + 7 + 3``), an identity (``12 + 0 = 12``) or a false equation are
not work.
"""

from __future__ import annotations

import ast
import itertools
import re
from dataclasses import dataclass
from fractions import Fraction

from .core.base import TeamReward
from .reasoning_tasks import Part, entry_of, number_text, problem_parts, score_fn

ANSWER_LINE = re.compile(r"^[\s*_`#>-]*answer[\s*_`]*:(.*)$", re.IGNORECASE)
NUMBER = re.compile(r"[+-]?(?:\d+|\d{1,3}(?:,\d{3})+)(?:\.\d+)?")
NUMBER_IN_TEXT = re.compile(r"(?<![\d.,])-?\d+(?:,\d{3})*(?:\.\d+)?")
ARITHMETIC = re.compile(r"[\d\s.+\-*/()]+")
MAX_EXPRESSION = 200  # characters: longer expressions are not evaluated
_BULLET = re.compile(r"^\s*(?:[•*]|\d+[.)]|-(?=\s))\s*")
_TIMES = re.compile(r"(?<=\d)\s*[xX]\s*(?=\d)")
_THOUSANDS = re.compile(r"(?<=\d),(?=\d{3}(?!\d))")
_WORD = re.compile(r"[^\W\d_][\w'’]*")

WEIGHTS = {"level/format": 0.2, "level/part": 0.4, "level/work": 0.2, "level/correct": 1.0}


# --- reading -------------------------------------------------------------------------------------------------------


def evaluate(expression: str) -> Fraction | None:
    """The exact value of an expression of numbers, ``+ - * /``, unary signs and parentheses; None otherwise
    (other characters or operators, division by zero, over ``MAX_EXPRESSION`` characters)."""
    text = expression.strip()
    if not text or len(text) > MAX_EXPRESSION or not ARITHMETIC.fullmatch(text):
        return None
    try:
        tree = ast.parse(text, mode="eval").body
    except SyntaxError:
        return None
    return _value(tree)


def _value(node: ast.AST) -> Fraction | None:
    if isinstance(node, ast.Constant) and type(node.value) in (int, float):
        return Fraction(str(node.value))
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        inner = _value(node.operand)
        return None if inner is None else (-inner if isinstance(node.op, ast.USub) else inner)
    if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Add, ast.Sub, ast.Mult, ast.Div)):
        left, right = _value(node.left), _value(node.right)
        if left is None or right is None or (isinstance(node.op, ast.Div) and right == 0):
            return None
        ops = {ast.Add: left.__add__, ast.Sub: left.__sub__, ast.Mult: left.__mul__, ast.Div: left.__truediv__}
        return ops[type(node.op)](right)
    return None


def parse_value(text: str, task: str) -> str | None:
    """An Answer line's value as the verifier gets it (a number normalised: ``4.0`` -> ``4``, ``1,234`` -> ``1234``;
    a countdown expression with its spaces collapsed), or None when it does not parse."""
    value = text.strip().strip("*_`").strip().removeprefix("$").rstrip(".").strip()
    if task == "countdown":
        return " ".join(value.split()) if evaluate(value) is not None else None
    if not NUMBER.fullmatch(value):
        return None
    return number_text(Fraction(value.replace(",", "")))


@dataclass(frozen=True, kw_only=True)
class Reply:
    """One agent's reply as read: its Answer lines, the value (None unless it counts), the text before it."""

    answer_lines: int
    value: str | None
    before: str

    @property
    def answered(self) -> bool:
        return self.value is not None


def read_reply(text: str, task: str) -> Reply:
    """The reply's answer (module docstring): a value only when there is exactly one Answer line, it is the last
    non-empty line and its value parses."""
    lines = text.strip().splitlines()
    found = [i for i, line in enumerate(lines) if ANSWER_LINE.match(line)]
    if not found:
        return Reply(answer_lines=0, value=None, before=text)
    last = found[-1]
    before = "\n".join(lines[:last])
    value = None
    if len(found) == 1 and last == len(lines) - 1:
        value = parse_value(ANSWER_LINE.match(lines[last]).group(1), task)
    return Reply(answer_lines=len(found), value=value, before=before)


def question_numbers(text: str) -> set[Fraction]:
    """The numbers written in ``text``, signed where a minus sign is attached (``2 - -1``: 2 and -1)."""
    return {Fraction(m.replace(",", "")) for m in NUMBER_IN_TEXT.findall(text)}


def _side(text: str) -> str:
    text = text.rsplit(":", 1)[-1].replace("−", "-").replace("×", "*").replace("·", "*").replace("÷", "/")
    text = _THOUSANDS.sub("", _TIMES.sub(" * ", text.replace("$", "")))
    return " ".join(_WORD.sub(" ", text).split())


def is_work_line(line: str, numbers: set[Fraction]) -> bool:
    """Whether ``line`` is a work line (module docstring) for a question with ``numbers``."""
    sides = [_side(s) for s in _BULLET.sub("", line, count=1).split("=")]
    if len(sides) < 2:
        return False
    values, operands = [], []
    for side in sides:
        value = evaluate(side)
        if value is None:
            return False
        values.append(value)
        tree = ast.parse(side, mode="eval").body
        if any(isinstance(n, ast.BinOp) for n in ast.walk(tree)):
            operands += [abs(Fraction(str(n.value))) for n in ast.walk(tree) if isinstance(n, ast.Constant)]
    if not operands or len(set(values)) != 1:
        return False
    known = {abs(n) for n in numbers}
    return values[-1] not in numbers and any(op in known for op in operands)


def has_work(reply: Reply, question: str) -> bool:
    """At least one work line before the Answer line."""
    numbers = question_numbers(question)
    return any(is_work_line(line, numbers) for line in reply.before.splitlines())


# --- the team reward -----------------------------------------------------------------------------------------------


def subset_sums(values: list[Fraction], agent: int) -> set[Fraction]:
    """The totals of every set of parts that holds another agent's part (what answering a teammate's share, or the
    whole problem, gives)."""
    n = len(values)
    out = set()
    for size in range(1, n + 1):
        for group in itertools.combinations(range(n), size):
            if group != (agent,):
                out.add(sum((values[k] for k in group), Fraction(0)))
    return out


class ReasoningReward(TeamReward):
    """The team reward of the ``reasoning`` environment (the levels in :mod:`comlrl.envs.reasoning`)."""

    def __init__(self, num_agents: int, name: str, *, task: str, roles: str, partial_credit: bool = False) -> None:
        super().__init__(num_agents, name)
        self.task, self.roles, self.partial_credit = task, roles, partial_credit
        self.work = roles == "solver_verifier"
        self.split = roles == "split" and num_agents > 1
        middle = ("level/work",) if self.work else ("level/part",) if self.split else ()
        self.level_names = ("level/format", *middle, "level/correct")
        self.max_reward = sum(WEIGHTS[k] for k in self.level_names)

    def package_score(self, value: str | None, entry: dict) -> float:
        """The package's verifier on ``value`` (0 for no value)."""
        return 0.0 if value is None else float(score_fn(self.task)(value, entry))

    def verify(self, value: str | None, entry: dict) -> float:
        """``level/correct`` of ``value``: the package's score, or (without ``partial_credit``) 1 for a full score
        and 0 otherwise."""
        score = self.package_score(value, entry)
        return score if self.partial_credit else float(score >= 1.0)

    def score_batch(self, agent_completions: list[list[str]], rows: list[dict]) -> list[dict[str, float]]:
        return [self.score_one([c[j] for c in agent_completions], row) for j, row in enumerate(rows)]

    def score_one(self, texts: list[str], row: dict) -> dict[str, float]:
        """One joint answer's score dict (``reward``, the levels, the metrics)."""
        entry = entry_of(row)
        replies = [read_reply(t, self.task) for t in texts]
        parts = problem_parts(self.task, entry["metadata"], entry["answer"], self.num_agents) if self.split else None
        if self.split and parts is None:
            raise ValueError(f"reasoning: row {row.get('task_id', '?')} does not split into {self.num_agents} parts.")
        levels = {k: 0.0 for k in self.level_names}
        levels["level/format"] = sum(r.answered for r in replies) / len(replies)
        gate = all(r.answered for r in replies)
        metrics: dict[str, float]
        if parts is not None:
            final, broken, metrics = self._split(replies, parts)
            levels["level/part"] = metrics["metric/parts_correct"]
        else:
            final, broken, metrics = self._roles(replies, entry)
        if gate:
            if self.work:
                levels["level/work"] = float(has_work(replies[0], entry["question"]))
            levels["level/correct"] = 0.0 if broken else self.verify(final, entry)
        accuracy = float(gate and not broken and self.package_score(final, entry) >= 1.0)
        reward = sum(WEIGHTS[k] * v for k, v in levels.items())
        return {"reward": reward, **levels, "metric/accuracy": accuracy, **metrics}

    def _split(self, replies: list[Reply], parts: list[Part]) -> tuple[str | None, bool, dict[str, float]]:
        values = [p.value for p in parts]
        answers = [None if r.value is None else Fraction(r.value) for r in replies]
        own = [a is not None and a == v for a, v in zip(answers, values)]
        broken = any(a is not None and a != values[i] and a in subset_sums(values, i) for i, a in enumerate(answers))
        final = None if any(a is None for a in answers) else number_text(sum(answers, Fraction(0)))
        metrics = {f"metric/part_{i + 1}_correct": float(ok) for i, ok in enumerate(own)}
        metrics["metric/parts_correct"] = sum(own) / len(own)
        metrics["metric/labour_broken"] = float(broken)
        return final, broken, metrics

    def _roles(self, replies: list[Reply], entry: dict) -> tuple[str | None, bool, dict[str, float]]:
        if len(replies) == 1:
            return replies[0].value, False, {}
        solver, verifier = (float(self.package_score(r.value, entry) >= 1.0) for r in replies)
        agree = replies[0].answered and replies[0].value == replies[1].value
        metrics = {
            "metric/solver_accuracy": solver,
            "metric/verifier_accuracy": verifier,
            "metric/agreement": float(agree),
            "metric/verifier_fixed": float(verifier and not solver),
            "metric/verifier_broke": float(solver and not verifier),
        }
        return replies[1].value, False, metrics
