"""Batched generation for one agent: tokenize + left-pad prompts, sample G completions each, mask after EOS.

All prompts of a step x ``num_generations`` go through one ``generate`` call per agent.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import torch
from transformers import LogitsProcessorList, PreTrainedModel, PreTrainedTokenizerBase

from ..accel.fastgen import fast_generate, supports_fast_generate
from ..algorithms.losses import token_logprobs
from .models import model_device
from .sampling import RowSeededSampler


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
        return Samples(
            self.prompt_ids[rows, prompt_cols],
            self.prompt_mask[rows, prompt_cols],
            self.completion_ids[rows, completion_cols],
            self.completion_mask[rows, completion_cols],
            self.texts[rows],
            None if self.truncated is None else self.truncated[rows],
            logp,
        )


@dataclass
class GenerationSettings:
    """Sampling settings for one generate call."""

    max_new_tokens: int = 128
    do_sample: bool = True
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    max_prompt_length: int | None = None
    fast: bool = True  # use comlrl.accel.fastgen's decode loop when the model supports it (else HF generate)
    concurrent: bool = True  # several models' calls decode at once on CPU (generate_concurrently)
    logprobs: bool = False  # record Samples.rollout_logprobs
    repetition_penalty: float = 1.0  # transformers' penalty on tokens already in the row (1: off)


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


def left_pad(seqs: list[list[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(ids, mask) of shape (len(seqs), max_len), padded on the left."""
    width = max(max((len(s) for s in seqs), default=0), 1)
    ids = torch.full((len(seqs), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(seqs), width), dtype=torch.long)
    for i, s in enumerate(seqs):
        if s:
            ids[i, width - len(s) :] = torch.tensor(s, dtype=torch.long)
            mask[i, width - len(s) :] = 1
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
    depend on the other rows of the batch (:mod:`comlrl.engine.sampling`); None samples from the global RNG.
    """
    request = GenerationRequest(
        model, tokenizer, prompts, num_generations, settings, chat, autocast_dtype, adapter_names, row_seeds
    )
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
    concurrent = (
        len(requests) > 1
        and threads >= 2
        and all(r.settings.concurrent for r in requests)
        and all(model_device(r.model).type == "cpu" for r in requests)
        and all(r.row_seeds is not None or not r.settings.do_sample for r in requests)
    )
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
        encoded = [e[-settings.max_prompt_length :] for e in encoded]
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
        kwargs.update(
            do_sample=True, temperature=settings.temperature, top_p=settings.top_p, top_k=settings.top_k or None
        )
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
        return _fast(
            model,
            prompt_ids,
            prompt_mask,
            settings,
            stop,
            pad_id,
            r.autocast_dtype,
            kwargs.get("adapter_names"),
            sampler,
            device,
        )
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
        return out[:, prompt_ids.shape[1] :].cpu(), None
    ids = out.sequences[:, prompt_ids.shape[1] :]
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
    texts = r.tokenizer.batch_decode(completion_ids, skip_special_tokens=True)
    if logp is not None:
        logp = logp * mask
    return Samples(job["prompt_ids"], job["prompt_mask"], completion_ids, mask, texts, truncated, logp)


def _fast(
    model: PreTrainedModel,
    prompt_ids: torch.Tensor,
    prompt_mask: torch.Tensor,
    settings: GenerationSettings,
    stop: list[int],
    pad_id: int,
    dtype: torch.dtype | None,
    adapter_names: list[str] | None,
    sampler: RowSeededSampler | None,
    device: torch.device,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Completion ids (and log-probs) from :func:`comlrl.accel.fastgen.fast_generate` (same distribution as ``generate``)."""
    out = fast_generate(
        model,
        prompt_ids.to(device),
        prompt_mask.to(device),
        max_new_tokens=settings.max_new_tokens,
        eos_token_ids=stop,
        pad_token_id=pad_id,
        do_sample=settings.do_sample,
        temperature=settings.temperature,
        top_p=settings.top_p,
        top_k=settings.top_k or 0,
        dtype=dtype,
        sample_fn=sampler.sample if sampler else None,
        adapter_names=adapter_names,
        logprobs=settings.logprobs,
        repetition_penalty=settings.repetition_penalty,
    )
    ids, logp = out if settings.logprobs else (out, None)
    return ids.cpu(), None if logp is None else logp.cpu()
