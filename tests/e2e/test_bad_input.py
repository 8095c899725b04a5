"""Each kind of bad input stops with a message naming the culprit (agent, row, field)."""

import json
import logging
import math
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from tiny import tiny_model, tiny_tokenizer

from comlrl import runconfig
from comlrl.configs.actor_critic import IACConfig, MAACConfig
from comlrl.configs.base import TrainConfig
from comlrl.configs.policy import MAGRPOConfig, MAREINFORCEConfig, MAReMaxConfig, MARLOOConfig
from comlrl.engine.models import load_model, load_tokenizer
from comlrl.errors import ConfigError, FormatterError, ModelLoadError, RewardError, TransitionError
from comlrl.rollout.episode import TRANSITION_KWARGS, Node, check_transition, transition
from comlrl.trainers.build import check_batch_size
from comlrl.trainers.magrpo import MAGRPOTrainer, MARLOOTrainer

ROWS = [{"prompt": f"q{i}", "question": f"what is {i}?"} for i in range(4)]


def make(reward=lambda a, b: [1.0], formatters=None, **cfg):
    args = MAGRPOConfig(
        **{
            "per_device_train_batch_size": 2,
            "num_generations": 2,
            "max_new_tokens": 4,
            "max_steps": 1,
            "output_dir": "/tmp/comlrl_bad",
            "logging_steps": 0,
            "disable_tqdm": True,
            **cfg,
        }
    )
    return MAGRPOTrainer(
        model=tiny_model(),
        num_agents=2,
        tokenizer=tiny_tokenizer(),
        train_dataset=ROWS,
        reward_func=reward,
        formatters=formatters or [lambda e: e["prompt"]] * 2,
        args=args,
    )


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

    with pytest.raises(
        RewardError, match=r"joint action 0, dataset row \d+, turn 1\) raised ZeroDivisionError: bad division"
    ):
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

    with pytest.raises(
        FormatterError, match="formatter of agent 1 raised RuntimeError on dataset row 0: broken template"
    ):
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
        MAGRPOTrainer(
            model=m,
            num_agents=2,
            tokenizer=tok,
            train_dataset=ROWS,
            reward_func=lambda a, b: [0.0],
            formatters=[lambda e: e["prompt"]] * 3,
        )
    with pytest.raises(ConfigError, match="disagrees with args.num_agents=3"):
        MAGRPOTrainer(
            model=m,
            num_agents=2,
            tokenizer=tok,
            train_dataset=ROWS,
            reward_func=lambda a, b: [0.0],
            args=MAGRPOConfig(num_agents=3),
        )
    with pytest.raises(ConfigError, match="tokenizer= has 3 entries for 2 agents"):
        MAGRPOTrainer(model=m, num_agents=2, tokenizer=[tok] * 3, train_dataset=ROWS, reward_func=lambda a, b: [0.0])


def test_trainer_variant_rejects_other_baseline():
    with pytest.raises(ConfigError, match="MARLOOTrainer uses advantage_mode='loo'"):
        MARLOOTrainer(
            model=tiny_model(),
            tokenizer=tiny_tokenizer(),
            train_dataset=ROWS,
            reward_func=lambda a, b: [0.0],
            args=MAGRPOConfig(),
        )


def test_multi_turn_needs_transition_and_checks_its_output():
    with pytest.raises(ConfigError, match="external_transition"):
        make(num_turns=2)
    args = MAGRPOConfig(
        per_device_train_batch_size=1,
        num_generations=2,
        max_new_tokens=3,
        max_steps=1,
        num_turns=2,
        logging_steps=0,
        disable_tqdm=True,
    )
    tr = MAGRPOTrainer(
        model=tiny_model(),
        tokenizer=tiny_tokenizer(),
        train_dataset=ROWS,
        reward_func=lambda a, b: [0.0],
        external_transition=lambda agent_completions: "only one string",
        args=args,
    )
    with pytest.raises(TransitionError, match="must return 2 prompt strings"):
        tr.train()


def test_missing_reward_and_model():
    with pytest.raises(ConfigError, match="reward_func= is required"):
        MAGRPOTrainer(model=tiny_model(), tokenizer=tiny_tokenizer(), train_dataset=ROWS)
    with pytest.raises(ConfigError, match="no model"):
        MAGRPOTrainer(tokenizer=tiny_tokenizer(), train_dataset=ROWS, reward_func=lambda a, b: [0.0])


# --- messages that say what was wrong and what to do ------------------------------------------------


@pytest.mark.parametrize(
    "value,kind", [(torch.tensor(1.0), "0-d Tensor"), (np.array(1.0), "0-d ndarray"), (np.float64(1.0), "number")]
)
def test_reward_returning_a_scalar_says_to_return_a_list(value, kind):
    with pytest.raises(RewardError, match=rf"returned a {kind} .*list with one float per joint action \(1 here\)"):
        make(lambda a, b: value).train()

    def batched(a, b):
        return torch.tensor(1.0)

    batched.batched = True
    with pytest.raises(RewardError, match=r"returned a 0-d Tensor .*one float per joint action \(4 here\)"):
        make(batched).train()


def test_reward_as_a_1d_tensor_is_accepted():
    def batched(a, b):
        return torch.ones(len(a))

    batched.batched = True
    assert make(batched).train()["metrics"]["reward/mean"] == 1.0


@pytest.mark.parametrize(
    "kwargs,message",
    [
        (
            {"learning_rate": "1e-4"},
            "MAGRPOConfig.learning_rate='1e-4' is a string; pass a number: learning_rate=1e-4.",
        ),
        ({"num_generations": "8"}, "MAGRPOConfig.num_generations='8' is a string; pass an integer: num_generations=8."),
        ({"max_steps": "1e3"}, "max_steps='1e3' is a string; pass an integer: max_steps=1000."),
        ({"shuffle": "false"}, "MAGRPOConfig.shuffle='false' is a string; pass True or False: shuffle=False"),
        ({"learning_rate": True}, "MAGRPOConfig.learning_rate=True is a bool; pass a number."),
        ({"max_steps": 2.0}, "MAGRPOConfig.max_steps=2.0 is a float; pass an integer: max_steps=2."),
        ({"seed": None}, "MAGRPOConfig.seed=None; pass an integer."),
        ({"bf16": 2}, "MAGRPOConfig.bf16=2; pass True or False."),
        ({"team_lora_forward": "2"}, "team_lora_forward='2' is a string; pass True, False or an integer"),
        ({"eval_max_rows": "8"}, "eval_max_rows='8' is a string; pass an integer: eval_max_rows=8."),
    ],
)
def test_config_value_of_the_wrong_type_names_field_value_and_fix(kwargs, message):
    with pytest.raises(ConfigError) as info:
        MAGRPOConfig(**kwargs)
    assert message in str(info.value)


def test_config_types_accepted_and_variants_checked():
    a = MAGRPOConfig(
        learning_rate=0,
        seed=np.int64(3),
        adam_epsilon=np.float32(1e-6),
        bf16=1,
        team_lora_forward=True,
        eval_max_rows=None,
        report_to="none",
        output_dir=Path("/tmp/comlrl_bad"),
    )
    assert a.learning_rate == 0 and a.seed == 3 and a.report_to == []
    assert MAGRPOConfig(team_lora_forward=3).team_lora_forward == 3
    for cls in (TrainConfig, MAGRPOConfig, MAREINFORCEConfig, MARLOOConfig, MAReMaxConfig, IACConfig, MAACConfig):
        assert cls(**cls().to_dict()) == cls()  # every saved config loads back
        with pytest.raises(ConfigError, match=rf"{cls.__name__}.learning_rate='1e-4' is a string"):
            cls(learning_rate="1e-4")


def test_yaml_numbers_still_load_and_yaml_strings_are_named(tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text(
        "env: {name: tldr}\nmodel: embedded\n"
        "training: {learning_rate: 5.0e-4, adam_epsilon: 1e-6, num_generations: 2}\n"
    )
    args = runconfig.load_config(path).trainer_config()
    assert (args.learning_rate, args.adam_epsilon, args.num_generations) == (5e-4, 1e-6, 2)
    args = runconfig.load_config(path, ["training.learning_rate=5e-4"]).trainer_config()  # PyYAML: a string
    assert args.learning_rate == 5e-4
    path.write_text("env: {name: tldr}\nmodel: embedded\ntraining: {num_generations: '4'}\n")
    with pytest.raises(ConfigError, match="training: MAGRPOConfig.num_generations='4' is a string; pass an integer"):
        runconfig.load_config(path)


def test_missing_local_model_path_says_so(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    for source in ("./my_model", str(tmp_path / "nope"), "~/comlrl_no_such_model", "models/a/b"):
        for load in (load_model, load_tokenizer):
            with pytest.raises(ModelLoadError, match=r"the local path .* does not exist") as info:
                load(source)
            assert "Repo id" not in str(info.value)
    with pytest.raises(ModelLoadError, match=rf"{tmp_path / 'my_model'} does not exist"):
        load_model("./my_model")


def test_one_tokenizer_for_models_with_different_vocabularies_asks_for_one_per_agent():
    team = dict(train_dataset=ROWS, reward_func=lambda a, b: [0.0])
    with pytest.raises(ModelLoadError) as info:
        MAGRPOTrainer(agents=[tiny_model(), tiny_model(vocab_size=200)], tokenizer=tiny_tokenizer(), **team)
    msg = str(info.value)
    assert "agent 1: the tokenizer has 259 tokens but agent 1's model has a vocabulary of 200" in msg
    assert "pass one tokenizer per agent, in agent order (tokenizer=[tok_0, tok_1]" in msg
    assert "resize_token_embeddings" not in msg
    with pytest.raises(ModelLoadError, match="Pass agent 1's model's own tokenizer") as info:  # one per agent given
        MAGRPOTrainer(agents=[tiny_model(), tiny_model(vocab_size=200)], tokenizer=[tiny_tokenizer()] * 2, **team)
    assert "one tokenizer per agent" not in str(info.value)


HUB_SCRIPT = """
import json, sys, time
from comlrl.engine.models import load_model, load_tokenizer
out = {}
for source in ("someorg/somemodel", "someorg/tiny"):
    start = time.perf_counter()
    try:
        load_model(source), load_tokenizer(source)
        out[source] = ["loaded", time.perf_counter() - start]
    except Exception as exc:
        out[source] = [f"{type(exc).__name__}: {exc}", time.perf_counter() - start]
print(json.dumps(out))
"""


def test_unreachable_hub_fails_fast_and_cached_models_still_load(tmp_path):
    snapshot = tmp_path / "hub" / "models--someorg--tiny" / "snapshots" / ("a" * 40)  # huggingface_hub's cache layout
    tiny_model().save_pretrained(snapshot)
    tiny_tokenizer().save_pretrained(snapshot)
    (snapshot.parent.parent / "refs").mkdir()
    (snapshot.parent.parent / "refs" / "main").write_text("a" * 40)
    env = {k: v for k, v in os.environ.items() if not k.upper().endswith("_PROXY") and k != "HF_HUB_OFFLINE"}
    # A closed local port: the hub is unreachable on any machine (before: ~23 s of retries per file).
    env.update(HF_HOME=str(tmp_path), HF_ENDPOINT="http://127.0.0.1:9")
    proc = subprocess.run([sys.executable, "-c", HUB_SCRIPT], env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    message, seconds = out["someorg/somemodel"]
    assert seconds < 5, out
    assert message.startswith("ModelLoadError: could not load 'someorg/somemodel'") and "unreachable" in message
    assert out["someorg/tiny"][0] == "loaded" and out["someorg/tiny"][1] < 10, out


def test_transition_with_a_wrong_signature_lists_the_valid_names():
    with pytest.raises(TransitionError) as info:
        check_transition(lambda prompts, completions: prompts)
    msg = str(info.value)
    assert "external_transition(prompts, completions) requires 'completions'" in msg
    assert "Did you mean 'agent_completions'?" in msg and ", ".join(TRANSITION_KWARGS) in msg
    assert "def external_transition(prompts, agent_completions, **kwargs):" in msg

    def positional_only(prompts, /):
        return prompts

    with pytest.raises(TransitionError, match="requires 'prompts'"):
        check_transition(positional_only)

    class Stateful:
        def step(self, *, batch_item, turn, scale=1.0):
            return []

    for ok in (lambda agent_completions: [], lambda **kw: [], lambda prompts, extra=1: [], Stateful().step):
        check_transition(ok)


def test_transition_receives_every_documented_keyword():
    seen = {}

    def spy(**kwargs):
        seen.update(kwargs)
        return ["a", "b"]

    node = Node(
        row={"prompt": "q"}, row_id=0, prompts=["p0", "p1"], prompt_history=[["p0"], ["p1"]], response_history=[[], []]
    )
    child = transition(spy, node, ["c0", "c1"], 1)
    assert sorted(seen) == sorted(TRANSITION_KWARGS) and child.prompts == ["a", "b"]
    assert seen["response_history_per_agent"] == [["c0"], ["c1"]] and seen["turn"] == 1


def test_wrong_transition_signature_fails_at_construction_with_the_valid_names():
    args = MAGRPOConfig(
        per_device_train_batch_size=1,
        num_generations=2,
        max_new_tokens=3,
        max_steps=1,
        num_turns=2,
        logging_steps=0,
        disable_tqdm=True,
    )
    with pytest.raises(TransitionError, match="requires 'completions', which comlrl does not pass") as info:
        MAGRPOTrainer(
            model=tiny_model(),
            tokenizer=tiny_tokenizer(),
            train_dataset=ROWS,
            reward_func=lambda a, b: [0.0],
            external_transition=lambda prompts, completions: prompts,
            args=args,
        )
    assert ", ".join(TRANSITION_KWARGS) in str(info.value)


def test_batch_larger_than_dataset_warns_with_both_numbers(caplog):
    with caplog.at_level(logging.WARNING, logger="comlrl.trainers.build"):
        check_batch_size(3, 8)
    [record] = caplog.records
    assert record.levelno == logging.WARNING
    assert "per_device_train_batch_size=8 is larger than train_dataset (3 rows)" in record.getMessage()
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="comlrl.trainers.build"):
        check_batch_size(8, 8)
        check_batch_size(10, 4)
        check_batch_size(0, 4)  # an empty dataset is _check_dataset's error, not this warning
    assert not caplog.records
