"""``RewardProcessors``: the reference library's ready-made ``reward_processor`` callables (float -> float, applied
to each team reward, as our trainers' ``reward_processor=`` is)."""

from __future__ import annotations

from typing import Callable


class RewardProcessors:
    """Factories of ``reward_processor`` callables."""

    @staticmethod
    def scale(factor: float = 1.0) -> Callable[[float], float]:
        """Multiply each team reward by ``factor``."""
        return lambda reward: reward * factor

    @staticmethod
    def shift(value: float = 0.0) -> Callable[[float], float]:
        """Add ``value`` to each team reward."""
        return lambda reward: reward + value
