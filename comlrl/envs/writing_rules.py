"""The task check of the writing rewards (:mod:`comlrl.envs.writing`): which sentences of an output count.

A sentence counts when it is about the source text, in the agent's own words (not repeated from earlier, not in
long runs copied from a prompt, no lightly edited copy) and prose; the rules and their thresholds are in
:mod:`comlrl.envs.writing`'s docstring. :func:`task_context` builds what a row's answers are checked against,
:func:`counted_sentences` keeps the sentences that count.
"""

from __future__ import annotations

import dataclasses
import difflib
import re
from dataclasses import dataclass
from typing import Mapping, Sequence

from .wordlists import STOPWORDS, TRANSITIONS

_TOKEN = re.compile(r"[a-z0-9]+(?:'[a-z]+)?")
_SENTENCE_BREAK = re.compile(r"(?<=[.!?])\s+|\n+")
_SOURCE_LABEL = re.compile(r"^[ \t]*(?:SUBREDDIT|TITLE|POST):", re.M)
TRANSITION_WORDS = frozenset(w for ps in TRANSITIONS.values() for p in ps for w in re.findall(r"[a-z0-9]+", p))
GROUNDED_SHARE = 0.25  # of a sentence's topic words found in the source (and at least one) ...
GROUNDED_LONG = (3, 1 / 6)  # ... or at least 3 and a sixth of them (a long sentence that adds context)
COPIED_SHARE = 0.5  # of its 4-grams said earlier (this output, agent 1's), and of its words in copied runs: at most
COPIED_RUN = 8  # words a prompt has in the same order: a copied clause (a name or a noun phrase is shorter)
COPIED_GAP = 3  # prompt words a copied run may leave out between two it keeps (articles, pronouns, auxiliaries)
PROSE_WORDS, PROSE_STOPWORDS = 8, 1 / 12  # a sentence of 8+ words needs a stop word per 12 words
NEAR_COPY = 0.75  # difflib ratio with one or two consecutive sentences seen before: a lightly edited copy
MAX_SENTENCE_WORDS = 60  # a longer run without a sentence break is a list or a dump, not a sentence
_SUFFIXES = (("ies", "y"), ("ied", "y"), ("ing", ""), ("ed", ""), ("s", ""))


def tokens(text: str) -> list[str]:
    """Lower-cased words (letters and digits, with an apostrophe suffix: "can't")."""
    return _TOKEN.findall(text.lower())


def split_sentences(text: str) -> list[str]:
    """Sentences: split after . ! ? followed by white space, and at line breaks."""
    return [s.strip() for s in _SENTENCE_BREAK.split(text) if s.strip()]


def stem(word: str) -> str:
    """A light stem: one inflection stripped (-s, -ed, -ing, -ies/-ied to -y), then a final e or a doubled
    consonant, so "searched", "searches" and "search" match, and "smiling" matches "smile", but not
    "considerable" and "considerations"."""
    for suffix, replace in _SUFFIXES:
        if word.endswith(suffix) and len(word) - len(suffix) >= 3:
            if suffix == "s" and word.endswith(("ss", "us", "is")):
                break
            word = word[: -len(suffix)] + replace
            break
    if len(word) >= 4 and word.endswith("e"):
        word = word[:-1]
    if len(word) >= 4 and word[-1] == word[-2] and word[-1] not in "lsz":
        word = word[:-1]
    return word


def topic_words(words: Sequence[str]) -> set[str]:
    """Words that carry a topic: 3+ characters or a number, neither a stop word nor a transition word."""
    return {w for w in words if w not in STOPWORDS and w not in TRANSITION_WORDS and (len(w) >= 3 or w.isdigit())}


def ngrams(words: Sequence[str], longest: int = 4) -> set[tuple[str, ...]]:
    """Every run of 1 to ``longest`` consecutive words."""
    return {tuple(words[i : i + n]) for n in range(1, longest + 1) for i in range(len(words) - n + 1)}


def _windows(text: str) -> list[tuple[str, ...]]:
    """The words of each sentence of ``text`` and of each two consecutive sentences."""
    sentences = [tuple(tokens(s)) for s in split_sentences(text)]
    return [w for w in sentences + [a + b for a, b in zip(sentences, sentences[1:])] if w]


def near_copy(words: Sequence[str], windows: Sequence[Sequence[str]]) -> bool:
    """Whether ``words`` (a sentence) is a lightly edited copy of a window: difflib's ratio (2 * matched words /
    both lengths) at least ``NEAR_COPY``; the lengths and the shared words rule most windows out cheaply."""
    n = len(words)
    for window in windows:
        if min(n, len(window)) * 2 < NEAR_COPY * (n + len(window)):
            continue
        matcher = difflib.SequenceMatcher(None, words, window, autojunk=False)
        if matcher.quick_ratio() >= NEAR_COPY and matcher.ratio() >= NEAR_COPY:
            return True
    return False


def copied_runs(words: Sequence[str], positions: Mapping[str, Sequence[int]], run: int, gap: int) -> list[bool]:
    """Which of ``words`` (a sentence) lie in a copied run: ``run`` or more consecutive words that a prompt has in
    the same order, each at most ``gap`` prompt words after the one before (so a copy that drops short words is
    one run). ``positions``: each word's positions in the prompts' words (:func:`word_positions`)."""
    covered = [False] * len(words)
    ending: dict[int, int] = {}  # prompt position -> length of the longest run ending there at the previous word
    for i, word in enumerate(words):
        current = {}
        for p in positions.get(word, ()):
            longest = 0
            for q in range(p - gap - 1, p):
                longest = max(longest, ending.get(q, 0))
            current[p] = longest + 1
        ending = current
        length = max(current.values(), default=0)
        if length >= run:  # the run ending here covers this word and the length - 1 before it
            covered[i - length + 1 : i + 1] = [True] * length
    return covered


def word_positions(texts: Sequence[str], gap: int = COPIED_GAP) -> dict[str, tuple[int, ...]]:
    """Each word's positions in the words of ``texts``, one after the other with more than ``gap`` positions
    between two texts (no run of :func:`copied_runs` joins two prompts)."""
    positions: dict[str, list[int]] = {}
    offset = 0
    for text in texts:
        words = tokens(text)
        for i, word in enumerate(words):
            positions.setdefault(word, []).append(offset + i)
        offset += len(words) + gap + 1
    return {word: tuple(found) for word, found in positions.items()}


@dataclass(frozen=True)
class TaskContext:
    """What a row's answers are checked against: the source's topic stems (None: no source, not checked), the
    positions of every prompt's words (the source and each role's instructions; see :func:`copied_runs`) and the
    prompts' sentence windows (see :func:`near_copy`)."""

    source_stems: frozenset[str] | None
    prompt_positions: Mapping[str, tuple[int, ...]] = dataclasses.field(default_factory=dict)
    prompt_windows: tuple[tuple[str, ...], ...] = ()


def task_context(source: str | None, prompts: Sequence[str] = ()) -> TaskContext:
    """The :class:`TaskContext` of a source text (labels like ``POST:`` dropped) and the prompts shown."""
    stems = None if source is None else frozenset(stem(w) for w in topic_words(tokens(_SOURCE_LABEL.sub(" ", source))))
    windows = tuple(dict.fromkeys(w for p in prompts for w in _windows(p)))
    return TaskContext(stems, word_positions(prompts), windows)


def counted_sentences(text: str, context: TaskContext, before: str = "") -> list[str]:
    """The sentences of ``text`` that count (module docstring): about the source, not copied from a prompt,
    from earlier in ``text`` or from ``before`` (agent 1's output, for agent 2), and prose. A sentence may use the
    prompts' words and short phrases (a summary names the post's things in the post's words); what it may not is
    repeat what was said, or take most of its words from long runs of a prompt."""
    seen = ngrams(tokens(before))
    earlier = _windows(before)  # sentences an edited copy could come from: agent 1's, then this output's
    kept = []
    previous: tuple[str, ...] = ()
    for sentence in split_sentences(text):
        words = tokens(sentence)
        if not words:
            continue
        edited = len(words) >= 4 and near_copy(words, [*context.prompt_windows, *earlier])
        earlier += [tuple(words), previous + tuple(words)] if previous else [tuple(words)]
        previous = tuple(words)
        n = min(4, len(words))
        repeated = 0
        for i in range(len(words) - n + 1):  # said before: in agent 1's output, or earlier in this one
            gram = tuple(words[i : i + n])
            repeated += gram in seen
            seen |= ngrams(gram)
        repeated /= len(words) - n + 1
        if context.source_stems is not None:
            topic = topic_words(words)
            grounded = sum(stem(w) in context.source_stems for w in topic)
            enough = grounded >= GROUNDED_SHARE * len(topic) or (
                grounded >= GROUNDED_LONG[0] and grounded >= GROUNDED_LONG[1] * len(topic)
            )
            if grounded == 0 or not enough:
                continue
        if repeated > COPIED_SHARE or edited:
            continue
        if sum(copied_runs(words, context.prompt_positions, min(COPIED_RUN, len(words)), COPIED_GAP)) > (
            COPIED_SHARE * len(words)
        ):
            continue
        if len(words) > MAX_SENTENCE_WORDS:
            continue
        if len(words) >= PROSE_WORDS and sum(w in STOPWORDS for w in words) < PROSE_STOPWORDS * len(words):
            continue
        kept.append(sentence)
    return kept
