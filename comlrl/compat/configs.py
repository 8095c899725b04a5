"""Config classes under the reference library's names where its defaults differ from ours: each is our config with
the reference's defaults for the fields left unset (it adds no field), or, for what comlrl does not build, a name
that fails with the reason."""

from __future__ import annotations

from typing import Any, NoReturn

from .. import config as ours
from ..config_fields import config_class
from ..errors import ConfigError


def reference_style(cls: type, name: str, module: str) -> type:
    """``cls`` under the reference's ``name`` in ``module``, whose unset fields take the reference's defaults."""
    sub = type(
        name, (cls,), {"__doc__": f"{cls.__name__} with the reference library's defaults.", "reference_style": True}
    )
    sub.__module__ = module
    return config_class(sub)


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
