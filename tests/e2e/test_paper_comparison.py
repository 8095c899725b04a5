"""benchmarks/paper_comparison.py: the plan at its default sizes, and the whole pipeline on a tiny model (--smoke)."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "paper_comparison.py"


@pytest.fixture(scope="module")
def paper():
    spec = importlib.util.spec_from_file_location("paper_comparison", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    yield module
    del sys.modules[spec.name]


def test_default_plan_fits_the_budget_and_holds_every_condition(paper, tmp_path, capsys):
    assert paper.main(["--out", str(tmp_path / "plan"), "--dry-run"]) == 0
    text = capsys.readouterr().out
    assert not (tmp_path / "plan").exists()  # a dry run writes nothing
    trains, compares = paper.build_plan(tmp_path, paper.Sizes())
    assert sum(paper.estimate(trains, compares).values()) / 60 <= paper.BUDGET_MINUTES
    assert "warning" not in text
    tldr = [c for c in compares if c.task == "tldr"]
    assert [c.name for c in tldr] == ["tldr-strict-s1", "tldr-published-s1", "tldr-strict-s1-crossplay"]
    crossplay = tldr.pop()
    team = str(tmp_path / "runs" / "tldr-strict-team-s1")
    assert dict(crossplay.conditions) == {
        "untrained": "untrained:UNTRAINED",
        "team": f"run:{team}",
        "trained0+untrained1": f"mix:{team},untrained",
        "untrained0+trained1": f"mix:untrained,{team}",
        "swapped": f"mix:{team}#1,{team}#0",
    }
    assert (crossplay.rows, crossplay.samples) == (40, 2)
    every = ["untrained", "team", "single-grpo", "single", "parallel", "sequential", "discussion"]
    for c in tldr:
        # the published comparison re-scores the strict one's baseline answers instead of generating them again
        names = [n for n, _ in c.conditions] + list(c.rescore)
        assert sorted(names) == sorted(every) and names[:3] == every[:3]
        assert (c.rows, c.samples) == (40, 4)
        assert f"{c.name}" in text and f"{len(c.conditions)} conditions x 40 rows x 4 samples" in text
    assert tldr[1].rescore_from == "tldr-strict-s1" and tldr[0].rescore == ()
    # the team and its single agent: the same steps and rows, twice the new tokens per agent, each reward trained on
    team, single = (t for t in trains if t.name.startswith("tldr-published-"))
    assert "env.options.reward=published" in team.sets and "env.options.reward=published" in single.sets
    assert "training.max_new_tokens=48" in team.sets and "training.max_new_tokens=96" in single.sets
    assert team.steps == single.steps and "training.eval_contributions=true" in team.sets


def test_a_second_seed_compares_only_its_trained_conditions(paper, tmp_path):
    trains, compares = paper.build_plan(tmp_path, paper.Sizes(seeds=(1, 2), rewards=("strict",), code=False))
    assert [t.name for t in trains] == [
        "tldr-strict-team-s1",
        "tldr-strict-single-s1",
        "tldr-strict-team-s2",
        "tldr-strict-single-s2",
    ]
    second = compares[1]
    assert second.name == "tldr-strict-s2" and second.untrained_from == "tldr-strict-team-s2"
    assert [n for n, _ in second.conditions] == ["untrained", "team", "single-grpo"]
    # cross-play pairs agent 0 of the first seed's team with agent 1 of the second's
    seeds = dict(compares[2].conditions)["seed1-agent0+seed2-agent1"]
    assert seeds == f"mix:{tmp_path / 'runs' / 'tldr-strict-team-s1'},{tmp_path / 'runs' / 'tldr-strict-team-s2'}"
    assert "training.seed=2" in trains[2].sets


def test_smoke_runs_the_pipeline_and_the_summary_holds_every_condition(paper, tmp_path):
    out = tmp_path / "smoke"
    assert paper.main(["--out", str(out), "--smoke"]) == 0
    summary = (out / "summary.md").read_text()
    trains, compares = paper.build_plan(out, paper.SMOKE)
    for job in compares:
        section = summary.split(f"### {job.title}\n", 1)[1].split("\n### ", 1)[0]
        data = json.loads((out / "compare" / job.name / "summary.json").read_text())
        assert list(data["conditions"]) == [n for n, _ in job.conditions]
        for name in [n for n, _ in job.conditions] + list(job.rescore):
            assert f"\n| {name} | " in section  # its row in the results table
            assert f"* **{name}**, row 0" in section  # its sample answers
        records = [json.loads(x) for x in (out / "compare" / job.name / "samples.jsonl").read_text().splitlines()]
        keys = {n: {(r["row"], r["key"]) for r in records if r["condition"] == n} for n, _ in job.conditions}
        assert len({frozenset(k) for k in keys.values()}) == 1  # every condition answered the same rows
    assert any(job.rescore for job in compares)
    assert "both comparisons' untrained teams gave the same answers" in summary
    assert "Contributions of the team condition's agents" in summary
    assert "pass@1" in summary  # the code task's own metric
    assert "\n| swapped | " in summary  # cross-play
    for t in trains:
        assert (out / "runs" / t.name / "final").is_dir()
    assert "commit: " in summary and "torch " in summary and "cores" in summary
    # a second run over the same folder reuses every finished step
    assert paper.main(["--out", str(out), "--smoke"]) == 0
    assert (out / "summary.md").read_text().split("* started")[0] == summary.split("* started")[0]
