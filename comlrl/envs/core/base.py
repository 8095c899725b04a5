"""The environment interface (:class:`Env`, :class:`TeamReward`) and what every environment shares: formatters, choice
checks, score summaries; the registry behind ``comlrl.envs.make`` is in :mod:`.registry`.

An environment bundles what a cooperative task needs: a dataset loader, one prompt formatter per
agent, a team reward (a batched callable that also reports per-level scores), an optional multi-turn
transition, and evaluation metrics. ``make(name, num_agents=2, **options)`` builds one by name.

Team reward contract (what the trainer calls)::

    reward.batched is True                  # all joint actions of a step in one call
    reward(*agent_completions, batch_items=rows, **ignored) -> list[float]
    reward.score(*agent_completions, batch_items=rows) -> list[dict[str, float]]

``agent_completions[i]`` is agent i's list of L completions, ``batch_items`` the L dataset rows (one
per joint action; a single row is broadcast). Each score dict has ``"reward"`` and ``"level/<name>"``
keys in [0, 1] (the fraction of that level's points earned; levels after a failed one are 0), plus
environment-specific ``"metric/..."`` keys. ``reward(...) == [d["reward"] for d in reward.score(...)]``.
"""

from __future__ import annotations

import functools
import statistics
from typing import Any, Callable, Sequence

import datasets

from ...errors import ComlrlError

Formatter = Callable[[dict], str]


class TeamReward:
    """Base class of the environments' team rewards: subclasses implement :meth:`score_batch`."""

    batched = True
    #: The keys of :meth:`score` dicts besides "reward" (documented per environment).
    level_names: tuple[str, ...] = ()
    max_reward: float = 0.0

    def __init__(self, num_agents: int, name: str) -> None:
        self.num_agents = num_agents
        self.__name__ = f"{name}_reward"

    def score_batch(self, agent_completions: list[list[str]], rows: list[dict]) -> list[dict[str, float]]:
        """Score L joint actions: ``agent_completions[i][j]`` is agent i's answer in joint action j."""
        raise NotImplementedError

    def score(
        self, *agent_completions: Sequence[str], batch_items: Sequence[dict] | None = None, **kwargs: Any
    ) -> list[dict[str, float]]:
        """Per joint action: ``{"reward": r, "level/...": ..., ...}``. Extra keyword arguments are ignored."""
        completions = self._check_completions(agent_completions)
        rows = self._check_rows(batch_items, len(completions[0]) if completions else 0)
        if not completions or not completions[0]:
            return []
        return self.score_batch(completions, rows)

    def __call__(
        self, *agent_completions: Sequence[str], batch_items: Sequence[dict] | None = None, **kwargs: Any
    ) -> list[float]:
        """One team reward per joint action (``prompts``, ``turn`` and other keywords are ignored)."""
        return [d["reward"] for d in self.score(*agent_completions, batch_items=batch_items)]

    def _check_completions(self, agent_completions: Sequence[Sequence[str]]) -> list[list[str]]:
        if len(agent_completions) != self.num_agents:
            raise ComlrlError(
                f"{self.__name__}: got completions for {len(agent_completions)} agent(s), "
                f"the environment was made for num_agents={self.num_agents}."
            )
        lists = [list(c) if not isinstance(c, str) else [c] for c in agent_completions]
        lengths = {len(c) for c in lists}
        if len(lengths) > 1:
            raise ComlrlError(f"{self.__name__}: agents' completion lists differ in length: {[len(c) for c in lists]}.")
        for i, comps in enumerate(lists):
            for j, text in enumerate(comps):
                if not isinstance(text, str):
                    raise ComlrlError(
                        f"{self.__name__}: agent {i} completion {j} is {type(text).__name__}, expected str."
                    )
        return lists

    def _check_rows(self, batch_items: Sequence[dict] | None, n: int) -> list[dict]:
        if batch_items is None:
            return [{}] * n
        rows = list(batch_items)
        if len(rows) == 1 and n > 1:
            rows = rows * n
        if len(rows) != n:
            raise ComlrlError(
                f"{self.__name__}: {len(rows)} batch_items for {n} joint actions (need one row per joint action)."
            )
        return rows


class Env:
    """A cooperative task: loader, per-agent formatters, team reward, transition, evaluation.

    Subclasses set ``name``, ``description``, ``defaults``, ``roles`` and build ``reward_func``.
    """

    name: str = ""
    description: str = ""
    #: Suggested trainer settings (shown by ``comlrl envs``).
    defaults: dict[str, Any] = {}
    #: Supported agent counts (None: any count >= 1).
    agent_counts: tuple[int, ...] | None = None
    #: What ``load_dataset()`` reads when no source is given (shown by ``comlrl envs``).
    default_data: str = ""

    def __init__(self, num_agents: int = 2) -> None:
        if not isinstance(num_agents, int) or num_agents < 1:
            raise ComlrlError(f"{self.name}: num_agents must be a positive integer, got {num_agents!r}.")
        if self.agent_counts is not None and num_agents not in self.agent_counts:
            raise ComlrlError(
                f"{self.name}: num_agents={num_agents} is not supported; this task is defined for "
                f"{' or '.join(map(str, self.agent_counts))} agent(s) ({self.description})."
            )
        self.num_agents = num_agents
        self.reward_func: TeamReward
        self.external_transition: Callable[..., list[str]] | None = None

    # --- data and prompts ------------------------------------------------------------------------
    def load_dataset(
        self, source: str | None = None, split: str = "train", limit: int | None = None
    ) -> datasets.Dataset:
        """Rows in this environment's schema from a local file or HF id; ``source`` None: ``default_data``."""
        raise NotImplementedError

    def formatters(self) -> list[Formatter]:
        """One ``row -> prompt`` callable per agent (plain user-message text; chat templates are the trainer's)."""
        raise NotImplementedError

    def roles(self) -> list[str]:
        """A short description of each agent's part, used in baseline prompts."""
        raise NotImplementedError

    # --- single-agent baseline ------------------------------------------------------------------
    def single_formatter(self) -> Formatter:
        """A prompt asking one model for the whole team answer."""
        raise NotImplementedError

    def split_single(self, answer: str, row: dict) -> list[str]:
        """Split one model's whole answer into the per-agent answers the team reward expects."""
        raise NotImplementedError

    # --- metrics ---------------------------------------------------------------------------------
    def evaluate(self, agent_completions: list[list[str]], batch_items: list[dict]) -> dict[str, float]:
        """Metrics over joint answers: ``reward/mean``, ``reward/std``, the mean of every score key."""
        scores = self.reward_func.score(*agent_completions, batch_items=batch_items)
        return summarize_scores(scores)

    def describe(self) -> dict[str, Any]:
        """Name, description, agent count, default data, defaults and reward levels (for ``comlrl envs``)."""
        return {
            "name": self.name,
            "description": self.description,
            "num_agents": self.num_agents,
            "data": self.default_data,
            "defaults": dict(self.defaults),
            "max_reward": self.reward_func.max_reward,
            "levels": list(self.reward_func.level_names),
        }

    def __repr__(self) -> str:
        return f"{type(self).__name__}(name={self.name!r}, num_agents={self.num_agents})"


def agent_formatters(prompt: Callable[[dict, int | None], str], num_agents: int) -> list[Formatter]:
    """One formatter per agent from ``prompt(row, agent)``; ``num_agents=1``: the single-agent prompt
    (``agent=None``) alone."""
    if num_agents == 1:
        return [functools.partial(prompt, agent=None)]
    return [functools.partial(prompt, agent=i) for i in range(num_agents)]


def check_choices(env: str, option: str, value: str | Sequence[str], allowed: Sequence[str]) -> tuple[str, ...]:
    """``value`` (one name or several) as a tuple; a ``ValueError`` naming the env, the option and the choices
    when it is empty or holds an unknown name."""
    names = (value,) if isinstance(value, str) else tuple(value)
    unknown = [n for n in names if n not in allowed]
    if unknown or not names:
        given = ", ".join(map(repr, unknown)) if unknown else "nothing"
        raise ValueError(f"{env}: unknown {option} {given}; choose from {', '.join(allowed)}.")
    return names


def summarize_scores(scores: list[dict[str, float]]) -> dict[str, float]:
    """Mean of each score key over joint answers, plus ``reward/mean``, ``reward/std``, ``reward/max``."""
    if not scores:
        return {"reward/mean": 0.0, "reward/std": 0.0, "reward/max": 0.0, "count": 0.0}
    rewards = [s["reward"] for s in scores]
    out = {
        "reward/mean": statistics.fmean(rewards),
        "reward/std": statistics.pstdev(rewards) if len(rewards) > 1 else 0.0,
        "reward/max": max(rewards),
        "count": float(len(scores)),
    }
    for key in scores[0]:
        if key != "reward":
            out[key] = statistics.fmean(s.get(key, 0.0) for s in scores)
    return out
