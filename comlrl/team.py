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

from .models import is_checkpointing


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


class _LoRADelta(torch.autograd.Function):
    """base_out + scaling * (x A^T) B^T in ``dtype``, as one addmm; A, B (fp32 masters) are cast per call."""

    @staticmethod
    def forward(ctx, base_out: torch.Tensor, x: torch.Tensor, lora_a: torch.Tensor, lora_b: torch.Tensor,
                scaling: float, dtype: torch.dtype) -> torch.Tensor:
        a, b = lora_a.to(dtype), lora_b.to(dtype)  # (r, in), (out, r)
        x2 = x.reshape(-1, x.shape[-1]).to(dtype)  # (M, in)
        xa = x2 @ a.T  # (M, r)
        out = torch.addmm(base_out.reshape(-1, base_out.shape[-1]).to(dtype), xa, b.T, alpha=scaling)
        ctx.save_for_backward(x2, xa, a, b)
        ctx.scaling, ctx.x_shape, ctx.x_dtype = scaling, x.shape, x.dtype
        ctx.weight_dtypes = lora_a.dtype, lora_b.dtype
        return out.view(*base_out.shape[:-1], out.shape[-1])

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        x2, xa, a, b = ctx.saved_tensors
        g = grad.reshape(-1, grad.shape[-1]).to(a.dtype)  # (M, out)
        grad_xa = (g @ b).mul_(ctx.scaling)  # (M, r)
        grad_b = (g.T @ xa).mul_(ctx.scaling)  # (out, r)
        grad_a = grad_xa.T @ x2  # (r, in)
        grad_x = (grad_xa @ a).view(ctx.x_shape).to(ctx.x_dtype)
        return grad, grad_x, grad_a.to(ctx.weight_dtypes[0]), grad_b.to(ctx.weight_dtypes[1]), None, None


def _fused_lora_forward(original: Any) -> Any:
    def forward(self: Any, x: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
        names = list(self.active_adapters) if not self.disable_adapters and not self.merged else []
        name = names[0] if len(names) == 1 else None
        device = x.device.type
        if (name is None or name not in self.lora_A or kwargs.get("adapter_names") is not None or args
                or not torch.is_autocast_enabled(device) or type(self.base_layer) is not torch.nn.Linear
                or name in getattr(self, "lora_variant", {}) or self.use_dora.get(name)
                or getattr(self, "lora_bias", {}).get(name)
                or not isinstance(self.lora_dropout[name], torch.nn.Identity)):
            return original(self, x, *args, **kwargs)
        result = self.base_layer(x, **kwargs)
        return _LoRADelta.apply(result, x, self.lora_A[name].weight, self.lora_B[name].weight, self.scaling[name],
                                torch.get_autocast_dtype(device))
    return forward


@contextlib.contextmanager
def fused_lora_forward(model: torch.nn.Module) -> Iterator[None]:
    """Inside the block, PEFT LoRA linears under autocast add their delta with one fused op (same math as PEFT's
    ``result + lora_B(lora_A(x)) * scaling``, without its fp32 input copy, scaling multiply and add).

    Measured on SmolLM2-135M, r=16 all-linear on a bf16 base, 4 x 104 tokens: forward+backward ~10% faster. Layers it
    does not cover (several active adapters, DoRA, dropout > 0, no autocast, ...) run PEFT's own forward; so does
    everything under activation checkpointing (its backward recompute runs outside this block and must match).
    """
    try:
        from peft.tuners.lora.layer import Linear
    except ImportError:
        yield
        return
    if is_checkpointing(model) or not hasattr(model, "peft_config"):
        yield
        return
    original = Linear.forward
    Linear.forward = _fused_lora_forward(original)
    try:
        yield
    finally:
        Linear.forward = original
