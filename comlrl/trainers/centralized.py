"""The centralized baseline: one model writes every role's answer in one completion.

The completion ``<agent_1>...</agent_1> ... <agent_N>...</agent_N>`` is split into the N role outputs
(:func:`comlrl.algorithms.preference.split_roles`) for the team reward, the multi-turn transition and evaluation; a
completion that does not parse gives N empty outputs and counts in ``centralized/parse_failure_rate``. Training is
the one loop of :mod:`.base` with one agent: MAGRPO on the joint completion, one optimizer, the log-probs of every
token of it.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
from typing import Any, Callable

from ..algorithms.preference import centralized_prompt, split_roles
from ..configs.centralized import CentralizedMAGRPOConfig
from ..configs.policy import MAGRPOConfig
from ..engine.rewards import accepted_kwargs
from ..errors import ConfigError
from ..rollout.episode import Episode, Node, check_transition, transition
from .base import MultiAgentTrainer
from .build import build_formatters


class RolePrompt(str):
    """A centralized prompt that remembers the role prompts it was built from (``role_prompts``), so the reward and
    the transition see each role's own prompt."""

    role_prompts: list[str]

    def __new__(cls, role_prompts: list[str], template: str) -> RolePrompt:
        self = super().__new__(cls, centralized_prompt(role_prompts, template))
        self.role_prompts = list(role_prompts)
        return self


def role_prompts(prompt: str, row: dict, formatters: list[Callable]) -> list[str]:
    """The role prompts behind a centralized prompt (rebuilt from the row by the role formatters if it has none)."""
    return getattr(prompt, "role_prompts", None) or [f(row) for f in formatters]


class RoleSplitReward:
    """``reward_func`` as the decentralized team's reward sees it: called with the N role outputs split from each
    joint completion (empty ones when it does not parse), and ``prompts=`` per role. Keeps ``batched`` and a
    ``score()`` method (level metrics) when ``reward_func`` has them. Counts ``joint_actions`` and ``parse_failures``
    over its calls."""

    def __init__(self, reward_func: Callable, formatters: list[Callable]) -> None:
        self.reward_func, self.formatters, self.num_roles = reward_func, formatters, len(formatters)
        self.batched = bool(getattr(reward_func, "batched", False))
        self.__name__ = getattr(reward_func, "__name__", type(reward_func).__name__)
        self.joint_actions = self.parse_failures = 0
        if hasattr(reward_func, "score"):
            self.score = functools.partial(self._forward, reward_func.score)

    def __call__(self, *completions: list[str], **extras: Any) -> Any:
        return self._forward(self.reward_func, *completions, **extras)

    def _forward(self, target: Callable, *completions: list[str], **extras: Any) -> Any:
        if len(completions) != 1:
            raise ConfigError(f"the centralized reward takes the one model's completions, got {len(completions)} lists")
        split = [split_roles(text, self.num_roles) for text in completions[0]]
        self.joint_actions += len(split)
        self.parse_failures += sum(not ok for _, ok in split)
        roles = [[outputs[i] for outputs, _ in split] for i in range(self.num_roles)]
        kwargs = accepted_kwargs(self.reward_func, extras)
        if "prompts" in kwargs:
            rows = extras.get("batch_items") or [{}] * len(split)
            per_action = [role_prompts(p, r, self.formatters) for p, r in zip(extras["prompts"][0], rows)]
            kwargs["prompts"] = [[p[i] for p in per_action] for i in range(self.num_roles)]
        return target(*roles, **kwargs)


class CentralizedMAGRPOTrainer(MultiAgentTrainer):
    """The centralized baseline of a decentralized team: one model answers for all N roles at once.

    Takes MAGRPOTrainer's arguments, read as the decentralized team's: ``formatters`` are the N role formatters,
    ``num_agents`` the number of roles (``args.num_roles``), ``reward_func`` / ``eval_reward_func`` the team reward of
    N role outputs, ``external_transition`` the team's (it gets per-role prompts, completions and histories and
    returns N role prompts, rebuilt into the next centralized prompt). ``model`` (or ``agents=[one source]``) is the
    one model; its prompt for a row is :func:`comlrl.algorithms.preference.centralized_prompt` of the role prompts
    with ``args.centralized_template``. A plain MAGRPOConfig is taken as a CentralizedMAGRPOConfig with its values.

    Metrics: ``centralized/parse_failure_rate`` (the share of joint completions that do not parse, over the step's
    samples and turns) every step and as ``eval/centralized/parse_failure_rate`` in :meth:`evaluate`, whose
    ``last_eval_samples`` hold the role outputs as ``completions`` (``joint_completion``: the model's text).
    """

    config_class = CentralizedMAGRPOConfig
    accepted_config = CentralizedMAGRPOConfig
    num_models = 1  # model folders a run saves (agent_0), whatever the number of roles (read by ``comlrl eval``)

    def __init__(
        self,
        model: Any = None,
        num_agents: int | None = None,
        tokenizer: Any = None,
        train_dataset: Any = None,
        reward_func: Callable | None = None,
        formatters: Any = None,
        args: MAGRPOConfig | None = None,
        *,
        agents: Any = None,
        external_transition: Callable | None = None,
        eval_reward_func: Callable | None = None,
        **kwargs: Any,
    ) -> None:
        args = copy_as_centralized(args)
        self.num_roles = num_roles(args, num_agents, formatters)
        if agents is not None and len(agents) != 1:
            raise ConfigError(f"{type(self).__name__} trains one model; agents= lists {len(agents)}.")
        args.num_roles, args.num_agents = self.num_roles, None
        self.role_formatters = build_formatters(formatters, self.num_roles)
        template = args.centralized_template

        def formatter(row: dict) -> str:
            return RolePrompt([f(row) for f in self.role_formatters], template)

        reward = RoleSplitReward(reward_func, self.role_formatters) if callable(reward_func) else reward_func
        if eval_reward_func is not None:
            eval_reward_func = RoleSplitReward(eval_reward_func, self.role_formatters)
        if external_transition is not None:
            check_transition(external_transition)
            external_transition = self._transition(external_transition, template)
        super().__init__(
            model,
            1,
            tokenizer,
            train_dataset,
            reward,
            [formatter],
            args,
            agents=agents,
            external_transition=external_transition,
            eval_reward_func=eval_reward_func,
            **kwargs,
        )

    def _transition(self, fn: Callable, template: str) -> Callable:
        """The team's ``external_transition`` on the split roles; returns the next centralized prompt."""
        n, formatters = self.num_roles, self.role_formatters

        def centralized_transition(
            prompts: list[str],
            agent_completions: list[str],
            prompt_history_per_agent: list[list[str]],
            response_history_per_agent: list[list[str]],
            batch_item: dict,
            turn: int,
        ) -> list[str]:
            history = [role_prompts(p, batch_item, formatters) for p in prompt_history_per_agent[0]]
            earlier = [split_roles(r, n)[0] for r in response_history_per_agent[0][:-1]]
            node = Node(
                row=batch_item,
                row_id=-1,  # the row's index is not passed to transitions; the loop's error message names it
                prompts=role_prompts(prompts[0], batch_item, formatters),
                prompt_history=[[h[i] for h in history] for i in range(n)],
                response_history=[[r[i] for r in earlier] for i in range(n)],
            )
            child = transition(fn, node, split_roles(agent_completions[0], n)[0], turn)
            return [RolePrompt(child.prompts, template)]

        return centralized_transition

    def episode_metrics(self, episode: Episode, prefix: str = "") -> dict[str, float]:
        out = super().episode_metrics(episode, prefix)
        texts = [text for turn in episode.turns for text in turn.samples[0].texts]
        failed = sum(not split_roles(text, self.num_roles)[1] for text in texts)
        out[f"{prefix}centralized/parse_failure_rate"] = failed / max(len(texts), 1)
        return out

    def evaluate(self, *args: Any, **kwargs: Any) -> dict[str, float]:
        """:meth:`MultiAgentTrainer.evaluate`; ``last_eval_samples`` show the role outputs and prompts."""
        metrics = super().evaluate(*args, **kwargs)
        for s in self.last_eval_samples:
            joint, prompt = s["completions"][0], s["prompts"][0]
            outputs, ok = split_roles(joint, self.num_roles)
            roles = getattr(prompt, "role_prompts", [])
            s.update(prompts=[str(prompt)], role_prompts=roles, completions=outputs, joint_completion=joint, parsed=ok)
        return metrics


def copy_as_centralized(args: MAGRPOConfig | None) -> CentralizedMAGRPOConfig:
    """A copy of ``args`` as a CentralizedMAGRPOConfig (a MAGRPOConfig's values kept; None: the defaults)."""
    if args is None:
        return CentralizedMAGRPOConfig()
    if not isinstance(args, MAGRPOConfig):
        raise ConfigError(
            f"CentralizedMAGRPOTrainer needs args=CentralizedMAGRPOConfig(...) (or a MAGRPOConfig), got "
            f"{type(args).__name__}."
        )
    if isinstance(args, CentralizedMAGRPOConfig):
        return copy.deepcopy(args)
    return CentralizedMAGRPOConfig(**{f.name: getattr(args, f.name) for f in dataclasses.fields(args) if f.init})


def num_roles(args: Any, num_agents: int | None, formatters: Any) -> int:
    """The team's roles N: ``args.num_roles``, ``num_agents``, ``args.num_agents`` and the formatters given must
    agree; default 2."""
    counts = {
        "args.num_roles": getattr(args, "num_roles", None),
        "num_agents": num_agents,
        "args.num_agents": getattr(args, "num_agents", None),
        "formatters": len(formatters) if isinstance(formatters, (list, tuple)) else None,
    }
    given = {k: v for k, v in counts.items() if v is not None}
    if len(set(given.values())) > 1:
        raise ConfigError("the number of roles disagrees: " + ", ".join(f"{k}={v}" for k, v in given.items()) + ".")
    n = next(iter(given.values()), 2)
    if n < 1:
        raise ConfigError(f"num_roles={n}: a team needs at least one role.")
    return n


__all__ = ["CentralizedMAGRPOConfig", "CentralizedMAGRPOTrainer", "RolePrompt", "RoleSplitReward"]
