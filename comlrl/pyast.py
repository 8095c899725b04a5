"""Parsing Python source into an AST, safe to call from several threads at once."""

from __future__ import annotations

import ast
import threading
import warnings

# CPython before 3.11.8 / 3.12.1 keeps the AST builder's recursion counter in interpreter-wide state: two threads
# building ASTs at once (a garbage collection inside one lets the other run) fail with "SystemError: AST constructor
# recursion depth mismatch" (python/cpython#106905). The sandbox counts tests on its worker threads, so every parse
# in the library goes through this lock. It also covers ``warnings.catch_warnings``, which is not thread-safe.
_LOCK = threading.Lock()


def parse_quiet(source: str) -> ast.Module | None:
    """``ast.parse(source)``, or None when it does not parse; SyntaxWarnings (bad escapes) are silenced."""
    with _LOCK, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            return ast.parse(source)
        except (SyntaxError, ValueError, RecursionError, MemoryError):
            return None
