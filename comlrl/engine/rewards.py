"""Calling user reward functions and checking what they return.

Contract (spec §1): ``reward_func(*agent_completions, **kw) -> list[float]``; ``agent_completions[i]`` is
agent i's list of completions for the joint actions being scored; one finite team reward per joint action.
Keyword extras are passed only when the function accepts them (by name or ``**kwargs``):
``prompts`` (per-agent prompt lists), ``batch_items`` (the dataset rows), ``turn`` (1-based).

By default the function is called once per joint action (lists of length 1), which is what most
hand-written rewards expect. A function (or object) with ``batched = True`` is called once with all
joint actions of a step; built-in environments do this to run their sandboxed tests in parallel.
An object with a ``score(...)`` method returning dicts with ``"reward"`` and ``"level/..."`` keys
also reports per-level metrics.

The return value is always a sequence, even for one joint action: ``[1.0]``, not ``1.0`` or
``torch.tensor(1.0)``. A lone number or 0-d tensor/array is rejected with a message saying so, because
accepting it would make the same function fail as soon as it is marked ``batched``. A 1-d tensor or
array of the right length is accepted (each element is read with ``.item()``).
"""

from __future__ import annotations

import inspect
import math
import numbers
from typing import Any, Callable, Sequence

from ..errors import RewardError


def batched_reward(fn: Callable) -> Callable:
    """Mark ``fn`` as taking all joint actions of a step in one call."""
    fn.batched = True
    return fn


def accepted_kwargs(fn: Callable, candidates: dict[str, Any]) -> dict[str, Any]:
    """The subset of ``candidates`` that ``fn`` accepts by name (all of them if it takes ``**kwargs``)."""
    target = fn.score if hasattr(fn, "score") and not inspect.isfunction(fn) else fn
    try:
        params = inspect.signature(target).parameters.values()
    except (TypeError, ValueError):
        return {}
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params):
        return dict(candidates)
    names = {p.name for p in params if p.kind in (p.KEYWORD_ONLY, p.POSITIONAL_OR_KEYWORD)}
    return {k: v for k, v in candidates.items() if k in names}


def _to_float(value: Any, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        if hasattr(value, "item") and getattr(value, "ndim", getattr(value, "dim", lambda: 1)) in (0, ()):
            value = value.item()
        else:
            raise RewardError(f"{where}: reward must be a number, got {type(value).__name__} {value!r}.")
    value = float(value)
    if not math.isfinite(value):
        raise RewardError(f"{where}: reward is {value} (NaN/inf are not allowed; return a finite number).")
    return value


def _check(out: Any, expected: int, where: str) -> list:
    if isinstance(out, numbers.Number) or getattr(out, "ndim", None) == 0:  # float, numpy scalar, 0-d tensor/array
        what = "a number" if isinstance(out, numbers.Number) else f"a 0-d {type(out).__name__}"
        raise RewardError(
            f"{where}: reward_func returned {what} ({out!r:.60}); it must return a list with one float per joint "
            f"action ({expected} here), even for a single one: e.g. `return [float(r)]`."
        )
    if isinstance(out, (str, bytes)) or not isinstance(out, Sequence) and not hasattr(out, "__len__"):
        raise RewardError(f"{where}: reward_func must return a list of {expected} number(s), got {type(out).__name__}.")
    out = list(out)
    if len(out) != expected:
        raise RewardError(f"{where}: reward_func returned {len(out)} value(s) for {expected} joint action(s).")
    return out


def compute_rewards(
    reward_func: Callable,
    agent_completions: list[list[str]],
    *,
    prompts: list[list[str]],
    batch_items: list[dict],
    row_ids: list[int],
    turn: int = 1,
    processor: Callable[[float], float] | None = None,
) -> tuple[list[float], list[dict[str, float]]]:
    """Team reward of each joint action, plus per-level metrics when the function reports them.

    agent_completions[i][j], prompts[i][j]: agent i's completion/prompt in joint action j;
    batch_items[j], row_ids[j]: the dataset row (and its index) of joint action j.
    """
    n = len(batch_items)
    extras = {"prompts": prompts, "batch_items": batch_items, "turn": turn}
    kwargs = accepted_kwargs(reward_func, extras)
    if getattr(reward_func, "batched", False):
        raw, levels = _call(
            reward_func,
            agent_completions,
            kwargs=kwargs,
            n=n,
            where=f"reward_func (turn {turn}, rows {sorted(set(row_ids))})",
        )
    else:
        raw, levels = [], []
        for j in range(n):
            kw = {
                k: ([[p[j]] for p in v] if k == "prompts" else [v[j]] if k == "batch_items" else v)
                for k, v in kwargs.items()
            }
            r, lv = _call(
                reward_func,
                [[c[j]] for c in agent_completions],
                kwargs=kw,
                n=1,
                where=f"reward_func (joint action {j}, dataset row {row_ids[j]}, turn {turn})",
            )
            raw += r
            levels += lv
    rewards = []
    for j, value in enumerate(raw):
        where = f"reward_func (joint action {j}, dataset row {row_ids[j]}, turn {turn})"
        value = _to_float(value, where)
        if processor is not None:
            value = _to_float(processor(value), f"reward_processor on {where}")
        rewards.append(value)
    return rewards, levels


def _call(fn: Callable, completions: list[list[str]], *, kwargs: dict, n: int, where: str) -> tuple[list, list[dict]]:
    try:
        if hasattr(fn, "score"):
            scored = _check(fn.score(*completions, **kwargs), n, where)
            return [d["reward"] for d in scored], [{k: float(v) for k, v in d.items() if k != "reward"} for d in scored]
        return _check(fn(*completions, **kwargs), n, where), []
    except RewardError:
        raise
    except Exception as exc:  # a user function failed: stop and name where
        raise RewardError(f"{where} raised {type(exc).__name__}: {exc}") from exc
