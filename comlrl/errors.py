"""Exceptions that name the culprit: the config field, the agent, the dataset row."""


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
