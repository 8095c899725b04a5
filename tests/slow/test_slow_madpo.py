"""MADPO learns: two embedded SmolLM2-135M agents (LoRA on one shared base) raise a dense team reward in a few
online rounds of collect -> pair -> train.

Slow (1-3 minutes on 2 CPU cores) but part of CI. The task and reward are test_slow_learning's: both agents
summarize the same Reddit post; the team reward is 1 - total words / 48 (clipped at 0).
"""

import json

import pytest
from brevity_task import FORMATTERS, NEEDS_NATIVE_BF16, posts, team_brevity
from peft import LoraConfig

from comlrl.configs.preference import MADPOConfig
from comlrl.trainers.madpo import MADPOTrainer

pytestmark = [pytest.mark.slow, NEEDS_NATIVE_BF16]


def test_embedded_lora_team_learns_with_madpo(shared_data, tmp_path):
    train, held_out = posts(shared_data)
    args = MADPOConfig(
        num_rounds=5,
        prompts_per_round=8,
        num_generations=4,
        steps_per_round=4,
        per_device_train_batch_size=4,
        beta=0.1,
        learning_rate=5e-4,
        max_new_tokens=24,
        apply_chat_template=True,
        output_dir=str(tmp_path),
        seed=0,
        bf16=None,  # bf16 where native; emulated bf16 (an AVX2-only CPU) is ~60x slower (fp32 numbers: docs/trainers.md)
    )
    lora = LoraConfig(
        r=8, lora_alpha=16, target_modules=["q_proj", "k_proj", "v_proj", "o_proj"], task_type="CAUSAL_LM"
    )
    trainer = MADPOTrainer(
        model="embedded",
        num_agents=2,
        train_dataset=train,
        eval_dataset=held_out,
        reward_func=team_brevity,
        formatters=FORMATTERS,
        args=args,
        peft_config=lora,
    )
    before = trainer.evaluate()["eval/reward/mean"]
    out = trainer.train()
    after = trainer.evaluate()["eval/reward/mean"]
    rounds = [h["reward/mean"] for h in out["history"][:: args.steps_per_round]]  # each round's candidates
    summary = {"eval_before": before, "eval_after": after, "candidate_reward_per_round": rounds}
    print("LEARNING", json.dumps(summary))
    # the held-out gain varies between runs of the same code on this machine class (+0.24 and +0.15 seen, same seed:
    # float reductions differ with the host's load and kernels' paths); +0.1 is still far above a run that does not
    # learn, and the candidates' rise below is the steadier signal
    assert after > before + 0.1, summary
    assert rounds[-1] > rounds[0] + 0.1, summary
    assert (tmp_path / "pairs" / "round-00004.jsonl").is_file()
