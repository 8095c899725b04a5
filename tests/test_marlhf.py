"""MARLHFTrainer on tiny models: stage 3's config, the three stages end to end, labelled pairs, resume."""

import pytest
from tiny import tiny_model, tiny_tokenizer

from comlrl.config import MAGRPOConfig, MARLHFConfig
from comlrl.engine.reward_model import RewardModelReward
from comlrl.errors import ConfigError
from comlrl.trainers.marlhf import MARLHFTrainer, rl_config
from comlrl.trainers.preference import read_jsonl, shard_path

ROWS = [{"prompt": f"Task {i}: say something."} for i in range(12)]


def length_reward(a, b):
    return [float(len(b[0]) - len(a[0]))]


def cfg(tmp_path, **kw):
    base = dict(
        output_dir=str(tmp_path / "run"),
        preference_prompts=8,
        candidates_per_prompt=3,
        reward_model_training="full",
        reward_model_epochs=2,
        reward_model_batch_size=4,
        reward_model_eval_fraction=0.25,
        rl_args={"advantage_mode": "none"},
        num_generations=2,
        per_device_train_batch_size=2,
        max_new_tokens=6,
        max_steps=2,
        learning_rate=1e-3,
        logging_steps=0,
        disable_tqdm=True,
    )
    base.update(kw)
    return MARLHFConfig(**base)


def test_rl_config_takes_the_run_settings_and_rl_args(tmp_path):
    args = cfg(tmp_path, rl_args={"advantage_mode": "loo", "beta": 0.02})
    rl = rl_config(args)
    assert type(rl) is MAGRPOConfig
    assert (rl.advantage_mode, rl.beta, rl.max_steps, rl.learning_rate) == ("loo", 0.02, 2, 1e-3)
    with pytest.raises(ConfigError, match=r"rl_args.advantage_mod: not a field of MAGRPOConfig.*advantage_mode"):
        rl_config(cfg(tmp_path, rl_args={"advantage_mod": "loo"}))
    with pytest.raises(ConfigError, match=r"rl_args.max_steps: a run setting"):
        rl_config(cfg(tmp_path, rl_args={"max_steps": 3}))
    with pytest.raises(ConfigError, match="rl_algorithm"):
        rl_config(cfg(tmp_path, rl_algorithm="ppo"))
    assert rl_config(cfg(tmp_path, rl_algorithm="iac", rl_args={"gae_lambda": 0.5})).gae_lambda == 0.5


def test_three_stages_end_to_end(tmp_path):
    t = MARLHFTrainer(
        model=tiny_model(),
        num_agents=2,
        tokenizer=tiny_tokenizer(),
        train_dataset=ROWS,
        reward_func=length_reward,
        args=cfg(tmp_path),
    )
    out = t.train()
    pairs = read_jsonl(shard_path(tmp_path / "run", 0))
    assert pairs and all(p["chosen_reward"] > p["rejected_reward"] for p in pairs)
    rm = out["reward_model"]
    assert rm["reward_model/pairs"] + rm["reward_model/eval_pairs"] == len(pairs)
    assert 0.0 <= rm["reward_model/eval_accuracy"] <= 1.0
    assert (tmp_path / "run" / "reward_model" / "reward_model.json").is_file()
    assert isinstance(t.rl.reward_func, RewardModelReward)
    assert len(out["history"]) == 2 and "reward/level/reward_model" in out["history"][0]
    # evaluation scores the task reward, not the learned one
    ev = t.evaluate(eval_dataset=ROWS[:2])
    assert "eval/reward/level/reward_model" not in ev
    # resuming reuses the saved reward model (no stage 1 or 2 again)
    t.rl.save_checkpoint()
    again = MARLHFTrainer(
        model=tiny_model(),
        num_agents=2,
        tokenizer=tiny_tokenizer(),
        train_dataset=ROWS,
        reward_func=length_reward,
        args=cfg(tmp_path, max_steps=3, overwrite_output_dir=True),
    )
    again.preference_pairs = lambda: pytest.fail("stage 1 ran again on resume")
    result = again.train(resume_from_checkpoint=True)
    assert result["reward_model"] == rm and len(result["history"]) == 3


def test_labelled_pairs_need_no_task_reward(tmp_path):
    prefs = [{"prompt": f"Task {i}", "chosen": ["long answer", "long too"], "rejected": ["a", "b"]} for i in range(8)]
    t = MARLHFTrainer(
        model=tiny_model(),
        num_agents=2,
        tokenizer=tiny_tokenizer(),
        train_dataset=ROWS,
        preference_dataset=prefs,
        args=cfg(tmp_path, preferences="dataset"),
    )
    out = t.train()
    assert out["reward_model"]["reward_model/pairs"] == 6  # 2 of 8 prompts held out
    with pytest.raises(ConfigError, match="preference_dataset="):
        MARLHFTrainer(
            model=tiny_model(), num_agents=2, tokenizer=tiny_tokenizer(), args=cfg(tmp_path, preferences="dataset")
        )
    with pytest.raises(ConfigError, match="column 'chosen'"):
        MARLHFTrainer(
            model=tiny_model(),
            num_agents=2,
            tokenizer=tiny_tokenizer(),
            train_dataset=ROWS,
            preference_dataset=[{"prompt": "p", "rejected": ["a", "b"]}] * 2,
            args=cfg(tmp_path, preferences="dataset"),
        ).train()
