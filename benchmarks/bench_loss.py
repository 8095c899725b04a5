"""One agent's loss forward+backward on the embedded SmolLM2-135M, interleaved A/B so machine drift hits all alike.

Shapes: 4 completions of 64 tokens after a 40-token prompt. Setups: ``lora`` (r=16 all-linear on a bf16
base, bf16 autocast), ``full_bf16`` (fp32 weights, bf16 autocast), ``full_fp32``. Variants per setup:

* ``ours``: ``completion_logprobs`` as the trainer runs it (eager attention when training in bf16 on CPU, chunked
  output-layer log-probs over real completion tokens only, lean RMSNorm / rotary / MLP autograd Functions, the
  prompt shared by the 4 rows run once);
* ``distinct``: ``ours`` with a different prompt per row, so nothing is shared;
* ``sdpa``: the same with SDPA attention kept (``training_attention`` disabled);
* ``eager_layers``: the same with HF's own RMSNorm / rotary / MLP ops (``lean_layers`` disabled);
* ``logits``: eager attention, but the model's own logits for the last C+1 positions + ``token_logprobs`` and PEFT's
  own LoRA forward (no chunked head, no fused LoRA delta);
* ``before``: ``logits`` with SDPA attention: the loss path before these three changes.

    python benchmarks/bench_loss.py --setup lora --rounds 8
"""

from __future__ import annotations

import argparse
import contextlib
import resource
import statistics
import time

import torch

from comlrl.accel import attention
from comlrl.engine import logprobs
from comlrl.engine.models import load_model


def build(setup: str) -> torch.nn.Module:
    model = load_model("embedded")
    if setup == "lora":
        from peft import LoraConfig, get_peft_model

        model = get_peft_model(
            model.to(torch.bfloat16), LoraConfig(r=16, lora_alpha=32, lora_dropout=0.0, target_modules="all-linear")
        )
        for name, p in model.named_parameters():
            if "lora_" in name:
                p.data = p.data.float()
    return model.train()


# variant -> the training-forward switch of comlrl.rollout.rollout it turns off
_OFF = {"sdpa": "training_attention", "eager_layers": "lean_layers"}


def step(model: torch.nn.Module, variant: str, bf16: bool, tensors: list[torch.Tensor]) -> float:
    p_ids, p_mask, c_ids, c_mask = tensors
    if variant == "distinct":  # every row's prompt differs (one token): nothing to share, same shapes
        p_ids = p_ids.clone()
        p_ids[:, 0] = torch.arange(len(p_ids))
    start = time.perf_counter()
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
        if variant in ("logits", "before"):
            ids, mask = torch.cat([p_ids, c_ids], 1), torch.cat([p_mask, c_mask], 1)
            with attention.training_attention(model) if variant == "logits" else contextlib.nullcontext():
                logp = logprobs._logits_logprobs(
                    model,
                    ids=ids,
                    mask=mask,
                    position_ids=(mask.cumsum(1) - 1).clamp(min=0),
                    completion_ids=c_ids,
                    completion_mask=c_mask,
                )
        else:
            name = _OFF.get(variant)  # "ours" / "distinct": every switch on
            original = getattr(logprobs, name) if name else None
            if name:
                setattr(logprobs, name, lambda m: contextlib.nullcontext())
            try:
                logp = logprobs.completion_logprobs(model, p_ids, p_mask, c_ids, c_mask)
            finally:
                if name:
                    setattr(logprobs, name, original)
    (logp * c_mask).sum().backward()
    model.zero_grad(set_to_none=True)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--setup", choices=["lora", "full_bf16", "full_fp32"], default="lora")
    parser.add_argument("--variants", default="ours,distinct,eager_layers,sdpa,logits,before")
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--threads", type=int, default=2)
    ns = parser.parse_args()
    torch.set_num_threads(ns.threads)
    torch.manual_seed(0)
    model = build(ns.setup)
    batch, prompt, completion = 4, 40, 64
    tensors = [
        torch.randint(0, 49000, (1, prompt)).repeat(batch, 1),
        torch.ones(batch, prompt, dtype=torch.long),
        torch.randint(0, 49000, (batch, completion)),
        torch.ones(batch, completion, dtype=torch.long),
    ]
    variants = ns.variants.split(",")
    bf16 = ns.setup != "full_fp32"
    for v in variants:  # warm-up
        step(model, v, bf16, tensors)
    times: dict[str, list[float]] = {v: [] for v in variants}
    for _ in range(ns.rounds):
        for v in variants:
            times[v].append(step(model, v, bf16, tensors))
    print(
        f"setup {ns.setup}, {ns.threads} threads, {ns.rounds} interleaved rounds, "
        f"peak RSS {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024**2:.2f} GB"
    )
    print("| variant | median s | min s |\n|---|---:|---:|")
    for v, ts in times.items():
        print(f"| {v} | {statistics.median(ts):.3f} | {min(ts):.3f} |")


if __name__ == "__main__":
    main()
