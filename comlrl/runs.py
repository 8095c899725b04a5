"""What a run config builds (its environment, data and trainer) and what a finished run is read back as (its config and
trained models), for ``comlrl train``, ``comlrl eval`` and ``comlrl compare``.

:func:`open_evaluation` loads what ``comlrl eval TARGET`` evaluates (a run's trained models, or a config's untrained
ones), :func:`trained_models` finds and checks a run's saved models, and :func:`make_generate` turns a trainer's agents
into the ``generate`` function the baselines and comparisons call.
"""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path
from typing import Any

from . import runconfig
from .errors import ComlrlError

BASELINES = ("single", "parallel", "sequential", "discussion", "centralized")


def make_env(cfg: runconfig.RunConfig) -> Any:
    from . import envs

    return envs.make(cfg.env.name, num_agents=cfg.team_size, format=cfg.env.format, **cfg.env.options)


def load_data(cfg: runconfig.RunConfig, env: Any) -> tuple[Any, Any]:
    """(train rows, eval rows or None) as the ``data`` section says; held-out rows never enter training."""
    d = cfg.data
    split = {} if d.split is None else {"split": d.split}
    if not d.eval_limit:
        return env.load_dataset(d.source, limit=d.limit, **split), None
    if d.eval_split != "holdout":
        train = env.load_dataset(d.source, limit=d.limit, **split)
        return train, env.load_dataset(d.eval_source or d.source, split=d.eval_split, limit=d.eval_limit)
    if d.eval_source not in (None, d.source):
        raise ComlrlError(
            "data.eval_split=holdout takes evaluation rows from data.source; unset data.eval_source "
            "or give eval_split a split name."
        )
    rows = env.load_dataset(d.source, limit=None if d.limit is None else d.limit + d.eval_limit, **split)
    n = len(rows)
    if n <= d.eval_limit:
        raise ComlrlError(
            f"data: {n} rows cannot hold out data.eval_limit={d.eval_limit} evaluation rows and still "
            "train; lower eval_limit or add rows."
        )
    return rows.select(range(n - d.eval_limit)), rows.select(range(n - d.eval_limit, n))


def build_trainer(cfg: runconfig.RunConfig, env: Any, *, train: Any, evaluation: Any, output_dir: str) -> Any:
    """The algorithm's trainer for this env, data and team (loads the models)."""
    args = cfg.trainer_config(env_defaults=env.defaults, output_dir=output_dir)
    team = {"agents": cfg.agents} if cfg.agents is not None else {"model": cfg.model, "num_agents": cfg.team_size}
    return cfg.algo.trainer_class()(
        **team,
        tokenizer=cfg.tokenizer,
        train_dataset=train,
        eval_dataset=evaluation,
        reward_func=env.reward_func,
        formatters=env.formatters(),
        external_transition=env.external_transition,
        peft_config=cfg.lora_config(),
        args=args,
    )


# --- a finished run ------------------------------------------------------------------------------------


def open_evaluation(
    target: str | Path, step: int | None = None, overrides: list[str] | tuple[str, ...] = ()
) -> tuple[Any, Any, Any, dict[str, Any]]:
    """(trainer, env, evaluation rows, models) of ``comlrl eval TARGET``, with the models to evaluate loaded.

    TARGET is a run directory (its resolved ``config.yaml``; the trained models in ``final/``, or those of
    ``checkpoint-<step>``) or a YAML run config (the config's model, untrained). ``models`` says which was loaded.
    """
    target = Path(target)
    run = None
    if target.is_dir():
        cfg = runconfig.load_config(run_config_file(target), overrides)
        # a trainer's num_models: the model folders it saves whatever the team's size (the centralized baseline: 1)
        run = trained_models(target, step, getattr(cfg.algo.trainer_class(), "num_models", None) or cfg.team_size)
    elif step is not None:
        raise ComlrlError(f"--checkpoint {step} needs a run directory (written by comlrl train), not {target}.")
    elif not target.exists():
        raise ComlrlError(
            f"{target} does not exist: pass a run directory (written by comlrl train) to evaluate its "
            "trained models, or a YAML run config to evaluate the config's model."
        )
    else:
        cfg = runconfig.load_config(target, overrides)
    if not cfg.data.eval_limit:
        raise ComlrlError("eval needs evaluation rows: set data.eval_limit > 0 (e.g. --set data.eval_limit=16).")
    env = make_env(cfg)
    _, rows = load_data(cfg, env)
    trainer = build_trainer(
        cfg, env, train=None, evaluation=rows, output_dir=str(target) if run else cfg.output_dir or "output"
    )
    if run is None:
        team = cfg.agents if cfg.agents is not None else f"{cfg.model} x {cfg.team_size}"
        return (
            trainer,
            env,
            rows,
            {
                "config": str(target),
                "models": "untrained",
                "description": f"{team}, untrained (the config's model; pass a run directory "
                "to evaluate a run's trained models)",
            },
        )
    from .parallel.checkpoint import load_weights

    for agent in trainer.agents:  # full weights, or the agent's LoRA adapter on the base the config names
        load_weights(agent.model, run / agent.name, agent.adapter)
    what = "final models" if run.name == "final" else f"models at step {run.name.removeprefix('checkpoint-')}"
    lora = f", LoRA adapters on {cfg.agents or cfg.model}" if cfg.lora is not None else ""
    return (
        trainer,
        env,
        rows,
        {
            "run_dir": str(target),
            "models": run.name,
            "path": str(run),
            "description": f"{run} (the {what} of run {target}{lora})",
        },
    )


def run_config_file(run_dir: Path) -> Path:
    """The resolved ``config.yaml`` every run of ``comlrl train`` writes in its directory."""
    path = run_dir / "config.yaml"
    if not path.is_file():
        held = sorted(p.name for p in run_dir.iterdir())
        raise ComlrlError(
            f"{run_dir} is not a run directory of comlrl train: it has no config.yaml (the resolved "
            f"config every run writes); it holds: {', '.join(held) or 'nothing'}."
        )
    return path


def strip_step(target: str) -> tuple[str, int | None]:
    """(run directory, checkpoint step) of ``DIR@STEP``; (target, None) without a step."""
    m = re.match(r"^(.*)@(\d+)$", target)
    return (m.group(1), int(m.group(2))) if m else (target, None)


def trained_models(run_dir: Path, step: int | None, num_agents: int) -> Path:
    """``run_dir/final`` (step None) or ``run_dir/checkpoint-<step>``, checked to hold one folder per agent."""
    from .parallel import checkpoint

    saved = [s for s, _ in checkpoint.checkpoints(run_dir)]
    listing = (
        f"its checkpoints: {', '.join(map(str, saved))}"
        if saved
        else "it has no checkpoints (training.save_steps was 0, or the run stopped before the first)"
    )
    final = run_dir / "final"
    if step is None:
        if not final.is_dir():
            raise ComlrlError(
                f"{run_dir} has no final models: {final} is written when training finishes; {listing}"
                + (" (evaluate one with --checkpoint N)." if saved else ".")
            )
        folder = final
    else:
        folder = run_dir / f"{checkpoint.PREFIX}{step}"
        if not folder.is_dir():
            raise ComlrlError(
                f"{run_dir} has no {folder.name}; {listing}"
                + ("; and final models (omit --checkpoint)." if final.is_dir() else ".")
            )
        problem = checkpoint.verify(folder)
        if problem is not None:
            raise ComlrlError(f"{folder} cannot be evaluated: {problem}.")
    names = [f"agent_{i}" for i in range(num_agents)]
    held = sorted(p.name for p in folder.iterdir() if p.is_dir() and p.name.startswith("agent_"))
    if held != sorted(names):
        raise ComlrlError(
            f"{folder} holds {', '.join(held) or 'no agent folders'}, but the run's team of "
            f"{num_agents} needs {', '.join(names)}."
        )
    return folder


def make_generate(
    trainer: Any, batch_size: int = 8, *, seed: int | None = None, tokens: list[list[int]] | None = None
) -> Any:
    """``generate(agent_index, prompts, parts=1) -> completions`` with the trainer's agents (greedy unless
    eval_do_sample); ``parts`` agents' answers in one completion get ``parts`` x ``max_new_tokens``.

    ``seed``: prompt j of the generator's k-th call samples from its own stream keyed by (seed, agent, k, j), so what
    it samples does not depend on the batch size or on what ran before (None: the global RNG). ``tokens``: each call
    appends the tokens it generated per prompt (up to and including the first EOS)."""
    from tqdm.auto import tqdm

    from .rollout.rollout import generate as generate_batch
    from .rollout.sampling import derive_seed

    settings = trainer.generation_settings(train=False)
    calls = [0]

    def generate(agent_index: int, prompts: list[str], parts: int = 1) -> list[str]:
        agent = trainer.agents[agent_index]
        budget = (
            settings if parts == 1 else dataclasses.replace(settings, max_new_tokens=settings.max_new_tokens * parts)
        )
        call, calls[0] = calls[0], calls[0] + 1
        out: list[str] = []
        counts: list[int] = []
        bar = tqdm(
            range(0, len(prompts), batch_size),
            desc=f"generate agent {agent_index}",
            leave=False,
            disable=trainer.args.disable_tqdm,
        )
        for lo in bar:
            batch = prompts[lo : lo + batch_size]
            adapters = [agent.adapter] * len(batch) if agent.adapter is not None else None
            seeds = None if seed is None else [derive_seed(seed, agent_index, call, lo + j) for j in range(len(batch))]
            samples = generate_batch(
                agent.model,
                agent.tokenizer,
                batch,
                num_generations=1,
                settings=budget,
                chat=agent.chat,
                autocast_dtype=trainer.rollout_dtype,
                adapter_names=adapters,
                row_seeds=seeds,
            )
            out.extend(samples.texts)
            counts.extend(int(n) for n in samples.completion_mask.sum(dim=1))
        if tokens is not None:
            tokens.append(counts)
        return out

    return generate
