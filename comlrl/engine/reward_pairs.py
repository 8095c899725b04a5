"""What the joint reward model (:mod:`comlrl.engine.reward_model`) reads: preference pair records and their text.

Pair records (written by the MADPO trainer, read here)::

    {"row": int, "prompts": [str per agent], "chosen": [str per agent], "rejected": [str per agent], ...}

:func:`check_pairs` checks their shape, :func:`split_pairs_by_prompt` holds pairs out by prompt row, and
:func:`check_readable`, :func:`joint_unreadable` and :func:`readable_pairs` tell whether the reward model's
tokenizer can read the texts (no unknown token, no characters lost in a round trip).
"""

from __future__ import annotations

import random
import unicodedata
from typing import Sequence

from transformers import PreTrainedTokenizerBase

from ..errors import ConfigError

PAIR_KEYS = ("row", "prompts", "chosen", "rejected")


def _clean(text: str) -> str:
    """What a round trip must keep: the text without whitespace, NFKC-normalized (decoders add or drop spaces)."""
    return "".join(unicodedata.normalize("NFKC", text).split())


def _quote(text: str, start: int, width: int = 40) -> str:
    lo = max(0, start - width // 4)
    piece = text[lo : lo + width]
    return ("..." if lo > 0 else "") + repr(piece)[1:-1] + ("..." if lo + width < len(text) else "")


def _unreadable(tokenizer: PreTrainedTokenizerBase, text: str) -> str | None:
    """Why ``tokenizer`` cannot read ``text`` (an unknown-token piece, or characters lost in a round trip), or None."""
    unk = tokenizer.unk_token_id
    try:
        enc = tokenizer(text, add_special_tokens=False, return_offsets_mapping=unk is not None)
    except NotImplementedError:  # slow tokenizers give no offsets
        enc = tokenizer(text, add_special_tokens=False)
    ids = enc["input_ids"]
    if unk is not None and unk in ids:
        offsets = enc.get("offset_mapping")
        if offsets is not None:
            for tid, (a, b) in zip(ids, offsets):
                if tid == unk and text[a:b] != tokenizer.unk_token:  # a literal unk string in the text is fine
                    return f"'{_quote(text, a)}' encodes to the unknown token {tokenizer.unk_token!r} at {text[a:b]!r}"
        elif tokenizer.unk_token not in text:
            return f"'{_quote(text, 0)}' encodes to the unknown token {tokenizer.unk_token!r}"
    decoded = tokenizer.decode(ids, skip_special_tokens=False)
    want, got = _clean(text), _clean(decoded)
    if want != got:
        at = next((k for k, (x, y) in enumerate(zip(want, got)) if x != y), min(len(want), len(got)))
        # back to a position in the text: the at-th non-whitespace character (exact unless NFKC changed lengths)
        seen = [k for k, ch in enumerate(text) if not ch.isspace()]
        where = seen[at] if at < len(seen) else len(text)
        return (
            f"decoding its tokens loses characters near '{_quote(text, where)}' (decoded: '{_quote(decoded, where)}')"
        )
    return None


def check_readable(tokenizer: PreTrainedTokenizerBase, texts_per_agent: list[list[str]], what: str = "agent") -> None:
    """Raise ConfigError naming ``{what} {i}`` (1-based) and quoting the text when the tokenizer cannot read one of
    agent i's texts: it encodes to the unknown token, or decoding its tokens loses non-whitespace characters."""
    for i, texts in enumerate(texts_per_agent):
        if isinstance(texts, str):
            raise ConfigError(f"{what} {i + 1}: expected a list of texts, got one string {_quote(texts, 0)!r}.")
        for j, text in enumerate(texts):
            if not isinstance(text, str):
                raise ConfigError(f"{what} {i + 1}: text {j} is {type(text).__name__}, not a str.")
            why = _unreadable(tokenizer, text)
            if why is not None:
                raise ConfigError(
                    f"{what} {i + 1}: the reward model's tokenizer ({type(tokenizer).__name__}) cannot read text {j}: "
                    f"{why}. Use a reward model whose tokenizer covers the agents' text (e.g. the agents' own model)."
                )


def joint_unreadable(tokenizer: PreTrainedTokenizerBase, prompts: Sequence[str], answers: Sequence[str]) -> str | None:
    """Why ``tokenizer`` cannot read one joint action (each agent's prompt and answer), naming the agent, or None."""
    for what, texts in (("the prompt of agent", prompts), ("agent", answers)):
        for i, text in enumerate(texts):
            why = _unreadable(tokenizer, text)
            if why is not None:
                return f"{what} {i + 1}: {why}"
    return None


def readable_pairs(tokenizer: PreTrainedTokenizerBase, pairs: Sequence[dict]) -> tuple[list[dict], int, str | None]:
    """The pairs whose every text (each agent's prompt, chosen and rejected answer) ``tokenizer`` can read, the
    number skipped, and why the first skipped one was (None when none was)."""
    kept, first = [], None
    for pair in pairs:
        why = joint_unreadable(tokenizer, pair["prompts"], pair["chosen"]) or joint_unreadable(
            tokenizer, pair["prompts"], pair["rejected"]
        )
        if why is None:
            kept.append(pair)
        elif first is None:
            first = why
    return kept, len(pairs) - len(kept), first


def check_pairs(pairs: Sequence[dict], num_agents: int | None = None, what: str = "pairs") -> int:
    """The number of agents N of well-formed pair records; ConfigError naming the pair index and key otherwise."""
    if not pairs:
        raise ConfigError(f"{what} is empty: the reward model needs at least one preference pair.")
    for p, pair in enumerate(pairs):
        if not isinstance(pair, dict):
            raise ConfigError(f"{what}[{p}] is {type(pair).__name__}, not a dict with keys {list(PAIR_KEYS)}.")
        for key in PAIR_KEYS:
            if key not in pair:
                raise ConfigError(f"{what}[{p}] has no key '{key}' (keys: {sorted(pair)}; needed: {list(PAIR_KEYS)}).")
        for key in PAIR_KEYS[1:]:
            values = pair[key]
            if isinstance(values, str) or not isinstance(values, (list, tuple)):
                raise ConfigError(f"{what}[{p}]['{key}'] must be a list with one str per agent, got {values!r:.80}.")
            if num_agents is None:
                num_agents = len(values)
                if num_agents < 1:
                    raise ConfigError(f"{what}[{p}]['{key}'] is empty: it needs one str per agent.")
            if len(values) != num_agents:
                raise ConfigError(
                    f"{what}[{p}]['{key}'] has {len(values)} entries, expected one per agent ({num_agents})."
                )
            for i, v in enumerate(values):
                if not isinstance(v, str):
                    raise ConfigError(f"{what}[{p}]['{key}'][{i}] (agent {i + 1}) is {type(v).__name__}, not a str.")
    assert num_agents is not None
    return num_agents


def split_pairs_by_prompt(pairs: Sequence[dict], eval_fraction: float, seed: int) -> tuple[list[dict], list[dict]]:
    """(train, eval) pairs held out by prompt: the rows (``pair['row']``) are split, so no prompt has pairs on both
    sides. About ``eval_fraction`` of the distinct rows go to eval, at least one row to each side; pairs keep their
    order."""
    if not 0.0 < eval_fraction < 1.0:
        raise ConfigError(f"eval_fraction must be in (0, 1), got {eval_fraction}.")
    for p, pair in enumerate(pairs):
        if not isinstance(pair, dict) or "row" not in pair:
            raise ConfigError(f"pairs[{p}] has no key 'row': pairs are held out by prompt row.")
    rows = sorted({pair["row"] for pair in pairs})
    if len(rows) < 2:
        raise ConfigError(
            f"holding out pairs by prompt needs pairs from at least 2 distinct rows, got {len(rows)} "
            f"({len(pairs)} pair(s)); add prompts or skip the held-out split."
        )
    random.Random(seed).shuffle(rows)
    n_eval = min(max(round(eval_fraction * len(rows)), 1), len(rows) - 1)
    held = set(rows[:n_eval])
    train = [pair for pair in pairs if pair["row"] not in held]
    evals = [pair for pair in pairs if pair["row"] in held]
    return train, evals
