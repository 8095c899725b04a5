"""Batched generation for one agent: tokenize + left-pad prompts, sample G completions each, mask after EOS.

All prompts of a step x ``num_generations`` go through one ``generate`` call per agent.
"""

from __future__ import annotations

import contextlib
import itertools
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Iterator

import torch
from torch import nn
from transformers import LogitsProcessorList, PreTrainedModel, PreTrainedTokenizerBase

from .attention import slot_attention, slot_layout
from .fastgen import LLAMA_LAYOUTS, additive_mask, fast_generate, supports_fast_generate, window_exceeded
from .losses import head_logprobs, token_logprobs
from .models import is_checkpointing, model_device, unwrap_peft
from .sampling import RowSeededSampler
from .lean import lean_layers
from .shapes import pad_tokens
from .team import fused_lora_forward, routed_adapters


@dataclass
class Samples:
    """One agent's sampled completions for a batch of prompts (row k = prompt k // G, sample k % G)."""

    prompt_ids: torch.Tensor  # (B*G, P) left-padded
    prompt_mask: torch.Tensor  # (B*G, P)
    completion_ids: torch.Tensor  # (B*G, C) right-padded
    completion_mask: torch.Tensor  # (B*G, C) 1 up to and including the first EOS
    texts: list[str] = field(default_factory=list)
    truncated: torch.Tensor | None = None  # (B*G,) bool: hit max_new_tokens without EOS
    # (B*G, C) fp32: each completion token's log-prob under the policy that sampled it, as the rollout computed it
    # (``GenerationSettings.logprobs``; 0 on padding); None when not recorded
    rollout_logprobs: torch.Tensor | None = None

    def rows(self, lo: int, hi: int) -> "Samples":
        """Rows lo:hi (e.g. one agent's part of a batch generated for several agents)."""
        return self.select(slice(lo, hi))

    def select(self, rows: slice, prompt_cols: slice = slice(None), completion_cols: slice = slice(None)) -> "Samples":
        """The given rows, prompt columns and completion columns."""
        logp = None if self.rollout_logprobs is None else self.rollout_logprobs[rows, completion_cols]
        return Samples(self.prompt_ids[rows, prompt_cols], self.prompt_mask[rows, prompt_cols],
                       self.completion_ids[rows, completion_cols], self.completion_mask[rows, completion_cols],
                       self.texts[rows], None if self.truncated is None else self.truncated[rows], logp)


@dataclass
class GenerationSettings:
    """Sampling settings for one generate call."""

    max_new_tokens: int = 128
    do_sample: bool = True
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    max_prompt_length: int | None = None
    fast: bool = True  # use comlrl.fastgen's decode loop when the model supports it (else HF generate)
    concurrent: bool = True  # several models' calls decode at once on CPU (generate_concurrently)
    logprobs: bool = False  # record Samples.rollout_logprobs
    repetition_penalty: float = 1.0  # transformers' penalty on tokens already in the row (1: off)


def format_prompt(tokenizer: PreTrainedTokenizerBase, text: str, chat: bool) -> list[int]:
    """Token ids of a prompt: the raw text (with the tokenizer's usual special tokens) or a chat user turn."""
    if chat:
        if not getattr(tokenizer, "chat_template", None):
            raise ValueError(f"apply_chat_template=True but tokenizer {type(tokenizer).__name__} has no chat template")
        ids = tokenizer.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True, tokenize=True)
        if isinstance(ids, dict) or hasattr(ids, "keys"):
            ids = ids["input_ids"]
        return list(ids)
    return tokenizer(text, add_special_tokens=True)["input_ids"]


def left_pad(seqs: list[list[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(ids, mask) of shape (len(seqs), max_len), padded on the left."""
    width = max(max((len(s) for s in seqs), default=0), 1)
    ids = torch.full((len(seqs), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(seqs), width), dtype=torch.long)
    for i, s in enumerate(seqs):
        if s:
            ids[i, width - len(s):] = torch.tensor(s, dtype=torch.long)
            mask[i, width - len(s):] = 1
    return ids, mask


def eos_ids(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase) -> list[int]:
    """Every token id that ends a completion (tokenizer EOS plus the model's generation-config EOS ids)."""
    ids = set()
    if tokenizer.eos_token_id is not None:
        ids.add(int(tokenizer.eos_token_id))
    gen_eos = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    if gen_eos is not None:
        ids.update(int(i) for i in (gen_eos if isinstance(gen_eos, (list, tuple)) else [gen_eos]))
    return sorted(ids)


def completion_mask(completion_ids: torch.Tensor, stop_ids: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """Mask of generated tokens up to and including the first stop token, and whether each row was truncated.

    Padding after EOS is excluded even when pad == EOS: the mask comes from the *first* stop token.
    """
    is_stop = torch.isin(completion_ids, torch.tensor(stop_ids, device=completion_ids.device))
    c = completion_ids.shape[1]
    any_stop = is_stop.any(dim=1)
    first = torch.where(any_stop, is_stop.float().argmax(dim=1), torch.full_like(any_stop, c, dtype=torch.long))
    positions = torch.arange(c, device=completion_ids.device).unsqueeze(0)
    mask = (positions <= first.unsqueeze(1)).long()
    return mask, ~any_stop


@torch.no_grad()
def generate(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    prompts: list[str],
    num_generations: int,
    settings: GenerationSettings,
    chat: bool | list[bool] = False,
    autocast_dtype: torch.dtype | None = None,
    adapter_names: list[str] | None = None,
    row_seeds: list[int] | None = None,
) -> Samples:
    """Sample ``num_generations`` completions for every prompt in one batched ``generate`` call.

    ``chat`` and ``adapter_names`` may be given per prompt; adapter names route each row through
    its agent's LoRA adapter when several agents share one base model.
    ``row_seeds`` (one per output row, prompt-major): sample row k from its own RNG stream, so its tokens do not
    depend on the other rows of the batch (:mod:`comlrl.sampling`); None samples from the global RNG.
    """
    request = GenerationRequest(model, tokenizer, prompts, num_generations, settings, chat, autocast_dtype,
                                adapter_names, row_seeds)
    return generate_concurrently([request])[0]


@dataclass
class GenerationRequest:
    """The arguments of one :func:`generate` call."""

    model: PreTrainedModel
    tokenizer: PreTrainedTokenizerBase
    prompts: list[str]
    num_generations: int
    settings: GenerationSettings
    chat: bool | list[bool] = False
    autocast_dtype: torch.dtype | None = None
    adapter_names: list[str] | None = None
    row_seeds: list[int] | None = None


@torch.no_grad()
def generate_concurrently(requests: list[GenerationRequest]) -> list[Samples]:
    """:func:`generate` for several distinct models; on CPU their decodes run at once, one thread each, the cores
    split between them.

    Why: a decode step at rollout batch sizes is ~1/3 per-op Python/dispatch overhead (measured for SmolLM2-135M
    fp32 at batch 4: ~17 of ~50 ms), which one model's decode leaves the cores idle through; two models decoding
    side by side with one core each took 3.9 s against 4.6 s one after the other. Tokenizing and decoding text stay
    on the calling thread (a shared fast tokenizer is not safe to call concurrently). Requests sampling from the
    global RNG (no ``row_seeds``) run one after another, so their draws stay in a fixed order; so do all requests
    when any has ``settings.concurrent`` off.
    """
    jobs = [_encode(r) for r in requests]
    threads = torch.get_num_threads()
    concurrent = (len(requests) > 1 and threads >= 2 and all(r.settings.concurrent for r in requests)
                  and all(model_device(r.model).type == "cpu" for r in requests)
                  and all(r.row_seeds is not None or not r.settings.do_sample for r in requests))
    if not concurrent:
        completions = [_sample(r, job) for r, job in zip(requests, jobs)]
    else:
        workers = min(len(requests), threads)

        def run(pair: tuple[GenerationRequest, dict]) -> tuple[torch.Tensor, torch.Tensor | None]:
            torch.set_num_threads(max(threads // workers, 1))  # this thread's intra-op pool only
            with torch.no_grad():
                return _sample(*pair)

        with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="comlrl-rollout") as pool:
            completions = list(pool.map(run, zip(requests, jobs)))
    return [_finish(r, job, *out) for r, job, out in zip(requests, jobs, completions)]


def _encode(r: GenerationRequest) -> dict:
    """Tokenized, left-padded prompt rows (G per prompt) and the ``generate`` keyword arguments of a request."""
    chats = r.chat if isinstance(r.chat, list) else [r.chat] * len(r.prompts)
    encoded = [format_prompt(r.tokenizer, p, c) for p, c in zip(r.prompts, chats)]
    settings = r.settings
    if settings.max_prompt_length:
        encoded = [e[-settings.max_prompt_length:] for e in encoded]
    encoded = [e for e in encoded for _ in range(r.num_generations)]  # (B*G) rows, sample-major within a prompt
    pad_id = r.tokenizer.pad_token_id
    prompt_ids, prompt_mask = left_pad(encoded, pad_id)
    stop = eos_ids(r.model, r.tokenizer)
    kwargs = dict(max_new_tokens=settings.max_new_tokens, pad_token_id=pad_id, eos_token_id=stop, use_cache=True)
    if settings.repetition_penalty != 1.0:  # generate applies it before the logits processors (the sampler)
        kwargs["repetition_penalty"] = settings.repetition_penalty
    if settings.do_sample and r.row_seeds is not None:
        if len(r.row_seeds) != len(encoded):
            raise ValueError(f"row_seeds has {len(r.row_seeds)} seeds for {len(encoded)} rows")
        kwargs.update(do_sample=False, temperature=None, top_p=None, top_k=None)  # the sampler is a logits processor
    elif settings.do_sample:
        kwargs.update(do_sample=True, temperature=settings.temperature, top_p=settings.top_p, top_k=settings.top_k or None)
    else:
        kwargs.update(do_sample=False, temperature=None, top_p=None, top_k=None)
    if r.adapter_names is not None:
        kwargs["adapter_names"] = [a for a in r.adapter_names for _ in range(r.num_generations)]
    return dict(prompt_ids=prompt_ids, prompt_mask=prompt_mask, stop=stop, pad_id=pad_id, kwargs=kwargs)


def _sample(r: GenerationRequest, job: dict) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Completion ids (B*G, T) of an encoded request and, with ``settings.logprobs``, the sampled tokens' log-probs
    (B*G, T), on CPU; touches the model only (no tokenizer)."""
    model, settings, kwargs = r.model, r.settings, job["kwargs"]
    prompt_ids, prompt_mask, stop, pad_id = job["prompt_ids"], job["prompt_mask"], job["stop"], job["pad_id"]
    device = model_device(model)
    sampler = None
    if settings.do_sample and r.row_seeds is not None:
        sampler = RowSeededSampler(r.row_seeds, settings.temperature, settings.top_k, settings.top_p, device)
    if settings.fast and supports_fast_generate(model):
        return _fast(model, prompt_ids, prompt_mask, settings, stop, pad_id, r.autocast_dtype,
                     kwargs.get("adapter_names"), sampler, device)
    if sampler is not None:
        kwargs = dict(kwargs, logits_processor=LogitsProcessorList([sampler]))
    if settings.logprobs:
        kwargs = dict(kwargs, output_logits=True, return_dict_in_generate=True)
    was_training = model.training
    model.train(False)
    with torch.autocast(device.type, dtype=r.autocast_dtype or torch.bfloat16, enabled=r.autocast_dtype is not None):
        out = model.generate(input_ids=prompt_ids.to(device), attention_mask=prompt_mask.to(device), **kwargs)
    model.train(was_training)
    if not settings.logprobs:
        return out[:, prompt_ids.shape[1]:].cpu(), None
    ids = out.sequences[:, prompt_ids.shape[1]:]
    logits = torch.stack(out.logits, dim=1).float()  # (B, T, V) raw scores, before any warper
    return ids.cpu(), token_logprobs(logits / settings.temperature, ids).cpu()


def _finish(r: GenerationRequest, job: dict, completion_ids: torch.Tensor, logp: torch.Tensor | None) -> Samples:
    """Samples of a request from its completion ids (and log-probs): masked after the first stop id, padded,
    decoded to text."""
    stop, pad_id = job["stop"], job["pad_id"]
    if completion_ids.shape[1] == 0:
        completion_ids = torch.full((len(job["prompt_ids"]), 1), stop[0] if stop else pad_id, dtype=torch.long)
        logp = None if logp is None else torch.zeros(completion_ids.shape)
    mask, truncated = completion_mask(completion_ids, stop)
    completion_ids = torch.where(mask.bool(), completion_ids, torch.full_like(completion_ids, pad_id))
    texts = r.tokenizer.batch_decode(completion_ids * mask + pad_id * (1 - mask), skip_special_tokens=True)
    if logp is not None:
        logp = logp * mask
    return Samples(job["prompt_ids"], job["prompt_mask"], completion_ids, mask, texts, truncated, logp)


def _fast(model: PreTrainedModel, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, settings: GenerationSettings,
          stop: list[int], pad_id: int, dtype: torch.dtype | None, adapter_names: list[str] | None,
          sampler: RowSeededSampler | None, device: torch.device) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Completion ids (and log-probs) from :func:`comlrl.fastgen.fast_generate` (same distribution as ``generate``)."""
    out = fast_generate(
        model, prompt_ids.to(device), prompt_mask.to(device), max_new_tokens=settings.max_new_tokens,
        eos_token_ids=stop, pad_token_id=pad_id, do_sample=settings.do_sample, temperature=settings.temperature,
        top_p=settings.top_p, top_k=settings.top_k or 0, dtype=dtype, sample_fn=sampler.sample if sampler else None,
        adapter_names=adapter_names, logprobs=settings.logprobs, repetition_penalty=settings.repetition_penalty,
    )
    ids, logp = out if settings.logprobs else (out, None)
    return ids.cpu(), None if logp is None else logp.cpu()


def completion_logprobs(
    model: PreTrainedModel,
    prompt_ids: torch.Tensor,
    prompt_mask: torch.Tensor,
    completion_ids: torch.Tensor,
    completion_mask: torch.Tensor,
    row_adapters: list[str] | None = None,
    temperature: float = 1.0,
) -> torch.Tensor:
    """log p(completion token | prefix) for every completion position: (B, C), 0 where ``completion_mask`` is 0.
    Positions are taken from the mask. ``row_adapters`` (B,): each row's LoRA adapter on a shared base, rows of an
    adapter contiguous (see :func:`team_completion_logprobs`); None: the model as it is.

    ``temperature``: the policy scored is softmax(logits / temperature), the distribution a rollout at that
    temperature samples from before top-k / top-p truncation (as TRL scores it); truncation is not part of it.

    Logits are computed for real completion tokens only, never the prompt's or padding: for models whose logits are
    a plain output projection of the decoder's last hidden state (Llama-layout), through
    :func:`comlrl.losses.head_logprobs` (logits kept in the matmul dtype up to 64 MB, recomputed in backward beyond
    that; fp32 softmax temporaries ~16 MB at a time); otherwise through the model's own head on the last C+1
    positions (``logits_to_keep``).
    """
    width = completion_ids.shape[1]
    # lengths in a few buckets: every new matmul shape costs a cached CPU kernel (comlrl.shapes)
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
                return _logits_logprobs(model, ids, mask, position_ids, completion_ids, completion_mask,
                                        temperature)[:, :width]
        decoder, head = parts
        states = _states_before_completion(model, decoder, prompt_ids, prompt_mask, completion_ids, mask, position_ids,
                                           names, slots)
    real = completion_mask.bool()
    states = states[real]  # (N, H): the state before each real completion token
    device_type = states.device.type
    dtype = torch.get_autocast_dtype(device_type) if torch.is_autocast_enabled(device_type) else head.weight.dtype
    logp = torch.zeros(completion_ids.shape, dtype=torch.float32, device=states.device)  # (B, C)
    bias = head.bias
    if temperature != 1.0:  # logits / T == (h / T) W^T + b / T
        states, bias = states / temperature, None if bias is None else bias / temperature
    logp[real] = head_logprobs(states, head.weight, bias, completion_ids[real], dtype=dtype).float()
    return logp[:, :width]


def _states_before_completion(model: nn.Module, decoder: nn.Module, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor,
                              completion_ids: torch.Tensor, mask: torch.Tensor, position_ids: torch.Tensor,
                              names: list[str] | None = None, slots: torch.Tensor | None = None) -> torch.Tensor:
    """The decoder's last hidden state before each completion token: (B, C, H).

    Rows that repeat a prompt (the G samples of a rollout) share its forward when :func:`shared_prompt_layout` finds
    that cheaper: one packed row per distinct prompt, [prompt, completion 1, ..., completion k], each completion
    attending to the prompt and to itself only. Same math as the separate rows; backward sums each shared prompt's
    gradient over its rows. ``names``/``slots``: each row's LoRA adapter (rows of different adapters never share).
    """
    config = getattr(decoder, "config", None)
    blocked = _slot_attention_fits(decoder)
    layout = shared_prompt_layout(prompt_ids, prompt_mask, completion_ids, mask[:, prompt_ids.shape[1]:],
                                  position_ids, config, slots, blocked) if config is not None else None
    if layout is None:
        with _routed(names, slots):
            hidden = decoder(input_ids=torch.cat([prompt_ids, completion_ids], dim=1), attention_mask=mask,
                             position_ids=position_ids, use_cache=False).last_hidden_state
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


def _slot_attention_fits(decoder: nn.Module) -> bool:
    """Whether a packed forward of ``decoder`` can run its attention by blocks (:mod:`comlrl.attention`) and compute
    what the model's own would: eager attention (as in bf16 CPU training, :func:`training_attention`) without dropout,
    and no activation checkpointing (its recompute in backward runs outside the forward's context and must see the same
    attention)."""
    config = getattr(decoder, "config", None)
    return (getattr(config, "_attn_implementation", None) == "eager"
            and not getattr(config, "attention_dropout", 0) and not is_checkpointing(decoder)
            and hasattr(decoder, "set_attn_implementation"))


def team_completion_logprobs(model: nn.Module, adapters: list[str],
                             parts: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]],
                             temperature: float = 1.0) -> list[torch.Tensor]:
    """:func:`completion_logprobs` of several agents' rows in one forward of their shared LoRA base, the rows of
    ``parts[i]`` = (prompt_ids, prompt_mask, completion_ids, completion_mask) through adapter ``adapters[i]`` whatever
    adapters are active. The same values (up to kernel rounding) as one call per agent with its adapter active; the
    base's fixed per-forward costs are paid once. Needs autocast and :func:`comlrl.team.can_route`. Returns one
    (B_i, C_i) tensor per part.
    """
    width_p = max(p[0].shape[1] for p in parts)
    width_c = max(p[2].shape[1] for p in parts)
    prompts = [pad_tokens(p[0], p[1], left=True, width=width_p) for p in parts]  # already bucketed widths
    completions = [pad_tokens(p[2], p[3], left=False, width=width_c) for p in parts]
    stacked = [torch.cat(column) for column in (*zip(*prompts), *zip(*completions))]
    rows = [name for name, p in zip(adapters, parts) for _ in range(len(p[0]))]
    logp = completion_logprobs(model, *stacked, row_adapters=rows, temperature=temperature)
    out, lo = [], 0
    for p in parts:
        n, c = p[2].shape
        out.append(logp[lo : lo + n, :c])
        lo += n
    return out


def _adapter_slots(row_adapters: list[str] | None, device: torch.device) -> tuple[list[str] | None, torch.Tensor | None]:
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
    """:func:`comlrl.team.routed_adapters` over the contiguous row blocks of ``slots`` (sorted), or a no-op."""
    if slots is None:
        return contextlib.nullcontext()
    counts = torch.bincount(slots, minlength=len(names)).tolist()
    return routed_adapters([(n, end - k, end) for n, k, end in zip(names, counts, itertools.accumulate(counts)) if k])


def shared_prompt_layout(
    prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, completion_ids: torch.Tensor, completion_mask: torch.Tensor,
    position_ids: torch.Tensor, config: object, groups: torch.Tensor | None = None, blocked: bool = False,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor] | None:
    """Pack rows that share a prompt into one sequence per distinct prompt, or None when that would not pay.
    ``groups`` (B,): rows of different groups never share a packed row (e.g. different LoRA adapters); packed rows
    are ordered by group. ``blocked``: the forward will run its attention by blocks (:mod:`comlrl.attention`), each
    slot over [prompt; slot] -- fewer score pairs than the separate rows, so packing always pays.

    Returns ``ids`` (U, L) = [prompt (P), completion slot 1 (C), ..., slot K (C)] with L = P + K C (K: the most rows
    of one prompt; unused slots are padding), ``positions`` (U, L) as the separate rows have them, ``allowed``
    (U, 1, L, L) bool (a prompt token sees the real prompt tokens before it, a completion token the real prompt
    tokens and its own slot's real tokens before it; every token sees itself, so padding rows stay finite), and
    ``gather`` (B, C): the index into the flattened (U L) positions of the state before each completion token.

    Packing trades (k - 1) P tokens through every weight for longer attention rows (L^2 against k (P + C)^2 score
    pairs, unless ``blocked``); it is used when the body's matmul FLOPs saved exceed the attention FLOPs added.
    """
    b, p = prompt_ids.shape
    c = completion_ids.shape[1]
    # a custom mask replaces the sliding window; flash kernels take no 4-D mask
    if window_exceeded(config, p + c) or getattr(config, "_attn_implementation", None) not in ("eager", "sdpa"):
        return None
    keys = [prompt_ids, prompt_mask.to(prompt_ids.dtype)]
    if groups is not None:
        keys.insert(0, groups[:, None].to(prompt_ids.dtype))
    uniq, inverse = torch.unique(torch.cat(keys, dim=1), dim=0, return_inverse=True)  # (U, [1+]2P), (B,)
    uniq = uniq[:, uniq.shape[1] - 2 * p :]
    u = len(uniq)
    if u == b:
        return None
    counts = torch.bincount(inverse, minlength=u)  # (U,)
    k = int(counts.max())
    length = p + k * c
    hidden, layers = getattr(config, "hidden_size", 0), getattr(config, "num_hidden_layers", 0)
    intermediate = getattr(config, "intermediate_size", 4 * hidden)
    per_token = 2 * layers * (4 * hidden * hidden + 3 * hidden * intermediate)  # body matmuls, approx. (q/k/v/o, MLP)
    per_pair = 4 * hidden * layers  # scores + weighted values
    saved = (b - u) * p * per_token
    added = (u * length * length - b * (p + c) ** 2) * per_pair
    if saved <= added and not blocked:
        return None
    # slot of each row within its prompt's group: rank among the rows with the same prompt, in row order
    order = torch.argsort(inverse, stable=True)  # rows grouped by prompt
    starts = torch.cumsum(counts, 0) - counts  # (U,)
    slot = torch.empty_like(inverse)
    slot[order] = torch.arange(b, device=inverse.device) - starts[inverse[order]]
    first = order[starts]  # (U,): a row of each distinct prompt
    device = prompt_ids.device
    ids = torch.zeros((u, length), dtype=prompt_ids.dtype, device=device)
    positions = torch.zeros((u, length), dtype=position_ids.dtype, device=device)
    valid = torch.zeros((u, length), dtype=torch.bool, device=device)
    ids[:, :p], positions[:, :p], valid[:, :p] = uniq[:, :p], position_ids[first, :p], prompt_mask[first].bool()
    cols = p + slot[:, None] * c + torch.arange(c, device=device)  # (B, C) packed column of each completion token
    ids[inverse[:, None], cols] = completion_ids
    positions[inverse[:, None], cols] = position_ids[:, p:]
    valid[inverse[:, None], cols] = completion_mask.bool()
    segment = torch.full((length,), -1, dtype=torch.long, device=device)  # -1: prompt, j: completion slot j
    segment[p:] = torch.arange(k, device=device).repeat_interleave(c)
    idx = torch.arange(length, device=device)
    same = (segment[None, :] == -1) | (segment[None, :] == segment[:, None])  # (L, L) key in prompt or in own slot
    allowed = (same & (idx[None, :] <= idx[:, None]))[None] & valid[:, None, :]  # (U, L, L)
    allowed |= torch.eye(length, dtype=torch.bool, device=device)
    before = torch.cat([torch.full((b, 1), p - 1, device=device), cols[:, :-1]], dim=1)  # (B, C)
    gather = inverse[:, None] * length + before
    return ids, positions, allowed[:, None], gather


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


def _logits_logprobs(model: PreTrainedModel, ids: torch.Tensor, mask: torch.Tensor, position_ids: torch.Tensor,
                     completion_ids: torch.Tensor, completion_mask: torch.Tensor,
                     temperature: float = 1.0) -> torch.Tensor:
    """completion_logprobs through the model's own logits (the last C+1 positions only), 0 on padding."""
    c = completion_ids.shape[1]
    with _contiguous_head_input(model):
        logits = model(input_ids=ids, attention_mask=mask, position_ids=position_ids, logits_to_keep=c + 1,
                       use_cache=False).logits
    logits = logits[:, :-1, :]
    if temperature != 1.0:
        logits = logits / temperature
    return token_logprobs(logits, completion_ids) * completion_mask  # (B, C)


@contextlib.contextmanager
def training_forward(model: nn.Module) -> Iterator[None]:
    """The forward of a training step (one that backward will run through): bf16 CPU attention run eagerly
    (:func:`training_attention`), LoRA deltas as one op (:func:`comlrl.team.fused_lora_forward`) and Llama-layout
    layers that save fewer activations (:func:`comlrl.lean.lean_layers`); each leaves models it does not fit alone."""
    with training_attention(model), fused_lora_forward(model), lean_layers(model):
        yield


@contextlib.contextmanager
def training_attention(model: nn.Module) -> Iterator[None]:
    """Run the block's attention eagerly when it trains in bf16 on CPU (a model set to ``sdpa``); else leave it.

    Why: torch's CPU flash-attention backward is slow in bf16 at RL shapes. Measured on SmolLM2-135M, 4 x 104 tokens,
    2 cores: 11.5 ms per layer against ~2.5 ms for eager attention's matmuls + softmax; a forward+backward went
    1.58 -> 1.28 s (LoRA on a bf16 base) and 1.86 -> 1.47 s (full fine-tune, bf16 autocast). fp32 gained nothing,
    and no-grad forwards keep SDPA (its forward is the fast part).
    """
    inner = unwrap_peft(model)
    config = getattr(inner, "config", None)
    param = next(inner.parameters(), None)
    bf16 = param is not None and (param.dtype == torch.bfloat16 or (
        torch.is_autocast_enabled("cpu") and torch.get_autocast_dtype("cpu") == torch.bfloat16))
    # Gradient checkpointing re-runs the forward during backward, outside this block: it must see the same attention.
    if (not bf16 or config is None or getattr(config, "_attn_implementation", None) != "sdpa"
            or not torch.is_grad_enabled() or param.device.type != "cpu" or not hasattr(inner, "set_attn_implementation")
            or is_checkpointing(inner)):
        yield
        return
    inner.set_attn_implementation("eager")
    try:
        yield
    finally:
        inner.set_attn_implementation("sdpa")


@contextlib.contextmanager
def _contiguous_head_input(model: PreTrainedModel) -> Iterator[None]:
    """Make the output projection's input contiguous while the block runs.

    Why: with ``logits_to_keep`` HF models feed the LM head a strided slice of the hidden states, and ``F.linear`` on a
    non-contiguous 3-D input falls back to a batched matmul over a copy of the (V, H) weight per row -- measured on
    CPU for SmolLM2 (V=49k) at 4 rows: 0.4 s of weight copies per forward+backward, a quarter of the loss time.
    """
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    if head is None:
        yield
        return
    handle = head.register_forward_pre_hook(lambda module, args: (args[0].contiguous(), *args[1:]))
    try:
        yield
    finally:
        handle.remove()
