"""ClassEval: method assignment, answer parsing, the merged class, the reward and the loader."""

import json

import pytest

import comlrl.envs as envs
from comlrl.envs import DatasetError
from comlrl.envs.coding.classeval import Method, assign_methods, count_params, parse_answer, task_from_row

DEPOSIT = (
    "    def deposit(self, amount):\n        if amount < 0:\n            raise ValueError('Invalid amount')\n"
    "        self.balance += amount\n        return self.balance\n"
)
WITHDRAW = (
    "    def withdraw(self, amount):\n        if amount < 0:\n            raise ValueError('Invalid amount')\n"
    "        if amount > self.balance:\n            raise ValueError('Insufficient balance.')\n"
    "        self.balance -= amount\n        return self.balance\n"
)
VIEW = "    def view_balance(self):\n        return self.balance\n"
TRANSFER = (
    "    def transfer(self, other_account, amount):\n        self.withdraw(amount)\n"
    "        other_account.deposit(amount)\n"
)


@pytest.fixture(scope="module")
def rows(shared_data_module):
    env = envs.make("classeval")
    return [dict(r) for r in env.load_dataset(str(shared_data_module / "classeval.json"), limit=12)]


@pytest.fixture(scope="module")
def shared_data_module():
    from conftest import SHARED_DATA

    if not SHARED_DATA.is_dir():
        pytest.skip(f"{SHARED_DATA} not present")
    return SHARED_DATA


def _methods(*params):
    return tuple(
        Method(name=f"m{i}", signature=f"def m{i}(self):", description="", params=p) for i, p in enumerate(params)
    )


def test_assignment_strategies():
    methods = _methods(1, 0, 2, 1, 3)
    assert assign_methods(methods, 2, "params") == [["m0", "m3"], ["m1", "m2", "m4"]]
    assert assign_methods(methods, 2, "alternate") == [["m0", "m2", "m4"], ["m1", "m3"]]
    assert assign_methods(methods, 3, "round_robin") == [["m0", "m3"], ["m1", "m4"], ["m2"]]
    assert assign_methods(methods, 2, "contiguous") == [["m0", "m1", "m2"], ["m3", "m4"]]
    assert assign_methods(methods, 1, "params") == [["m0", "m1", "m2", "m3", "m4"]]
    assert assign_methods(_methods(1, 1, 1), 2, "params") == [["m0", "m2"], ["m1"]]  # one side empty: alternate
    with pytest.raises(ValueError, match="unknown split 'random'"):
        envs.make("classeval", split="random")
    with pytest.raises(ValueError, match="2 agents"):
        envs.make("classeval", num_agents=3, split="params")
    assert envs.make("classeval", num_agents=3).split == "alternate"


def test_count_params():
    assert count_params("def f(self, a, b=1, *args, c, **kw):") == 3
    assert count_params("@staticmethod\ndef f(n, m=None):") == 2
    assert count_params("def f(self):") == 0


def test_parse_answer_variants():
    bare_indented = f"Here are my methods:\n```python\n{DEPOSIT}\n{WITHDRAW}```\nDone."
    parsed = parse_answer(bare_indented)
    assert set(parsed.methods) == {"deposit", "withdraw"} and all(ok for _, ok in parsed.methods.values())
    in_class = "import math\n\nclass BankAccount:\n" + DEPOSIT + "\n    def view_balance(self):\n        return (\n"
    parsed = parse_answer(in_class)
    assert parsed.methods["deposit"][1] and not parsed.methods["view_balance"][1]  # broken method: invalid
    assert parsed.module == "import math"
    stub = parse_answer('    def deposit(self, amount):\n        """Deposit."""\n')
    assert stub.methods == {}  # the skeleton's stub echoed back is not an implementation


def _bank(rows):
    return next(r for r in rows if r["task_id"] == "ClassEval_8")


def test_bank_account_levels(rows):
    """BankAccount: deposit/withdraw (one parameter) go to agent 1, view_balance/transfer to agent 2 (V = 4)."""
    env = envs.make("classeval")
    row = _bank(rows)
    assert env.owners(row) == [["deposit", "withdraw"], ["view_balance", "transfer"]]
    reward = env.reward_func
    full = reward.score([DEPOSIT + WITHDRAW], [VIEW + TRANSFER], batch_items=[row])[0]
    assert full["reward"] == pytest.approx(6.0) and full["level/tests"] == 1.0 and full["metric/pass"] == 1.0
    # agent 2 also writes deposit: 1 of 4 methods implemented twice -> -0.25
    shared = reward.score([DEPOSIT + WITHDRAW], [VIEW + TRANSFER + DEPOSIT], batch_items=[row])[0]
    assert shared["level/overlap"] == 0.25 and shared["reward"] == pytest.approx(5.75)
    # agent 2 answers nothing: 2 of 4 methods valid -> 2 x 0.5, plus 4 x the tests that still pass
    half = reward.score([DEPOSIT + WITHDRAW], ["Sorry, no idea."], batch_items=[row])[0]
    assert half["level/methods_valid"] == 0.5 and 0 < half["level/tests"] < 1
    assert half["reward"] == pytest.approx(1.0 + 4 * half["level/tests"])
    # a broken method counts as invalid and is replaced by a stub; the class still compiles
    broken = reward.score(
        [DEPOSIT + WITHDRAW], [VIEW + "    def transfer(self, other, amount):\n        return (\n"], batch_items=[row]
    )[0]
    assert broken["level/parse"] == 1.0 and broken["level/methods_valid"] == 0.75
    # module-level code that does not compile breaks the merged class: reward 0
    bad_module = reward.score(
        ["def helper(:\n    pass\n\nclass BankAccount:\n" + DEPOSIT], [VIEW + TRANSFER], batch_items=[row]
    )[0]
    assert bad_module["level/parse"] == 0.0 and bad_module["reward"] == 0.0
    assert reward.score([""], [""], batch_items=[row])[0]["reward"] == 0.0
    assert reward.score(["lorem ipsum"], ["def nothing("], batch_items=[row])[0]["reward"] == 0.0


def test_canonical_solutions_pass(rows):
    env = envs.make("classeval")
    subset = rows[:10]  # ClassEval_0..9: their canonical solutions pass in a plain subprocess
    scores = env.reward_func.score([""] * 10, [r["canonical_solution"] for r in subset], batch_items=subset)
    assert [s["level/tests"] for s in scores] == [1.0] * 10
    assert all(s["reward"] == pytest.approx(6.0) for s in scores)
    assert env.evaluate([[""] * 10, [r["canonical_solution"] for r in subset]], subset)["pass@1"] == 1.0


def test_prompts_single_and_transition(rows):
    env = envs.make("classeval")
    row = _bank(rows)
    first, second = [f(row) for f in env.formatters()]
    assert "ONLY these methods: `deposit`, `withdraw`" in first and "`view_balance`, `transfer`" in second
    assert "class BankAccount" in first
    whole = (
        "class BankAccount:\n    def __init__(self, balance=0):\n        self.balance = balance\n"
        + DEPOSIT
        + WITHDRAW
        + VIEW
        + TRANSFER
    )
    assert env.split_single(whole, row) == ["", whole]
    assert env.reward_func(*env.split_single(whole, row), batch_items=[row]) == pytest.approx([6.0])
    prompts = env.external_transition(
        batch_item=row,
        agent_completions=[DEPOSIT + WITHDRAW, ""],
        prompt_history_per_agent=[[], []],
        response_history_per_agent=[[], []],
        turn=1,
        num_agents=2,
    )
    assert "Methods implemented validly: 2/4 (missing or invalid: view_balance, transfer)" in prompts[1]
    assert "FAILED" in prompts[1] or "ERROR" in prompts[1]


def test_loader_errors(tmp_path):
    env = envs.make("classeval")
    path = tmp_path / "ce.json"
    path.write_text(json.dumps([{"skeleton": "class A:\n    def f(self):\n        pass\n"}]))
    with pytest.raises(DatasetError, match=r"ce\.json: row 1 is missing the field 'test'"):
        env.load_dataset(str(path))
    path.write_text(
        json.dumps([{"skeleton": "class A:\n    def f(self, x):\n        '''doc'''\n", "test": "import unittest\n"}])
    )
    row = env.load_dataset(str(path))[0]
    assert row["class_name"] == "A" and [m["name"] for m in row["methods"]] == ["f"]
    assert task_from_row(row).methods[0].params == 1
    with pytest.raises(DatasetError, match="FudanSELab/ClassEval"):
        env.load_dataset("FudanSELab/ClassEval")  # offline; with no source the packaged classes load
