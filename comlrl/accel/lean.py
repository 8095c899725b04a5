"""Lean training forward for Llama-layout decoders: RMSNorm, rotary embedding and SwiGLU MLP as autograd Functions
that save fewer activations than the eager ops they replace (same math).

Per token and layer, the eager ops save the norm's input and its normalised output (x2 norms), q, k and their
rotated halves, and the MLP's gate, silu(gate), up and product. The Functions save the norm's input and its
1/rms, nothing for the rotation, and gate and up only (the product is recomputed in backward, an elementwise op).
SmolLM2-135M, fp32 full fine-tune, 4 x 104 tokens: the loss forward's RSS rise went 0.75 -> 0.59 GB (measured), at
+1% loss-pass time.
"""

from __future__ import annotations

import contextlib
import importlib
from typing import Iterator

import torch
import torch.nn.functional as F
from torch import nn

from .modules import is_checkpointing, unwrap_peft

# model_type -> (modeling module, RMSNorm class, MLP class): classes whose forwards are the eager ops replaced here
_FAMILIES = {
    "llama": ("transformers.models.llama.modeling_llama", "LlamaRMSNorm", "LlamaMLP"),
    "mistral": ("transformers.models.mistral.modeling_mistral", "MistralRMSNorm", "MistralMLP"),
    "qwen2": ("transformers.models.qwen2.modeling_qwen2", "Qwen2RMSNorm", "Qwen2MLP"),
}


def _stats(x: torch.Tensor) -> torch.Tensor:
    """x in at least fp32 (the precision of the statistics)."""
    return x.to(torch.promote_types(x.dtype, torch.float32))


def _rms_norm_and_rstd(x: torch.Tensor, weight: torch.Tensor, eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(HF LlamaRMSNorm's output, 1 / rms(x) in fp32 or wider)."""
    xf = _stats(x)
    rstd = torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return weight * (xf * rstd).to(x.dtype), rstd


def rms_norm_values(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """HF LlamaRMSNorm's values, op for op (fp32 statistics, cast back before the weight, so results match it
    bitwise); no autograd bookkeeping of its own."""
    return _rms_norm_and_rstd(x, weight, eps)[0]


class _RMSNorm(torch.autograd.Function):
    """weight * (x / rms(x)).to(x.dtype), statistics in fp32; saves x and 1/rms."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        out, rstd = _rms_norm_and_rstd(x, weight, eps)
        ctx.save_for_backward(x, weight, rstd)
        return out

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        x, weight, rstd = ctx.saved_tensors
        normed = _stats(x) * rstd
        grad_weight = None
        if ctx.needs_input_grad[1]:
            grad_weight = (grad * normed.to(x.dtype)).reshape(-1, weight.shape[-1]).sum(0).to(weight.dtype)
        gn = _stats(grad * weight)  # d loss / d normed
        grad_x = rstd * (gn - normed * (gn * normed).mean(-1, keepdim=True))
        return grad_x.to(x.dtype), grad_weight, None


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """Llama RMSNorm, saving only its input and 1/rms for backward."""
    return _RMSNorm.apply(x, weight, eps)


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


class _Rotary(torch.autograd.Function):
    """x * cos + rotate_half(x) * sin; a rotation, so backward needs only cos and sin."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(cos, sin)
        ctx.x_dtype = x.dtype
        return x * cos + _rotate_half(x) * sin

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        cos, sin = ctx.saved_tensors
        # rotate_half is linear with transpose -rotate_half
        return (grad * cos - _rotate_half(grad * sin)).to(ctx.x_dtype), None, None


def apply_rotary(
    q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, unsqueeze_dim: int = 1
) -> tuple[torch.Tensor, torch.Tensor]:
    """Rotary position embedding of q and k (HF's ``apply_rotary_pos_emb``), saving only cos and sin."""
    cos, sin = cos.unsqueeze(unsqueeze_dim).detach(), sin.unsqueeze(unsqueeze_dim).detach()
    return _Rotary.apply(q, cos, sin), _Rotary.apply(k, cos, sin)


def _silu_grads(
    gate: torch.Tensor, up: torch.Tensor, grad_product: torch.Tensor, silu_gate: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """d/d gate and d/d up of silu(gate) * up, given d/d product (and silu(gate) if already computed)."""
    grad_product = grad_product.to(gate.dtype)
    silu_gate = F.silu(gate) if silu_gate is None else silu_gate
    return torch.ops.aten.silu_backward(grad_product * up, gate), grad_product * silu_gate


class _SwiGLU(torch.autograd.Function):
    """silu(gate) * up; saves gate and up."""

    @staticmethod
    def forward(ctx, gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(gate, up)
        return F.silu(gate) * up

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        gate, up = ctx.saved_tensors
        return _silu_grads(gate, up, grad)


class _SwiGLULinear(torch.autograd.Function):
    """F.linear(silu(gate) * up, weight, bias) in ``dtype``; saves gate and up, recomputes the product in backward."""

    @staticmethod
    def forward(
        ctx, gate: torch.Tensor, up: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, dtype: torch.dtype
    ) -> torch.Tensor:
        product = F.silu(gate) * up
        out = F.linear(product.to(dtype), weight.to(dtype), None if bias is None else bias.to(dtype))
        ctx.save_for_backward(gate, up, weight)
        ctx.dtype, ctx.has_bias = dtype, bias is not None
        ctx.bias_dtype = None if bias is None else bias.dtype
        return out

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        gate, up, weight = ctx.saved_tensors
        g2 = grad.reshape(-1, grad.shape[-1]).to(ctx.dtype)  # (M, H)
        silu_gate = F.silu(gate)
        grad_weight = grad_bias = None
        if ctx.needs_input_grad[2]:
            product = (silu_gate * up).reshape(-1, gate.shape[-1]).to(ctx.dtype)  # (M, I)
            grad_weight = (g2.T @ product).to(weight.dtype)
        if ctx.has_bias and ctx.needs_input_grad[3]:
            grad_bias = g2.sum(0).to(ctx.bias_dtype)
        grad_product = (g2 @ weight.to(ctx.dtype)).view(*gate.shape[:-1], weight.shape[1])
        grad_gate, grad_up = _silu_grads(gate, up, grad_product, silu_gate)
        return grad_gate, grad_up, grad_weight, grad_bias, None


def _mlp_forward(self: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """Llama MLP forward: down(silu(gate(x)) * up(x)) through the lean Functions."""
    gate, up = self.gate_proj(x), self.up_proj(x)
    down = self.down_proj
    if type(down) is nn.Linear:
        dtype = torch.get_autocast_dtype(x.device.type) if torch.is_autocast_enabled(x.device.type) else gate.dtype
        return _SwiGLULinear.apply(gate, up, down.weight, down.bias, dtype)
    return down(_SwiGLU.apply(gate, up))


def _norm_forward(self: nn.Module, x: torch.Tensor) -> torch.Tensor:
    return rms_norm(x, self.weight, self.variance_epsilon)


@contextlib.contextmanager
def lean_layers(model: nn.Module) -> Iterator[None]:
    """Inside the block, a Llama / Mistral / Qwen2 model's RMSNorm, rotary embedding and SiLU MLP save fewer
    activations for backward (see the module doc); other models, no-grad forwards and activation checkpointing (its
    recompute runs outside the block and must match) are left as they are."""
    inner = unwrap_peft(model)
    config = getattr(inner, "config", None)
    family = _FAMILIES.get(getattr(config, "model_type", None))
    if (
        family is None
        or not torch.is_grad_enabled()
        or is_checkpointing(inner)
        or getattr(config, "hidden_act", None) != "silu"
    ):
        yield
        return
    module = importlib.import_module(family[0])
    norm_cls, mlp_cls = getattr(module, family[1]), getattr(module, family[2])
    saved = [
        (norm_cls, "forward", norm_cls.forward),
        (mlp_cls, "forward", mlp_cls.forward),
        (module, "apply_rotary_pos_emb", module.apply_rotary_pos_emb),
    ]
    norm_cls.forward, mlp_cls.forward = _norm_forward, _mlp_forward
    module.apply_rotary_pos_emb = apply_rotary
    try:
        yield
    finally:
        for owner, name, value in saved:
            setattr(owner, name, value)
