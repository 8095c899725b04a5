"""Multi-turn rollout expansion: samples and seconds per training step under ``rollout_expansion`` tree, best and
top_k, on the same task and team.

The embedded SmolLM2-135M team (LoRA r=16 on one shared base) trains MAGRPO on the ``reasoning`` env (chain_sum, 2-4
one-digit terms split between the two agents) for ``--turns`` turns: after each turn every agent sees its own answer
and is asked to check it (a transition written here, so any number of turns works). Each variant builds its own
trainer and runs ``--steps`` optimizer steps of ``--rows`` rows x G = ``--generations`` samples; the samples every
agent drew per step are counted from the rollouts, and the seconds per step (rollout, reward and update) timed.
With T turns a row costs G + G^2 + ... + G^T samples per agent under tree, G*T under best and G + k*G*(T-1) under
top_k. Variants run one after the other; run it with nothing else on the machine.

    python benchmarks/bench_expansion.py [--turns 3] [--generations 3] [--rows 2] [--steps 2] [--top-k 2]
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time

import torch
from peft import LoraConfig

from comlrl import envs
from comlrl.configs.policy import MAGRPOConfig
from comlrl.trainers.magrpo import MAGRPOTrainer

TASK = {"task": "chain_sum", "roles": "split", "task_config": {"min_terms": 2, "max_terms": 4, "max_digits": 1}}


def check_again(prompts: list[str], agent_completions: list[str], **_) -> list[str]:
    """Each agent's next prompt: its own prompt and answer, and a request to check the answer."""
    return [
        f"{p}\n\nYour previous answer:\n{c}\n\nCheck it and give your final line `Answer: <number>` again."
        for p, c in zip(prompts, agent_completions)
    ]


def run_variant(expansion: str, ns: argparse.Namespace, out: str) -> dict:
    env = envs.make("reasoning", **TASK)
    train = env.load_dataset(split="train", limit=ns.rows * ns.steps)
    args = MAGRPOConfig(
        per_device_train_batch_size=ns.rows,
        num_generations=ns.generations,
        num_turns=ns.turns,
        rollout_expansion=expansion,
        expansion_top_k=ns.top_k,
        max_new_tokens=ns.max_new_tokens,
        temperature=0.8,
        learning_rate=5e-4,
        max_steps=ns.steps,
        apply_chat_template=True,
        output_dir=f"{out}/{expansion}",
        seed=0,
        disable_tqdm=True,
    )
    trainer = MAGRPOTrainer(
        model="embedded",
        num_agents=2,
        train_dataset=train,
        reward_func=env.reward_func,
        formatters=env.formatters(),
        external_transition=check_again,
        peft_config=LoraConfig(r=16, lora_alpha=32, lora_dropout=0.0, target_modules="all-linear"),
        args=args,
    )
    counts: list[list[int]] = []  # per rollout: samples of each agent, all turns
    rollout = trainer.rollout

    def counting_rollout(*a, **kw):
        episode = rollout(*a, **kw)
        counts.append([sum(len(t.samples[i].texts) for t in episode.turns) for i in range(2)])
        return episode

    trainer.rollout = counting_rollout
    start = time.perf_counter()
    history = trainer.train()["history"]
    seconds = time.perf_counter() - start
    return {
        "expansion": expansion,
        "samples_per_agent_per_step": [c[0] for c in counts],
        "samples_per_agent_per_row": counts[0][0] / ns.rows,
        "seconds_per_step": round(seconds / ns.steps, 1),
        "generate_seconds_per_step": round(sum(h.get("time/generate", 0.0) for h in history) / ns.steps, 1),
        "reward_mean": [round(h["reward/mean"], 3) for h in history],
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--turns", type=int, default=3)
    ap.add_argument("--generations", type=int, default=3)
    ap.add_argument("--rows", type=int, default=2)
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--top-k", type=int, default=2)
    ap.add_argument("--max-new-tokens", type=int, default=32)
    ap.add_argument("--variants", default="tree,best,top_k")
    ns = ap.parse_args()
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads; {json.dumps(vars(ns))}")
    with tempfile.TemporaryDirectory() as out:
        for expansion in ns.variants.split(","):
            print(json.dumps(run_variant(expansion, ns, out)), flush=True)


if __name__ == "__main__":
    main()
