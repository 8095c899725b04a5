"""Advantage estimators and credit assignment: pure functions on tensors.

Shapes: ``returns`` is ``(num_groups, G)``: one row per group of G sibling joint actions
(one prompt, or one node of the multi-turn tree), G = num_generations.
"""

from __future__ import annotations

from typing import Callable, Sequence

import torch

# joint action composition: a name or alias -> the canonical name
JOINT_MODES = {"align": "align", "aligned": "align", "cross": "cross"}
# how cross mode turns the returns of the joint actions holding a sample into that sample's credit
CROSS_CREDITS = ("mean", "sum")
# which samples share a baseline and a scale (episode_advantages): the team's joint returns per node; each agent's own
# return statistics (Dr.MAS); each agent's samples per node on the turn's own rewards (AT-GRPO)
ADVANTAGE_GROUPINGS = ("team", "agent", "agent_turn")
# which joint actions of a turn get a child node: every one; the best per dataset row; the k best per dataset row
ROLLOUT_EXPANSIONS = ("tree", "best", "top_k")

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


# TRL's GRPOTrainer: advantages / (std + 1e-4), with torch's default (Bessel-corrected) std
TRL_STD_EPS = 1e-4


def compute_advantages(
    returns: torch.Tensor, mode: str = "mean", scale: str = "none", eps: float = 1e-6
) -> torch.Tensor:
    """A = (R - b(R)) [/ std], for ``returns`` of shape (num_groups, G).

    ``scale``: 'none' (paper default); 'group' and 'batch' as TRL's scale_rewards: divide by the Bessel-corrected
    std of each group's returns (of all returns) plus :data:`TRL_STD_EPS`, a single return left unscaled;
    'standardize': (A - group mean of A) / max(population std of A, ``eps``), the reference library's
    advantage_normalization, the same for every baseline that is constant within the group.
    """
    if mode not in BASELINES:
        raise ValueError(f"unknown advantage mode '{mode}'; valid: {sorted(BASELINES)}")
    if returns.dim() != 2:
        raise ValueError(f"returns must have shape (num_groups, G), got {tuple(returns.shape)}")
    adv = returns - BASELINES[mode](returns)
    if scale == "group":
        if returns.shape[-1] > 1:  # a group of one has no std
            adv = adv / (returns.std(dim=-1, keepdim=True, unbiased=True) + TRL_STD_EPS)
    elif scale == "standardize":
        if adv.shape[-1] > 1:  # a group of one is left as it is
            std = adv.std(dim=-1, keepdim=True, unbiased=False)
            adv = (adv - adv.mean(dim=-1, keepdim=True)) / std.clamp(min=eps)
    elif scale == "batch":
        if returns.numel() > 1:
            adv = adv / (returns.std(unbiased=True) + TRL_STD_EPS)
    elif scale != "none":
        raise ValueError(f"unknown scale '{scale}'; valid: none, group, batch, standardize")
    return adv


def agent_advantages(returns: list[torch.Tensor], mode: str = "mean") -> list[torch.Tensor]:
    """Agent-wise normalization (Dr.MAS) of one agent's returns over a rollout, ``returns[t]``: (M_t, G), its samples
    at turn t grouped by node: A = (R - b(R)) / (std + :data:`TRL_STD_EPS`), the baseline ``mode`` of each group,
    the std (Bessel-corrected) of all the agent's returns over every turn, so that each agent's advantages are on its
    own reward scale. A single return is left unscaled.

    In a single-turn episode this is scale='batch' of :func:`compute_advantages` on the agent's returns (in cross
    mode its credits), the std of each agent's own returns; over several turns 'batch' takes each turn's std apart.
    """
    adv = [compute_advantages(r, mode, "none") for r in returns]
    flat = torch.cat([r.reshape(-1) for r in returns]) if returns else torch.zeros(0)
    if flat.numel() < 2:
        return adv
    std = flat.std(unbiased=True)
    return [a / (std + TRL_STD_EPS) for a in adv]


def joint_mode_name(mode: str) -> str:
    """The canonical joint mode ('align' or 'cross') of ``mode`` or its alias ('aligned'); ValueError otherwise."""
    if mode not in JOINT_MODES:
        raise ValueError(f"unknown joint_mode {mode!r}; valid: {sorted(JOINT_MODES)}")
    return JOINT_MODES[mode]


def cross_credit(joint_returns: torch.Tensor, agent: int, credit: str = "mean") -> torch.Tensor:
    """Credit of each of agent ``agent``'s G samples in cross mode, from the G^(N-1) joint actions containing it:
    their mean return (``credit='mean'``) or their summed return (``'sum'``, the reference library's: G^(N-1) times
    the mean, so the two differ by a constant factor that advantage standardization removes).

    joint_returns: (num_groups, G, G, ..., G) with one G axis per agent (G^N joint actions per group).
    Returns (num_groups, G).
    """
    if credit not in CROSS_CREDITS:
        raise ValueError(f"unknown cross credit {credit!r}; valid: {', '.join(CROSS_CREDITS)}")
    n_agents = joint_returns.dim() - 1
    if not 0 <= agent < n_agents:
        raise ValueError(f"agent {agent} out of range for {n_agents} agents")
    other = [d + 1 for d in range(n_agents) if d != agent]
    if not other:
        return joint_returns
    return joint_returns.sum(dim=other) if credit == "sum" else joint_returns.mean(dim=other)


def clip_rewards(rewards: list[torch.Tensor], clip: float | None) -> list[torch.Tensor]:
    """Each turn's rewards clipped to [-clip, clip]; unchanged when ``clip`` is None."""
    return rewards if clip is None else [r.clamp(-clip, clip) for r in rewards]


def stage_discounts(discount: float | Sequence[float], stages: int) -> list[float]:
    """One discount per stage: ``discount`` for every stage, or the list given (one per stage), the discount of the
    returns that flow back from a stage's child nodes."""
    if isinstance(discount, (int, float)):
        return [float(discount)] * stages
    out = [float(d) for d in discount]
    if len(out) != stages:
        raise ValueError(f"{len(out)} discounts for {stages} stages: give one per stage (or one number)")
    return out


def tree_returns(
    rewards: list[torch.Tensor], children: list[torch.Tensor], discount: float | Sequence[float]
) -> list[torch.Tensor]:
    """Returns over a multi-turn rollout tree: R = r + discount * mean(R of the child node's joint actions).

    rewards[t]: (M_t, G) rewards of the G joint actions at each of the M_t nodes of stage t (a turn, or one stage of
    a turn played in stages: :mod:`comlrl.rollout.topology`).
    children[t]: (M_t, G) long, index of the child node at stage t+1, or -1 where the branch ended.
    discount: one number, or one per stage (its children's returns' discount: 1 from a stage to the next stage of
    its turn, the turn discount from a turn's last stage to the next turn).
    """
    if len(rewards) != len(children):
        raise ValueError("rewards and children need one entry per turn")
    discounts = stage_discounts(discount, len(rewards))
    returns: list[torch.Tensor] = [r.clone() for r in rewards]
    for t in range(len(rewards) - 2, -1, -1):
        child = children[t]
        has_child = child >= 0
        if has_child.any():
            child_value = returns[t + 1].mean(dim=-1)  # (M_{t+1},)
            returns[t][has_child] += discounts[t] * child_value[child[has_child]]
    return returns


def turn_sums(rewards: list[torch.Tensor], children: list[torch.Tensor]) -> torch.Tensor:
    """(T, 3) per stage of a rollout tree (a turn under the parallel topology, the one the reference's API runs): the
    weighted reward sum of its joint actions, their total weight, and their weighted sum of undiscounted returns
    (:func:`tree_returns`, discount 1).

    A root node weighs 1 (one dataset row), split evenly over its joint actions; a joint action passes its weight on
    to its child node. So the weights of turn t add up to the rows' share that reaches turn t, reward sum / weight is
    turn t's mean reward, and return sum / rows is the expected reward sum from turn t on per row (0 where an episode
    ended before turn t). rewards[t], children[t]: (M_t, J) as in :func:`tree_returns`.
    """
    returns = tree_returns(rewards, children, 1.0)
    out = torch.zeros(len(rewards), 3)
    node_weight = torch.ones(rewards[0].shape[0]) if rewards else torch.zeros(0)
    for t, (r, child) in enumerate(zip(rewards, children)):
        w = (node_weight / max(r.shape[1], 1))[:, None].expand_as(r)
        out[t] = torch.stack([(w * r.float()).sum(), w.sum(), (w * returns[t].float()).sum()])
        if t + 1 < len(rewards):
            has_child = child >= 0
            node_weight = torch.zeros(rewards[t + 1].shape[0]).index_add_(0, child[has_child], w[has_child])
    return out


def tree_gae(
    rewards: list[torch.Tensor],
    values: list[torch.Tensor],
    children: list[torch.Tensor],
    *,
    discount: float | Sequence[float],
    lam: float,
) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """GAE(lambda) over the multi-turn tree (Schulman et al. 2016), with V from *before* the critic update.

    rewards[t], children[t]: (M_t, G) as in :func:`tree_returns`; values[t]: (M_t,) V(h) of each node;
    ``discount``: one number or one per stage, as in :func:`tree_returns`.
    delta = r + discount * V(child) - V(node)   (V(child) = 0 where the branch ended)
    A     = delta + discount * lam * mean_g' A(child, g')
    Returns (advantages[t], value targets[t] = A + V(node)), each (M_t, G).
    lam = 0 gives TD(0) advantages; lam = 1 gives Monte-Carlo tree returns minus V.
    """
    n = len(rewards)
    if not (len(values) == len(children) == n):
        raise ValueError("rewards, values and children need one entry per turn")
    discounts = stage_discounts(discount, n)
    values = [v.to(r.dtype) for v, r in zip(values, rewards)]  # a bf16 critic's values: GAE in the rewards' fp32
    advantages: list[torch.Tensor] = [torch.zeros_like(r) for r in rewards]
    for t in range(n - 1, -1, -1):
        child = children[t]
        has_child = child >= 0
        v_next = torch.zeros_like(rewards[t])
        a_next = torch.zeros_like(rewards[t])
        if t + 1 < n and has_child.any():
            v_next[has_child] = values[t + 1][child[has_child]]
            a_next[has_child] = advantages[t + 1].mean(dim=-1)[child[has_child]]
        delta = rewards[t] + discounts[t] * v_next - values[t].unsqueeze(-1)
        advantages[t] = delta + discounts[t] * lam * a_next
    targets = [a + v.unsqueeze(-1) for a, v in zip(advantages, values)]
    return advantages, targets


def normalize(advantages: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """(A - mean) / std over all entries (advantage normalization of the actor-critic trainers); a single advantage is
    returned as is (centering it would zero the only learning signal)."""
    if advantages.numel() < 2:
        return advantages
    return (advantages - advantages.mean()) / (advantages.std(unbiased=False) + eps)
