"""The reference library's config fields, translated onto ours with the reference's meaning.

A config built with any field that only the reference has (``rollout_buffer_size``, ``advantage_normalization``,
...), or through a reference-only import path (:mod:`comlrl.trainers.reinforce`), is a *reference-style* config:
the fields it leaves unset take the reference's defaults (its temperature 0.6, its early termination, its
undiscounted tree returns, its loss and optimizer), so that the script trains as its author expects. Our own fields
can be mixed in and win over a reference default that would set the same thing.

:func:`translate` is called by every config constructor (:func:`comlrl.config_fields.config_class`). The mapping is
in :mod:`.rules` (a rule per reference field) and :mod:`.defaults` (the reference's defaults);
``tests/test_compat.py`` fails when one of them drifts from our configs or from the reference's field lists.
"""

from __future__ import annotations

import logging
from typing import Any

from ..errors import ConfigError
from . import REFERENCE
from .defaults import ALIASES, DEFAULTS, REFERENCE_NAMES
from .rules import (
    ACTOR_CRITIC,
    ACTOR_CRITIC_MODE,
    COMMON,
    ITERATIVE,
    MADPO,
    MADPO_MODE,
    MARLHF,
    MARLHF_MODE,
    POLICY,
    PREFERENCE,
    REINFORCE,
    REINFORCE_MODE,
    Rule,
)

log = logging.getLogger("comlrl.compat")

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
