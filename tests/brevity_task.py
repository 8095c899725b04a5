"""The slow learning tests' task: two agents summarize the same real Reddit post; the team is rewarded for a short
joint answer (1 - total words / 48, clipped at 0). Dense, so a few dozen updates of the embedded team move it."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from datasets import Dataset, load_dataset

from comlrl.engine.process import native_bf16

# The heavier slow tests fit the suite's budget only where bf16 is native: on a CPU without it (AVX2 only) bf16
# matmuls are emulated (~60x slower) and fp32, which bf16=None picks there, makes test_slow_actor_critic take 13
# minutes instead of ~4 (and MAAC's 12-step fp32 gain is 0.09, under the 0.1 the bf16 runs clear).
NEEDS_NATIVE_BF16 = pytest.mark.skipif(
    not native_bf16(torch.device("cpu")), reason="fits the CI budget only on a CPU with native bf16 (AVX512-BF16/AMX)"
)

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
