"""How each of the reference library's config fields becomes ours: a :class:`Rule` per field, by config family,
and the settings of our own fields that make a reference-style config train with the reference's loss and
optimizer. :mod:`.fields` applies them."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from ..errors import ConfigError

Convert = Callable[[Any, dict], dict]


@dataclass(frozen=True)
class Rule:
    """How one reference field becomes ours: ``convert(value, every reference-style value given or defaulted)``
    returns our fields; ``sets`` names the ones it can set (a field of ours given by the caller wins over a
    reference default that sets it); ``note`` is the line logged on first use."""

    convert: Convert
    sets: tuple[str, ...]
    note: str


@dataclass(frozen=True)
class SameAs:
    """A reference-style setting of ours that takes the value another field of ours ends up with."""

    field: str

    def __repr__(self) -> str:
        return f"the {self.field}"


def _rename(ours: str, note: str = "same meaning") -> Rule:
    return Rule(lambda v, ref: {ours: v}, (ours,), f"-> {ours} ({note})")


def _dropped(note: str) -> Rule:
    return Rule(lambda v, ref: {}, (), f"has no effect here: {note}")


def _consumed(by: str) -> Rule:
    return Rule(lambda v, ref: {}, (), f"read together with {by}")


def _choice(name: str, value: Any, valid: tuple) -> Any:
    if value not in valid:
        raise ConfigError(f"{name}={value!r}: the reference library accepts one of {valid}.")
    return value


def _devices(v: Any, ref: dict) -> dict:
    """parallel_training + agent_devices: 'mp' puts agent i on agent_devices[i] in this process; 'none' puts every
    agent on the first device named (the reference's resolve_single_device)."""
    mode = _choice("parallel_training", "none" if v in (None, "null") else str(v).lower(), ("none", "mp"))
    spec = ref.get("agent_devices")
    if mode == "mp" and spec is None:
        raise ConfigError("parallel_training='mp' needs agent_devices (one device, or one per agent).")
    if spec is None or spec == "auto":
        return {}
    specs = [spec] if isinstance(spec, str) else list(spec)
    if not specs:
        raise ConfigError("agent_devices=[]: name one device, or one per agent.")
    if mode == "none" or len(specs) == 1:
        return {"device": specs[0]}
    return {"agent_devices": specs}


def _kl(v: Any, ref: dict) -> dict:
    coef = float(ref.get("reference_kl_coef", 0.1))
    return {"beta": coef if v else 0.0}


def _tree_nodes(ref: dict) -> int:
    """Nodes of one row's rollout tree (the reference buffers and batches nodes, we batch rows)."""
    g, turns, n = int(ref.get("num_generations", 4)), int(ref.get("num_turns", 1)), int(ref.get("num_agents", 2))
    joint = g ** max(n, 1) if str(ref.get("joint_mode", "aligned")).lower() in ("cross", "crossed") else g
    return sum(joint**t for t in range(max(turns, 1)))


def _rows_per_step(samples_per_row: Callable[[dict], int]) -> Convert:
    def convert(v: Any, ref: dict) -> dict:
        buffer, batch = int(v), ref.get("train_batch_size")
        batch = buffer if batch is None else int(batch)
        if buffer < 1 or batch < 1:
            raise ConfigError(f"rollout_buffer_size={buffer}, train_batch_size={batch}: both must be >= 1.")
        return {"per_device_train_batch_size": max(1, batch // samples_per_row(ref))}

    return convert


def _joint_mode(v: Any, ref: dict) -> dict:
    mode = _choice("joint_mode", str(v).lower(), ("align", "aligned", "cross", "crossed"))
    return {"joint_mode": "cross" if mode == "crossed" else mode}


def _advantages(v: Any, ref: dict) -> dict:
    return {"scale_rewards": "standardize" if v else "none"}


def _advantage_mode(v: Any, ref: dict) -> dict:
    return {"advantage_mode": {"raw": "none", "rloo": "loo"}.get(v, v)}


def _positive_or_none(name: str) -> Rule:
    def convert(v: Any, ref: dict) -> dict:
        if v is not None:
            raise ConfigError(
                f"{name}={v!r}: comlrl's value head is one linear layer; an MLP head is not built (leave it None)."
            )
        return {}

    return Rule(convert, (), "None only: our value head is linear")


def _value_clip(v: Any, ref: dict) -> dict:
    return {"value_clip": None if ref.get("use_separate_critic", True) else v}


def _value_loss_coef(v: Any, ref: dict) -> dict:
    return {} if ref.get("use_separate_critic", True) else {"shared_value_loss_coef": float(v)}


def _critic_lr(v: Any, ref: dict) -> dict:
    return {"critic_learning_rate": v if v is not None else ref.get("agent_learning_rate", 5e-6)}


COMMON: dict[str, Rule] = {
    "parallel_training": Rule(
        _devices,
        ("device", "agent_devices"),
        "with agent_devices -> agent_devices ('mp': agent i on device i, one process) or device ('none')",
    ),
    "agent_devices": _consumed("parallel_training"),
    "top_k": Rule(lambda v, ref: {"top_k": 0 if v is None else v}, ("top_k",), "None -> 0 (off)"),
    "early_termination_threshold": Rule(
        lambda v, ref: {"termination_threshold": v, "termination_scope": "node"},
        ("termination_threshold", "termination_scope"),
        "-> termination_threshold with termination_scope='node' (a node stops expanding once the mean reward of "
        "its joint actions exceeds it)",
    ),
    "external_prompt_passthrough": Rule(
        lambda v, ref: {"format_transition_prompts": not v},
        ("format_transition_prompts",),
        "-> format_transition_prompts = not it",
    ),
    "eval_interval": _rename("eval_steps", "evaluate every N steps; the reference counts dataset rows"),
    "eval_num_samples": Rule(
        lambda v, ref: {"eval_max_rows": max(1, int(v))}, ("eval_max_rows",), "-> eval_max_rows (same meaning)"
    ),
    "eval_batch_size": _rename("per_device_eval_batch_size"),
    "reference_devices": _dropped("the frozen reference copy lives on its agent's device"),
}

POLICY: dict[str, Rule] = {  # the REINFORCE family and the actor-critic trainers
    "reference_kl_enabled": Rule(
        _kl,
        ("beta",),
        "with reference_kl_coef -> beta (KL to the initial model; we penalize it in the loss as TRL does, the "
        "reference subtracts it from the returns)",
    ),
    "reference_kl_coef": _consumed("reference_kl_enabled"),
}

REINFORCE: dict[str, Rule] = {
    "rollout_buffer_size": Rule(
        _rows_per_step(_tree_nodes),
        ("per_device_train_batch_size",),
        "with train_batch_size -> per_device_train_batch_size = train_batch_size // nodes of one row's tree (the "
        "reference steps the optimizer per train_batch_size tree nodes, we per rollout of rows)",
    ),
    "train_batch_size": _consumed("rollout_buffer_size"),
    "advantage_normalization": Rule(
        _advantages,
        ("scale_rewards",),
        "-> scale_rewards='standardize' ((A - mean) / std per group, after the baseline)",
    ),
    "advantage_mode": Rule(_advantage_mode, ("advantage_mode",), "raw -> none, rloo -> loo"),
    "joint_mode": Rule(
        _joint_mode,
        ("joint_mode",),
        "'crossed' -> 'cross' (its rollout there; its credit there is the sum for 'cross' only, see docs/migration.md)",
    ),
    "discount": Rule(
        lambda v, ref: {"discount": 1.0},
        ("discount",),
        "is ignored by the reference's MAGRPO (undiscounted tree returns): discount=1.0",
    ),
    "collaboration_mode": _dropped("CentralizedMAGRPOTrainer is always centralized"),
}

ACTOR_CRITIC: dict[str, Rule] = {
    "rollout_buffer_size": Rule(
        _rows_per_step(lambda ref: int(ref.get("num_generations", 1)) * int(ref.get("num_turns", 1))),
        ("per_device_train_batch_size",),
        "with train_batch_size -> per_device_train_batch_size = train_batch_size // samples of one row",
    ),
    "train_batch_size": _consumed("rollout_buffer_size"),
    "advantage_normalization": _rename("normalize_advantages"),
    "critic_learning_rate": Rule(_critic_lr, ("critic_learning_rate",), "None -> the agents' learning rate"),
    "value_clip_range": Rule(
        _value_clip, ("value_clip",), "-> value_clip (the reference clips only a value head on the actor)"
    ),
    "value_loss_coef": Rule(
        _value_loss_coef,
        ("shared_value_loss_coef",),
        "-> shared_value_loss_coef with use_separate_critic=False (the value loss trains the actor's backbone too, in the "
        "actor's step); no effect on a separate critic (its own AdamW: a constant loss scale changes nothing)",
    ),
    "value_head_hidden_dim": _positive_or_none("value_head_hidden_dim"),
    "critic_value_head_hidden_dim": _positive_or_none("critic_value_head_hidden_dim"),
    "critic_devices": _dropped("a critic lives on its agent's device (MAAC's: agent 0's)"),
}


def _preference_batch(v: Any, ref: dict) -> dict:
    batch = ref.get("train_batch_size")
    batch = int(v) if batch is None else int(batch)
    if int(v) < 1 or batch < 1:
        raise ConfigError(f"rollout_buffer_size={v}, train_batch_size={batch}: both must be >= 1.")
    return {"per_device_train_batch_size": batch}


def _decentralized(v: Any, ref: dict) -> dict:
    _choice("collaboration_mode", v, ("decentralized", "centralized"))
    if v == "centralized":
        raise ConfigError(
            "collaboration_mode='centralized': comlrl's preference trainers train a decentralized team; one model "
            "answering every role is CentralizedMAGRPOTrainer (or comparator_generation='centralized' for MADPO's "
            "comparator)."
        )
    return {}


def _ac_algorithm(ref: dict) -> bool:
    return str(ref.get("rl_algorithm", "magrpo")).lower() in ("iac", "maac")


def _rl_rows(v: Any, ref: dict) -> dict:
    per_row = (lambda r: int(r.get("num_generations", 4))) if _ac_algorithm(ref) else _tree_nodes
    return _rows_per_step(per_row)(v, ref)


def _rl_advantages(v: Any, ref: dict) -> dict:
    if _ac_algorithm(ref):
        return {"rl_args": {"normalize_advantages": bool(v)}}
    mode = {"raw": "none", "rloo": "loo"}.get(ref.get("advantage_mode", "mean"), ref.get("advantage_mode", "mean"))
    return {"rl_args": {"scale_rewards": "standardize" if v else "none", "advantage_mode": mode}}


def _rl_arg(
    ours: str, convert: Callable[[Any], Any] = lambda v: v, when: Callable[[dict], bool] = _ac_algorithm
) -> Convert:
    return lambda v, ref: {"rl_args": {ours: convert(v)}} if when(ref) and v is not None else {}


def _reward_training(v: Any, ref: dict) -> dict:
    return {"reward_model_training": "head" if v else "full"}


PREFERENCE: dict[str, Rule] = {  # MADPO's fields, which MARLHF inherits there
    "collaboration_mode": Rule(_decentralized, (), "'decentralized' only"),
    "preference_pairs_per_sample": _rename("pairs_per_prompt"),
    "use_environment_step": _dropped("the reference's logging x-axis; we log per optimizer step"),
    "environment_steps_per_pair": _dropped("the reference's logging x-axis; we log per optimizer step"),
    "joint_mode": _dropped("single-turn candidates: one joint answer per candidate"),
}
MADPO: dict[str, Rule] = {
    "rollout_buffer_size": Rule(
        _preference_batch, ("per_device_train_batch_size",), "with train_batch_size -> pairs per optimizer step"
    ),
    "train_batch_size": _consumed("rollout_buffer_size"),
    "preference_num_candidates": _rename("num_generations", "joint candidates per prompt"),
    "dpo_beta": _rename("beta"),
    "advantage_normalization": _dropped("MADPO has no advantages"),
    "advantage_mode": _dropped("MADPO has no advantages"),
    "reference_kl_enabled": _dropped("the reference's MADPO never reads it; reference_free=True is its form"),
    "reference_kl_coef": _dropped("the reference's MADPO never reads it"),
}
MARLHF: dict[str, Rule] = {
    "rollout_buffer_size": Rule(
        _rl_rows, ("per_device_train_batch_size",), "with train_batch_size -> stage 3's rows per optimizer step"
    ),
    "train_batch_size": _consumed("rollout_buffer_size"),
    "preference_num_candidates": _rename("candidates_per_prompt", "stage 1's joint candidates per prompt"),
    "dpo_beta": _dropped("MARLHF trains a reward model, not DPO"),
    "advantage_normalization": Rule(_rl_advantages, ("rl_args",), "with advantage_mode -> stage 3's rl_args"),
    "advantage_mode": _consumed("advantage_normalization"),
    "reference_kl_enabled": Rule(
        lambda v, ref: {"rl_args": {"beta": float(ref.get("reference_kl_coef", 0.1)) if v else 0.0}},
        ("rl_args",),
        "with reference_kl_coef -> stage 3's rl_args beta",
    ),
    "reference_kl_coef": _consumed("reference_kl_enabled"),
    "reward_model_name": _rename("reward_model"),
    "reward_model_device": _dropped("the reward model lives on the trainer's device"),
    "reward_learning_rate": _rename("reward_model_learning_rate"),
    "reward_num_train_epochs": _rename("reward_model_epochs"),
    "reward_train_batch_size": _rename("reward_model_batch_size"),
    "reward_max_length": Rule(
        lambda v, ref: {"reward_model_max_length": v} if v is not None else {},
        ("reward_model_max_length",),
        "-> reward_model_max_length (None: ours)",
    ),
    "reward_freeze_backbone": Rule(
        _reward_training, ("reward_model_training",), "-> reward_model_training 'head' (True) or 'full'"
    ),
    "critic_model_name": Rule(_rl_arg("critic_model"), ("rl_args",), "-> stage 3's rl_args critic_model"),
    "critic_learning_rate": Rule(
        lambda v, ref: _rl_arg("critic_learning_rate")(v if v is not None else ref.get("agent_learning_rate"), ref),
        ("rl_args",),
        "-> stage 3's rl_args (None: the agents' learning rate)",
    ),
    "rl_algorithm": Rule(
        lambda v, ref: {
            "rl_algorithm": v,
            "rl_args": {"loss_type": "seq_sum", "gae_lambda": 0.0, "critic_max_grad_norm": 0.0}
            if _ac_algorithm(ref)
            else {"loss_type": "seq_sum"},
        },
        ("rl_algorithm",),
        "keeps its name; stage 3 takes the reference's loss (seq_sum), and TD(0) targets for iac / maac",
    ),
    "use_separate_critic": Rule(_rl_arg("use_separate_critic"), ("rl_args",), "-> stage 3's rl_args"),
    "critic_type": Rule(_rl_arg("critic_type"), ("rl_args",), "-> stage 3's rl_args"),
    "value_clip_range": Rule(
        lambda v, ref: _rl_arg("value_clip")(None if ref.get("use_separate_critic", True) else v, ref),
        ("rl_args",),
        "-> stage 3's rl_args value_clip (only on a value head sharing the actor, as there)",
    ),
    "value_loss_coef": Rule(
        lambda v, ref: _rl_arg("shared_value_loss_coef")(
            None if ref.get("use_separate_critic", True) else float(v), ref
        ),
        ("rl_args",),
        "-> stage 3's rl_args shared_value_loss_coef (only on a value head sharing the actor, as there)",
    ),
    "value_head_hidden_dim": ACTOR_CRITIC["value_head_hidden_dim"],
    "critic_value_head_hidden_dim": ACTOR_CRITIC["critic_value_head_hidden_dim"],
    "critic_devices": ACTOR_CRITIC["critic_devices"],
}

REPLAY_MODES = {"current": "current", "nearest_k": "last_k", "all_history": "all", "lambda_decay": "decay"}
REPLAY_ALIASES = {
    "latest": "current",
    "new": "current",
    "recent_k": "nearest_k",
    "last_k": "nearest_k",
    "k": "nearest_k",
}
REPLAY_ALIASES |= {"lambda": "lambda_decay", "td_lambda": "lambda_decay", "td-lambda": "lambda_decay"}
COMPARATOR_POLICIES = {"current": "current", "current_copy": "current", "model": "model", "history": "history"}
COMPARATOR_POLICIES |= {"api": "api", "self": "current", "online": "current", "copy": "current", "external": "model"}


def _replay(v: Any, ref: dict) -> dict:
    mode = REPLAY_ALIASES.get(str(v).lower(), str(v).lower())
    _choice("preference_replay_mode", mode, tuple(REPLAY_MODES))
    lam = ref.get("preference_replay_lambda")
    if mode == "lambda_decay" and lam is not None and float(lam) == 0.0:
        return {"replay": "current"}  # lambda 0: every stored round but this one weighs 0
    return {"replay": REPLAY_MODES[mode]}


def _comparator_policy(v: Any, ref: dict) -> dict:
    """Every comparator of the reference's iterative MADPO answers apart from the team (the current one too) and
    pairs candidate i of the team with candidate i of the comparator."""
    policy = str(v).lower()
    _choice("comparator_policy", policy, tuple(COMPARATOR_POLICIES))
    return {"comparator": COMPARATOR_POLICIES[policy], "comparator_pairing": "aligned"}


def _comparator_agents(v: Any, ref: dict) -> dict:
    if v is None:
        return {}
    sources = [v] if isinstance(v, str) else list(v)
    if len(set(map(str, sources))) != 1:
        raise ConfigError(
            f"comparator_agents={sources!r}: comlrl's comparator is one model answering for every agent "
            "(comparator_model); give one source."
        )
    return {"comparator_model": sources[0]}


def _only(name: str, allowed: tuple, why: str) -> Rule:
    def convert(v: Any, ref: dict) -> dict:
        if v not in allowed:
            raise ConfigError(f"{name}={v!r}: {why}")
        return {}

    return Rule(convert, (), f"accepted as {allowed[0]!r} only")


def _comparator_candidates(v: Any, ref: dict) -> dict:
    if v is not None and int(v) < 1:
        raise ConfigError(f"comparator_num_candidates={v}: must be >= 1 or None (as many as the team).")
    return {"comparator_num_generations": int(v) if v is not None else None}


ITERATIVE: dict[str, Rule] = {  # MADPOIterConfig's own fields
    "num_iterations": _rename("num_rounds", "collect -> pair -> train rounds"),
    "preference_replay_mode": Rule(
        _replay, ("replay",), "-> replay (nearest_k -> last_k, all_history -> all, lambda_decay -> decay)"
    ),
    "preference_replay_k": Rule(
        lambda v, ref: {"replay_k": int(v)} if v is not None else {}, ("replay_k",), "-> replay_k"
    ),
    "preference_replay_lambda": Rule(
        lambda v, ref: {"replay_decay": float(v)} if v not in (None, 0, 0.0) else {},
        ("replay_decay",),
        "-> replay_decay (pairs of age a drawn in proportion to lambda ** a, as (1 - lambda) lambda ** a there)",
    ),
    "preference_replay_sample_size": _dropped(
        "a round trains steps_per_round x batch pair slots: its own pairs first, then replayed ones"
    ),
    "preference_replay_dir": _rename("replay_dir", "its iteration_<N>.json files, written and replayed"),
    "policy_checkpoint_dir": _dropped("the comparator's snapshots are kept under output_dir"),
    "log_reward_distribution": _dropped("every round's team and comparator rewards go to pairs/rounds.jsonl"),
    "comparator_policy": Rule(
        _comparator_policy,
        ("comparator", "comparator_pairing"),
        "-> comparator (current_copy -> current: the same team at the round's start) with "
        "comparator_pairing='aligned' (the team's i-th candidate against the comparator's i-th)",
    ),
    "comparator_generation_mode": Rule(
        lambda v, ref: {"comparator_generation": {"centralised": "centralized"}.get(str(v).lower(), str(v).lower())},
        ("comparator_generation",),
        "-> comparator_generation",
    ),
    "comparator_centralized_agent_index": _only(
        "comparator_centralized_agent_index", (0,), "comlrl's centralized comparator is comparator_model itself"
    ),
    "comparator_model_name": Rule(
        lambda v, ref: {"comparator_model": v} if v is not None else {}, ("comparator_model",), "-> comparator_model"
    ),
    "comparator_agents": Rule(_comparator_agents, ("comparator_model",), "-> comparator_model (one source)"),
    "comparator_devices": _dropped("the comparator lives on the trainer's device"),
    "comparator_num_candidates": Rule(
        _comparator_candidates, ("comparator_num_generations",), "-> comparator_num_generations"
    ),
    "comparator_history_k": Rule(
        lambda v, ref: {"comparator_lag": int(v)} if v is not None else {}, ("comparator_lag",), "-> comparator_lag"
    ),
    "comparator_api_key": _only(
        "comparator_api_key",
        (None,),
        "keep the key out of the config: put it in an environment variable and name it in comparator_api_key_env",
    ),
    "comparator_api_key_header": _only(
        "comparator_api_key_header", ("Authorization",), "the header follows comparator_api_format here"
    ),
    "comparator_api_key_prefix": _only("comparator_api_key_prefix", ("Bearer",), "the prefix follows the format"),
    "comparator_api_response_field": _only(
        "comparator_api_response_field", ("completions",), "the generic format reads 'completions'"
    ),
}

# fields of ours a reference-style config sets unless the caller gives them: the reference's data order (its loaders
# never shuffle), evaluation (one sampled answer per agent at the run's temperature, top_p and top_k), loss and
# optimizer
RUN_MODE = {"shuffle": False, "eval_do_sample": True, "eval_temperature": SameAs("temperature")}
REINFORCE_MODE = {"loss_type": "seq_sum", "max_grad_norm": 0.0, "weight_decay": 0.01, "cross_credit": "sum"}
OPTIMIZER_MODE = {"max_grad_norm": 0.0, "weight_decay": 0.01}  # torch's AdamW(lr) without clipping
MADPO_MODE = {
    **OPTIMIZER_MODE,
    "shuffle": True,  # the reference reads the rows in order but shuffles its pairs every epoch: our pair pool
    "reference_free": True,
    "num_rounds": 1,
    "prompts_per_round": None,
    "steps_per_round": None,
}
MARLHF_MODE = {**OPTIMIZER_MODE, "preference_prompts": None, "reward_model_normalize": False}
ACTOR_CRITIC_MODE = {
    "loss_type": "seq_sum",  # its policy loss: -(sum of the completion's token log-probs) x advantage, sample mean
    "max_grad_norm": 0.0,
    "critic_max_grad_norm": 0.0,
    "weight_decay": 0.01,
    "gae_lambda": 0.0,
}
