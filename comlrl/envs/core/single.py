"""The single-agent training form of an environment: ``make(name, format="single")``.

One model writes the whole team answer from the environment's single-agent prompt (``team.single_formatter()``);
``team.split_single`` splits each answer into the parts the team's agents would write, and the team's reward scores
those parts. Trained with GRPO (``algorithm: magrpo`` with one agent) on the team's steps, rows and samples per row,
with ``max_new_tokens`` = the team's per-agent limit x its size, it is the equal-budget control of a team: the same
reward and the same number of new tokens per joint answer, without a second agent. Its ``evaluate`` returns the
team's metric keys, so the two compare directly.

Single-turn only: a team's multi-turn transition builds one prompt per agent, and no general rule turns them into one
model's prompt, so the form has no ``external_transition`` (a run config with ``training.num_turns`` > 1 is refused).
"""

from __future__ import annotations

import inspect
from typing import Any

import datasets

from ...errors import ComlrlError
from .base import Env, Formatter, TeamReward

#: ``make(..., format=...)``: one model per agent (the team), or one model writing every part.
FORMATS = ("team", "single")


class SplitSingleReward(TeamReward):
    """The team reward of ``team``, scored on the parts ``team.split_single`` makes of each single answer.

    Score keys, ``level_names`` and ``max_reward`` are the team reward's.
    """

    def __init__(self, team: Env) -> None:
        super().__init__(1, team.name)
        self.team = team
        self.level_names = team.reward_func.level_names
        self.max_reward = team.reward_func.max_reward

    def split(self, answers: list[str], rows: list[dict]) -> list[list[str]]:
        """Per-agent completion lists (``parts[i][j]``: agent i's part of answer j) from the single answers."""
        n = self.team.num_agents
        parts = [self.team.split_single(a, r) for a, r in zip(answers, rows)]
        for j, p in enumerate(parts):
            if len(p) != n:
                raise ComlrlError(
                    f"{self.__name__}: {self.team.name}.split_single gave {len(p)} parts for answer {j}, "
                    f"the team has {n} agents."
                )
        return [[p[i] for p in parts] for i in range(n)]

    def score_batch(self, agent_completions: list[list[str]], rows: list[dict]) -> list[dict[str, float]]:
        return self.team.reward_func.score(*self.split(agent_completions[0], rows), batch_items=rows)


class SingleAgentEnv(Env):
    """``team`` (a built environment of two or more agents) as one agent that writes every part.

    Data, options and metrics are the team's; the team environment is ``self.team``, and attributes this class does
    not define are read from it.
    """

    agent_counts = (1,)

    def __init__(self, team: Env) -> None:
        self.name = team.name
        super().__init__(1)
        if team.num_agents < 2:
            raise ComlrlError(f"{team.name}: format='single' needs a team of 2+ agents to split into, got 1.")
        self.team = team
        self.description = f"{team.description} (one model writes every part)"
        self.default_data = team.default_data
        self.defaults = single_defaults(team.defaults, team.num_agents)
        self.reward_func = SplitSingleReward(team)
        self.external_transition = None

    def __getattr__(self, name: str) -> Any:
        if name == "team":  # not set yet: no recursion through the team
            raise AttributeError(name)
        return getattr(self.team, name)

    def load_dataset(self, source: str | None = None, *args: Any, **kwargs: Any) -> datasets.Dataset:
        """The team's rows (its default split when none is given)."""
        return self.team.load_dataset(source, *args, **kwargs)

    def formatters(self) -> list[Formatter]:
        return [self.team.single_formatter()]

    def roles(self) -> list[str]:
        return ["every part: " + "; ".join(self.team.roles())]

    def single_formatter(self) -> Formatter:
        return self.team.single_formatter()

    def split_single(self, answer: str, row: dict) -> list[str]:
        """The answer whole: the reward splits it into the team's parts."""
        return [answer]

    def evaluate(self, agent_completions: list[list[str]], batch_items: list[dict]) -> dict[str, float]:
        """The team's ``evaluate`` on the split parts: the team's metric keys."""
        if len(agent_completions) != 1:
            raise ComlrlError(
                f"{self.name} (format='single'): got completions for {len(agent_completions)} agent(s), expected 1."
            )
        rows = [dict(r) for r in batch_items]
        return self.team.evaluate(self.reward_func.split(list(agent_completions[0]), rows), rows)

    def describe(self) -> dict[str, Any]:
        return {**self.team.describe(), "num_agents": 1, "format": "single", "defaults": dict(self.defaults)}

    def __repr__(self) -> str:
        return f"{type(self).__name__}(name={self.name!r}, team={self.team!r})"


def single_defaults(defaults: dict[str, Any], num_agents: int) -> dict[str, Any]:
    """A team's suggested settings for one model writing every part: ``max_new_tokens`` x the team's size."""
    out = dict(defaults)
    if "max_new_tokens" in out:
        out["max_new_tokens"] = out["max_new_tokens"] * num_agents
    return out


def default_team_size(cls: type[Env]) -> int:
    """The agent count ``cls()`` builds: the team ``make(name, format="single")`` splits answers for."""
    default = inspect.signature(cls.__init__).parameters["num_agents"].default
    return 2 if default is inspect.Parameter.empty else int(default)


def check_format(name: str, format: str, num_agents: int | None) -> int:
    """The agent count ``make`` builds for ``format``; a ComlrlError naming the field for an unknown format or a
    team size with format 'single'."""
    if format not in FORMATS:
        raise ComlrlError(f"environment '{name}': unknown format {format!r}; choose from {', '.join(FORMATS)}.")
    if format == "team":
        return 2 if num_agents is None else num_agents
    if num_agents not in (None, 1):
        raise ComlrlError(
            f"environment '{name}': num_agents={num_agents} with format='single': one model writes every part, "
            "so num_agents must be 1 (or left out)."
        )
    return 1
