"""Time per training step of an embedded SmolLM2-135M team, split by stage, with peak memory.

Config (issue 6): 2 agents, full fine-tune fp32, 8 prompts of ~40 tokens, num_generations=4,
max_new_tokens=64, 1 turn, 1 epoch (8 steps at one prompt per step). Variants: full fine-tune,
LoRA on a shared base (2 agents), LoRA on a shared base (4 agents). Each variant runs in its own
process so that peak RSS is its own.

    python benchmarks/bench_train.py                 # all variants
    python benchmarks/bench_train.py --variant lora2 --steps 4
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time
from pathlib import Path

import torch

VARIANTS = {"full2": dict(agents=2, lora=False), "lora2": dict(agents=2, lora=True), "lora4": dict(agents=4, lora=True)}
DATA = Path(__file__).resolve().parents[2] / "shared" / "data" / "tldr_posts_extra.jsonl"


def matmul_peak(dtype: torch.dtype = torch.float32, n: int = 1024, reps: int = 20) -> float:
    """Measured GFLOP/s of a square matmul on this machine."""
    a, b = torch.randn(n, n, dtype=dtype), torch.randn(n, n, dtype=dtype)
    a @ b
    start = time.perf_counter()
    for _ in range(reps):
        a @ b
    return 2 * n**3 * reps / (time.perf_counter() - start) / 1e9


def prompts(n: int = 8) -> list[dict]:
    """n real Reddit posts cut to ~40 tokens (about 160 characters)."""
    rows = [json.loads(line) for line in DATA.read_text().splitlines()[:n]]
    return [{"prompt": "Summarize: " + r["prompt"][:150]} for r in rows]


def run_variant(name: str, steps: int) -> dict:
    from peft import LoraConfig

    from comlrl.trainers.magrpo import MAGRPOConfig, MAGRPOTrainer

    spec = VARIANTS[name]
    args = MAGRPOConfig(per_device_train_batch_size=1, num_generations=4, max_new_tokens=64, max_steps=steps,
                        learning_rate=1e-5, logging_steps=0, disable_tqdm=True, output_dir="/tmp/comlrl_bench")
    peft = LoraConfig(r=16, lora_alpha=32, lora_dropout=0.0, target_modules="all-linear") if spec["lora"] else None
    trainer = MAGRPOTrainer(model="embedded", num_agents=spec["agents"], train_dataset=prompts(),
                            reward_func=lambda *c: [float(len(c[-1][0]) - len(c[0][0])) / 100], args=args, peft_config=peft)
    n_params = sum(p.numel() for n, p in trainer.agents[0].model.named_parameters() if "lora_" not in n)
    start = time.perf_counter()
    hist = trainer.train()["history"]
    total = time.perf_counter() - start
    keys = ["time/generate", "time/reward", "time/loss", "time/optimizer"]
    split = {k: sum(h.get(k, 0.0) for h in hist) / len(hist) for k in keys}
    tokens = sum(sum(h[f"agent/{i}/completion/mean_length"] * 4 for i in range(spec["agents"])) for h in hist)
    # training-phase FLOPs: forward + backward ~ 6 * params * tokens through the loss forward (prompt + completion)
    seq_tokens = sum((40 + h[f"agent/{i}/completion/mean_length"]) * 4 for h in hist for i in range(spec["agents"]))
    flops = (6 if not spec["lora"] else 4) * n_params * seq_tokens  # LoRA: no weight gradients for the base
    return {
        "variant": name, "steps": len(hist), "sec_per_step": total / len(hist),
        **{k.replace("time/", "sec_") : v for k, v in split.items()},
        "rollout_tokens_per_s": tokens / max(sum(h["time/generate"] for h in hist), 1e-9),
        "train_gflops_per_s": flops / max(sum(h["time/loss"] for h in hist), 1e-9) / 1e9,
        "peak_rss_gb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024**2,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--variant", choices=sorted(VARIANTS))
    parser.add_argument("--steps", type=int, default=8)
    ns = parser.parse_args()
    torch.set_num_threads(2)
    if ns.variant:
        print(json.dumps(run_variant(ns.variant, ns.steps)))
        return
    peak = matmul_peak()
    print(f"machine: {torch.get_num_threads()} threads, fp32 matmul peak {peak:.0f} GFLOP/s")
    print(f"{'variant':8} {'s/step':>7} {'gen':>6} {'reward':>6} {'loss':>6} {'optim':>6} {'tok/s':>7} {'MFU':>6} {'RSS GB':>7}")
    for name in VARIANTS:
        out = subprocess.run([sys.executable, __file__, "--variant", name, "--steps", str(ns.steps)],
                             capture_output=True, text=True)
        if out.returncode != 0:
            print(name, "failed:", out.stderr[-2000:])
            continue
        r = json.loads(out.stdout.strip().splitlines()[-1])
        print(f"{name:8} {r['sec_per_step']:7.2f} {r['sec_generate']:6.2f} {r['sec_reward']:6.3f} {r['sec_loss']:6.2f} "
              f"{r['sec_optimizer']:6.2f} {r['rollout_tokens_per_s']:7.1f} {r['train_gflops_per_s'] / peak:6.1%} "
              f"{r['peak_rss_gb']:7.2f}")


if __name__ == "__main__":
    main()
