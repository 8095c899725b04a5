"""The one training loop and its strategies: the loop (:mod:`.base`: rollout -> rewards -> advantages -> loss ->
optimizer step), the multi-turn episode tree (:mod:`.episode`), the MAGRPO family (:mod:`.magrpo`: one loop, the
baseline a parameter), the actor-critic trainers (:mod:`.actor_critic`) and team assembly with input checks
(:mod:`.setup`).

What may live here: the order of the steps and their bookkeeping. What may not: tensor math (in
:mod:`comlrl.algorithms`) or speed paths (reached only through :mod:`comlrl.engine`, checked by import-linter).
"""

from .actor_critic import IACConfig, IACTrainer, MAACConfig, MAACTrainer
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

__all__ = [
    "IACConfig",
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
