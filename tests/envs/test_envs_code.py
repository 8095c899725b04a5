"""Code environments (humaneval, coophumaneval, mbpp): levels, canonical solutions, loaders,
transitions.

Tests that run programs go through comlrl.sandbox; the canonical-solution checks use deterministic subsets.
"""

import json

import pytest

import comlrl.envs as envs
from comlrl.envs import DatasetError
from comlrl.envs.coding.functions import helper_names
from comlrl.envs.coding.tasks import mbpp_entry_point, split_check_tests, task_from_row

ROW = {  # a HumanEval-format problem with three asserts
    "task_id": "toy/0",
    "prompt": (
        'import math\n\n\ndef frac(x: float) -> float:\n    """Decimal part of x.\n    >>> frac(3.5)\n    0.5\n    """\n'
    ),
    "entry_point": "frac",
    "test": (
        "METADATA = {}\n\n\ndef check(candidate):\n    assert candidate(3.5) == 0.5\n"
        "    assert abs(candidate(1.25) - 0.25) < 1e-6\n    assert candidate(7.0) == 0.0\n    assert True\n"
    ),
    "canonical_solution": "    return x - math.floor(x)\n",
}
AUX = "Here is the helper:\n```python\ndef aux(x):\n    return math.floor(x)\n```"
MAIN = "def frac(x):\n    whole = aux(x)\n    return x - whole\n"


@pytest.fixture(scope="module")
def humaneval():
    return envs.make("humaneval")


def _score(env, aux, main, row=ROW):
    return env.reward_func.score([aux], [main], batch_items=[row])[0]


@pytest.mark.parametrize(
    "aux, main, expected",
    [
        (AUX, MAIN, 4.0),  # 0.4 + 0.6 + 0.5 + 1.0 + 0.5 + 1.0
        (
            "def aux(x):\n    return x - math.floor(x)",
            "def frac(x):\n    return aux(x)",
            3.0,
        ),  # trivial wrapper: no +1.0
        (AUX, "def frac(x):\n    aux(x)\n    return x - math.floor(x)", 3.5),  # result ignored: -0.5
        ("", "def frac(x):\n    return x % 1.0", 2.1),  # no aux: 0.6 + 0.5 + 1.0
        ("def aux(x):\n    pass", "def frac(x):\n    return x % 1.0", 2.1),  # aux without return: no +0.4
        (AUX, "def frac(x):\n    return 0.5", 1.5 + 1 / 3),  # 1 of 3 tests, aux unused
        (AUX, "def frac(x):\n    return 0.5 if aux(x) else 0.5", 1.5 + 1 / 3 + 1.5),  # 1/3 tests + uses aux
        (AUX, "def frac(x):\n    return 1.0", 1.5),  # defined, compiles, 0 tests: no bonus
        (AUX, "def frac(x):\n    return (x %\n", 1.0),  # defined but syntax error: stop after 0.4 + 0.6
        (AUX, "def other(x):\n    return x", 0.4),  # entry point missing: stop
        ("", "", 0.0),
        ("lorem ipsum dolor", "I am sorry, I cannot help with that.", 0.0),
    ],
)
def test_levels_hand_computed(humaneval, aux, main, expected):
    assert _score(humaneval, aux, main)["reward"] == pytest.approx(expected)


def test_level_keys_and_redefined_aux(humaneval):
    main = "def aux(x):\n    return 0\n\n" + MAIN  # redefines aux: stripped, teammate's aux is used
    out = _score(humaneval, AUX, main)
    assert out["reward"] == pytest.approx(4.0) and out["metric/redefined_aux"] == 1.0
    assert set(out) >= {
        "reward",
        "level/aux_defined",
        "level/defined",
        "level/syntax",
        "level/tests",
        "level/aux_used",
        "level/not_wrapper",
        "level/aux_ignored",
        "metric/pass",
        "metric/calls_aux",
    }
    assert out["metric/n_tests"] == 3.0  # ``assert True`` tests nothing and is skipped


def test_body_only_answer_and_helper_writing_main(humaneval):
    body = "whole = aux(x)\n    return x - whole"  # first line lost its indentation
    out = _score(humaneval, AUX + "\n\ndef frac(x):\n    return 0", body)
    assert out["metric/wrapped_body"] == 1.0 and out["reward"] == pytest.approx(4.0)  # aux's frac is dropped


def test_reward_call_matches_score_and_ignores_extras(humaneval):
    values = humaneval.reward_func([AUX, ""], [MAIN, ""], batch_items=[ROW], prompts=[["a", "b"], ["c", "d"]], turn=2)
    assert values == pytest.approx([4.0, 0.0])


def test_three_agents_helpers(tmp_path):
    env = envs.make("humaneval", num_agents=3)
    assert helper_names(3) == ["aux", "aux2"]
    assert "aux2" in env.formatters()[1](ROW) and "frac" in env.formatters()[2](ROW)
    main = "def frac(x):\n    return x - aux(x)\n"
    out = env.reward_func.score([AUX], ["I forgot."], [main], batch_items=[ROW])[0]
    assert out["level/aux_defined"] == 0.5  # aux defined, aux2 missing
    assert out["reward"] == pytest.approx(0.2 + 0.6 + 0.5 + 1.0 + 0.5 + 1.0)


def test_single_agent_env_and_split(humaneval):
    single = envs.make("humaneval", num_agents=1)
    program = (
        "```python\nimport math\n\ndef aux(x):\n    return math.floor(x)\n\ndef frac(x):\n    return x - aux(x)\n```"
    )
    assert single.reward_func([program], batch_items=[ROW])[0] == pytest.approx(4.0)
    aux_part, main_part = humaneval.split_single(program, ROW)
    assert aux_part.startswith("def aux") and "def aux" not in main_part and "def frac" in main_part
    assert _score(humaneval, aux_part, main_part)["reward"] == pytest.approx(4.0)


def test_transitions(humaneval):
    kwargs = dict(
        batch_item=ROW,
        prompt_history_per_agent=[["p"], ["q"]],
        response_history_per_agent=[["a"], ["b"]],
        turn=1,
        num_agents=2,
    )
    wrong = [AUX, "def frac(x):\n    return 0.5"]
    aux_prompt, main_prompt = humaneval.external_transition(agent_completions=wrong, **kwargs)
    assert "Decimal part of x" in main_prompt and "return 0.5" in main_prompt  # problem + previous answer
    assert "Tests: 1/3 passed" in main_prompt and "FAILED: assert abs(frac(1.25) - 0.25)" in main_prompt
    assert "does not call aux" in main_prompt and "Revise your `aux`" in aux_prompt
    syntax = humaneval.external_transition(agent_completions=[AUX, "def frac(x):\n    return (x"], **kwargs)[1]
    assert "Syntax: ERROR" in syntax and "line" in syntax
    for mode, present, absent in [
        ("level_passed", "Tests: some failed", "FAILED"),
        ("passed", "does not pass all tests", "Syntax"),
        ("plain", "Your previous answer", "Feedback"),
    ]:
        prompt = envs.make("humaneval", transition=mode).external_transition(agent_completions=wrong, **kwargs)[1]
        assert present in prompt and absent not in prompt
    with pytest.raises(ValueError, match="unknown transition 'verbose'"):
        envs.make("humaneval", transition="verbose")


def test_split_check_tests_fallbacks():
    tests, setup, ok = split_check_tests(
        "def check(candidate):\n    for x in range(3):\n        assert candidate(x) == x\n", "f"
    )
    assert ok and tests == ("for x in range(3):\n    assert f(x) == x",)
    tests, setup, ok = split_check_tests("def check(candidate):\n    print('no asserts')\n", "f")
    assert not ok and tests == ("check(f)",) and "def check" in setup
    tests, setup, ok = split_check_tests("def check(c):\n    import math\n    assert c(1) == math.e\n", "f")
    assert ok and tests == ("assert f(1) == math.e",) and "import math" in setup


def test_humaneval_package_loader_and_prompts(humaneval):
    ds = humaneval.load_dataset()
    assert len(ds) == 164 and ds[0]["task_id"] == "HumanEval/0"
    assert humaneval.load_dataset(limit=2).num_rows == 2
    task = task_from_row(ds[32])  # find_zero: the prompt gives ``poly``, which the program needs
    assert "def poly" in task.context and task.signature == "def find_zero(xs: list):"
    aux_prompt, main_prompt = [f(ds[0]) for f in humaneval.formatters()]
    assert (
        "named `aux`" in aux_prompt
        and "`has_close_elements`" in main_prompt
        and "def has_close_elements" in main_prompt
    )


def test_humaneval_canonical_solutions_pass(humaneval):
    rows = [dict(r) for r in humaneval.load_dataset(limit=20)]
    scores = humaneval.reward_func.score([""] * 20, [r["canonical_solution"] for r in rows], batch_items=rows)
    assert [s["level/tests"] for s in scores] == [1.0] * 20
    assert all(s["reward"] == pytest.approx(2.1) for s in scores)
    metrics = humaneval.evaluate([[""] * 20, [r["canonical_solution"] for r in rows]], rows)
    assert (
        metrics["pass@1"] == 1.0 and metrics["aux/usage_rate"] == 0.0 and metrics["reward/mean"] == pytest.approx(2.1)
    )


def test_mbpp_canonical_solutions_pass(shared_data):
    env = envs.make("mbpp")
    rows = [dict(r) for r in env.load_dataset(str(shared_data / "mbpp.jsonl"), limit=30)]  # tasks 1..30
    assert rows[0]["entry_point"] == "min_cost" and rows[0]["prompt"].startswith("def min_cost(cost, m, n):")
    scores = env.reward_func.score([""] * 30, [r["canonical_solution"] for r in rows], batch_items=rows)
    assert [s["level/tests"] for s in scores] == [1.0] * 30
    assert env.reward_func([""], ["garbage"], batch_items=rows[:1]) == [0.0]


def test_mbpp_entry_point_inference():
    assert (
        mbpp_entry_point("def helper(x):\n    return x\ndef solve(a):\n    return helper(a)", ["assert solve(1) == 1"])
        == "solve"
    )
    assert mbpp_entry_point("", ["assert set(foo([1])) == {1}"]) == "foo"


def test_coophumaneval_local_file(tmp_path):
    env = envs.make("coophumaneval")
    rows = [dict(ROW, task_id="coop/0"), {k: ROW[k] for k in ("prompt", "test", "entry_point")}]
    path = tmp_path / "coop.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    ds = env.load_dataset(str(path))
    assert ds["task_id"] == ["coop/0", "2"] and ds[0]["canonical_solution"].endswith("return x - math.floor(x)\n")
    assert ds[1]["canonical_solution"] == ""
    as_json = tmp_path / "coop.json"
    as_json.write_text(json.dumps(rows))
    assert env.load_dataset(str(as_json)).num_rows == 2
    assert env.reward_func([AUX], [MAIN], batch_items=[ds[0]]) == pytest.approx([4.0])
    with pytest.raises(DatasetError, match="'OpenMLRL/CoopHumanEval'"):
        env.load_dataset()


def test_a_solution_under_reference_is_refused_by_name(tmp_path):
    """The canonical solution's field is canonical_solution: a row that names it 'reference' fails, naming the row
    and the field, whether it is loaded from a file, given as reward batch items, or is a ClassEval row."""
    row = {k: v for k, v in ROW.items() if k != "canonical_solution"} | {"reference": ROW["prompt"] + "    return 0\n"}
    path = tmp_path / "coop.jsonl"
    path.write_text(json.dumps(ROW) + "\n" + json.dumps(row) + "\n")
    for name in ("coophumaneval", "codetest"):
        with pytest.raises(
            DatasetError, match=r"coop\.jsonl: row 2: code row 'toy/0' has a 'reference'.*`canonical_solution`"
        ):
            envs.make(name).load_dataset(str(path))
    with pytest.raises(DatasetError, match=r"code row 'toy/0' .*'reference'.*`canonical_solution`"):
        task_from_row(row)
    mbpp = {"task_id": 7, "text": "Return one.", "test_list": ["assert one() == 1"], "reference": "def one(): return 1"}
    with pytest.raises(DatasetError, match=r"code row 7 .*`canonical_solution`"):
        task_from_row(mbpp)
    with pytest.raises(
        DatasetError,
        match=r"classeval rows: row 1: classeval row 1 has a 'reference' .*`canonical_solution` \(the whole class",
    ):
        envs.make("classeval").load_dataset(
            [{"skeleton": "class A:\n    def f(self):\n        pass", "test": "", "reference": "x"}]
        )
    # a row with both keeps working: canonical_solution is read, 'reference' is just another column
    assert task_from_row(dict(ROW, reference="unused")).canonical_solution.endswith("return x - math.floor(x)\n")


def test_normalised_rows_carry_the_whole_canonical_program():
    env = envs.make("coophumaneval")
    ds = env.load_dataset([ROW])
    program = ds[0]["canonical_solution"]
    assert program == ROW["prompt"] + ROW["canonical_solution"] and "reference" not in ds.column_names
    assert env.load_dataset(ds)[0]["canonical_solution"] == program  # loading normalised rows again changes nothing
    assert task_from_row(ds[0]).canonical_solution == task_from_row(ROW).canonical_solution == program


def test_code_loader_errors(tmp_path):
    env = envs.make("coophumaneval")
    path = tmp_path / "coop.jsonl"
    path.write_text(json.dumps(ROW) + "\n" + json.dumps({"prompt": "x", "test": "y"}) + "\n")
    with pytest.raises(DatasetError, match=r"coop\.jsonl: row 2 is missing the field 'entry_point'"):
        env.load_dataset(str(path))
    path.write_text(json.dumps(ROW) + "\n{not json\n")
    with pytest.raises(DatasetError, match=r"coop\.jsonl: row 2 \(line 2\) is not valid JSON"):
        env.load_dataset(str(path))
    with pytest.raises(DatasetError, match="not found"):
        envs.make("mbpp").load_dataset(str(tmp_path / "nope.jsonl"))
    mbpp = tmp_path / "mbpp.jsonl"
    mbpp.write_text(json.dumps({"text": "t", "code": "def f(): return 1"}) + "\n")
    with pytest.raises(DatasetError, match=r"mbpp\.jsonl: row 1 is missing the field 'test_list'"):
        envs.make("mbpp").load_dataset(str(mbpp))
