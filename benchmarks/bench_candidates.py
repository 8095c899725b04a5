"""MADPO candidate collection: one batched rollout per round vs one rollout per prompt, on the embedded team.

A round of ``--prompts`` TL;DR posts x ``--candidates`` joint candidates for a 2-agent LoRA team of the embedded
SmolLM2-135M (one shared base), 32 new tokens, temperature 1. ``batched`` is what MADPOTrainer does
(``collect_round``: every prompt's candidates in one rollout of the team); ``per_prompt`` collects the same round
one prompt at a time, the loop the batched rollout replaces. The two are interleaved round by round; generated
tokens/s (completion tokens up to and including EOS, both agents) and seconds per round are printed, best and
median.

    python benchmarks/bench_candidates.py [--rounds 3] [--prompts 8] [--candidates 4]
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

from peft import LoraConfig

from comlrl.configs.preference import MADPOConfig
from comlrl.rollout.sampling import derive_seed
from comlrl.trainers.madpo import MADPOTrainer

DATA = Path(__file__).resolve().parents[2] / "shared" / "data" / "tldr_posts_extra.jsonl"


def rows(n: int) -> list[dict]:
    posts = [json.loads(line)["prompt"] for line in DATA.open() if line.strip()]
    return [{"post": p[:300]} for p in posts[:n]]


def tokens(episode) -> int:
    return sum(int(s.completion_mask.sum()) for s in episode.turns[0].samples)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--candidates", type=int, default=4)
    ns = ap.parse_args()
    data = rows(ns.prompts)
    with tempfile.TemporaryDirectory() as out:
        args = MADPOConfig(
            num_generations=ns.candidates,
            prompts_per_round=ns.prompts,
            max_new_tokens=32,
            apply_chat_template=True,
            output_dir=out,
            disable_tqdm=True,
            seed=0,
        )
        lora = LoraConfig(
            r=8, lora_alpha=16, target_modules=["q_proj", "k_proj", "v_proj", "o_proj"], task_type="CAUSAL_LM"
        )
        trainer = MADPOTrainer(
            model="embedded",
            num_agents=2,
            train_dataset=data,
            reward_func=lambda a, b: [float(-len(a[0]) - len(b[0]))],
            formatters=[
                lambda r: "Summarize in one sentence:\n" + r["post"],
                lambda r: "Summarize briefly:\n" + r["post"],
            ],
            args=args,
            peft_config=lora,
        )
        settings = trainer.generation_settings(train=True)
        ids = list(range(len(data)))
        results: dict[str, list[tuple[float, float]]] = {"batched": [], "per_prompt": []}
        for r in range(ns.rounds + 1):  # round 0 warms both paths up (kernels, caches) and is not counted
            for name in results:
                seed = derive_seed(0, "bench", r)
                start = time.perf_counter()
                if name == "batched":
                    n = tokens(
                        trainer.rollout(
                            data,
                            ids,
                            settings=settings,
                            num_generations=ns.candidates,
                            reward_func=trainer.reward_func,
                            seed=seed,
                        )
                    )
                else:
                    n = sum(
                        tokens(
                            trainer.rollout(
                                [row],
                                [i],
                                settings=settings,
                                num_generations=ns.candidates,
                                reward_func=trainer.reward_func,
                                seed=seed,
                            )
                        )
                        for i, row in enumerate(data)
                    )
                elapsed = time.perf_counter() - start
                if r:
                    results[name].append((n / elapsed, elapsed))
        for name, runs in results.items():
            rates = [x for x, _ in runs]
            secs = [s for _, s in runs]
            print(
                f"{name:>10}: {max(rates):7.1f} tokens/s best, {statistics.median(rates):7.1f} median; "
                f"{statistics.median(secs):6.2f} s per round of {ns.prompts} prompts x {ns.candidates} candidates"
            )


if __name__ == "__main__":
    main()
