"""Rollout engines side by side: comlrl's decode loop, transformers' ``generate`` and vLLM on the embedded team.

The three engines behind ``comlrl.rollout.generation`` (``comlrl``, ``transformers``, ``vllm``: a colocated vLLM
engine in this process, ``comlrl.rollout.vllm_engine``), each in two layouts of a 2-agent SmolLM2-135M-Instruct team:
``lora`` (one shared base with a LoRA adapter per agent, r=8 on q/k/v/o; both agents' rows in one batch, routed by
``PromptBatch.adapter_names``) and ``full`` (two model copies, one call per agent, one after the other). Variants are
named ``<engine>_<layout>``. fp32 unless ``--bf16`` (bf16 rollouts as the trainer runs them with ``bf16=True``: a
LoRA team's base stored in bf16, a full model's decode under bf16 autocast).

(a) Rollout throughput. Every round, each variant samples ``--samples`` completions of each of ``--prompts`` chat
prompts (TL;DR posts cut to their first 8 words, ~40 tokens) per agent, at most ``--new-tokens`` tokens, temperature
1, per-row seeds: ``engine.sample`` on ``PromptBatch`` rows built as ``rollout._encode`` builds them. Variants are
interleaved round by round so that load from other processes hits them alike, and every round has posts of its own
(vLLM's prefix cache would otherwise serve repeated prompts from an earlier round). Generated tokens are rows x
positions up to and including the first stop id (``rollout.completion_mask``). Round 0 is each variant's first call,
reported apart as time to first call (for vLLM it starts the engines: two for ``full``); ``import vllm`` is timed
before it. Best and median tokens/s of the later rounds are printed, by wall time and by this process's CPU time
(vLLM's engine core runs in this process too; on a shared machine CPU time is the steadier measure).

(b) Training step. ``MAGRPOTrainer(model="embedded", num_agents=2)`` on TL;DR posts (one per step, as
bench_train.py: ``--samples`` generations of at most ``--new-tokens`` tokens, its length reward), LoRA team
(``peft_config``, same adapters as above) or full fine-tune, rolling out with ``use_vllm=True`` (vllm),
``fast_generation=False`` (transformers' ``generate``) or the default decode loop (comlrl). As the trainer does, a
full team's two models decode at once on CPU, one thread each, with the decode loop and ``generate``; vLLM's engines
run one after the other. Each variant runs in its own process; its first step (vLLM: engine start) is reported
apart from the mean s/step of the others.

    python benchmarks/bench_vllm.py [--rounds 3] [--steps 3] [--new-tokens 64] [--threads 2]
        [--variants comlrl_lora,transformers_lora,vllm_lora,comlrl_full,transformers_full,vllm_full]
    python benchmarks/bench_vllm.py --steps 0          # rollouts only
    python benchmarks/bench_vllm.py --rounds 0         # training steps only

The last line printed is a JSON summary of both parts.
"""

from __future__ import annotations

import os
import sys

# Before torch is imported (torch sizes its thread pool from this): vLLM's worker drops torch to 1 intra-op thread for
# serving unless OMP_NUM_THREADS is set in the environment (vllm.utils.torch_utils.set_torch_threads_for_runtime),
# which would leave the vLLM variants one thread against the others' --threads.
os.environ["OMP_NUM_THREADS"] = sys.argv[sys.argv.index("--threads") + 1] if "--threads" in sys.argv[:-1] else "2"
os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")  # its start-up warnings (on stdout) would bury the tables

import argparse
import gc
import json
import resource
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

import torch
from bench_generate import DATA, FALLBACK_PROMPTS  # the same TL;DR posts as the decode-loop benchmark

ENGINES = ("comlrl", "transformers", "vllm")
LAYOUTS = ("lora", "full")
VARIANTS = [f"{e}_{layout}" for layout in LAYOUTS for e in ENGINES]
LORA = dict(r=8, lora_alpha=16, target_modules=["q_proj", "k_proj", "v_proj", "o_proj"], lora_dropout=0.0)


def posts() -> list[str]:
    """The TL;DR posts (the fallback prompts when the shared data folder is missing)."""
    if not DATA.is_file():
        return FALLBACK_PROMPTS
    return [json.loads(line)["prompt"] for line in DATA.open() if line.strip()]


def prompts(n: int, offset: int = 0, words: int = 8) -> list[str]:
    """n posts from ``offset`` on (cycling), cut to their first ``words`` words (~40 tokens with the chat template)."""
    rows = posts()
    return [" ".join(rows[(offset + i) % len(rows)].split()[:words]) for i in range(n)]


# --------------------------------------------------------------------------------------------- (a) rollouts
def build_teams(bf16: bool) -> dict:
    """The two layouts' models: a LoRA team on one shared base, and two full copies."""
    from peft import LoraConfig

    from comlrl.engine.models import load_model
    from comlrl.engine.team import adapter_parameters, build_lora_team

    base = load_model("embedded").eval()
    if bf16:
        base = base.to(torch.bfloat16)  # as the trainer stores a LoRA team's frozen base with bf16=True
    team = build_lora_team([base, base], [0, 0], LoraConfig(**LORA), seeds=[1, 2])
    peft = team[0][0].eval()
    for _, name in team:
        adapter_parameters(peft, name)  # adapters in fp32, as the trainer keeps them
    return {"lora": (peft, [name for _, name in team]), "full": [load_model("embedded").eval() for _ in range(2)]}


def batches(layout: str, teams: dict, tok, texts: list[str], samples: int, seed: int) -> list[tuple]:
    """(model, PromptBatch) per call of a round: one for the LoRA team, one per agent for the full copies. Rows as
    ``rollout._encode`` makes them: chat prompts, ``samples`` rows per prompt, left-padded, per-row seeds keyed as
    ``episode.generate_team`` keys them (seed, agent, row)."""
    from comlrl.engine.models import left_pad
    from comlrl.rollout.protocol import PromptBatch
    from comlrl.rollout.rollout import eos_ids, format_prompt
    from comlrl.rollout.sampling import derive_seed

    encoded = [format_prompt(tok, t, chat=True) for t in texts]
    rows = [e for e in encoded for _ in range(samples)]
    seeds = [[derive_seed(seed, agent, k) for k in range(len(rows))] for agent in range(2)]
    if layout == "lora":
        model, names = teams["lora"]
        ids, mask = left_pad(rows + rows, tok.pad_token_id)
        adapters = [n for n in names for _ in rows]
        batch = PromptBatch(
            prompt_ids=ids,
            prompt_mask=mask,
            stop_ids=eos_ids(model, tok),
            pad_id=tok.pad_token_id,
            row_seeds=seeds[0] + seeds[1],
            adapter_names=adapters,
        )
        return [(model, batch)]
    out = []
    for agent, model in enumerate(teams["full"]):
        ids, mask = left_pad(rows, tok.pad_token_id)
        batch = PromptBatch(
            prompt_ids=ids,
            prompt_mask=mask,
            stop_ids=eos_ids(model, tok),
            pad_id=tok.pad_token_id,
            row_seeds=seeds[agent],
        )
        out.append((model, batch))
    return out


def run_rollouts(ns: argparse.Namespace, names: list[str]) -> tuple[dict, float | None]:
    """Part (a): tokens/s per variant, interleaved round by round; round 0 is each variant's first call. Returns
    each variant's figures and the seconds ``import vllm`` took (None without a vLLM variant)."""
    from comlrl.engine.models import load_tokenizer
    from comlrl.rollout.generation import ROLLOUT_ENGINES, VLLM_ENGINE
    from comlrl.rollout.protocol import GenerationSettings
    from comlrl.rollout.rollout import completion_mask
    from comlrl.rollout.sampling import derive_seed
    from comlrl.rollout.vllm_engine import vllm_process_guard

    tok = load_tokenizer("embedded")
    teams = build_teams(ns.bf16)
    autocast = torch.bfloat16 if ns.bf16 else None
    summary: dict = {}
    import_s = None
    if any(n.startswith("vllm") for n in names):
        start = time.perf_counter()
        with vllm_process_guard():
            import vllm  # noqa: F401

        import_s = time.perf_counter() - start
        print(f"import vllm: {import_s:.1f} s", flush=True)
    rows = ns.prompts * ns.samples
    print(
        f"rollouts: {ns.prompts} prompts x {ns.samples} samples per agent ({rows} rows per agent, 2 agents), "
        f"up to {ns.new_tokens} new tokens, {'bf16' if ns.bf16 else 'fp32'}, {torch.get_num_threads()} threads",
        flush=True,
    )
    first: dict[str, float] = {}
    rates: dict[str, list[float]] = {n: [] for n in names}
    cpu_rates: dict[str, list[float]] = {n: [] for n in names}
    with torch.no_grad():
        for r in range(ns.rounds + 1):  # round 0: each variant's first call (vLLM: engine start), not in the rates
            texts = prompts(ns.prompts, offset=r * ns.prompts)
            for name in names:
                engine_name, layout = name.rsplit("_", 1)
                engine = ROLLOUT_ENGINES[engine_name]
                settings = GenerationSettings(
                    max_new_tokens=ns.new_tokens, do_sample=True, temperature=1.0, engine=engine_name
                )
                calls = batches(layout, teams, tok, texts, ns.samples, derive_seed(0, "bench", r))
                tokens, stopped, total = 0, 0, 0
                start, cpu_start = time.perf_counter(), time.process_time()
                outs = [(engine.sample(model, batch, settings, autocast), batch) for model, batch in calls]
                elapsed, cpu = time.perf_counter() - start, time.process_time() - cpu_start
                for out, batch in outs:
                    cmask, truncated = completion_mask(out.ids, batch.stop_ids)
                    tokens += int(cmask.sum())
                    stopped += int((~truncated).sum())
                    total += batch.rows
                label = "first" if r == 0 else f"round {r}"
                if r == 0:
                    first[name] = elapsed
                else:
                    rates[name].append(tokens / elapsed)
                    cpu_rates[name].append(tokens / cpu)
                print(
                    f"{label:8s} {name:18s} {total:3d} rows ({stopped:3d} stopped) {tokens:5d} tokens "
                    f"wall {elapsed:6.2f}s {tokens / elapsed:7.1f} tok/s | cpu {cpu:6.2f}s {tokens / cpu:7.1f} tok/s",
                    flush=True,
                )
    VLLM_ENGINE.close()  # the engines' weights and KV caches go before part (b)'s processes start
    del teams, calls, outs
    gc.collect()

    print(
        "\nvariant            first call s | wall best  wall median  vs comlrl | cpu best  cpu median  vs comlrl"
        "   (generated tok/s)"
    )
    for name in names:
        w, c = rates[name], cpu_rates[name]
        summary[name] = {"first_call_s": first[name]}
        if w:
            summary[name].update(
                wall_best=max(w), wall_median=statistics.median(w), cpu_best=max(c), cpu_median=statistics.median(c)
            )
    for name in names:
        row, own = summary[name], summary.get(f"comlrl_{name.rsplit('_', 1)[1]}", {})
        if "wall_best" not in row:
            print(f"{name:18s} {first[name]:12.2f} | (no timed rounds)")
            continue
        ratio = {k: f"{row[k] / own[k]:7.2f}x" if k in own else "      -" for k in ("wall_median", "cpu_median")}
        print(
            f"{name:18s} {first[name]:12.2f} | {row['wall_best']:9.1f} {row['wall_median']:12.1f} "
            f"{ratio['wall_median']} | {row['cpu_best']:8.1f} {row['cpu_median']:11.1f} {ratio['cpu_median']}"
        )
    print(
        "(vs comlrl: ratio of medians to the decode loop in the same layout; first call: round 0, for vLLM the "
        "engine start-up, not in the rates)"
    )
    return summary, import_s


# --------------------------------------------------------------------------------------------- (b) training
def train_prompts(n: int) -> list[dict]:
    """n real Reddit posts cut to ~40 tokens (about 160 characters), as bench_train.py builds them."""
    return [{"prompt": "Summarize: " + p[:150]} for p in (posts() * n)[:n]]


def run_train_variant(name: str, steps: int, samples: int, new_tokens: int, bf16: bool) -> dict:
    """One MAGRPO run of ``steps`` optimizer steps on one engine and layout: seconds per step, first step apart."""
    from peft import LoraConfig

    from comlrl.trainers.magrpo import MAGRPOConfig, MAGRPOTrainer

    engine, layout = name.rsplit("_", 1)
    with tempfile.TemporaryDirectory() as out:
        args = MAGRPOConfig(
            per_device_train_batch_size=1,
            num_generations=samples,
            max_new_tokens=new_tokens,
            max_steps=steps,
            learning_rate=1e-5,
            logging_steps=0,
            disable_tqdm=True,
            output_dir=out,
            bf16=bf16,
            use_vllm=engine == "vllm",
            fast_generation=engine != "transformers",
        )
        start = time.perf_counter()
        trainer = MAGRPOTrainer(
            model="embedded",
            num_agents=2,
            train_dataset=train_prompts(steps),
            reward_func=lambda *c: [float(len(c[-1][0]) - len(c[0][0])) / 100],
            args=args,
            peft_config=LoraConfig(**LORA) if layout == "lora" else None,
        )
        setup = time.perf_counter() - start
        stamps = [time.perf_counter()]
        hook = trainer.on_step_end

        def timed(metrics: dict) -> None:
            hook(metrics)
            stamps.append(time.perf_counter())

        trainer.on_step_end = timed
        hist = trainer.train()["history"]
    secs = [b - a for a, b in zip(stamps, stamps[1:])]
    rest, later = secs[1:], hist[1:]
    mean = lambda xs: sum(xs) / len(xs) if xs else None  # noqa: E731
    return {
        "variant": name,
        "steps": len(hist),
        "setup_s": setup,
        "first_step_s": secs[0],
        "first_generate_s": hist[0].get("time/generate"),
        "sec_per_step": mean(rest),
        "sec_generate": mean([h.get("time/generate", 0.0) for h in later]),
        "sec_update": mean([h.get("time/update", 0.0) for h in later]),
        "rollout_tokens_per_s": mean(
            [h["perf/rollout_tokens_per_s"] for h in later if "perf/rollout_tokens_per_s" in h]
        ),
        "peak_rss_gb": peak_rss_gb(),
    }


def peak_rss_gb() -> float:
    """This process's peak resident memory: VmHWM, which starts afresh at exec (``ru_maxrss`` would carry over the
    parent's peak at fork, and the parent holds part (a)'s models and vLLM engines)."""
    status = Path("/proc/self/status")
    if status.is_file():
        for line in status.read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024**2
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024**2


def _subprocess(args: list[str]) -> dict | None:
    out = subprocess.run([sys.executable, __file__, *args], capture_output=True, text=True)
    if out.returncode != 0:
        print(args, "failed:", out.stderr[-2000:])
        return None
    return json.loads(out.stdout.strip().splitlines()[-1])


def run_training(ns: argparse.Namespace, names: list[str]) -> dict:
    """Part (b): each variant's MAGRPO run in its own process."""
    print(
        f"\ntraining: MAGRPO, 2 agents, {ns.steps} steps of 1 prompt x {ns.samples} generations, up to "
        f"{ns.new_tokens} new tokens, {'bf16' if ns.bf16 else 'fp32'}, {ns.threads} threads, one process per variant"
    )
    print(
        "| variant | setup s | first step s | first generate s | s/step (after the first) | generate | update "
        "| rollout tok/s | peak RSS GB |\n|---|---:|---:|---:|---:|---:|---:|---:|---:|",
        flush=True,
    )
    results: dict = {}
    for name in names:
        common = ["--threads", str(ns.threads), "--samples", str(ns.samples), "--new-tokens", str(ns.new_tokens)]
        r = _subprocess(["--train-variant", name, "--steps", str(ns.steps), *common, *(["--bf16"] if ns.bf16 else [])])
        if r is None:
            continue
        results[name] = r
        cell = lambda key, fmt, r=r: "-" if r.get(key) is None else format(r[key], fmt)  # noqa: E731
        print(
            f"| {name} | {r['setup_s']:.1f} | {r['first_step_s']:.2f} | {cell('first_generate_s', '.2f')} "
            f"| {cell('sec_per_step', '.2f')} | {cell('sec_generate', '.2f')} | {cell('sec_update', '.2f')} "
            f"| {cell('rollout_tokens_per_s', '.1f')} | {r['peak_rss_gb']:.2f} |",
            flush=True,
        )
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3, help="timed rollout rounds after the first call (0: skip)")
    parser.add_argument("--steps", type=int, default=3, help="MAGRPO steps per variant, the first apart (0: skip)")
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--prompts", type=int, default=2, help="prompts per agent per rollout round")
    parser.add_argument("--samples", type=int, default=4, help="samples per prompt (the trainer's num_generations)")
    parser.add_argument(
        "--threads", type=int, default=2, help="torch threads; also OMP_NUM_THREADS (give it as '--threads N')"
    )
    parser.add_argument("--variants", default=",".join(VARIANTS), help=f"comma-separated, of {VARIANTS}")
    parser.add_argument("--bf16", action="store_true", help="bf16 rollouts and training (default fp32)")
    parser.add_argument(
        "--vllm-kv-gib",
        type=int,
        default=1,
        help="KV cache of each vLLM engine in GiB (VLLM_CPU_KVCACHE_SPACE, a whole number; 8192 fp32 tokens of "
        "SmolLM2, its longest sequence, take 0.35)",
    )
    parser.add_argument("--train-variant", choices=VARIANTS, help="(internal) one training run, JSON")
    ns = parser.parse_args()
    if os.environ["OMP_NUM_THREADS"] != str(ns.threads):
        parser.error("give the thread count as '--threads N' (two words): it is read before torch is imported")
    torch.set_num_threads(ns.threads)
    torch.manual_seed(0)
    os.environ["VLLM_CPU_KVCACHE_SPACE"] = str(ns.vllm_kv_gib)  # the engines read it when they start
    if ns.train_variant:
        print(json.dumps(run_train_variant(ns.train_variant, ns.steps, ns.samples, ns.new_tokens, ns.bf16)))
        return
    names = [n for n in dict.fromkeys(ns.variants.split(",")) if n]
    unknown = set(names) - set(VARIANTS)
    if not names:
        parser.error("--variants names no variant")
    if unknown:
        parser.error(f"unknown variants {sorted(unknown)}; of {VARIANTS}")
    summary: dict = {
        "threads": ns.threads,
        "dtype": "bfloat16" if ns.bf16 else "float32",
        "new_tokens": ns.new_tokens,
        "rows_per_agent": ns.prompts * ns.samples,
        "rounds": ns.rounds,
        "steps": ns.steps,
    }
    if ns.rounds > 0:
        summary["rollout"], summary["vllm_import_s"] = run_rollouts(ns, names)
    if ns.steps > 0:
        summary["train"] = run_training(ns, names)
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
