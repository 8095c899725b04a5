"""Each kind of bad input stops with a message naming the culprit (agent, row, field)."""

import math

import pytest

from comlrl.config import MAGRPOConfig, MARLOOConfig
from comlrl.errors import ConfigError, FormatterError, RewardError, TransitionError
from comlrl.trainers.magrpo import MAGRPOTrainer, MARLOOTrainer
from tiny import tiny_model, tiny_tokenizer

ROWS = [{"prompt": f"q{i}", "question": f"what is {i}?"} for i in range(4)]


def make(reward=lambda a, b: [1.0], formatters=None, **cfg):
    args = MAGRPOConfig(**{"per_device_train_batch_size": 2, "num_generations": 2, "max_new_tokens": 4,
                           "max_steps": 1, "output_dir": "/tmp/comlrl_bad", "logging_steps": 0, "disable_tqdm": True, **cfg})
    return MAGRPOTrainer(model=tiny_model(), num_agents=2, tokenizer=tiny_tokenizer(), train_dataset=ROWS,
                         reward_func=reward, formatters=formatters or [lambda e: e["prompt"]] * 2, args=args)


@pytest.mark.parametrize(
    "reward,match",
    [
        (lambda a, b: [1.0, 2.0], r"returned 2 value\(s\) for 1 joint action"),
        (lambda a, b: [math.nan], "NaN"),
        (lambda a, b: [math.inf], "inf"),
        (lambda a, b: ["good"], "must be a number, got str"),
        (lambda a, b: [None], "must be a number, got NoneType"),
        (lambda a, b: 1.0, "must return a list"),
    ],
)
def test_bad_reward_values(reward, match):
    with pytest.raises(RewardError, match=match) as info:
        make(reward).train()
    assert "dataset row" in str(info.value) or "rows" in str(info.value)


def test_reward_raising_names_row_and_joint_action():
    def boom(a, b):
        raise ZeroDivisionError("bad division")

    with pytest.raises(RewardError, match=r"joint action 0, dataset row \d+, turn 1\) raised ZeroDivisionError: bad division"):
        make(boom).train()


def test_batched_reward_wrong_length():
    def r(a, b):
        return [0.0]

    r.batched = True
    with pytest.raises(RewardError, match=r"returned 1 value\(s\) for 4 joint action"):
        make(r).train()


def test_reward_processor_nan_is_caught():
    t = make()
    t.reward_processor = lambda x: math.nan
    with pytest.raises(RewardError, match="reward_processor"):
        t.train()


def test_formatter_raising_names_agent_and_row():
    def fmt(e):
        raise RuntimeError("broken template")

    with pytest.raises(FormatterError, match="formatter of agent 1 raised RuntimeError on dataset row 0: broken template"):
        make(formatters=[lambda e: e["prompt"], fmt])


def test_formatter_non_string():
    with pytest.raises(FormatterError, match="agent 0 returned int on dataset row 0"):
        make(formatters=[lambda e: 42, lambda e: e["prompt"]])


def test_dataset_missing_column_names_column_agent_and_row():
    with pytest.raises(FormatterError, match=r"agent 1 needs column 'answer' which dataset row 0 does not have"):
        make(formatters=[lambda e: e["prompt"], lambda e: e["answer"]])


def test_group_baseline_needs_two_generations():
    with pytest.raises(ConfigError, match="num_generations=1"):
        MAGRPOConfig(num_generations=1)
    with pytest.raises(ConfigError, match="num_generations=1"):
        MARLOOConfig(num_generations=1)
    assert MAGRPOConfig(num_generations=1, advantage_mode="none").num_generations == 1


def test_unknown_config_field_suggests():
    with pytest.raises(ConfigError, match="unknown field 'num_generation'. Did you mean 'num_generations'"):
        MAGRPOConfig(num_generation=4)
    with pytest.raises(ConfigError, match="joint_mode='crosss'.*Did you mean 'cross'"):
        MAGRPOConfig(joint_mode="crosss")


def test_contradictory_aliases():
    with pytest.raises(ConfigError, match="max_completion_length=64 contradicts max_new_tokens=32"):
        MAGRPOConfig(max_completion_length=64, max_new_tokens=32)


def test_num_agents_disagreements():
    m, tok = tiny_model(), tiny_tokenizer()
    with pytest.raises(ConfigError, match="agents=2, num_agents=3"):
        MAGRPOTrainer(agents=[m, m], num_agents=3, tokenizer=tok, train_dataset=ROWS, reward_func=lambda a, b: [0.0])
    with pytest.raises(ConfigError, match="num_agents=2, formatters=3"):
        MAGRPOTrainer(model=m, num_agents=2, tokenizer=tok, train_dataset=ROWS, reward_func=lambda a, b: [0.0],
                      formatters=[lambda e: e["prompt"]] * 3)
    with pytest.raises(ConfigError, match="disagrees with args.num_agents=3"):
        MAGRPOTrainer(model=m, num_agents=2, tokenizer=tok, train_dataset=ROWS, reward_func=lambda a, b: [0.0],
                      args=MAGRPOConfig(num_agents=3))
    with pytest.raises(ConfigError, match="tokenizer= has 3 entries for 2 agents"):
        MAGRPOTrainer(model=m, num_agents=2, tokenizer=[tok] * 3, train_dataset=ROWS, reward_func=lambda a, b: [0.0])


def test_trainer_variant_rejects_other_baseline():
    with pytest.raises(ConfigError, match="MARLOOTrainer uses advantage_mode='loo'"):
        MARLOOTrainer(model=tiny_model(), tokenizer=tiny_tokenizer(), train_dataset=ROWS, reward_func=lambda a, b: [0.0],
                      args=MAGRPOConfig())


def test_multi_turn_needs_transition_and_checks_its_output():
    with pytest.raises(ConfigError, match="external_transition"):
        make(num_turns=2)
    args = MAGRPOConfig(per_device_train_batch_size=1, num_generations=2, max_new_tokens=3, max_steps=1,
                        num_turns=2, logging_steps=0, disable_tqdm=True)
    tr = MAGRPOTrainer(model=tiny_model(), tokenizer=tiny_tokenizer(), train_dataset=ROWS, reward_func=lambda a, b: [0.0],
                       external_transition=lambda agent_completions: "only one string", args=args)
    with pytest.raises(TransitionError, match="must return 2 prompt strings"):
        tr.train()


def test_missing_reward_and_model():
    with pytest.raises(ConfigError, match="reward_func= is required"):
        MAGRPOTrainer(model=tiny_model(), tokenizer=tiny_tokenizer(), train_dataset=ROWS)
    with pytest.raises(ConfigError, match="no model"):
        MAGRPOTrainer(tokenizer=tiny_tokenizer(), train_dataset=ROWS, reward_func=lambda a, b: [0.0])
