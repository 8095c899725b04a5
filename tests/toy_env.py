"""A tiny registered-on-demand environment whose reward varies with random tiny models (for CLI tests).

Reward = (len(c2) - len(c1)) / 10 in characters, level/longer = 1 when agent 2 wrote more. The tldr
reward is 0 for every random-model output, which would make every update zero and resume tests trivial.
"""

from __future__ import annotations

import contextlib
import json

from comlrl.envs.core import base, registry
from comlrl.envs.core.loaders import load_rows

NAME = "toy-length"


class ToyReward(base.TeamReward):
    level_names = ("level/longer",)
    max_reward = 10.0

    def score_batch(self, agent_completions, rows):
        a, b = agent_completions[0], agent_completions[-1]
        return [{"reward": (len(y) - len(x)) / 10.0, "level/longer": float(len(y) > len(x))} for x, y in zip(a, b)]


class ToyEnv(base.Env):
    name = NAME
    description = "toy: agent 2 should write more than agent 1"
    defaults = {"max_new_tokens": 8}

    def __init__(self, num_agents: int = 2) -> None:
        super().__init__(num_agents)
        self.reward_func = ToyReward(num_agents, NAME)

    def load_dataset(self, source=None, split="train", limit=None):
        return load_rows(
            source, split=split, limit=limit, required=["prompt"], normalize=lambda r, i: dict(r), env_name=NAME
        )

    def formatters(self):
        return [lambda row: row["prompt"], lambda row: row["prompt"] + " More:"][: self.num_agents]

    def roles(self):
        return ["short", "long"][: self.num_agents]


SPLIT_NAME = "toy-split"


class SplitToy(ToyEnv):
    """The toy env with a single-agent format: one answer, cut in half into the two roles."""

    name = SPLIT_NAME

    def formatters(self):
        return [self.single_formatter()] if self.num_agents == 1 else super().formatters()

    def single_formatter(self):
        return lambda row: row["prompt"] + " Both:"

    def split_single(self, answer, row):
        half = len(answer) // 2
        return [answer] if self.num_agents == 1 else [answer[:half], answer[half:]]


def register() -> None:
    registry.register(NAME, ToyEnv)


@contextlib.contextmanager
def registered():
    register()
    try:
        yield
    finally:
        registry.ENVS.pop(NAME, None)


def write_rows(path, n: int = 12) -> str:
    with open(path, "w") as fh:
        for i in range(n):
            fh.write(json.dumps({"prompt": f"Task {i}: say something."}) + "\n")
    return str(path)


def write_config(path, rows: str, model: str, **training) -> str:
    """A run config for the toy env with a tiny model; ``training`` overrides the defaults below."""
    import yaml

    settings = dict(
        seed=3,
        learning_rate=1e-2,
        per_device_train_batch_size=2,
        num_generations=2,
        max_new_tokens=6,
        max_steps=4,
        logging_steps=1,
        disable_tqdm=True,
    )
    settings.update(training)
    cfg = {
        "name": "toy",
        "algorithm": "magrpo",
        "env": {"name": NAME},
        "data": {"source": rows, "eval_limit": 2},
        "model": model,
        "num_agents": 2,
        "training": settings,
        "report": False,
    }
    with open(path, "w") as fh:
        yaml.safe_dump(cfg, fh, sort_keys=False)
    return str(path)
