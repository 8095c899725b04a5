"""Exceptions that name the culprit: the config field, the agent, the dataset row; and what explains a config
field unknown to a config (:func:`explain_unknown_field`)."""

from __future__ import annotations

import difflib
from typing import Callable

FIELD_EXPLAINERS: list[Callable[[type, str], str | None]] = []
"""Each called with (config class, unknown field name): the error message that says what the field is and what to
use instead, or None. The compat layer adds the reference library's fields (:mod:`comlrl.compat.fields`), so that a
config keeps no knowledge of another library's names."""


def suggest(name: str, valid: list[str]) -> str:
    """' Did you mean X?' for the closest valid name, or ''."""
    close = difflib.get_close_matches(name, valid, n=1, cutoff=0.6)
    return f" Did you mean '{close[0]}'?" if close else ""


def explain_unknown_field(cls: type, name: str) -> str | None:
    """The first explainer's message for field ``name`` unknown to config class ``cls``; None when none knows it."""
    for explain in FIELD_EXPLAINERS:
        message = explain(cls, name)
        if message is not None:
            return message
    return None


class ComlrlError(ValueError):
    """Base class for errors caused by user input (config, data, callables)."""


class ConfigError(ComlrlError):
    """A config field is unknown, has a bad value, or contradicts another field."""


class RewardError(ComlrlError):
    """A reward function raised or returned something that is not one finite number per joint action."""


class FormatterError(ComlrlError):
    """A formatter raised, returned a non-string, or needs a dataset column that is missing."""


class TransitionError(ComlrlError):
    """An external transition raised or did not return one prompt string per agent."""


class ModelLoadError(ComlrlError):
    """A model or tokenizer could not be loaded; the message says what to do instead."""


class CentralizedComparatorParseError(ComlrlError):
    """A centralized comparator's completion could not be split into one answer per agent (its role tags)."""
