"""Who did what: each agent's contribution to the team reward, by replacing its answer.

For evaluation row r and agent i, the team reward of the team's joint answers is compared with the team reward when
agent i's answer alone is replaced by

* ``untrained``: the untrained model's answer to the same prompt, sampled with the evaluation's decoding settings and
  seeds (so an untrained team's contribution is exactly 0);
* ``empty``: the empty string.

The drop, reward - replaced reward (each the mean over the row's joint answers), is agent i's contribution on row r
(``last_eval_samples[r]["contribution"]["agent_<i>/<kind>"]``); :func:`contribution_metrics` gives its mean over rows
and a 95% percentile bootstrap interval (:mod:`comlrl.algorithms.bootstrap`).

The untrained model of an agent: for a LoRA agent, its base with the adapters off (the rows decode through PEFT's
``"__base__"`` adapter name, no extra memory); for a full fine-tune, its frozen reference when ``beta`` > 0 keeps one,
else its initial weights loaded again from the model source the trainer was built from (one more copy of each agent's
model, kept for later evaluations). Only the first turn is measured: a later turn's prompts depend on the answers
replaced, so multi-turn evaluation refuses it.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Callable

import torch
from transformers import PreTrainedModel

from ..algorithms.bootstrap import bootstrap_mean
from ..configs.fields import own_field
from ..engine.models import copy_model, load_model
from ..engine.team import BASE_ADAPTER
from ..errors import ConfigError
from ..rollout.agent import Agent
from ..rollout.episode import Episode, generate_team, score_turn
from ..rollout.generation import VLLM
from ..rollout.protocol import GenerationSettings
from ..rollout.rollout import Samples
from ..rollout.sampling import derive_seed

KINDS = ("untrained", "empty")  # what an agent's answer is replaced by
PREFIX = "eval/contribution/"


def check_contributions(trainer: Any) -> None:
    """Fail unless ``trainer`` can measure contributions, saying why and what to change."""
    what = "eval_contributions / evaluate(contributions=True)"
    why = None
    if trainer.args.num_turns > 1:
        why = (
            f"num_turns={trainer.args.num_turns}: contributions are measured on the first turn only, and a later "
            "turn's prompts depend on the answers replaced; evaluate with num_turns=1"
        )
    elif trainer.rollout_engine == VLLM:
        why = "vLLM rollouts hold no untrained copy of the agents' models; set use_vllm=False for this evaluation"
    if why:
        raise ConfigError(f"{what}: {why}.")
    trainer.dist.require_one_process(
        f"{what}: under torchrun each process holds only some agents; evaluate in one process."
    )


def add_contributions(
    trainer: Any, episode: Episode, *, settings: GenerationSettings, g: int, seed: int, samples: list[dict]
) -> None:
    """Each agent's contribution on an evaluation episode's rows (``samples``: their evaluation samples, in node
    order): a sample gets ``contribution`` and the untrained team's first answers, ``untrained_completions``."""
    drops, untrained = episode_contributions(
        episode,
        untrained_agents(trainer),
        reward_func=trainer.eval_reward_func,
        num_generations=g,
        settings=settings,
        joint_mode=own_field(trainer.args, "joint_mode", "align"),
        reward_processor=trainer.reward_processor,
        autocast_dtype=trainer.rollout_dtype,
        seed=seed,
    )
    for m, (sample, drop) in enumerate(zip(samples, drops)):
        sample["contribution"] = drop
        sample["untrained_completions"] = [s.texts[m * g] for s in untrained]


def untrained_agents(trainer: Any) -> list[Agent]:
    """The team with every agent's untrained model in place of its own (built once per trainer, then reused)."""
    team = getattr(trainer, "_untrained_team", None)
    if team is None:
        team = trainer._untrained_team = build_untrained(
            trainer.agents, trainer._team_sources, [trainer.agent_devices[a.index] for a in trainer.agents]
        )
    return team


def build_untrained(agents: list[Agent], sources: list, devices: list[torch.device]) -> list[Agent]:
    """Each agent with its untrained model: its LoRA base (adapters off), its reference, or its initial weights
    loaded from ``sources[agent.index]`` (a source named by several agents is loaded once, then copied)."""
    loaded: dict[str, PreTrainedModel] = {}
    out = []
    for a, device in zip(agents, devices):
        if a.adapter is not None:
            out.append(dataclasses.replace(a, adapter=BASE_ADAPTER))
            continue
        if a.ref_model is not None:
            out.append(dataclasses.replace(a, model=a.ref_model))
            continue
        source = sources[a.index]
        if isinstance(source, PreTrainedModel):
            raise ConfigError(
                f"eval contributions: agent {a.index}'s model was given as a loaded model, which training changes in "
                "place, so its initial weights are gone. Set beta > 0 (the trainer then keeps a frozen copy of the "
                "initial model as the reference), use LoRA (peft_config=; the base is the untrained model), or pass "
                "the model as a hub id or path."
            )
        key = str(source)
        model = copy_model(loaded[key]) if key in loaded else load_model(source)
        loaded.setdefault(key, model)
        out.append(dataclasses.replace(a, model=model.to(device).train(False).requires_grad_(False)))
    return out


def episode_contributions(
    episode: Episode,
    untrained: list[Agent],
    *,
    reward_func: Callable,
    num_generations: int,
    settings: GenerationSettings,
    joint_mode: str,
    reward_processor: Callable | None,
    autocast_dtype: torch.dtype | None,
    seed: int,
) -> tuple[list[dict[str, float]], list[Samples]]:
    """Each first-turn node's contributions (``"agent_<i>/<kind>"`` -> drop) and the untrained team's samples.

    ``seed``: the episode's sampling key (what :func:`comlrl.rollout.episode.run_episode` was given), so each
    untrained answer samples from the stream of the answer it replaces.
    """
    first = episode.turns[0]
    g = num_generations
    replacements = generate_team(  # per agent, rows = node * G + g, as first.samples
        untrained, first.nodes, g, settings=settings, autocast_dtype=autocast_dtype, seed=derive_seed(seed, 0)
    )
    team = first.rewards.mean(dim=1)  # (M,) the team's reward per node, over its joint answers
    drops: list[dict[str, float]] = [{} for _ in first.nodes]
    for i in range(len(first.samples)):
        for kind in KINDS:
            texts = replacements[i].texts if kind == "untrained" else [""] * len(first.samples[i].texts)
            samples = list(first.samples)
            samples[i] = dataclasses.replace(samples[i], texts=list(texts))
            rewards = score_turn(  # (M, J)
                first.nodes,
                samples,
                0,
                reward_func=reward_func,
                g=g,
                joint_mode=joint_mode,
                num_turns=1,
                external_transition=None,
                termination_threshold=None,
                termination_scope="branch",
                reward_processor=reward_processor,
            )[0]
            for m, drop in enumerate((team - rewards.mean(dim=1)).tolist()):
                drops[m][f"agent_{i}/{kind}"] = drop
    return drops, replacements


def contribution_metrics(rows: list[dict[str, float]]) -> dict[str, float]:
    """``eval/contribution/agent_<i>/<kind>``: the mean over rows of each contribution; ``..._low`` / ``..._high``: its
    95% percentile bootstrap interval over rows (rows whose reward is not finite are left out)."""
    out: dict[str, float] = {}
    for key in dict.fromkeys(k for r in rows for k in r):
        values = [r[key] for r in rows if key in r and math.isfinite(r[key])]
        if not values:
            out.update({f"{PREFIX}{key}": math.nan, f"{PREFIX}{key}_low": math.nan, f"{PREFIX}{key}_high": math.nan})
            continue
        interval = bootstrap_mean(values)
        out[f"{PREFIX}{key}"] = interval.mean
        out[f"{PREFIX}{key}_low"], out[f"{PREFIX}{key}_high"] = interval.low, interval.high
    return out
