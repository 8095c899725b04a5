"""codetest's reward pays for the task only: hacks a policy under RL pressure finds, each scored
against the honest answer on the same problem in one batched reward call.

* a tester's asserts can never switch the coder's verdict to the shared interpreter;
* problems without mutants cannot be won with a tautology (foils judge there);
* asserts whose verdict does not depend on the function count for nothing, and padding never pays;
* respelled copies of one assert and weak asserts do not raise the reward."""

import pytest

import comlrl.envs as envs
from comlrl.envs.coding.codetest_asserts import hidden_asserts
from comlrl.envs.coding.tasks import task_from_row

ROW = {
    "task_id": "toy/1",
    "text": "Return the sum of the positive numbers in a list.",
    "code": "def pos_sum(xs):\n    total = 0\n    for x in xs:\n        if x > 0:\n            total += x\n    return total\n",
    "test_list": ["assert pos_sum([1, -2, 3]) == 4", "assert pos_sum([]) == 0", "assert pos_sum([-1, 0, 5]) == 5"],
}
GOOD = "def pos_sum(xs):\n    return sum(x for x in xs if x > 0)"
WRONG = "def pos_sum(xs):\n    return sum(xs)"  # passes 1 of 3 hidden tests
EQ_HACK = "class Yes:\n    def __eq__(self, other):\n        return True\n\n\ndef pos_sum(xs):\n    return Yes()"
REAL = "assert pos_sum([1, -2, 3]) == 4"  # valid, kills every mutant; WRONG fails it
# Behaviour-independent asserts: the same verdict whatever pos_sum does.
TAUTOLOGIES = [
    "assert pos_sum([1]) == pos_sum([1])",
    "assert pos_sum([2]) is not None or True",
    "assert isinstance(pos_sum([3]), object)",
    "assert type(pos_sum([4])) == type(pos_sum([4]))",
    "assert pos_sum([5]) == pos_sum([5]) or pos_sum([5]) != pos_sum([5])",
    "assert [pos_sum([6])] != []",
    "assert pos_sum([7]) in [pos_sum([7])]",
    "assert str(pos_sum([8])) == str(pos_sum([8]))",
]
HIDDEN_OR = "\n".join(t + " or patch" for t in ROW["test_list"])  # once switched the whole job to 'shared'
LAMBDA = "assert pos_sum([1, -2, 3]) == 4 or pos_sum(lambda: 0)"


@pytest.fixture(scope="module")
def env():
    return envs.make("codetest")


def _score(env, pairs, row=ROW):
    return env.reward_func.score([p[0] for p in pairs], [p[1] for p in pairs], batch_items=[row])


def test_tester_text_never_switches_the_coders_verdict(env):
    """Finding 1: the hidden tests run in their own split job; an always-equal coder passes none of them
    whatever its teammate writes, and a tester's assert that needs the interpreter is not counted."""
    cases = [
        (EQ_HACK, HIDDEN_OR),
        (EQ_HACK, LAMBDA),
        (EQ_HACK, "from unittest.mock import patch\n" + REAL),
        (EQ_HACK, REAL + "\nassert pos_sum.__class__ or mock"),
        (EQ_HACK, "\n".join(ROW["test_list"])),
        (GOOD, LAMBDA),
        (GOOD, REAL + " or patch"),
    ]
    scores = _score(env, cases)
    for s in scores[:5]:
        assert s["level/hidden_tests"] == 0.0 and s["metric/verdict_shared"] == 0.0
        assert s["level/agreement"] == 0.0
        assert s["reward"] <= 1.0 + 0.5 + 1.0 + 1.5  # defined, syntax and the tester's share at most
    lam, pat = scores[5], scores[6]
    assert lam["metric/needs_interpreter"] == 1.0 and lam["metric/n_tests"] == 0 and lam["reward"] == 3.0
    assert pat["metric/needs_interpreter"] == 1.0 and pat["metric/n_tests"] == 0 and pat["reward"] == 3.0


NO_MUTANT = {
    "task_id": "toy/2",
    "text": "Sort by length.",
    "code": "def by_len(xs):\n    return sorted(xs, key=len)\n",
    "test_list": [
        "assert by_len(['ab', 'c']) == ['c', 'ab']",
        "assert by_len(['xyz', 'a', 'bc']) == ['a', 'bc', 'xyz']",
    ],
}
BY_LEN = "def by_len(xs):\n    return sorted(xs, key=lambda s: len(s))"


def test_no_mutant_problem_is_judged_by_foils(env):
    """Finding 2: without a mutant, a tautology earns nothing; a real assert earns the tester's share."""
    tautology = "assert by_len(['a']) == by_len(['a'])"
    real = "assert by_len(['aaa', 'b']) == ['b', 'aaa']"
    weak = "assert by_len(['a']) is not None"
    taut, honest, weak_only = _score(env, [(BY_LEN, tautology), (BY_LEN, real), (BY_LEN, weak)], NO_MUTANT)
    assert honest["metric/n_mutants"] == 0 and honest["metric/n_foils"] >= 3
    assert taut["reward"] == 3.0 and taut["level/tests_written"] == 0.0 and taut["metric/uninformative"] == 1
    assert honest["reward"] == 7.0
    assert weak_only["level/mutants_killed"] == 0.0 and weak_only["level/agreement"] == 0.0
    assert weak_only["reward"] <= 3.5


def test_mbpp_604_tautology_earns_nothing(env):
    row = next(dict(r) for r in env.load_dataset(split="train") if str(r["task_id"]) == "604")
    oracle = "\n".join(hidden_asserts(task_from_row(row)))
    tautologies = "\n".join(
        [
            'assert reverse_words("a b") == reverse_words("a b")',
            'assert reverse_words("x") is not None or True',
            'assert isinstance(reverse_words("q r"), object)',
        ]
    )
    taut, best = _score(env, [(row["canonical_solution"], tautologies), (row["canonical_solution"], oracle)], row)
    assert taut["reward"] == 3.0 and taut["level/mutants_killed"] == 0.0 and taut["level/agreement"] == 0.0
    assert best["reward"] == 7.0


def test_padding_never_pays(env):
    """Finding 3: adding behaviour-independent asserts (or respelled copies, or weak ones) never raises a reward."""
    pads = {
        "tautologies": TAUTOLOGIES,
        "respelled": [
            "assert 4 == pos_sum([1, -2, 3])",
            "assert pos_sum([1, -2, 3]) == 4.0",
            "assert (pos_sum([1,-2,3]) == 4) == True",
        ],
        "weak": [f"assert pos_sum([{i}]) is not None" for i in range(6)],
    }
    invalid = "assert pos_sum([2]) == 3"
    for coder in (GOOD, WRONG):
        for base in (REAL, REAL + "\n" + invalid):
            pairs = [(coder, base)] + [(coder, base + "\n" + "\n".join(p)) for p in pads.values()]
            plain, *padded = _score(env, pairs)
            for name, s in zip(pads, padded):
                assert s["reward"] <= plain["reward"] + 1e-9, (coder, base, name, s, plain)
                for level in ("level/tests_valid", "level/agreement", "level/mutants_killed"):
                    assert s[level] <= plain[level] + 1e-9, (name, level)
    wrong_plain, wrong_padded = _score(env, [(WRONG, REAL), (WRONG, REAL + "\n" + "\n".join(TAUTOLOGIES))])
    assert wrong_padded["metric/uninformative"] == len(TAUTOLOGIES)
    assert wrong_padded["reward"] == pytest.approx(wrong_plain["reward"])


def test_oracle_still_reaches_the_maximum_on_real_problems(env):
    rows = [dict(r) for r in env.load_dataset(split="train", limit=12)]
    tests = ["\n".join(hidden_asserts(task_from_row(r))) for r in rows]
    scores = env.reward_func.score([r["canonical_solution"] for r in rows], tests, batch_items=rows)
    assert [s["reward"] for s in scores] == [7.0] * len(rows)
