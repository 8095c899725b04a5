"""Mutants of a canonical solution: small AST edits that a good test suite should catch.

Four operators, each a pure function ``source -> list[Mutant]`` (one mutant per site; nothing is run):

* :func:`off_by_one`: every integer constant ``c`` inside a function body becomes ``c + 1`` and ``c - 1``
  (``True`` / ``False`` are left alone);
* :func:`flip_comparison`: every comparison operator is flipped: ``<`` <-> ``<=``, ``>`` <-> ``>=``,
  ``==`` <-> ``!=``, ``in`` <-> ``not in``, ``is`` <-> ``is not``;
* :func:`swap_operator`: every arithmetic / boolean operator is swapped: ``+`` <-> ``-``, ``*`` <-> ``//``,
  ``/`` -> ``*``, ``%`` -> ``//``, ``**`` -> ``*``, ``and`` <-> ``or`` (``x += 1`` included);
* :func:`negate_condition`: the condition of every ``if`` / ``while`` / conditional expression / comprehension
  filter becomes ``not (...)``, and ``True`` <-> ``False`` (which covers ``sorted(..., reverse=True)``).

Only code inside function definitions is mutated (module-level constants, imports and docstrings are not).
A mutant's source is ``ast.unparse`` of the edited tree; it always parses and always differs from the
original's ``ast.unparse``. :func:`make_mutants` interleaves the operators (the first site of each, then
the second of each, ...) so that a small cap still mixes the kinds, and removes duplicates.

Whether a mutant can be told apart from the canonical solution at all is decided by running the hidden tests
(:mod:`comlrl.envs.coding.codetest` does, in the sandbox): one that passes all of them is *equivalent on the
hidden tests* and is dropped.

Where the edits find nothing (or only equivalent mutants), :func:`changed_result_program` gives a wrong version
that always differs: the canonical solution whose result is changed by :func:`changed_result` (a value of the same
type that is never equal to the right one), so a test that cannot fail on a plausible wrong function still passes on
it.
"""

from __future__ import annotations

import ast
import copy
import inspect
import itertools
from dataclasses import dataclass
from typing import Any, Callable, Iterator

from ...pyast import parse_quiet

OPERATORS = ("off_by_one", "flip_comparison", "swap_operator", "negate_condition")

FLIPPED_COMPARISONS: dict[type, type] = {
    ast.Lt: ast.LtE,
    ast.LtE: ast.Lt,
    ast.Gt: ast.GtE,
    ast.GtE: ast.Gt,
    ast.Eq: ast.NotEq,
    ast.NotEq: ast.Eq,
    ast.In: ast.NotIn,
    ast.NotIn: ast.In,
    ast.Is: ast.IsNot,
    ast.IsNot: ast.Is,
}
SWAPPED_OPERATORS: dict[type, type] = {
    ast.Add: ast.Sub,
    ast.Sub: ast.Add,
    ast.Mult: ast.FloorDiv,
    ast.FloorDiv: ast.Mult,
    ast.Div: ast.Mult,
    ast.Mod: ast.FloorDiv,
    ast.Pow: ast.Mult,
    ast.And: ast.Or,
    ast.Or: ast.And,
}
_SYMBOLS = {
    ast.Lt: "<",
    ast.LtE: "<=",
    ast.Gt: ">",
    ast.GtE: ">=",
    ast.Eq: "==",
    ast.NotEq: "!=",
    ast.In: "in",
    ast.NotIn: "not in",
    ast.Is: "is",
    ast.IsNot: "is not",
    ast.Add: "+",
    ast.Sub: "-",
    ast.Mult: "*",
    ast.FloorDiv: "//",
    ast.Div: "/",
    ast.Mod: "%",
    ast.Pow: "**",
    ast.And: "and",
    ast.Or: "or",
}


@dataclass(frozen=True)
class Mutant:
    """One mutated program."""

    operator: str  # one of OPERATORS
    description: str  # e.g. "line 3: 1 -> 2", "line 5: < -> <="
    source: str  # the whole mutated program (ast.unparse)


def _function_nodes(tree: ast.Module) -> Iterator[ast.AST]:
    """Every node inside a function body, in a fixed order (docstrings skipped)."""
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            if not isinstance(node, ast.Lambda):
                for default in [*node.args.defaults, *node.args.kw_defaults]:
                    if default is not None:
                        yield from _walk_no_functions(default)
            body = node.body if isinstance(node.body, list) else [node.body]
            for i, stmt in enumerate(body):
                if i == 0 and _is_docstring(stmt):
                    continue
                yield from _walk_no_functions(stmt)


def _walk_no_functions(node: ast.AST) -> Iterator[ast.AST]:
    """``ast.walk`` that does not descend into nested functions (they are visited on their own)."""
    todo = [node]
    while todo:
        current = todo.pop(0)
        yield current
        for child in ast.iter_child_nodes(current):
            if not isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)):
                todo.append(child)


def _is_docstring(stmt: ast.stmt) -> bool:
    return isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Constant) and isinstance(stmt.value.value, str)


def _is_int(node: ast.AST) -> bool:
    return isinstance(node, ast.Constant) and type(node.value) is int


# A site: (node predicate, list of edits); an edit mutates the node in place and returns a description.
Edit = Callable[[ast.AST], str]


def _constant_edits(node: ast.AST) -> list[Edit]:
    if not _is_int(node):
        return []

    def shift(delta: int) -> Edit:
        def edit(n: ast.AST) -> str:
            old = n.value
            n.value = old + delta
            return f"line {n.lineno}: {old} -> {old + delta}"

        return edit

    return [shift(+1), shift(-1)]


def _comparison_edits(node: ast.AST) -> list[Edit]:
    if not isinstance(node, ast.Compare):
        return []

    def flip(k: int) -> Edit:
        def edit(n: ast.AST) -> str:
            old = type(n.ops[k])
            n.ops[k] = FLIPPED_COMPARISONS[old]()
            return f"line {n.lineno}: {_SYMBOLS[old]} -> {_SYMBOLS[FLIPPED_COMPARISONS[old]]}"

        return edit

    return [flip(k) for k, op in enumerate(node.ops) if type(op) in FLIPPED_COMPARISONS]


def _operator_edits(node: ast.AST) -> list[Edit]:
    if not isinstance(node, (ast.BinOp, ast.AugAssign, ast.BoolOp)) or type(node.op) not in SWAPPED_OPERATORS:
        return []

    def edit(n: ast.AST) -> str:
        old = type(n.op)
        n.op = SWAPPED_OPERATORS[old]()
        return f"line {n.lineno}: {_SYMBOLS[old]} -> {_SYMBOLS[SWAPPED_OPERATORS[old]]}"

    return [edit]


def _condition_edits(node: ast.AST) -> list[Edit]:
    if isinstance(node, ast.Constant) and type(node.value) is bool:

        def flip_bool(n: ast.AST) -> str:
            n.value = not n.value
            return f"line {n.lineno}: {not n.value} -> {n.value}"

        return [flip_bool]
    if isinstance(node, (ast.If, ast.While, ast.IfExp)):

        def negate(n: ast.AST) -> str:
            n.test = ast.UnaryOp(op=ast.Not(), operand=n.test)
            return f"line {n.lineno}: condition negated"

        return [negate]
    if isinstance(node, ast.comprehension) and node.ifs:

        def negate_filter(k: int) -> Edit:
            def edit(n: ast.AST) -> str:
                line = getattr(n.ifs[k], "lineno", "?")
                n.ifs[k] = ast.UnaryOp(op=ast.Not(), operand=n.ifs[k])
                return f"line {line}: filter negated"

            return edit

        return [negate_filter(k) for k in range(len(node.ifs))]
    return []


_EDITS: dict[str, Callable[[ast.AST], list[Edit]]] = {
    "off_by_one": _constant_edits,
    "flip_comparison": _comparison_edits,
    "swap_operator": _operator_edits,
    "negate_condition": _condition_edits,
}


def _apply(source: str, operator: str) -> list[Mutant]:
    tree = parse_quiet(source)
    if tree is None:
        return []
    try:
        original = ast.unparse(tree)
    except (ValueError, RecursionError):
        return []
    find = _EDITS[operator]
    sites = [(i, k) for i, node in enumerate(_function_nodes(tree)) for k in range(len(find(node)))]
    out: list[Mutant] = []
    seen = {original}
    for i, k in sites:
        copy_tree = copy.deepcopy(tree)
        node = next(itertools.islice(_function_nodes(copy_tree), i, None))
        description = find(node)[k](node)
        try:
            mutated = ast.unparse(ast.fix_missing_locations(copy_tree))
        except (ValueError, RecursionError):
            continue
        if mutated in seen or parse_quiet(mutated) is None:
            continue
        seen.add(mutated)
        out.append(Mutant(operator, description, mutated))
    return out


def off_by_one(source: str) -> list[Mutant]:
    """One mutant per integer constant in a function body and direction: ``c`` -> ``c + 1``, ``c - 1``."""
    return _apply(source, "off_by_one")


def flip_comparison(source: str) -> list[Mutant]:
    """One mutant per comparison operator in a function body, flipped (``<`` -> ``<=``, ``==`` -> ``!=``, ...)."""
    return _apply(source, "flip_comparison")


def swap_operator(source: str) -> list[Mutant]:
    """One mutant per arithmetic / boolean operator in a function body, swapped (``+`` -> ``-``, ...)."""
    return _apply(source, "swap_operator")


def negate_condition(source: str) -> list[Mutant]:
    """One mutant per ``if`` / ``while`` / ``x if c else y`` / comprehension filter (negated) and per bool constant."""
    return _apply(source, "negate_condition")


def make_mutants(source: str, limit: int | None = None, operators: tuple[str, ...] = OPERATORS) -> list[Mutant]:
    """The mutants of ``source`` from ``operators``, interleaved (round robin), duplicates removed, at most ``limit``."""
    per_operator = [_apply(source, op) for op in operators]
    out: list[Mutant] = []
    seen: set[str] = set()
    for group in itertools.zip_longest(*per_operator):
        for mutant in group:
            if mutant is not None and mutant.source not in seen:
                seen.add(mutant.source)
                out.append(mutant)
                if limit is not None and len(out) >= limit:
                    return out
    return out


# --- the canonical solution with its result changed ---------------------------------------------------------

CHANGED_RESULT_VARIANTS = (0, 1)


def changed_result(value: Any, variant: int) -> Any:
    """A value of ``value``'s builtin type that is never equal to it. Variant 0 changes the end (``+ 1``, one more
    character or item, one more key), variant 1 everything (``- 1``, every character, item or value changed, one
    element fewer). Iterators are read and returned as an iterator of the changed items; ``None`` becomes ``0``
    (variant 0) or ``''`` (variant 1); any other object becomes ``None``."""
    # Self-contained (builtins only): its source also runs inside the sandbox, in the changed canonical solution.
    if isinstance(value, bool):
        return not value
    if isinstance(value, int):
        return value + 1 if variant == 0 else value - 1
    if isinstance(value, float):
        step = 1.0 if variant == 0 else -1.0
        for candidate in (value + step, 2.0 * value + step, 0.0, 1.0):
            if candidate != value:
                return candidate
    if isinstance(value, complex):
        return value + (1 if variant == 0 else 1j)
    if type(value) is str:
        if variant == 0 or not value:
            return value + "x"
        return "".join(chr(ord(c) ^ 1) for c in value)
    if type(value) is bytes:
        if variant == 0 or not value:
            return value + b"x"
        return bytes(b ^ 1 for b in value)
    if type(value) in (list, tuple):
        if variant == 0 or not value:
            extra = changed_result(value[-1], 0) if value else 0
            return value + type(value)([extra])
        return type(value)(changed_result(item, 1) for item in value)
    if type(value) is dict:
        if variant == 0 or not value:
            key = 0
            while key in value:
                key += 1
            return {**value, key: 0}
        return {k: changed_result(v, 1) for k, v in value.items()}
    if type(value) in (set, frozenset):
        if variant == 0 or not value:
            item = 0
            while item in value:
                item += 1
            return type(value)([*value, item])
        return type(value)(list(value)[1:])
    if value is None:
        return 0 if variant == 0 else ""
    if hasattr(type(value), "__next__"):
        return iter(changed_result(list(value), variant))
    return None


def changed_result_program(canonical_solution: str, entry_point: str, variant: int) -> str:
    """The canonical program whose entry point returns :func:`changed_result` of the right result (its own recursive
    calls get the right results: only the outermost call is changed)."""
    helper = inspect.getsource(changed_result).replace("changed_result", "_comlrl_changed_result")
    return (
        f"{canonical_solution.rstrip()}\n\n\n{helper}\n\n"
        f"_comlrl_canonical = {entry_point}\n"
        "_comlrl_depth = [0]\n\n\n"
        f"def {entry_point}(*args, **kwargs):\n"
        "    _comlrl_depth[0] += 1\n"
        "    try:\n"
        "        result = _comlrl_canonical(*args, **kwargs)\n"
        f"        return _comlrl_changed_result(result, {variant}) if _comlrl_depth[0] == 1 else result\n"
        "    finally:\n"
        "        _comlrl_depth[0] -= 1\n"
    )
