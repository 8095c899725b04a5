"""reasoning (reasoning-gym problems): disjoint seeded splits, task settings, the parts of split mode, hand-computed
rewards with a hack set, the solver_verifier transition, the baselines and a 2-turn training on a tiny model."""

import json
from fractions import Fraction

import pytest

import comlrl.envs as envs
from comlrl.envs import DatasetError
from comlrl.envs.core.baselines import run_baseline
from comlrl.envs.reasoning import question_text, verifier_prompt
from comlrl.envs.reasoning_reward import evaluate, is_work_line, question_numbers, read_reply
from comlrl.envs.reasoning_tasks import TEST_SEED_OFFSET, chunks, problem_parts, signed_terms

pytest.importorskip("reasoning_gym")

# chain_sum 4 - 1 - 7 = -4: agent 1's part 4 - 1 (3), agent 2's -7
SUM_ROW = {
    "task_id": "sum",
    "task": "chain_sum",
    "question": "State the final answer to the following arithmetic problem: 4 - 1 - 7 =",
    "answer": "-4",
    "metadata": json.dumps({"expression": "4 - 1 - 7"}),
}
# basic_arithmetic 12 + 7 + 3 = 22
ARITH_ROW = {
    "task_id": "arith",
    "task": "basic_arithmetic",
    "question": "Calculate 12 + 7 + 3.",
    "answer": "22",
    "metadata": json.dumps({"expression": "12 + 7 + 3"}),
}
HONEST_SOLVER = "12 + 7 = 19\n19 + 3 = 22\nAnswer: 22"


def split_scores(a, b, row=SUM_ROW, **options):
    return envs.make("reasoning", task=row["task"], **options).reward_func.score([a], [b], batch_items=[row])[0]


def sv_scores(solver, verifier, row=ARITH_ROW, **options):
    env = envs.make("reasoning", task=row["task"], roles="solver_verifier", **options)
    return env.reward_func.score([solver], [verifier], batch_items=[row])[0]


# --- splits and settings ------------------------------------------------------------------------------------------


def test_train_and_test_never_share_a_question_in_a_small_problem_space():
    # 1-digit sums of two terms: 10 x 10 x 2 signs = 200 questions at most, so the seeds alone would repeat some
    env = envs.make(
        "reasoning", task_config={"min_terms": 2, "max_terms": 2, "max_digits": 1}, train_size=120, test_size=40
    )
    train, test = env.load_dataset(split="train"), env.load_dataset(split="test")
    assert len(train) == 120 and len(test) == 40
    assert not set(train["question"]) & set(test["question"])
    assert len(set(train["question"])) == 120 and len(set(test["question"])) == 40  # no split repeats a question
    assert test["task_id"][0].startswith("chain_sum/test/") and train["task_id"][0].startswith("chain_sum/train/")
    again = envs.make(
        "reasoning", task_config={"min_terms": 2, "max_terms": 2, "max_digits": 1}, train_size=120, test_size=40
    )
    assert again.load_dataset(split="train", limit=5)["question"] == train["question"][:5]  # seeded, prefix-stable


def test_the_splits_draw_from_seeds_far_apart():
    import reasoning_gym as rg

    env = envs.make("reasoning", task="leg_counting", roles="solver_verifier", test_size=3, seed=7)
    test = env.load_dataset(split="test")
    assert test["question"][0] == rg.create_dataset("leg_counting", seed=7 + TEST_SEED_OFFSET, size=60)[0]["question"]
    assert (
        env.load_dataset(split="train", limit=1)["question"][0]
        == rg.create_dataset("leg_counting", seed=7, size=20000)[0]["question"]
    )
    with pytest.raises(DatasetError, match="unknown split 'valid'"):
        env.load_dataset(split="valid")


def test_task_config_reaches_reasoning_gym_and_a_bad_field_is_named():
    env = envs.make("reasoning", task_config={"min_terms": 5, "max_terms": 5})
    row = env.load_dataset(limit=1)[0]
    assert json.loads(row["metadata"])["num_terms"] == 5
    with pytest.raises(ValueError, match="'min_term' is not a setting of chain_sum. Did you mean 'min_terms'"):
        envs.make("reasoning", task_config={"min_term": 5})
    with pytest.raises(ValueError, match="'seed' is set by the env option seed"):
        envs.make("reasoning", task_config={"seed": 1})
    with pytest.raises(ValueError, match="reasoning-gym refuses.*chain_sum.*max_terms must be >= min_terms"):
        envs.make("reasoning", task_config={"min_terms": 4, "max_terms": 3})


def test_roles_and_tasks_are_checked():
    with pytest.raises(ValueError, match="task 'gsm_symbolic' does not support roles='split'.*solver_verifier"):
        envs.make("reasoning", task="gsm_symbolic")
    with pytest.raises(ValueError, match="unknown roles 'debate'; choose from split, solver_verifier"):
        envs.make("reasoning", roles="debate")
    with pytest.raises(ValueError, match="unknown task 'gsm8k'"):
        envs.make("reasoning", task="gsm8k", roles="solver_verifier")
    with pytest.raises(ValueError, match="solver_verifier' is a team of 2"):
        envs.make("reasoning", num_agents=3, task="countdown", roles="solver_verifier")
    assert envs.make("reasoning", roles="solver_verifier").defaults["num_turns"] == 2
    assert envs.make("reasoning").defaults["num_turns"] == 1 and envs.make("reasoning").external_transition is None


# --- parts ------------------------------------------------------------------------------------------------------


def test_signed_terms_and_parts_by_hand():
    assert signed_terms("4 - 1 - 7") == [4, -1, -7]
    assert signed_terms("5 - (3 - 2)") == [5, -3, 2] and signed_terms("2 - -1") == [2, 1]
    assert signed_terms("3 * 4 + 1") is None and signed_terms("-(1 + 2)") == [-1, -2]
    assert chunks([1, 2, 3, 4, 5], 2) == [[1, 2, 3], [4, 5]] and chunks([1, 2, 3], 3) == [[1], [2], [3]]
    # 2 cows (8 legs) + 3 chickens (6) | 1 spider (8) = 22
    meta = {"animals": {"cow": 2, "chicken": 3, "spider": 1}}
    parts = problem_parts("leg_counting", meta, "22", 2)
    assert [(p.text, p.value) for p in parts] == [("2 cows, 3 chickens", 14), ("1 spider", 8)]
    assert problem_parts("leg_counting", meta, "23", 2) is None  # parts that do not add up to the answer
    assert problem_parts("leg_counting", meta, "22", 4) is None  # more agents than animals
    parts = problem_parts("chain_sum", {"expression": "4 - 1 - 7"}, "-4", 2)
    assert [(p.text, p.value) for p in parts] == [("4 - 1", 3), ("-7", -7)]


def test_split_prompts_show_each_agent_only_its_part():
    env = envs.make("reasoning", task="leg_counting")
    row = dict(env.load_dataset(limit=1)[0])
    animals = json.loads(row["metadata"])["animals"]
    first, second = (f(row) for f in env.formatters())
    names = list(animals)
    half = (len(names) + 1) // 2
    assert all(f" {a}" in first for a in names[:half]) and not any(f" {a}" in first for a in names[half:])
    assert all(f" {a}" in second for a in names[half:]) and "Answer: <number>" in second
    basic = envs.make("reasoning", task="basic_arithmetic")
    exprs = [json.loads(r["metadata"])["expression"] for r in basic.load_dataset(limit=20)]
    assert all("*" not in e and "/" not in e for e in exprs)  # split mode draws sums and differences


# --- reading answers and work ---------------------------------------------------------------------------------------


def test_reading_the_answer_line():
    assert read_reply("work\nAnswer: 1,234.0", "chain_sum").value == "1234"
    assert read_reply("**Answer:** -4.", "chain_sum").value == "-4"
    assert read_reply("Answer: 3, 5, 7", "chain_sum").value is None  # a list of candidates
    assert read_reply("Answer: 3\nAnswer: 5", "chain_sum").value is None  # several answers
    assert read_reply("Answer: 3\nor maybe 5", "chain_sum").value is None  # not the last line
    assert read_reply("Answer: 12 legs", "leg_counting").value is None
    assert read_reply("Answer: (2 + 3) * 4", "countdown").value == "(2 + 3) * 4"
    assert read_reply("Answer: __import__('os')", "countdown").value is None
    assert evaluate("2 ** 99999") is None and evaluate("1 / 0") is None and evaluate("7 / 2") == Fraction(7, 2)


@pytest.mark.parametrize(
    "line, work",
    [
        ("12 + 7 = 19", True),
        ("Step 1: 3 cows × 5 legs = 15 legs", True),
        ("- 12 - 7 = 5", True),  # a list marker, then 12 - 7
        ("12x3 = 36", True),
        ("12 + 7 = 19 + 3 = 22", False),  # false: 19 != 22
        ("12 + 7 + 3", False),  # the question echoed, no equation
        ("12, 7, 3", False),
        ("12 + 0 = 12", False),  # an identity: its value is a number of the question
        ("1 + 1 = 2", False),  # uses no number of the question
        ("12 + 7 = 20", False),  # false
        ("= 22", False),
    ],
)
def test_work_lines(line, work):
    assert is_work_line(line, question_numbers("Calculate 12 + 7 + 3 and 3 cows.")) is work


# --- split rewards and the hack set --------------------------------------------------------------------------------


def test_split_honest_answer_scores_the_maximum():
    s = split_scores("4 - 1 = 3\nAnswer: 3", "Answer: -7")
    assert s["reward"] == pytest.approx(1.6) and s["metric/accuracy"] == 1.0
    assert (s["level/format"], s["level/part"], s["level/correct"]) == (1, 1, 1)
    assert (s["metric/part_1_correct"], s["metric/part_2_correct"]) == (1, 1)
    assert s["metric/labour_broken"] == 0.0


@pytest.mark.parametrize(
    "a, b, reward, broken",
    [
        ("Answer: -4", "Answer: 0", 0.2, 1.0),  # agent 1 answers the whole problem: the sum is right, nothing paid
        ("Answer: 0", "Answer: -4", 0.2, 1.0),  # agent 2 does it
        ("Answer: -7", "Answer: -7", 0.4, 1.0),  # agent 1 answers its teammate's part: only agent 2's part paid
        ("Answer: 4", "Answer: -7", 0.4, 0.0),  # a number of the question echoed: -3 is wrong
        ("Answer: 5", "Answer: 5", 0.2, 0.0),  # a constant answer: the format level alone
        ("Answer: 3\nAnswer: -4", "Answer: -7", 0.3, 0.0),  # several answers: agent 1's does not count, stop
        ("Answer: 3, -4", "Answer: -7", 0.3, 0.0),  # a list of candidates
        ("The answer is 3.", "Answer: -7", 0.3, 0.0),  # no Answer line
        ("", "", 0.0, 0.0),
    ],
)
def test_split_hacks_score_below_the_honest_answer(a, b, reward, broken):
    s = split_scores(a, b)
    assert s["reward"] == pytest.approx(reward) and s["reward"] < 1.6 and s["metric/accuracy"] == 0.0
    assert s["metric/labour_broken"] == broken


def test_split_three_agents_refuses_a_teammates_pair_of_parts():
    row = {**SUM_ROW, "question": "... 4 - 1 - 7 + 2 =", "answer": "-2", "metadata": '{"expression": "4 - 1 - 7 + 2"}'}
    env = envs.make("reasoning", num_agents=3)  # parts: 4 - 1 (3) | -7 | 2
    honest = env.reward_func.score(["Answer: 3"], ["Answer: -7"], ["Answer: 2"], batch_items=[row])[0]
    pair = env.reward_func.score(["Answer: 3"], ["Answer: -5"], ["Answer: 0"], batch_items=[row])[0]  # -7 + 2
    assert honest["reward"] == pytest.approx(1.6) and pair["reward"] == pytest.approx(0.2 + 0.4 / 3)
    assert pair["metric/labour_broken"] == 1.0 and pair["metric/parts_correct"] == pytest.approx(1 / 3)


def test_partial_credit_passes_the_package_score():
    single = envs.make("reasoning", num_agents=1)
    # chain_sum's verifier pays len("-4") / len("-40") when the right answer is inside a wrong one
    assert single.reward_func.score(["Answer: -40"], batch_items=[SUM_ROW])[0]["reward"] == pytest.approx(0.2)
    partial = envs.make("reasoning", num_agents=1, partial_credit=True)
    s = partial.reward_func.score(["Answer: -40"], batch_items=[SUM_ROW])[0]
    assert s["reward"] == pytest.approx(0.2 + 2 / 3) and s["metric/accuracy"] == 0.0


# --- solver + verifier ------------------------------------------------------------------------------------------


def test_solver_verifier_honest_and_the_roles_metrics():
    s = sv_scores(HONEST_SOLVER, "Answer: 22")
    assert s["reward"] == pytest.approx(1.4) and s["level/work"] == 1.0 and s["metric/accuracy"] == 1.0
    assert (s["metric/solver_accuracy"], s["metric/verifier_accuracy"], s["metric/agreement"]) == (1, 1, 1)
    fixed = sv_scores("12 + 7 = 19\nAnswer: 19", "Answer: 22")
    assert fixed["reward"] == pytest.approx(1.4) and fixed["metric/verifier_fixed"] == 1.0
    assert fixed["metric/solver_accuracy"] == 0.0 and fixed["metric/agreement"] == 0.0
    broke = sv_scores(HONEST_SOLVER, "Answer: 21")
    assert broke["reward"] == pytest.approx(0.4) and broke["metric/verifier_broke"] == 1.0


@pytest.mark.parametrize(
    "solver, verifier, reward",
    [
        ("Answer: 22", "Answer: 22", 1.2),  # no work where work is asked for
        ("12, 7, 3\nAnswer: 22", "Answer: 22", 1.2),  # the question's numbers echoed as the work
        ("12 + 7 + 3\nAnswer: 22", "Answer: 22", 1.2),
        ("12 + 0 = 12\nAnswer: 22", "Answer: 22", 1.2),
        (HONEST_SOLVER, "Answer: 12", 0.4),  # a number of the question echoed as the answer
        (HONEST_SOLVER, "Answer: 22\nAnswer: 23", 0.1),  # several answers: the gate stops the scoring
        (HONEST_SOLVER, "Answer: 21, 22, 23", 0.1),  # a list of candidates
        ("12 + 7 = 19\n19 + 3 = 22", "Answer: 22", 0.1),  # the solver gives no answer: no work is paid either
    ],
)
def test_solver_verifier_hacks_score_below_the_honest_answer(solver, verifier, reward):
    s = sv_scores(solver, verifier)
    assert s["reward"] == pytest.approx(reward) and s["reward"] < 1.4


def test_countdown_expression_answers_by_the_package_verifier():
    row = {
        "task_id": "cd",
        "task": "countdown",
        "question": "Calculate 24 using all of these numbers: 2, 3, 4.\nEach number may be used at most once.\n\n"
        "Final answer format instructions:\n1. Provide your solution as a arithmetic expression (no '=' sign).\n",
        "answer": "2*3*4",
        "metadata": json.dumps({"numbers": [2, 3, 4], "target": 24}),
    }
    env = envs.make("reasoning", num_agents=1, task="countdown", roles="solver_verifier")
    honest, wrong, echo = env.reward_func.score(
        ["2 * 3 = 6\n6 * 4 = 24\nAnswer: 2*3*4", "2 + 3 = 5\nAnswer: (2 + 3) * 4", "2 * 3 = 6\nAnswer: 24"],
        batch_items=[row] * 3,
    )
    assert honest["reward"] == pytest.approx(1.4) and wrong["reward"] == pytest.approx(0.4)
    assert echo["reward"] == pytest.approx(0.4)  # the target alone: the package's verifier wants its numbers
    assert "Final answer format" not in env.formatters()[0](row) and "Answer: <expression>" in env.formatters()[0](row)


def test_the_verifier_sees_the_solvers_work_in_the_second_turn():
    env = envs.make("reasoning", task="gsm_symbolic", roles="solver_verifier")
    row = dict(env.load_dataset(limit=1)[0])
    first = [f(row) for f in env.formatters()]
    nxt = env.external_transition(batch_item=row, agent_completions=[HONEST_SOLVER, "Answer: 1"], turn=1)
    assert nxt[1] == verifier_prompt(question_text(row), HONEST_SOLVER, task="gsm_symbolic")
    assert HONEST_SOLVER in nxt[1] and HONEST_SOLVER in nxt[0] and "Answer: 1" not in nxt[1]
    assert row["question"] in first[1] and HONEST_SOLVER not in first[1]


# --- single agent, baselines, loading ------------------------------------------------------------------------------


def _honest(prompt: str) -> str:
    """A fake model that solves its share: split parts from 'Your terms:' / 'Part k:' lines, else the question."""
    lines = prompt.splitlines()
    parts = [ln.split(":", 1)[1] for ln in lines if ln.startswith("Part ")]
    if parts:
        return "\n".join(f"Answer {k + 1}: {evaluate(p)}" for k, p in enumerate(parts))
    terms = next(ln.split(":", 1)[1] for ln in lines if ln.startswith("Your terms:"))
    return f"Answer: {evaluate(terms)}"


@pytest.mark.parametrize("mode, calls", [("single", 1), ("parallel", 2), ("sequential", 2), ("discussion", 4)])
def test_baselines_run_and_score_honest_answers(mode, calls):
    env = envs.make("reasoning", task_config={"max_digits": 2})
    rows = [dict(r) for r in env.load_dataset(split="test", limit=3)]
    seen = []

    def generate(agent, prompts):
        seen.append(agent)
        return [_honest(p) for p in prompts]

    out = run_baseline(env, mode, generate=generate, rows=rows)
    assert len(seen) == calls and out["num_tasks"] == 3
    assert out["reward/mean"] == pytest.approx(1.6) and out["metric/accuracy"] == 1.0


def test_single_format_scores_one_model_writing_every_part():
    env, team = envs.make("reasoning", format="single"), envs.make("reasoning")
    row = dict(team.load_dataset(limit=1)[0])
    answer = _honest(env.formatters()[0](row))
    assert env.reward_func.score([answer], batch_items=[row])[0]["reward"] == pytest.approx(1.6)
    assert team.split_single("Answer 2: 5\nAnswer 1: 4", row) == ["Answer: 4", "Answer: 5"]
    sv = envs.make("reasoning", roles="solver_verifier")
    assert sv.split_single(HONEST_SOLVER, row) == [HONEST_SOLVER, HONEST_SOLVER]


def test_local_rows_load_and_a_row_without_parts_is_named():
    env = envs.make("reasoning")
    rows = env.load_dataset([{**SUM_ROW, "metadata": {"expression": "4 - 1 - 7"}}])
    assert rows[0]["question"] == SUM_ROW["question"] and json.loads(rows[0]["metadata"]) == {"expression": "4 - 1 - 7"}
    with pytest.raises(DatasetError, match="row 1.*does not split into 2 parts"):
        env.load_dataset([{**SUM_ROW, "metadata": {"expression": "4 * 7"}}])
    with pytest.raises(DatasetError, match="row 1.*task is 'countdown'"):
        env.load_dataset([{**SUM_ROW, "task": "countdown"}])


def test_two_turn_training_shows_each_verifier_its_solvers_work(tmp_path):
    from tiny import tiny_model, tiny_tokenizer

    from comlrl.configs.policy import MAGRPOConfig
    from comlrl.trainers.magrpo import MAGRPOTrainer

    env = envs.make("reasoning", roles="solver_verifier")
    data = env.load_dataset(limit=2)
    args = MAGRPOConfig(
        per_device_train_batch_size=2,
        num_generations=2,
        max_new_tokens=8,
        max_steps=2,
        num_turns=2,
        output_dir=str(tmp_path / "run"),
        disable_tqdm=True,
        max_prompt_length=512,
    )
    trainer = MAGRPOTrainer(
        model=tiny_model(),
        num_agents=2,
        tokenizer=tiny_tokenizer(),
        train_dataset=data,
        reward_func=env.reward_func,
        formatters=env.formatters(),
        external_transition=env.external_transition,
        args=args,
    )
    out = trainer.train()
    assert trainer.state["step"] == 2 and "reward/turn_2/mean" in out["metrics"]
    row = dict(data[0])
    ep = trainer.rollout(
        [row], [0], settings=trainer.generation_settings(), num_generations=2, reward_func=env.reward_func
    )
    first = ep.turns[0]
    for k in range(2):  # joint action k (aligned: the k-th sample of each agent) -> its child node
        child = ep.turns[1].nodes[int(first.children[0, k])]
        work = first.samples[0].texts[k]
        assert child.prompts[1] == verifier_prompt(question_text(row), work, task="chain_sum")
