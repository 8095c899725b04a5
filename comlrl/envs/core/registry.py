"""The registry of environments behind :func:`make`: every :class:`~.base.Env` subclass under its name, and the
single-agent form of any of them (:mod:`.single`)."""

from __future__ import annotations

import inspect
from typing import Any, Callable

from ...errors import ComlrlError, suggest
from .base import Env
from .single import SingleAgentEnv, check_format

ENVS: dict[str, type[Env]] = {}


def register(name: str, cls: type[Env] | None = None) -> Callable[[type[Env]], type[Env]] | type[Env]:
    """Register an :class:`Env` subclass under ``name`` (usable as a decorator). Names are unique."""

    def add(env_cls: type[Env]) -> type[Env]:
        if name in ENVS and ENVS[name] is not env_cls:
            raise ComlrlError(f"environment '{name}' is already registered ({ENVS[name].__name__}).")
        ENVS[name] = env_cls
        return env_cls

    return add(cls) if cls is not None else add


def list_envs() -> list[str]:
    """Names of the registered environments, sorted."""
    return sorted(ENVS)


def env_options(name: str) -> dict[str, Any]:
    """The keyword options (and their defaults) that ``make(name, ...)`` accepts besides num_agents."""
    cls = _lookup(name)
    params = inspect.signature(cls.__init__).parameters
    return {k: p.default for k, p in params.items() if k not in ("self", "num_agents") and p.kind is p.KEYWORD_ONLY}


def _lookup(name: str) -> type[Env]:
    if name not in ENVS:
        raise ComlrlError(
            f"unknown environment '{name}'.{suggest(name, list(ENVS))} Available: {', '.join(list_envs())}."
        )
    return ENVS[name]


def make(name: str, num_agents: int | None = None, *, format: str = "team", **options: Any) -> Env:
    """Build the environment ``name``; ``options`` are environment-specific.

    ``format``: ``"team"`` (default) builds it for ``num_agents`` agents (default 2); ``"single"`` builds the team
    (its default size) as one agent that writes every part, the team reward scoring ``split_single``'s parts
    (:mod:`.single`: the equal-budget control of a team; ``num_agents`` must be 1 or left out).
    """
    cls = _lookup(name)
    count = check_format(name, format, num_agents)
    valid = env_options(name)
    for key in options:
        if key not in valid:
            hint = suggest(key, list(valid))
            raise ComlrlError(
                f"environment '{name}': unknown option '{key}'.{hint} Options: {', '.join(sorted(valid)) or 'none'}."
            )
    if format == "single":
        return SingleAgentEnv(cls(**options))
    return cls(num_agents=count, **options)
