"""The command line and run configs: validation with suggestions, overrides, paths, an end-to-end quick start."""

import json
import logging
import shutil
import subprocess
import sys
import types
from pathlib import Path

import pytest
import toy_env
import yaml
from tiny import tiny_model, tiny_tokenizer

from comlrl import runconfig
from comlrl.cli import main
from comlrl.errors import ConfigError
from comlrl.rollout.topology import TOPOLOGIES
from comlrl.tracking import Tracker, read_metrics

REPO = Path(__file__).resolve().parents[2]
CONFIGS = REPO / "configs"
ENVS = ("tldr", "arxiv", "humaneval", "coophumaneval", "mbpp", "classeval", "codetest", "bfcl", "blocks")
ALGOS = ("magrpo", "mareinforce", "marloo", "maremax", "iac", "maac", "centralized_magrpo", "madpo", "marlhf")


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("tiny") / "model"
    tiny_model().save_pretrained(path)
    tiny_tokenizer().save_pretrained(path)
    return str(path)


def test_every_example_config_loads_and_validates():
    files = sorted(CONFIGS.glob("*.yaml"))
    expected = {f"{e}_{a}.yaml" for e in ENVS for a in ALGOS} | {"quickstart.yaml"}
    assert expected <= {f.name for f in files}
    for path in files:
        cfg = runconfig.load_config(path)
        if path.stem.endswith("_single_grpo"):  # the equal-budget single agent: GRPO is magrpo with one agent
            assert (cfg.env.name, cfg.algorithm, cfg.env.format) == (path.stem.split("_")[0], "magrpo", "single")
        elif path.stem.split("_")[-1] in TOPOLOGIES:  # <env>_magrpo_<topology>: MAGRPO under that topology
            env, algo, topology = path.stem.split("_")
            assert (cfg.env.name, cfg.algorithm, cfg.trainer_config().topology) == (env, algo, topology)
        elif path.stem != "quickstart":
            env, algo = path.stem.split("_", 1)
            assert (cfg.env.name, cfg.algorithm) == (env, algo)
        args = cfg.trainer_config()
        assert args.num_generations >= 2
        assert args.max_steps > 0 or args.num_rounds * args.steps_per_round > 0  # MADPO counts rounds
        raw = (yaml.safe_load(path.read_text()).get("data") or {}).get("source")
        if raw and raw.startswith("../"):  # resolved against configs/, not the working directory
            assert cfg.data.source == str((CONFIGS / raw).resolve())
    coop = runconfig.load_config(CONFIGS / "coophumaneval_magrpo.yaml")
    assert coop.data.source == "OpenMLRL/CoopHumanEval"  # a hub id stays a hub id
    assert "local" in (CONFIGS / "coophumaneval_magrpo.yaml").read_text()  # and the file says how to go offline


def test_quickstart_uses_the_packaged_posts():
    cfg = runconfig.load_config(CONFIGS / "quickstart.yaml")
    assert cfg.model == "embedded" and cfg.env.name == "tldr" and cfg.evaluation.before and cfg.evaluation.after
    # tests/envs/test_packaged_data.py checks the rows
    assert cfg.data.source is None and cfg.data.eval_split == "holdout"


@pytest.mark.parametrize(
    "override, message",
    [
        ("training.learnig_rate=1e-5", "Did you mean 'training.learning_rate'?"),
        ("modle=embedded", "Did you mean 'model'?"),
        ("data.eval_limt=3", "Did you mean 'data.eval_limit'?"),
        ("env.name=tldrr", "Did you mean 'tldr'?"),
        ("algorithm=magrp", "Did you mean 'magrpo'?"),
        ("evaluation.befor=true", "Did you mean 'evaluation.before'?"),
        ("lora={r: 4, lora_alpa: 8}", "Did you mean 'lora.lora_alpha'?"),
        ("training.joint_mode=crosss", "Did you mean 'cross'?"),
    ],
)
def test_typos_fail_with_the_nearest_name(override, message):
    with pytest.raises(ConfigError) as err:
        runconfig.load_config(CONFIGS / "quickstart.yaml", [override])
    assert message in str(err.value)


def test_typo_in_a_file_through_the_cli(tmp_path, capsys):
    bad = tmp_path / "bad.yaml"
    bad.write_text("env: {name: tldr}\nmodel: embedded\ntrainig: {max_steps: 2}\n")
    assert main(["train", str(bad)]) == 2
    assert "unknown key 'trainig'. Did you mean 'training'?" in capsys.readouterr().err


def test_contradictions_and_invalid_values_are_rejected():
    q = CONFIGS / "quickstart.yaml"
    for sets, message in [
        (["agents=[embedded, embedded]"], "either model"),
        (["algorithm=mareinforce", "training.advantage_mode=mean"], "fixes it to 'none'"),
        (["training.loss_type=dr_grp"], "Did you mean 'dr_grpo'"),
        (["training.num_generations=1"], "training: MAGRPOConfig.num_generations"),
        (["resume=maybe"], "resume"),
        (["training.output_dir=x"], "top-level output_dir"),
    ]:
        with pytest.raises(ConfigError, match=message):
            runconfig.load_config(q, sets)


def test_set_values_are_yaml_and_paths_resolve_against_the_config_file(tmp_path, monkeypatch):
    sub = tmp_path / "configs"
    sub.mkdir()
    (tmp_path / "data").mkdir()
    path = sub / "run.yaml"
    path.write_text(
        "env: {name: tldr}\ndata: {source: ../data/posts.jsonl}\nagents: [./m1, HuggingFaceTB/SmolLM2-135M]\n"
    )
    monkeypatch.chdir(tmp_path / "data")
    cfg = runconfig.load_config(
        path,
        [
            "training.learning_rate=3e-4",
            "training.report_to=[tensorboard]",
            "data.limit=null",
            "evaluation.num_samples=5",
            "tokenizer=./tok",
            "agents.1=embedded",
        ],
    )
    assert cfg.data.source == str(tmp_path / "data" / "posts.jsonl")
    assert cfg.agents == [str(sub / "m1"), "embedded"]
    assert cfg.tokenizer == str(tmp_path / "data" / "tok")  # --set paths are relative to the working directory
    args = cfg.trainer_config()
    assert args.learning_rate == 3e-4 and args.report_to == ["tensorboard"] and cfg.evaluation.num_samples == 5
    with pytest.raises(ConfigError, match="KEY=VALUE"):
        runconfig.load_config(path, ["training.learning_rate"])


def test_env_defaults_fill_unset_training_fields():
    cfg = runconfig.load_config(CONFIGS / "humaneval_magrpo.yaml", ["training={max_steps: 3}"])
    from comlrl.envs import ENVS

    resolved = runconfig.resolved(cfg)
    assert resolved["training"]["max_new_tokens"] == ENVS["humaneval"].defaults["max_new_tokens"]
    assert resolved["training"]["max_steps"] == 3


def test_actor_critic_algorithms_are_registered():
    cfg = runconfig.load_config(CONFIGS / "quickstart.yaml", ["algorithm=maac", "training.critic_type=q"])
    assert type(cfg.trainer_config()).__name__ == "MAACConfig"
    with pytest.raises(ConfigError, match="critic_type"):
        runconfig.load_config(CONFIGS / "quickstart.yaml", ["algorithm=iac", "training.critic_type=q"])


def test_algorithm_registry_is_extensible():
    algo = runconfig.register_algorithm(
        "test-algo", "comlrl.trainers.magrpo:MAGRPOTrainer", "comlrl.configs:MAGRPOConfig"
    )
    try:
        cfg = runconfig.load_config(CONFIGS / "quickstart.yaml", ["algorithm=test-algo"])
        assert cfg.algo is algo
        with pytest.raises(ConfigError, match="already registered"):
            runconfig.register_algorithm("test-algo", "x:Y", "x:Z")
    finally:
        runconfig.ALGORITHMS.pop("test-algo")


def test_help_everywhere():
    for argv in (["--help"], ["train", "--help"], ["eval", "--help"], ["report", "--help"], ["envs", "--help"]):
        with pytest.raises(SystemExit) as done:
            main(argv)
        assert done.value.code == 0
    out = subprocess.run([sys.executable, "-m", "comlrl", "train", "--help"], capture_output=True, text=True, cwd=REPO)
    assert out.returncode == 0 and "--resume" in out.stdout and "data.eval_limit" in out.stdout


def test_envs_lists_every_environment(capsys):
    assert main(["envs"]) == 0
    out = capsys.readouterr().out
    for name in ENVS:
        assert f"{name}:" in out
    assert "defaults:" in out and "options:" in out
    assert "data (no source): 100 Reddit posts with their authors' TL;DR, packaged (tldr_posts.jsonl.gz" in out
    assert main(["envs", "--json"]) == 0
    listed = json.loads(capsys.readouterr().out)
    assert {e["name"] for e in listed} >= set(ENVS)


def test_quickstart_trains_end_to_end_with_a_tiny_model(tiny_dir, shared_data, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    sets = [
        f"model={tiny_dir}",
        "training.max_steps=2",
        "training.save_steps=2",
        "training.max_new_tokens=6",
        "training.max_prompt_length=32",
        "training.disable_tqdm=true",
        "data.limit=4",
        "data.eval_limit=2",
    ]
    assert main(["train", str(CONFIGS / "quickstart.yaml"), *[a for s in sets for a in ("--set", s)]]) == 0
    runs = list((tmp_path / "runs").iterdir())
    assert len(runs) == 1 and runs[0].name.startswith("quickstart-")
    run = runs[0]
    out = capsys.readouterr().out
    assert "before" in out and "after" in out and "reward/mean" in out and "report.md" in out
    resolved = yaml.safe_load((run / "config.yaml").read_text())
    assert (
        resolved["training"]["seed"] == 42
        and resolved["model"] == tiny_dir
        and resolved["output_dir"] == str(run.relative_to(tmp_path))
    )
    info = json.loads((run / "run.json").read_text())["starts"][0]
    assert info["seed"] == 42 and "commit" in info["git"]
    assert [r["step"] for r in read_metrics(run)] == [1, 2]
    assert {"reward/mean", "reward/std", "agent/0/completion/mean_length", "perf/rollout_tokens_per_s"} <= set(
        read_metrics(run)[0]
    )
    assert (run / "checkpoint-2" / "manifest.json").is_file()
    assert (run / "final" / "agent_1" / "adapter_config.json").is_file()  # the quick start trains LoRA adapters
    assert (run / "samples" / "eval-before.jsonl").is_file() and (run / "samples" / "eval-after.jsonl").is_file()
    assert (run / "report" / "reward.png").is_file() and (run / "report.md").is_file()
    # the main job's comparison: the trained and the untrained team, and agent 0 alone (untrained)
    compared = json.loads((run / "compare" / "summary.json").read_text())["conditions"]
    assert list(compared) == ["trained", "untrained", "single"] and "comparison:" in out
    before, after = (json.loads((run / f"eval_{t}.json").read_text())["eval/reward/mean"] for t in ("before", "after"))
    got = (compared["untrained"]["reward"]["mean"], compared["trained"]["reward"]["mean"])
    assert got == pytest.approx((before, after))
    assert "## Comparison" in (run / "report.md").read_text() and (run / "compare" / "compare.png").is_file()
    assert "seed 42" in (run / "train.log").read_text()
    # a second train into the same directory must not silently append to it
    assert (
        main(["train", str(CONFIGS / "quickstart.yaml"), "--set", f"output_dir={run}", "--set", f"model={tiny_dir}"])
        == 2
    )
    assert "--resume" in capsys.readouterr().err


def test_eval_command_team_and_evaluation_during_training(tiny_dir, tmp_path, capsys):
    with toy_env.registered():
        rows = toy_env.write_rows(tmp_path / "rows.jsonl")
        cfg = toy_env.write_config(tmp_path / "toy.yaml", rows, tiny_dir, eval_steps=1, max_steps=2)
        assert main(["eval", cfg, "--output", str(tmp_path / "eval.json")]) == 0
        team = json.loads((tmp_path / "eval.json").read_text())["team"]
        assert "eval/reward/mean" in team and "eval/reward/level/longer" in team
        assert main(["train", cfg, "--set", f"output_dir={tmp_path / 'run'}"]) == 0
    rows = read_metrics(tmp_path / "run")
    assert all("eval/reward/mean" in r for r in rows)  # eval_steps=1: every line carries its evaluation
    assert (tmp_path / "run" / "samples" / "eval-step000002.jsonl").is_file()


def test_eval_baselines(tiny_dir, tmp_path, capsys):
    baselines = pytest.importorskip("comlrl.envs.core.baselines")
    with toy_env.registered():
        rows = toy_env.write_rows(tmp_path / "rows.jsonl")
        cfg_path = toy_env.write_config(tmp_path / "toy.yaml", rows, tiny_dir)
        if not hasattr(baselines, "run_baseline"):
            pytest.skip("comlrl.envs.core.baselines.run_baseline is not there yet")
        assert main(["eval", cfg_path, "--baseline", "parallel", "--baseline", "sequential"]) == 0
    out = capsys.readouterr().out
    assert "parallel" in out and "sequential" in out


def test_report_to_sinks_are_optional(tmp_path, monkeypatch, caplog):
    monkeypatch.setitem(sys.modules, "torch.utils.tensorboard", None)  # not installed
    logged = []
    fake = types.SimpleNamespace(
        init=lambda **kw: types.SimpleNamespace(log=lambda d, step: logged.append((step, d)), finish=lambda: None)
    )
    monkeypatch.setitem(sys.modules, "wandb", fake)
    tracker = Tracker(tmp_path, ["tensorboard", "wandb"])
    with caplog.at_level(logging.WARNING, logger="comlrl"):
        tracker.log({"step": 1, "reward/mean": 0.5, "note": "x"}, 1)
    assert "tensorboard" in caplog.text and "pip install tensorboard" in caplog.text
    assert logged == [(1, {"reward/mean": 0.5})]
    assert read_metrics(tmp_path) == [{"step": 1, "reward/mean": 0.5, "note": "x"}]
    tracker.close()
    with pytest.raises(ConfigError, match="Did you mean 'wandb'"):
        Tracker(tmp_path, ["wandbb"])


@pytest.mark.parametrize(
    "algorithm, training",
    [
        ("madpo", {"max_steps": -1, "num_rounds": 2, "steps_per_round": 1, "prompts_per_round": 4, "save_steps": 1}),
        (
            "marlhf",
            {
                "preference_prompts": 6,
                "candidates_per_prompt": 3,
                "reward_model_training": "full",
                "reward_model_epochs": 1,
                "max_steps": 2,
                "save_steps": 1,
            },
        ),
    ],
)
def test_preference_algorithms_train_resume_and_report_from_the_cli(tiny_dir, tmp_path, capsys, algorithm, training):
    with toy_env.registered():
        rows = toy_env.write_rows(tmp_path / "rows.jsonl")
        cfg = toy_env.write_config(tmp_path / "toy.yaml", rows, tiny_dir, **training)
        run = tmp_path / "run"
        sets = ["--set", f"algorithm={algorithm}", "--set", f"output_dir={run}", "--set", "report=true"]
        assert main(["train", cfg, *sets]) == 0
        assert (run / "pairs" / "round-00000.jsonl").is_file() and (run / "report.md").is_file()
        assert (run / "report" / "rounds.png").is_file()  # candidate reward histograms per round
        steps = [r["step"] for r in read_metrics(run)]
        assert steps == [1, 2]
        # resume from the step-1 checkpoint: the run's pairs (and the reward model) are read back, not re-made
        for name in ("checkpoint-2",):
            shutil.rmtree(run / name)
        assert main(["train", cfg, *sets, "--resume"]) == 0
        assert [r["step"] for r in read_metrics(run)] == [1, 2]
        assert main(["eval", str(run), "--output", str(tmp_path / "eval.json")]) == 0  # the trained team
        assert "eval/reward/mean" in json.loads((tmp_path / "eval.json").read_text())["team"]
    if algorithm == "marlhf":
        assert (run / "reward_model" / "reward_model.json").is_file()
        assert (run / "final" / "reward_model" / "head.safetensors").is_file()
