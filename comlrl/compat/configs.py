"""Config classes under the reference library's names, on its import paths: each is our config that takes the
reference's field names, with the reference's defaults for the fields left unset (it adds no dataclass field; its
reference-only fields read back as attributes), or, for what comlrl does not build, a name that fails with the
reason."""

from __future__ import annotations

from typing import Any, NoReturn

from .. import configs as ours
from ..configs.fields import config_class
from ..errors import ConfigError


def _reference_field(self: Any, name: str) -> Any:
    """A reference-only field, as given or the reference's default (called only when ``name`` is none of ours)."""
    values = self.__dict__.get("_reference_values", {})  # absent while a copy is being rebuilt
    if name in values:
        return values[name]
    raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")


def reference_style(cls: type, name: str, module: str) -> type:
    """``cls`` under the reference's ``name`` in ``module``: it takes the reference's field names, its unset fields
    take the reference's defaults, and its reference-only fields read back (``args.rollout_buffer_size``)."""
    namespace = {
        "__doc__": f"{cls.__name__} with the reference library's field names and defaults.",
        "reference_style": True,
        "__getattr__": _reference_field,
    }
    sub = type(name, (cls,), namespace)
    sub.__module__ = module
    return config_class(sub)


# the configs of the reference's paths that share our names (comlrl.trainers.actor_critic, .preference)
IACConfig = reference_style(ours.IACConfig, "IACConfig", "comlrl.trainers.actor_critic")
MAACConfig = reference_style(ours.MAACConfig, "MAACConfig", "comlrl.trainers.actor_critic")
MADPOConfig = reference_style(ours.MADPOConfig, "MADPOConfig", "comlrl.trainers.preference")
MARLHFConfig = reference_style(ours.MARLHFConfig, "MARLHFConfig", "comlrl.trainers.preference")
MADPOIterConfig = reference_style(ours.MADPOConfig, "MADPOIterConfig", "comlrl.trainers.preference")


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
