"""Learning on code: the embedded SmolLM2-135M team (LoRA) raises its held-out codetest team reward.

Slow (a few minutes on 2 CPU cores) but part of CI; the shorter version of the run in docs/environments.md
("Learning on a code task"). Agent 1 writes MBPP functions, agent 2 assert tests; the team reward (max 7.0) runs
every program in the sandbox. Greedy evaluation on 8 held-out MBPP test problems before and after 8 steps.
"""

import json

import pytest
from peft import LoraConfig

from comlrl import envs
from comlrl.configs.policy import MAGRPOConfig
from comlrl.trainers.magrpo import MAGRPOTrainer

pytestmark = pytest.mark.slow


def test_embedded_team_learns_codetest(tmp_path):
    env = envs.make("codetest")
    train = env.load_dataset(split="train")  # MBPP tasks 601-974
    held_out = env.load_dataset(split="test", limit=8)  # tasks 11-18
    steps = 8
    args = MAGRPOConfig(
        per_device_train_batch_size=2,
        num_generations=4,
        max_new_tokens=64,
        learning_rate=5e-4,
        max_steps=steps,
        temperature=0.8,
        apply_chat_template=True,
        bf16=None,  # bf16 where native; emulated bf16 (an AVX2-only CPU) is ~60x slower than fp32
        output_dir=str(tmp_path),
        seed=42,
        disable_tqdm=True,
    )
    trainer = MAGRPOTrainer(
        model="embedded",
        num_agents=2,
        train_dataset=train,
        eval_dataset=held_out,
        reward_func=env.reward_func,
        formatters=env.formatters(),
        peft_config=LoraConfig(
            r=8, lora_alpha=16, lora_dropout=0.0, target_modules="all-linear", task_type="CAUSAL_LM"
        ),
        args=args,
    )
    before = trainer.evaluate()
    out = trainer.train()
    after = trainer.evaluate()
    keys = ["eval/reward/mean", "eval/reward/level/tests_written", "eval/reward/level/tests_valid"]
    summary = {
        "before": {k: before[k] for k in keys},
        "after": {k: after[k] for k in keys},
        "train": [round(h["reward/mean"], 3) for h in out["history"]],
        "steps": steps,
    }
    print("CODE LEARNING", json.dumps(summary))
    assert after["eval/reward/mean"] > before["eval/reward/mean"] + 0.5, summary
    assert after["eval/reward/level/tests_valid"] > before["eval/reward/level/tests_valid"], summary
