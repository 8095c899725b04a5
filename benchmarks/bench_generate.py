"""Rollout throughput: HF ``model.generate`` vs ``comlrl.accel.fastgen.fast_generate`` on the embedded SmolLM2-135M.

Batch 16 = 4 chat prompts (~40 tokens, TL;DR posts) x 4 samples, temperature 1.0, top_p 1.0, 64 new tokens.
Variants are interleaved round by round so that load from other processes hits them alike; the best and median
generated tokens/s (batch x decoded positions / time) per variant are printed, by wall time and by this process's
CPU time (on a shared machine CPU time is the steadier measure: it excludes time spent descheduled, though not
memory-bandwidth contention), then a greedy-equality check.

    python benchmarks/bench_generate.py [--rounds 3] [--threads 2]
        [--variants generate,fast_fp32,fast_bf16,generic_fp32]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path
from typing import Callable

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from comlrl.accel.fastgen import fast_generate
from comlrl.engine.models import left_pad, load_model, load_tokenizer
from comlrl.rollout.rollout import completion_mask, eos_ids, format_prompt

DATA = Path(__file__).resolve().parents[2] / "shared" / "data" / "tldr_posts_extra.jsonl"
FALLBACK_PROMPTS = [
    "Summarize: my landlord kept the deposit after I moved out",
    "Summarize: I got lost hiking and a stranger drove me home",
    "Summarize: my cat learned to open the fridge door last week",
    "Summarize: our team lost the final because of a late penalty",
]


def prompts(n: int = 4, words: int = 8) -> list[str]:
    """n real TL;DR posts cut to their first ``words`` words (~40 tokens with SmolLM2's chat template)."""
    if not DATA.is_file():
        return FALLBACK_PROMPTS[:n]
    rows = [json.loads(line) for line in DATA.open() if line.strip()][:n]
    return [" ".join(r["prompt"].split()[:words]) for r in rows]


def hf_generate(
    model: PreTrainedModel,
    ids: torch.Tensor,
    mask: torch.Tensor,
    *,
    pad: int,
    stop: list[int],
    new_tokens: int,
    do_sample: bool,
) -> torch.Tensor:
    """Completion ids from plain ``model.generate``, called exactly as ``rollout.generate`` calls it."""
    kwargs = dict(max_new_tokens=new_tokens, pad_token_id=pad, eos_token_id=stop, use_cache=True)
    if do_sample:
        kwargs.update(do_sample=True, temperature=1.0, top_p=1.0, top_k=None)
    else:
        kwargs.update(do_sample=False, temperature=None, top_p=None, top_k=None)
    out = model.generate(input_ids=ids, attention_mask=mask, **kwargs)
    return out[:, ids.shape[1] :]


def variants(model: PreTrainedModel, pad: int, stop: list[int], new_tokens: int) -> dict[str, Callable]:
    """name -> f(ids, mask) returning completion ids; all sample with temperature 1.0, top_p 1.0."""

    def fast(dtype: torch.dtype | None, backend: str = "auto") -> Callable:
        return lambda ids, mask: fast_generate(
            model,
            ids,
            mask,
            max_new_tokens=new_tokens,
            eos_token_ids=stop,
            pad_token_id=pad,
            do_sample=True,
            dtype=dtype,
            backend=backend,
        )

    return {
        "generate": lambda ids, mask: hf_generate(
            model, ids, mask, pad=pad, stop=stop, new_tokens=new_tokens, do_sample=True
        ),
        "fast_fp32": fast(None),
        "fast_bf16": fast(torch.bfloat16),
        "generic_fp32": fast(None, "generic"),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--samples", type=int, default=4)
    parser.add_argument("--variants", default="generate,fast_fp32,fast_bf16")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)

    model, tok = load_model("embedded").eval(), load_tokenizer("embedded")
    encoded = [format_prompt(tok, p, chat=True) for p in prompts()]
    print(f"prompt lengths {[len(e) for e in encoded]}, batch {len(encoded) * args.samples}, threads {args.threads}")
    ids, mask = left_pad([e for e in encoded for _ in range(args.samples)], tok.pad_token_id)
    stop, pad = eos_ids(model, tok), tok.pad_token_id
    runs = {k: v for k, v in variants(model, pad, stop, args.new_tokens).items() if k in args.variants.split(",")}

    rates: dict[str, list[float]] = {name: [] for name in runs}
    cpu_rates: dict[str, list[float]] = {name: [] for name in runs}
    with torch.no_grad():
        for r in range(args.rounds):
            for name, fn in runs.items():
                start, cpu_start = time.perf_counter(), time.process_time()
                out = fn(ids, mask)
                elapsed, cpu = time.perf_counter() - start, time.process_time() - cpu_start
                cmask, _ = completion_mask(out, stop)
                rates[name].append(out.numel() / elapsed)
                cpu_rates[name].append(out.numel() / cpu)
                print(
                    f"round {r} {name:12s} {out.shape[1]:3d} steps ({int(cmask.sum()):4d} tokens up to EOS) "
                    f"wall {elapsed:6.2f}s {rates[name][-1]:7.1f} tok/s | cpu {cpu:6.2f}s "
                    f"{cpu_rates[name][-1]:7.1f} tok/s",
                    flush=True,
                )
    base = "generate" in runs
    print("\nvariant       wall best  wall median  speedup | cpu best  cpu median  speedup   (generated tok/s)")
    for name in runs:
        w, c = rates[name], cpu_rates[name]
        w_speed = statistics.median(w) / statistics.median(rates["generate"]) if base else float("nan")
        c_speed = statistics.median(c) / statistics.median(cpu_rates["generate"]) if base else float("nan")
        print(
            f"{name:12s} {max(w):10.1f} {statistics.median(w):12.1f} {w_speed:7.2f}x | {max(c):8.1f} "
            f"{statistics.median(c):11.1f} {c_speed:7.2f}x"
        )
    print("(speedup = ratio of medians to plain generate in this run)")

    greedy_check(model, tok, encoded=encoded, pad=pad, stop=stop)


def greedy_check(
    model: PreTrainedModel,
    tok: PreTrainedTokenizerBase,
    *,
    encoded: list[list[int]],
    pad: int,
    stop: list[int],
    new_tokens: int = 32,
) -> None:
    """Greedy fast_generate (fp32) must equal greedy model.generate token for token."""
    ids, mask = left_pad(encoded, pad)
    with torch.no_grad():
        ref = hf_generate(model, ids, mask, pad=pad, stop=stop, new_tokens=new_tokens, do_sample=False)
        out = fast_generate(
            model, ids, mask, max_new_tokens=new_tokens, eos_token_ids=stop, pad_token_id=pad, do_sample=False
        )
        bf16 = fast_generate(
            model,
            ids,
            mask,
            max_new_tokens=new_tokens,
            eos_token_ids=stop,
            pad_token_id=pad,
            do_sample=False,
            dtype=torch.bfloat16,
        )
    same = ref.shape == out.shape and torch.equal(ref, out)
    print(f"\ngreedy fp32 fast_generate == model.generate ({new_tokens} tokens, {len(encoded)} prompts): {same}")
    agree = [int((a[: min(len(a), len(b))] == b[: min(len(a), len(b))]).cumprod(0).sum()) for a, b in zip(ref, bf16)]
    print(f"greedy bf16: leading tokens equal to fp32 generate per prompt: {agree}")
    print("sample:", repr(tok.decode(out[0], skip_special_tokens=True)[:120]))


if __name__ == "__main__":
    main()
