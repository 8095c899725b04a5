"""Time per training step of an embedded SmolLM2-135M team, split by stage, with peak memory.

Config: 2 agents, full fine-tune fp32, 8 prompts of ~40 tokens, num_generations=4,
max_new_tokens=64, 1 turn, 1 epoch (8 steps at one prompt per step). Variants: full fine-tune fp32 (the reference
config; its two models decode at once), the same with the models decoding one after the other (``full2_seq``), with loss
micro-batches of 2 or with gradient checkpointing, fp32 training with bf16 rollouts,
bf16 autocast + bf16 rollouts (also with gradient checkpointing); LoRA r=16 on one shared base for 2 agents (fp32 and bf16) and 4 agents (bf16),
with the bf16 LoRA teams' loss passes routed for 2 agents at once (the default), one agent at a time (``*_solo``)
or the whole team at once (``*_team``).
Plain fp32 ``model.generate`` at each variant's rollout batch is measured in the same run as the tokens/s
baseline; for the bf16 LoRA teams also plain ``generate`` of the very model they roll out (bf16 base, one adapter per
agent, rows routed by ``adapter_names``: "vs same-model generate"; for full fine-tunes that column is the fp32 model).
Each variant runs in its own process so that peak RSS is its own. The pseudo-variant ``reference`` runs
the PyPI reference library (comlrl 1.4.3, full fine-tune fp32) on the same config through bench_reference.py in
.venv-ref (``bash scripts/setup_reference.sh``); it runs first, and each variant's speed is also given against it.

    python benchmarks/bench_train.py                      # every variant, a markdown table
    python benchmarks/bench_train.py --variants lora2,lora4 --steps 4
    python benchmarks/bench_train.py --variant lora2      # one variant, JSON
    python benchmarks/bench_train.py --variants reference,full2,lora2   # ratios against the reference, same run
    python benchmarks/bench_train.py --variants reference,full2,lora2 --repeats 2   # in turn twice, medians

MFU is measured against the fp32 matmul peak for fp32 variants and the bf16 peak for bf16 variants, counting
6 (LoRA: 4) x params x the tokens the packed loss pass runs (each prompt once, then its samples' completions).
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

# bf16: forward passes under bf16 autocast and bf16 rollouts (trained weights and AdamW states stay fp32; a frozen
# LoRA base is stored in bf16). forward_batch_size: loss micro-batches of 2 sequences (bounds activation memory).
VARIANTS = {
    "full2": dict(agents=2, lora=False, bf16=False),
    "full2_seq": dict(agents=2, lora=False, bf16=False, concurrent_rollout=False),
    "full2_mb2": dict(agents=2, lora=False, bf16=False, forward_batch_size=2),
    "full2_gc": dict(agents=2, lora=False, bf16=False, gradient_checkpointing=True),
    "full2_bf16roll": dict(agents=2, lora=False, bf16=False, rollout_dtype="bfloat16"),
    "full2_bf16roll_seq": dict(agents=2, lora=False, bf16=False, rollout_dtype="bfloat16", concurrent_rollout=False),
    "full2_bf16": dict(agents=2, lora=False, bf16=True),
    "full2_bf16_gc": dict(agents=2, lora=False, bf16=True, gradient_checkpointing=True),
    "lora2_fp32": dict(agents=2, lora=True, bf16=False),
    "lora2": dict(agents=2, lora=True, bf16=True),
    "lora4": dict(agents=4, lora=True, bf16=True),
    "lora2_solo": dict(agents=2, lora=True, bf16=True, team_lora_forward=1),
    "lora2_keep": dict(agents=2, lora=True, bf16=True, release_memory=False),
    "lora4_solo": dict(agents=4, lora=True, bf16=True, team_lora_forward=1),
    "lora4_team": dict(agents=4, lora=True, bf16=True, team_lora_forward=True),
}
DATA = Path(__file__).resolve().parents[2] / "shared" / "data" / "tldr_posts_extra.jsonl"
REFERENCE_PYTHON = Path(__file__).resolve().parents[1] / ".venv-ref" / "bin" / "python"


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


def run_variant(name: str, steps: int, n_prompts: int = 8) -> dict:
    from peft import LoraConfig

    from comlrl.trainers.magrpo import MAGRPOConfig, MAGRPOTrainer

    spec = VARIANTS[name]
    args = MAGRPOConfig(
        per_device_train_batch_size=1,
        num_generations=4,
        max_new_tokens=64,
        max_steps=steps,
        learning_rate=1e-5,
        logging_steps=0,
        disable_tqdm=True,
        output_dir="/tmp/comlrl_bench",
        bf16=spec["bf16"],
        forward_batch_size=spec.get("forward_batch_size"),
        gradient_checkpointing=spec.get("gradient_checkpointing", False),
        rollout_dtype=spec.get("rollout_dtype"),
        concurrent_rollout=spec.get("concurrent_rollout", True),
        team_lora_forward=spec.get("team_lora_forward", 2),
        release_memory=spec.get("release_memory", True),
    )
    peft = LoraConfig(r=16, lora_alpha=32, lora_dropout=0.0, target_modules="all-linear") if spec["lora"] else None
    trainer = MAGRPOTrainer(
        model="embedded",
        num_agents=spec["agents"],
        train_dataset=prompts(n_prompts),
        reward_func=lambda *c: [float(len(c[-1][0]) - len(c[0][0])) / 100],
        args=args,
        peft_config=peft,
    )
    n_params = sum(p.numel() for n, p in trainer.agents[0].model.named_parameters() if "lora_" not in n)
    start = time.perf_counter()
    hist = trainer.train()["history"]
    total = time.perf_counter() - start
    keys = ["time/generate", "time/reward", "time/loss", "time/optimizer"]
    split = {k: sum(h.get(k, 0.0) for h in hist) / len(hist) for k in keys}
    tokens = sum(sum(h[f"agent/{i}/completion/mean_length"] * 4 for i in range(spec["agents"])) for h in hist)
    # training-phase FLOPs: forward + backward ~ 6 * params * tokens through the loss forward. The 4 samples of a
    # prompt run as one packed sequence (packing.shared_prompt_layout): the ~40 prompt tokens once, then each
    # completion -- the FLOPs the loss pass really runs, not 4 x (prompt + completion)
    seq_tokens = sum(40 + h[f"agent/{i}/completion/mean_length"] * 4 for h in hist for i in range(spec["agents"]))
    flops = (6 if not spec["lora"] else 4) * n_params * seq_tokens  # LoRA: no weight gradients for the base
    return {
        "variant": name,
        "steps": len(hist),
        "sec_per_step": total / len(hist),
        **{k.replace("time/", "sec_"): v for k, v in split.items()},
        "rollout_tokens_per_s": tokens / max(sum(h["time/generate"] for h in hist), 1e-9),
        "train_gflops_per_s": flops / max(sum(h["time/loss"] for h in hist), 1e-9) / 1e9,
        "peak_rss_gb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024**2,
    }


def run_generate(batch: int, rounds: int = 3, lora_agents: int = 0) -> dict:
    """Plain ``model.generate`` (temperature 1, top_p 1, KV cache) at the rollout batch of a variant: generated tokens
    (up to EOS) per second, the baseline the rollout path is compared with. Default: the fp32 model. ``lora_agents``:
    the same model a bf16 LoRA team rolls out -- the bf16 base with one r=16 adapter per agent, each agent's rows
    routed to its adapter by ``generate(adapter_names=...)`` (PEFT's mixed-batch generate)."""
    from comlrl.engine.models import left_pad, load_model, load_tokenizer
    from comlrl.rollout.rollout import completion_mask, eos_ids, format_prompt

    model, tok = load_model("embedded").eval(), load_tokenizer("embedded")
    stop = eos_ids(model, tok)
    extra = {}
    if lora_agents:
        from peft import LoraConfig

        from comlrl.engine.team import adapter_parameters, build_lora_team

        config = LoraConfig(r=16, lora_alpha=32, lora_dropout=0.0, target_modules="all-linear")
        team = build_lora_team([model.to(torch.bfloat16)] * lora_agents, [0] * lora_agents, config)  # one shared base
        model = team[0][0].eval()
        for _, name in team:
            adapter_parameters(model, name)  # adapters in fp32 on the bf16 base, as the trainer keeps them
        extra["adapter_names"] = [name for _, name in team for _ in range(batch // lora_agents)]
    tokens, seconds = 0, 0.0
    for r, row in enumerate(prompts()[:rounds]):
        ids, mask = left_pad([format_prompt(tok, row["prompt"], False)] * batch, tok.pad_token_id)
        torch.manual_seed(r)
        start = time.perf_counter()
        with torch.no_grad():
            out = model.generate(
                input_ids=ids,
                attention_mask=mask,
                max_new_tokens=64,
                do_sample=True,
                temperature=1.0,
                top_p=1.0,
                top_k=None,
                pad_token_id=tok.pad_token_id,
                eos_token_id=stop,
                use_cache=True,
                **extra,
            )
        seconds += time.perf_counter() - start
        tokens += int(completion_mask(out[:, ids.shape[1] :], stop)[0].sum())
    name = f"generate_b{batch}" + (f"_lora{lora_agents}" if lora_agents else "")
    return {
        "variant": name,
        "tokens_per_s": tokens / seconds,
        "peak_rss_gb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024**2,
    }


def _subprocess(args: list[str], python: str = sys.executable, script: str = __file__) -> dict | None:
    out = subprocess.run([python, script, *args], capture_output=True, text=True)
    if out.returncode != 0:
        print(args, "failed:", out.stderr[-2000:])
        return None
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--variant", choices=sorted(VARIANTS))
    parser.add_argument(
        "--variants",
        help="comma-separated variants to run, 'reference' among them (default: all, "
        "with the reference first when .venv-ref exists)",
    )
    parser.add_argument("--generate-batch", type=int, help="(internal) measure plain generate at this batch")
    parser.add_argument(
        "--generate-lora",
        type=int,
        default=0,
        help="(internal) with --generate-batch: on a bf16 base with this many routed LoRA adapters",
    )
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument(
        "--repeats",
        type=int,
        default=1,
        help="run the whole list this many times in turn (the VM's speed drifts); medians at the end",
    )
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument(
        "--prompts",
        type=int,
        default=8,
        help="distinct prompts (<= 100) our variants cycle through; more than 8 with as many --steps "
        "shows how resident memory grows over a run of new prompt and completion lengths",
    )
    ns = parser.parse_args()
    torch.set_num_threads(ns.threads)
    if ns.generate_batch:
        print(json.dumps(run_generate(ns.generate_batch, lora_agents=ns.generate_lora)))
        return
    if ns.variant:
        print(json.dumps(run_variant(ns.variant, ns.steps, ns.prompts)))
        return
    peak, peak_bf16 = matmul_peak(), matmul_peak(torch.bfloat16)
    print(f"machine: {torch.get_num_threads()} threads, matmul peak fp32 {peak:.0f} / bf16 {peak_bf16:.0f} GFLOP/s")
    default = (["reference"] if REFERENCE_PYTHON.exists() else []) + list(VARIANTS)
    names = ns.variants.split(",") if ns.variants else default
    names = sorted(dict.fromkeys(n for n in names if n), key=lambda n: n != "reference")  # the reference first
    unknown = set(names) - set(VARIANTS) - {"reference"}
    if unknown:
        parser.error(f"unknown variants {sorted(unknown)}")
    if "reference" in names and not REFERENCE_PYTHON.exists():
        print(f"reference skipped: {REFERENCE_PYTHON} not found; run `bash scripts/setup_reference.sh` first")
        names.remove("reference")
    # the reference rolls out 4 sequences per agent, as the full fine-tune variants do
    batches = sorted({4 * (VARIANTS[n]["agents"] if VARIANTS.get(n, {}).get("lora") else 1) for n in names})
    plain = {b: _subprocess(["--generate-batch", str(b), "--threads", str(ns.threads)]) for b in batches}
    for b, r in plain.items():
        if r:
            print(f"plain generate fp32, batch {b:2d}: {r['tokens_per_s']:.1f} tok/s")
    # the same model as a bf16 LoRA team's rollout: its bf16 base and adapters through PEFT's mixed-batch generate
    teams = sorted({VARIANTS[n]["agents"] for n in names if VARIANTS.get(n, {}).get("lora") and VARIANTS[n]["bf16"]})
    same = {
        a: _subprocess(["--generate-batch", str(4 * a), "--generate-lora", str(a), "--threads", str(ns.threads)])
        for a in teams
    }
    for a, r in same.items():
        if r:
            print(
                f"plain generate, bf16 base + {a} LoRA adapters (adapter_names), batch {4 * a:2d}: "
                f"{r['tokens_per_s']:.1f} tok/s"
            )
    head = (
        "| variant | s/step | generate | reward | loss | optimizer | rollout tok/s | vs generate | vs same-model "
        "generate | MFU | peak RSS GB | bf16 peak before |\n|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
        "---:|"
    )
    print(head)
    results: dict[str, list[dict]] = {}
    for _ in range(ns.repeats):
        for name in names:
            phase = matmul_peak(torch.bfloat16)  # the machine's speed right before this variant (it drifts)
            r = _run_named(name, ns.steps, ns.threads, ns.prompts)
            if r is None:
                continue
            results.setdefault(name, []).append(r)
            spec = VARIANTS.get(name, dict(agents=2, lora=False, bf16=False))
            base = plain.get(4 * (spec["agents"] if spec["lora"] else 1))
            tok_s, gflops = r.get("rollout_tokens_per_s"), r.get("train_gflops_per_s")
            ratio = f"{tok_s / base['tokens_per_s']:.2f}x" if base and tok_s else "-"
            own = same.get(spec["agents"]) if spec["lora"] and spec["bf16"] else base  # full FT: the fp32 model
            same_ratio = f"{tok_s / own['tokens_per_s']:.2f}x" if own and tok_s else "-"
            mfu = f"{gflops / (peak_bf16 if spec['bf16'] else peak):.1%}" if gflops else "-"
            cell = lambda key, fmt, r=r: format(r[key], fmt) if key in r else "-"  # noqa: E731
            print(
                f"| {name} | {r['sec_per_step']:.2f} | {cell('sec_generate', '.2f')} | {cell('sec_reward', '.3f')} "
                f"| {cell('sec_loss', '.2f')} | {cell('sec_optimizer', '.2f')} | {cell('rollout_tokens_per_s', '.1f')} "
                f"| {ratio} | {same_ratio} | {mfu} | {r['peak_rss_gb']:.2f} | {phase:.0f} |",
                flush=True,
            )
    median = {name: statistics.median(r["sec_per_step"] for r in rs) for name, rs in results.items()}
    for name, sec in median.items():
        if "reference" in median and name != "reference":
            print(
                f"{name}: median {sec:.2f} s/step, {median['reference'] / sec:.2f} times faster than the reference "
                f"({median['reference']:.2f} s/step); peak RSS {max(r['peak_rss_gb'] for r in results[name]):.2f} GB"
            )


def _run_named(name: str, steps: int, threads: int, n_prompts: int = 8) -> dict | None:
    """One variant (or the reference library) in its own process."""
    common = ["--steps", str(steps), "--threads", str(threads)]
    if name == "reference":  # the PyPI library in its own venv, on our converted model folder
        from comlrl.engine.models import embedded_model_dir

        return _subprocess(
            ["--model", str(embedded_model_dir()), *common],
            str(REFERENCE_PYTHON),
            str(Path(__file__).with_name("bench_reference.py")),
        )
    return _subprocess(["--variant", name, "--prompts", str(n_prompts), *common])


if __name__ == "__main__":
    main()
