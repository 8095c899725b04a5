"""Config classes under the reference library's names, on its import paths: each is our config that takes the
reference's field names, with the reference's defaults for the fields left unset (it adds no dataclass field; its
reference-only fields read back as attributes), or, for what comlrl does not build, a name that fails with the
reason."""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, NoReturn

from .. import configs as ours
from ..configs.fields import config_class, suggest
from ..errors import ConfigError
from .fields import compat_fields, compat_values, translate


def _compat_field(self: Any, name: str) -> Any:
    """A reference-only field, as given or the reference's default (called only when ``name`` is none of ours)."""
    values = self.__dict__.get("_compat_values", {})  # absent while a copy is being rebuilt
    if name in values:
        return values[name]
    raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")


def compat_style(cls: type, name: str, module: str) -> type:
    """``cls`` under the reference's ``name`` in ``module``: it takes the reference's field names, its unset fields
    take the reference's defaults, and its reference-only fields read back (``args.rollout_buffer_size``).

    Its constructor translates the reference's fields (:func:`comlrl.compat.fields.translate`), keeps the
    reference-only ones to read back, marks the instance compat-style (:func:`is_compat_style`), then runs our
    config's checked constructor on the translated fields."""
    namespace = {
        "__doc__": f"{cls.__name__} with the reference library's field names and defaults.",
        "compat_style": True,
        "__getattr__": _compat_field,
    }
    sub = type(name, (cls,), namespace)
    sub.__module__ = module
    sub = config_class(sub)
    checked_init = sub.__init__
    names = [f.name for f in dataclasses.fields(sub)]

    @functools.wraps(checked_init)
    def compat_init(self: Any, *args: Any, **kwargs: Any) -> None:
        known = [*names, *compat_fields(type(self))]
        for key in kwargs:
            if key not in known:
                raise ConfigError(f"{type(self).__name__}: unknown field '{key}'.{suggest(key, known)}")
        object.__setattr__(self, "_compat_style", True)
        object.__setattr__(self, "_compat_values", compat_values(type(self), kwargs, set(names)))
        checked_init(self, *args, **translate(type(self), kwargs, set(names)))

    sub.__init__ = compat_init
    return sub


def is_compat_style(config: Any) -> bool:
    """Whether ``config`` was built from one of the reference's import paths (or carries that style from one,
    :func:`carry_compat_style`): the trainer then calls the reward and reports evaluation as the reference does."""
    return bool(config.__dict__.get("_compat_style", False))


def carry_compat_style(source: Any, config: Any) -> Any:
    """``config`` (a config built from ``source``'s settings, e.g. MARLHF's stage 3) marked compat-style when
    ``source`` is: a compat-style script's every stage calls the task reward as the reference does."""
    if is_compat_style(source):
        object.__setattr__(config, "_compat_style", True)
    return config


# the configs of the reference's paths that share our names (comlrl.trainers.actor_critic, .preference)
IACConfig = compat_style(ours.IACConfig, "IACConfig", "comlrl.trainers.actor_critic")
MAACConfig = compat_style(ours.MAACConfig, "MAACConfig", "comlrl.trainers.actor_critic")
MADPOConfig = compat_style(ours.MADPOConfig, "MADPOConfig", "comlrl.trainers.preference")
MARLHFConfig = compat_style(ours.MARLHFConfig, "MARLHFConfig", "comlrl.trainers.preference")
MADPOIterConfig = compat_style(ours.MADPOConfig, "MADPOIterConfig", "comlrl.trainers.preference")


class MARLHFIterConfig:
    """The reference's iterative MARLHF (preference pairs, reward model and RL refreshed each iteration): not built
    in comlrl; constructing it raises with the alternatives."""

    def __init__(self, *args: Any, **kwargs: Any) -> NoReturn:
        raise ConfigError(
            "MARLHFIterConfig: the reference's iterative MARLHF is not built in comlrl. MARLHFConfig runs its three "
            "stages once (pairs, reward model, RL); iterative preference rounds with a comparator, replay and an API "
            "comparator are MADPOIterConfig / MADPOConfig(num_rounds=...). See docs/migration.md."
        )


MARLHFIterTrainer = MARLHFIterConfig
