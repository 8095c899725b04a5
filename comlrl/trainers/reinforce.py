"""The reference library's import path of its REINFORCE family (``comlrl.trainers.reinforce`` in comlrl 1.4.3).

Its trainers are ours. Its configs are ours in the reference's style: every field left unset takes the reference's
default (see :mod:`comlrl.compat.fields`), so a script written for it trains as there. New code imports from
``comlrl`` (``from comlrl import MAGRPOConfig``), where the defaults are ours.
"""

from .. import config as _ours
from ..config_fields import config_class
from .centralized import CentralizedMAGRPOTrainer
from .magrpo import MAGRPOTrainer, MAREINFORCETrainer, MAReMaxTrainer, MARLOOTrainer


def _reference_style(cls: type, name: str | None = None) -> type:
    """``cls`` whose unset fields take the reference's defaults (a subclass that adds no field)."""
    sub = type(
        name or cls.__name__,
        (cls,),
        {"__doc__": f"{cls.__name__} with the reference library's defaults.", "reference_style": True},
    )
    sub.__module__ = __name__
    return config_class(sub)


MAGRPOConfig = _reference_style(_ours.MAGRPOConfig)
MAREINFORCEConfig = _reference_style(_ours.MAREINFORCEConfig)
MAReMaxConfig = _reference_style(_ours.MAReMaxConfig, "MAReMaxConfig")
MARLOOConfig = _reference_style(_ours.MARLOOConfig)
CentralizedMAGRPOConfig = _reference_style(_ours.CentralizedMAGRPOConfig)

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
