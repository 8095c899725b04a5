"""Limits and result types of the sandbox."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

RUN_STATUSES = ("ok", "syntax_error", "program_error", "timeout", "crashed")
TEST_STATUSES = ("passed", "failed", "error", "timeout")


@dataclass(kw_only=True)
class SandboxLimits:
    """Resource limits for one sandboxed run."""

    timeout: float = 10.0  # wall clock for the whole run, seconds
    per_test_timeout: float = 3.0  # for each assert / test method
    cpu_seconds: int = 10  # CPU time per process
    memory_mb: int = 1024  # address space per process
    file_size_mb: int = 16  # largest file the program may write
    max_processes: int = 32  # processes + threads of the sandbox user
    max_output_bytes: int = 65536  # stdout / stderr kept, per stream
    network: bool = False  # False = disable network where the OS allows it
    disk_mb: int = 64  # size of each private tmpfs (work dir, /tmp, /dev/shm)
    output_kill_bytes: int = 16 * 1024 * 1024  # total output after which the run is killed

    def __post_init__(self) -> None:
        for name in (
            "timeout",
            "per_test_timeout",
            "cpu_seconds",
            "memory_mb",
            "file_size_mb",
            "max_processes",
            "max_output_bytes",
            "disk_mb",
            "output_kill_bytes",
        ):
            if getattr(self, name) <= 0:
                raise ValueError(f"SandboxLimits.{name} must be positive, got {getattr(self, name)!r}")


@dataclass
class TestOutcome:
    """Verdict for one test (one assert statement, test block or unittest method)."""

    __test__ = False  # not a pytest test class

    name: str  # e.g. "assert 0", "check", "TestFoo.test_bar"
    status: str  # "passed" | "failed" | "error" | "timeout"
    message: str = ""
    # verdict="strict": why this test would have needed the program's interpreter (it failed instead)
    shared_reason: str = ""


@dataclass
class SandboxResult:
    """Outcome of running one program and its tests in the sandbox.

    ``tests`` holds the tests that reported (plus the one running when the process died);
    tests that never started are absent but still count in ``n_total``.
    """

    status: str  # "ok" | "syntax_error" | "program_error" | "timeout" | "crashed"
    tests: list[TestOutcome]
    stdout: str
    stderr: str
    duration: float
    message: str = ""
    n_requested: int | None = None  # tests requested; None = len(tests)
    info: dict[str, Any] = field(default_factory=dict)  # exit code, cpu time, isolation used
    # Reward-hacking signs the judge saw ("kind: message"): non-data results compared, subclasses
    # of builtins overriding comparisons, exits or deaths during tests, channel abuse, seccomp kills.
    suspect: list[str] = field(default_factory=list)

    @property
    def n_passed(self) -> int:
        return sum(t.status == "passed" for t in self.tests)

    @property
    def n_total(self) -> int:
        return len(self.tests) if self.n_requested is None else self.n_requested

    @property
    def fraction_passed(self) -> float:
        return self.n_passed / self.n_total if self.n_total else 0.0

    @property
    def all_passed(self) -> bool:
        return self.n_total > 0 and self.n_passed == self.n_total
