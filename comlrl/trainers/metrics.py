"""Metrics of rollouts and updates: reward statistics, completion lengths and timings of one rollout, and how a
step merges them over its rollouts, an update over its passes and an evaluation over its batches."""

from __future__ import annotations

import torch

from ..rollout.episode import Episode, joint_answers


def episode_metrics(episode: Episode, num_agents: int, prefix: str = "") -> dict[str, float]:
    """Reward statistics per turn and level, each agent's completion lengths and clipped ratio, and the timings of one
    rollout (``prefix``: e.g. ``"eval/"``; timings only without one). Rewards are the scored stages' (one per turn);
    an agent's lengths cover every stage it acted in."""
    scored = episode.scored
    first = scored[0].rewards
    out = {
        f"{prefix}reward/mean": float(first.mean()),
        f"{prefix}reward/std": float(first.std(unbiased=False)),
        f"{prefix}reward/max": float(first.max()),
        f"{prefix}reward/frac_zero_std": float((first.std(dim=1, unbiased=False) < 1e-8).float().mean())
        if first.shape[1] > 1
        else 1.0,
    }
    if len(scored) > 1:
        for t, turn in enumerate(scored):
            out[f"{prefix}reward/turn_{t + 1}/mean"] = float(turn.rewards.mean())
    levels = scored[0].levels
    for key in sorted({k for d in levels for k in d}):
        vals = [d[key] for d in levels if key in d]
        out[f"{prefix}reward/{key}"] = sum(vals) / len(vals)
    tokens = 0
    for i in range(num_agents):
        acted = [t for t in episode.turns if t.acts(i)]
        if not acted:
            continue
        masks = [t.samples[i].completion_mask for t in acted]
        lengths = torch.cat([m.sum(dim=1) for m in masks]).float()
        tokens += int(lengths.sum())
        out[f"{prefix}agent/{i}/completion/mean_length"] = float(lengths.mean())
        trunc = torch.cat([t.samples[i].truncated for t in acted]).float()
        out[f"{prefix}agent/{i}/completion/clipped_ratio"] = float(trunc.mean())
    if not prefix:
        for k, v in episode.timings.items():
            out[f"time/{k}"] = v
        out["perf/rollout_tokens_per_s"] = tokens / max(episode.timings.get("generate", 0.0), 1e-9)
    return out


def merge_evaluation(episodes: list[Episode], per: list[dict[str, float]]) -> dict[str, float]:
    """An evaluation's metrics from its rollouts' (``per``, one dict of ``eval/`` metrics each): each metric weighted
    by the rollout's joint actions, the reward std over all of them, and the final turn's mean reward."""
    weights = [ep.scored[0].rewards.numel() for ep in episodes]
    keys = {k for m in per for k in m if not k.endswith("/std") and not k.endswith("/max")}
    out = {
        k: sum(m[k] * w for m, w in zip(per, weights) if k in m) / sum(w for m, w in zip(per, weights) if k in m)
        for k in keys
    }
    all_r = torch.cat([ep.scored[0].rewards.reshape(-1) for ep in episodes])
    out["eval/reward/std"] = float(all_r.std(unbiased=False))
    last = torch.cat([ep.scored[-1].rewards.reshape(-1) for ep in episodes])
    out["eval/reward/final_turn_mean"] = float(last.mean())
    return dict(sorted(out.items()))


def mean_metrics(per_rollout: list[dict[str, float]]) -> dict[str, float]:
    """One step's metrics from its rollouts' metrics: the mean of each key over the rollouts that have it; timings
    (``time/*``) summed."""
    out: dict[str, float] = {}
    for key in dict.fromkeys(k for m in per_rollout for k in m):
        values = [m[key] for m in per_rollout if key in m]
        out[key] = sum(values) if key.startswith("time/") else sum(values) / len(values)
    return out


def iteration_metrics(per_iteration: list[dict[str, float]]) -> dict[str, float]:
    """An update's policy metrics from its ``num_iterations`` passes: the mean over the passes of each metric (the
    first pass has ratio 1 exactly, so its clip fraction and KL to the old policy are 0), and ``approx_kl_old_last``:
    the last pass's KL to the policy that sampled."""
    out = {k: sum(float(m[k]) for m in per_iteration) / len(per_iteration) for k in per_iteration[0]}
    if len(per_iteration) > 1 and "approx_kl_old" in per_iteration[-1]:
        out["approx_kl_old_last"] = float(per_iteration[-1]["approx_kl_old"])
    return out


def eval_samples(episode: Episode, num_agents: int, g: int) -> list[dict]:
    """One evaluation sample per node of the first turn's scored stage: the row, each agent's prompt, the reward and
    every agent's answer of its first joint action (under a topology, the answers of earlier stages it carries)."""
    first = episode.scored[0]
    acting = first.agents(num_agents)
    return [
        {
            "row": node.row_id,
            "prompts": node.prompts,
            "reward": float(first.rewards[m, 0]),
            "completions": joint_answers(node, first.samples, acting, m * g, (0,) * len(acting)),
        }
        for m, node in enumerate(first.nodes)
    ]
