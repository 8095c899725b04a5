"""The one training loop and its strategies: the loop (:mod:`.base`: rollout -> rewards -> advantages -> loss ->
optimizer step; the update in :mod:`.update`, the metrics in :mod:`.metrics`), team assembly with input checks
(:mod:`.build`), the MAGRPO family (:mod:`.magrpo`: one loop, the baseline a parameter), the actor-critic trainers
(:mod:`.actor_critic`), the centralized baseline (:mod:`.centralized`: one model writes every role's answer), the
preference trainers (:mod:`.madpo`: MADPO, its comparator side in :mod:`.comparator`; :mod:`.marlhf`: MARLHF, its
reward-model fit in :mod:`.reward_model`; their pair records in :mod:`.pairs`). The rollouts they train on are in
:mod:`comlrl.rollout`. The reference library's import paths (:mod:`.reinforce`, :mod:`.preference`, and its names in
:mod:`.actor_critic`) re-export these same trainers, with configs that take the reference's field names and defaults
(:mod:`comlrl.compat`); the configs here are ours.

What may live here: the order of the steps and their bookkeeping. What may not: tensor math (in
:mod:`comlrl.algorithms`) or speed paths (reached only through :mod:`comlrl.rollout` and :mod:`comlrl.engine`,
checked by import-linter).
"""

from ..configs.actor_critic import IACConfig, MAACConfig  # ours (the reference's paths: .actor_critic, .preference)
from ..configs.preference import MADPOConfig
from ..engine.reward_model import JointRewardModel
from .actor_critic import ActorCriticTrainerBase, IACTrainer, MAACTrainer
from .centralized import CentralizedMAGRPOConfig, CentralizedMAGRPOTrainer
from .madpo import MADPOTrainer
from .magrpo import (
    MAGRPOConfig,
    MAGRPOTrainer,
    MAREINFORCEConfig,
    MAREINFORCETrainer,
    MAREMAXConfig,
    MAReMaxConfig,
    MAREMAXTrainer,
    MAReMaxTrainer,
    MARLOOConfig,
    MARLOOTrainer,
)
from .marlhf import MARLHFConfig, MARLHFTrainer

__all__ = [
    "ActorCriticTrainerBase",
    "JointRewardModel",
    "CentralizedMAGRPOConfig",
    "CentralizedMAGRPOTrainer",
    "IACConfig",
    "MADPOConfig",
    "MADPOTrainer",
    "MARLHFConfig",
    "MARLHFTrainer",
    "IACTrainer",
    "MAACConfig",
    "MAACTrainer",
    "MAGRPOConfig",
    "MAGRPOTrainer",
    "MAREINFORCEConfig",
    "MAREINFORCETrainer",
    "MAREMAXConfig",
    "MAREMAXTrainer",
    "MARLOOConfig",
    "MARLOOTrainer",
    "MAReMaxConfig",
    "MAReMaxTrainer",
]
