"""Multi-agent RLHF in three stages, each on machinery the other trainers use.

1. Preference pairs: the team's joint candidates for ``preference_prompts`` rows in one batched rollout, scored by
   the task reward and paired by :func:`comlrl.algorithms.preference.select_pairs` (or a labelled dataset's
   chosen / rejected columns); stored in ``<output_dir>/pairs/round-00000.jsonl``.
2. A joint reward model (:mod:`comlrl.engine.reward_model`: a causal-LM backbone with a scalar head reading every
   agent's prompt and answer) fit to the pairs with the Bradley-Terry loss (:mod:`comlrl.trainers.reward_model`);
   held-out pair accuracy reported and the model saved in ``<output_dir>/reward_model/``. Pairs its tokenizer cannot
   read are skipped and counted (``reward_model/unreadable_pairs``). The mean and std of its scores on the pairs'
   joint answers are kept (``reward_model/score_mean``, ``reward_model/score_std``).
3. RL of the team against the frozen reward model, its score standardized with that statistic
   (``reward_model_normalize``), with the one loop of ``rl_algorithm`` (optionally mixed with the task reward);
   evaluation keeps scoring the task reward, so a run shows whether the learned reward transfers.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import logging
from pathlib import Path
from typing import Any, Callable

import torch

from ..compat.configs import carry_compat_style
from ..configs.base import TrainConfig
from ..configs.preference import MARLHFConfig
from ..engine.reward_model import (
    RewardModelReward,
    build_reward_model,
    load_reward_model,
    pair_score_stats,
    save_reward_model,
)
from ..engine.reward_pairs import readable_pairs, split_pairs_by_prompt
from ..errors import ConfigError, suggest
from ..parallel import distributed
from ..rollout.sampling import derive_seed
from ..tracking import fresh_output_dir
from .actor_critic import IACTrainer, MAACTrainer
from .base import MultiAgentTrainer
from .magrpo import MAGRPOTrainer, MAREINFORCETrainer, MAReMaxTrainer, MARLOOTrainer
from .pairs import PAIRS_DIR, ROUNDS_FILE, candidate_pairs, dataset_pairs, read_jsonl, shard_path, write_jsonl
from .reward_model import train_reward_model

log = logging.getLogger(__name__)

RL_TRAINERS: dict[str, type[MultiAgentTrainer]] = {
    "magrpo": MAGRPOTrainer,
    "mareinforce": MAREINFORCETrainer,
    "marloo": MARLOOTrainer,
    "maremax": MAReMaxTrainer,
    "iac": IACTrainer,
    "maac": MAACTrainer,
}
REWARD_MODEL_DIR = "reward_model"
# TrainConfig fields stage 3 takes from the MARLHF config (the aliases are merged into their names already)
_SHARED = [
    f.name for f in dataclasses.fields(TrainConfig) if f.name not in ("agent_learning_rate", "max_completion_length")
]


def rl_config(args: MARLHFConfig) -> TrainConfig:
    """Stage 3's config: the run settings of ``args`` and ``args.rl_args``, in ``rl_algorithm``'s config class."""
    if args.rl_algorithm not in RL_TRAINERS:
        raise ConfigError(
            f"MARLHFConfig.rl_algorithm={args.rl_algorithm!r}: must be one of {', '.join(RL_TRAINERS)}."
            + suggest(str(args.rl_algorithm), list(RL_TRAINERS))
        )
    cls = RL_TRAINERS[args.rl_algorithm].config_class
    names = {f.name for f in dataclasses.fields(cls)}
    for key in args.rl_args:
        if key in _SHARED:
            raise ConfigError(f"MARLHFConfig.rl_args.{key}: a run setting; set MARLHFConfig.{key} instead.")
        if key not in names:
            raise ConfigError(
                f"MARLHFConfig.rl_args.{key}: not a field of {cls.__name__}.{suggest(str(key), sorted(names))}"
            )
    values = {name: getattr(args, name) for name in _SHARED}
    values["num_agents"] = args.num_agents
    try:
        rl = cls(**values, **args.rl_args)
    except ConfigError as exc:
        raise ConfigError(f"MARLHFConfig.rl_args ({cls.__name__}): {exc}") from exc
    return carry_compat_style(args, rl)


def _untrained_reward(*_: Any, **__: Any) -> list[float]:
    raise ConfigError("MARLHF: stage 3's reward model is not trained yet; call train().")


class MARLHFTrainer:
    """Preference pairs -> joint reward model -> RL against it (see the module docstring).

    Arguments as :class:`~comlrl.trainers.base.MultiAgentTrainer`; ``reward_func`` is the task reward (stage 1's
    labeller and evaluation's score; optional with ``preferences='dataset'`` and ``task_reward_weight=0``).
    ``preference_dataset``: the labelled pairs of ``preferences='dataset'``. ``reward_model``: a backbone source
    for stage 2 (overrides ``args.reward_model``); ``reward_model_tokenizer``: its tokenizer (default: its own).
    Stage 3 is the trainer of ``rl_algorithm`` (``self.rl``), whose evaluate(), save_model() and checkpoints are
    this trainer's. After stage 2, ``self.reward_model`` is the joint reward model (a module) and
    ``self.reward_tokenizer`` its tokenizer. Runs as one process.
    """

    config_class = MARLHFConfig

    def __init__(
        self,
        model: Any = None,
        num_agents: int | None = None,
        tokenizer: Any = None,
        train_dataset: Any = None,
        reward_func: Callable | None = None,
        formatters: Any = None,
        args: MARLHFConfig | None = None,
        *,
        preference_dataset: Any = None,
        reward_model: Any = None,
        reward_model_tokenizer: Any = None,
        eval_reward_func: Callable | None = None,
        **kwargs: Any,
    ) -> None:
        args = args if args is not None else MARLHFConfig()
        if not isinstance(args, MARLHFConfig):
            raise ConfigError(f"MARLHFTrainer needs args=MARLHFConfig(...), got {type(args).__name__}.")
        distributed.require_one_process("MARLHFTrainer does not run under torchrun yet; launch it as one process.")
        if args.output_dir is None:  # one fresh folder for all three stages (pairs, reward model, RL)
            args = copy.deepcopy(args)  # the caller's config stays as given
            args.output_dir = fresh_output_dir("marlhf")
            log.info("output_dir not set: this run writes to %s", args.output_dir)
        self.args = args
        if args.preferences == "online" and reward_func is None:
            raise ConfigError("MARLHF with preferences='online' labels the candidates with reward_func=; pass it.")
        if args.task_reward_weight and reward_func is None:
            raise ConfigError(f"task_reward_weight={args.task_reward_weight} mixes in reward_func=; pass it.")
        if args.preferences == "dataset" and preference_dataset is None:
            raise ConfigError("MARLHF with preferences='dataset' needs preference_dataset= (chosen / rejected pairs).")
        self.task_reward = reward_func
        self.preference_dataset = preference_dataset
        self._reward_model_source, self._reward_model_tokenizer = reward_model, reward_model_tokenizer
        self.rl = RL_TRAINERS[args.rl_algorithm](
            model,
            num_agents,
            tokenizer,
            train_dataset,
            reward_func or _untrained_reward,
            formatters,
            rl_config(args),
            eval_reward_func=eval_reward_func or reward_func,
            **kwargs,
        )
        if reward_func is not None:  # as stage 3's trainer calls it (a reference-style run: the reference's prompts=)
            self.task_reward = self.rl.reward_func
        self.reward_model: Any = None  # stage 2's JointRewardModel, as the reference names it
        self.reward_tokenizer: Any = None  # and its tokenizer
        self.reward_model_metrics: dict[str, float] = {}

    # the trainer protocol the command line and users rely on, answered by stage 3's trainer
    @property
    def tracker(self) -> Any:
        return self.rl.tracker

    @tracker.setter
    def tracker(self, value: Any) -> None:
        self.rl.tracker = value

    @property
    def state(self) -> dict:
        return self.rl.state

    @property
    def dist(self) -> Any:
        return self.rl.dist

    @property
    def num_agents(self) -> int:
        return self.rl.num_agents

    @property
    def agents(self) -> list:
        return self.rl.agents

    @property
    def last_eval_samples(self) -> list[dict]:
        return self.rl.last_eval_samples

    def evaluate(self, *args: Any, **kwargs: Any) -> dict[str, float]:
        """Stage 3's trainer's evaluate(): the task reward of the team's answers."""
        return self.rl.evaluate(*args, **kwargs)

    def save_model(self, output_dir: str | None = None) -> list[str]:
        """Every agent's model (stage 3's trainer) and, beside them, the reward model."""
        paths = self.rl.save_model(output_dir)
        if self.reward_model is not None and output_dir is not None:
            paths.append(
                str(save_reward_model(self.reward_model, self.reward_tokenizer, Path(output_dir) / REWARD_MODEL_DIR))
            )
        return paths

    # ------------------------------------------------------------------ stages
    def train(self, resume_from_checkpoint: str | bool | None = None) -> dict[str, Any]:
        """Run the three stages; a resumed run reuses the saved pairs and reward model and continues stage 3."""
        out = Path(self.args.output_dir)
        saved = out / REWARD_MODEL_DIR
        if resume_from_checkpoint not in (None, False) and (saved / "reward_model.json").is_file():
            self.reward_model, self.reward_tokenizer = load_reward_model(saved, self.rl.device)
            metrics_file = saved / "metrics.json"
            self.reward_model_metrics = json.loads(metrics_file.read_text()) if metrics_file.is_file() else {}
            log.info("resume: reward model from %s", saved)
        else:
            pairs = self.preference_pairs()
            self.reward_model_metrics = self.fit_reward_model(pairs)
            save_reward_model(self.reward_model, self.reward_tokenizer, saved)
            (saved / "metrics.json").write_text(json.dumps(self.reward_model_metrics, indent=2))
        model, tok = self.reward_model, self.reward_tokenizer
        model.requires_grad_(False).train(False)
        a = self.args
        if "reward_model/score_mean" not in self.reward_model_metrics:  # a checkpoint written without the statistic
            pairs, _, _ = readable_pairs(tok, read_jsonl(shard_path(out, 0)))
            self.reward_model_metrics.update(self.score_statistic(pairs))
        self.rl.reward_func = RewardModelReward(
            model,
            tok,
            task_reward=self.task_reward if a.task_reward_weight else None,
            task_weight=a.task_reward_weight,
            max_length=a.reward_model_max_length,
            score_mean=self.reward_model_metrics["reward_model/score_mean"],
            score_std=self.reward_model_metrics["reward_model/score_std"],
            normalize=a.reward_model_normalize,
        )
        result = self.rl.train(resume_from_checkpoint)
        result["reward_model"] = dict(self.reward_model_metrics)
        return result

    @torch.no_grad()
    def preference_pairs(self) -> list[dict]:
        """Stage 1: pair records (every agent's prompt, the chosen and the rejected joint answer)."""
        a = self.args
        if a.preferences == "dataset":
            pairs = dataset_pairs(self.preference_dataset, self.rl.formatters, a.chosen_column, a.rejected_column)
        else:
            data = self.rl.train_dataset
            if data is None:
                raise ConfigError("MARLHF stage 1 collects candidates on train_dataset=; pass it.")
            order = torch.randperm(len(data), generator=torch.Generator().manual_seed(derive_seed(a.seed, "stage1")))
            ids = order[: a.preference_prompts].tolist()
            episode = self.rl.rollout(
                [data[i] for i in ids],
                ids,
                settings=self.rl.generation_settings(train=True),
                num_generations=a.candidates_per_prompt,
                reward_func=self.task_reward,
                seed=derive_seed(a.seed, "stage1", "candidates"),
            )
            pairs, ties = candidate_pairs(
                [episode],
                round_index=0,
                mode=a.pair_selection,
                pairs_per_prompt=a.pairs_per_prompt,
                tie_tolerance=a.tie_tolerance,
                seed=a.seed,
            )
            if not pairs:
                raise ConfigError(
                    f"MARLHF stage 1 (round 0): every prompt's {a.candidates_per_prompt} candidates tied "
                    f"({ties} ties); use a denser task reward, more candidates_per_prompt or a higher temperature."
                )
            rewards = episode.turns[0].rewards.reshape(-1).tolist()
            write_jsonl(Path(a.output_dir) / PAIRS_DIR / ROUNDS_FILE, [{"round": 0, "team_rewards": rewards}])
        write_jsonl(shard_path(a.output_dir, 0), pairs)
        return pairs

    def fit_reward_model(self, pairs: list[dict]) -> dict[str, float]:
        """Stage 2: a fresh joint reward model fit to ``pairs`` (held out by prompt); its metrics, with the number
        of pairs skipped as unreadable and the score statistic stage 3 standardizes with."""
        a = self.args
        source = self._reward_model_source or a.reward_model
        tokenizer = self._reward_model_tokenizer
        if source is None:  # the first agent's backbone (without the team's adapters) and tokenizer
            source, tokenizer = self.rl._team_sources[0], tokenizer or self.rl.agents[0].tokenizer
        model, tok = build_reward_model(
            source, tokenizer, training=a.reward_model_training, device=self.rl.device, seed=a.seed
        )
        total = len(pairs)
        pairs, skipped, why = readable_pairs(tok, pairs)
        if not pairs:  # the tokenizer reads none of them: the wrong tokenizer, named
            raise ConfigError(
                f"MARLHF stage 2: the reward model's tokenizer ({type(tok).__name__}) cannot read any of the {total} "
                f"pairs; the first: {why}. Use a reward model whose tokenizer covers the agents' text (e.g. the "
                "agents' own model)."
            )
        if skipped:
            log.warning(
                "reward model: %d of %d pairs skipped, unreadable by its tokenizer; first: %s", skipped, total, why
            )
        train, held_out = split_pairs_by_prompt(pairs, a.reward_model_eval_fraction, a.seed)
        metrics = train_reward_model(
            model,
            tok,
            train,
            held_out,
            epochs=a.reward_model_epochs,
            learning_rate=a.reward_model_learning_rate,
            batch_size=a.reward_model_batch_size,
            max_length=a.reward_model_max_length,
            seed=a.seed,
            disable_tqdm=a.disable_tqdm,
        )
        self.reward_model, self.reward_tokenizer = model, tok
        metrics["reward_model/unreadable_pairs"] = float(skipped)
        metrics.update(self.score_statistic(pairs))
        log.info("reward model: %s", {k: round(v, 4) for k, v in metrics.items()})
        return metrics

    def score_statistic(self, pairs: list[dict]) -> dict[str, float]:
        """``reward_model/score_mean`` and ``reward_model/score_std``: the mean and population std of the reward
        model's scores of the pairs' chosen and rejected joint answers, the statistic stage 3 standardizes with."""
        model, tok = self.reward_model, self.reward_tokenizer
        a = self.args
        mean, std = pair_score_stats(
            model, tok, pairs, batch_size=2 * a.reward_model_batch_size, max_length=a.reward_model_max_length
        )
        return {"reward_model/score_mean": mean, "reward_model/score_std": std}


__all__ = ["MARLHFConfig", "MARLHFTrainer", "rl_config"]
