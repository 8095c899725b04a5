"""MAGRPO and its baseline variants: the one loop of :mod:`.base` with a different ``advantage_mode``.

``from comlrl.trainers.magrpo import MAGRPOConfig, MAGRPOTrainer`` is the quick-start import path.
"""

from __future__ import annotations

from ..configs.policy import MAGRPOConfig, MAREINFORCEConfig, MAReMaxConfig, MARLOOConfig
from .base import MultiAgentTrainer


class MAGRPOTrainer(MultiAgentTrainer):
    """Multi-agent GRPO (Liu et al. 2025): group-mean baseline by default; ``advantage_mode`` may pick another."""

    config_class = MAGRPOConfig


class MAREINFORCETrainer(MultiAgentTrainer):
    """Multi-agent REINFORCE: no baseline (A = R)."""

    config_class = MAREINFORCEConfig
    fixed_advantage_mode = "none"


class MARLOOTrainer(MultiAgentTrainer):
    """Multi-agent RLOO: leave-one-out mean baseline.

    R_g - mean of the other G-1 returns = G/(G-1) (R_g - group mean): MARLOO's advantages are MAGRPO's times
    G/(G-1), the same direction. Under Adam (the default optimizer), which is invariant to a constant gradient scale
    up to its epsilon, the two train almost alike. They differ under SGD (the step is G/(G-1) longer), with a KL
    penalty (beta > 0: the KL term weighs relatively less in MARLOO), and when max_grad_norm clips one run's
    gradients but not the other's.
    """

    config_class = MARLOOConfig
    fixed_advantage_mode = "loo"


class MAReMaxTrainer(MultiAgentTrainer):
    """Multi-agent ReMax-style: group-max baseline."""

    config_class = MAReMaxConfig
    fixed_advantage_mode = "max"


# the spec's spelling
MAREMAXTrainer = MAReMaxTrainer
MAREMAXConfig = MAReMaxConfig

__all__ = [
    "MAGRPOConfig",
    "MAGRPOTrainer",
    "MAREINFORCEConfig",
    "MAREINFORCETrainer",
    "MARLOOConfig",
    "MARLOOTrainer",
    "MAReMaxConfig",
    "MAReMaxTrainer",
    "MAREMAXConfig",
    "MAREMAXTrainer",
]
