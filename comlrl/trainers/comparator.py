"""MADPO's comparator side: the API endpoint's client from the config, a centralized completion split into one answer
per role, and the team's parameters at the start of rounds, which a lagged comparator answers with."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import Any, Iterator

import torch

from ..algorithms.preference import CentralizedComparatorAdapter
from ..engine.api_client import APIClient
from ..errors import CentralizedComparatorParseError, ConfigError
from ..rollout.agent import Agent


def comparator_client(args: Any) -> APIClient:
    """comparator='api': the endpoint's client, its key read from the variable comparator_api_key_env names."""
    a, key = args, None
    if a.comparator_api_key_env:
        key = os.environ.get(a.comparator_api_key_env)
        if not key:
            raise ConfigError(
                f"MADPOConfig.comparator_api_key_env: the environment variable {a.comparator_api_key_env} is not "
                "set (or empty); export the API key in it, or set comparator_api_key_env=None for an endpoint "
                "without a key."
            )
    return APIClient(
        url=a.comparator_api_url,
        fmt=a.comparator_api_format,
        model=a.comparator_api_model,
        key=key,
        timeout=a.comparator_api_timeout,
        max_n_per_request=a.comparator_api_max_n_per_request,
        extra_body=a.comparator_api_extra_body,
        headers=a.comparator_api_headers,
        concurrency=a.comparator_api_concurrency,
    )


def split_roles(adapter: CentralizedComparatorAdapter, text: str, row: dict, num_agents: int) -> list[str] | None:
    """One answer per agent from a centralized completion, None when the adapter cannot parse it."""
    n = num_agents
    try:
        outputs = adapter.parse_completion(text, row, n)
    except CentralizedComparatorParseError:
        return None
    if isinstance(outputs, (str, bytes)) or len(outputs) != n or not all(isinstance(o, str) for o in outputs):
        raise ConfigError(
            f"centralized_comparator_adapter.parse_completion must return {n} strings (one per agent), got "
            f"{str(outputs)[:120]!r}."
        )
    return list(outputs)


def snapshot_path(folder: Path, round_index: int) -> Path:
    """Where the team's parameters at the start of round ``round_index`` are kept on disk."""
    return folder / f"team-round-{round_index:05d}.pt"


def save_snapshot(agents: list[Agent], folder: Path, round_index: int) -> list[list[torch.Tensor]]:
    """Every agent's trained parameters, copied to the CPU and written atomically to :func:`snapshot_path`."""
    params = [[p.detach().to("cpu", copy=True) for p in a.params] for a in agents]
    path = snapshot_path(folder, round_index)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    torch.save(params, tmp)
    os.replace(tmp, path)
    return params


def drop_snapshots(snapshots: dict[int, Any], folder: Path, keep: set[int] | list[int]) -> None:
    """Forget the rounds not in ``keep``, in ``snapshots`` and on disk."""
    for r in [r for r in snapshots if r not in keep]:
        del snapshots[r]
    for path in folder.glob("team-round-*.pt"):
        r = path.stem.removeprefix("team-round-")
        if r.isdigit() and int(r) not in keep:
            path.unlink(missing_ok=True)


@contextlib.contextmanager
def swapped_parameters(agents: list[Agent], saved: list[list[torch.Tensor]]) -> Iterator[None]:
    """Inside the block every agent's trained parameters are ``saved``; restored after."""
    backup = [[p.detach().clone() for p in a.params] for a in agents]
    # copied in place under no_grad (not through .data): that raises the parameters' version counters, by which
    # a vLLM engine knows to push the comparator's weights, and the trained ones again after
    try:
        with torch.no_grad():
            for a, params in zip(agents, saved):
                for p, q in zip(a.params, params):
                    p.copy_(q)
        yield
    finally:
        with torch.no_grad():
            for a, params in zip(agents, backup):
                for p, q in zip(a.params, params):
                    p.copy_(q)
