"""Batched generation for one agent: tokenize + left-pad prompts, sample G completions each, mask after EOS.

All prompts of a step x ``num_generations`` go through one call per agent to its rollout engine
(:mod:`comlrl.rollout.generation`: comlrl's decode loop, transformers' ``generate`` or vLLM), which sees token ids only.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from ..accel.shapes import pad_tokens
from ..engine.models import left_pad, model_device
from .generation import select_engine
from .protocol import Completions, GenerationSettings, PromptBatch


@dataclass(kw_only=True)
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
        return Samples(
            prompt_ids=self.prompt_ids[rows, prompt_cols],
            prompt_mask=self.prompt_mask[rows, prompt_cols],
            completion_ids=self.completion_ids[rows, completion_cols],
            completion_mask=self.completion_mask[rows, completion_cols],
            texts=self.texts[rows],
            truncated=None if self.truncated is None else self.truncated[rows],
            rollout_logprobs=logp,
        )


def concat_samples(parts: list[Samples], pad_id: int) -> Samples:
    """One agent's shards, in row order, re-padded to common widths: prompts left-, completions right-padded.

    The result is what one ``generate`` call over all rows returns (its widths are the maxima over the rows).
    """
    if len(parts) == 1:
        return parts[0]
    p_width = max(p.prompt_ids.shape[1] for p in parts)
    c_width = max(p.completion_ids.shape[1] for p in parts)
    prompts = [
        pad_tokens(p.prompt_ids, p.prompt_mask, left=True, multiple=1, pad_id=pad_id, width=p_width) for p in parts
    ]
    completions = [
        pad_tokens(p.completion_ids, p.completion_mask, left=False, multiple=1, pad_id=pad_id, width=c_width)
        for p in parts
    ]
    logp = (
        None
        if any(p.rollout_logprobs is None for p in parts)
        else torch.cat([F.pad(p.rollout_logprobs, (0, c_width - p.rollout_logprobs.shape[1])) for p in parts])
    )
    prompt_ids, prompt_mask = (torch.cat(column) for column in zip(*prompts))
    completion_ids, completion_mask = (torch.cat(column) for column in zip(*completions))
    return Samples(
        prompt_ids=prompt_ids,
        prompt_mask=prompt_mask,
        completion_ids=completion_ids,
        completion_mask=completion_mask,
        texts=[t for p in parts for t in p.texts],
        truncated=torch.cat([p.truncated for p in parts]),
        rollout_logprobs=logp,
    )


def format_prompt(tokenizer: PreTrainedTokenizerBase, text: str, chat: bool) -> list[int]:
    """Token ids of a prompt: the raw text (with the tokenizer's usual special tokens) or a chat user turn."""
    if chat:
        if not getattr(tokenizer, "chat_template", None):
            raise ValueError(f"apply_chat_template=True but tokenizer {type(tokenizer).__name__} has no chat template")
        ids = tokenizer.apply_chat_template(
            [{"role": "user", "content": text}], add_generation_prompt=True, tokenize=True
        )
        if isinstance(ids, dict) or hasattr(ids, "keys"):
            ids = ids["input_ids"]
        return list(ids)
    return tokenizer(text, add_special_tokens=True)["input_ids"]


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
    *,
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
    depend on the other rows of the batch (:mod:`comlrl.rollout.sampling`); None samples from the global RNG.
    """
    request = GenerationRequest(
        model=model,
        tokenizer=tokenizer,
        prompts=prompts,
        num_generations=num_generations,
        settings=settings,
        chat=chat,
        autocast_dtype=autocast_dtype,
        adapter_names=adapter_names,
        row_seeds=row_seeds,
    )
    return generate_concurrently([request])[0]


@dataclass(kw_only=True)
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
    when any has ``settings.concurrent`` off, runs on an engine that does not run in threads, or shares a parameter
    with another request's model (a decode may hold its model's weights for the call:
    :class:`comlrl.accel.decode_weights.WeightLoan`).
    """
    jobs = [_encode(r) for r in requests]
    threads = torch.get_num_threads()
    concurrent = (
        len(requests) > 1
        and threads >= 2
        and all(r.settings.concurrent for r in requests)
        and all(model_device(r.model).type == "cpu" for r in requests)
        and all(r.row_seeds is not None or not r.settings.do_sample for r in requests)
        and all(select_engine(r.settings, r.model).runs_in_threads for r in requests)
        and not _share_parameters([r.model for r in requests])
    )
    if not concurrent:
        completions = [_sample(r, job) for r, job in zip(requests, jobs)]
    else:
        workers = min(len(requests), threads)

        def run(pair: tuple[GenerationRequest, PromptBatch]) -> Completions:
            torch.set_num_threads(max(threads // workers, 1))  # this thread's intra-op pool only
            with torch.no_grad():
                return _sample(*pair)

        with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="comlrl-rollout") as pool:
            completions = list(pool.map(run, zip(requests, jobs)))
    return [_finish(r, job, out) for r, job, out in zip(requests, jobs, completions)]


def _share_parameters(models: list[torch.nn.Module]) -> bool:
    """Whether any parameter tensor belongs to more than one of ``models`` (or a model is listed twice)."""
    seen: set[int] = set()
    for model in models:
        own = {id(p) for p in model.parameters()}
        if own & seen:
            return True
        seen |= own
    return False


def _encode(r: GenerationRequest) -> PromptBatch:
    """The prompt rows of a request as token ids: tokenized, truncated, G rows per prompt, left-padded."""
    chats = r.chat if isinstance(r.chat, list) else [r.chat] * len(r.prompts)
    encoded = [format_prompt(r.tokenizer, p, c) for p, c in zip(r.prompts, chats)]
    if r.settings.max_prompt_length:
        encoded = [e[-r.settings.max_prompt_length :] for e in encoded]
    encoded = [e for e in encoded for _ in range(r.num_generations)]  # (B*G) rows, sample-major within a prompt
    if r.row_seeds is not None and r.settings.do_sample and len(r.row_seeds) != len(encoded):
        raise ValueError(f"row_seeds has {len(r.row_seeds)} seeds for {len(encoded)} rows")
    prompt_ids, prompt_mask = left_pad(encoded, r.tokenizer.pad_token_id)
    adapters = None if r.adapter_names is None else [a for a in r.adapter_names for _ in range(r.num_generations)]
    return PromptBatch(
        prompt_ids=prompt_ids,
        prompt_mask=prompt_mask,
        stop_ids=eos_ids(r.model, r.tokenizer),
        pad_id=r.tokenizer.pad_token_id,
        row_seeds=r.row_seeds,
        adapter_names=adapters,
    )


def _sample(r: GenerationRequest, batch: PromptBatch) -> Completions:
    """Completions of an encoded request from its engine (:func:`comlrl.rollout.generation.select_engine`); touches
    the model only (no tokenizer), so it may run in a thread."""
    return select_engine(r.settings, r.model).sample(r.model, batch, r.settings, r.autocast_dtype)


def _finish(r: GenerationRequest, batch: PromptBatch, out: Completions) -> Samples:
    """Samples of a request from its completions: masked after the first stop id, padded, decoded to text."""
    stop, pad_id = batch.stop_ids, batch.pad_id
    completion_ids, logp = out.ids, out.logprobs
    if completion_ids.shape[1] == 0:
        completion_ids = torch.full((batch.rows, 1), stop[0] if stop else pad_id, dtype=torch.long)
        logp = None if logp is None else torch.zeros(completion_ids.shape)
    mask, truncated = completion_mask(completion_ids, stop)
    if out.truncated is not None:
        truncated = out.truncated.bool()
    completion_ids = torch.where(mask.bool(), completion_ids, torch.full_like(completion_ids, pad_id))
    texts = r.tokenizer.batch_decode(completion_ids, skip_special_tokens=True)
    if logp is not None:  # a pad after a stop id may be a token top-k / top-p drop: -inf, and -inf * 0 is NaN
        logp = torch.where(mask.bool(), logp, torch.zeros_like(logp))
    return Samples(
        prompt_ids=batch.prompt_ids,
        prompt_mask=batch.prompt_mask,
        completion_ids=completion_ids,
        completion_mask=mask,
        texts=texts,
        truncated=truncated,
        rollout_logprobs=logp,
    )
