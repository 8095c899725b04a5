"""comlrl trainers."""

from .actor_critic import IACConfig, IACTrainer, MAACConfig, MAACTrainer
from .magrpo import (MAGRPOConfig, MAGRPOTrainer, MAREINFORCEConfig, MAREINFORCETrainer, MAREMAXConfig,
                     MAREMAXTrainer, MAReMaxConfig, MAReMaxTrainer, MARLOOConfig, MARLOOTrainer)

__all__ = ["IACConfig", "IACTrainer", "MAACConfig", "MAACTrainer", "MAGRPOConfig", "MAGRPOTrainer",
           "MAREINFORCEConfig", "MAREINFORCETrainer", "MAREMAXConfig", "MAREMAXTrainer", "MARLOOConfig",
           "MARLOOTrainer", "MAReMaxConfig", "MAReMaxTrainer"]
