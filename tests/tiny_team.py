"""A tiny MAGRPO team's training inputs (rows, a config, a reward) and its weights, for the tests that train one on
CPU and repeat the run elsewhere (on another device, with agents on their own devices)."""

from __future__ import annotations

import torch

from comlrl.configs.policy import MAGRPOConfig

ROWS = [{"prompt": f"Task {i}: say something."} for i in range(6)]


def cfg(**kw) -> MAGRPOConfig:
    """Two steps of 2 prompts x 2 generations of 6 tokens at lr 1e-2, quiet; ``kw`` overrides any field."""
    base = dict(
        per_device_train_batch_size=2,
        num_generations=2,
        max_new_tokens=6,
        max_steps=2,
        learning_rate=1e-2,
        logging_steps=0,
        disable_tqdm=True,
    )
    base.update(kw)
    return MAGRPOConfig(**base)


def length_reward(a: list[str], b: list[str]) -> list[float]:
    """The second agent's completion length minus the first's: a reward that differs between joint actions."""
    return [float(len(b[0]) - len(a[0]))]


def weights(trainer) -> list[torch.Tensor]:
    """Each agent's parameters, flattened into one tensor."""
    return [torch.cat([p.detach().flatten() for p in a.model.parameters()]) for a in trainer.agents]
