"""The reference library's ``comlrl.utils`` entry points that training scripts use (:mod:`comlrl.compat`)."""

from .reward_processor import RewardProcessors

__all__ = ["RewardProcessors"]
