"""Summarise a codetest training run's held-out evaluations (before / after): the team reward, the coder's share
(defined + syntax + hidden tests, of 3.0), the tester's share (written + valid + mutants killed, of 3.0), the joint
agreement (of 1.0), pass@1, validity and kill rate (``env.evaluate`` on the saved answers), and the paired
per-problem gain with its standard error.

    python scripts/codetest_learning_summary.py RUN_DIR     # reads RUN_DIR/samples/eval-{before,after}.jsonl
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

from comlrl import envs
from comlrl.envs.coding.codetest_judge import WEIGHTS

CODER = ("level/defined", "level/syntax", "level/hidden_tests")
TESTER = ("level/tests_written", "level/tests_valid", "level/mutants_killed")


def _read(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def summarize(run_dir: Path, benchmark: str = "mbpp") -> dict:
    env = envs.make("codetest", benchmark=benchmark)
    rows = [dict(r) for r in env.load_dataset(split="test")]
    by_prompt = {env.formatters()[0](r): r for r in rows}
    out = {}
    rewards = {}
    for phase in ("before", "after"):
        samples = _read(run_dir / "samples" / f"eval-{phase}.jsonl")
        items = [by_prompt[s["prompts"][0]] for s in samples]
        answers = [[s["completions"][0] for s in samples], [s["completions"][1] for s in samples]]
        scores = env.reward_func.score(*answers, batch_items=items)
        metrics = env.evaluate(answers, items)
        mean = {k: statistics.fmean(s[k] for s in scores) for k in WEIGHTS}
        out[phase] = {
            "reward": statistics.fmean(s["reward"] for s in scores),
            "coder_share": sum(WEIGHTS[k] * mean[k] for k in CODER),
            "tester_share": sum(WEIGHTS[k] * mean[k] for k in TESTER),
            "agreement": mean["level/agreement"],
            **{k: mean[k] for k in WEIGHTS},
            "pass@1": metrics["pass@1"],
            "validity_rate": metrics["validity_rate"],
            "kill_rate": metrics["kill_rate"],
            "counted_asserts": statistics.fmean(s["metric/n_tests"] for s in scores),
            "sharp_asserts": statistics.fmean(s["metric/n_sharp"] for s in scores),
            "uninformative_asserts": statistics.fmean(s["metric/uninformative"] for s in scores),
        }
        rewards[phase] = [s["reward"] for s in scores]
    gains = [a - b for a, b in zip(rewards["after"], rewards["before"])]
    out["gain"] = {
        "mean": statistics.fmean(gains),
        "se": statistics.stdev(gains) / len(gains) ** 0.5 if len(gains) > 1 else 0.0,
        "problems_up": sum(g > 0 for g in gains),
        "problems_down": sum(g < 0 for g in gains),
        "problems": len(gains),
    }
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("run_dir", type=Path)
    parser.add_argument("--benchmark", default="mbpp", choices=("mbpp", "humaneval"))
    ns = parser.parse_args(argv)
    result = summarize(ns.run_dir, ns.benchmark)
    for key in result["before"]:
        print(f"{key:28s} {result['before'][key]:8.3f} {result['after'][key]:8.3f}")
    print(json.dumps(result["gain"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
