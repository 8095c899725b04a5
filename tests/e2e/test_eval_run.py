"""`comlrl eval RUN_DIR`: a trained run's final models (or a checkpoint's), full fine-tunes and LoRA teams alike."""

import json
import shutil

import pytest
import torch
import toy_env
from safetensors.torch import load_file
from tiny import tiny_model, tiny_tokenizer

from comlrl.cli import main
from comlrl.runs import open_evaluation

LORA = "lora={r: 4, lora_alpha: 8, lora_dropout: 0.0, target_modules: [q_proj, v_proj]}"


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Two tiny 2-step runs of the toy env (checkpoints at steps 1 and 2): a full fine-tune and a LoRA team."""
    tmp = tmp_path_factory.mktemp("evalrun")
    tiny_model().save_pretrained(tmp / "tiny")
    tiny_tokenizer().save_pretrained(tmp / "tiny")
    with toy_env.registered():
        rows = toy_env.write_rows(tmp / "rows.jsonl")
        cfg = toy_env.write_config(
            tmp / "toy.yaml", rows, str(tmp / "tiny"), max_steps=2, save_steps=1, save_total_limit=None
        )
        assert main(["train", cfg, "--set", f"output_dir={tmp / 'full'}"]) == 0
        assert main(["train", cfg, "--set", f"output_dir={tmp / 'lora'}", "--set", LORA]) == 0
        yield {"config": cfg, "full": tmp / "full", "lora": tmp / "lora"}


def samples(path):
    return [json.loads(line)["completions"] for line in path.read_text().splitlines()]


def assert_weights(model, saved, init=None):
    """The model's weights are the saved ones (and differ from ``init``, the untrained model)."""
    state = model.state_dict()
    for key, value in saved.items():
        assert torch.equal(state[key], value), key
    if init is not None:
        assert any(not torch.equal(init[k], v) for k, v in saved.items())


def test_eval_run_dir_evaluates_the_final_models(runs, capsys):
    run, init = runs["full"], tiny_model().state_dict()
    with toy_env.registered():
        trainer, _, _, models = open_evaluation(run)
        assert models["models"] == "final" and models["path"] == str(run / "final")
        for agent in trainer.agents:
            assert_weights(agent.model, load_file(str(run / "final" / agent.name / "model.safetensors")), init)
        metrics = trainer.evaluate()
        trained = [s["completions"] for s in trainer.last_eval_samples]
        untrained, _, _, plain = open_evaluation(runs["config"])
        untrained.evaluate()
        assert plain["models"] == "untrained"
        for agent in untrained.agents:
            assert_weights(agent.model, init)
        # the trained team answers as at the end of training, the config's model as before it
        assert metrics == json.loads((run / "eval_after.json").read_text())
        assert trained == samples(run / "samples" / "eval-after.jsonl")
        assert [s["completions"] for s in untrained.last_eval_samples] == samples(run / "samples" / "eval-before.jsonl")
        assert trained != samples(run / "samples" / "eval-before.jsonl")
        capsys.readouterr()
        assert main(["eval", str(run)]) == 0
    out = capsys.readouterr().out
    assert f"models: {run / 'final'} (the final models of run {run})" in out
    saved = json.loads((run / "eval_final.json").read_text())
    assert saved["models"]["models"] == "final" and saved["team"] == metrics
    assert f"results: {run / 'eval_final.json'}" in out


def test_eval_run_dir_checkpoint_loads_that_checkpoint(runs, tmp_path, capsys):
    run = runs["full"]
    with toy_env.registered():
        trainer, _, _, models = open_evaluation(run, 1)
        assert models["models"] == "checkpoint-1"
        for agent in trainer.agents:
            saved = load_file(str(run / "checkpoint-1" / agent.name / "model.safetensors"))
            assert_weights(agent.model, saved)
            final = load_file(str(run / "final" / agent.name / "model.safetensors"))
            assert any(not torch.equal(saved[k], final[k]) for k in saved)  # step 1 is not step 2
        capsys.readouterr()
        assert main(["eval", str(run), "--checkpoint", "1", "--output", str(tmp_path / "e.json")]) == 0
    assert "the models at step 1 of run" in capsys.readouterr().out
    written = json.loads((run / "eval_checkpoint-1.json").read_text())
    assert written == json.loads((tmp_path / "e.json").read_text()) and "eval/reward/mean" in written["team"]


def test_eval_run_dir_of_a_lora_team_loads_adapters_on_the_shared_base(runs, capsys):
    from peft import get_peft_model_state_dict

    run, init = runs["lora"], tiny_model().state_dict()
    with toy_env.registered():
        trainer, _, _, models = open_evaluation(run)
        model = trainer.agents[0].model
        assert all(a.model is model for a in trainer.agents)  # one base, an adapter per agent
        for agent in trainer.agents:
            saved = load_file(str(run / "final" / agent.name / "adapter_model.safetensors"))
            loaded = get_peft_model_state_dict(model, adapter_name=agent.adapter)
            assert loaded.keys() == saved.keys()
            assert all(torch.equal(loaded[k], saved[k]) for k in saved)
            assert any(v.abs().sum() > 0 for k, v in saved.items() if "lora_B" in k)  # trained: B left zero init
        base = {
            k.replace(".base_layer", ""): v for k, v in model.get_base_model().state_dict().items() if "lora_" not in k
        }
        assert base.keys() == init.keys()
        for key, value in init.items():  # the frozen base is the config's model (stored in bf16 when bf16 is on)
            assert torch.equal(base[key], value.to(base[key].dtype)), key
        trainer.evaluate()
        assert [s["completions"] for s in trainer.last_eval_samples] == samples(run / "samples" / "eval-after.jsonl")
        capsys.readouterr()
        assert main(["eval", str(run), "--checkpoint", "2"]) == 0
    assert "LoRA adapters on" in capsys.readouterr().out
    # checkpoint-2 holds the same adapters as final/: the evaluation at the end of training
    assert json.loads((run / "eval_checkpoint-2.json").read_text())["team"] == json.loads(
        (run / "eval_after.json").read_text()
    )


def test_eval_run_dir_with_a_baseline_uses_the_trained_models(runs, capsys):
    pytest.importorskip("comlrl.envs.core.baselines")
    run = runs["full"]
    with toy_env.registered():
        assert main(["eval", str(run), "--baseline", "parallel"]) == 0
    out = capsys.readouterr().out
    assert "final models of run" in out and "| parallel |" in out
    assert "parallel" in json.loads((run / "eval_final.json").read_text())


def test_eval_errors_name_what_is_missing_and_what_exists(runs, tmp_path, capsys):
    def error(*argv):
        with toy_env.registered():
            assert main(["eval", *map(str, argv)]) == 2
        return capsys.readouterr().err

    assert "does not exist" in error(tmp_path / "nope")
    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / "notes.txt").write_text("x")
    assert "no config.yaml" in error(empty) and "notes.txt" in error(empty)
    broken = tmp_path / "broken"
    broken.mkdir()
    shutil.copy(runs["full"] / "config.yaml", broken / "config.yaml")
    text = error(broken)
    assert "no final models" in text and "no checkpoints" in text
    (broken / "checkpoint-3").mkdir()
    assert "its checkpoints: 3" in error(broken) and "--checkpoint N" in error(broken)
    text = error(broken, "--checkpoint", 7)
    assert "has no checkpoint-7" in text and "its checkpoints: 3" in text
    assert "cannot be evaluated" in error(broken, "--checkpoint", 3) and "manifest" in error(broken, "--checkpoint", 3)
    (broken / "final" / "agent_0").mkdir(parents=True)
    text = error(broken)
    assert "holds agent_0" in text and "needs agent_0, agent_1" in text
    assert "needs a run directory" in error(runs["config"], "--checkpoint", 1)


def test_eval_help_says_what_each_target_evaluates(capsys):
    with pytest.raises(SystemExit):
        main(["eval", "--help"])
    out = " ".join(capsys.readouterr().out.split())
    assert "RUN_DIR|CONFIG" in out and "untrained" in out and "--checkpoint N" in out and "eval_final.json" in out
