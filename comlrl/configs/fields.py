"""How comlrl's config dataclasses are declared and checked: a field with its help text, a constructor that
refuses unknown fields (with the nearest valid name) and values of the wrong type for int / float / bool fields.

The configs themselves are the other modules of :mod:`comlrl.configs`.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import numbers
import typing
from dataclasses import dataclass, field
from typing import Any

from ..errors import ConfigError, explain_unknown_field, suggest


def help_field(default: Any, text: str, **kw: Any) -> Any:
    """A dataclass field with ``default`` and its help text (a fresh copy of a list / dict default per instance)."""
    if isinstance(default, (list, dict)):
        return field(default_factory=lambda: copy.deepcopy(default), metadata={"help": text, **kw})
    return field(default=default, metadata={"help": text, **kw})


_SCALARS = {"int": int, "float": float, "bool": bool, "None": type(None)}


def scalar_types(annotation: Any) -> frozenset | None:
    """The types a field annotated with int / float / bool / None only accepts ('float | None' -> {float, NoneType});
    None when the annotation names anything else (str, list, dict, Any, ...): such fields are not type-checked.
    Annotations are strings here (``from __future__ import annotations``); real types (subclasses) work too."""
    if isinstance(annotation, str):
        types = {_SCALARS.get(part.strip()) for part in annotation.split("|")}
    else:
        types = {a if a in _SCALARS.values() else None for a in typing.get_args(annotation) or (annotation,)}
    return None if None in types or types <= {type(None)} else frozenset(types)


def type_problem(name: str, value: Any, types: frozenset) -> str | None:
    """Why ``value`` does not fit a field of these scalar types, with the fix; None when it fits.

    Nothing is coerced: a string for a number field is refused, not parsed (run configs convert YAML's '1e-5'
    strings themselves, see runconfig._coerce_floats). A bool is not a number here, a float not an integer.
    """
    want_bool, want_int, want_float = bool in types, int in types, float in types
    expected = (
        "True, False or an integer"
        if want_bool and want_int
        else "True or False"
        if want_bool
        else "a number"
        if want_float
        else "an integer"
    )
    if value is None:
        return None if type(None) in types else f"{name}=None; pass {expected}."
    if isinstance(value, bool):
        return None if want_bool or not (want_int or want_float) else f"{name}={value!r} is a bool; pass {expected}."
    if isinstance(value, numbers.Integral):
        return None if want_int or want_float or value in (0, 1) else f"{name}={value!r}; pass {expected}."
    if isinstance(value, numbers.Real):
        if want_float:
            return None
        fix = f": {name}={int(value)}" if want_int and float(value).is_integer() else ""
        return f"{name}={value!r} is a float; pass {expected}{fix}."
    if isinstance(value, str):
        text = value.strip()
        try:
            number = float(text)
        except ValueError:
            number = None
        fix = ""
        if want_float and number is not None:
            fix = f": {name}={text}"
        elif want_int and number is not None and number.is_integer():
            fix = f": {name}={int(number)}"
        elif want_bool and text.lower() in ("true", "false"):
            fix = f": {name}={text.lower() == 'true'} (as a string, 'false' would count as true)"
        return f"{name}={value!r} is a string; pass {expected}{fix}."
    return f"{name}={value!r:.60} is a {type(value).__name__}; pass {expected}."


def own_field(config: Any, name: str, default: Any) -> Any:
    """``config``'s own dataclass field ``name``, or ``default`` when its class has none (a compat-style config's
    reference-only fields read back as attributes too, with the reference's meaning: never read them as ours)."""
    return getattr(config, name) if any(f.name == name for f in dataclasses.fields(config)) else default


def config_class(cls: type) -> type:
    """Make ``cls`` a dataclass whose constructor rejects unknown fields with a suggestion, and values of the wrong
    type for its int / float / bool fields (e.g. learning_rate='1e-4') with the value to pass instead.

    An unknown field that an explainer of :data:`comlrl.errors.FIELD_EXPLAINERS` knows is refused with its message
    (the compat layer's: the import path whose config takes the reference library's field)."""
    cls = dataclass(cls, kw_only=True)
    init = cls.__init__
    names = [f.name for f in dataclasses.fields(cls)]
    init_names = [f.name for f in dataclasses.fields(cls) if f.init]
    checked = {f.name: t for f in dataclasses.fields(cls) if (t := scalar_types(f.type)) is not None}

    @functools.wraps(init)
    def checked_init(self: Any, *args: Any, **kwargs: Any) -> None:
        unknown = [key for key in kwargs if key not in names]
        for key in unknown:
            explained = explain_unknown_field(type(self), key)
            if explained is not None:
                raise ConfigError(explained)
        if unknown:
            raise ConfigError(f"{cls.__name__}: unknown field '{unknown[0]}'.{suggest(unknown[0], names)}")
        for key, value in {**dict(zip(init_names, args)), **kwargs}.items():
            problem = type_problem(key, value, checked[key]) if key in checked else None
            if problem is not None:
                raise ConfigError(f"{cls.__name__}.{problem}")
        # the fields the caller gave, so that aliases can tell a value given from a default (``_merge_alias``)
        object.__setattr__(self, "_given_fields", frozenset(kwargs) | frozenset(init_names[: len(args)]))
        init(self, *args, **kwargs)

    cls.__init__ = checked_init
    return cls
