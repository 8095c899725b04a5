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

# fields of ours a reference-style config sets unless the caller gives them: the reference's loss and optimizer
REINFORCE_MODE = {"loss_type": "seq_sum", "max_grad_norm": 0.0, "weight_decay": 0.01}
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
REFERENCE_NAMES = {"MAREMAXConfig": "MAReMaxConfig"}  # our spelling -> the reference's

# by our base class name: whose rules and reference-style settings a config takes (most derived last)
FAMILIES: dict[str, tuple[dict[str, Rule], dict[str, Any]]] = {
    "TrainConfig": (COMMON, {}),
    "PolicyConfig": (POLICY, {}),
    "MAGRPOConfig": (REINFORCE, REINFORCE_MODE),
    "ActorCriticConfig": (ACTOR_CRITIC, ACTOR_CRITIC_MODE),
}

_logged: set[tuple[str, str]] = set()


def rules_for(cls: type) -> tuple[dict[str, Rule], dict[str, Any]]:
    """The translation rules and reference-style settings of config class ``cls`` (merged along its bases)."""
    rules: dict[str, Rule] = {}
    mode: dict[str, Any] = {}
    for base in reversed(cls.__mro__):
        family = FAMILIES.get(base.__name__)
        if family is not None and base.__module__ == "comlrl.config":
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
        if key not in kwargs and not (set(sets) & given_ours):
            merged[key] = value
    out: dict[str, Any] = {}
    for key, value in merged.items():
        rule = rules.get(key)
        if rule is None:  # ours, or unknown to both (then the constructor names it with its suggestion)
            out[key] = value
            continue
        converted = rule.convert(value, merged)
        if key in kwargs:
            _note(cls.__name__, key, value, rule.note, converted)
        for k, v in converted.items():
            if k != key and k in given_ours:
                if key in kwargs and kwargs[k] != v:
                    raise ConfigError(
                        f"{cls.__name__}: {key}={value!r} (a reference field) means {k}={v!r}, but {k}={kwargs[k]!r} "
                        "is given too; set only one of them."
                    )
                out[k] = kwargs[k]
                continue
            out[k] = v
    for key, value in mode.items():
        if key not in given_ours:
            out[key] = value
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
