"""LoRA teams: agents that share one frozen base model, each with its own adapter.

With ``peft_config`` and agents built from the same source, the team holds **one** base in memory
and one adapter per agent (adapter ``agent_<i>``). Generation for all such agents runs as one batch
with per-sample adapter routing; each agent's loss is computed with its own adapter active, and its
optimizer holds only its adapter's parameters. Agents from distinct sources get a base each.
"""

from __future__ import annotations

import contextlib
import copy
from typing import Any, Iterator

import torch
from transformers import PreTrainedModel


def adapter_name(agent: int) -> str:
    return f"agent_{agent}"


def build_lora_team(models: list[PreTrainedModel], groups: list[int], peft_config: Any,
                    agents: list[int] | None = None, seeds: list[int] | None = None) -> list[tuple[Any, str]]:
    """Wrap models with LoRA adapters; agents with the same group id share one PeftModel.

    models[i]: agent i's base (agents of a group pass the same base); groups[i]: its sharing group.
    agents: each model's agent index (default 0, 1, ...; a torchrun process holds only some agents).
    seeds: seed the RNG before each adapter's random init, so an agent's adapter does not depend on which
    other agents were built before it in this process.
    Returns (model, adapter name) per agent.
    """
    from peft import get_peft_model

    shared: dict[int, Any] = {}
    out = []
    for i, (model, group) in enumerate(zip(models, groups)):
        name = adapter_name(agents[i] if agents is not None else i)
        cfg = copy.deepcopy(peft_config)
        if seeds is not None:
            torch.manual_seed(seeds[i])
        if group not in shared:
            shared[group] = get_peft_model(model, cfg, adapter_name=name)
        else:
            shared[group].add_adapter(name, cfg)
        out.append((shared[group], name))
    return out


def adapter_parameters(model: torch.nn.Module, name: str | None) -> list[torch.nn.Parameter]:
    """Trainable parameters of one agent: its adapter's weights (kept in fp32 whatever the base's dtype), or every
    parameter when there is no adapter."""
    if name is None:
        return [p for p in model.parameters() if p.requires_grad]
    marker = f".{name}."
    params = [p for n, p in model.named_parameters() if marker in n]
    for p in params:
        if p.is_floating_point() and p.dtype != torch.float32:
            p.data = p.data.float()
        p.requires_grad_(True)
    return params


@contextlib.contextmanager
def active_adapter(model: Any, name: str | None) -> Iterator[None]:
    """Run the block with ``name`` as the model's active adapter (no-op without adapters)."""
    if name is None:
        yield
        return
    previous = model.active_adapter
    model.set_adapter(name)
    try:
        yield
    finally:
        if model.active_adapter != previous:
            model.set_adapter(previous)


@contextlib.contextmanager
def reference_mode(model: Any) -> Iterator[None]:
    """The frozen base behind a LoRA model (adapters disabled): the KL reference at no extra memory."""
    with model.disable_adapter():
        yield
