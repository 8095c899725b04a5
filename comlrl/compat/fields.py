"""The reference library's config fields, translated onto ours with the reference's meaning.

A config imported from one of the reference's paths (:data:`REFERENCE_PATHS`: :mod:`comlrl.trainers.reinforce`,
:mod:`comlrl.trainers.actor_critic`, :mod:`comlrl.trainers.preference`) is a *compat-style* config: it takes the
reference's field names, and the fields it leaves unset take the reference's defaults (its temperature 0.6, its
early termination, its undiscounted tree returns, its loss and optimizer), so that the script trains as its author
expects. Our own fields can be mixed in and win over a reference default that would set the same thing. Its
reference-only fields read back as given, or as the reference's default (:func:`compat_values`).

Our own configs (``from comlrl import MAGRPOConfig``) keep our meaning: a reference-only field given to one is
refused with the import path that takes it (:func:`explain_compat_field`, which this module adds to
:data:`comlrl.errors.FIELD_EXPLAINERS`: our configs know no reference name).

:func:`translate` is called by the constructor of every compat-style config, before our own constructor
(:func:`comlrl.compat.configs.compat_style`). The mapping is in :mod:`.rules` (a rule per reference field) and
:mod:`.defaults` (the reference's defaults); ``tests/e2e/test_compat.py`` fails when one of them drifts from our configs
or from the reference's field lists.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Any

from ..errors import FIELD_EXPLAINERS, ConfigError
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
    RUN_MODE,
    Rule,
    SameAs,
)

log = logging.getLogger("comlrl.compat")

# by our base class name: whose rules and compat-style settings a config takes (most derived last)
FAMILIES: dict[str, tuple[dict[str, Rule], dict[str, Any]]] = {
    "TrainConfig": (COMMON, RUN_MODE),
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
    """The translation rules and compat-style settings of config class ``cls`` (merged along its bases)."""
    rules: dict[str, Rule] = {}
    mode: dict[str, Any] = {}
    for base in reversed(cls.__mro__):
        family = FAMILIES.get(base.__name__)
        if family is not None and base.__module__.startswith("comlrl."):
            rules.update(family[0])
            mode.update(family[1])
    return rules, mode


def compat_fields(cls: type) -> list[str]:
    """The reference's field names that config class ``cls`` translates."""
    return list(rules_for(cls)[0])


def compat_defaults(cls: type) -> dict[str, Any]:
    """The reference's defaults of the class ``cls`` stands for ({} when it has no reference counterpart)."""
    for base in cls.__mro__:
        name = REFERENCE_NAMES.get(base.__name__, base.__name__)
        if name in DEFAULTS:
            return DEFAULTS[name]
    return {}


# by our base class name: the reference's import path whose configs take the reference's field names
REFERENCE_PATHS = {
    **dict.fromkeys(
        ("MAGRPOConfig", "MAREINFORCEConfig", "MAReMaxConfig", "MARLOOConfig", "CentralizedMAGRPOConfig"),
        "comlrl.trainers.reinforce",
    ),
    **dict.fromkeys(("ActorCriticConfig", "IACConfig", "MAACConfig"), "comlrl.trainers.actor_critic"),
    **dict.fromkeys(("PreferenceConfig", "MADPOConfig", "MARLHFConfig"), "comlrl.trainers.preference"),
}


def _reference_home(cls: type, key: str) -> tuple[str, str, Rule] | None:
    """(the reference's class name, its import path, the rule) of reference field ``key`` for our config ``cls``;
    None when no reference config of that family has the field."""
    path = next((REFERENCE_PATHS[b.__name__] for b in cls.__mro__ if b.__name__ in REFERENCE_PATHS), None)
    if path is None:
        return None
    rules, _ = rules_for(cls)
    if key in rules:
        return REFERENCE_NAMES.get(cls.__name__, cls.__name__), path, rules[key]
    if key in ITERATIVE and any(b.__name__ == "MADPOConfig" for b in cls.__mro__):
        return "MADPOIterConfig", path, ITERATIVE[key]
    return None


def explain_compat_field(cls: type, key: str) -> str | None:
    """Why ``key``, unknown to our config class ``cls``, is refused when it is a reference-only field (one without
    the reference's meaning here): the import path whose config takes it and our field that does the same. None
    for any other name, and for a compat-style class (it translates the reference's fields itself)."""
    if getattr(cls, "compat_style", False):
        return None
    home = _reference_home(cls, key)
    if home is None:
        return None
    name, path, rule = home
    ours = [k for k in rule.sets if k != "rl_args"] or list(rule.sets)
    instead = f", or use our {' / '.join(ours)}" if ours else f" ({rule.note})"
    return (
        f"{cls.__name__}: {key} is a field of the reference library's {name}: import it from {path}{instead}. "
        "docs/migration.md maps each reference field onto ours."
    )


FIELD_EXPLAINERS.append(explain_compat_field)


def compat_values(cls: type, kwargs: dict[str, Any], fields: set[str]) -> dict[str, Any]:
    """The reference-only fields of compat-style config ``cls``: the value given in ``kwargs``, else the
    reference's default (a reference name that is also a field of ours is left out: ours is read)."""
    rules, _ = rules_for(cls)
    values = {k: v for k, v in compat_defaults(cls).items() if k not in fields}
    values.update((k, v) for k, v in kwargs.items() if k in rules and k not in fields)
    return values


def translate(cls: type, kwargs: dict[str, Any], fields: set[str]) -> dict[str, Any]:
    """Our constructor keywords for ``cls`` from ``kwargs``, which may use the reference's field names.

    Unchanged when ``cls`` is not a reference-path class. Else the reference's defaults fill every field the
    caller left unset, each reference field is converted by its :class:`Rule`, and the compat-style settings of
    our own fields apply unless the caller gave them.
    """
    if not getattr(cls, "compat_style", False):
        return kwargs
    rules, mode = rules_for(cls)
    reference_only = [k for k in kwargs if k in rules and k not in fields]
    defaults = compat_defaults(cls)
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
            _note(cls.__name__, key, value, note=rule.note, converted=converted)
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
            out[key] = _field_value(cls, out, value.field) if isinstance(value, SameAs) else value
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


def _field_value(cls: type, out: dict[str, Any], name: str) -> Any:
    """Field ``name`` of ``cls`` as translated into ``out``, else its default."""
    if name in out:
        return out[name]
    return next(f.default for f in dataclasses.fields(cls) if f.name == name)


def _note(cls_name: str, key: str, value: Any, *, note: str, converted: dict) -> None:
    if (cls_name, key) in _logged:
        return
    _logged.add((cls_name, key))
    became = ", ".join(f"{k}={v!r}" for k, v in converted.items()) or "nothing"
    log.info("%s: %s=%r (%s) %s: %s", cls_name, key, value, REFERENCE, note, became)
