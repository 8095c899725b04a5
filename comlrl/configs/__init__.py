"""The trainer configs: typed dataclasses with one help string per field, TRL-style names and validation.

Every field's help lives in ``field(metadata={"help": ...})`` only; the CLI and docs read it from there. Unknown
fields fail at construction with the nearest valid name suggested.

How a config is declared and checked is in :mod:`.fields`; the settings every trainer shares in :mod:`.base`; the
policy-gradient family in :mod:`.policy`, the actor-critic trainers' in :mod:`.actor_critic`, the centralized
baseline's in :mod:`.centralized`, the preference trainers' in :mod:`.preference`. Every config is importable from
here, as from the top level (``from comlrl import MAGRPOConfig``).
"""

from .actor_critic import ActorCriticConfig, IACConfig, MAACConfig
from .base import TrainConfig
from .centralized import CentralizedMAGRPOConfig
from .policy import MAGRPOConfig, MAREINFORCEConfig, MAReMaxConfig, MARLOOConfig, PolicyConfig
from .preference import MADPOConfig, MARLHFConfig, PreferenceConfig

__all__ = [
    "ActorCriticConfig",
    "CentralizedMAGRPOConfig",
    "IACConfig",
    "MAACConfig",
    "MADPOConfig",
    "MAGRPOConfig",
    "MAREINFORCEConfig",
    "MARLHFConfig",
    "MARLOOConfig",
    "MAReMaxConfig",
    "PolicyConfig",
    "PreferenceConfig",
    "TrainConfig",
]
