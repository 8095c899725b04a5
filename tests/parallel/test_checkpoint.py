"""Crash-safe checkpoints: atomic writes, detection of broken checkpoints, bitwise resume after SIGKILL."""

import json
import logging
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch
import toy_env
from safetensors.torch import load_file
from tiny import tiny_model, tiny_tokenizer

from comlrl.cli import main
from comlrl.parallel import checkpoint
from comlrl.tracking import read_metrics, truncate_metrics
from comlrl.trainers.magrpo import MAGRPOTrainer

ROWS = [{"prompt": f"Task {i}: say something."} for i in range(6)]
TESTS = Path(__file__).parents[1]
REPO = TESTS.parent


def length_reward(a, b):
    return [float(len(b[0]) - len(a[0]))]


def trainer(out, peft_config=None, cls=MAGRPOTrainer, **kw):
    args = dict(
        per_device_train_batch_size=2,
        num_generations=2,
        max_new_tokens=6,
        max_steps=4,
        learning_rate=1e-2,
        disable_tqdm=True,
        output_dir=str(out),
        save_steps=2,
        save_total_limit=None,
        seed=11,
    )
    args.update(kw)
    return cls(
        model=tiny_model(),
        tokenizer=tiny_tokenizer(),
        train_dataset=ROWS,
        reward_func=length_reward,
        formatters=[lambda e: e["prompt"], lambda e: e["prompt"] + " More:"],
        args=cls.config_class(**args),
        peft_config=peft_config,
    )


def state(t):
    return [{k: v.detach().clone() for k, v in a.model.state_dict().items()} for a in t.agents]


def assert_same_weights(a, b):
    for sa, sb in zip(a, b):
        assert sa.keys() == sb.keys()
        for k in sa:
            assert torch.equal(sa[k], sb[k]), k


def strip(rows):
    return [{k: v for k, v in r.items() if not k.startswith(("time/", "perf/"))} for r in rows]


@pytest.mark.parametrize("kind", ["full", "lora", "iac"])
def test_resume_in_process_is_bitwise_identical(tmp_path, kind):
    peft, cls, extra = None, MAGRPOTrainer, {}
    if kind == "lora":
        from peft import LoraConfig

        peft = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM")
    if kind == "iac":  # critics (weights, optimizer, scheduler) are part of the checkpoint too
        from comlrl.trainers import IACTrainer

        cls, extra = IACTrainer, {"critic_learning_rate": 1e-2}
    full = trainer(tmp_path / "a", peft, cls, **extra)
    full.train()
    resumed = trainer(tmp_path / "b", peft, cls, **extra)
    resumed.train()  # writes checkpoint-2 and checkpoint-4 into b
    again = trainer(tmp_path / "b", peft, cls, **extra)  # a fresh process would build the same trainer, then resume
    again.train(resume_from_checkpoint=str(tmp_path / "b" / "checkpoint-2"))
    assert again.state["step"] == 4
    assert_same_weights(state(full), state(again))
    if kind == "iac":
        for ca, cb in zip(full.critics, again.critics):
            for p, q in zip(ca.model.parameters(), cb.model.parameters()):
                assert torch.equal(p, q)
    assert strip(again.history) == strip(full.history)
    assert strip(read_metrics(tmp_path / "b")) == strip(
        read_metrics(tmp_path / "a")
    )  # later lines replaced, not doubled
    if kind == "lora":  # the checkpoint holds adapters, not copies of the base
        assert (tmp_path / "b" / "checkpoint-2" / "agent_0" / "adapter_model.safetensors").is_file()


def test_checkpoint_contents_and_pruning(tmp_path):
    t = trainer(tmp_path, save_steps=1, save_total_limit=2)
    t.train()
    assert [s for s, _ in checkpoint.checkpoints(tmp_path)] == [3, 4]
    ck = tmp_path / "checkpoint-4"
    names = {p.relative_to(ck).as_posix() for p in ck.rglob("*") if p.is_file()}
    assert {
        "manifest.json",
        "rng_state.pt",
        "trainer_state.json",
        "history.json",
        "agent_0/training_state.pt",
        "agent_1/model.safetensors",
    } <= names
    meta = json.loads((ck / "trainer_state.json").read_text())
    assert meta["state"] == {"step": 4, "rollouts": 4, "epoch": 1, "batch_in_epoch": 1}
    assert meta["seed"] == 11 and "git" in meta
    manifest = json.loads((ck / "manifest.json").read_text())
    assert set(manifest["files"]) == names - {"manifest.json"}
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temporary directories left


def test_failed_write_leaves_no_checkpoint(tmp_path, monkeypatch):
    t = trainer(tmp_path, max_steps=1, save_steps=0)
    t.train()

    def fail(path):
        if path.name == "rng_state.pt":
            raise OSError("disk full")

    monkeypatch.setattr(checkpoint, "_file_written", fail)
    with pytest.raises(OSError, match="disk full"):
        t.save_checkpoint()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["metrics.jsonl", "run_info.json"]


def test_corrupt_truncated_and_incomplete_checkpoints_are_skipped_with_a_warning(tmp_path, caplog):
    t = trainer(tmp_path, save_steps=1)
    t.train()
    weights = tmp_path / "checkpoint-4" / "agent_0" / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:1000])  # truncated
    blob = tmp_path / "checkpoint-3" / "agent_1" / "training_state.pt"
    data = bytearray(blob.read_bytes())
    data[len(data) // 2] ^= 0xFF  # same size, flipped bits
    blob.write_bytes(bytes(data))
    (tmp_path / "checkpoint-2" / "manifest.json").unlink()  # the run died before the manifest
    with caplog.at_level(logging.WARNING, logger="comlrl"):
        found = checkpoint.latest_checkpoint(tmp_path)
    assert found == tmp_path / "checkpoint-1"
    text = caplog.text
    assert "checkpoint-4" in text and "truncated" in text
    assert "checkpoint-3" in text and "corrupt" in text
    assert "checkpoint-2" in text and "manifest" in text
    with pytest.raises(checkpoint.CheckpointError, match="checkpoint-4"):
        t.load_checkpoint(str(tmp_path / "checkpoint-4"))


def test_checkpoints_count_optimizer_steps_under_gradient_accumulation(tmp_path):
    """save_steps counts optimizer steps (TRL's): with 2 rollouts per step, checkpoint-1 holds 2 rollouts, and a
    run resumed from it ends where the uninterrupted one does."""
    t = trainer(tmp_path / "a", gradient_accumulation_steps=2, save_steps=1, max_steps=2)
    t.train()
    assert [s for s, _ in checkpoint.checkpoints(tmp_path / "a")] == [1, 2]
    state = json.loads((tmp_path / "a" / "checkpoint-1" / "trainer_state.json").read_text())["state"]
    assert state["step"] == 1 and state["rollouts"] == 2
    resumed = trainer(tmp_path / "b", gradient_accumulation_steps=2, save_steps=1, max_steps=2)
    resumed.train(resume_from_checkpoint=str(tmp_path / "a" / "checkpoint-1"))
    for x, y in zip(t.agents, resumed.agents):
        for p, q in zip(x.model.parameters(), y.model.parameters()):
            assert torch.equal(p, q)


def test_truncate_metrics_drops_later_and_partial_lines(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text("".join(json.dumps({"step": s, "x": s}) + "\n" for s in (1, 2, 3, 4)) + '{"step": 5, "x"')
    assert truncate_metrics(path, 2) == 3
    assert [r["step"] for r in read_metrics(path)] == [1, 2]


# --- SIGKILL in a real process ------------------------------------------------------------------------

DRIVER = textwrap.dedent("""
    import sys, time
    from pathlib import Path
    sys.path.insert(0, {tests!r})
    import toy_env
    toy_env.register()
    mode, step, marker = sys.argv[1], int(sys.argv[2]), Path(sys.argv[3])
    import comlrl.parallel.checkpoint as ck
    import comlrl.trainers.base as base
    if mode == "checkpoint":  # stop for good after the first file of checkpoint-<step> reached the disk
        def pause(path):
            if f".checkpoint-{{step}}.tmp" in str(path):
                marker.write_text(str(path))
                time.sleep(600)
        ck._file_written = pause
    elif mode == "step":  # stop for good inside step <step>, after its rollout, before its update
        optimize = base.MultiAgentTrainer.optimize
        def slow(self, buffer):
            if self.state["step"] + 1 == step:
                marker.write_text("mid-step")
                time.sleep(600)
            return optimize(self, buffer)
        base.MultiAgentTrainer.optimize = slow
    from comlrl.cli import main
    sys.exit(main(sys.argv[4:]))
""")


def run_until_killed(script, mode, step, marker, argv, timeout=180):
    proc = subprocess.Popen(
        [sys.executable, str(script), mode, str(step), str(marker), *argv],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"},
    )
    deadline = time.time() + timeout
    while not marker.exists():
        if proc.poll() is not None:
            pytest.fail(f"the run ended (rc {proc.returncode}) before reaching {mode} {step}:\n{proc.stdout.read()}")
        if time.time() > deadline:
            proc.kill()
            pytest.fail(f"timed out waiting for {mode} {step}")
        time.sleep(0.1)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    marker.unlink()
    assert proc.returncode == -signal.SIGKILL


@pytest.fixture
def toy(tmp_path):
    with toy_env.registered():
        yield tmp_path


def test_killed_mid_checkpoint_and_mid_step_resumes_to_the_uninterrupted_result(toy, tmp_path):
    tiny = tmp_path / "tiny"
    tiny_model().save_pretrained(tiny)
    tiny_tokenizer().save_pretrained(tiny)
    rows = toy_env.write_rows(tmp_path / "rows.jsonl")
    cfg = toy_env.write_config(tmp_path / "toy.yaml", rows, str(tiny), max_steps=6, save_steps=2, save_total_limit=None)
    script = tmp_path / "driver.py"
    script.write_text(DRIVER.format(tests=str(TESTS)))
    marker = tmp_path / "marker"

    # the reference: one uninterrupted run
    assert main(["train", cfg, "--set", f"output_dir={tmp_path / 'a'}"]) == 0

    b = tmp_path / "b"
    # 1. SIGKILL while checkpoint-4 is being written (its metrics line is already out)
    run_until_killed(script, "checkpoint", 4, marker, ["train", cfg, "--set", f"output_dir={b}"])
    assert [s for s, _ in checkpoint.checkpoints(b)] == [2]
    assert [p for p in b.iterdir() if p.name.startswith(".checkpoint-4.tmp")]
    assert [r["step"] for r in read_metrics(b)] == [1, 2, 3, 4]
    # 2. resume from checkpoint-2; SIGKILL in the middle of step 5 (after checkpoint-4 is complete)
    run_until_killed(script, "step", 5, marker, ["train", cfg, "--set", f"output_dir={b}", "--resume"])
    assert not [p for p in b.iterdir() if p.name.startswith(".")]  # the partial write was cleaned up
    assert [s for s, _ in checkpoint.checkpoints(b)] == [2, 4]
    assert checkpoint.verify(b / "checkpoint-4") is None
    assert [r["step"] for r in read_metrics(b)] == [1, 2, 3, 4]
    # 3. resume from checkpoint-4 to the end
    assert main(["train", cfg, "--set", f"output_dir={b}", "--resume"]) == 0

    starts = json.loads((b / "run.json").read_text())["starts"]
    assert [Path(s["resumed_from"]).name if s["resumed_from"] else None for s in starts] == [
        None,
        "checkpoint-2",
        "checkpoint-4",
    ]
    for agent in ("agent_0", "agent_1"):
        wa = load_file(str(tmp_path / "a" / "final" / agent / "model.safetensors"))
        wb = load_file(str(b / "final" / agent / "model.safetensors"))
        assert wa.keys() == wb.keys()
        for k in wa:
            assert torch.equal(wa[k], wb[k]), (agent, k)
    ma, mb = read_metrics(tmp_path / "a"), read_metrics(b)
    assert [r["step"] for r in mb] == [1, 2, 3, 4, 5, 6]
    assert strip(ma) == strip(mb)
    assert any(r["reward/std"] > 0 for r in ma)  # the updates were not all zero
    assert json.loads((tmp_path / "a" / "eval_after.json").read_text()) == json.loads(
        (b / "eval_after.json").read_text()
    )
