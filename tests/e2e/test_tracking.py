"""One run per directory: a tracker refuses another run's metrics unless it resumes or overwrites them."""

import json
import shutil

import pytest
import toy_env
from tiny import tiny_model, tiny_tokenizer

from comlrl import report
from comlrl.cli import main
from comlrl.configs.policy import MAGRPOConfig
from comlrl.errors import ConfigError
from comlrl.tracking import RUN_INFO_FILE, Tracker, read_metrics, read_run_info
from comlrl.trainers.magrpo import MAGRPOTrainer

ROWS = [{"prompt": f"Task {i}: say something."} for i in range(4)]


def log_run(folder, steps, **kw):
    tracker = Tracker(folder, **kw)
    for step in steps:
        tracker.log({"step": step, "reward/mean": step / 10}, step)
    tracker.log_samples([{"row": 0, "reward": 0.0, "completions": ["a", "b"]}], steps[-1])
    tracker.close()
    return tracker


def test_a_used_directory_is_refused_before_anything_is_written(tmp_path):
    log_run(tmp_path, [1, 2, 3])
    before = (tmp_path / "metrics.jsonl").read_text()
    with pytest.raises(ConfigError) as err:
        Tracker(tmp_path)
    text = str(err.value)
    assert str(tmp_path) in text and "previous run" in text and "steps 1-3" in text
    assert "new output_dir" in text and "overwrite_output_dir=True" in text and "resume_from_checkpoint" in text
    assert (tmp_path / "metrics.jsonl").read_text() == before
    (tmp_path / "metrics.jsonl").write_text("")  # an empty file (a resume that found no checkpoint) holds no run
    Tracker(tmp_path)


def test_overwrite_replaces_the_previous_metrics_and_samples(tmp_path):
    log_run(tmp_path, [1, 2, 3, 4], trainer="MAREINFORCETrainer")
    tracker = Tracker(tmp_path, trainer="MAGRPOTrainer", overwrite=True)
    assert [r["step"] for r in read_metrics(tmp_path)] == [1, 2, 3, 4]  # nothing is removed before the first write
    tracker.log({"step": 1, "reward/mean": 0.5}, 1)
    tracker.log_samples([{"row": 1, "reward": 0.5, "completions": ["x", "y"]}], 1)
    assert read_metrics(tmp_path) == [{"step": 1, "reward/mean": 0.5}]
    assert sorted(p.name for p in (tmp_path / "samples").iterdir()) == ["eval-step000001.jsonl"]
    assert read_run_info(tmp_path)["trainer"] == "MAGRPOTrainer"


def test_resume_appends_after_the_checkpoint_loader_truncated_the_metrics(tmp_path):
    """A Python-API resume: the lines after checkpoint-2 are dropped, then steps 3-4 are appended once."""

    def trainer():
        args = MAGRPOConfig(
            per_device_train_batch_size=2,
            num_generations=2,
            max_new_tokens=4,
            max_steps=4,
            learning_rate=1e-2,
            disable_tqdm=True,
            output_dir=str(tmp_path),
            save_steps=2,
            seed=5,
        )
        t = MAGRPOTrainer(
            model=tiny_model(),
            tokenizer=tiny_tokenizer(),
            train_dataset=ROWS,
            args=args,
            reward_func=lambda a, b: [float(len(b[0]) - len(a[0]))],
            formatters=[lambda e: e["prompt"], lambda e: e["prompt"] + " More:"],
        )
        return t

    first = trainer()
    first.tracker = Tracker(tmp_path, trainer=type(first).__name__)
    first.train()
    lines = read_metrics(tmp_path)
    assert [r["step"] for r in lines] == [1, 2, 3, 4]
    with pytest.raises(ConfigError, match="previous run"):
        Tracker(tmp_path, trainer="MAGRPOTrainer")
    again = trainer()
    again.tracker = Tracker(tmp_path, trainer=type(again).__name__, resume=True, overwrite=True)  # resume wins
    again.train(resume_from_checkpoint=str(tmp_path / "checkpoint-2"))
    resumed = read_metrics(tmp_path)
    assert [r["step"] for r in resumed] == [1, 2, 3, 4]
    assert resumed[:2] == lines[:2]  # kept, not rewritten
    assert read_run_info(tmp_path)["trainer"] == "MAGRPOTrainer"


def test_cli_resume_continues_a_run_directory(tmp_path, capsys):
    tiny = tmp_path / "tiny"
    tiny_model().save_pretrained(tiny)
    tiny_tokenizer().save_pretrained(tiny)
    run = tmp_path / "run"
    with toy_env.registered():
        cfg = toy_env.write_config(
            tmp_path / "toy.yaml",
            toy_env.write_rows(tmp_path / "rows.jsonl"),
            str(tiny),
            max_steps=2,
            save_steps=1,
            save_total_limit=None,
        )
        assert main(["train", cfg, "--set", f"output_dir={run}"]) == 0
        shutil.rmtree(run / "checkpoint-2")  # as if the run had been killed during step 2
        (run / "metrics.jsonl").write_text((run / "metrics.jsonl").read_text() + '{"step": 2, "reward')
        assert main(["train", cfg, "--set", f"output_dir={run}"]) == 2
        assert "--resume" in capsys.readouterr().err
        assert main(["train", cfg, "--set", f"output_dir={run}", "--resume"]) == 0
    assert [r["step"] for r in read_metrics(run)] == [1, 2]
    assert [bool(s["resumed_from"]) for s in json.loads((run / "run.json").read_text())["starts"]] == [False, True]
    assert read_run_info(run)["trainer"] == "MAGRPOTrainer" and read_run_info(run)["config"]["algorithm"] == "magrpo"


def test_report_of_a_python_api_run_names_its_trainer(tmp_path):
    log_run(tmp_path, [1, 2, 3], trainer="MAGRPOTrainer", config={"training": {"seed": 7, "learning_rate": 0.01}})
    assert not (tmp_path / "config.yaml").exists() and (tmp_path / RUN_INFO_FILE).is_file()
    text = report.write_report(tmp_path)["markdown"].read_text()
    assert "algorithm: **magrpo (MAGRPOTrainer)**" in text and "seed: 7" in text and "learning_rate=0.01" in text
    assert "algorithm: **?**" not in text
    flat = tmp_path / "flat"  # the trainer's arguments as they are (args.to_dict())
    log_run(flat, [1], trainer="MARLOOTrainer", config={"seed": 9, "num_agents": 3, "beta": 0.0})
    text = report.write_report(flat)["markdown"].read_text()
    assert "algorithm: **marloo (MARLOOTrainer)**" in text and "seed: 9" in text and "team: 3 agents" in text
    assert "environment" not in text.splitlines()[2]  # not known outside a run config
    custom = tmp_path / "custom"
    log_run(custom, [1], trainer="MyTrainer")
    assert "algorithm: **MyTrainer**" in report.write_report(custom)["markdown"].read_text()
