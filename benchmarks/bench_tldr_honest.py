"""The tldr reward's two error rates: honest answers it fails to count, and cheap answers it fails to catch.

* Honest: the hand-written pairs of ``tests/data/tldr_honest_pairs.json`` (24 packaged posts, a concise and a
  detailed answer in two styles: close to the post's wording, and paraphrased). A pair is counted when its team
  reward is above 0; per level, the share of pairs that earn points on it; per agent, the share of sentence
  characters that count (``metric/counted_1/2``).
* Hacks: the hack set of ``tests/envs/test_envs_writing.py`` (``writing_hacks`` on its honest answers, tldr and arxiv).
  A hack alone is caught when it scores at most 0.5; a hack added to an honest answer (to both agents' answers or
  to agent 2's alone) is caught when it does not raise the honest score.

    python benchmarks/bench_tldr_honest.py
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

import comlrl.envs as envs
from comlrl.envs.writing import LEVELS

ROOT = Path(__file__).resolve().parent.parent
PAIRS = ROOT / "tests" / "data" / "tldr_honest_pairs.json"


def honest_rates() -> dict[str, float]:
    """Shares of the honest pairs counted (reward > 0), per style and per level, and mean rewards."""
    env = envs.make("tldr")
    rows = env.load_dataset()
    pairs = json.loads(PAIRS.read_text())["pairs"]
    scores = env.reward_func.score(
        [p["concise"] for p in pairs], [p["detailed"] for p in pairs], batch_items=[rows[p["row"]] for p in pairs]
    )
    out: dict[str, float] = {"pairs": len(pairs)}
    for style in (None, "close", "paraphrase"):
        picked = [s for p, s in zip(pairs, scores) if style in (None, p["style"])]
        tag = style or "all"
        out[f"{tag}/counted"] = sum(s["reward"] > 0 for s in picked) / len(picked)
        out[f"{tag}/reward_mean"] = statistics.fmean(s["reward"] for s in picked)
        for level in LEVELS:
            out[f"{tag}/{level}"] = sum(s[level] > 0 for s in picked) / len(picked)
        for agent in (1, 2):
            out[f"{tag}/sentence_chars_counted_{agent}"] = statistics.fmean(
                s[f"metric/counted_{agent}"] for s in picked
            )
    return out


def _add(text: str, more: str) -> str:
    """``more`` appended on a new line, cut to the room left under 250 tokens (as the tests add it)."""
    return text + "\n" + " ".join(more.split()[: max(0, 250 - len(text.split()))])


def hack_rates() -> dict[str, float]:
    """Shares of the test file's hacks caught, alone and added to honest work."""
    sys.path.insert(0, str(ROOT / "tests"))
    import test_envs_writing as t  # the hack set and its honest answers, as the tests build them

    alone = added = alone_caught = added_caught = 0
    for name, index in t.HONEST:
        row = t._packaged_row(name, index)
        reward = t._writing_reward(name, row)
        honest = reward(*t.HONEST[(name, index)])
        for hack, (c1, c2) in t.writing_hacks(name, row, t.HONEST[(name, index)]).items():
            alone += 1
            alone_caught += reward(c1, c2) <= 0.5
            if hack == "generic text for any input":  # the documented limit, left out by the test as well
                continue
            h1, h2 = t.HONEST[(name, index)]
            for a, b in ((_add(h1, c1), _add(h2, c2)), (h1, _add(h2, c2))):
                added += 1
                added_caught += reward(a, b) <= honest + 1e-9
    return {
        "hacks_alone": alone,
        "hacks_alone/caught": alone_caught / alone,
        "hacks_added": added,
        "hacks_added/caught": added_caught / added,
    }


def main() -> None:
    for key, value in {**honest_rates(), **hack_rates()}.items():
        print(f"{key:45s} {value:.3f}" if isinstance(value, float) else f"{key:45s} {value}")


if __name__ == "__main__":
    main()
