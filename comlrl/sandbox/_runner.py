"""Public entry points: run one program's tests, or many programs in parallel."""

from __future__ import annotations

import ast
import os
import signal
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from ..pyast import parse_quiet
from . import _zygote
from ._isolation import current_isolation, nproc_limit, warn_network_once
from ._process import RawRun, execute
from ._types import TEST_STATUSES, SandboxLimits, SandboxResult, TestOutcome
from ._verdict import shared_reason, warn_shared_once
from .harness._harness_os import CPU_KILL_SHARE

KINDS = ("asserts", "unittest")
VERDICTS = ("split", "strict", "shared", "shared-spawn")


def _validate(program: Any, tests: Any, kind: Any, setup: Any, verdict: Any) -> None:
    if verdict not in VERDICTS:
        raise ValueError(f"run_tests: verdict must be one of {VERDICTS}, got {verdict!r}")
    if kind not in KINDS:
        raise ValueError(f"run_tests: kind must be one of {KINDS}, got {kind!r}")
    if not isinstance(program, str):
        raise TypeError(f"run_tests: program must be a str, got {type(program).__name__}")
    if not isinstance(setup, str):
        raise TypeError(f"run_tests: setup must be a str, got {type(setup).__name__}")
    if kind == "unittest" and not isinstance(tests, str):
        raise TypeError(
            f"run_tests: kind='unittest' needs tests as a str of unittest source, got {type(tests).__name__}"
        )
    if kind == "asserts" and not isinstance(tests, str):
        if not isinstance(tests, (list, tuple)) or not all(isinstance(t, str) for t in tests):
            raise TypeError("run_tests: kind='asserts' needs tests as a list of str or one str")


def static_test_count(tests: list[str] | str, kind: str) -> int:
    """Number of tests requested, found without running anything."""
    if kind == "asserts":
        return 1 if isinstance(tests, str) else len(tests)
    tree = parse_quiet(tests)
    if tree is None:
        return 0
    return sum(
        isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)) and item.name.startswith("test")
        for node in ast.walk(tree)
        if isinstance(node, ast.ClassDef)
        for item in node.body
    )


def _exit_text(code: int | None) -> str:
    if code is None:
        return "no exit status"
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exited with code {code}"


def _classify(raw: RawRun, by_type: dict[str, dict], limits: SandboxLimits, wall: float) -> tuple[str, str]:
    """Run status and message from the records and how the process ended."""
    if "done" in by_type:
        return "ok", ""
    if "load" in by_type:
        load = by_type["load"]
        status = load.get("status")
        return (status if status in ("syntax_error", "program_error") else "crashed", str(load.get("message", "")))
    if "setup_failed" in by_type:
        return "crashed", f"sandbox setup failed: {by_type['setup_failed'].get('message', '')}"
    if raw.killed == "timeout":
        return "timeout", f"wall-clock limit of {wall:g} s exceeded"
    if raw.killed == "output":
        return "crashed", f"output exceeded {limits.output_kill_bytes} bytes; run killed"
    exit_rec = by_type.get("exit", {})  # from init in namespace modes: the worker's own status
    code = exit_rec.get("code", raw.returncode)
    cpu = max(raw.cpu, float(exit_rec.get("cpu", 0.0) or 0.0))
    by_signal = isinstance(code, int) and (code < 0 or code >= 128)  # the relay adds 128
    if by_signal and cpu >= CPU_KILL_SHARE * limits.cpu_seconds:
        return "timeout", f"CPU time limit of {limits.cpu_seconds} s exceeded"
    return "crashed", f"process {_exit_text(code)} before reporting all results"


def _outcomes(records: list[dict], status: str, message: str) -> tuple[list[TestOutcome], int | None]:
    """Per-test outcomes in plan order, plus the planned test count (None without a plan)."""
    plan: list[str] | None = None
    reported: dict[int, TestOutcome] = {}
    extra: list[TestOutcome] = []
    running: int | None = None
    for rec in records:
        kind = rec.get("type")
        if kind == "plan" and plan is None and isinstance(rec.get("names"), list):
            plan = [str(n) for n in rec["names"]]
        elif kind == "start":
            running = rec.get("index")
        elif kind == "test" and rec.get("status") in TEST_STATUSES:
            outcome = TestOutcome(
                str(rec.get("name", "")),
                rec["status"],
                str(rec.get("message", "")),
                str(rec.get("shared_reason") or ""),
            )
            index = rec.get("index")
            if isinstance(index, int) and index >= 0:
                reported.setdefault(index, outcome)
            else:
                extra.append(outcome)
            running = None
    tests = [reported[i] for i in sorted(reported)] + extra
    if running is not None and running not in reported and plan and 0 <= running < len(plan):
        # The process died inside this test: the test gets the blame, not a silent gap.
        tests.append(TestOutcome(plan[running], "timeout" if status == "timeout" else "error", message))
    return tests, (len(plan) if plan is not None else None)


def _assemble(raw: RawRun, tests: list[str] | str, kind: str, limits: SandboxLimits, wall: float) -> SandboxResult:
    by_type: dict[str, dict] = {}
    for rec in raw.records:
        by_type.setdefault(str(rec.get("type")), rec)
    status, message = _classify(raw, by_type, limits, wall)
    outcomes, planned = _outcomes(raw.records, status, message)
    requested = static_test_count(tests, kind)
    if kind == "unittest" and planned is not None:
        requested = planned
    isolation = by_type.get("hello", {}).get("isolation")
    info = {
        "exit_code": raw.returncode,
        # (a run that ended at the judge's "done" was not reaped yet: the judge's own CPU time)
        "cpu_seconds": raw.cpu or float(by_type.get("judge", {}).get("cpu", 0.0) or 0.0),
        "isolation": isolation,
        "output_bytes": raw.output_bytes,
        "forged_records": raw.forged,
        "verdict": isolation.get("verdict") if isinstance(isolation, dict) else None,
        "restarts": int(by_type.get("judge", {}).get("restarts", 0) or 0),
    }
    suspect = [
        f"{rec.get('category', 'other')}: {rec.get('message', '')}"
        for rec in raw.records
        if rec.get("type") == "suspect"
    ]
    return SandboxResult(
        status=status,
        tests=outcomes,
        stdout=raw.stdout.decode("utf-8", errors="replace"),
        stderr=raw.stderr.decode("utf-8", errors="replace"),
        duration=raw.duration,
        message=message,
        n_requested=requested,
        info=info,
        suspect=suspect,
    )


def run_tests(
    program: str,
    tests: list[str] | str,
    *,
    kind: str = "asserts",
    setup: str = "",
    limits: SandboxLimits | None = None,
    timeout: float | None = None,
    verdict: str = "split",
    allow_shadowing: Sequence[str] = (),
) -> SandboxResult:
    """Run ``program`` and its tests in the sandbox and report each test.

    kind="asserts": ``tests`` is a list of statements (one test each) or one string (one
    test, e.g. HumanEval's ``check`` block); ``setup`` is test code run before the tests.
    kind="unittest": ``tests`` is unittest source; every test method is one test.
    ``timeout`` overrides ``limits.timeout`` (wall clock for the whole run).
    ``verdict``: "split" (default: the tests run in a judge process, the program in another, so
    it cannot fake a pass; tests that need the program's interpreter fall back to "shared"),
    "strict" ("split" that never falls back: for tests written by a model, whose text must not
    choose the mode; a test that passes the program non-data fails with
    ``TestOutcome.shared_reason`` set), "shared" (program and tests in one interpreter), or
    "shared-spawn" (program and tests in one interpreter started for this run, the "spawn" launcher,
    so without the warm zygote's seccomp filter, cgroup and file-system view: the least isolated
    verdict, run beside "split" in tests/sandbox/test_verdict.py to show which reward hacks an unisolated
    verdict would pay for, and the baseline of ``benchmarks/bench_sandbox.py``).
    ``allow_shadowing``: names of the program's globals that the tests may use although they are
    a builtin's name (an entry point called ``sum``); any other such global stays hidden from the
    tests, which keep the builtin (a program must not redefine the ``abs`` a test compares with).
    """
    _validate(program, tests, kind, setup, verdict)
    limits = limits or SandboxLimits()
    wall = limits.timeout if timeout is None else float(timeout)
    if wall <= 0:
        raise ValueError(f"run_tests: timeout must be positive, got {timeout!r}")
    iso = current_isolation()
    if not limits.network and not iso.netns:
        warn_network_once()
    job = {"program": program, "tests": tests if isinstance(tests, str) else list(tests), "kind": kind, "setup": setup}
    job["allow_shadowing"] = [str(n) for n in allow_shadowing]
    job["strict"] = verdict == "strict"
    fallback = shared_reason(tests, setup) if verdict == "split" else None
    if fallback is not None:
        warn_shared_once(fallback)
        verdict = "shared"
    raw = _execute(job, iso, limits, wall, verdict)
    needs_shared = next((r for r in raw.records if r.get("type") == "needs_shared"), None)
    if needs_shared is not None and verdict == "split":  # the tests pass the program something that is not data
        fallback = f"pass the program non-data arguments ({needs_shared.get('reason', '')})"
        warn_shared_once(fallback)
        raw = _execute(job, iso, limits, wall, "shared")
    result = _assemble(raw, tests, kind, limits, wall)
    result.info["shared_reason"] = fallback
    return result


def _execute(job: dict, iso: Any, limits: SandboxLimits, wall: float, verdict: str) -> RawRun:
    netns = iso.netns and not limits.network
    zygote = None if verdict == "shared-spawn" else _zygote.zygote_for(iso.mode, netns)
    kwargs = dict(
        mode=iso.mode,
        netns=netns,
        limits=limits,
        timeout=wall,
        nproc=nproc_limit(iso.mode, limits.max_processes),
        verdict="split" if verdict in ("split", "strict") else "shared",
    )
    if zygote is not None:
        try:
            return execute(job, zygote=zygote, **kwargs)
        except _zygote.ZygoteError:
            _zygote.discard(zygote)  # the next run starts a new one; this one starts afresh
    return execute(job, **kwargs)


def _run_job(index: int, job: Mapping[str, Any]) -> SandboxResult:
    if not isinstance(job, Mapping):
        raise TypeError(f"run_many: job {index} must be a dict of run_tests arguments, got {type(job).__name__}")
    try:
        return run_tests(**job)
    except (TypeError, ValueError) as exc:
        raise type(exc)(f"run_many: job {index}: {exc}") from exc


def run_many(
    jobs: Sequence[Mapping[str, Any]], max_workers: int | None = None, progress: bool = False
) -> list[SandboxResult]:
    """Run many ``run_tests`` jobs (dicts of its keyword arguments) in parallel.

    Results come back in job order. ``max_workers`` defaults to the number of CPUs."""
    jobs = list(jobs)
    if not jobs:
        return []
    workers = max_workers or os.cpu_count() or 1
    if workers < 1:
        raise ValueError(f"run_many: max_workers must be >= 1, got {max_workers!r}")
    current_isolation()  # probe once up front rather than in the first few workers
    with ThreadPoolExecutor(max_workers=min(workers, len(jobs)), thread_name_prefix="comlrl-sandbox") as pool:
        futures = [pool.submit(_run_job, i, job) for i, job in enumerate(jobs)]
        if progress:
            _show_progress(futures)
        return [f.result() for f in futures]


def _show_progress(futures: list) -> None:
    from concurrent.futures import as_completed

    try:
        from tqdm.auto import tqdm
    except ImportError:  # progress is optional
        return
    for _ in tqdm(as_completed(futures), total=len(futures), desc="sandbox", unit="prog"):
        pass
