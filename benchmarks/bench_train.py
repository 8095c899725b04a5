"""Time per training step of an embedded SmolLM2-135M team, split by stage, with peak memory.

Config: 2 agents, full fine-tune fp32, 8 prompts of ~40 tokens, num_generations=4, max_new_tokens=64, 1 turn, 1 epoch
(8 steps at one prompt per step), sampling at temperature 0.6, top_p 0.6, top_k 50 (``SAMPLING``: our variants, the
plain ``generate`` baseline and the reference all sample with it). Variants: full fine-tune fp32 (the reference
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
    python benchmarks/bench_train.py --variants full2,lora2 --steps 4 --profile   # where each second of a step goes
    python benchmarks/bench_train.py --variants lora2 --steps 3 --profile-ops     # torch.profiler's top ops

``--profile`` adds, per variant (not the reference), a table of each phase's seconds per step after the warm-up step:
rollout (per model: building the decoder, prefill, decode forward, sampling), rewards, loss forward, backward and the
rest of the loss per update group, the optimizer step per agent, and the rest (:class:`StepProfile`, timers around
the trainer's own methods in the variant's process). ``--profile-ops``: the top 15 ops by self CPU time of one step's
rollout and of its update.

MFU is measured against the fp32 matmul peak for fp32 variants and the bf16 peak for bf16 variants, counting
6 (LoRA: 4) x params x the tokens the packed loss pass runs (each prompt once, then its samples' completions).
"""

from __future__ import annotations

import argparse
import collections
import functools
import json
import resource
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, Callable

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
# the workload's sampling (the reference library's defaults too); bench_reference.py takes it as options
SAMPLING = dict(temperature=0.6, top_p=0.6, top_k=50)


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


def run_variant(name: str, steps: int, n_prompts: int = 8, *, profile: bool = False, profile_ops: bool = False) -> dict:
    """One variant's training run, timed; ``profile``: with the phase table of :class:`StepProfile` (``profile``
    key), ``profile_ops``: with torch.profiler's top ops of one step's rollout and update (``ops`` key)."""
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
        **SAMPLING,
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
    profiler = StepProfile(trainer, ops=profile_ops) if profile or profile_ops else None
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
        **({"profile": profiler.table()} if profile else {}),
        **({"ops": profiler.ops} if profile_ops else {}),
    }


class StepProfile:
    """Where each second of a training step goes: perf_counter timers around the trainer's own methods and the
    library functions it calls (wrapped in this process only, the library unchanged), summed over the steps after
    ``warmup``. With ``ops``, ``torch.profiler`` records the first step after the warm-up instead (its rollout and its
    update apart; that step is left out of the phase times).

    Rollout phases per model (an agent, or the agents of a LoRA team sampled in one call) are the time of the thread
    that samples it: with concurrent rollouts the agents' threads overlap, so those rows add up to more than the
    rollout's wall time. Loss phases are per update group (one agent, or a routed LoRA pair in one forward).
    """

    def __init__(self, trainer: Any, *, warmup: int = 1, ops: bool = False) -> None:
        self.totals: dict[str, float] = collections.defaultdict(float)
        self.calls: dict[str, int] = collections.defaultdict(int)
        self.warmup, self.ops_step = warmup, warmup if ops else None
        self.started = self.recorded = 0
        self.recording = self.profiling_ops = False
        self.ops: dict[str, str] = {}
        self.local = threading.local()  # the model a rollout thread is sampling
        self.loss_group: str | None = None  # the update group whose loss runs now (the main thread)
        self.spans: list[tuple[float, float]] = []  # decode engine calls of the current generate call
        models: dict[int, list[int]] = {}
        for a in trainer.agents:
            models.setdefault(id(a.model), []).append(a.index)
        self.models = {m: _agents_label(ix) for m, ix in models.items()}
        self._install(trainer)

    def add(self, key: str, seconds: float) -> None:
        if self.recording:
            self.totals[key] += seconds
            self.calls[key] += 1

    def timed(self, inner: Callable, key: str | Callable[..., str]) -> Callable:
        """``inner`` timed into ``key`` (a string, or a function of the call's arguments that returns one)."""

        @functools.wraps(inner)
        def wrapper(*args, **kwargs):
            start = time.perf_counter()
            try:
                return inner(*args, **kwargs)
            finally:
                self.add(key(*args, **kwargs) if callable(key) else key, time.perf_counter() - start)

        return wrapper

    def _install(self, trainer: Any) -> None:
        import comlrl.accel.fastgen as fastgen
        import comlrl.rollout.episode as episode
        import comlrl.rollout.generation as generation
        import comlrl.trainers.base as base
        import comlrl.trainers.update as update
        from comlrl.accel.llama_decoder import LlamaDecoder

        t, u = trainer, trainer.update
        engine = lambda what: lambda *a, **k: f"{getattr(self.local, 'model', 'other model')}: {what}"  # noqa: E731
        # the step, and the op profiler's step
        t.training_step = self._step(t.training_step)
        t.on_step_end = self.timed(t.on_step_end, "on_step_end")
        t.rollout = self._ops("rollout", self.timed(t.rollout, "rollout"))
        t.optimize = self._ops("update", t.optimize)
        # rollout: the generate call (tokenize, the decode engine per model, decode text), inside the engine the
        # decoder's construction (weight snapshot, KV cache), the prefill and the decode loop (forward, sampling)
        episode.generate_concurrently = self._generate(episode.generate_concurrently)
        generation.fast_generate = self._engine(generation.fast_generate)
        fastgen._make_decoder = self.timed(fastgen._make_decoder, engine("build decoder"))
        fastgen._decode_loop = self._decode_loop(fastgen._decode_loop, engine("sampling"))
        for cls in (LlamaDecoder, fastgen._HFDecoder):
            cls.prefill = self.timed(cls.prefill, engine("prefill"))
            cls.step = self.timed(cls.step, engine("decode forward"))
        episode.compute_rewards = self.timed(episode.compute_rewards, "rewards")
        t.compute_advantages = self.timed(t.compute_advantages, "advantages")
        t.episode_metrics = self.timed(t.episode_metrics, "episode metrics")
        base.release_freed_memory = self.timed(base.release_freed_memory, "release freed memory")
        update.release_freed_memory = self.timed(update.release_freed_memory, "release freed memory")
        # update: per group the log-prob forward, the backward and the rest of the loss; per agent the optimizer step
        u._accumulate_agent = self._group(u._accumulate_agent, lambda agent, *a, **k: _agents_label([agent.index]))
        u._accumulate_team = self._group(
            u._accumulate_team, lambda group, *a, **k: _agents_label([x.index for x in group])
        )
        loss = lambda what: lambda *a, **k: f"{self.loss_group}: {what}"  # noqa: E731
        update.completion_logprobs = self.timed(update.completion_logprobs, loss("loss forward"))
        update.team_completion_logprobs = self.timed(update.team_completion_logprobs, loss("loss forward"))
        backward = torch.Tensor.backward
        timed_backward = self.timed(backward, loss("backward"))
        torch.Tensor.backward = lambda *a, **k: (timed_backward if self.loss_group else backward)(*a, **k)
        u._optimizer_step = self.timed(
            u._optimizer_step, lambda agent: f"optimizer step: {_agents_label([agent.index])}"
        )

    def _step(self, inner):
        def step(*args, **kwargs):
            self.profiling_ops = self.started == self.ops_step
            self.recording = self.started >= self.warmup and not self.profiling_ops
            self.started += 1
            start = time.perf_counter()
            out = inner(*args, **kwargs)
            self.add("step", time.perf_counter() - start)
            self.recorded += self.recording
            return out

        return step

    def _ops(self, name: str, inner):
        def run(*args, **kwargs):
            if not self.profiling_ops:
                return inner(*args, **kwargs)
            # every thread's ops: the rollout's models decode in threads of their own (torch records only the
            # profiling thread's by default)
            threads = torch.profiler._ExperimentalConfig(profile_all_threads=True)
            cpu = [torch.profiler.ProfilerActivity.CPU]
            with torch.profiler.profile(activities=cpu, experimental_config=threads) as prof:
                out = inner(*args, **kwargs)
            self.ops[name] = prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=15)
            return out

        return run

    def _generate(self, inner):
        def generate(*args, **kwargs):
            self.spans = []
            start = time.perf_counter()
            out = inner(*args, **kwargs)
            end = time.perf_counter()
            self.add("generate", end - start)
            if self.spans:  # tokenizing, decoding text and the threads' start: the call outside every engine span
                self.add(
                    "generate outside the engines",
                    end - start - (max(e for _, e in self.spans) - min(s for s, _ in self.spans)),
                )
            return out

        return generate

    def _engine(self, inner):
        def engine(model, *args, **kwargs):
            self.local.model = self.models.get(id(model), "other model")
            start = time.perf_counter()
            try:
                return inner(model, *args, **kwargs)
            finally:
                end = time.perf_counter()
                self.spans.append((start, end))
                self.add(f"{self.local.model}: engine", end - start)

        return engine

    def _decode_loop(self, inner, key):
        def loop(decoder, logits, sample, *args, **kwargs):
            start = time.perf_counter()
            try:
                return inner(decoder, logits, self.timed(sample, key), *args, **kwargs)
            finally:
                self.add(f"{self.local.model}: decode loop", time.perf_counter() - start)

        return loop

    def _group(self, inner, label):
        def run(*args, **kwargs):
            self.loss_group = label(*args, **kwargs)
            start = time.perf_counter()
            try:
                return inner(*args, **kwargs)
            finally:
                self.add(f"{self.loss_group}: loss", time.perf_counter() - start)
                self.loss_group = None

        return run

    def table(self) -> str:
        """Markdown: each phase's seconds per step (mean over the recorded steps) and share of the step."""
        n = self.recorded
        if not n:
            return f"(no step after the warm-up{' and the op-profiled step' if self.ops_step is not None else ''})"
        sec = lambda key: self.totals.get(key, 0.0) / n  # noqa: E731
        step = sec("step") + sec("on_step_end")
        rows: list[tuple[str, float, bool]] = [("rollout: generate (wall)", sec("generate"), True)]
        for m in self.models.values():
            parts = ["build decoder", "prefill", "decode loop"]
            loop = ["decode forward", "sampling"]
            calls = self.calls.get(f"{m}: decode forward", 0) / n
            rows += [
                (f"· {m}: decode engine (its thread)", sec(f"{m}: engine"), False),
                (f"· · {m}: build decoder (weights, KV cache)", sec(f"{m}: build decoder"), False),
                (f"· · {m}: prefill", sec(f"{m}: prefill"), False),
                (f"· · {m}: decode loop", sec(f"{m}: decode loop"), False),
                (f"· · · {m}: decode forward ({calls:.0f} per step)", sec(f"{m}: decode forward"), False),
                (f"· · · {m}: sampling", sec(f"{m}: sampling"), False),
                (f"· · · {m}: loop other", sec(f"{m}: decode loop") - sum(sec(f"{m}: {p}") for p in loop), False),
                (f"· · {m}: engine other", sec(f"{m}: engine") - sum(sec(f"{m}: {p}") for p in parts), False),
            ]
        rows += [
            (
                "· generate outside the engines (tokenize, decode text, threads)",
                sec("generate outside the engines"),
                False,
            ),
            ("rollout: rewards", sec("rewards"), True),
            ("rollout: other (prompts, episode bookkeeping)", sec("rollout") - sec("generate") - sec("rewards"), True),
            ("advantages", sec("advantages"), True),
            ("episode metrics", sec("episode metrics"), True),
            ("release freed memory", sec("release freed memory"), True),
        ]
        groups = [k[: -len(": loss")] for k in self.totals if k.endswith(": loss")]
        for g in groups:
            fwd, bwd = sec(f"{g}: loss forward"), sec(f"{g}: backward")
            rows += [
                (f"loss forward (log-probs): {g}", fwd, True),
                (f"backward: {g}", bwd, True),
                (f"loss other (policy loss, chunk tensors): {g}", sec(f"{g}: loss") - fwd - bwd, True),
            ]
        rows += [(k, sec(k), True) for k in sorted(self.totals) if k.startswith("optimizer step: ")]
        rows.append(("on_step_end (logging)", sec("on_step_end"), True))
        rows.append(
            ("other (the step minus the unindented rows above)", step - sum(s for _, s, top in rows if top), True)
        )
        lines = ["| phase | s/step | share |", "|---|---:|---:|"]
        lines += [f"| {name} | {s:.3f} | {s / step:.1%} |" for name, s, _ in rows]
        lines.append(f"| step | {step:.3f} | 100% |")
        return (
            "\n".join(lines)
            + f"\n\nmean over {n} step(s) after the warm-up; rows marked · are parts of the row above them"
        )


def _agents_label(indices: list[int]) -> str:
    return f"agent {indices[0]}" if len(indices) == 1 else "agents " + "+".join(map(str, indices))


def run_generate(batch: int, rounds: int = 3, lora_agents: int = 0) -> dict:
    """Plain ``model.generate`` (``SAMPLING``, KV cache) at the rollout batch of a variant: generated tokens
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
                temperature=SAMPLING["temperature"],
                top_p=SAMPLING["top_p"],
                top_k=SAMPLING["top_k"] or None,
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
    parser.add_argument(
        "--profile",
        action="store_true",
        help="per variant (not the reference), where each second of a step goes: phases per agent, a markdown table",
    )
    parser.add_argument(
        "--profile-ops",
        action="store_true",
        help="per variant, torch.profiler on the first step after the warm-up: the top 15 ops by self CPU time of its "
        "rollout and of its update (that step's time counts in s/step, not in --profile's table)",
    )
    ns = parser.parse_args()
    torch.set_num_threads(ns.threads)
    if ns.generate_batch:
        print(json.dumps(run_generate(ns.generate_batch, lora_agents=ns.generate_lora)))
        return
    if ns.variant:
        print(json.dumps(run_variant(ns.variant, ns.steps, ns.prompts, profile=ns.profile, profile_ops=ns.profile_ops)))
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
    flags = ("--profile",) * ns.profile + ("--profile-ops",) * ns.profile_ops
    for _ in range(ns.repeats):
        for name in names:
            phase = matmul_peak(torch.bfloat16)  # the machine's speed right before this variant (it drifts)
            r = _run_named(name, ns.steps, ns.threads, ns.prompts, profiles=flags)
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
    for name, rs in results.items():
        for i, r in enumerate(rs):
            run = f" (round {i + 1})" if len(rs) > 1 else ""
            if "profile" in r:
                print(f"\n{name}{run}: where a step's time goes\n\n{r['profile']}")
            for part, table in r.get("ops", {}).items():
                print(f"\n{name}{run}: top ops by self CPU time, one step's {part}\n\n{table}")
    median = {name: statistics.median(r["sec_per_step"] for r in rs) for name, rs in results.items()}
    for name, sec in median.items():
        if "reference" in median and name != "reference":
            print(
                f"{name}: median {sec:.2f} s/step, {median['reference'] / sec:.2f} times faster than the reference "
                f"({median['reference']:.2f} s/step); peak RSS {max(r['peak_rss_gb'] for r in results[name]):.2f} GB"
            )


def _run_named(name: str, steps: int, threads: int, n_prompts: int = 8, profiles: tuple[str, ...] = ()) -> dict | None:
    """One variant (or the reference library) in its own process; ``profiles``: its --profile flags (our variants)."""
    common = ["--steps", str(steps), "--threads", str(threads)]
    if name == "reference":  # the PyPI library in its own venv, on our converted model folder
        from comlrl.engine.models import embedded_model_dir

        sampling = ["--temperature", str(SAMPLING["temperature"]), "--top-p", str(SAMPLING["top_p"])]
        return _subprocess(
            ["--model", str(embedded_model_dir()), *sampling, "--top-k", str(SAMPLING["top_k"]), *common],
            str(REFERENCE_PYTHON),
            str(Path(__file__).with_name("bench_reference.py")),
        )
    return _subprocess(["--variant", name, "--prompts", str(n_prompts), *common, *profiles])


if __name__ == "__main__":
    main()
