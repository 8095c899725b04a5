"""What a torch module is: its device, the transformers model under a PEFT wrapper, whether it checkpoints."""

from __future__ import annotations

import torch


def model_device(model: torch.nn.Module) -> torch.device:
    """The device of a model's (first) parameters."""
    return next(model.parameters()).device


def unwrap_peft(model: torch.nn.Module) -> torch.nn.Module:
    """The transformers model under a PEFT wrapper (LoRA layers stay injected in it), else the model itself."""
    get_base = getattr(model, "get_base_model", None)
    return get_base() if callable(get_base) else model


def is_checkpointing(model: torch.nn.Module) -> bool:
    """Whether a (possibly PEFT-wrapped) transformers model recomputes its layers in backward (activation
    checkpointing)."""
    inner = unwrap_peft(model)
    flag = getattr(inner, "is_activation_checkpointing", None)  # transformers >= 5.x; older: is_gradient_checkpointing
    return bool(flag if flag is not None else getattr(inner, "is_gradient_checkpointing", False))
