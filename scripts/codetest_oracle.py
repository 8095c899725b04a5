"""Check the codetest oracle on every problem: the canonical solution as agent 1 and the problem's hidden asserts as
agent 2 should earn the maximum team reward (7.0). Also prints the mutant statistics.

    python scripts/codetest_oracle.py                      # MBPP (all 974 tasks) and HumanEval (164)
    python scripts/codetest_oracle.py --benchmark humaneval --limit 20 --json out.json

Everything runs in the sandbox (a few programs per problem, ~20 sandbox runs; about 15-30 minutes on 2 cores
for everything). Problems below the maximum are listed with the level they lost.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

from comlrl import envs
from comlrl.envs.coding.codetest_asserts import hidden_asserts
from comlrl.envs.coding.tasks import task_from_row

MBPP_SPLITS = ("prompt", "test", "validation", "train")


def check(benchmark: str, limit: int | None, batch: int) -> dict:
    env = envs.make("codetest", benchmark=benchmark)
    splits = MBPP_SPLITS if benchmark == "mbpp" else ("test",)
    rows = [dict(r) for split in splits for r in env.load_dataset(split=split)]
    rows = rows[:limit] if limit else rows
    scores = []
    start = time.time()
    for lo in range(0, len(rows), batch):
        part = rows[lo : lo + batch]
        tests = ["\n".join(hidden_asserts(task_from_row(r), env.reward_func.max_tests)) for r in part]
        scores += env.reward_func.score([r["canonical_solution"] for r in part], tests, batch_items=part)
        print(f"{benchmark}: {len(scores)}/{len(rows)} ({time.time() - start:.0f} s)", file=sys.stderr)
    below = []
    for row, score in zip(rows, scores):
        if score["reward"] < env.reward_func.max_reward - 1e-9:
            lost = [k for k in env.reward_func.level_names if score[k] < 1.0]
            below.append({"task_id": row["task_id"], "reward": score["reward"], "levels_below_1": lost})
    n_mutants = [s["metric/n_mutants"] for s in scores]
    return {
        "benchmark": benchmark,
        "problems": len(rows),
        "at_maximum": len(rows) - len(below),
        "below_maximum": below,
        "mean_mutants": statistics.fmean(n_mutants),
        "no_mutants": sum(n == 0 for n in n_mutants),
        "max_mutants": env.reward_func.max_mutants,
        "full_mutants": sum(n == env.reward_func.max_mutants for n in n_mutants),
        "foil_judged": sum(s["metric/foil_judged"] for s in scores),
        "unjudged": sum(s["metric/unjudged"] for s in scores),
        "mean_equivalent_dropped": statistics.fmean(s["metric/n_equivalent"] for s in scores),
        "seconds": round(time.time() - start, 1),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--benchmark", choices=("mbpp", "humaneval", "both"), default="both")
    parser.add_argument("--limit", type=int, default=None, help="problems per benchmark (default: all)")
    parser.add_argument("--batch", type=int, default=32, help="problems per reward call")
    parser.add_argument("--json", default=None, help="write the results here")
    ns = parser.parse_args(argv)
    names = ("mbpp", "humaneval") if ns.benchmark == "both" else (ns.benchmark,)
    results = [check(name, ns.limit, ns.batch) for name in names]
    for r in results:
        print(
            f"{r['benchmark']}: {r['at_maximum']}/{r['problems']} at the maximum; mutants per problem "
            f"{r['mean_mutants']:.2f} (none: {r['no_mutants']}, the full {r['max_mutants']}: {r['full_mutants']}); "
            f"equivalent on the hidden tests, dropped: {r['mean_equivalent_dropped']:.2f} per problem; judged by foils: "
            f"{r['foil_judged']:.0f}, by nothing: {r['unjudged']:.0f}; {r['seconds']} s"
        )
        for b in r["below_maximum"]:
            print(f"  {b['task_id']}: {b['reward']:.3f} ({', '.join(b['levels_below_1'])})")
    if ns.json:
        with open(ns.json, "w") as fh:
            json.dump(results, fh, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
