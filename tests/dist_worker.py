"""A tiny team trained by one process or under torchrun, for tests/parallel/test_distributed.py and benchmarks/.

    python -m torch.distributed.run --standalone --nproc-per-node 2 tests/dist_worker.py OUT '{"max_steps": 3}'
    python tests/dist_worker.py OUT '{"max_steps": 3}'                   # the single-process reference

The JSON holds MAGRPOConfig fields (or, with ``"trainer": "iac"`` / ``"maac"``, IACConfig / MAACConfig fields) plus
``resume`` (continue from the newest checkpoint in output_dir),
``model`` (keyword arguments of tiny.tiny_model, e.g. {"hidden": 256, "layers": 4}) or ``model_dir`` (a saved
model every process loads by path), ``lora`` (peft.LoraConfig
fields: a LoRA team on one shared base per process), and the test hooks ``die_at`` / ``hang_at`` /
``reward_error_at`` = [rank, step]: that rank exits with os._exit(1) / sleeps forever at the start of that
step, or that rank's reward function raises during that step (only rank 0 computes rewards); ``kill_at``: that rank
sends itself SIGKILL. Each rank writes
``OUT/weights.rank<r>.pt`` ({agent index: its own weights} of its agents), ``OUT/bytes.rank<r>.json`` ({agent
index: bytes of parameters, gradients and optimizer state held by this rank; "peak_rss": the process's peak RSS;
"checkpointing": whether its agents recompute activations in backward}), ``OUT/history.rank<r>.json`` (the
trainer's metrics per step plus ``time/step``, the wall time of the step) and ``OUT/final`` (save_model at the
end); actor-critic runs add
``OUT/critics.rank<r>.pt`` ({critic index: its trainable parameters} of the critics on that rank) and
``OUT/critic_rows.rank<r>.json`` (how many rows its critics ran forward: values and updates) and
``OUT/critic_dtypes.rank<r>.json`` (each critic's backbone dtype).

``{"scenarios": {NAME: SPEC, ...}}`` runs several specs one after another in the same processes, each into
``OUT/NAME``, which gets ``done.rank<r>`` when rank r finished it.
"""

from __future__ import annotations

import json
import os
import resource
import signal
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))

from tiny import tiny_model, tiny_tokenizer  # noqa: E402

ROWS = [{"prompt": f"Task {i}: say something."} for i in range(8)]
BASE = dict(
    per_device_train_batch_size=4,
    num_generations=2,
    max_new_tokens=6,
    max_steps=3,
    learning_rate=1e-2,
    logging_steps=1,
    disable_tqdm=True,
    seed=11,
    save_total_limit=None,
)


def length_reward(a: list[str], b: list[str]) -> list[float]:
    return [float(len(b[0]) - len(a[0]))]


def revise(prompts: list[str], agent_completions: list[str]) -> list[str]:
    """Turn 2 of a multi-turn episode: each agent sees its prompt and its first answer."""
    return [f"{p} First try: {c[:8]} Again:" for p, c in zip(prompts, agent_completions)]


def full(t: torch.Tensor) -> torch.Tensor:
    """A whole tensor: an FSDP shard gathered over its mesh (a collective), anything else as it is."""
    return t.full_tensor() if hasattr(t, "full_tensor") else t


def own_weights(agent) -> dict[str, torch.Tensor]:
    """The agent's weights: the whole model, or only its own LoRA adapter on a shared base."""
    if agent.adapter is None:  # a sharded agent's tensors are gathered (every rank of it calls this)
        return {k: full(v).detach().clone() for k, v in agent.model.state_dict().items()}
    return {k: v.detach().clone() for k, v in agent.model.named_parameters() if f".{agent.adapter}." in k}


def run(out: str | Path, spec: dict) -> dict:
    """Train the tiny team; returns the trainer's train() output (weights and history go to ``out``)."""
    from comlrl.configs.actor_critic import IACConfig, MAACConfig
    from comlrl.configs.policy import MAGRPOConfig
    from comlrl.parallel import checkpoint
    from comlrl.parallel.sharding import local_bytes
    from comlrl.trainers.actor_critic import IACTrainer, MAACTrainer
    from comlrl.trainers.magrpo import MAGRPOTrainer

    spec = dict(spec)
    kind = spec.pop("trainer", "magrpo")
    trainer_class, config_class = {
        "magrpo": (MAGRPOTrainer, MAGRPOConfig),
        "iac": (IACTrainer, IACConfig),
        "maac": (MAACTrainer, MAACConfig),
    }[kind]
    hooks = {k: spec.pop(k) for k in ("die_at", "kill_at", "hang_at", "reward_error_at", "resume") if k in spec}
    model_kwargs = spec.pop("model", {})
    lora = spec.pop("lora", None)
    out = Path(out)
    rank = int(os.environ.get("RANK", 0))

    class HookedTrainer(trainer_class):
        def training_step(self, batches):  # the failure hooks fire as step `at` (1-based) starts
            step = self.state["step"] + 1
            if hooks.get("die_at") == [rank, step]:
                print(f"rank {rank}: dying at step {step} (test hook)", flush=True)
                os._exit(1)
            if hooks.get("kill_at") == [rank, step]:
                print(f"rank {rank}: SIGKILL at step {step} (test hook)", flush=True)
                os.kill(os.getpid(), signal.SIGKILL)
            if hooks.get("hang_at") == [rank, step]:
                print(f"rank {rank}: hanging at step {step} (test hook)", flush=True)
                time.sleep(3600)
            self._step = step
            start = time.perf_counter()
            metrics = super().training_step(batches)
            metrics["time/step"] = time.perf_counter() - start
            return metrics

        def _forward_values(self, critic, ids, mask):  # actor-critic: rows each critic copy runs (values + updates)
            self.critic_rows = getattr(self, "critic_rows", 0) + ids.shape[0]
            return super()._forward_values(critic, ids, mask)

    def reward(a, b):
        if hooks.get("reward_error_at") == [rank, getattr(trainer, "_step", 0)]:
            raise ValueError("reward exploded (test hook)")
        return length_reward(a, b)

    model_dir = spec.pop("model_dir", None)
    args = config_class(**{**BASE, "output_dir": str(out / "run"), **spec})
    model = model_dir or tiny_model(**model_kwargs)  # model_dir: a saved model, loaded by each process
    if not model_dir:
        # Extra stop ids make some completions end early, so shards get different widths and masks get padding.
        model.generation_config.eos_token_id = [2, *range(60, 90)]
    peft_config = None
    if lora is not None:
        from peft import LoraConfig

        peft_config = LoraConfig(**lora)
    trainer = HookedTrainer(
        model=model,
        tokenizer=None if model_dir else tiny_tokenizer(),  # a saved model (or "embedded") brings its own
        train_dataset=ROWS,
        reward_func=reward,
        formatters=[lambda e: e["prompt"], lambda e: e["prompt"] + " More detail:"],
        args=args,
        peft_config=peft_config,
        external_transition=revise if args.num_turns > 1 else None,
    )
    resume = checkpoint.latest_checkpoint(args.output_dir) if hooks.get("resume") else None
    result = trainer.train(resume_from_checkpoint=str(resume) if resume else None)
    out.mkdir(parents=True, exist_ok=True)
    torch.save({a.index: own_weights(a) for a in trainer.agents}, out / f"weights.rank{rank}.pt")
    held = {a.index: local_bytes(a.model, a.optimizer) for a in trainer.agents}
    peak_rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux reports KiB
    checkpointing = all(getattr(a.model, "_comlrl_checkpointing", False) for a in trainer.agents)
    (out / f"bytes.rank{rank}.json").write_text(
        json.dumps({**held, "peak_rss": peak_rss, "checkpointing": checkpointing})
    )
    trainer.save_model(str(out / "final"))  # a sharded agent: gathered into one from_pretrained folder
    (out / f"history.rank{rank}.json").write_text(json.dumps(result["history"]))
    if kind != "magrpo":
        torch.save(
            {c.index: [full(p).detach().clone() for p in c.model.trainable_parameters()] for c in trainer.critics},
            out / f"critics.rank{rank}.pt",
        )
        (out / f"critic_rows.rank{rank}.json").write_text(json.dumps(getattr(trainer, "critic_rows", 0)))
        (out / f"critic_dtypes.rank{rank}.json").write_text(
            json.dumps({c.index: str(next(c.model.backbone.parameters()).dtype) for c in trainer.critics})
        )
    return result


def run_scenarios(out: str | Path, scenarios: dict[str, dict]) -> None:
    """Run each ``{name: spec}`` in order, into ``out/name``; each rank marks a scenario it finished with
    ``out/name/done.rank<r>``. The same processes (and process group) run them all: a launch's start-up is paid once
    for several checks."""
    rank = int(os.environ.get("RANK", 0))
    for name, spec in scenarios.items():
        print(f"rank {rank}: === scenario {name} ===", file=sys.stderr, flush=True)  # its traceback would follow
        run(Path(out) / name, spec)
        (Path(out) / name / f"done.rank{rank}").touch()


if __name__ == "__main__":
    torch.set_num_threads(1)  # as torchrun's workers (OMP_NUM_THREADS=1): same float reductions in every process
    spec = json.loads(sys.argv[2]) if len(sys.argv) > 2 else {}
    if "scenarios" in spec:
        run_scenarios(sys.argv[1], spec["scenarios"])
    else:
        run(sys.argv[1], spec)
