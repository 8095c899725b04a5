"""Advantage estimators and credit assignment: pure functions on tensors.

Shapes: ``returns`` is ``(num_groups, G)``: one row per group of G sibling joint actions
(one prompt, or one node of the multi-turn tree), G = num_generations.
"""

from __future__ import annotations

from typing import Callable

import torch

# joint action composition: a name or alias -> the canonical name
JOINT_MODES = {"align": "align", "aligned": "align", "cross": "cross"}

Baseline = Callable[[torch.Tensor], torch.Tensor]
BASELINES: dict[str, Baseline] = {}


def register_baseline(name: str) -> Callable[[Baseline], Baseline]:
    """Register a baseline ``(num_groups, G) returns -> (num_groups, G) baseline`` under ``name``."""

    def wrap(fn: Baseline) -> Baseline:
        if name in BASELINES:
            raise ValueError(f"baseline '{name}' is already registered")
        BASELINES[name] = fn
        return fn

    return wrap


@register_baseline("none")
def baseline_none(returns: torch.Tensor) -> torch.Tensor:
    """MAREINFORCE: b = 0, so A = R."""
    return torch.zeros_like(returns)


@register_baseline("mean")
def baseline_mean(returns: torch.Tensor) -> torch.Tensor:
    """MAGRPO: b = mean of the group (Liu et al. 2025, eq. for the group-relative advantage)."""
    return returns.mean(dim=-1, keepdim=True).expand_as(returns)


@register_baseline("loo")
def baseline_loo(returns: torch.Tensor) -> torch.Tensor:
    """MARLOO: b_g = mean of the other G-1 returns (Kool et al. 2019, RLOO)."""
    g = returns.shape[-1]
    if g < 2:
        raise ValueError("leave-one-out baseline needs a group of at least 2 returns")
    return (returns.sum(dim=-1, keepdim=True) - returns) / (g - 1)


@register_baseline("max")
def baseline_max(returns: torch.Tensor) -> torch.Tensor:
    """MAREMAX: b = max of the group, so every advantage is <= 0 (ReMax-style greedy baseline)."""
    return returns.max(dim=-1, keepdim=True).values.expand_as(returns)


def compute_advantages(
    returns: torch.Tensor, mode: str = "mean", scale: str = "none", eps: float = 1e-6
) -> torch.Tensor:
    """A = (R - b(R)) [/ std], for ``returns`` of shape (num_groups, G).

    ``scale``: 'none' (paper default), 'group' (divide by each group's std), 'batch' (by the std of all returns),
    'standardize' ((A - group mean of A) / group std of A, the reference library's advantage_normalization; the
    same for every baseline that is constant within the group).
    """
    if mode not in BASELINES:
        raise ValueError(f"unknown advantage mode '{mode}'; valid: {sorted(BASELINES)}")
    if returns.dim() != 2:
        raise ValueError(f"returns must have shape (num_groups, G), got {tuple(returns.shape)}")
    adv = returns - BASELINES[mode](returns)
    if scale == "group":
        std = (
            returns.std(dim=-1, keepdim=True, unbiased=False)
            if returns.shape[-1] > 1
            else torch.ones_like(returns[:, :1])
        )
        adv = adv / (std + eps)
    elif scale == "standardize":
        if adv.shape[-1] > 1:  # a group of one is left as it is
            std = adv.std(dim=-1, keepdim=True, unbiased=False)
            adv = (adv - adv.mean(dim=-1, keepdim=True)) / std.clamp(min=eps)
    elif scale == "batch":
        std = returns.std(unbiased=False) if returns.numel() > 1 else torch.ones(())
        adv = adv / (std + eps)
    elif scale != "none":
        raise ValueError(f"unknown scale '{scale}'; valid: none, group, batch, standardize")
    return adv


def joint_mode_name(mode: str) -> str:
    """The canonical joint mode ('align' or 'cross') of ``mode`` or its alias ('aligned'); ValueError otherwise."""
    if mode not in JOINT_MODES:
        raise ValueError(f"unknown joint_mode {mode!r}; valid: {sorted(JOINT_MODES)}")
    return JOINT_MODES[mode]


def cross_credit(joint_returns: torch.Tensor, agent: int) -> torch.Tensor:
    """Credit of each of agent ``agent``'s G samples in cross mode: mean return of the joint actions containing it.

    joint_returns: (num_groups, G, G, ..., G) with one G axis per agent (G^N joint actions per group).
    Returns (num_groups, G).
    """
    n_agents = joint_returns.dim() - 1
    if not 0 <= agent < n_agents:
        raise ValueError(f"agent {agent} out of range for {n_agents} agents")
    other = [d + 1 for d in range(n_agents) if d != agent]
    return joint_returns.mean(dim=other) if other else joint_returns


def clip_rewards(rewards: list[torch.Tensor], clip: float | None) -> list[torch.Tensor]:
    """Each turn's rewards clipped to [-clip, clip]; unchanged when ``clip`` is None."""
    return rewards if clip is None else [r.clamp(-clip, clip) for r in rewards]


def tree_returns(rewards: list[torch.Tensor], children: list[torch.Tensor], discount: float) -> list[torch.Tensor]:
    """Returns over a multi-turn rollout tree: R = r + discount * mean(R of the child node's joint actions).

    rewards[t]: (M_t, G) rewards of the G joint actions at each of the M_t nodes of turn t.
    children[t]: (M_t, G) long, index of the child node at turn t+1, or -1 where the branch ended.
    """
    if len(rewards) != len(children):
        raise ValueError("rewards and children need one entry per turn")
    returns: list[torch.Tensor] = [r.clone() for r in rewards]
    for t in range(len(rewards) - 2, -1, -1):
        child = children[t]
        has_child = child >= 0
        if has_child.any():
            child_value = returns[t + 1].mean(dim=-1)  # (M_{t+1},)
            returns[t][has_child] += discount * child_value[child[has_child]]
    return returns


def tree_gae(
    rewards: list[torch.Tensor], values: list[torch.Tensor], children: list[torch.Tensor], discount: float, lam: float
) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """GAE(lambda) over the multi-turn tree (Schulman et al. 2016), with V from *before* the critic update.

    rewards[t], children[t]: (M_t, G) as in :func:`tree_returns`; values[t]: (M_t,) V(h) of each node.
    delta = r + discount * V(child) - V(node)   (V(child) = 0 where the branch ended)
    A     = delta + discount * lam * mean_g' A(child, g')
    Returns (advantages[t], value targets[t] = A + V(node)), each (M_t, G).
    lam = 0 gives TD(0) advantages; lam = 1 gives Monte-Carlo tree returns minus V.
    """
    n = len(rewards)
    if not (len(values) == len(children) == n):
        raise ValueError("rewards, values and children need one entry per turn")
    advantages: list[torch.Tensor] = [torch.zeros_like(r) for r in rewards]
    for t in range(n - 1, -1, -1):
        child = children[t]
        has_child = child >= 0
        v_next = torch.zeros_like(rewards[t])
        a_next = torch.zeros_like(rewards[t])
        if t + 1 < n and has_child.any():
            v_next[has_child] = values[t + 1][child[has_child]]
            a_next[has_child] = advantages[t + 1].mean(dim=-1)[child[has_child]]
        delta = rewards[t] + discount * v_next - values[t].unsqueeze(-1)
        advantages[t] = delta + discount * lam * a_next
    targets = [a + v.unsqueeze(-1) for a, v in zip(advantages, values)]
    return advantages, targets


def normalize(advantages: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """(A - mean) / std over all entries (advantage normalization of the actor-critic trainers); a single advantage is
    returned as is (centering it would zero the only learning signal)."""
    if advantages.numel() < 2:
        return advantages
    return (advantages - advantages.mean()) / (advantages.std(unbiased=False) + eps)
