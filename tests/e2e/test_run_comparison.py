"""evaluation.compare: a training run ends with the trained team beside the untrained team and baselines."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest
import toy_env
import yaml
from tiny import tiny_model, tiny_tokenizer

from comlrl import runconfig
from comlrl.cli import main
from comlrl.envs.core import registry
from comlrl.errors import ConfigError

QUICKSTART = Path(__file__).resolve().parents[2] / "configs" / "quickstart.yaml"
SPLIT, SplitToy = toy_env.SPLIT_NAME, toy_env.SplitToy


@pytest.mark.parametrize(
    "overrides, message",
    [
        (["evaluation.compare=[singel]"], "evaluation.compare: unknown baseline 'singel'. Did you mean 'single'?"),
        (["evaluation.compare=[single, single]"], "evaluation.compare: 'single' is listed twice"),
        (["evaluation.compare=single"], "evaluation.compare: expected a list of baselines"),
        (["evaluation.before=false"], "evaluation.compare needs evaluation.before: true"),
        (["evaluation.after=false", "evaluation.before=false"], "needs evaluation.before and evaluation.after"),
        (["data.eval_limit=0"], "evaluation.compare needs evaluation rows"),
    ],
)
def test_the_option_is_checked_when_the_config_loads(overrides, message):
    with pytest.raises(ConfigError, match=message.replace(".", r"\.").replace("?", r"\?").replace("[", r"\[")):
        runconfig.load_config(QUICKSTART, ["evaluation.compare=[single]", *overrides])
    assert runconfig.load_config(QUICKSTART).evaluation.compare == ["single"]  # the main job compares


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """A tiny trained run with evaluation before/after and compare: [single, parallel], and the config."""
    registry.register(SPLIT, SplitToy)
    root = tmp_path_factory.mktemp("run-compare")
    model = root / "model"
    tiny_model().save_pretrained(model)
    tiny_tokenizer().save_pretrained(model)
    rows = toy_env.write_rows(root / "rows.jsonl", n=10)
    cfg_path = toy_env.write_config(root / "toy.yaml", rows, str(model), max_steps=2, save_steps=0)
    cfg = yaml.safe_load(Path(cfg_path).read_text())
    cfg["env"]["name"] = SPLIT
    cfg["data"]["eval_limit"] = 3
    cfg["evaluation"] = {"before": True, "after": True, "compare": ["single", "parallel"]}
    cfg["report"] = True
    Path(cfg_path).write_text(yaml.safe_dump(cfg, sort_keys=False))
    assert main(["train", cfg_path, "--set", f"output_dir={root / 'run'}"]) == 0
    yield {"dir": root / "run", "config": cfg_path, "root": root}
    registry.ENVS.pop(SPLIT, None)


def test_the_team_rows_are_the_before_and_after_evaluations(run):
    folder = run["dir"] / "compare"
    summary = json.loads((folder / "summary.json").read_text())
    conditions = summary["conditions"]
    assert list(conditions) == ["trained", "untrained", "single", "parallel"] and summary["control"] == "untrained"
    before = json.loads((run["dir"] / "eval_before.json").read_text())
    after = json.loads((run["dir"] / "eval_after.json").read_text())
    assert conditions["untrained"]["reward"]["mean"] == pytest.approx(before["eval/reward/mean"])
    assert conditions["trained"]["reward"]["mean"] == pytest.approx(after["eval/reward/mean"])
    assert conditions["untrained"]["levels"]["level/longer"] == pytest.approx(before["eval/reward/level/longer"])
    assert conditions["untrained"]["difference"] == {"mean": 0.0, "low": 0.0, "high": 0.0}
    trained = conditions["trained"]["difference"]
    assert trained["mean"] == pytest.approx(after["eval/reward/mean"] - before["eval/reward/mean"])
    assert trained["low"] <= trained["mean"] <= trained["high"]
    assert summary["settings"]["rows"] == 3 and summary["settings"]["decoding"] == "greedy"
    # every condition answered the same three rows, by content
    samples = [json.loads(line) for line in (folder / "samples.jsonl").read_text().splitlines()]
    keys = {name: {(r["row"], r["key"]) for r in samples if r["condition"] == name} for name in conditions}
    assert len(keys["untrained"]) == 3 and all(k == keys["untrained"] for k in keys.values())
    with (folder / "results.csv").open() as fh:
        table = {r["condition"]: r for r in csv.DictReader(fh)}
    assert list(table) == list(conditions) and table["single"]["kind"] == "baseline"
    assert float(table["trained"]["reward_mean"]) == pytest.approx(after["eval/reward/mean"])
    assert (folder / "compare.png").stat().st_size > 0
    results = (folder / "results.md").read_text()
    assert "| trained |" in results and "| single |" in results and "vs untrained" in results


def test_the_baselines_answer_with_the_untrained_models(run, capsys):
    # the config's untrained models give the same greedy single-agent answers as the run's baseline
    out = run["root"] / "untrained.json"
    assert main(["eval", run["config"], "--baseline", "single", "--output", str(out)]) == 0
    untrained = json.loads(out.read_text())["single"]
    conditions = json.loads((run["dir"] / "compare" / "summary.json").read_text())["conditions"]
    assert conditions["single"]["reward"]["mean"] == pytest.approx(untrained["reward/mean"])


def test_the_report_has_the_comparison(run):
    report = (run["dir"] / "report.md").read_text()
    assert "## Comparison" in report and "(compare/results.md)" in report and "compare/compare.png" in report
    section = report.split("## Comparison")[1].split("\n## ")[0]
    assert all(f"| {name} |" in section for name in ("trained", "untrained", "single", "parallel"))
