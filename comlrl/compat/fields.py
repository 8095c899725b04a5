"""The reference library's config fields, translated onto ours with the reference's meaning.

A config built with any field that only the reference has (``rollout_buffer_size``, ``advantage_normalization``,
...), or through a reference-only import path (:mod:`comlrl.trainers.reinforce`), is a *reference-style* config:
the fields it leaves unset take the reference's defaults (its temperature 0.6, its early termination, its
undiscounted tree returns, its loss and optimizer), so that the script trains as its author expects. Our own fields
can be mixed in and win over a reference default that would set the same thing.

:func:`translate` is called by every config constructor (:func:`comlrl.config_fields.config_class`); the tables
here are the whole mapping, and ``tests/test_compat.py`` fails when one of them drifts from our configs.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, Callable

from ..errors import ConfigError
from . import REFERENCE

log = logging.getLogger("comlrl.compat")

Convert = Callable[[Any, dict], dict]


@dataclass(frozen=True)
class Rule:
    """How one reference field becomes ours: ``convert(value, every reference-style value given or defaulted)``
    returns our fields; ``sets`` names the ones it can set (a field of ours given by the caller wins over a
    reference default that sets it); ``note`` is the line logged on first use."""

    convert: Convert
    sets: tuple[str, ...]
    note: str


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
    joint = g ** max(n, 1) if str(ref.get("joint_mode", "aligned")) == "cross" else g
    return sum(joint**t for t in range(max(turns, 1)))


def _rows_per_step(samples_per_row: Callable[[dict], int]) -> Convert:
    def convert(v: Any, ref: dict) -> dict:
        buffer, batch = int(v), ref.get("train_batch_size")
        batch = buffer if batch is None else int(batch)
        if buffer < 1 or batch < 1:
            raise ConfigError(f"rollout_buffer_size={buffer}, train_batch_size={batch}: both must be >= 1.")
        return {"per_device_train_batch_size": max(1, batch // samples_per_row(ref))}

    return convert


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
    "value_loss_coef": _dropped("each critic has its own AdamW, on which a constant loss scale has no effect"),
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
            "rl_args": {"gae_lambda": 0.0, "critic_max_grad_norm": 0.0}
            if _ac_algorithm(ref)
            else {"loss_type": "seq_sum"},
        },
        ("rl_algorithm",),
        "keeps its name; stage 3 takes the reference's loss (seq_sum) or TD(0) targets",
    ),
    "use_separate_critic": Rule(_rl_arg("use_separate_critic"), ("rl_args",), "-> stage 3's rl_args"),
    "critic_type": Rule(_rl_arg("critic_type"), ("rl_args",), "-> stage 3's rl_args"),
    "value_clip_range": Rule(
        lambda v, ref: _rl_arg("value_clip")(None if ref.get("use_separate_critic", True) else v, ref),
        ("rl_args",),
        "-> stage 3's rl_args value_clip (only on a value head sharing the actor, as there)",
    ),
    "value_loss_coef": ACTOR_CRITIC["value_loss_coef"],
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
    policy = str(v).lower()
    _choice("comparator_policy", policy, tuple(COMPARATOR_POLICIES))
    return {"comparator": COMPARATOR_POLICIES[policy]}


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
    if v is not None and int(v) != int(ref.get("preference_num_candidates", v)):
        raise ConfigError(
            f"comparator_num_candidates={v}: comlrl's comparator answers as many candidates as the team "
            "(num_generations); leave it None."
        )
    return {}


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
    "preference_replay_dir": _dropped("pairs are stored in <output_dir>/pairs/"),
    "policy_checkpoint_dir": _dropped("the comparator's snapshots are kept under output_dir"),
    "log_reward_distribution": _dropped("every round's team and comparator rewards go to pairs/rounds.jsonl"),
    "comparator_policy": Rule(
        _comparator_policy,
        ("comparator",),
        "-> comparator (current_copy -> current: the same team at the round's start)",
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
    "comparator_num_candidates": Rule(_comparator_candidates, (), "None (as many as the team) only"),
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

# fields of ours a reference-style config sets unless the caller gives them: the reference's loss and optimizer
REINFORCE_MODE = {"loss_type": "seq_sum", "max_grad_norm": 0.0, "weight_decay": 0.01}
OPTIMIZER_MODE = {"max_grad_norm": 0.0, "weight_decay": 0.01}  # torch's AdamW(lr) without clipping
MADPO_MODE = {
    **OPTIMIZER_MODE,
    "reference_free": True,
    "num_rounds": 1,
    "prompts_per_round": None,
    "steps_per_round": None,
}
MARLHF_MODE = {**OPTIMIZER_MODE, "preference_prompts": None, "reward_model_normalize": False}
ACTOR_CRITIC_MODE = {"max_grad_norm": 0.0, "critic_max_grad_norm": 0.0, "weight_decay": 0.01, "gae_lambda": 0.0}

_SHARED = {"num_agents": 2, "max_new_tokens": 256, "temperature": 0.6, "top_p": 0.6, "logging_steps": 50}
_RUN = {
    "parallel_training": "none",
    "agent_devices": None,
    "external_prompt_passthrough": False,
    "eval_interval": 16,
    "eval_num_samples": 4,
    "eval_batch_size": 1,
    "reference_kl_enabled": False,
    "reference_kl_coef": 0.1,
    "reference_devices": None,
}
_MAGRPO = {
    **_SHARED,
    **_RUN,
    "num_train_epochs": 20,
    "agent_learning_rate": 5e-6,
    "num_generations": 4,
    "top_k": 50,
    "num_turns": 2,
    "discount": 1.0,
    "joint_mode": "aligned",
    "early_termination_threshold": -0.2,
    "rollout_buffer_size": 2,
    "train_batch_size": None,
    "advantage_normalization": True,
    "advantage_mode": "mean",
}
_ACTOR_CRITIC = {
    **_SHARED,
    **_RUN,
    "agent_learning_rate": 5e-6,
    "critic_learning_rate": 5e-6,
    "rollout_buffer_size": 8,
    "train_batch_size": None,
    "value_loss_coef": 0.6,
    "advantage_normalization": True,
    "top_k": None,
    "num_train_epochs": 40,
    "use_separate_critic": True,
    "critic_type": "v",
    "critic_devices": None,
    "num_turns": 2,
    "discount": 1.0,
    "num_generations": 1,
    "early_termination_threshold": -0.2,
    "logging_steps": 1,
}
# the reference's defaults, by the reference class each of our configs stands for (its full field list)
DEFAULTS: dict[str, dict[str, Any]] = {
    "MAGRPOConfig": _MAGRPO,
    "MAREINFORCEConfig": {**_MAGRPO, "advantage_mode": "raw"},
    "MAReMaxConfig": {**_MAGRPO, "advantage_mode": "max"},
    "MARLOOConfig": {**_MAGRPO, "advantage_mode": "rloo"},
    "CentralizedMAGRPOConfig": {**_MAGRPO, "num_turns": 1, "collaboration_mode": "centralized"},
    "IACConfig": {
        **_ACTOR_CRITIC,
        "value_clip_range": 0.2,
        "value_head_hidden_dim": None,
        "critic_value_head_hidden_dim": None,
    },
    "MAACConfig": _ACTOR_CRITIC,
}
ALIASES = {"agent_learning_rate": "learning_rate", "max_completion_length": "max_new_tokens"}  # ours, both names
_MADPO = {
    **_SHARED,
    **_RUN,
    "num_train_epochs": 20,
    "agent_learning_rate": 5e-6,
    "collaboration_mode": "decentralized",
    "top_k": 50,
    "num_turns": 1,
    "discount": 1.0,
    "joint_mode": "aligned",
    "early_termination_threshold": None,
    "rollout_buffer_size": 2,
    "train_batch_size": None,
    "advantage_normalization": True,
    "advantage_mode": "mean",
    "preference_num_candidates": 80,
    "preference_pairs_per_sample": 16,
    "pair_selection": "reward_gap",
    "dpo_beta": 0.1,
    "use_environment_step": True,
    "environment_steps_per_pair": 2,
}
DEFAULTS["MADPOConfig"] = _MADPO
DEFAULTS["MARLHFConfig"] = {
    **_MADPO,
    "rl_algorithm": "magrpo",
    "num_generations": 4,
    "reward_model_name": None,
    "reward_model_device": "cuda:0",
    "reward_learning_rate": 1e-5,
    "reward_num_train_epochs": 1,
    "reward_train_batch_size": 1,
    "reward_max_length": None,
    "reward_freeze_backbone": False,
    "critic_model_name": None,
    "critic_learning_rate": None,
    "critic_devices": None,
    "use_separate_critic": True,
    "critic_type": "v",
    "value_loss_coef": 0.6,
    "value_clip_range": 0.2,
    "critic_value_head_hidden_dim": None,
    "value_head_hidden_dim": None,
}
DEFAULTS["MADPOIterConfig"] = {
    **_MADPO,
    "num_train_epochs": 1,
    "preference_num_candidates": 20,
    "preference_pairs_per_sample": 4,
    "pair_selection": "comparator_reward",
    "num_iterations": 6,
    "preference_replay_mode": "current",
    "preference_replay_k": None,
    "preference_replay_lambda": None,
    "preference_replay_sample_size": None,
    "preference_replay_dir": None,
    "log_reward_distribution": False,
    "policy_checkpoint_dir": None,
    "comparator_policy": "current",
    "comparator_generation_mode": "decentralized",
    "comparator_centralized_agent_index": 0,
    "comparator_model_name": None,
    "comparator_agents": None,
    "comparator_devices": None,
    "comparator_num_candidates": None,
    "comparator_history_k": None,
    "comparator_api_url": None,
    "comparator_api_format": "generic",
    "comparator_api_model": None,
    "comparator_api_max_n_per_request": None,
    "comparator_api_timeout": 120.0,
    "comparator_api_headers": None,
    "comparator_api_key": None,
    "comparator_api_key_env": None,
    "comparator_api_key_header": "Authorization",
    "comparator_api_key_prefix": "Bearer",
    "comparator_api_response_field": "completions",
    "comparator_api_extra_body": None,
}
REFERENCE_NAMES = {"MAREMAXConfig": "MAReMaxConfig"}  # our spelling -> the reference's

# by our base class name: whose rules and reference-style settings a config takes (most derived last)
FAMILIES: dict[str, tuple[dict[str, Rule], dict[str, Any]]] = {
    "TrainConfig": (COMMON, {}),
    "PolicyConfig": (POLICY, {}),
    "MAGRPOConfig": (REINFORCE, REINFORCE_MODE),
    "ActorCriticConfig": (ACTOR_CRITIC, ACTOR_CRITIC_MODE),
    "PreferenceConfig": (PREFERENCE, {}),
    "MADPOConfig": (MADPO, MADPO_MODE),
    "MARLHFConfig": (MARLHF, MARLHF_MODE),
    "MADPOIterConfig": (ITERATIVE, {}),
}

_logged: set[tuple[str, str]] = set()


def rules_for(cls: type) -> tuple[dict[str, Rule], dict[str, Any]]:
    """The translation rules and reference-style settings of config class ``cls`` (merged along its bases)."""
    rules: dict[str, Rule] = {}
    mode: dict[str, Any] = {}
    for base in reversed(cls.__mro__):
        family = FAMILIES.get(base.__name__)
        if family is not None and base.__module__.startswith("comlrl."):
            rules.update(family[0])
            mode.update(family[1])
    return rules, mode


def reference_fields(cls: type) -> list[str]:
    """The reference's field names that config class ``cls`` translates."""
    return list(rules_for(cls)[0])


def reference_defaults(cls: type) -> dict[str, Any]:
    """The reference's defaults of the class ``cls`` stands for ({} when it has no reference counterpart)."""
    for base in cls.__mro__:
        name = REFERENCE_NAMES.get(base.__name__, base.__name__)
        if name in DEFAULTS:
            return DEFAULTS[name]
    return {}


def translate(cls: type, kwargs: dict[str, Any], fields: set[str]) -> dict[str, Any]:
    """Our constructor keywords for ``cls`` from ``kwargs``, which may use the reference's field names.

    Unchanged when none of them is a reference-only field and ``cls`` is not a reference-path class. Else the
    reference's defaults fill every field the caller left unset, each reference field is converted by its
    :class:`Rule`, and the reference-style settings of our own fields apply unless the caller gave them.
    """
    rules, mode = rules_for(cls)
    reference_only = [k for k in kwargs if k in rules and k not in fields]
    forced = bool(getattr(cls, "reference_style", False))
    if not reference_only and not forced:
        return kwargs
    defaults = reference_defaults(cls)
    given_ours = {k for k in kwargs if k in fields}
    merged = dict(kwargs)
    for key, value in defaults.items():
        rule = rules.get(key)
        sets = rule.sets if rule is not None else (key, ALIASES.get(key, key))
        if key not in kwargs and not (set(sets) - {"rl_args"}) & given_ours:
            merged[key] = value
    out: dict[str, Any] = {}
    from_rules: set[str] = set()
    for key, value in merged.items():
        rule = rules.get(key)
        if rule is None:  # ours, or unknown to both (then the constructor names it with its suggestion)
            out[key] = {**out.get(key, {}), **value} if key == "rl_args" and isinstance(value, dict) else value
            continue
        converted = rule.convert(value, merged)
        if key in kwargs:
            _note(cls.__name__, key, value, rule.note, converted)
        for k, v in converted.items():
            if k == "rl_args":  # stage 3's settings add up, the caller's own rl_args win key by key (below)
                out[k] = {**out.get(k, {}), **v}
                continue
            if k != key and k in given_ours:
                if key in kwargs and kwargs[k] != v:
                    raise ConfigError(
                        f"{cls.__name__}: {key}={value!r} (a reference field) means {k}={v!r}, but {k}={kwargs[k]!r} "
                        "is given too; set only one of them."
                    )
                out[k] = kwargs[k]
                continue
            out[k] = v
            from_rules.add(k)
    for key, value in mode.items():  # unless the caller or a reference field set it
        if key not in given_ours and key not in from_rules:
            out[key] = value
    if "rl_args" in kwargs and "rl_args" in out:  # the caller's own rl_args win, key by key
        out["rl_args"] = {**out["rl_args"], **kwargs["rl_args"]}
    if ("style", cls.__name__) not in _logged:
        _logged.add(("style", cls.__name__))
        unset = sorted(k for k in defaults if k not in kwargs)
        log.info(
            "%s: a config in the style of %s (%s): the fields left unset take its defaults (%s), and its loss "
            "and optimizer (%s); docs/migration.md lists every difference",
            cls.__name__,
            REFERENCE,
            ", ".join(reference_only) if reference_only else "its import path",
            ", ".join(unset) or "none",
            ", ".join(f"{k}={v!r}" for k, v in mode.items()) or "ours",
        )
    return out


def _note(cls_name: str, key: str, value: Any, note: str, converted: dict) -> None:
    if (cls_name, key) in _logged:
        return
    _logged.add((cls_name, key))
    became = ", ".join(f"{k}={v!r}" for k, v in converted.items()) or "nothing"
    log.info("%s: %s=%r (%s) %s: %s", cls_name, key, value, REFERENCE, note, became)
