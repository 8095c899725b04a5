"""The problems of the ``reasoning`` environment: reasoning-gym tasks and their settings, seeded splits that never
overlap, and the parts a problem splits into when its information is spread over the agents.

reasoning-gym (``pip install 'comlrl[reasoning]'``) generates item ``i`` of a dataset made with seed ``s`` from
``Random(s + i)``, so two seeds close together share items. The splits draw from seeds a billion apart (``train``:
``seed``, ``test``: ``seed + TEST_SEED_OFFSET``), and since a small problem space repeats questions under any seeds,
a ``train`` row whose question is a ``test`` question is dropped; no split holds a question twice (questions compare
case- and whitespace-insensitively).

Parts (``roles="split"``): a problem whose answer is a sum splits into contiguous parts, one per agent, whose values
add up to the answer: ``leg_counting``'s animals, and the signed terms of ``chain_sum`` and of ``basic_arithmetic``
expressions made only of sums and differences (unary minus and parentheses allowed: ``5 - (3 - 2)`` has the terms
5, -3, +2). A problem with fewer terms (animals) than agents, or with ``*`` or ``/``, has no parts and is skipped.
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import json
from dataclasses import dataclass
from fractions import Fraction
from typing import Any, Callable

from ..errors import suggest
from .core.loaders import DatasetError

TASKS = ("gsm_symbolic", "basic_arithmetic", "chain_sum", "leg_counting", "countdown")
#: Tasks whose problems split into parts that sum to the answer (``roles="split"``).
SPLIT_TASKS = ("basic_arithmetic", "chain_sum", "leg_counting")
SPLITS = ("train", "test")
TEST_SEED_OFFSET = 1_000_000_000
#: reasoning-gym settings the environment sets per split.
RESERVED = {"seed": "the env option seed", "size": "the env options train_size and test_size"}
#: ``roles="split"`` defaults: basic_arithmetic draws sums and differences only (a task_config entry overrides it).
SPLIT_DEFAULTS: dict[str, dict[str, Any]] = {"basic_arithmetic": {"operators": ("+", "-")}}
DRAWS_PER_ROW = 20  # items drawn per wanted row at most: filtered and repeated questions are skipped


def _gym() -> Any:
    try:
        import reasoning_gym
    except ImportError as exc:
        raise ImportError(
            "reasoning: the tasks come from the reasoning-gym package: pip install 'comlrl[reasoning]' "
            "(reasoning-gym==0.1.25)."
        ) from exc
    return reasoning_gym


def config_fields(task: str) -> dict[str, Any]:
    """The settings of ``task``'s reasoning-gym config and their defaults."""
    _gym()
    from reasoning_gym.factory import DATASETS

    _, config_cls = DATASETS[task]
    return {
        f.name: f.default if f.default is not dataclasses.MISSING else f.default_factory()  # type: ignore[misc]
        for f in dataclasses.fields(config_cls)
    }


def check_task_config(task: str, config: dict[str, Any] | None, *, split_mode: bool = False) -> dict[str, Any]:
    """``config`` with the split-mode defaults under it; a ValueError naming a field that is not one of ``task``'s
    settings (with the closest one), a reserved field, or a value reasoning-gym's checks refuse."""
    if config is not None and not isinstance(config, dict):
        raise ValueError(f"reasoning: task_config must be a dict of {task}'s settings, got {type(config).__name__}.")
    given = dict(config or {})
    fields = config_fields(task)
    for key in given:
        if key in RESERVED:
            raise ValueError(f"reasoning: task_config field '{key}' is set by {RESERVED[key]}, not task_config.")
        if key not in fields:
            hint = suggest(key, list(fields))
            settings = ", ".join(k for k in fields if k not in RESERVED)
            raise ValueError(
                f"reasoning: task_config field '{key}' is not a setting of {task}.{hint} Settings: {settings}."
            )
    out = {**(SPLIT_DEFAULTS.get(task, {}) if split_mode else {}), **given}
    create(task, out, seed=0, size=1)  # reasoning-gym's own checks, once, at make()
    return out


def create(task: str, config: dict[str, Any], *, seed: int, size: int) -> Any:
    """reasoning-gym's dataset of ``task``; its refusal of a setting as a ValueError naming the task."""
    gym = _gym()
    try:
        return gym.create_dataset(task, seed=seed, size=size, **config)
    except (AssertionError, TypeError, ValueError) as exc:
        raise ValueError(
            f"reasoning: reasoning-gym refuses task_config {config} for {task}: {exc or 'invalid'}."
        ) from exc


@functools.lru_cache(maxsize=None)
def score_fn(task: str) -> Callable[[str | None, dict], float]:
    """The package's verifier of ``task``: ``score(answer, entry) -> [0, 1]``."""
    return _gym().get_score_answer_fn(task)


# --- parts ---------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Part:
    """One agent's share of a problem: what it is shown and the value it should answer."""

    text: str
    value: Fraction


def signed_terms(expression: str) -> list[Fraction] | None:
    """The signed terms of a sum or difference of numbers (``"4 - 1 - 7"`` -> 4, -1, -7), or None for any other
    expression."""
    try:
        tree = ast.parse(expression.replace("−", "-"), mode="eval").body
    except SyntaxError:
        return None

    def terms(node: ast.AST) -> list[Fraction] | None:
        if isinstance(node, ast.Constant) and type(node.value) in (int, float):
            return [Fraction(str(node.value))]
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
            inner = terms(node.operand)
            return None if inner is None else [-t if isinstance(node.op, ast.USub) else t for t in inner]
        if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Add, ast.Sub)):
            left, right = terms(node.left), terms(node.right)
            if left is None or right is None:
                return None
            return left + ([-t for t in right] if isinstance(node.op, ast.Sub) else right)
        return None

    return terms(tree)


def number_text(value: Fraction) -> str:
    """``value`` as the verifiers read it: an integer when whole, else a decimal."""
    if value.denominator == 1:
        return str(value.numerator)
    return format(value.numerator / value.denominator, ".10g")


def terms_text(terms: list[Fraction]) -> str:
    """Signed terms as an expression: ``[4, -1]`` -> ``"4 - 1"``, ``[-7]`` -> ``"-7"``."""
    out = number_text(terms[0])
    for t in terms[1:]:
        out += f" - {number_text(-t)}" if t < 0 else f" + {number_text(t)}"
    return out


def chunks(items: list, n: int) -> list[list]:
    """``items`` in ``n`` contiguous chunks, the first ones one longer when they do not divide evenly."""
    size, extra = divmod(len(items), n)
    out, start = [], 0
    for k in range(n):
        end = start + size + (k < extra)
        out.append(items[start:end])
        start = end
    return out


def problem_parts(task: str, metadata: dict, answer: str, n: int) -> list[Part] | None:
    """The ``n`` parts of a problem (module docstring), or None when it has none: not a sum, fewer terms (animals)
    than agents, or parts that do not add up to ``answer``."""
    if task == "leg_counting":
        from reasoning_gym.arithmetic.leg_counting import ANIMALS

        animals = list(metadata.get("animals", {}).items())
        if len(animals) < n or any(a not in ANIMALS for a, _ in animals):
            return None
        parts = [
            Part(
                ", ".join(f"{count} {animal}{'s' if count > 1 else ''}" for animal, count in group),
                Fraction(sum(count * ANIMALS[animal] for animal, count in group)),
            )
            for group in chunks(animals, n)
        ]
    elif task in ("chain_sum", "basic_arithmetic"):
        terms = signed_terms(str(metadata.get("expression", "")))
        if terms is None or len(terms) < n:
            return None
        parts = [Part(terms_text(group), sum(group, Fraction(0))) for group in chunks(terms, n)]
    else:
        return None
    try:
        total = Fraction(answer.replace(",", ""))
    except (ValueError, ZeroDivisionError):
        return None
    return parts if sum((p.value for p in parts), Fraction(0)) == total else None


# --- rows and splits -----------------------------------------------------------------------------------------------


def question_key(question: str) -> str:
    return " ".join(question.lower().split())


def entry_of(row: dict) -> dict:
    """The reasoning-gym entry of a row (what its verifier reads)."""
    meta = row.get("metadata") or {}
    return {"question": row["question"], "answer": str(row["answer"]), "metadata": _metadata(meta)}


def _metadata(meta: str | dict) -> dict:
    return json.loads(meta) if isinstance(meta, str) else dict(meta)


def row_of(entry: dict, task: str, task_id: str) -> dict:
    """A dataset row: ``task_id``, ``task``, ``question``, ``answer`` and the entry's metadata as JSON text."""
    return {
        "task_id": task_id,
        "task": task,
        "question": entry["question"],
        "answer": str(entry["answer"]),
        "metadata": json.dumps(entry["metadata"], default=str),
    }


def splittable(task: str, parts: int | None) -> Callable[[dict], bool]:
    """Whether an entry is kept: always, or (``parts``) when it splits into that many parts."""
    if parts is None:
        return lambda entry: True
    return lambda entry: problem_parts(task, entry["metadata"], str(entry["answer"]), parts) is not None


@functools.lru_cache(maxsize=32)
def _split_rows(task: str, config_json: str, split: str, seed: int, size: int, want: int, parts: int | None,
                exclude_size: int) -> tuple[dict, ...]:  # fmt: skip
    config = json.loads(config_json)
    exclude: set[str] = set()
    if split == "train":
        test = _split_rows(task, config_json, "test", seed, exclude_size, exclude_size, parts, 0)
        exclude = {question_key(r["question"]) for r in test}
    first = seed + (TEST_SEED_OFFSET if split == "test" else 0)
    ds = create(task, config, seed=first, size=size * DRAWS_PER_ROW)
    keep = splittable(task, parts)
    rows: list[dict] = []
    for i in range(len(ds)):
        if len(rows) == want:
            break
        entry = ds[i]
        key = question_key(entry["question"])
        if key in exclude or not keep(entry):
            continue
        exclude.add(key)
        rows.append(row_of(entry, task, f"{task}/{split}/{i}"))
    if len(rows) < want:
        needs = f" that split into {parts} parts" if parts else ""
        raise DatasetError(
            f"reasoning: {task} gave {len(rows)} distinct {split} questions{needs} in {len(ds)} draws, "
            f"{want} wanted; widen task_config {config} or lower train_size / test_size."
        )
    return tuple(rows)


def split_rows(
    task: str,
    config: dict[str, Any],
    *,
    split: str,
    seed: int,
    sizes: dict[str, int],
    limit: int | None = None,
    parts: int | None = None,
) -> list[dict]:
    """The first ``limit`` rows (all: ``sizes[split]``) of ``split``, deterministic in (task, config, seed, sizes,
    parts); ``train`` never holds a ``test`` question (module docstring)."""
    if split not in SPLITS:
        raise DatasetError(f"reasoning: unknown split '{split}'; choose one of {', '.join(SPLITS)}.")
    size = sizes[split]
    want = size if limit is None else min(limit, size)
    config_json = json.dumps(config, sort_keys=True, default=list)
    return [dict(r) for r in _split_rows(task, config_json, split, seed, size, want, parts, sizes["test"])]
