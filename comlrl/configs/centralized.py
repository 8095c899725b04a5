"""The centralized baseline's config (:class:`CentralizedMAGRPOConfig`): MAGRPO with one model answering for every
role. Declared as every config is (:mod:`comlrl.configs.fields`) on
:class:`comlrl.configs.policy.MAGRPOConfig`."""

from __future__ import annotations

from ..algorithms.preference import CENTRALIZED_TEMPLATE, centralized_prompt
from ..errors import ConfigError
from .fields import config_class, help_field
from .policy import MAGRPOConfig


@config_class
class CentralizedMAGRPOConfig(MAGRPOConfig):
    """The centralized baseline (:class:`comlrl.trainers.centralized.CentralizedMAGRPOTrainer`): MAGRPO with one
    model that writes every role's answer in one completion, ``<agent_1>...</agent_1> ... <agent_N>...</agent_N>``.

    ``num_agents`` is the team's number of roles here, as in the decentralized team's config (an alias of
    ``num_roles``); the trainer holds one model.
    """

    num_roles: int | None = help_field(
        None,
        "The team's roles N, each answered inside its <agent_i> tags (default: num_agents, else the number of "
        "formatters given, else 2).",
    )
    centralized_template: str = help_field(
        CENTRALIZED_TEMPLATE,
        "The one model's prompt, a str.format template: {roles} (every role's prompt under an [Agent i] heading), "
        "{format} (the <agent_i>...</agent_i> skeleton to answer in) and {num_roles}; literal braces as {{ }}.",
    )

    def __post_init__(self) -> None:
        super().__post_init__()
        self._refuse_topology("one model writes every role's answer in one completion, so no agent sees another's")
        name = type(self).__name__
        if self.num_roles is not None and self.num_roles < 1:
            raise ConfigError(f"{name}.num_roles={self.num_roles}: must be >= 1 (or None).")
        if self.num_roles is not None and self.num_agents not in (None, self.num_roles):
            raise ConfigError(
                f"{name}: num_agents={self.num_agents} disagrees with num_roles={self.num_roles} (here both count "
                "the team's roles; set one)."
            )
        if "{roles}" not in self.centralized_template:
            raise ConfigError(f"{name}.centralized_template must contain {{roles}}, where the role prompts go.")
        try:
            centralized_prompt(["a", "b"], self.centralized_template)
        except (KeyError, IndexError, ValueError) as exc:
            raise ConfigError(
                f"{name}.centralized_template: {type(exc).__name__} {exc} (its fields are {{roles}}, {{format}} and "
                "{num_roles}; write literal braces as {{ and }})."
            ) from exc
