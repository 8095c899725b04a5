"""The actor-critic trainers' configs: the learned value critic(s) and their update (:class:`ActorCriticConfig`), each
agent's own critic (:class:`IACConfig`) or one centralized critic (:class:`MAACConfig`). Declared as every config is
(:mod:`comlrl.configs.fields`) on :class:`comlrl.configs.policy.PolicyConfig`."""

from __future__ import annotations

from ..errors import ConfigError
from .fields import config_class, help_field
from .policy import PolicyConfig


@config_class
class ActorCriticConfig(PolicyConfig):
    """Config of the actor-critic trainers (IAC, MAAC): separate actors, learned value critic(s)."""

    critic_type: str = help_field(
        "v", "'v': V(prompts); 'q' (MAAC only): Q(prompts, joint action), node value = mean of Q."
    )
    use_separate_critic: bool = help_field(
        True,
        "True: a separate value model (critic_model); False: a value head on the actor's own backbone "
        "(features detached: the value loss trains the head only, unless shared_value_loss_coef is set).",
    )
    shared_value_loss_coef: float | None = help_field(
        None,
        "With use_separate_critic=False: None trains the value head alone, on detached features, with its own "
        "optimizer; a number c back-propagates c x mean (V - target)^2 through the actor's backbone as well, in the "
        "actor's optimizer step, the head at the actor's learning rate (the reference library's shared critic: one "
        "step on actor loss + c x value loss). Not used by a separate critic (its own AdamW, on which a constant "
        "loss scale has no effect).",
    )
    critic_model: str | None = help_field(
        None, "Model source of the separate critic (None = the actor's source); may be smaller."
    )
    critic_learning_rate: float = help_field(1e-5, "AdamW learning rate of the critic (backbone and head).")
    critic_max_grad_norm: float = help_field(1.0, "Gradient-norm clip of the critic (0 disables).")
    gae_lambda: float = help_field(1.0, "GAE lambda over turns: 1 = Monte-Carlo tree returns, 0 = TD(0).")
    value_clip: float | None = help_field(None, "Clip the value update around the pre-update values (None = off).")
    normalize_advantages: bool = help_field(
        True,
        "Normalize each agent's advantages to zero mean, unit std per rollout (on by default, as in CleanRL's and "
        "TRL's PPO: early on, an untrained critic's V is far from the returns and raw advantages share one sign).",
    )

    def __post_init__(self) -> None:
        super().__post_init__()
        self._check_choice("critic_type", ("v", "q"))
        if not 0.0 <= self.gae_lambda <= 1.0:
            raise ConfigError(f"{type(self).__name__}.gae_lambda={self.gae_lambda}: must be in [0, 1].")
        if self.critic_learning_rate < 0:
            raise ConfigError(f"{type(self).__name__}.critic_learning_rate={self.critic_learning_rate}: must be >= 0.")
        coef = self.shared_value_loss_coef
        if coef is not None and (self.use_separate_critic or coef < 0):
            raise ConfigError(
                f"{type(self).__name__}.shared_value_loss_coef={coef}: a weight >= 0 of the value loss on "
                "the actor's backbone, so it needs use_separate_critic=False; a separate critic has its own AdamW, "
                "on which a constant loss scale has no effect (leave it None)."
            )


@config_class
class IACConfig(ActorCriticConfig):
    """Independent actor-critic: each agent has its own critic V_i(agent i's prompt)."""

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.critic_type != "v":
            raise ConfigError(
                "IACConfig.critic_type='q': an independent critic sees only its agent; use MAACConfig for Q."
            )


@config_class
class MAACConfig(ActorCriticConfig):
    """Multi-agent actor-critic: one centralized critic over all agents' prompts (V) or prompts + joint action (Q)."""

    def __post_init__(self) -> None:
        super().__post_init__()
        if not self.use_separate_critic:
            raise ConfigError(
                "MAACConfig.use_separate_critic=False: a centralized critic reads every agent's "
                "prompt, so it cannot live on one actor's backbone; use a separate critic."
            )
