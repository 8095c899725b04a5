"""Training-forward log-probs: each completion token's log-prob under an agent (or several agents' LoRA adapters on
one base), as the loss and the KL reference score it."""

from __future__ import annotations

import contextlib
import itertools
from typing import Iterator

import torch
import torch.nn.functional as F
from torch import nn
from transformers import PreTrainedModel

from ..accel.attention import slot_attention, slot_attention_fits, slot_layout, training_attention
from ..accel.head import contiguous_head_input, head_logprobs
from ..accel.lean import lean_layers
from ..accel.llama_decoder import LLAMA_LAYOUTS, additive_mask
from ..accel.packing import shared_prompt_layout
from ..accel.sampler import SamplerSettings, completion_sampler_logprobs
from ..accel.shapes import pad_tokens
from ..algorithms.losses import token_entropy, token_logprobs
from .models import unwrap_peft
from .team import fused_lora_forward, routed_adapters


def completion_logprobs(
    model: PreTrainedModel,
    prompt_ids: torch.Tensor,
    prompt_mask: torch.Tensor,
    completion_ids: torch.Tensor,
    completion_mask: torch.Tensor,
    *,
    row_adapters: list[str] | None = None,
    temperature: float = 1.0,
    sampler: SamplerSettings | None = None,
    entropy: bool = False,
) -> torch.Tensor | tuple[torch.Tensor, ...]:
    """log p(completion token | prefix) for every completion position: (B, C), 0 where ``completion_mask`` is 0.
    Positions are taken from the mask. ``row_adapters`` (B,): each row's LoRA adapter on a shared base, rows of an
    adapter contiguous (see :func:`team_completion_logprobs`); None: the model as it is.

    ``temperature``: the policy scored is softmax(logits / temperature), the distribution a rollout at that
    temperature samples from before top-k / top-p truncation (as TRL scores it); truncation is not part of it.
    ``sampler``: also the same tokens' log-probs under what a rollout with these settings draws from (repetition
    penalty, temperature, top-k, top-p, renormalized: :func:`comlrl.accel.sampler.completion_sampler_logprobs`),
    from the same forward's logits, without gradient; returns (log-probs, sampler log-probs) then.
    ``entropy``: also the entropy of softmax(logits / temperature) at every completion position (B, C), without
    gradient, 0 where ``completion_mask`` is 0, from the logits this forward computes anyway; it comes last in the
    returned tuple: (log-probs, entropy) or (log-probs, sampler log-probs, entropy).

    Logits are computed for real completion tokens only, never the prompt's or padding: for models whose logits are
    a plain output projection of the decoder's last hidden state (Llama-layout), through
    :func:`comlrl.accel.head.head_logprobs` (logits kept in the matmul dtype up to 64 MB, recomputed in backward beyond
    that; fp32 softmax temporaries ~16 MB at a time); otherwise through the model's own head on the last C+1
    positions (``logits_to_keep``).
    """
    width = completion_ids.shape[1]
    # lengths in a few buckets: every new matmul shape costs a cached CPU kernel (comlrl.accel.shapes)
    prompt_ids, prompt_mask = pad_tokens(prompt_ids, prompt_mask, left=True)
    completion_ids, completion_mask = pad_tokens(completion_ids, completion_mask, left=False)
    ids = torch.cat([prompt_ids, completion_ids], dim=1)
    mask = torch.cat([prompt_mask, completion_mask], dim=1)
    # Left padding shifts positions; rebuild them from the mask exactly as generate() does.
    position_ids = (mask.cumsum(dim=1) - 1).clamp(min=0)
    parts = _decoder_and_head(model)
    names, slots = _adapter_slots(row_adapters, ids.device)
    with training_forward(model):
        if parts is None:
            with _routed(names, slots):
                logits = _completion_logits(
                    model, ids=ids, mask=mask, position_ids=position_ids, c=completion_ids.shape[1]
                )
            logp = _scored(logits, completion_ids, completion_mask, temperature)
            extra = []
            if entropy:
                with torch.no_grad():
                    extra.append(_entropy(logits, completion_mask, temperature)[:, :width])
            if sampler is None:
                return (logp[:, :width], *extra) if extra else logp[:, :width]
            with torch.no_grad():
                detached = logits.detach()
                sampled = completion_sampler_logprobs(
                    lambda r, c: detached[r, c],
                    prompt_ids=prompt_ids,
                    prompt_mask=prompt_mask,
                    completion_ids=completion_ids,
                    completion_mask=completion_mask,
                    settings=sampler,
                    vocab=logits.shape[-1],
                )
            return (logp[:, :width], sampled[:, :width], *extra)
        decoder, head = parts
        states = _states_before_completion(
            model,
            decoder,
            prompt_ids=prompt_ids,
            prompt_mask=prompt_mask,
            completion_ids=completion_ids,
            mask=mask,
            position_ids=position_ids,
            names=names,
            slots=slots,
        )
    sampled = None
    if sampler is not None:
        with torch.no_grad():
            hidden = states.detach()
            sampled = completion_sampler_logprobs(
                lambda r, c: F.linear(hidden[r, c], head.weight, head.bias).float(),
                prompt_ids=prompt_ids,
                prompt_mask=prompt_mask,
                completion_ids=completion_ids,
                completion_mask=completion_mask,
                settings=sampler,
                vocab=head.weight.shape[0],
            )[:, :width]
    real = completion_mask.bool()
    states = states[real]  # (N, H): the state before each real completion token
    device_type = states.device.type
    dtype = torch.get_autocast_dtype(device_type) if torch.is_autocast_enabled(device_type) else head.weight.dtype
    logp = torch.zeros(completion_ids.shape, dtype=torch.float32, device=states.device)  # (B, C)
    bias = head.bias
    if temperature != 1.0:  # logits / T == (h / T) W^T + b / T
        states, bias = states / temperature, None if bias is None else bias / temperature
    scored = head_logprobs(states, head.weight, bias=bias, labels=completion_ids[real], dtype=dtype, entropy=entropy)
    extra = []
    if entropy:
        scored, ent = scored
        entropies = torch.zeros(completion_ids.shape, dtype=torch.float32, device=states.device)
        entropies[real] = ent.float()
        extra.append(entropies[:, :width])
    logp[real] = scored.float()
    out = (logp[:, :width], *([] if sampled is None else [sampled]), *extra)
    return out if len(out) > 1 else out[0]


def _states_before_completion(
    model: nn.Module,
    decoder: nn.Module,
    *,
    prompt_ids: torch.Tensor,
    prompt_mask: torch.Tensor,
    completion_ids: torch.Tensor,
    mask: torch.Tensor,
    position_ids: torch.Tensor,
    names: list[str] | None = None,
    slots: torch.Tensor | None = None,
) -> torch.Tensor:
    """The decoder's last hidden state before each completion token: (B, C, H).

    Rows that repeat a prompt (the G samples of a rollout) share its forward when :func:`shared_prompt_layout` finds
    that cheaper: one packed row per distinct prompt, [prompt, completion 1, ..., completion k], each completion
    attending to the prompt and to itself only. Same math as the separate rows; backward sums each shared prompt's
    gradient over its rows. ``names``/``slots``: each row's LoRA adapter (rows of different adapters never share).
    """
    config = getattr(decoder, "config", None)
    blocked = slot_attention_fits(decoder)
    layout = (
        shared_prompt_layout(
            prompt_ids,
            prompt_mask,
            completion_ids=completion_ids,
            completion_mask=mask[:, prompt_ids.shape[1] :],
            position_ids=position_ids,
            config=config,
            groups=slots,
            blocked=blocked,
        )
        if config is not None
        else None
    )
    if layout is None:
        with _routed(names, slots):
            hidden = decoder(
                input_ids=torch.cat([prompt_ids, completion_ids], dim=1),
                attention_mask=mask,
                position_ids=position_ids,
                use_cache=False,
            ).last_hidden_state
        return hidden[:, prompt_ids.shape[1] - 1 : -1]
    ids, positions, allowed, gather = layout
    bias = additive_mask(allowed, decoder.get_input_embeddings().weight.dtype)
    packed_slots = None
    if slots is not None:  # each packed row holds the rows of one adapter
        packed_slots = torch.empty(len(ids), dtype=slots.dtype, device=slots.device)
        packed_slots[gather[:, 0] // ids.shape[1]] = slots
    p, c = prompt_ids.shape[1], completion_ids.shape[1]
    blocks = contextlib.nullcontext()
    if blocked:
        blocks = slot_attention(decoder, slot_layout(bias, p, (ids.shape[1] - p) // c, c))
    with _routed(names, packed_slots), blocks:
        hidden = decoder(input_ids=ids, attention_mask=bias, position_ids=positions, use_cache=False).last_hidden_state
    return hidden.flatten(0, 1)[gather]  # (B, C, H)


def team_completion_logprobs(
    model: nn.Module,
    adapters: list[str],
    parts: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]],
    *,
    temperature: float = 1.0,
    sampler: SamplerSettings | None = None,
    entropy: bool = False,
) -> list[torch.Tensor] | list[tuple[torch.Tensor, ...]]:
    """:func:`completion_logprobs` of several agents' rows in one forward of their shared LoRA base, the rows of
    ``parts[i]`` = (prompt_ids, prompt_mask, completion_ids, completion_mask) through adapter ``adapters[i]`` whatever
    adapters are active. The same values (up to kernel rounding) as one call per agent with its adapter active; the
    base's fixed per-forward costs are paid once. Needs autocast and :func:`comlrl.engine.team.can_route`. Returns one
    (B_i, C_i) tensor per part; with ``sampler`` or ``entropy``, a tuple per part, ordered as
    :func:`completion_logprobs` returns them.
    """
    width_p = max(p[0].shape[1] for p in parts)
    width_c = max(p[2].shape[1] for p in parts)
    prompts = [pad_tokens(p[0], p[1], left=True, width=width_p) for p in parts]  # already bucketed widths
    completions = [pad_tokens(p[2], p[3], left=False, width=width_c) for p in parts]
    stacked = [torch.cat(column) for column in (*zip(*prompts), *zip(*completions))]
    rows = [name for name, p in zip(adapters, parts) for _ in range(len(p[0]))]
    out = completion_logprobs(
        model, *stacked, row_adapters=rows, temperature=temperature, sampler=sampler, entropy=entropy
    )
    columns = out if isinstance(out, tuple) else (out,)
    split, lo = [], 0
    for p in parts:
        n, c = p[2].shape
        split.append(tuple(x[lo : lo + n, :c] for x in columns))
        lo += n
    return split if len(columns) > 1 else [x for (x,) in split]


def _adapter_slots(
    row_adapters: list[str] | None, device: torch.device
) -> tuple[list[str] | None, torch.Tensor | None]:
    """(adapter names in order of first use, each row's index into them), or (None, None) without routing."""
    if row_adapters is None:
        return None, None
    index = {n: j for j, n in enumerate(dict.fromkeys(row_adapters))}
    names = list(index)
    slots = torch.tensor([index[n] for n in row_adapters], dtype=torch.long, device=device)
    if bool((slots.diff() < 0).any()):
        raise ValueError(f"row_adapters must list each adapter's rows together, got {row_adapters}")
    return names, slots


def _routed(names: list[str] | None, slots: torch.Tensor | None) -> contextlib.AbstractContextManager:
    """:func:`comlrl.engine.team.routed_adapters` over the contiguous row blocks of ``slots`` (sorted), or a no-op."""
    if slots is None:
        return contextlib.nullcontext()
    counts = torch.bincount(slots, minlength=len(names)).tolist()
    return routed_adapters([(n, end - k, end) for n, k, end in zip(names, counts, itertools.accumulate(counts)) if k])


def _decoder_and_head(model: nn.Module) -> tuple[nn.Module, nn.Linear] | None:
    """(decoder, output layer) when the model's logits are exactly ``head(decoder(...).last_hidden_state)``."""
    inner = unwrap_peft(model)
    config = getattr(inner, "config", None)
    if getattr(config, "model_type", None) not in LLAMA_LAYOUTS or getattr(config, "final_logit_softcapping", None):
        return None
    head = inner.get_output_embeddings() if hasattr(inner, "get_output_embeddings") else None
    decoder = inner.get_decoder() if hasattr(inner, "get_decoder") else None
    if type(head) is not nn.Linear or decoder is None or decoder is inner:
        return None  # e.g. a LoRA-wrapped head
    return decoder, head


def _logits_logprobs(
    model: PreTrainedModel,
    *,
    ids: torch.Tensor,
    mask: torch.Tensor,
    position_ids: torch.Tensor,
    completion_ids: torch.Tensor,
    completion_mask: torch.Tensor,
    temperature: float = 1.0,
) -> torch.Tensor:
    """completion_logprobs through the model's own logits (the last C+1 positions only), 0 on padding."""
    logits = _completion_logits(model, ids=ids, mask=mask, position_ids=position_ids, c=completion_ids.shape[1])
    return _scored(logits, completion_ids, completion_mask, temperature)


def _scored(
    logits: torch.Tensor, completion_ids: torch.Tensor, completion_mask: torch.Tensor, temperature: float
) -> torch.Tensor:
    """Each completion token's log-prob under softmax(logits / temperature): (B, C), 0 on padding."""
    if temperature != 1.0:
        logits = logits / temperature
    return token_logprobs(logits, completion_ids) * completion_mask


def _entropy(logits: torch.Tensor, completion_mask: torch.Tensor, temperature: float) -> torch.Tensor:
    """Each completion position's entropy of softmax(logits / temperature): (B, C), 0 on padding; one row of fp32
    temporaries at a time."""
    logits = logits.detach()
    if temperature != 1.0:
        logits = logits / temperature
    return torch.cat([token_entropy(row) for row in logits.split(1)]) * completion_mask


def _completion_logits(
    model: PreTrainedModel, *, ids: torch.Tensor, mask: torch.Tensor, position_ids: torch.Tensor, c: int
) -> torch.Tensor:
    """The model's own logits before each of the last ``c`` tokens (the last c+1 positions only): (B, c, V)."""
    with contiguous_head_input(model):
        logits = model(
            input_ids=ids, attention_mask=mask, position_ids=position_ids, logits_to_keep=c + 1, use_cache=False
        ).logits
    return logits[:, :-1, :]


@contextlib.contextmanager
def training_forward(model: nn.Module) -> Iterator[None]:
    """The forward of a training step (one that backward will run through): bf16 CPU attention run eagerly
    (:func:`training_attention`), LoRA deltas as one op (:func:`comlrl.engine.team.fused_lora_forward`) and Llama-layout
    layers that save fewer activations (:func:`comlrl.accel.lean.lean_layers`); each leaves models it does not fit alone."""
    with training_attention(model), fused_lora_forward(model), lean_layers(model):
        yield
