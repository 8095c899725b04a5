"""The policy-gradient trainers' configs: the update they share (:class:`PolicyConfig`) and the critic-free
multi-agent REINFORCE family (:class:`MAGRPOConfig` and its baselines)."""

from __future__ import annotations

from ..algorithms.advantages import ADVANTAGE_GROUPINGS, CROSS_CREDITS, JOINT_MODES, ROLLOUT_EXPANSIONS
from ..algorithms.losses import LOSS_NORMALIZATIONS
from ..errors import ConfigError
from .base import TrainConfig
from .fields import config_class, help_field, suggest

ADVANTAGE_MODES = ("none", "mean", "loo", "max")
SCALE_MODES = ("none", "group", "batch", "standardize")
SCALE_BOOLS = {True: "group", False: "none"}  # TRL's scale_rewards=True / False
TURN_WEIGHTINGS = ("samples", "turns")
LOSS_TYPES = tuple(LOSS_NORMALIZATIONS)


@config_class
class PolicyConfig(TrainConfig):
    """Settings of the policy-gradient update shared by the REINFORCE family and the actor-critic trainers."""

    num_agents: int | None = help_field(None, "Optional check: must equal the trainer's number of agents when set.")
    reward_clip: float | None = help_field(None, "Clip team rewards to [-c, c] before advantages (None = off).")
    loss_type: str = help_field(
        "token_mean",
        "How token losses are averaged over an optimizer step's completions (all its rollouts and turns). "
        "token_mean (TRL's dapo): every completion token alike, over the whole step; seq_mean_token_mean (TRL's "
        "grpo): each sequence's token mean, then the mean over sequences; seq_sum: each sequence's token sum, mean "
        "over sequences; dr_grpo: token sum over (sequences x max_new_tokens), a constant normalizer (Liu et al. "
        "2025, Dr. GRPO); bnpo: token mean within each rollout, then the mean over the step's rollouts (TRL "
        "normalizes per local batch). TRL's default is dapo, the same normalization as token_mean.",
    )
    turn_weighting: str = help_field(
        "samples",
        "Multi-turn: 'samples' (default): every sample of a step weighs alike, so turn t weighs in "
        "proportion to its node count (G^t, or G^(N t) in cross mode), as each tree node weighs alike in the "
        "reference library; 'turns': the loss_type normalization runs within each turn and the turns are averaged, "
        "so each turn weighs the same whatever its node count.",
    )
    rollout_expansion: str = help_field(
        "tree",
        f"Multi-turn: which joint actions of a turn get a child node, one of {ROLLOUT_EXPANSIONS}. 'tree': every one "
        "(G^(t-1) nodes per dataset row at turn t, G^(N (t-1)) in cross mode); 'best': each row's highest-reward "
        "joint action (ties: the lowest index), so a T-turn episode samples G x T completions per agent per row; "
        "'top_k': each row's expansion_top_k highest (G + k G (T - 1)), as AT-GRPO. A joint action not continued "
        "has no child: its return is its own reward (advantage_grouping='agent_turn' is the natural pairing); a "
        "terminated branch (termination_threshold) does not continue either. TRL has no equivalent (single-turn).",
    )
    expansion_top_k: int = help_field(
        2, "rollout_expansion='top_k': how many joint actions of each dataset row continue at every turn (>= 1)."
    )
    mask_truncated_completions: bool = help_field(
        False,
        "Leave completions that hit max_new_tokens without EOS out of the loss (they still count in the "
        "rewards and baselines), as TRL's option.",
    )
    epsilon: float = help_field(0.2, "PPO ratio clip range; only active when num_iterations > 1.")
    epsilon_high: float | None = help_field(
        None, "Upper clip range of the ratio, 1 + epsilon_high (DAPO's clip-higher); None = epsilon."
    )
    num_iterations: int = help_field(1, "Optimizer passes per rollout batch (PPO-style reuse with ratio clipping).")
    beta: float = help_field(0.0, "KL penalty coefficient to a frozen reference copy of each agent (0 = no reference).")

    def __post_init__(self) -> None:
        super().__post_init__()
        name = type(self).__name__
        self._check_choice("loss_type", LOSS_TYPES)
        self._check_choice("turn_weighting", TURN_WEIGHTINGS)
        self._check_choice("rollout_expansion", ROLLOUT_EXPANSIONS)
        if self.expansion_top_k < 1:
            raise ConfigError(f"{name}.expansion_top_k={self.expansion_top_k}: must be >= 1.")
        if self.epsilon_high is not None and self.epsilon_high <= 0:
            raise ConfigError(f"{name}.epsilon_high={self.epsilon_high}: must be > 0 (or None).")
        if self.num_iterations < 1:
            raise ConfigError(f"{name}.num_iterations={self.num_iterations}: must be >= 1.")
        if self.epsilon <= 0:
            raise ConfigError(f"{name}.epsilon={self.epsilon}: must be > 0.")
        if self.beta < 0:
            raise ConfigError(f"{name}.beta={self.beta}: must be >= 0.")


@config_class
class MAGRPOConfig(PolicyConfig):
    """Config of the critic-free multi-agent REINFORCE family (MAGRPO and its baselines).

    The four trainers differ only in ``advantage_mode``: none (MAREINFORCE), mean (MAGRPO),
    loo (MARLOO), max (MAREMAX). Defaults follow Liu et al. 2025 (arXiv 2508.04652):
    no std scaling, so the four baselines give different updates.
    """

    joint_mode: str = help_field(
        "align",
        "'align' (alias 'aligned'): G joint actions; 'cross': G^N, a sample's credit by cross_credit "
        "(multi-turn: a child node per joint action).",
    )
    cross_credit: str = help_field(
        "mean",
        f"Cross mode: a sample's credit from the G^(N-1) joint actions holding it, one of {CROSS_CREDITS}: 'mean' "
        "their mean return; 'sum' their summed return (the reference library's), G^(N-1) times larger, the same "
        "advantages under scale_rewards='standardize'.",
    )
    advantage_mode: str = help_field("mean", f"Baseline over the group of returns: one of {ADVANTAGE_MODES}.")
    advantage_grouping: str = help_field(
        "team",
        f"Which samples an advantage compares, one of {ADVANTAGE_GROUPINGS}; groups hold samples of one prompt. "
        "'team': per node, the joint actions' tree returns, with advantage_mode and scale_rewards. 'agent' "
        "(Dr.MAS): the node's advantage_mode baseline, divided by the Bessel std of all of that agent's returns "
        "(in cross mode its credits) in the rollout plus 1e-4, each agent on its own reward scale (needs "
        "scale_rewards='none'; single-turn it equals scale_rewards='batch'). 'agent_turn' (AT-GRPO): per agent, "
        "turn and node, each joint action's own turn reward (no later turn), with advantage_mode and scale_rewards. "
        "Costs no extra samples. TRL has no equivalent (one agent, one turn).",
    )
    scale_rewards: str | bool = help_field(
        "none",
        f"Divide advantages by the std of the group or batch: {SCALE_MODES}. 'group' and 'batch' are TRL's: the "
        "Bessel-corrected std of the group's (the batch's) returns plus 1e-4; TRL's True means 'group', False "
        "'none'. 'standardize': (A - group mean of A) / population std of A, the reference library's "
        "advantage_normalization (every baseline then gives the same update). The default differs from TRL's "
        "(group): without it the four baselines give different updates.",
    )

    def __post_init__(self) -> None:
        super().__post_init__()
        name = type(self).__name__
        if self.joint_mode not in JOINT_MODES:
            raise ConfigError(
                f"{name}.joint_mode={self.joint_mode!r}: must be one of {sorted(JOINT_MODES)}."
                + suggest(str(self.joint_mode), sorted(JOINT_MODES))
            )
        self.joint_mode = JOINT_MODES[self.joint_mode]
        self._check_choice("cross_credit", CROSS_CREDITS)
        self._check_choice("advantage_mode", ADVANTAGE_MODES)
        if isinstance(self.scale_rewards, bool):
            self.scale_rewards = SCALE_BOOLS[self.scale_rewards]
        self._check_choice("scale_rewards", SCALE_MODES)
        self._check_choice("advantage_grouping", ADVANTAGE_GROUPINGS)
        if self.advantage_grouping == "agent" and self.scale_rewards != "none":
            raise ConfigError(
                f"{name}.advantage_grouping='agent' divides each agent's advantages by the std of its own returns; "
                f"it takes no other scale, and scale_rewards={self.scale_rewards!r} (set scale_rewards='none')."
            )
        if self.advantage_mode in ("mean", "loo", "max") and self.num_generations < 2:
            raise ConfigError(
                f"{name}.num_generations={self.num_generations}: the '{self.advantage_mode}' baseline needs a "
                "group of at least 2 samples; raise num_generations or use advantage_mode='none'."
            )


def _variant(name: str, mode: str, doc: str) -> type:
    cls = type(
        name,
        (MAGRPOConfig,),
        {
            "__doc__": doc,
            "__annotations__": {"advantage_mode": str},
            "advantage_mode": help_field(mode, MAGRPOConfig.field_help()["advantage_mode"]),
        },
    )
    cls.__module__ = __name__
    return config_class(cls)


MAREINFORCEConfig = _variant("MAREINFORCEConfig", "none", "MAGRPOConfig with no baseline (A = R).")
MARLOOConfig = _variant("MARLOOConfig", "loo", "MAGRPOConfig with the leave-one-out baseline (RLOO).")
MAReMaxConfig = _variant("MAReMaxConfig", "max", "MAGRPOConfig with the group-max baseline (ReMax-style).")
