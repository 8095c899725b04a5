"""Time per training step of the reference library, PyPI ``comlrl==1.4.3`` MAGRPO, on bench_train.py's config.

Run with the reference's own virtualenv (``bash scripts/setup_reference.sh`` creates it): the PyPI release is an
unrelated older project with our package name, so this script imports only it, never our comlrl.

    .venv-ref/bin/python benchmarks/bench_reference.py --model ~/.cache/comlrl/smollm2-135m-instruct --steps 8
    python benchmarks/bench_train.py --variants reference,full2    # the same, side by side with ours

Config as bench_train.py: 2 agents on the same local model folder, full fine-tune fp32, the first ``--steps`` of its
8 prompts (raw text, no chat template), num_generations=4, max_new_tokens=64, sampling at temperature 0.6, top_p
0.6, top_k 50 (``--temperature``, ``--top-p``, ``--top-k``: their defaults are bench_train.py's ``SAMPLING``, which
bench_train.py also passes explicitly; the reference's own defaults are the same), 1 turn, 1 epoch, learning rate
1e-5, no eval, no wandb, KL off, reward (len(last) - len(first)) / 100. The reference hands ``generate`` its
temperature and top_p, and its top_k as given unless it is None (transformers then applies its default 50): top_k 50
filters as our decode loop's top_k 50 does, and ``--top-k 0`` turns top-k off on both sides.
One prompt per optimizer step: rollout_buffer_size=1 and train_batch_size=1 make each agent take one AdamW step per
prompt (its defaults, 2 and 2, would take one step per 2 prompts). Only ``train()`` is timed; its generate, reward,
loss (forward + backward) and optimizer parts are timed by wrapping the trainer's own methods. Prints one JSON line.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import resource
import sys
import time
from pathlib import Path

os.environ.setdefault("WANDB_MODE", "disabled")
# Our repo's root must not shadow the reference package (it is not on sys.path when run as a script; be sure).
_ROOT = str(Path(__file__).resolve().parents[1])
sys.path[:] = [p for p in sys.path if p not in ("", ".", _ROOT)]

import torch  # noqa: E402
from bench_train import SAMPLING  # noqa: E402  (this script's folder is on sys.path; it imports no comlrl)

DATA = Path(__file__).resolve().parents[2] / "shared" / "data" / "tldr_posts_extra.jsonl"
DEFAULT_MODEL = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "comlrl" / "smollm2-135m-instruct"


def prompts(n: int = 8) -> list[dict]:
    """The prompts of bench_train.py: n real Reddit posts cut to ~40 tokens."""
    rows = [json.loads(line) for line in DATA.read_text().splitlines()[:n]]
    return [{"prompt": "Summarize: " + r["prompt"][:150]} for r in rows]


def reward(*completions):
    """bench_train.py's reward; the reference calls it with one [text] list per agent (aligned joint mode)."""
    return [float(len(completions[-1][0]) - len(completions[0][0])) / 100]


def _timed(obj, name: str, totals: dict, key: str) -> None:
    """Wrap obj.name so that its wall time adds to totals[key]."""
    inner = getattr(obj, name)

    @functools.wraps(inner)  # the reference inspects reward_func's signature
    def wrapper(*args, **kwargs):
        start = time.perf_counter()
        try:
            return inner(*args, **kwargs)
        finally:
            totals[key] += time.perf_counter() - start

    setattr(obj, name, wrapper)


def run(model: str, steps: int, sampling: dict) -> dict:
    """``train()`` of the reference on the first ``steps`` prompts, sampling with ``sampling`` (temperature, top_p,
    top_k), timed by part."""
    import comlrl
    from comlrl.trainers.reinforce.magrpo import MAGRPOConfig, MAGRPOTrainer

    if getattr(comlrl, "__version__", None) != "1.4.3":
        raise SystemExit(
            f"expected the reference comlrl 1.4.3, imported {comlrl.__file__} {getattr(comlrl, '__version__', '?')}"
        )
    args = MAGRPOConfig(
        num_train_epochs=1,
        agent_learning_rate=1e-5,
        logging_steps=1,
        num_agents=2,
        num_generations=4,
        max_new_tokens=64,
        temperature=sampling["temperature"],
        top_p=sampling["top_p"],
        top_k=sampling["top_k"],
        num_turns=1,
        early_termination_threshold=None,
        eval_interval=0,
        rollout_buffer_size=1,
        train_batch_size=1,
        reference_kl_enabled=False,
    )
    trainer = MAGRPOTrainer(
        agent_model=model, num_agents=2, train_dataset=prompts(steps), reward_func=reward, args=args
    )
    trainer.verbose = False  # no tqdm bar
    totals = dict.fromkeys(["generate", "reward", "update", "optimizer", "tokens"], 0)
    totals.update(opt_steps=[0] * trainer.num_agents, losses=[])
    generate = trainer._generate_completions

    def count_tokens(*a, **kw):  # generated tokens up to and including the stop token, as bench_train counts them
        out = generate(*a, **kw)
        width = out["completion_input_ids"][0][0].shape[0] if out["completion_input_ids"][0] else 0
        totals["tokens"] += sum(min(n + 1, width) for n in out["response_lens"])
        return out

    trainer._generate_completions = count_tokens
    _timed(trainer, "_generate_completions", totals, "generate")
    _timed(trainer, "reward_func", totals, "reward")
    _timed(trainer, "_update_from_samples", totals, "update")
    loss_fn = trainer._compute_loss_with_gradients

    def record_loss(*a, **kw):
        loss = loss_fn(*a, **kw)
        totals["losses"].append(float(loss.detach()))
        return loss

    trainer._compute_loss_with_gradients = record_loss
    for i, opt in enumerate(trainer.optimizers):
        inner_step = opt.step

        def step(*a, _inner=inner_step, _i=i, **kw):
            start = time.perf_counter()
            out = _inner(*a, **kw)
            totals["optimizer"] += time.perf_counter() - start
            totals["opt_steps"][_i] += 1
            return out

        opt.step = step
    probe = next(trainer.agents[0].parameters())
    before = probe.detach().clone()
    torch.manual_seed(0)
    start = time.perf_counter()
    trainer.train()
    total = time.perf_counter() - start
    n = min(totals["opt_steps"])  # optimizer steps of each agent (one per prompt)
    if n == 0:
        raise SystemExit(f"the reference took no optimizer step: {totals['opt_steps']}")
    delta = float((probe.detach() - before).abs().max())
    losses = [round(x, 3) for x in totals["losses"]]
    print(
        f"reference: optimizer steps per agent {totals['opt_steps']}, losses {losses}, "
        f"max |dW| of agent 0's first tensor {delta:.2e}",
        file=sys.stderr,
    )
    return {
        "variant": "reference",
        "steps": n,
        "sec_per_step": total / n,
        "sec_generate": totals["generate"] / n,
        "sec_reward": totals["reward"] / n,
        "sec_loss": (totals["update"] - totals["optimizer"]) / n,
        "sec_optimizer": totals["optimizer"] / n,
        "rollout_tokens_per_s": totals["tokens"] / max(totals["generate"], 1e-9),
        "peak_rss_gb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024**2,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--model",
        default=str(DEFAULT_MODEL),
        help="local transformers folder of SmolLM2-135M-Instruct (our converted embedded model)",
    )
    parser.add_argument("--steps", type=int, default=8, help="prompts, one optimizer step each (at most 8)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--temperature", type=float, default=SAMPLING["temperature"])
    parser.add_argument("--top-p", type=float, default=SAMPLING["top_p"])
    parser.add_argument("--top-k", type=int, default=SAMPLING["top_k"], help="0: top-k off")
    ns = parser.parse_args()
    torch.set_num_threads(ns.threads)
    sampling = dict(temperature=ns.temperature, top_p=ns.top_p, top_k=ns.top_k)
    print(json.dumps(run(ns.model, min(ns.steps, 8), sampling)))


if __name__ == "__main__":
    main()
