"""BFCL's argument checker (its Python AST checker, ``simple_function_checker``, ported) for :mod:`.bfcl`.

A value matches when it is one of the possible answer's alternatives (strings compared without case, spaces and
``,./-_*^``; ints accepted for floats; lists and dicts element-wise); an argument whose alternatives include ``""``
may be omitted; a missing required argument or one the answer does not list is wrong. A test runs BFCL's own
checker on perturbed answers of every packaged row and requires the same verdicts.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

PY_TYPES = {
    "string": str,
    "integer": int,
    "float": float,
    "boolean": bool,
    "array": list,
    "tuple": list,
    "dict": dict,
    "any": str,
}


def standardize_string(text: str) -> str:
    """BFCL's string normalisation: drop spaces and ``,./-_*^``, lower-case, ``'`` -> ``"``."""
    return re.sub(r"[ \,\.\/\-\_\*\^]", "", text).lower().replace("'", '"')


def _std(value: Any) -> Any:
    return standardize_string(value) if type(value) is str else value


def _type_check(value: Any, possible: list, expected: type | None, nested: type | None) -> tuple[bool, bool]:
    """(type ok, is a 'variable'): BFCL's ``type_checker``."""
    answer_type = next((type(a) for a in possible if not (type(a) is str and a == "")), None)
    is_variable = answer_type is not None and answer_type is not expected
    if expected is not None and type(value) is expected:
        if nested is None:
            return True, is_variable
        for item in possible:
            ok = True
            if type(item) is list:
                ok = all(_type_check(v, item, nested, None)[0] for v in value)
            if ok:
                return True, is_variable
        return False, False
    if answer_type is not None and type(value) is answer_type:
        return True, True
    return False, False


def _list_check(value: list, possible: list) -> bool:
    model = [_std(v) for v in value]
    alternatives = [[_std(x) for x in alt] for alt in possible if isinstance(alt, (list, tuple, str))]
    return model in alternatives


def _dict_check(value: dict, possible: list) -> bool:
    for alt in possible:
        if not isinstance(alt, dict):
            continue
        ok = all(key in alt and _std(v) in [_std(x) for x in alt[key]] for key, v in value.items())
        if ok and all(key in value or "" in vals for key, vals in alt.items()):
            return True
    return False


def _list_dict_check(value: list, possible: list) -> bool:
    for alt in possible:
        if isinstance(alt, (list, str)) and len(alt) == len(value):
            if all(isinstance(v, dict) and _dict_check(v, [a]) for v, a in zip(value, alt)):
                return True
    return False


def check_value(value: Any, possible: list, detail: dict) -> str | None:
    """None when ``value`` matches one of ``possible`` (BFCL's semantics), else what is wrong."""
    type_name = detail.get("type")
    expected = PY_TYPES.get(type_name)
    nested = PY_TYPES.get((detail.get("items") or {}).get("type")) if type_name in ("array", "tuple") else None
    if type_name == "float" and type(value) is int:
        value = float(value)
    ok, is_variable = _type_check(value, possible, expected, nested)
    if expected is None:  # a type BFCL does not know: compare the value only
        ok, is_variable = True, False
    if not ok:
        return f"wrong type (expected {type_name})"
    if is_variable:
        ok = value in possible
    elif expected is dict:
        ok = _dict_check(value, possible)
    elif expected is list and nested is dict:
        ok = _list_dict_check(value, possible)
    elif expected is str or (expected is None and type(value) is str):
        ok = standardize_string(value) in [standardize_string(a) for a in possible if type(a) is str]
    elif expected is list:
        ok = _list_check(value, possible)
    else:
        ok = value in possible
    return None if ok else "wrong value"


@dataclass(frozen=True, kw_only=True)
class CallCheck:
    """One call against one needed call: accepted by BFCL, and the arguments right out of those considered."""

    valid: bool
    n_ok: int
    n_total: int
    errors: tuple[str, ...] = ()

    @property
    def score(self) -> float:
        """1 when accepted, else the fraction of arguments that are right."""
        return 1.0 if self.valid else (self.n_ok / self.n_total if self.n_total else 0.0)


def check_call(doc: dict | None, args: dict, possible: dict) -> CallCheck:
    """BFCL's ``simple_function_checker`` (Python) for a call whose name matches, argument by argument.

    The arguments considered: the function's required ones, the possible answer's and the call's. Each is
    right when given with a matching value, or omitted while optional (``""`` among its alternatives and
    not required). The call is accepted when all are right."""
    params = (doc or {}).get("parameters") or {}
    props = params.get("properties") or {k: {} for k in possible}
    required = list(params.get("required") or [])
    names = list(dict.fromkeys([*required, *possible, *args]))
    errors = []
    for name in names:
        if name in args:
            if name not in props or name not in possible:
                errors.append(f"unexpected argument '{name}'")
                continue
            problem = check_value(args[name], possible[name], props[name])
            if problem:
                errors.append(f"{problem} for '{name}'")
        elif name in required:
            errors.append(f"missing required argument '{name}'")
        elif name in possible and "" not in possible[name]:
            errors.append(f"missing argument '{name}'")
    return CallCheck(valid=not errors, n_ok=len(names) - len(errors), n_total=len(names), errors=tuple(errors))
