"""Writing tasks for two agents: ``tldr`` (summaries) and ``arxiv`` (paper introductions).

Team reward (the published MAGRPO set-up; see docs/environments.md). ``c1``/``c2`` are agent 1's and
agent 2's outputs. Tokens are whitespace-separated; distinct words are lower-cased ``\\w+`` runs. The
levels are tiered: a level whose measure falls outside its range scores 0 and stops the scoring.

=========  ======  =========================================  ==========================================
level      points  tldr                                       arxiv
=========  ======  =========================================  ==========================================
structure  0.5     both outputs have 8..256 tokens            both outputs have 128..256 tokens
length     1.0     r = chars(c2)/chars(c1): 1.0 on [1.6, 3.2]; 1.0 on [1.3, 1.6]; ramps on [0.8, 1.3]
                   (r-1.1)/0.5 on [1.1, 1.6); 1-(r-3.2)/1.8   and (1.6, 2.0]; stop outside [0.8, 2.0]
                   on (3.2, 5.0]; stop outside [1.1, 5.0]
distinct   0.5     r = distinct(c2)/distinct(c1): 0.5 for     0.5 on [0.7, 1.3]; ramps on [0.5, 0.7) and
                   r >= 2; 0.5(r-1.3)/0.7 on [1.3, 2); stop   (1.3, 1.7]; stop outside [0.5, 1.7]
                   below 1.3
style      1.0     0.4 * transition + 0.6 * overlap           same, transitions counted in c1 and c2
=========  ======  =========================================  ==========================================

transition: 0 with no category of transition words found, else 0.4 + 0.05 per extra category (max 1.0).
overlap: Jaccard similarity of the two outputs' content words (stop words removed), min(J, 0.03)/0.03
(0 when both have no content words). Maximum team reward 3.0.

Score keys (each level as the fraction of its points earned): ``level/structure``, ``level/length``,
``level/distinct``, ``level/style``; raw measures ``metric/tokens_1``, ``metric/tokens_2``,
``metric/length_ratio``, ``metric/distinct_ratio``, ``metric/transition_categories``, ``metric/jaccard``.

With ``num_agents=1`` one model writes both parts separated by the marker line ``### PART 2`` and the
reward splits its answer there (the single-agent baseline).
"""

from __future__ import annotations

import dataclasses
import math
import re
from dataclasses import dataclass
from typing import Any

import datasets

from ..errors import ComlrlError
from .core.base import Env, Formatter, TeamReward, register
from .core.loaders import load_rows, text_field
from .core.packaged import PACKAGED
from .wordlists import STOPWORDS, TRANSITIONS

MARKER = "### PART 2"
_MARKER_LINE = re.compile(r"^[ \t#*=\-]*part\s*2\b.*$", re.I | re.M)
_PART1_LINE = re.compile(r"^[ \t#*=\-]*part\s*1\b[^\n]*\n?", re.I)
_WORD = re.compile(r"\b\w+\b")
_TRANSITION_RE = {
    cat: re.compile(
        r"(?<![\w])(" + "|".join(re.escape(p) for p in sorted(phrases, key=len, reverse=True)) + r")(?![\w])"
    )
    for cat, phrases in TRANSITIONS.items()
}

# --- pure measures --------------------------------------------------------------------------------


def count_tokens(text: str) -> int:
    """Whitespace-separated tokens."""
    return len(text.split())


def distinct_words(text: str) -> set[str]:
    """Distinct lower-cased words (``\\w+`` runs)."""
    return set(_WORD.findall(text.lower()))


def content_words(text: str) -> set[str]:
    """Distinct lower-cased words that are not stop words."""
    return {w for w in distinct_words(text) if w not in STOPWORDS}


def transition_categories(text: str) -> set[str]:
    """Categories of transition words found in ``text`` (whole-word, case-insensitive)."""
    lower = text.lower()
    return {cat for cat, pattern in _TRANSITION_RE.items() if pattern.search(lower)}


def transition_score(n_categories: int) -> float:
    """0 for none; 0.4 for one category, +0.05 per extra category, capped at 1.0."""
    return 0.0 if n_categories <= 0 else min(1.0, 0.4 + 0.05 * (n_categories - 1))


def jaccard(a: set[str], b: set[str]) -> float:
    """|a & b| / |a | b| (0 when both are empty)."""
    union = a | b
    return len(a & b) / len(union) if union else 0.0


def plateau(r: float, lo: float, full_lo: float, full_hi: float, hi: float) -> tuple[float, bool]:
    """Trapezoid score in [0, 1] and whether ``r`` is in range ``[lo, hi]`` (outside: stop).

    1 on ``[full_lo, full_hi]``, linear ramps on ``[lo, full_lo)`` and ``(full_hi, hi]``.
    """
    if math.isnan(r):
        return 0.0, False
    if r < lo or r > hi:
        return 0.0, False
    if r < full_lo:
        return (r - lo) / (full_lo - lo), True
    if r > full_hi:
        return 1.0 - (r - full_hi) / (hi - full_hi), True
    return 1.0, True


@dataclass(frozen=True)
class WritingTiers:
    """Thresholds of one writing reward (see the module docstring)."""

    tokens: tuple[int, int]
    length: tuple[float, float, float, float]  # lo, full_lo, full_hi, hi
    distinct: tuple[float, float, float, float]
    transitions_in_both: bool
    jaccard_cap: float = 0.03
    weights: tuple[float, float, float, float] = (0.5, 1.0, 0.5, 1.0)  # structure, length, distinct, style


TLDR_TIERS = WritingTiers(
    tokens=(8, 256), length=(1.1, 1.6, 3.2, 5.0), distinct=(1.3, 2.0, math.inf, math.inf), transitions_in_both=False
)
ARXIV_TIERS = WritingTiers(
    tokens=(128, 256), length=(0.8, 1.3, 1.6, 2.0), distinct=(0.5, 0.7, 1.3, 1.7), transitions_in_both=True
)

LEVELS = ("level/structure", "level/length", "level/distinct", "level/style")


def score_writing(c1: str, c2: str, tiers: WritingTiers) -> dict[str, float]:
    """The tiered team reward of one joint answer, with each level's fraction and the raw measures."""
    out = {key: 0.0 for key in LEVELS}
    n1, n2 = count_tokens(c1), count_tokens(c2)
    w1, w2 = distinct_words(c1), distinct_words(c2)
    length_ratio = len(c2) / len(c1) if c1 else 0.0
    distinct_ratio = len(w2) / len(w1) if w1 else 0.0
    cats = transition_categories(c1 + "\n" + c2 if tiers.transitions_in_both else c2)
    jac = jaccard(content_words(c1), content_words(c2))
    out.update(
        {
            "metric/tokens_1": float(n1),
            "metric/tokens_2": float(n2),
            "metric/length_ratio": length_ratio,
            "metric/distinct_ratio": distinct_ratio,
            "metric/transition_categories": float(len(cats)),
            "metric/jaccard": jac,
        }
    )
    lo, hi = tiers.tokens
    levels = []
    if lo <= n1 <= hi and lo <= n2 <= hi:
        levels.append(1.0)
        length, ok = plateau(length_ratio, *tiers.length) if c1 else (0.0, False)
        levels.append(length)
        if ok:
            distinct, ok = plateau(distinct_ratio, *tiers.distinct) if w1 else (0.0, False)
            levels.append(distinct)
            if ok:
                overlap = min(jac, tiers.jaccard_cap) / tiers.jaccard_cap
                levels.append(0.4 * transition_score(len(cats)) + 0.6 * overlap)
    for key, value in zip(LEVELS, levels):
        out[key] = value
    out["reward"] = float(sum(w * v for w, v in zip(tiers.weights, levels)))
    return out


def split_marked(answer: str) -> tuple[str, str]:
    """Split a single-agent answer at the ``PART 2`` marker line: (part 1, part 2); part 2 is '' without it."""
    match = _MARKER_LINE.search(answer)
    if match is None:
        return answer.strip(), ""
    first = _PART1_LINE.sub("", answer[: match.start()].strip(), count=1)
    return first.strip(), answer[match.end() :].strip()


class WritingReward(TeamReward):
    """Tiered writing reward (module docstring); with one agent the answer is split at the marker."""

    level_names = LEVELS

    def __init__(self, num_agents: int, name: str, tiers: WritingTiers) -> None:
        super().__init__(num_agents, name)
        self.tiers = tiers
        self.max_reward = sum(tiers.weights)

    def score_batch(self, agent_completions: list[list[str]], rows: list[dict]) -> list[dict[str, float]]:
        if self.num_agents == 1:
            pairs = [split_marked(a) for a in agent_completions[0]]
        else:
            pairs = list(zip(agent_completions[0], agent_completions[1]))
        return [score_writing(c1, c2, self.tiers) for c1, c2 in pairs]


# --- environments ---------------------------------------------------------------------------------


class WritingEnv(Env):
    """Two agents write complementary parts of one text; see the module docstring for the reward."""

    agent_counts = (1, 2)
    hub_id: str = ""
    tiers: WritingTiers
    prompts: tuple[str, str, str]  # agent 1, agent 2, single agent; each with {text}

    def __init__(self, num_agents: int = 2, *, jaccard_cap: float | None = None) -> None:
        """``jaccard_cap``: Jaccard similarity that earns the full overlap score (default 0.03, as specified;
        the published arxiv code used 0.23)."""
        super().__init__(num_agents)
        if jaccard_cap is not None and not 0 < jaccard_cap <= 1:
            raise ValueError(f"{self.name}: jaccard_cap must be in (0, 1], got {jaccard_cap}.")
        tiers = self.tiers if jaccard_cap is None else dataclasses.replace(self.tiers, jaccard_cap=jaccard_cap)
        self.reward_func = WritingReward(num_agents, self.name, tiers)
        self.external_transition = None

    def _text(self, row: dict) -> str:
        raise NotImplementedError

    def _formatter(self, template: str) -> Formatter:
        def format_prompt(row: dict) -> str:
            return template.format(text=self._text(row))

        return format_prompt

    def formatters(self) -> list[Formatter]:
        if self.num_agents == 1:
            return [self.single_formatter()]
        return [self._formatter(self.prompts[0]), self._formatter(self.prompts[1])]

    def single_formatter(self) -> Formatter:
        return self._formatter(self.prompts[2])

    def split_single(self, answer: str, row: dict) -> list[str]:
        return [answer] if self.num_agents == 1 else list(split_marked(answer))


def _post_text(row: dict) -> str:
    """The post of a tldr row: a ``prompt`` ("SUBREDDIT/TITLE/POST ... TL;DR:") or ``post`` (+ title)."""
    if row.get("prompt") is not None:
        text = str(row["prompt"])
    elif row.get("post") is None:
        raise ComlrlError(f"tldr row has neither 'prompt' nor 'post' (fields: {sorted(row)}).")
    else:
        parts = [
            f"SUBREDDIT: r/{row['subreddit']}" if row.get("subreddit") else "",
            f"TITLE: {row['title']}" if row.get("title") else "",
        ]
        text = "\n\n".join([p for p in parts if p] + [f"POST: {row['post']}"])
    return re.sub(r"\s*TL;DR:\s*$", "", text.strip())


@register("tldr")
class TldrEnv(WritingEnv):
    """Summarise a Reddit post: agent 1 concise, agent 2 detailed (2 agents; 1 = single-agent baseline)."""

    name = "tldr"
    description = "summarize a Reddit post: agent 1 concise, agent 2 detailed"
    defaults = {"max_new_tokens": 256, "num_turns": 1}
    hub_id = "trl-lib/tldr"
    default_data = f"{PACKAGED['tldr'].describe()}; online: source={hub_id}"
    tiers = TLDR_TIERS
    prompts = (
        "Summarize the Reddit post below in one or two short, factual sentences. A teammate writes a longer, "
        "detailed summary of the same post, so keep yours brief.\n\n{text}\n\nConcise summary:",
        "Write a detailed summary of the Reddit post below. A teammate writes a one- or two-sentence summary, so "
        "make yours about two to three times longer, use a richer, more varied vocabulary, and connect the ideas "
        "with transition words (for example: moreover, however, as a result, for instance)."
        "\n\n{text}\n\nDetailed summary:",
        "Write two summaries of the Reddit post below. First a concise, factual summary in one or two sentences. "
        f"Then a line containing only {MARKER}, followed by a detailed summary about two to three times longer "
        "than the first, with a richer vocabulary and transition words for flow.\n\n{text}\n\nConcise summary:",
    )

    def _text(self, row: dict) -> str:
        return _post_text(row)

    def roles(self) -> list[str]:
        if self.num_agents == 1:
            return ["both summaries, separated by the marker line"]
        return ["a concise summary (one or two sentences)", "a detailed summary (two to three times longer)"]

    def load_dataset(self, source: Any = None, split: str = "train", limit: int | None = None) -> datasets.Dataset:
        """Reddit posts. ``source``: a local JSON/JSONL/parquet file with ``prompt`` (the ``trl-lib/tldr``
        layout) or ``post`` (+ ``title``, ``subreddit``), or a hub id (``trl-lib/tldr`` for the full data set).
        None reads the 100 posts shipped with the package (split ``train``, :mod:`.packaged`), never the
        network, so a run gets the same rows online and offline; the source used is logged at INFO."""

        def normalize(row: dict, i: int) -> dict:
            return {"prompt": _post_text(row), "completion": str(row.get("completion") or row.get("summary") or "")}

        return load_rows(
            source,
            split=split,
            limit=limit,
            required=[("prompt", "post")],
            normalize=normalize,
            default=PACKAGED[self.name].rows,
            default_label=PACKAGED[self.name].label,
            env_name=self.name,
        )


@register("arxiv")
class ArxivEnv(WritingEnv):
    """Expand an abstract into an introduction: agent 1 background/motivation, agent 2 method/implications."""

    name = "arxiv"
    description = "expand an abstract into an introduction: background/motivation + method/implications"
    defaults = {"max_new_tokens": 512, "num_turns": 1}
    hub_id = "OpenMLRL/arXiv_abstract"
    default_data = f"{PACKAGED['arxiv'].describe()}; online: source={hub_id}"
    tiers = ARXIV_TIERS
    prompts = (
        "You and a teammate are writing the introduction of a research paper from its abstract. Write the first "
        "part: the background and motivation (the problem, why it matters, what was missing before). Your "
        "teammate covers the method and its implications, so do not describe the method. Write about 150 to 200 "
        "words of plain prose.\n\nAbstract:\n{text}\n\nBackground and motivation:",
        "You and a teammate are writing the introduction of a research paper from its abstract. Write the second "
        "part: the methodology and its implications (how the paper approaches the problem, what the results "
        "mean). Your teammate covers the background and motivation, so do not repeat them. Write about 200 to "
        "250 words of plain prose.\n\nAbstract:\n{text}\n\nMethodology and implications:",
        "Write the introduction of a research paper from its abstract, in two parts. First the background and "
        "motivation (about 150 to 200 words). Then a line containing only "
        f"{MARKER}, followed by the methodology and its implications (about 200 to 250 words), without repeating "
        "the background.\n\nAbstract:\n{text}\n\nBackground and motivation:",
    )

    def _text(self, row: dict) -> str:
        return text_field(row, "abstract", "abstract_text").strip()

    def roles(self) -> list[str]:
        if self.num_agents == 1:
            return ["the whole introduction, in two parts separated by the marker line"]
        return ["the background and motivation", "the methodology and implications"]

    def load_dataset(self, source: Any = None, split: str = "train", limit: int | None = None) -> datasets.Dataset:
        """Abstracts. ``source``: a local file with ``abstract`` (a string) or ``abstract_text`` (a list of
        sentences), or a hub id (``OpenMLRL/arXiv_abstract``). None reads the 200 abstracts shipped with the
        package (split ``train``, :mod:`.packaged`), never the network; the source used is logged at INFO."""

        def normalize(row: dict, i: int) -> dict:
            abstract = text_field(row, "abstract", "abstract_text").strip()
            if not abstract:
                raise ValueError("the abstract is empty")
            return {"abstract": abstract, "article_id": str(row.get("article_id") or row.get("id") or i)}

        return load_rows(
            source,
            split=split,
            limit=limit,
            required=[("abstract", "abstract_text")],
            normalize=normalize,
            default=PACKAGED[self.name].rows,
            default_label=PACKAGED[self.name].label,
            env_name=self.name,
        )
