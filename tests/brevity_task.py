"""The slow learning tests' task: two agents summarize the same real Reddit post; the team is rewarded for a short
joint answer (1 - total words / 48, clipped at 0). Dense, so a few dozen updates of the embedded team move it."""

from __future__ import annotations

from pathlib import Path

from datasets import Dataset, load_dataset

FORMATTERS = [
    lambda e: "Summarize in one short sentence:\n" + e["post"],
    lambda e: "Summarize briefly:\n" + e["post"],
]


def team_brevity(a: list[str], b: list[str]) -> list[float]:
    return [1.0 - min(len(a[0].split()) + len(b[0].split()), 48) / 48]


def posts(shared_data: Path) -> tuple[Dataset, Dataset]:
    """(train rows 8..99, held-out rows 0..7) of the extra TL;DR posts, each cut to 300 characters."""
    ds = load_dataset("json", data_files=str(shared_data / "tldr_posts_extra.jsonl"), split="train")
    ds = ds.map(lambda e: {"post": e["prompt"][:300]})
    return ds.select(range(8, 100)), ds.select(range(8))
