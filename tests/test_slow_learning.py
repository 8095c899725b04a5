"""The proof that learning happens: two embedded SmolLM2-135M agents raise a dense team reward.

Slow (a few minutes on 2 CPU cores) but part of CI. Task: both agents summarize the same real
Reddit post; the team is rewarded for a short joint answer (1 - total words / 48, clipped at 0).
"""

import json

import pytest
from datasets import load_dataset

from comlrl.config import MAGRPOConfig
from comlrl.trainers.magrpo import MAGRPOTrainer

pytestmark = pytest.mark.slow


def team_brevity(a, b):
    return [1.0 - min(len(a[0].split()) + len(b[0].split()), 48) / 48]


def test_embedded_team_reward_rises(shared_data, tmp_path):
    ds = load_dataset("json", data_files=str(shared_data / "tldr_posts_extra.jsonl"), split="train")
    ds = ds.map(lambda e: {"post": e["prompt"][:300]})
    train, held_out = ds.select(range(8, 100)), ds.select(range(8))
    formatters = [
        lambda e: "Summarize in one short sentence:\n" + e["post"],
        lambda e: "Summarize briefly:\n" + e["post"],
    ]
    steps = 30
    args = MAGRPOConfig(
        per_device_train_batch_size=2,
        num_generations=4,
        max_new_tokens=24,
        learning_rate=5e-5,
        max_steps=steps,
        apply_chat_template=True,
        output_dir=str(tmp_path),
        seed=0,
    )
    trainer = MAGRPOTrainer(
        model="embedded",
        num_agents=2,
        train_dataset=train,
        eval_dataset=held_out,
        reward_func=team_brevity,
        formatters=formatters,
        args=args,
    )
    before = trainer.evaluate()["eval/reward/mean"]
    out = trainer.train()
    after = trainer.evaluate()["eval/reward/mean"]
    rewards = [h["reward/mean"] for h in out["history"]]
    first, last = sum(rewards[:6]) / 6, sum(rewards[-6:]) / 6
    summary = {"eval_before": before, "eval_after": after, "train_first6": first, "train_last6": last, "steps": steps}
    print("LEARNING", json.dumps(summary))
    (tmp_path / "summary.json").write_text(json.dumps(summary))
    assert last > first + 0.15, summary
    assert after > before + 0.15, summary
