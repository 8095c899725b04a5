"""The centralized baseline: one model writes every role's answer in <agent_i> tags (CentralizedMAGRPOTrainer, the
``centralized`` evaluation baseline and the ``centralized_magrpo`` algorithm)."""

import json

import pytest
import toy_env
from tiny import tiny_model, tiny_tokenizer

from comlrl.algorithms.preference import CENTRALIZED_TEMPLATE, centralized_prompt, join_roles
from comlrl.configs.centralized import CentralizedMAGRPOConfig
from comlrl.configs.policy import MAGRPOConfig
from comlrl.engine.rewards import compute_rewards
from comlrl.envs.core.baselines import run_baseline
from comlrl.errors import ConfigError
from comlrl.trainers.centralized import CentralizedMAGRPOTrainer, RolePrompt, RoleSplitReward

ROWS = [{"prompt": f"Task {i}: say something."} for i in range(4)]
FORMATTERS = [lambda r: r["prompt"], lambda r: r["prompt"] + " More:"]


def cfg(**kw):
    base = dict(
        per_device_train_batch_size=2,
        num_generations=2,
        max_new_tokens=4,
        max_steps=2,
        learning_rate=1e-2,
        logging_steps=0,
        disable_tqdm=True,
    )
    return CentralizedMAGRPOConfig(**{**base, **kw})


def test_centralized_prompt_holds_every_role_prompt_in_order_and_the_tag_format():
    text = centralized_prompt(["Summarize the post.", "  Write a long summary.\n"])
    one, two = text.index("[Agent 1]\nSummarize the post."), text.index("[Agent 2]\nWrite a long summary.")
    assert one < two and "team of 2 agents" in text
    tags = [text.index(t) for t in ("<agent_1>", "</agent_1>", "<agent_2>", "</agent_2>")]
    assert tags == sorted(tags) and "<agent_3>" not in text
    assert centralized_prompt(["a", "b", "c"], "{num_roles}|{roles}|{format}").startswith("3|[Agent 1]\na\n\n[Agent 2]")
    assert centralized_prompt(["x"], "{{literal}} {roles}") == "{literal} [Agent 1]\nx"
    with pytest.raises(ValueError):
        centralized_prompt([])
    assert CentralizedMAGRPOConfig().centralized_template == CENTRALIZED_TEMPLATE
    for bad, why in (("no fields", "must contain"), ("{roles} {agents}", "KeyError"), ("{roles} {", "ValueError")):
        with pytest.raises(ConfigError, match=why):
            CentralizedMAGRPOConfig(centralized_template=bad)
    with pytest.raises(ConfigError, match="disagrees"):
        CentralizedMAGRPOConfig(num_roles=3, num_agents=2)


def test_reward_wrapper_passes_role_outputs_in_order_and_counts_parse_failures():
    calls = []

    def reward(a, b, prompts, batch_items):
        calls.append((a, b, prompts))
        return [float(len(b[0]) - len(a[0]))]

    wrapped = RoleSplitReward(reward, FORMATTERS)
    assert not hasattr(wrapped, "score") and not wrapped.batched
    good = "intro <agent_2> second, longer </agent_2>\n<agent_1>first</agent_1> outro"
    prompt = RolePrompt(["p1", "p2"], CENTRALIZED_TEMPLATE)
    rewards, levels = compute_rewards(
        wrapped,
        [[good, "no tags at all"]],
        prompts=[[prompt, "plain prompt"]],
        batch_items=ROWS[:2],
        row_ids=[0, 1],
    )
    assert rewards == [float(len("second, longer") - len("first")), 0.0] and levels == []
    # per joint action: role outputs in role order, and each role's prompt (rebuilt from the row without a RolePrompt)
    assert calls[0] == (["first"], ["second, longer"], [["p1"], ["p2"]])
    assert calls[1] == ([""], [""], [[FORMATTERS[0](ROWS[1])], [FORMATTERS[1](ROWS[1])]])
    assert (wrapped.joint_actions, wrapped.parse_failures) == (2, 1)


def test_reward_wrapper_keeps_batched_and_score_levels():
    env = toy_env.ToyEnv(2)
    wrapped = RoleSplitReward(env.reward_func, FORMATTERS)
    assert wrapped.batched and hasattr(wrapped, "score")
    texts = [join_roles(["a", "bbb"]), join_roles(["aaaa", "b"]), "<agent_1>x</agent_1>"]  # the last lacks agent_2
    rewards, levels = compute_rewards(
        wrapped, [texts], prompts=[[""] * 3], batch_items=ROWS[:3], row_ids=[0, 1, 2], turn=1
    )
    assert rewards == pytest.approx([0.2, -0.3, 0.0])
    assert levels == [{"level/longer": 1.0}, {"level/longer": 0.0}, {"level/longer": 0.0}]
    assert wrapped.parse_failures == 1


@pytest.fixture(scope="module")
def trained():
    """A 2-step run with a random tiny model (nothing it writes parses), and its evaluation."""
    seen = []

    def reward(a, b, prompts):
        seen.append((a, b, prompts))
        return [float(len(b[0]) - len(a[0]))]

    t = CentralizedMAGRPOTrainer(
        model=tiny_model(),
        tokenizer=tiny_tokenizer(),
        train_dataset=ROWS,
        eval_dataset=ROWS[:2],
        reward_func=reward,
        formatters=FORMATTERS,
        args=cfg(),
    )
    out = t.train()
    return t, out, t.evaluate(), seen


def test_training_runs_one_model_on_the_joint_completion_and_reports_parse_failures(trained):
    t, out, _, seen = trained
    assert (t.num_agents, t.num_roles, len(t.agents)) == (1, 2, 1)
    assert t.args.num_roles == 2 and t.state["step"] == 2
    # the one agent's prompt is the centralized prompt of the role prompts
    assert t.formatters[0](ROWS[0]) == centralized_prompt([f(ROWS[0]) for f in FORMATTERS])
    assert [h["centralized/parse_failure_rate"] for h in out["history"]] == [1.0, 1.0]
    assert "agent/0/policy/pg_loss" in out["metrics"] and "agent/1/policy/pg_loss" not in out["metrics"]
    # the reward saw N empty role outputs and each role's own prompt
    a, b, prompts = seen[0]
    assert a == [""] and b == [""] and prompts[1][0].endswith(" More:") and not prompts[0][0].endswith(" More:")


def test_evaluate_reports_the_rate_and_shows_role_outputs(trained):
    t, _, metrics, _ = trained
    assert metrics["eval/centralized/parse_failure_rate"] == 1.0
    sample = t.last_eval_samples[0]
    assert sample["completions"] == ["", ""] and sample["parsed"] is False
    assert isinstance(sample["joint_completion"], str) and sample["role_prompts"] == [f(ROWS[0]) for f in FORMATTERS]
    json.dumps(sample)  # the tracker writes samples as JSON


def test_parse_failure_rate_counts_the_episode_texts(trained):
    t = trained[0]
    ep = t.rollout(ROWS[:2], [0, 1], settings=t.generation_settings(), num_generations=2, reward_func=t.reward_func)
    ep.turns[0].samples[0].texts[:3] = [join_roles(["x", "y"])] * 3
    assert t.episode_metrics(ep)["centralized/parse_failure_rate"] == 0.25


def test_multi_turn_transition_sees_per_role_prompts_and_completions():
    calls, turn_prompts = [], []

    def transition(prompts, agent_completions, prompt_history_per_agent, response_history_per_agent, turn):
        calls.append((prompts, agent_completions, prompt_history_per_agent, response_history_per_agent, turn))
        return [f"Revise {p}" for p in prompts]

    def reward(a, b, prompts, turn):
        turn_prompts.append((turn, prompts[0][0], prompts[1][0]))
        return [0.0]

    t = CentralizedMAGRPOTrainer(
        model=tiny_model(),
        tokenizer=tiny_tokenizer(),
        train_dataset=ROWS,
        reward_func=reward,
        formatters=FORMATTERS,
        external_transition=transition,
        args=cfg(num_turns=2, max_steps=1, max_new_tokens=2),
    )
    t.train()
    prompts, completions, p_hist, r_hist, turn = calls[0]
    row_prompts = [prompts[0], prompts[1]]
    assert turn == 1 and completions == ["", ""] and p_hist == [[p] for p in row_prompts] and r_hist == [[""], [""]]
    assert prompts[1] == prompts[0] + " More:"
    second = [(p1, p2) for turn, p1, p2 in turn_prompts if turn == 2]
    assert second and all(p1.startswith("Revise Task") and p2.endswith(" More:") for p1, p2 in second)

    # a joint completion that parses: the transition gets its role outputs, the next prompt is centralized
    calls.clear()
    root = t.formatters[0](ROWS[0])
    joint = join_roles(["short", "longer one"])
    (nxt,) = t.external_transition(
        prompts=[root],
        agent_completions=[joint],
        prompt_history_per_agent=[[root]],
        response_history_per_agent=[[joint]],
        batch_item=ROWS[0],
        turn=1,
    )
    assert calls[0][1] == ["short", "longer one"] and calls[0][3] == [["short"], ["longer one"]]
    assert nxt == centralized_prompt([f"Revise {FORMATTERS[i](ROWS[0])}" for i in range(2)])
    assert nxt.role_prompts == [f"Revise {FORMATTERS[i](ROWS[0])}" for i in range(2)]


def test_team_arguments_are_checked():
    kw = dict(model=tiny_model(), tokenizer=tiny_tokenizer(), train_dataset=ROWS, reward_func=lambda a, b: [0.0])
    with pytest.raises(ConfigError, match="number of roles disagrees"):
        CentralizedMAGRPOTrainer(num_agents=3, formatters=FORMATTERS, args=cfg(), **kw)
    with pytest.raises(ConfigError, match="trains one model"):
        CentralizedMAGRPOTrainer(agents=[tiny_model(), tiny_model()], **{k: v for k, v in kw.items() if k != "model"})
    from comlrl.configs.actor_critic import IACConfig

    with pytest.raises(ConfigError, match="needs args=CentralizedMAGRPOConfig"):
        CentralizedMAGRPOTrainer(args=IACConfig(), **kw)
    # a MAGRPOConfig is read as a CentralizedMAGRPOConfig; num_agents counts the roles
    t = CentralizedMAGRPOTrainer(num_agents=3, args=MAGRPOConfig(max_steps=1, num_generations=2), **kw)
    assert isinstance(t.args, CentralizedMAGRPOConfig) and (t.num_roles, t.num_agents) == (3, 1)
    assert t.formatters[0](ROWS[0]).count("[Agent ") == 3


class TaggedGenerator:
    def __init__(self, answer):
        self.answer, self.calls = answer, []

    def __call__(self, agent, prompts):
        self.calls.append((agent, list(prompts)))
        return [self.answer] * len(prompts)


@pytest.mark.parametrize(
    "answer, outputs, rate",
    [(join_roles(["hi", "hello there"]), ["hi", "hello there"], 0.0), ("hi, hello there", ["", ""], 1.0)],
)
def test_centralized_baseline(answer, outputs, rate):
    env = toy_env.ToyEnv(2)
    gen = TaggedGenerator(answer)
    out = run_baseline(env, "centralized", generate=gen, rows=ROWS[:2])
    [(agent, prompts)] = gen.calls
    assert agent == 0 and prompts == [centralized_prompt([f(r) for f in env.formatters()]) for r in ROWS[:2]]
    expected = env.evaluate([[outputs[0]] * 2, [outputs[1]] * 2], ROWS[:2])
    assert out["centralized/parse_failure_rate"] == rate
    assert {k: out[k] for k in expected} == expected
    assert out["reward/mean"] == pytest.approx((len(outputs[1]) - len(outputs[0])) / 10)


def test_algorithm_is_registered_and_exported():
    import comlrl
    import comlrl.trainers
    from comlrl import runconfig
    from comlrl.runs import BASELINES

    algo = runconfig.get_algorithm("centralized_magrpo")
    assert algo.trainer_class() is CentralizedMAGRPOTrainer and algo.config_class() is CentralizedMAGRPOConfig
    assert comlrl.CentralizedMAGRPOTrainer is CentralizedMAGRPOTrainer
    assert comlrl.trainers.CentralizedMAGRPOConfig is CentralizedMAGRPOConfig
    assert "centralized" in BASELINES


def test_cli_trains_and_evaluates_a_centralized_run(tmp_path, capsys):
    from comlrl.cli import main

    model = tmp_path / "model"
    tiny_model().save_pretrained(model)
    tiny_tokenizer().save_pretrained(model)
    with toy_env.registered():
        rows = toy_env.write_rows(tmp_path / "rows.jsonl", n=6)
        config = toy_env.write_config(tmp_path / "toy.yaml", rows, str(model), max_steps=1, max_new_tokens=3)
        run = tmp_path / "run"
        sets = [
            "--set",
            "algorithm=centralized_magrpo",
            "--set",
            f"output_dir={run}",
            "--set",
            "evaluation.before=false",
        ]
        assert main(["train", config, *sets]) == 0
        assert sorted(p.name for p in (run / "final").iterdir() if p.is_dir()) == ["agent_0"]
        assert main(["eval", str(run), "--output", str(tmp_path / "eval.json")]) == 0
        team = json.loads((tmp_path / "eval.json").read_text())["team"]
        assert team["eval/centralized/parse_failure_rate"] == 1.0
        assert main(["eval", config, "--baseline", "centralized"]) == 0
    assert "centralized/parse_failure_rate" in capsys.readouterr().out
