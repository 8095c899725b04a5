"""LoRA teams: agents that share one frozen base model, each with its own adapter.

With ``peft_config`` and agents built from the same source, the team holds **one** base in memory
and one adapter per agent (adapter ``agent_<i>``). Generation for all such agents runs as one batch
with per-sample adapter routing; each agent's loss is computed with its own adapter active, and its
optimizer holds only its adapter's parameters. Agents from distinct sources get a base each.
"""

from __future__ import annotations

import contextlib
import copy
import warnings
from contextvars import ContextVar
from typing import Any, Iterator

import torch
from transformers import PreTrainedModel

from ..accel.decode_weights import BASE_ADAPTER  # noqa: F401  (re-exported: an agent's rows through its bare base)
from .models import is_checkpointing
from .process import seeded


def adapter_name(agent: int) -> str:
    return f"agent_{agent}"


def wrap_lora(model: PreTrainedModel, peft_config: Any, adapter: str = "default") -> Any:
    """``peft.get_peft_model(model, peft_config, adapter_name=adapter)`` without the FutureWarning it makes
    transformers >= 5 print about ``is_gradient_checkpointing`` (PEFT reads the old name)."""
    from peft import get_peft_model

    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing.*", category=FutureWarning)
        return get_peft_model(model, peft_config, adapter_name=adapter)


def build_lora_team(
    models: list[PreTrainedModel],
    groups: list[int],
    peft_config: Any,
    *,
    agents: list[int] | None = None,
    seeds: list[int] | None = None,
) -> list[tuple[Any, str]]:
    """Wrap models with LoRA adapters; agents with the same group id share one PeftModel.

    models[i]: agent i's base (agents of a group pass the same base); groups[i]: its sharing group.
    agents: each model's agent index (default 0, 1, ...; a torchrun process holds only some agents).
    seeds: each adapter's random init runs under its own seed (the global RNG is restored after), so an agent's
    adapter does not depend on which other agents were built before it in this process.
    Returns (model, adapter name) per agent.
    """
    shared: dict[int, Any] = {}
    out = []
    for i, (model, group) in enumerate(zip(models, groups)):
        name = adapter_name(agents[i] if agents is not None else i)
        cfg = copy.deepcopy(peft_config)
        with seeded(seeds[i]) if seeds is not None else contextlib.nullcontext():
            if group not in shared:
                shared[group] = wrap_lora(model, cfg, name)
            else:
                shared[group].add_adapter(name, cfg)
        out.append((shared[group], name))
    return out


def adapter_weights(model: torch.nn.Module, name: str) -> list[torch.nn.Parameter]:
    """The weights of LoRA adapter ``name`` (its factors), as they are."""
    marker = f".{name}."
    return [p for n, p in model.named_parameters() if marker in n]


def adapter_parameters(model: torch.nn.Module, name: str | None) -> list[torch.nn.Parameter]:
    """Trainable parameters of one agent: its adapter's weights (kept in fp32 whatever the base's dtype), or every
    parameter when there is no adapter."""
    if name is None:
        return [p for p in model.parameters() if p.requires_grad]
    params = adapter_weights(model, name)
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
def trainable(params: list[torch.nn.Parameter]) -> Iterator[None]:
    """Inside the block every parameter in ``params`` requires grad; their flags are restored after."""
    flags = [p.requires_grad for p in params]
    for p in params:
        p.requires_grad_(True)
    try:
        yield
    finally:
        for p, flag in zip(params, flags):
            p.requires_grad_(flag)


@contextlib.contextmanager
def reference_mode(model: Any) -> Iterator[None]:
    """The frozen base behind a LoRA model (adapters disabled): the KL reference at no extra memory."""
    with model.disable_adapter():
        yield


class _LoRADelta(torch.autograd.Function):
    """base_out + scaling_j * (x A_j^T) B_j^T in ``dtype``, as one addmm per adapter j over its block of rows;
    the factors (fp32 masters) are cast per call.

    ``spans``: ((first, end), ...) rows of x's first dim that adapter j covers (rows outside every span get no delta);
    ``factors``: A_0, B_0, A_1, B_1, ... One adapter over the whole batch is ``spans=((0, N),)``.
    """

    @staticmethod
    def forward(
        ctx,
        base_out: torch.Tensor,
        x: torch.Tensor,
        spans: tuple[tuple[int, int], ...],
        scalings: tuple[float, ...],
        dtype: torch.dtype,
        *factors: torch.Tensor,
    ) -> torch.Tensor:
        per_row = x[:1].numel() // x.shape[-1] if x.shape[0] else 0  # tokens per first-dim row
        rows = [(lo * per_row, hi * per_row) for lo, hi in spans]
        x2 = x.reshape(-1, x.shape[-1]).to(dtype)  # (M, in)
        base2 = base_out.reshape(-1, base_out.shape[-1]).to(dtype)  # (M, out)
        casts = [f.to(dtype) for f in factors]  # (r, in), (out, r) per adapter
        xas = [x2[lo:hi] @ a.T for (lo, hi), a in zip(rows, casts[0::2])]  # (M_j, r)
        if rows == [(0, len(x2))]:
            out = torch.addmm(base2, xas[0], casts[1].T, alpha=scalings[0])
        else:
            out = base2.clone()
            for (lo, hi), xa, b, s in zip(rows, xas, casts[1::2], scalings):
                out[lo:hi].addmm_(xa, b.T, alpha=s)
        ctx.save_for_backward(x2, *xas, *casts)
        ctx.rows, ctx.scalings, ctx.x_shape, ctx.x_dtype = rows, scalings, x.shape, x.dtype
        ctx.weight_dtypes = [f.dtype for f in factors]
        return out.view(*base_out.shape[:-1], out.shape[-1])

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        x2, *rest = ctx.saved_tensors
        n = len(ctx.rows)
        xas, casts = rest[:n], rest[n:]
        g = grad.reshape(-1, grad.shape[-1]).to(x2.dtype)  # (M, out)
        covered = sum(hi - lo for lo, hi in ctx.rows) == len(x2)
        grad_x = (torch.empty_like if covered else torch.zeros_like)(x2)  # (M, in)
        grads = []
        for (lo, hi), xa, a, b, s in zip(ctx.rows, xas, casts[0::2], casts[1::2], ctx.scalings):
            gj = g[lo:hi]
            grad_xa = (gj @ b).mul_(s)  # (M_j, r)
            grads += [grad_xa.T @ x2[lo:hi], (gj.T @ xa).mul_(s)]  # dA (r, in), dB (out, r)
            torch.mm(grad_xa, a, out=grad_x[lo:hi])
        grads = [gr.to(dt) for gr, dt in zip(grads, ctx.weight_dtypes)]
        return grad, grad_x.view(ctx.x_shape).to(ctx.x_dtype), None, None, None, *grads


# Adapter blocks of the batch rows in a routed team forward (see routed_adapters); None outside one.
_ROUTES: ContextVar[tuple[tuple[str, int, int], ...] | None] = ContextVar("comlrl_lora_routes", default=None)


@contextlib.contextmanager
def routed_adapters(blocks: list[tuple[str, int, int]]) -> Iterator[None]:
    """Inside the block (and :func:`fused_lora_forward`), LoRA layers send the batch rows first:end of each
    (adapter, first, end) through that adapter alone, whatever adapters are active: several agents' rows in one
    forward of their shared base. Layers the fused delta cannot compute raise (check :func:`can_route` first)."""
    token = _ROUTES.set(tuple(blocks))
    try:
        yield
    finally:
        _ROUTES.reset(token)


def _fusable(layer: Any, name: str) -> bool:
    """Whether adapter ``name`` of a PEFT LoRA linear is a plain low-rank delta the fused op computes exactly."""
    return (
        type(layer.base_layer) is torch.nn.Linear
        and name not in getattr(layer, "lora_variant", {})
        and not layer.use_dora.get(name)
        and not getattr(layer, "lora_bias", {}).get(name)
        and isinstance(layer.lora_dropout[name], torch.nn.Identity)
    )


def can_route(model: torch.nn.Module, names: list[str]) -> bool:
    """Whether every LoRA layer of ``model`` can run :func:`routed_adapters` forwards for these adapters (plain
    LoRA linears, no dropout / DoRA / bias / variants, no merged adapters, no activation checkpointing)."""
    try:
        from peft.tuners.lora.layer import Linear, LoraLayer
    except ImportError:
        return False
    if is_checkpointing(model):
        return False
    for module in model.modules():
        if isinstance(module, LoraLayer):
            if type(module) is not Linear or module.merged:
                return False
            if not all(_fusable(module, n) for n in names if n in module.lora_A):
                return False
    return True


def _fused_lora_forward(original: Any) -> Any:
    def forward(self: Any, x: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
        device = x.device.type
        routes = _ROUTES.get()
        if routes is not None:
            return _routed_forward(self, x, routes, args, kwargs)
        names = list(self.active_adapters) if not self.disable_adapters and not self.merged else []
        name = names[0] if len(names) == 1 else None
        if (
            name is None
            or name not in self.lora_A
            or kwargs.get("adapter_names") is not None
            or args
            or not torch.is_autocast_enabled(device)
            or not _fusable(self, name)
        ):
            return original(self, x, *args, **kwargs)
        result = self.base_layer(x, **kwargs)
        return _LoRADelta.apply(
            result,
            x,
            ((0, x.shape[0]),),
            (self.scaling[name],),
            torch.get_autocast_dtype(device),
            self.lora_A[name].weight,
            self.lora_B[name].weight,
        )

    return forward


def _routed_forward(
    layer: Any, x: torch.Tensor, routes: tuple[tuple[str, int, int], ...], args: tuple, kwargs: dict
) -> torch.Tensor:
    """A LoRA linear's output with each block of rows through its own adapter (see :func:`routed_adapters`)."""
    device = x.device.type
    blocks = [(n, lo, hi) for n, lo, hi in routes if n in layer.lora_A]
    if (
        args
        or kwargs.get("adapter_names") is not None
        or not torch.is_autocast_enabled(device)
        or layer.merged
        or not all(_fusable(layer, n) for n, _, _ in blocks)
        or x.shape[0] != routes[-1][2]
    ):
        raise RuntimeError(
            f"routed LoRA forward: {type(layer).__name__} cannot route adapters {[r[0] for r in routes]} "
            f"over an input of shape {tuple(x.shape)} (autocast on? can_route(model)?)"
        )
    result = layer.base_layer(x, **kwargs)
    if not blocks:
        return result
    factors = [w for n, _, _ in blocks for w in (layer.lora_A[n].weight, layer.lora_B[n].weight)]
    return _LoRADelta.apply(
        result,
        x,
        tuple((lo, hi) for _, lo, hi in blocks),
        tuple(layer.scaling[n] for n, _, _ in blocks),
        torch.get_autocast_dtype(device),
        *factors,
    )


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
