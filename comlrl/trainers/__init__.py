"""The one training loop and its strategies: the loop (:mod:`.base`: rollout -> rewards -> advantages -> loss ->
optimizer step; the update in :mod:`.update`, the metrics in :mod:`.metrics`), the multi-turn episode tree
(:mod:`.episode`), the MAGRPO family (:mod:`.magrpo`: one loop, the baseline a parameter), the actor-critic trainers
(:mod:`.actor_critic`), the centralized baseline (:mod:`.centralized`: one model writes every role's answer), the
preference trainers (:mod:`.preference`: MADPO; :mod:`.marlhf`: MARLHF) and team assembly with input checks
(:mod:`.setup`). The reference library's import paths (:mod:`.reinforce`, and its names in :mod:`.actor_critic` and
:mod:`.preference`) re-export these same trainers, with configs that take the reference's field names and defaults
(:mod:`comlrl.compat`); the configs here are ours.

What may live here: the order of the steps and their bookkeeping. What may not: tensor math (in
:mod:`comlrl.algorithms`) or speed paths (reached only through :mod:`comlrl.engine`, checked by import-linter).
"""

from ..config import IACConfig, MAACConfig, MADPOConfig  # ours (the reference's paths: .actor_critic, .preference)
from ..engine.reward_model import JointRewardModel
from .actor_critic import ActorCriticTrainerBase, IACTrainer, MAACTrainer
from .centralized import CentralizedMAGRPOConfig, CentralizedMAGRPOTrainer
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
from .preference import MADPOTrainer

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
