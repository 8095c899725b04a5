"""Step time of one team in one process vs under torchrun (agent parallelism, one agent per process).

The team (tests/dist_worker.py): 2 agents, each a random Llama (default 4 layers, hidden 256, byte vocab) --
big enough that the work per agent outweighs the collectives, small enough for a 2-core CPU; 4 prompts x 4
samples, up to 32 new tokens (extra stop ids end some completions early). Variants: one process doing both
agents with 1 thread and with one thread per core, and torchrun with one process (1 thread) per agent. On a
shared machine the OpenMP threads of one process suffer most from other load (their barriers wait for the
slowest core), so the load average is printed with the numbers:

    python benchmarks/bench_distributed.py                # 1 process vs torchrun 2 processes
    python benchmarks/bench_distributed.py --steps 8 --hidden 512 --dp   # also 4 processes (2 agents x 2 replicas)
    python benchmarks/bench_distributed.py --trainer iac                 # actor-critic: critics placed with agents
    python benchmarks/bench_distributed.py --fsdp          # memory: the embedded team replicated vs sharded (fsdp)

``--fsdp`` trains the embedded SmolLM2-135M team (full fine-tune, fp32) with both agents on both of 2 ranks, once
replicated (data parallel) and once sharded with ``fsdp="full_shard"``, and prints per rank the bytes of parameters
and AdamW state it holds (counted from its local tensors) and its peak RSS.

Prints the median step time over steps 2..N (step 1 includes warm-up) and its parts (generate = sampling plus
exchanging completions, loss = forward/backward incl. the gradient all-reduce, optimizer).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
WORKER = ROOT / "tests" / "dist_worker.py"


def memory(out: Path, nproc: int) -> list[dict]:
    """Per rank: the bytes its agents hold (parameters, AdamW state) and its peak RSS, as dist_worker wrote them."""
    rows = []
    for r in range(nproc):
        held = json.loads((out / f"bytes.rank{r}.json").read_text())
        agents = [v for k, v in held.items() if k.isdigit()]
        rows.append(
            {
                "params": sum(v["params"] for v in agents),
                "optimizer": sum(v["optimizer"] for v in agents),
                "peak_rss": held["peak_rss"],
            }
        )
    return rows


def fsdp_memory(steps: int) -> None:
    """The embedded team on 2 ranks, replicated vs sharded: held bytes and peak RSS per rank, side by side."""
    spec = {
        "model_dir": "embedded",
        "bf16": False,
        "max_steps": steps,
        "max_new_tokens": 16,
        "num_generations": 2,
        "per_device_train_batch_size": 2,
        "save_steps": 0,
        "logging_steps": 0,
        "placement": {"0": [0, 1], "1": [0, 1]},
    }
    print(f"embedded SmolLM2-135M team (2 agents, full fine-tune, fp32) on 2 ranks, {steps} steps, 2 prompts x 2")
    print(
        f"{'variant':<28}{'rank':>5}{'params GB':>11}{'AdamW GB':>10}{'peak RSS GB':>13}{'step s':>8}{'generate':>10}"
        f"{'loss':>7}{'optim':>7}"
    )
    with tempfile.TemporaryDirectory() as tmp:
        for name, extra in (("replicated (data parallel)", {}), ("fsdp full_shard", {"fsdp": "full_shard"})):
            out = Path(tmp) / name.split()[0]
            t = run(2, 1, {**spec, **extra}, out)
            for r, m in enumerate(memory(out, 2)):
                print(
                    f"{name:<28}{r:>5}{m['params'] / 1e9:>11.3f}{m['optimizer'] / 1e9:>10.3f}"
                    f"{m['peak_rss'] / 1e9:>13.2f}{t['time/step']:>8.2f}{t['time/generate']:>10.2f}"
                    f"{t['time/loss']:>7.2f}{t['time/optimizer']:>7.2f}"
                )


def run(nproc: int, threads: int, spec: dict, out: Path) -> dict[str, float]:
    """Median per-step times of one job (rank 0's view)."""
    env = {
        **os.environ,
        "HF_HUB_OFFLINE": "1",
        "TOKENIZERS_PARALLELISM": "false",
        "OMP_NUM_THREADS": str(threads),
        "CUDA_VISIBLE_DEVICES": "",
    }
    if nproc == 1:
        # dist_worker pins one thread (as torchrun's workers); give the single process every core instead
        code = (
            f"import json, sys, torch; sys.path.insert(0, {str(WORKER.parent)!r}); import dist_worker; "
            f"torch.set_num_threads({threads}); dist_worker.run(sys.argv[1], json.loads(sys.argv[2]))"
        )
        cmd = [sys.executable, "-c", code, str(out), json.dumps(spec)]
    else:
        cmd = [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            f"--nproc-per-node={nproc}",
            str(WORKER),
            str(out),
            json.dumps(spec),
        ]
    start = time.perf_counter()
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - start
    if proc.returncode:
        raise SystemExit(f"{nproc}-process run failed:\n{(proc.stdout + proc.stderr)[-3000:]}")
    steps = json.loads((out / "history.rank0.json").read_text())[1:]
    keys = ("time/step", "time/generate", "time/loss", "time/optimizer", "time/critic_update")
    return {**{k: statistics.median(s.get(k, 0.0) for s in steps) for k in keys}, "wall": wall}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--new-tokens", type=int, default=32)
    ap.add_argument(
        "--dp", action="store_true", help="also 4 processes: 2 agents x 2 replicas (oversubscribes 2 cores)"
    )
    ap.add_argument(
        "--trainer",
        choices=("magrpo", "iac", "maac"),
        default="magrpo",
        help="iac / maac: a separate critic per agent / one centralized critic (a copy of the actor model)",
    )
    ap.add_argument("--fsdp", action="store_true", help="memory per rank of the embedded team, replicated vs sharded")
    a = ap.parse_args()
    if a.fsdp:
        fsdp_memory(max(a.steps // 3, 2))
        return
    cores = os.cpu_count() or 1
    spec = {
        "max_steps": a.steps,
        "max_new_tokens": a.new_tokens,
        "num_generations": 4,
        "per_device_train_batch_size": 4,
        "save_steps": 0,
        "logging_steps": 0,
        "model": {"hidden": a.hidden, "layers": a.layers},
        "trainer": a.trainer,
    }
    variants = [
        ("1 process, both agents", 1, 1),
        ("1 process, both agents", 1, cores),
        ("torchrun 2 procs, agent parallel", 2, 1),
    ]
    if a.dp:
        variants.append(("torchrun 4 procs, 2 agents x 2 replicas", 4, max(cores // 4, 1)))
    print(
        f"{a.trainer}: team of 2 random Llama agents ({a.layers} layers, hidden {a.hidden}), 4 prompts x 4 samples, "
        f"up to {a.new_tokens} new tokens, {cores} CPU cores (load average {os.getloadavg()[0]:.1f}), "
        f"median over steps 2..{a.steps}"
    )
    print(
        f"{'variant':<42}{'threads/proc':>13}{'step s':>9}{'generate':>10}{'loss':>8}{'optim':>8}{'critic':>8}"
        f"{'job wall s':>12}"
    )
    base = None
    with tempfile.TemporaryDirectory() as tmp:
        for name, nproc, threads in variants:
            t = run(nproc, threads, spec, Path(tmp) / f"n{nproc}")
            base = base or t["time/step"]
            print(
                f"{name:<42}{threads:>13}{t['time/step']:>9.3f}{t['time/generate']:>10.3f}{t['time/loss']:>8.3f}"
                f"{t['time/optimizer']:>8.3f}{t['time/critic_update']:>8.3f}{t['wall']:>12.1f}"
                f"   x{base / t['time/step']:.2f}"
            )
    print(f"(load average after: {os.getloadavg()[0]:.1f}; x = speed-up over the first row)")


if __name__ == "__main__":
    main()
