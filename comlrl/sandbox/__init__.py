"""Sandbox for model-written code: run a program and its tests in isolated processes.

The tests run in a judge process, the program in a separate candidate process; only plain data
crosses between them, so a program cannot fake a passing test (``verdict="split"``, the default).

Public API::

    run_tests(program, tests, kind="asserts" | "unittest", setup="", limits=None, timeout=None,
              verdict="split" | "strict" | "shared" | "shared-spawn")
    run_many(jobs, max_workers=None, progress=False)
    network_isolation_available()
    isolation_mode()                 # "ns-root" | "ns-user" | "uid" | "plain"
    static_test_count(tests, kind)   # tests requested, without running anything
    needs_interpreter(tests, setup)  # why tests would need the program's interpreter (None: they do not)
    SandboxLimits, SandboxResult (.suspect: signs of reward hacking), TestOutcome

See docs/sandbox.md for what is isolated and how.
"""

from ._isolation import current_isolation, network_isolation_available
from ._runner import run_many, run_tests, static_test_count
from ._types import SandboxLimits, SandboxResult, TestOutcome
from ._verdict import shared_reason as needs_interpreter


def isolation_mode() -> str:
    """The isolation mode used on this machine: "ns-root", "ns-user", "uid" or "plain"."""
    return current_isolation().mode


__all__ = [
    "SandboxLimits",
    "SandboxResult",
    "TestOutcome",
    "isolation_mode",
    "needs_interpreter",
    "network_isolation_available",
    "run_many",
    "run_tests",
    "static_test_count",
]
