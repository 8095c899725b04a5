"""Code-generation problems in one schema, from HumanEval, CoopHumanEval and MBPP rows.

Normalised row (what ``load_dataset`` returns for ``humaneval``, ``coophumaneval`` and ``mbpp``)::

    task_id: str              prompt: str (signature + docstring shown to the agents)
    entry_point: str          test: str (HumanEval-style ``def check(candidate)`` code, or '')
    test_list: list[str]      test_setup_code: str (MBPP asserts and their setup; [] / '' for HumanEval)
    canonical_solution: str   the whole canonical program: prompt + HumanEval's ``canonical_solution`` body, or
                              MBPP's ``code`` ('' when unknown)

:func:`task_from_row` turns a normalised *or raw* row into a :class:`CodeTask` with individual tests:
HumanEval's ``check(candidate)`` body is split into its assert statements (``candidate`` renamed to
the entry point) so that "fraction of tests passed" is meaningful; statements that contain an assert
(a loop of asserts, say) stay whole as one test; statements without one (``import math``, helper
variables) become setup code run before the tests. When no assert can be split out, the whole check
runs as a single test ``check(<entry point>)``.

A row whose solution is under ``reference`` and not ``canonical_solution`` is refused by name
(:func:`check_solution_field`): the field is ``canonical_solution``.
"""

from __future__ import annotations

import ast
import builtins
import functools
import re
import textwrap
from dataclasses import dataclass

from ...errors import ComlrlError
from ...pyast import parse_quiet
from ..core.loaders import DatasetError

_CHECK_NAME = "check"
_BUILTINS = frozenset(dir(builtins))


@dataclass(frozen=True, kw_only=True)
class CodeTask:
    """One problem, ready to assemble and test a team program."""

    task_id: str
    prompt: str
    entry_point: str
    tests: tuple[str, ...]  # statements; each one test (run after the program and the setup)
    setup: str  # code run after the program, before the tests
    context: str  # code from the prompt that the program needs (imports, given helper functions)
    signature: str  # "def entry(args):" of the entry point ('' when unknown)
    canonical_solution: str  # the whole canonical program ('' when unknown)
    split: bool  # tests were split into individual statements


_SOLUTION_FIELDS = {  # kind of row -> what its canonical_solution holds, and the benchmark's own name for it
    "code": "the body after the prompt as in HumanEval, or the whole program; MBPP rows may give it as `code`",
    "classeval": "the whole class; ClassEval rows may give it as `solution_code`",
}


def check_solution_field(row: dict, kind: str, index: int | None = None) -> None:
    """Refuse a ``kind`` row (``code``, ``classeval``) that gives its solution as ``reference``: the field is
    ``canonical_solution``. ``index`` (the row's number in its file) names a row without a ``task_id``."""
    if "reference" in row and "canonical_solution" not in row:
        name = row.get("task_id", index if index is not None else "?")
        raise DatasetError(
            f"{kind} row {name!r} has a 'reference' field and no 'canonical_solution': the canonical solution's "
            f"field is `canonical_solution` ({_SOLUTION_FIELDS[kind]}); rename it."
        )


# --- HumanEval --------------------------------------------------------------------------------------


class _Rename(ast.NodeTransformer):
    def __init__(self, old: str, new: str) -> None:
        self.old, self.new = old, new

    def visit_Name(self, node: ast.Name) -> ast.Name:  # noqa: N802 - ast API
        if node.id == self.old:
            node.id = self.new
        return node


def _segment(lines: list[str], node: ast.stmt) -> str:
    first = node.decorator_list[0].lineno if getattr(node, "decorator_list", None) else node.lineno
    return textwrap.dedent("\n".join(lines[first - 1 : node.end_lineno]))


def _renamed(source: str, old: str, new: str) -> str:
    """``source`` with the variable ``old`` renamed to ``new`` (AST-based, strings are untouched)."""
    if old == new or not re.search(rf"\b{re.escape(old)}\b", source):
        return source
    tree = parse_quiet(source)
    if tree is None:
        return re.sub(rf"\b{re.escape(old)}\b", new, source)
    return ast.unparse(_Rename(old, new).visit(tree))


def _references(node: ast.AST, name: str) -> bool:
    return any(isinstance(n, ast.Name) and n.id == name for n in ast.walk(node))


def split_check_tests(test_code: str, entry_point: str) -> tuple[tuple[str, ...], str, bool]:
    """Split a HumanEval ``check(candidate)`` test into ``(tests, setup, split_ok)``; see module docstring."""
    fallback = ((f"{_CHECK_NAME}({entry_point})",), test_code, False)
    tree = parse_quiet(test_code)
    if tree is None:
        return fallback
    lines = test_code.split("\n")
    checks = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == _CHECK_NAME and n.args.args]
    if len(checks) != 1:
        return fallback
    check = checks[0]
    arg = check.args.args[0].arg
    setup = [_segment(lines, n) for n in tree.body if n is not check]
    tests = []
    try:
        for stmt in check.body:
            source = _renamed(_segment(lines, stmt), arg, entry_point)
            has_assert = any(isinstance(n, ast.Assert) for n in ast.walk(stmt))
            if not has_assert:
                setup.append(source)
            elif _references(stmt, arg):
                tests.append(source)
            # an assert that never calls the candidate (``assert True``) tests nothing: skipped
    except (SyntaxError, ValueError, RecursionError):
        return fallback
    if not tests:
        return fallback
    return tuple(tests), "\n".join(setup), True


def prompt_context(prompt: str, entry_point: str) -> str:
    """The code in a HumanEval prompt that the program needs: everything but the entry-point stub.

    Imports, constants and given helper functions (HumanEval/32 gives ``poly``). When the prompt does
    not parse, its import lines only.
    """
    tree = parse_quiet(prompt)
    if tree is None:
        imports = re.compile(r"^\s*(import\s|from\s+\S+\s+import\s)")
        return "\n".join(ln.strip() for ln in prompt.split("\n") if imports.match(ln))
    lines = prompt.split("\n")
    keep = [
        _segment(lines, n)
        for n in tree.body
        if not (isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.name == entry_point)
        and not (isinstance(n, ast.Expr) and isinstance(n.value, ast.Constant))  # module docstrings
    ]
    return "\n\n".join(keep)


def signature_of(code: str, name: str) -> str:
    """The ``def name(...):`` line(s) of function ``name`` in ``code`` ('' when not found)."""
    tree = parse_quiet(code)
    if tree is None:
        match = re.search(rf"^[ \t]*(async\s+)?def\s+{re.escape(name)}\s*\(.*?\)\s*(->\s*[^:\n]+)?:", code, re.M | re.S)
        return textwrap.dedent(match.group(0)) if match else ""
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == name:
            stub = ast.FunctionDef(
                name=node.name, args=node.args, body=[ast.Pass()], decorator_list=[], returns=node.returns
            )
            stub.type_params = []  # Python >= 3.12 unparses it
            return ast.unparse(ast.fix_missing_locations(stub)).split("\n")[0]
    return ""


# --- MBPP ---------------------------------------------------------------------------------------------


def mbpp_entry_point(code: str, tests: list[str]) -> str:
    """The function the MBPP tests call: the first called name that ``code`` defines (else the first call)."""
    tree = parse_quiet(code)
    if tree is not None:
        defined = {n.name for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}
    else:
        defined = set(re.findall(r"^\s*def\s+(\w+)", code, re.M))
    calls: list[str] = []
    for test in tests:
        test_tree = parse_quiet(test)
        if test_tree is not None:
            calls += [
                n.func.id for n in ast.walk(test_tree) if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)
            ]
        else:
            calls += re.findall(r"(\w+)\s*\(", test)
    for name in calls:
        if name in defined:
            return name
    return next((c for c in calls if c not in _BUILTINS), calls[0] if calls else "")


def mbpp_prompt(text: str, signature: str, tests: list[str]) -> str:
    """A HumanEval-style problem for an MBPP task: the signature and a docstring with the example tests."""
    signature = signature or "def solution(*args):"
    examples = "\n".join(f"    {t.strip()}" for t in tests)
    doc = text.strip().replace('"""', "'''")
    return f'{signature}\n    """{doc}\n\n    Your code should pass these tests:\n{examples}\n    """\n'


def normalize_mbpp(row: dict, index: int) -> dict:
    """A raw MBPP row (``text``/``prompt``, ``code``, ``test_list``, ...) in the common code schema."""
    check_solution_field(row, "code", index)
    tests = [str(t) for t in row["test_list"]]
    code = str(row.get("code") or "").replace("\r\n", "\n")
    entry = str(row.get("entry_point") or mbpp_entry_point(code, tests))
    if not entry:
        raise ValueError("cannot tell which function the tests call (no entry_point and no call in test_list)")
    text = str(row.get("text") if row.get("text") is not None else row.get("prompt"))
    return {
        "task_id": str(row.get("task_id", index)),
        "prompt": mbpp_prompt(text, signature_of(code, entry) if code else "", tests),
        "entry_point": entry,
        "test": "",
        "test_list": tests,
        "test_setup_code": str(row.get("test_setup_code") or ""),
        "canonical_solution": code,
    }


def normalize_humaneval_row(row: dict, index: int) -> dict:
    """A HumanEval-format row (``prompt``, ``test``, ``entry_point``, optional ``canonical_solution``: the body after
    the prompt, or the whole program as a normalised row carries it)."""
    check_solution_field(row, "code", index)
    prompt, canonical = str(row["prompt"]), str(row.get("canonical_solution") or "")
    return {
        "task_id": str(row.get("task_id", index)),
        "prompt": prompt,
        "entry_point": str(row["entry_point"]).strip(),
        "test": str(row["test"]),
        "test_list": [],
        "test_setup_code": "",
        "canonical_solution": _whole_program(prompt, canonical),
    }


def _whole_program(prompt: str, canonical: str) -> str:
    # a normalised row already holds prompt + body: prepending the prompt again would define the function twice
    if not canonical or canonical.startswith(prompt):
        return canonical
    return prompt + canonical


def normalize_code_row(row: dict, index: int = 0) -> dict:
    """Either format (HumanEval-style or MBPP-style) in the common schema; already-normalised rows pass."""
    check_solution_field(row, "code", index)
    if "canonical_solution" in row and "test_list" in row and "test" in row and "entry_point" in row:
        return row
    if row.get("test_list") and not row.get("test"):
        return normalize_mbpp(row, index)
    return normalize_humaneval_row(row, index)


def task_from_row(row: dict) -> CodeTask:
    """The :class:`CodeTask` of a (raw or normalised) code row; cached by the row's contents."""
    try:
        norm = normalize_code_row(row)
    except KeyError as exc:
        raise ComlrlError(
            f"code row {row.get('task_id', '?')!r} is missing the field {exc}: code rewards need HumanEval-style rows "
            f"(prompt, test, entry_point) or MBPP-style rows (text, test_list); load them with env.load_dataset()."
        ) from exc
    return _task(
        task_id=norm["task_id"],
        prompt=norm["prompt"],
        entry=norm["entry_point"],
        test=norm["test"],
        test_list=tuple(norm["test_list"] or ()),
        setup=norm["test_setup_code"] or "",
        canonical_solution=norm["canonical_solution"] or "",
    )


@functools.lru_cache(maxsize=4096)
def _task(
    *, task_id: str, prompt: str, entry: str, test: str, test_list: tuple[str, ...], setup: str, canonical_solution: str
) -> CodeTask:
    if test_list:  # MBPP: asserts already separate; the prompt is not code (its first line is the signature)
        first = prompt.split("\n", 1)[0]
        signature = first if re.match(rf"^(async\s+)?def\s+{re.escape(entry)}\s*\(", first) else ""
        return CodeTask(
            task_id=task_id,
            prompt=prompt,
            entry_point=entry,
            tests=test_list,
            setup=setup,
            context="",
            signature=signature,
            canonical_solution=canonical_solution,
            split=True,
        )
    tests, check_setup, split = split_check_tests(test, entry)
    return CodeTask(
        task_id=task_id,
        prompt=prompt,
        entry_point=entry,
        tests=tests,
        setup=check_setup,
        context=prompt_context(prompt, entry),
        signature=signature_of(prompt, entry),
        canonical_solution=canonical_solution,
        split=split,
    )
