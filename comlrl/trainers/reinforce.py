"""The reference library's import path of its REINFORCE family (``comlrl.trainers.reinforce`` in comlrl 1.4.3).

Its trainers are ours. Its configs are ours in the reference's style: every field left unset takes the reference's
default (see :mod:`comlrl.compat.fields`), so a script written for it trains as there. New code imports from
``comlrl`` (``from comlrl import MAGRPOConfig``), where the defaults are ours.
"""

from .. import configs as _ours
from ..compat.configs import compat_style
from .centralized import CentralizedMAGRPOTrainer
from .magrpo import MAGRPOTrainer, MAREINFORCETrainer, MAReMaxTrainer, MARLOOTrainer

MAGRPOConfig = compat_style(_ours.MAGRPOConfig, "MAGRPOConfig", __name__)
MAREINFORCEConfig = compat_style(_ours.MAREINFORCEConfig, "MAREINFORCEConfig", __name__)
MAReMaxConfig = compat_style(_ours.MAReMaxConfig, "MAReMaxConfig", __name__)
MARLOOConfig = compat_style(_ours.MARLOOConfig, "MARLOOConfig", __name__)
CentralizedMAGRPOConfig = compat_style(_ours.CentralizedMAGRPOConfig, "CentralizedMAGRPOConfig", __name__)

__all__ = [
    "CentralizedMAGRPOConfig",
    "CentralizedMAGRPOTrainer",
    "MAGRPOConfig",
    "MAGRPOTrainer",
    "MAREINFORCEConfig",
    "MAREINFORCETrainer",
    "MAReMaxConfig",
    "MAReMaxTrainer",
    "MARLOOConfig",
    "MARLOOTrainer",
]
