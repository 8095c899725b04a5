"""comlrl trainers."""

from .magrpo import (MAGRPOConfig, MAGRPOTrainer, MAREINFORCEConfig, MAREINFORCETrainer, MAReMaxConfig,
                     MAReMaxTrainer, MARLOOConfig, MARLOOTrainer)

__all__ = ["MAGRPOConfig", "MAGRPOTrainer", "MAREINFORCEConfig", "MAREINFORCETrainer", "MARLOOConfig",
           "MARLOOTrainer", "MAReMaxConfig", "MAReMaxTrainer"]
