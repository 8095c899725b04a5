"""The reference library's trainer keywords, onto our trainer: ``model_config``, ``wandb_config``,
``eval_logger`` / ``eval_aggregator``, ``metrics_callback`` (IAC/MAAC), ``dataset_type``, and the actor-critic
trainers' ``critic_model`` / ``critics``.

Each is either translated into our config (``model_config``'s dtype into ``bf16``, ``wandb_config`` into
``report_to``) or kept as a hook our loop calls (:class:`CompatHooks`, which also holds what a compat-style config
changes in the loop). The first use of each logs one line.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any, Callable

import torch

from ..algorithms.advantages import turn_sums
from ..engine.rewards import accepted_kwargs
from ..errors import ConfigError, suggest
from . import REFERENCE
from .configs import is_compat_style

log = logging.getLogger("comlrl.compat")

KEYWORDS = (
    "model_config",
    "wandb_config",
    "eval_logger",
    "eval_aggregator",
    "metrics_callback",
    "dataset_type",
)
BF16_NAMES = {"bfloat16", "bf16", torch.bfloat16}
FP32_NAMES = {"float32", "fp32", torch.float32}
_logged: set[str] = set()


@dataclass(kw_only=True)
class CompatHooks:
    """What the reference keywords and a compat-style config leave for our loop to call or apply.

    ``compat_style``: the config came from one of the reference's import paths
    (:func:`comlrl.compat.configs.is_compat_style`); then :meth:`reward` calls the reward as the reference does and
    :meth:`turn_metrics` adds its per-turn evaluation keys. Else both leave ours as they are."""

    eval_logger: Callable | None = None
    eval_aggregator: Callable | None = None
    metrics_callback: Callable | None = None
    special_tokens: dict = field(default_factory=dict)
    wandb_init: dict | None = None
    compat_style: bool = False

    def reward(self, fn: Callable | None) -> Callable | None:
        """``fn`` as the trainer calls it: with the reference's ``prompts=`` in a compat-style run
        (:func:`compat_reward`), else unchanged."""
        return compat_reward(fn) if self.compat_style and fn is not None else fn

    def turn_metrics(self, episodes: list[Any], num_turns: int) -> dict[str, float]:
        """The reference's per-turn evaluation keys in a compat-style run (:func:`compat_turn_metrics`), else {}."""
        return compat_turn_metrics(episodes, num_turns) if self.compat_style else {}


def compat_hooks(trainer: str, args: Any, keywords: dict[str, Any], valid: list[str]) -> CompatHooks:
    """Apply the reference keywords ``keywords`` to ``args`` (our config, already a copy) and return the hooks.

    ``valid``: the trainer's own keyword names, for the suggestion when a keyword is neither ours nor the
    reference's.
    """
    for key in keywords:
        if key not in KEYWORDS:
            raise TypeError(
                f"{trainer}() got an unexpected keyword argument '{key}'.{suggest(key, [*valid, *KEYWORDS])}"
            )
    hooks = CompatHooks(compat_style=is_compat_style(args))
    model_config = keywords.get("model_config") or {}
    if not isinstance(model_config, dict):
        raise ConfigError(f"{trainer}: model_config must be a dict, got {type(model_config).__name__}.")
    dtype = model_config.get("torch_dtype", model_config.get("dtype"))
    if dtype in BF16_NAMES:
        args.bf16 = True
        _note("model_config.torch_dtype", f"{dtype} -> bf16=True (bf16 compute; trained weights stay fp32)")
    elif dtype in FP32_NAMES:
        args.bf16 = False
        _note("model_config.torch_dtype", f"{dtype} -> bf16=False")
    elif dtype not in (None, "auto"):
        raise ConfigError(f"{trainer}: model_config torch_dtype={dtype!r}: comlrl trains in float32 or bfloat16.")
    if model_config.get("attn_implementation") is not None:
        _note("model_config.attn_implementation", "is not used: comlrl picks the attention kernel of its decode loop")
    hooks.special_tokens = dict(model_config.get("special_tokens") or {})
    unknown = set(model_config) - {"torch_dtype", "dtype", "attn_implementation", "special_tokens", "model_kwargs"}
    if unknown:
        raise ConfigError(f"{trainer}: model_config keys {sorted(unknown)} are not known to {REFERENCE} or comlrl.")
    wandb_config = keywords.get("wandb_config")
    if wandb_config is not None:
        hooks.wandb_init = wandb_init_kwargs(wandb_config)
        if "wandb" not in args.report_to:
            args.report_to = [*args.report_to, "wandb"]
        _note("wandb_config", "-> report_to='wandb' with its project, entity, name, dir and tags")
    for name in ("eval_logger", "eval_aggregator", "metrics_callback"):
        fn = keywords.get(name)
        if fn is not None and not callable(fn):
            raise ConfigError(f"{trainer}: {name} must be callable, got {type(fn).__name__}.")
        setattr(hooks, name, fn)
    if (hooks.eval_logger is None) != (hooks.eval_aggregator is None):
        raise ConfigError(f"{trainer}: eval_logger and eval_aggregator work as a pair; pass both or neither.")
    if keywords.get("dataset_type") is not None:
        _note("dataset_type", "is only a label in the reference (its W&B run config); not used here")
    return hooks


def compat_reward(fn: Callable) -> Callable:
    """``fn`` called with the reference's ``prompts``: a list holding agent 0's prompt of the joint action (ours
    passes every agent's prompt list). Batched or ``score`` rewards are ours and are left as they are."""
    if getattr(fn, "batched", False) or hasattr(fn, "score"):
        return fn

    def reward(*completions: list[str], **extras: Any) -> Any:
        if "prompts" in extras:
            extras["prompts"] = list(extras["prompts"][0]) if extras["prompts"] else []
        return fn(*completions, **accepted_kwargs(fn, extras))

    reward.compat_fn = fn  # the user's function, for the trainers that group its calls (compat_group_reward)
    return reward


def compat_group_reward(fn: Callable, group: int) -> Callable:
    """``fn`` called as the reference's IAC / MAAC call a reward: once per node with each agent's ``group`` answers
    (the joint actions j*group ... j*group + group - 1 of a step), ``prompts`` = each agent's prompt and
    ``batch_items`` = [the row]; it returns one reward per joint action or one for the whole group."""

    def reward(*completions: list[str], **extras: Any) -> list:
        out = []
        for lo in range(0, len(completions[0]), group):
            sl = slice(lo, lo + group)
            given = {
                "prompts": [p[lo] for p in extras.get("prompts", [])],
                "batch_items": list(extras.get("batch_items", [])[sl][:1]),
                "turn": extras.get("turn"),
            }
            values = fn(*[c[sl] for c in completions], **accepted_kwargs(fn, given))
            values = list(values) if isinstance(values, (list, tuple)) or getattr(values, "ndim", 0) else [values]
            out += values * group if len(values) == 1 else values
        return out

    reward.batched = True
    return reward


def compat_critic(critic: Any, keywords: dict[str, Any]) -> Any:
    """Our ``critic=`` from the reference's ``critic_model=`` (one source) or ``critics=`` (one per agent), both
    taken out of ``keywords``."""
    popped = {k: keywords.pop(k) for k in ("critic_model", "critics") if k in keywords}
    given = {k: v for k, v in popped.items() if v is not None}
    if len(given) + (critic is not None) > 1:
        raise ConfigError(f"{' and '.join(sorted(given))} and critic= name the same critics; pass one of them.")
    for name in given:
        _note(name, "-> critic=")
    return next(iter(given.values()), critic)


def wandb_init_kwargs(wandb_config: Any) -> dict:
    """``wandb.init`` keywords from the reference's ``wandb_config`` (its config_sections go into the run config)."""
    if not isinstance(wandb_config, dict):
        raise ConfigError(f"wandb_config must be a dict, got {type(wandb_config).__name__}.")
    init: dict[str, Any] = {
        "project": wandb_config.get("project"),
        "entity": wandb_config.get("entity"),
        "name": wandb_config.get("name") or wandb_config.get("run_name"),
        "dir": wandb_config.get("dir"),
        "tags": wandb_config.get("tags"),
        "id": wandb_config.get("id"),
        "resume": wandb_config.get("resume"),
    }
    sections = wandb_config.get("config_sections")
    if isinstance(sections, dict):
        init["config"] = dict(sections)
    return {k: v for k, v in init.items() if v is not None}


def eval_extras(hooks: CompatHooks, completions: list, rows: list[dict], prompts: list[str], *, num_turns: int) -> dict:
    """``eval/<key>`` metrics from the reference's eval_logger + eval_aggregator.

    ``completions[agent][row][turn]``: each agent's answer along each evaluated row's path; ``rows``: the dataset
    rows; ``prompts``: their 'prompt' column.
    """
    if hooks.eval_logger is None:
        return {}
    candidates = {
        "agent_completions_turns": completions,
        "batch_items": rows,
        "prompts": prompts,
        "test_cases": [r.get("test", "") for r in rows],
        "entry_points": [r.get("entry_point", "") for r in rows],
    }
    detailed = hooks.eval_logger(**accepted_kwargs(hooks.eval_logger, candidates))
    aggregated = hooks.eval_aggregator(detailed, num_turns=num_turns)
    if not isinstance(aggregated, dict):
        raise ConfigError(f"eval_aggregator must return a dict of metrics, got {type(aggregated).__name__}.")
    return {f"eval/{k}": float(v) for k, v in aggregated.items() if _is_number(v)}


def _is_number(value: Any) -> bool:
    try:
        float(value)
    except (TypeError, ValueError):
        return False
    return True


def _note(name: str, text: str) -> None:
    if name not in _logged:
        _logged.add(name)
        log.info("%s (%s) %s", name, REFERENCE, text)


@dataclass(kw_only=True)
class RolloutSample:
    """One agent's sample as the reference's ``metrics_callback`` receives it (its IAC/MAAC ``RolloutSample``):
    the fields its callbacks read; the token tensors of the reference's record are not kept here (None)."""

    agent_idx: int
    prompt: str
    completion: str
    reward: torch.Tensor
    returns: torch.Tensor
    metadata: dict = field(default_factory=dict)
    full_input_ids: Any = None
    attention_mask: Any = None
    prompt_len: int = 0
    response_len: int = 0
    old_logprob: Any = None
    old_value: Any = None
    advantage: Any = None
    normalized_advantage: Any = None


def rollout_samples(episode: Any, num_agents: int) -> list[RolloutSample]:
    """Every agent's samples of ``episode`` (a :class:`comlrl.rollout.episode.Episode`), each with the mean
    immediate reward and the mean undiscounted return of the joint actions it is part of."""
    from ..algorithms.advantages import tree_returns
    from ..rollout.episode import joint_indices

    turns = episode.turns
    returns = tree_returns([t.rewards for t in turns], [t.children for t in turns], 1.0)
    out = []
    for t, turn in enumerate(turns):
        g = len(turn.samples[0].texts) // max(len(turn.nodes), 1)
        combos = joint_indices(num_agents, g, "align" if turn.rewards.shape[1] == g else "cross")
        for m, node in enumerate(turn.nodes):
            for i in range(num_agents):
                for k in range(g):
                    with_k = [j for j, c in enumerate(combos) if c[i] == k]
                    out.append(
                        RolloutSample(
                            agent_idx=i,
                            prompt=node.prompts[i],
                            completion=turn.samples[i].texts[m * g + k],
                            reward=turn.rewards[m, with_k].mean(),
                            returns=returns[t][m, with_k].mean(),
                            metadata={"turn_idx": t, "generation_idx": k, "batch_item": node.row},
                        )
                    )
    return out


def callback_metrics(hooks: CompatHooks, episode: Any, num_agents: int, prefix: str = "") -> dict[str, float]:
    """The reference's ``metrics_callback(rollouts) -> dict`` on this episode's samples (numbers only)."""
    if hooks.metrics_callback is None:
        return {}
    extra = hooks.metrics_callback(rollout_samples(episode, num_agents))
    if not isinstance(extra, dict):
        return {}
    return {f"{prefix}{k}": float(v) for k, v in extra.items() if _is_number(v)}


def compat_turn_metrics(episodes: list[Any], num_turns: int) -> dict[str, float]:
    """The reference's per-turn evaluation keys, for turns t = 1..num_turns: ``eval/turn_{t}/reward_mean`` (the mean
    reward of the joint actions played at turn t) and ``eval/turn_{t}/expected_return`` (the undiscounted reward sum
    from turn t on, averaged over the evaluated rows; 0 for a row whose episode ended before turn t). With one joint
    action per node, as the reference evaluates, these are its numbers; more are weighed evenly
    (:func:`comlrl.algorithms.advantages.turn_sums`). A turn no row reached reports 0."""
    totals = torch.zeros(num_turns, 3)
    rows = 0
    for ep in episodes:
        sums = turn_sums([t.rewards for t in ep.turns], [t.children for t in ep.turns])[:num_turns]
        totals[: len(sums)] += sums
        rows += ep.turns[0].rewards.shape[0] if ep.turns else 0
    out: dict[str, float] = {}
    for t, (reward_sum, weight, return_sum) in enumerate(totals.tolist(), start=1):
        out[f"eval/turn_{t}/reward_mean"] = reward_sum / weight if weight else 0.0
        out[f"eval/turn_{t}/expected_return"] = return_sum / rows if rows else 0.0
    return out


def eval_paths(episodes: list[Any], num_agents: int) -> tuple[list, list[dict], list[str]]:
    """``(completions[agent][row][turn], rows, prompts)`` of evaluation episodes, along each row's first joint
    action at every turn (the one path the reference's evaluation plays)."""
    completions: list[list[list[str]]] = [[] for _ in range(num_agents)]
    rows, prompts = [], []
    for ep in episodes:
        first = ep.turns[0]
        for m, node in enumerate(first.nodes):
            rows.append(node.row)
            prompts.append(str(node.row.get("prompt", "")) if hasattr(node.row, "get") else "")
            path: list[list[str]] = [[] for _ in range(num_agents)]
            index = m
            for turn in ep.turns:
                if index < 0:
                    break
                g = len(turn.samples[0].texts) // max(len(turn.nodes), 1)
                for i in range(num_agents):
                    path[i].append(turn.samples[i].texts[index * g])
                index = int(turn.children[index, 0])
            for i in range(num_agents):
                completions[i].append(path[i])
    return completions, rows, prompts
