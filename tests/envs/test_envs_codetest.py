"""codetest (one agent codes, one tests): mutation operators, assert parsing, hand-computed reward levels,
oracles on real MBPP / HumanEval problems, loaders, transitions, baselines and a 2-step training run.

Tests that run programs go through comlrl.sandbox; each group of answers is scored in one batched call."""

import ast

import pytest

import comlrl.envs as envs
from comlrl.envs import DatasetError, run_baseline
from comlrl.envs.coding.codetest_asserts import classify_mutant, extract_asserts, hidden_asserts
from comlrl.envs.coding.codetest_judge import CODETEST_LEVELS
from comlrl.envs.coding.mutants import (
    OPERATORS,
    changed_result,
    flip_comparison,
    make_mutants,
    negate_condition,
    off_by_one,
    swap_operator,
)
from comlrl.envs.coding.tasks import task_from_row
from comlrl.errors import ComlrlError
from comlrl.sandbox import SandboxResult, TestOutcome

# --- mutants ------------------------------------------------------------------------------------------

SRC = '''LIMIT = 10


def f(xs, k=2):
    """Doc 1 < 2."""
    total = 0
    for i in range(1, len(xs)):
        if xs[i] < k and i != 3:
            total += xs[i] * 2
    return total
'''


def _descriptions(mutants):
    return [m.description for m in mutants]


def test_off_by_one_hand_checked():
    out = off_by_one(SRC)
    assert _descriptions(out) == [
        "line 4: 2 -> 3",  # the default argument
        "line 4: 2 -> 1",
        "line 6: 0 -> 1",
        "line 6: 0 -> -1",
        "line 7: 1 -> 2",
        "line 7: 1 -> 0",
        "line 8: 3 -> 4",
        "line 8: 3 -> 2",
        "line 9: 2 -> 3",
        "line 9: 2 -> 1",
    ]
    assert "total = 1" in out[2].source and "range(1, len(xs))" in out[2].source
    assert all("LIMIT = 10" in m.source for m in out)  # module level: untouched
    assert off_by_one("def g():\n    return True\n") == []  # bools are not integers here


def test_flip_comparison_and_swap_operator_hand_checked():
    flips = flip_comparison(SRC)
    assert _descriptions(flips) == ["line 8: < -> <=", "line 8: != -> =="]
    assert "xs[i] <= k and i != 3" in flips[0].source and "Doc 1 < 2." in flips[0].source  # docstring kept
    swaps = swap_operator(SRC)
    assert _descriptions(swaps) == ["line 8: and -> or", "line 9: + -> -", "line 9: * -> //"]
    assert "total -= xs[i] * 2" in swaps[1].source and "total += xs[i] // 2" in swaps[2].source
    assert _descriptions(flip_comparison("def g(a):\n    return a in [1] or a is None\n")) == [
        "line 2: in -> not in",
        "line 2: is -> is not",
    ]


def test_negate_condition_hand_checked():
    src = (
        "def g(x):\n    if x > 1:\n        return [i for i in x if i]\n    return sorted(x, reverse=True) if x else 0\n"
    )
    out = negate_condition(src)
    assert _descriptions(out) == [
        "line 2: condition negated",
        "line 3: filter negated",
        "line 4: condition negated",
        "line 4: True -> False",
    ]
    assert "if not x > 1:" in out[0].source and "if not i]" in out[1].source and "reverse=False" in out[3].source


@pytest.mark.parametrize("operator", [off_by_one, flip_comparison, swap_operator, negate_condition])
def test_every_mutant_parses_and_differs(operator):
    canonical = ast.unparse(ast.parse(SRC))
    out = operator(SRC)
    assert out
    assert len({m.source for m in out}) == len(out)
    for m in out:
        assert ast.parse(m.source) and m.source != canonical and m.operator in OPERATORS


def test_make_mutants_interleaves_and_caps():
    out = make_mutants(SRC)
    assert [m.operator for m in out[:6]] == [
        "off_by_one",
        "flip_comparison",
        "swap_operator",
        "negate_condition",
        "off_by_one",
        "flip_comparison",
    ]
    assert len(out) == 10 + 2 + 3 + 1
    assert [m.source for m in make_mutants(SRC, limit=3)] == [m.source for m in out[:3]]
    assert make_mutants("def g(x):\n    return sorted(x, key=len)\n") == []
    assert make_mutants("def g(:\n") == []  # does not parse: nothing


def _result(status, statuses):
    tests = [TestOutcome(f"assert {i}", s) for i, s in enumerate(statuses)]
    return SandboxResult(status, tests, "", "", 0.0, n_requested=len(statuses))


def test_classify_mutant():
    assert classify_mutant(_result("ok", ["passed", "failed"]), 2) == "kept"
    assert classify_mutant(_result("ok", ["passed", "error"]), 2) == "kept"
    assert classify_mutant(_result("ok", ["passed", "passed"]), 2) == "equivalent"
    assert classify_mutant(_result("ok", ["error", "error"]), 2) == "trivial"  # any call kills it
    assert classify_mutant(_result("ok", ["failed", "timeout"]), 2) == "dropped"
    assert classify_mutant(_result("timeout", ["failed"]), 2) == "dropped"
    assert classify_mutant(_result("program_error", []), 2) == "dropped"


# --- parsing agent 2's answer -------------------------------------------------------------------------


def test_extract_asserts_is_robust():
    text = (
        "Here are some tests for `f`:\n\n```python\nassert f(1) == 2\nassert f(1)==2, 'same condition'\n"
        "print(f(3))\nx = f(2)\nassert x == 3\nassert True\nassert f(\n    [1, 2]\n) == [2, 3]\n```\n"
        "These tests check the edge cases.\n"
    )
    out = extract_asserts(text, "f")
    assert out.tests == ("assert f(1) == 2", "assert f([1, 2]) == [2, 3]")
    assert (out.found, out.duplicates, out.not_calling) == (5, 1, 2)
    # prose lines around unfenced asserts (the text does not parse): line by line, multi-line asserts joined
    loose = "Tests:\n  assert f(0) == 1\nassert f(\n    5) == 6\nassert f(9 == \nThat is all."
    assert extract_asserts(loose, "f").tests == ("assert f(0) == 1", "assert f(5) == 6")
    # an example inside a docstring is not a test, whether the answer parses or not
    echoed = 'def f(x):\n    """Add one.\n\n    assert f(1) == 2\n    """\n    return x + 1\n'
    assert extract_asserts(echoed, "f").tests == ()
    assert extract_asserts("```python\n" + echoed + "```\nThis is a bit of a custom implementation.", "f").tests == ()
    # asserts inside test functions count; the function itself does not
    wrapped = "def f(x):\n    return x + 1\n\ndef test_f():\n    assert f(1) == 2\n    assert f(-1) == 0\n"
    assert extract_asserts(wrapped, "f").tests == ("assert f(1) == 2", "assert f(-1) == 0")


def test_extract_asserts_rejects_tricks_and_caps():
    text = "\n".join(
        [
            "assert (f := lambda *a: 0) is not None or f(1)",  # rebinds the function
            "assert f.__globals__ is not None or f(1)",
            "assert f(1) == 2 or exec('x = 1')",
            "assert getattr(f, '__code__') or f(1)",  # a dunder through getattr
            "assert f(1) == 2 or __builtins__['print'](1)",
            "assert f(1) == 2 or __import__('os')._exit(0)",
            "assert g(1) == 2",  # another function
        ]
        + [f"assert f({i}) == {i + 1}" for i in range(12)]
    )
    out = extract_asserts(text, "f", limit=10)
    assert out.rejected == 6 and out.not_calling == 1 and out.truncated == 2
    assert out.tests == tuple(f"assert f({i}) == {i + 1}" for i in range(10))
    for empty in ("", "   ", "I cannot write tests.", "```\n```"):
        assert extract_asserts(empty, "f").tests == ()


# --- hand-computed reward levels ------------------------------------------------------------------------

ROW = {
    "task_id": "toy/1",
    "text": "Return the sum of the positive numbers in a list.",
    "code": "def pos_sum(xs):\n    total = 0\n    for x in xs:\n        if x > 0:\n            total += x\n    return total\n",
    "test_list": ["assert pos_sum([1, -2, 3]) == 4", "assert pos_sum([]) == 0", "assert pos_sum([-1, 0, 5]) == 5"],
}
# Mutants (interleaved): total = 1, x >= 0 (equivalent on the hidden tests), total -= x, if not x > 0,
# total = -1 -> 4 kept (the cap), 1 more kept but over the cap, x > -1 equivalent.
GOOD = "```python\ndef pos_sum(xs):\n    return sum(x for x in xs if x > 0)\n```"
BUGGY = "def pos_sum(xs):\n    return sum(xs)"  # passes 1 of 3 hidden tests ([] -> 0)
T_A = "assert pos_sum([1, -2, 3]) == 4"  # valid, kills all 4 mutants
T_B = "assert pos_sum([]) == 0"  # valid, kills total = 1 and total = -1 (2 of 4)
T_C = "assert pos_sum([2]) == 3"  # invalid
T_TRIVIAL = "assert pos_sum([1]) == pos_sum([1])"  # valid, kills nothing
HIDDEN = 1.0 / 3.0
EQ_HACK = "class Yes:\n    def __eq__(self, other):\n        return True\n\n\ndef pos_sum(xs):\n    return Yes()"

CASES = [
    ("oracle-like", GOOD, T_A, 7.0),  # 0.5 + 0.5 + 2.0 + 0.5 + 1.0 + 1.5 + 1.0
    ("half the mutants", GOOD, T_B, 3.0 + 0.5 + 1.0 + 0.75 + 1.0),
    ("one invalid test", GOOD, T_B + "\n" + T_C, 3.0 + 0.5 + 0.5 + 0.75 + 1.0),
    ("trivially true test", GOOD, T_TRIVIAL, 3.0),  # passes on every function: counts for nothing
    ("assert True", GOOD, "assert True\nassert 1 == 1", 3.0),  # does not call the function: no test
    ("only invalid", GOOD, T_C, 3.0 + 0.5),
    ("buggy function, test catches it", BUGGY, T_A, 1.0 + 2.0 * HIDDEN + 3.0),  # agreement 0
    ("buggy function passes the test", BUGGY, T_B, 1.0 + 2.0 * HIDDEN + 0.5 + 1.0 + 0.75 + 1.0),
    ("entry point missing", "def other(xs):\n    return 0", T_A, 3.0),  # no program: no agreement
    ("syntax error", "def pos_sum(xs):\n    return (", T_A, 0.5 + 3.0),
    ("always-equal object", EQ_HACK, T_A, 1.0 + 3.0),  # the sandbox compares data only: no hidden test passes
    ("malformed both", "Sure! The answer is 4.", "I think the function works.", 0.0),
    ("empty", "", "", 0.0),
    (
        "duplicated work",  # the tester also writes the function, and repeats its test
        GOOD + "\n\nassert pos_sum([1, -2, 3]) == 4",  # the coder's own asserts are dropped
        GOOD + f"\n{T_A}\nassert pos_sum([1,-2,3])==4\nassert pos_sum( [1, -2, 3] ) == 4, 'again'",
        7.0,
    ),
]


@pytest.fixture(scope="module")
def toy():
    env = envs.make("codetest")
    scores = env.reward_func.score([c[1] for c in CASES], [c[2] for c in CASES], batch_items=[ROW])
    return env, dict(zip([c[0] for c in CASES], scores))


@pytest.mark.parametrize("name, code, tests, expected", CASES, ids=[c[0] for c in CASES])
def test_levels_hand_computed(toy, name, code, tests, expected):
    _, scores = toy
    assert scores[name]["reward"] == pytest.approx(expected)


def test_level_values_and_metrics(toy):
    env, scores = toy
    out = scores["one invalid test"]
    assert set(CODETEST_LEVELS) <= set(out)
    assert out["level/tests_valid"] == 0.5 and out["level/mutants_killed"] == 0.5 and out["level/agreement"] == 1.0
    assert out["metric/n_tests"] == 2 and out["metric/n_valid"] == 1 and out["metric/kill_fraction"] == 0.5
    assert out["metric/n_mutants"] == 4 and out["metric/n_equivalent"] == 2 and out["metric/pass"] == 1.0
    assert scores["duplicated work"]["metric/duplicates"] == 2 and scores["duplicated work"]["metric/n_tests"] == 1
    assert scores["assert True"]["metric/not_calling"] == 2 and scores["assert True"]["level/tests_written"] == 0
    buggy = scores["buggy function, test catches it"]
    assert buggy["level/hidden_tests"] == pytest.approx(HIDDEN) and buggy["metric/agreement"] == 0.0
    assert buggy["metric/pass"] == 0.0 and buggy["level/mutants_killed"] == 1.0
    assert scores["always-equal object"]["metric/suspect"] == 1.0 and buggy["metric/suspect"] == 0.0
    [mutants] = env.reward_func.mutants_for([task_from_row(ROW)]).values()
    assert [m.description for m in mutants.mutants] == [
        "line 2: 0 -> 1",
        "line 5: + -> -",  # total += x
        "line 4: condition negated",
        "line 2: 0 -> -1",
    ]
    assert (mutants.candidates, mutants.equivalent, mutants.trivial) == (7, 2, 0)
    assert env.reward_func([GOOD], [T_A], batch_items=[ROW], prompts=["x"], turn=1) == [7.0]  # extras ignored


def test_no_mutant_left_is_judged_by_foils_and_evaluate():
    row = {
        "task_id": "toy/2",
        "text": "Sort by length.",
        "code": "def by_len(xs):\n    return sorted(xs, key=len)\n",
        "test_list": ["assert by_len(['ab', 'c']) == ['c', 'ab']"],
    }
    env = envs.make("codetest")
    code = "def by_len(xs):\n    return sorted(xs, key=lambda s: len(s))"
    tests = "assert by_len([]) == []"  # the foil that returns its argument passes it: 5 of 6 foils caught
    [out] = env.reward_func.score([code], [tests], batch_items=[row])
    assert out["metric/n_mutants"] == 0 and out["metric/n_foils"] == 6 and out["metric/foil_judged"] == 1.0
    assert out["level/mutants_killed"] == pytest.approx(5 / 6) and out["reward"] == pytest.approx(7.0 - 1.5 / 6)
    metrics = env.evaluate(
        [[code, GOOD, GOOD], [tests, T_B + "\n" + T_C, "assert pos_sum([1]) is not None"]], [row, ROW, ROW]
    )
    assert metrics["pass@1"] == 1.0 and metrics["validity_rate"] == pytest.approx((1.0 + 0.5 + 1.0) / 3)
    assert metrics["kill_rate"] == pytest.approx((5 / 6 + 0.5 + 0.0) / 3)  # the weak assert kills nothing
    assert metrics["reward/mean"] == pytest.approx((6.75 + 5.75 + 3.5) / 3)


@pytest.mark.parametrize(
    "value",
    [
        True,
        False,
        0,
        -7,
        2.5,
        float("inf"),
        1e300,
        1j,
        "",
        "a`",
        "python program",
        b"",
        b"ab",
        [],
        [1, [2, "x"]],
        (),
        ("a", 1.0),
        {},
        {"k": [1]},
        set(),
        {"a", "`"},
        frozenset({1}),
        None,
        range(3),
    ],
    ids=repr,
)
def test_changed_result_always_differs(value):
    for variant in (0, 1):
        changed = changed_result(value, variant)
        assert changed != value, (value, variant, changed)
        if value is not None and not isinstance(value, range):
            assert type(changed) is type(value)  # the same kind of value: a plausible wrong answer
    assert list(changed_result(iter([1, 2]), 0)) == [1, 2, 3]  # an iterator's items are changed


FIRST = {
    "task_id": "toy/3",
    "text": "Return the first item of a list.",
    "code": "def first(xs):\n    return xs[0]\n",
    "test_list": ["assert first([1, 2, 3]) == 1", "assert first([5, 6]) == 5"],
}


def test_self_comparisons_never_pay():
    """A test that cannot fail on a wrong function that returns plausible values pays nothing: without mutants
    (MBPP 604: constant foils crash on ``f(x)[0]``) and where a mutant crashes on the test's input (``xs[1]``)."""
    env = envs.make("codetest")
    row = next(dict(r) for r in env.load_dataset(split="train") if str(r["task_id"]) == "604")
    x = '"python program"'
    answers = {
        "none": "",
        "indexed": f"assert reverse_words({x})[0] == reverse_words({x})[0]",
        "split": f"assert reverse_words({x}).split()[0] == reverse_words({x}).split()[0]",
        "sliced": f"assert reverse_words({x})[0] == reverse_words({x})[:1]",  # not spelled as a self-comparison
        "not identity": f"assert reverse_words({x})[0] == reverse_words({x})[0] and reverse_words({x}) != {x}",
        "contradiction": f"assert reverse_words({x}) != reverse_words({x})",
        "length": f"assert len(reverse_words({x})) == 14",
        "honest": 'assert reverse_words("a b c") == "c b a"',
    }
    codes = [row["canonical_solution"]] * len(answers)
    scores = dict(zip(answers, env.reward_func.score(codes, list(answers.values()), batch_items=[row])))
    assert scores["none"]["reward"] == 3.0
    for name in ("indexed", "split", "sliced", "contradiction"):
        assert scores[name]["reward"] == 3.0 and scores[name]["metric/uninformative"] == 1, name
    assert scores["not identity"]["reward"] <= 3.5 and scores["not identity"]["metric/n_sharp"] == 0
    honest = scores["honest"]
    assert honest["reward"] == 7.0 and honest["metric/n_mutants"] == 0 and honest["metric/foil_judged"] == 1
    assert 3.0 < scores["length"]["reward"] < 7.0 and scores["length"]["metric/n_sharp"] == 1  # a real property
    code = "def first(xs):\n    return xs[0] if xs else None"
    crash = "assert first([7]) == first([7][:])"  # the mutant xs[1] raises on [7]: no property of first is tested
    out = env.reward_func.score([code] * 3, [crash, "assert first([7, 8]) == 7", ""], batch_items=[FIRST])
    assert out[0]["metric/n_mutants"] >= 1 and out[0]["reward"] == out[2]["reward"] == 3.0
    assert out[0]["metric/uninformative"] == 1 and out[1]["reward"] == 7.0


# --- oracles on real problems ------------------------------------------------------------------------------


@pytest.mark.parametrize("benchmark", ["mbpp", "humaneval"])
def test_canonical_solution_and_hidden_asserts_reach_the_maximum(benchmark):
    env = envs.make("codetest", benchmark=benchmark)
    rows = [dict(r) for r in env.load_dataset(limit=5)]
    tests = ["\n".join(hidden_asserts(task_from_row(r))) for r in rows]
    scores = env.reward_func.score([r["canonical_solution"] for r in rows], tests, batch_items=rows)
    assert [s["reward"] for s in scores] == [7.0] * 5
    assert sum(s["metric/n_mutants"] for s in scores) >= 8  # most of these problems have mutants
    garbage = env.reward_func.score(["x"] * 5, ["y"] * 5, batch_items=rows)
    assert [s["reward"] for s in garbage] == [0.0] * 5


# --- data, prompts, options -----------------------------------------------------------------------------


def test_loaders_and_prompts(tmp_path):
    env = envs.make("codetest")
    rows = env.load_dataset(limit=3)  # MBPP test split 11-13, packaged
    assert rows[0]["task_id"] == "11" and rows[0]["entry_point"] == "remove_Occ"
    prompt = rows[0]["prompt"]
    assert prompt.startswith("def remove_Occ(s, ch):") and 'assert remove_Occ("hello","l") == "heo"' in prompt
    assert 'remove_Occ("abcda","a")' not in prompt  # the other tests stay hidden
    coder, tester = [f(rows[0]) for f in env.formatters()]
    assert "Write the function `remove_Occ`" in coder and "assert statements" in tester
    assert "```python\ndef remove_Occ" in tester
    assert "Example" not in envs.make("codetest", examples=0).load_dataset(limit=1)[0]["prompt"]
    assert envs.make("codetest").load_dataset(split="train", limit=1)[0]["task_id"] == "601"
    he = envs.make("codetest", benchmark="humaneval").load_dataset()
    assert (
        len(he) == 164
        and he[0]["canonical_solution"].startswith(he[0]["prompt"])
        and len(he[0]["canonical_solution"]) > len(he[0]["prompt"])
    )
    with pytest.raises(DatasetError, match="one split, 'test'"):
        envs.make("codetest", benchmark="humaneval").load_dataset(split="train")
    path = tmp_path / "no_ref.jsonl"
    path.write_text('{"text": "t", "test_list": ["assert f(1) == 1"]}\n')
    with pytest.raises(DatasetError, match="no canonical solution"):
        env.load_dataset(str(path))
    with pytest.raises(ComlrlError, match="no canonical solution"):
        env.reward_func(["x"], ["y"], batch_items=[{"text": "t", "test_list": ["assert f(1) == 1"]}])
    with pytest.raises(ValueError, match="unknown benchmark"):
        envs.make("codetest", benchmark="apps")
    with pytest.raises(ComlrlError, match="num_agents=3"):
        envs.make("codetest", num_agents=3)
    assert envs.env_options("codetest")["max_mutants"] == 4


def test_single_agent_and_split():
    single = envs.make("codetest", num_agents=1)
    answer = GOOD + "\n\n" + T_A + "\n" + T_B
    assert single.reward_func([answer], batch_items=[ROW]) == [7.0]
    env = envs.make("codetest")
    code, tests = env.split_single(answer, ROW)
    assert code.startswith("def pos_sum") and "assert" not in code
    assert tests == T_A + "\n" + T_B


def test_transitions():
    env = envs.make("codetest")
    kwargs = dict(batch_item=ROW, turn=1, num_agents=2)
    coder, tester = env.external_transition(agent_completions=[BUGGY, T_B + "\n" + T_C + "\nassert True"], **kwargs)
    assert "Hidden tests: 1/3 passed" in coder and "FAILED: assert pos_sum([1, -2, 3]) == 4" in coder
    assert "Teammate's valid tests: 1/1 passed" in coder and "return sum(xs)" in coder
    assert "Tests that call `pos_sum`: 2 (ignored: 1 do not call `pos_sum`)" in tester
    assert "Valid (pass on a correct solution): 1/2" in tester and "INVALID: assert pos_sum([2]) == 3" in tester
    assert "Buggy versions caught: 2/4" in tester and "a swapped operator" in tester
    assert "total" not in tester  # neither the canonical solution nor a mutant is shown
    for mode, present, absent in [
        ("level_passed", "Valid (pass on a correct solution): 1/2", "INVALID"),
        ("passed", "not all valid", "Valid"),
        ("plain", "Your previous answer", "Feedback"),
    ]:
        prompt = envs.make("codetest", transition=mode).external_transition(
            agent_completions=[BUGGY, T_B + "\n" + T_C], **kwargs
        )[1]
        assert present in prompt and absent not in prompt


def test_baselines_run():
    env = envs.make("codetest")
    rows = [ROW]

    def generate(agent, prompts):
        return [GOOD + "\n" + T_A if "then assert" in p else (GOOD if agent == 0 else T_A) for p in prompts]

    for mode in ("single", "parallel", "sequential"):
        assert run_baseline(env, mode, generate=generate, rows=rows)["reward/mean"] == 7.0
