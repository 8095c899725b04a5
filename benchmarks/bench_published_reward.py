"""Which hacks the published writing rewards pay for: the hack set of ``tests/envs/test_envs_writing.py`` (the one
``bench_tldr_honest.py`` counts) scored by the strict reward (the default) and by ``reward="published"``.

Per env (tldr, arxiv) and hack: the team reward of the hack alone on each of the two packaged rows with honest
answers (row a / row b), under each reward; and under the published reward, the largest change the hack makes when
added to the honest answer (appended to both agents' answers or to agent 2's alone, cut to 250 tokens as the tests
add it). Prints one markdown table per env (the tables in docs/environments.md)::

    python benchmarks/bench_published_reward.py
"""

from __future__ import annotations

import sys
from pathlib import Path

import comlrl.envs as envs

ROOT = Path(__file__).resolve().parent.parent
REWARDS = ("strict", "published")


def _add(text: str, more: str) -> str:
    """``more`` appended on a new line, cut to the room left under 250 tokens (as the tests add it)."""
    return text + "\n" + " ".join(more.split()[: max(0, 250 - len(text.split()))])


def measure(name: str) -> dict[str, dict[str, list[float]]]:
    """Hack (and "honest answer") -> column -> one value per packaged row with honest answers."""
    sys.path.insert(0, str(ROOT / "tests"))
    import test_envs_writing as t  # the hack set and its honest answers, as the tests build them

    out: dict[str, dict[str, list[float]]] = {}
    for env_name, index in t.HONEST:
        if env_name != name:
            continue
        row = t._packaged_row(name, index)
        honest = t.HONEST[(name, index)]
        rewards = {r: envs.make(name, reward=r).reward_func for r in REWARDS}

        def score(reward: str, c1: str, c2: str) -> float:
            return rewards[reward]([c1], [c2], batch_items=[row])[0]  # noqa: B023 - used inside this iteration

        base = score("published", *honest)
        cases = {"honest answer": honest, **t.writing_hacks(name, row, honest), "swapped roles": honest[::-1]}
        for hack, (c1, c2) in cases.items():
            cols = out.setdefault(hack, {})
            for reward in REWARDS:
                cols.setdefault(reward, []).append(score(reward, c1, c2))
            if hack in ("honest answer", "swapped roles"):
                continue
            h1, h2 = honest
            added = max(score("published", a, b) - base for a, b in ((_add(h1, c1), _add(h2, c2)), (h1, _add(h2, c2))))
            cols.setdefault("added", []).append(added)
    return out


def table(name: str, rows: dict[str, dict[str, list[float]]]) -> str:
    """A markdown table of :func:`measure`'s values."""

    def cell(values: list[float] | None, signed: bool = False) -> str:
        if not values:
            return ""
        return " / ".join(f"{v:+.2f}" if signed else f"{v:.2f}" for v in values)

    lines = [
        f"| {name}: hack (row a / row b) | strict | published | published, added to the honest answer |",
        "|---|---|---|---|",
    ]
    for hack, cols in rows.items():
        lines.append(
            f"| {hack} | {cell(cols['strict'])} | {cell(cols['published'])} | {cell(cols.get('added'), signed=True)} |"
        )
    return "\n".join(lines)


def main() -> None:
    for name in ("tldr", "arxiv"):
        print(table(name, measure(name)))
        print()


if __name__ == "__main__":
    main()
