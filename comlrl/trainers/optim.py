"""The optimizer step every update ends with (the policy's, the critic's, DPO's and the reward model's): the gradients'
norm, clipping, the optimizer's step, the schedule's step and the gradients cleared."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from ..parallel import sharding
from ..parallel.sharding import is_shard


@dataclass
class OptimizerStep:
    """What one step reports: the gradients' total 2-norm before clipping and the learning rate of the next step."""

    grad_norm: float
    lr: float


def optimizer_step(
    *,
    optimizer: torch.optim.Optimizer,
    params: list[torch.Tensor],
    max_grad_norm: float | None,
    scheduler: Any = None,
) -> OptimizerStep:
    """Clip the gradients of ``params`` to total norm ``max_grad_norm`` (None, 0 or below: no clipping), step the
    optimizer, then ``scheduler`` (when given), and set the gradients to None.

    FSDP shards (DTensors) count with their whole tensor: a shard's norm is combined over its mesh, and a mix of
    sharded and whole parameters (a sharded critic's value head) is clipped over all of them at once.
    """
    clip = max_grad_norm if max_grad_norm and max_grad_norm > 0 else None
    shards = sum(1 for p in params if is_shard(p))
    if 0 < shards < len(params):  # torch's norm cannot stack a DTensor's norm with a tensor's
        norm = sharding.clip_grad_norm_(params, clip)
    elif clip is not None:
        norm = torch.nn.utils.clip_grad_norm_(params, clip)
    else:
        norm = torch.nn.utils.get_total_norm([p.grad for p in params if p.grad is not None])
    norm = float(norm.full_tensor() if is_shard(norm) else norm)
    optimizer.step()
    if scheduler is not None:
        scheduler.step()
    optimizer.zero_grad(set_to_none=True)
    lr = scheduler.get_last_lr()[0] if scheduler is not None else optimizer.param_groups[0]["lr"]
    return OptimizerStep(norm, lr)
