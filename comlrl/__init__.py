"""comlrl: cooperative multi-agent reinforcement learning for teams of LLMs.

Every trainer and its config import from the top level, as in TRL: ``from comlrl import MAGRPOTrainer,
MAGRPOConfig``. They load on first use, so ``import comlrl`` stays light.
"""

from __future__ import annotations

import importlib
from typing import Any

# the compat layer explains the reference library's field names to our configs, which know none of them
from .compat import fields as _compat_fields  # noqa: F401

__version__ = "0.1.0"

_EXPORTS = {
    "comlrl.trainers.magrpo": (
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
    ),
    "comlrl.trainers.actor_critic": ("IACTrainer", "MAACTrainer"),
    "comlrl.trainers.centralized": ("CentralizedMAGRPOConfig", "CentralizedMAGRPOTrainer"),
    "comlrl.trainers.madpo": ("MADPOTrainer",),
    # ours; the reference's paths (comlrl.trainers.actor_critic, .preference) hold its configs of these names
    "comlrl.configs": ("IACConfig", "MAACConfig", "MADPOConfig"),
    "comlrl.trainers.marlhf": ("MARLHFConfig", "MARLHFTrainer"),
    "comlrl.errors": ("ComlrlError", "ConfigError"),
}
_WHERE = {name: module for module, names in _EXPORTS.items() for name in names}
__all__ = sorted(_WHERE)


def __getattr__(name: str) -> Any:
    if name not in _WHERE:
        raise AttributeError(f"module 'comlrl' has no attribute {name!r}")
    value = getattr(importlib.import_module(_WHERE[name]), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
