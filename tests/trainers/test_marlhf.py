"""MARLHFTrainer on tiny models: stage 3's config, the three stages end to end, labelled pairs, resume."""

import json

import pytest
import torch
from peft import LoraConfig
from tiny import tiny_model, tiny_tokenizer
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

from comlrl.configs.policy import MAGRPOConfig
from comlrl.configs.preference import MARLHFConfig
from comlrl.engine.reward_model import RewardModelReward, score_joint
from comlrl.errors import ConfigError
from comlrl.trainers.marlhf import MARLHFTrainer, rl_config
from comlrl.trainers.pairs import read_jsonl, shard_path

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


def trainer(tmp_path, **kw) -> MARLHFTrainer:
    """The tiny two-agent MARLHF run most tests use: ROWS, the length reward; ``args`` keywords go to cfg()."""
    kw.setdefault("train_dataset", ROWS)
    kw.setdefault("reward_func", length_reward)
    return MARLHFTrainer(model=tiny_model(), num_agents=2, tokenizer=tiny_tokenizer(), **kw)


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
    t = trainer(tmp_path, args=cfg(tmp_path))
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
    again = trainer(tmp_path, args=cfg(tmp_path, max_steps=3, overwrite_output_dir=True))
    again.preference_pairs = lambda: pytest.fail("stage 1 ran again on resume")
    # a saved reward model whose metrics.json lacks the score statistics: they are recomputed from the stored pairs
    saved = tmp_path / "run" / "reward_model" / "metrics.json"
    old = {k: v for k, v in json.loads(saved.read_text()).items() if "score_" not in k}
    saved.write_text(json.dumps(old))
    result = again.train(resume_from_checkpoint=True)
    assert result["reward_model"] == pytest.approx(rm, abs=1e-6) and len(result["history"]) == 3
    assert again.rl.reward_func.normalize and again.rl.reward_func.score_std == pytest.approx(
        rm["reward_model/score_std"], abs=1e-6
    )


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


def test_reward_model_scores_are_normalized_with_the_logged_statistic(tmp_path):
    """Stage 3 reads (score - mean) / std, mean and std of the reward model's scores on the stage 1 pairs' joint
    answers (both sides), reported as reward_model/score_mean and reward_model/score_std."""
    t = trainer(tmp_path, args=cfg(tmp_path, max_steps=1))
    assert t.args.reward_model_normalize is True
    out = t.train()
    rm = out["reward_model"]
    mean, std = rm["reward_model/score_mean"], rm["reward_model/score_std"]
    pairs = read_jsonl(shard_path(tmp_path / "run", 0))
    model, tok = t.reward_model, t.reward_tokenizer
    scores = torch.cat(
        [
            score_joint(
                model,
                tok,
                [[p["prompts"][i] for p in pairs] for i in range(2)],
                [[p[key][i] for p in pairs] for i in range(2)],
            )
            for key in ("chosen", "rejected")
        ]
    )
    assert mean == pytest.approx(float(scores.mean()), abs=1e-5)
    assert std == pytest.approx(float(scores.std(unbiased=False)), abs=1e-5)
    step = out["history"][0]
    assert step["reward/level/reward_model"] == pytest.approx(
        (step["reward/level/reward_model_raw"] - mean) / std, abs=1e-4
    )
    assert step["reward/level/unreadable"] == 0.0


def word_tokenizer() -> PreTrainedTokenizerFast:
    vocab = {w: i for i, w in enumerate(["[UNK]", "<pad>", "</s>", "hello", "world", "good", "answer", ","])}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    return PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]", pad_token="<pad>", eos_token="</s>")


def test_unreadable_text_is_counted_and_skipped_not_fatal(tmp_path):
    """A pair the reward model's tokenizer cannot read is dropped from stage 2 (reward_model/unreadable_pairs); an
    unreadable joint answer in stage 3 gets the neutral score and counts in reward/level/unreadable."""
    prefs = [
        {"prompt": "hello", "chosen": ["good answer", "hello world"], "rejected": ["good", "world"]} for _ in range(8)
    ]
    prefs[3] = {"prompt": "hello", "chosen": ["good zebra", "hello world"], "rejected": ["good", "world"]}
    tok = word_tokenizer()
    t = MARLHFTrainer(
        model=tiny_model(),
        num_agents=2,
        tokenizer=tiny_tokenizer(),
        train_dataset=[{"prompt": "hello"}] * 4,
        preference_dataset=prefs,
        reward_model=tiny_model(vocab_size=len(tok)),
        reward_model_tokenizer=tok,
        args=cfg(tmp_path, preferences="dataset", max_steps=1),
    )
    out = t.train()
    rm = out["reward_model"]
    assert rm["reward_model/unreadable_pairs"] == 1.0
    assert rm["reward_model/pairs"] + rm["reward_model/eval_pairs"] == 7
    # the agents write random bytes, which this word-level tokenizer cannot read: skipped, counted, neutral (0)
    step = out["history"][0]
    assert step["reward/level/unreadable"] == 1.0 and step["reward/level/reward_model"] == 0.0
    # a tokenizer that reads none of the pairs is the wrong one: stage 2 fails, naming the first
    odd = [
        dict(p, row=r, prompts=["zebra", "hello"]) for r, p in enumerate(read_jsonl(shard_path(tmp_path / "run", 0)))
    ]
    with pytest.raises(ConfigError, match=r"cannot read any of the 8 pairs; the first: the prompt of agent 1: .*zebra"):
        t.fit_reward_model(odd)


def test_reward_model_from_an_in_memory_lora_team_has_no_adapter_layers(tmp_path):
    lora = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM")
    t = trainer(tmp_path, args=cfg(tmp_path, reward_model_training="lora", reward_model_epochs=1), peft_config=lora)
    t.fit_reward_model(t.preference_pairs())
    names = [n for n, _ in t.reward_model.backbone.named_parameters()]
    assert not any("agent_" in n for n in names), [n for n in names if "agent_" in n][:3]
    assert any("lora_A.default" in n for n in names)  # the reward model's own adapter
