"""The proof that learning happens: two embedded SmolLM2-135M agents raise a dense team reward.

Slow (a few minutes on 2 CPU cores) but part of CI. Task: both agents summarize the same real
Reddit post; the team is rewarded for a short joint answer (1 - total words / 48, clipped at 0).
"""

import json

import pytest
from brevity_task import FORMATTERS, posts, team_brevity

from comlrl.configs.policy import MAGRPOConfig
from comlrl.trainers.magrpo import MAGRPOTrainer

pytestmark = pytest.mark.slow


def test_embedded_team_reward_rises(shared_data, tmp_path):
    train, held_out = posts(shared_data)
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
        formatters=FORMATTERS,
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
