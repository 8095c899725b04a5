"""The preference trainers on the reference library's import path: MADPO (:mod:`.madpo`) and MARLHF (:mod:`.marlhf`),
their centralized comparator adapters, and the pair records they store (:mod:`.pairs`), under the reference's names."""

from __future__ import annotations

from typing import Any

from ..algorithms.preference import CentralizedComparatorAdapter, TaggedCentralizedComparatorAdapter
from .madpo import MADPOTrainer
from .pairs import candidate_pairs, read_jsonl, shard_path, snapshot_rounds

# the reference library's names on its import path (comlrl.compat): the same trainers; its configs take the
# reference's field names and defaults (ours: comlrl.MADPOConfig, comlrl.MARLHFConfig)
MADPOIterTrainer = MADPOTrainer
_REFERENCE_NAMES = {
    "MADPOConfig": "comlrl.compat.configs",
    "MARLHFConfig": "comlrl.compat.configs",
    "MARLHFTrainer": "comlrl.trainers.marlhf",  # resolved on first use
    "JointRewardModel": "comlrl.engine.reward_model",
    "CentralizedComparatorParseError": "comlrl.errors",
    "MADPOIterConfig": "comlrl.compat.configs",
    "MARLHFIterConfig": "comlrl.compat.configs",
    "MARLHFIterTrainer": "comlrl.compat.configs",
}


def __getattr__(name: str) -> Any:
    if name not in _REFERENCE_NAMES:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(_REFERENCE_NAMES[name]), name)


__all__ = [
    "CentralizedComparatorAdapter",
    "MADPOIterTrainer",
    "MADPOTrainer",
    "TaggedCentralizedComparatorAdapter",
    "candidate_pairs",
    "read_jsonl",
    "shard_path",
    "snapshot_rounds",
    *_REFERENCE_NAMES,
]
