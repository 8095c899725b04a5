"""Which tests cannot be judged apart from the program, so they run in one interpreter instead.

In the split verdict the tests see the program only through calls and attribute access. Tests that
reach into the program's interpreter itself (patch its modules or builtins, capture what it prints
through ``sys.stdout``, seed its random generator, inspect its source or frames) would then test
something else. They are recognised statically here and run with ``verdict="shared"``; that run
is logged once per reason and marked in ``SandboxResult.info["shared_reason"]``.
"""

from __future__ import annotations

import ast
import logging
import threading

from ..pyast import parse_quiet

logger = logging.getLogger("comlrl.sandbox")

# Names whose use means the test changes or inspects the interpreter the program runs in.
INTERPRETER_NAMES = {
    "mock": "use unittest.mock",
    "MagicMock": "use unittest.mock",
    "Mock": "use unittest.mock",
    "patch": "patch objects (mock.patch)",
    "monkeypatch": "patch objects",
    "redirect_stdout": "capture the program's output",
    "redirect_stderr": "capture the program's output",
    "getsource": "inspect the program's source",
    "currentframe": "inspect frames",
    "_getframe": "inspect frames",
    "globals": "read module globals",
    "__main__": "use the __main__ module",
    "__builtins__": "change builtins",
}
SYS_ATTRIBUTES = {"modules": "use sys.modules", "stdout": "capture sys.stdout", "stderr": "capture sys.stderr"}
SYS_ATTRIBUTES["stdin"] = "feed sys.stdin"
_warned: set[str] = set()
_lock = threading.Lock()


def shared_reason(tests: list[str] | str, setup: str) -> str | None:
    """Why these tests need the program's interpreter, or None when they can run in a judge."""
    sources = [tests] if isinstance(tests, str) else list(tests)
    for source in [setup, *sources]:
        tree = parse_quiet(source) if source else None
        if tree is None:
            continue
        reason = _reason(tree)
        if reason is not None:
            return reason
    return None


def _reason(tree: ast.AST) -> str | None:
    for node in ast.walk(tree):
        if isinstance(node, ast.Name) and node.id in INTERPRETER_NAMES:
            return INTERPRETER_NAMES[node.id]
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            names = [a.name for a in node.names] + ([node.module] if isinstance(node, ast.ImportFrom) else [])
            if any(n and (n.endswith("mock") or n in ("builtins", "inspect")) for n in names):
                return "import unittest.mock, builtins or inspect"
        if isinstance(node, ast.Attribute):
            base = node.value.id if isinstance(node.value, ast.Name) else None
            if base == "sys" and node.attr in SYS_ATTRIBUTES:
                return SYS_ATTRIBUTES[node.attr]
            if node.attr == "seed":
                return "seed a random generator the program shares"
            if node.attr in INTERPRETER_NAMES and node.attr not in ("globals",):
                return INTERPRETER_NAMES[node.attr]
    return None


def warn_shared_once(reason: str) -> None:
    """Log (once per reason and process) that some tests run in the program's interpreter."""
    with _lock:
        if reason in _warned:
            return
        _warned.add(reason)
    logger.warning(
        "sandbox: tests that %s run in the program's own interpreter (verdict='shared'); a program "
        "can fake their verdict (see docs/sandbox.md)",
        reason,
    )
