"""codetest's static side: a tester's answer -> assert statements, the problem's hidden asserts, the foils, and
per-test views of sandbox results (nothing here runs a program; see :mod:`comlrl.envs.coding.codetest`)."""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from typing import Any

from ...pyast import parse_quiet
from ...sandbox import needs_interpreter
from .clean import normalize_text
from .mutants import CHANGED_RESULT_VARIANTS, changed_result_program
from .tasks import CodeTask

_FORBIDDEN_NAMES = frozenset(
    {"exec", "eval", "compile", "globals", "locals", "vars", "getattr", "setattr", "delattr", "open", "breakpoint"}
)
_FENCE_LINE = re.compile(r"^\s*(```|~~~)")
_TRIPLE_QUOTED = re.compile(r"(\"\"\"|\'\'\')(.*?)\1", re.S)
_MAX_ASSERT_LINES = 8  # lines an unparsable answer's multi-line assert may span


# --- agent 2's answer -> assert statements --------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class AssertSet:
    """The asserts parsed from a tester's answer."""

    tests: tuple[str, ...]  # counted asserts (normalised source, message dropped), in order
    found: int = 0  # assert statements found
    duplicates: int = 0  # repeats of an earlier condition
    not_calling: int = 0  # do not call the entry point
    rejected: int = 0  # rebind names or reach into internals
    truncated: int = 0  # counted ones beyond the cap
    interpreter: int = 0  # would need the program's interpreter (mock, patch, seeds, ...): never run


def _calls(node: ast.AST, name: str) -> bool:
    return any(isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id == name for n in ast.walk(node))


def _unsafe(node: ast.AST) -> bool:
    for n in ast.walk(node):
        if isinstance(n, ast.NamedExpr):
            return True
        if isinstance(n, ast.Name) and (n.id in _FORBIDDEN_NAMES or n.id.startswith("__")):  # __builtins__ too
            return True
        if isinstance(n, ast.Attribute) and n.attr.startswith("__"):
            return True
    return False


def _asserts_in(text: str) -> list[ast.Assert]:
    """Assert statements of ``text`` (markdown fence lines removed, so asserts after a fenced block count too):
    every one in the tree when the rest parses, else line by line (an assert may span a few lines; lines inside
    triple-quoted strings, such as a docstring's example, are skipped)."""
    code = "\n".join("" if _FENCE_LINE.match(line) else line for line in text.split("\n"))
    tree = parse_quiet(code)
    if tree is not None:
        return [n for n in ast.walk(tree) if isinstance(n, ast.Assert)]
    # An assert inside a (doc)string is an example, not a test: blank closed triple-quoted strings first.
    code = _TRIPLE_QUOTED.sub(lambda m: "\n" * m.group(0).count("\n"), code)
    lines, out, i = code.split("\n"), [], 0
    while i < len(lines):
        stripped = lines[i].strip()
        if not (stripped.startswith("assert ") or stripped.startswith("assert(")):
            i += 1
            continue
        for span in range(1, _MAX_ASSERT_LINES + 1):
            chunk = "\n".join(ln.strip() if k == 0 else ln for k, ln in enumerate(lines[i : i + span]))
            parsed = parse_quiet(chunk)
            if parsed is not None and len(parsed.body) == 1 and isinstance(parsed.body[0], ast.Assert):
                out.append(parsed.body[0])
                i += span
                break
        else:
            i += 1
    return out


def extract_asserts(text: str, entry_point: str, limit: int = 10) -> AssertSet:
    """The counted asserts in a tester's answer (module docstring): parsed, never run."""
    found = _asserts_in(normalize_text(text))
    tests: list[str] = []
    seen: set[str] = set()
    duplicates = not_calling = rejected = truncated = interpreter = 0
    for node in found:
        if not _calls(node.test, entry_point):
            not_calling += 1
            continue
        if _unsafe(node.test):
            rejected += 1
            continue
        if needs_interpreter([ast.unparse(node)], "") is not None:
            interpreter += 1
            continue
        key = ast.dump(node.test)
        if key in seen:
            duplicates += 1
            continue
        seen.add(key)
        if len(tests) >= limit:
            truncated += 1
            continue
        try:
            tests.append(ast.unparse(ast.Assert(test=node.test, msg=None)))
        except (ValueError, RecursionError):
            rejected += 1
    return AssertSet(
        tests=tuple(tests),
        found=len(found),
        duplicates=duplicates,
        not_calling=not_calling,
        rejected=rejected,
        truncated=truncated,
        interpreter=interpreter,
    )


def hidden_assert_indices(task: CodeTask, limit: int = 10) -> list[int]:
    """Positions in ``task.tests`` of the single ``assert`` statements calling the entry point (first ``limit``)."""
    out = []
    for i, test in enumerate(task.tests):
        tree = parse_quiet(test)
        if tree is not None and len(tree.body) == 1 and isinstance(tree.body[0], ast.Assert):
            if _calls(tree.body[0].test, task.entry_point):
                out.append(i)
    return out[:limit]


def hidden_asserts(task: CodeTask, limit: int = 10) -> tuple[str, ...]:
    """The problem's hidden tests that are single ``assert`` statements calling the entry point (first ``limit``).

    These filter the mutants, and written out they are the oracle tester's answer."""
    return tuple(task.tests[i].strip() for i in hidden_assert_indices(task, limit))


@dataclass(frozen=True, kw_only=True)
class Foil:
    """A wrong function with the problem's name: one that returns a fixed kind of value whatever it is given, or
    the canonical solution with its result changed (``changed``: it returns values of the right type, never the
    right one)."""

    name: str
    source: str
    description: str
    changed: bool = False


FOIL_RETURNS = (
    ("returns_none", "None", "a function that always returns None"),
    ("returns_zero", "0", "a function that always returns 0"),
    ("returns_empty_string", "''", "a function that always returns ''"),
    ("returns_first_argument", "args[0] if args else None", "a function that returns its first argument"),
)
CHANGED_RESULTS = (
    ("result_extended", "a version whose result has one item (or 1) too many"),
    ("result_changed", "a version whose result has every item changed"),
)


def make_foils(entry_point: str, canonical_solution: str = "") -> tuple[Foil, ...]:
    """The foils of a problem (``FOIL_RETURNS``, and with a canonical solution ``CHANGED_RESULTS``: it with its result
    changed by :func:`~comlrl.envs.coding.mutants.changed_result`): they judge where no mutant is left, and an assert
    that no wrong function fails does not depend on the function at all."""
    stubs = tuple(
        Foil(name=name, source=f"def {entry_point}(*args, **kwargs):\n    return {value}\n", description=description)
        for name, value, description in FOIL_RETURNS
    )
    if not canonical_solution.strip():
        return stubs
    changed = tuple(
        Foil(
            name=name,
            source=changed_result_program(canonical_solution, entry_point, variant),
            description=description,
            changed=True,
        )
        for variant, (name, description) in zip(CHANGED_RESULT_VARIANTS, CHANGED_RESULTS)
    )
    return stubs + changed


_ALWAYS_TRUE_ON_ITSELF = (ast.Eq, ast.Is, ast.LtE, ast.GtE)
_ALWAYS_FALSE_ON_ITSELF = (ast.NotEq, ast.IsNot, ast.Lt, ast.Gt)


def self_compared(test: str) -> bool:
    """The assert's verdict is fixed by comparing an expression with itself (``f(x) == f(x)``,
    ``f(x)[0] != f(x)[0]``, ``f(1) == 2 or f(x) == f(x)``): it cannot depend on what the function returns."""
    tree = parse_quiet(test)
    if tree is None or len(tree.body) != 1 or not isinstance(tree.body[0], ast.Assert):
        return False
    return _fixed_truth(tree.body[0].test) is not None


def _fixed_truth(node: ast.expr) -> bool | None:
    """True / False when self-comparisons alone decide ``node``, else None."""
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
        inner = _fixed_truth(node.operand)
        return None if inner is None else not inner
    if isinstance(node, ast.BoolOp):
        parts = [_fixed_truth(v) for v in node.values]
        decisive = isinstance(node.op, ast.Or)  # True decides an `or`, False an `and`
        if decisive in parts:
            return decisive
        return (not decisive) if all(p is not None for p in parts) else None
    if not isinstance(node, ast.Compare) or len({ast.dump(o) for o in [node.left, *node.comparators]}) != 1:
        return None
    if all(isinstance(op, _ALWAYS_TRUE_ON_ITSELF) for op in node.ops):
        return True
    return False if any(isinstance(op, _ALWAYS_FALSE_ON_ITSELF) for op in node.ops) else None


# --- sandbox results ------------------------------------------------------------------------------------


def _per_test(result: Any, n: int, field: str, missing: str) -> list[str]:
    """``field`` of each of the n requested tests, by the index in its name ('assert <i>'), else by position."""
    out = [missing] * n
    if result is None:
        return out
    for position, outcome in enumerate(result.tests):
        parts = outcome.name.split()
        index = int(parts[-1]) if len(parts) == 2 and parts[0] == "assert" and parts[-1].isdigit() else position
        if 0 <= index < n:
            out[index] = getattr(outcome, field) or ""
    return out


def shared_reasons(result: Any, n: int) -> list[str]:
    """Per-test reason why it needed the program's interpreter ('' when it did not; strict verdict)."""
    return _per_test(result, n, "shared_reason", "")


def statuses(result: Any, n: int) -> list[str]:
    """Per-test status ('passed', 'failed', 'error', 'timeout', or 'missing' when it never reported)."""
    return _per_test(result, n, "status", "missing")


def messages(result: Any, n: int) -> list[str]:
    """Per-test failure message ('' when it passed or never reported)."""
    return _per_test(result, n, "message", "")


def classify_mutant(result: Any, n: int) -> str:
    """'kept', 'equivalent', 'trivial' or 'dropped' from a mutant's run against ``n`` hidden asserts."""
    status = statuses(result, n)
    if result is None or result.status != "ok" or "missing" in status or "timeout" in status:
        return "dropped"
    if all(s == "passed" for s in status):
        return "equivalent"
    if all(s == "error" for s in status):
        return "trivial"
    return "kept"
