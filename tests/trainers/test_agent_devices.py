"""agent_devices: each agent of a team on its own device, in one process (the 2-GPU check is in test_cuda.py).

Without a GPU the plumbing is checked by putting the trainer itself on the ``meta`` device (no data, no kernels)
while every agent is on ``cpu``: a step that moved an agent's tensors to the trainer's device instead of its own
would fail, so a run that trains, evaluates and resumes there used each agent's device throughout.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch
from tiny import tiny_model, tiny_tokenizer
from tiny_team import ROWS, cfg, length_reward, weights

from comlrl.configs.policy import MAGRPOConfig
from comlrl.errors import ConfigError
from comlrl.trainers.actor_critic import IACTrainer
from comlrl.trainers.build import source_groups
from comlrl.trainers.magrpo import MAGRPOTrainer
from comlrl.trainers.update import PolicyUpdate

FORMATTERS = [lambda e: e["prompt"], lambda e: e["prompt"] + " More detail:"]


def team(trainer_cls=MAGRPOTrainer, critic=False, peft_config=None, **kw):
    args = cfg(seed=1, **kw)
    if trainer_cls is not MAGRPOTrainer:
        names = {f.name for f in dataclasses.fields(trainer_cls.config_class)}
        args = trainer_cls.config_class(**{k: v for k, v in args.to_dict().items() if k in names})
    return trainer_cls(
        model=tiny_model(),
        tokenizer=tiny_tokenizer(),
        train_dataset=ROWS,
        reward_func=length_reward,
        formatters=FORMATTERS,
        args=args,
        peft_config=peft_config,
        **({"critic": tiny_model(seed=3)} if critic else {}),
    )


def critic_weights(trainer):
    return [torch.cat([p.detach().flatten() for p in c.model.trainable_parameters()]) for c in trainer.critics]


def optimizer_devices(optimizer):
    return {t.device for state in optimizer.state.values() for t in state.values() if torch.is_tensor(t)}


@pytest.mark.parametrize(
    "trainer_cls,kw",
    [(MAGRPOTrainer, {"beta": 0.1}), (IACTrainer, {})],
    ids=["magrpo-reference", "iac-critics"],
)
def test_cpu_agent_devices_train_bitwise_like_device_cpu(trainer_cls, kw, tmp_path):
    """agent_devices=['cpu', 'cpu'] is the same run as device='cpu': the same weights after 2 steps, bit for bit."""
    critic = trainer_cls is IACTrainer
    ref = team(trainer_cls, critic, device="cpu", output_dir=str(tmp_path / "a"), **kw)
    ref.train()
    per_agent = team(trainer_cls, critic, agent_devices=["cpu", "cpu"], output_dir=str(tmp_path / "b"), **kw)
    per_agent.train()
    for got, want in zip(weights(per_agent), weights(ref)):
        assert torch.equal(got, want)
    if critic:
        for got, want in zip(critic_weights(per_agent), critic_weights(ref)):
            assert torch.equal(got, want)


@pytest.mark.parametrize("trainer_cls", [MAGRPOTrainer, IACTrainer], ids=["magrpo", "iac"])
def test_agents_compute_on_their_own_devices_not_the_trainers(trainer_cls, tmp_path):
    """The trainer on 'meta', its agents on 'cpu': training (with a reference for beta > 0), evaluation and a resume
    from a checkpoint run; parameters, references, critics and optimizer states are on each agent's device."""
    critic = trainer_cls is IACTrainer
    kw = dict(device="meta", agent_devices=["cpu", "cpu"], beta=0.1, save_steps=1, output_dir=str(tmp_path / "run"))
    t = team(trainer_cls, critic, **kw)
    assert t.device == torch.device("meta") and t.agent_devices == [torch.device("cpu")] * 2
    t.train()
    assert "eval/reward/mean" in t.evaluate(ROWS[:2])
    for a in t.agents:
        assert next(a.model.parameters()).device == t.agent_devices[a.index]
        assert next(a.ref_model.parameters()).device == t.agent_devices[a.index]
        assert optimizer_devices(a.optimizer) == {t.agent_devices[a.index]}
    for c in getattr(t, "critics", []):
        assert c.device == t.agent_devices[c.index] and next(c.model.parameters()).device == c.device
    resumed = team(trainer_cls, critic, **{**kw, "max_steps": 3})
    resumed.train(resume_from_checkpoint=str(tmp_path / "run" / "checkpoint-2"))
    assert resumed.state["step"] == 3
    for a in resumed.agents:
        assert optimizer_devices(a.optimizer) == {resumed.agent_devices[a.index]}


def test_the_meta_trainer_device_catches_a_move_to_the_trainers_device(monkeypatch, tmp_path):
    """The check above has teeth: the update putting an agent's inputs on the trainer's device fails there."""
    chunk_tensors = PolicyUpdate._chunk_tensors
    monkeypatch.setattr(
        PolicyUpdate, "_chunk_tensors", lambda self, samples, sl, device: chunk_tensors(self, samples, sl, self.device)
    )
    t = team(device="meta", agent_devices=["cpu", "cpu"], output_dir=str(tmp_path))
    with pytest.raises((RuntimeError, NotImplementedError)):
        t.train()


def test_lora_agents_share_a_base_only_on_one_device():
    """share_base: agents of one source share a base when on the same device; on different devices each has its
    own (a shared model lives on one device)."""
    from peft import LoraConfig

    assert source_groups(["m", "m", "m"], ["cpu", "cpu", "cpu"]) == [0, 0, 0]
    assert source_groups(["m", "m", "m"], ["cuda:0", "cuda:1", "cuda:0"]) == [0, 1, 0]
    assert source_groups(["m", "n"], None) == [0, 1]
    lora = LoraConfig(r=2, lora_alpha=4, target_modules=["q_proj"], lora_dropout=0.0)
    t = team(agent_devices=["cpu", "cpu"], peft_config=lora, max_steps=1)
    assert t.agents[0].model is t.agents[1].model


def test_agent_devices_config_checks():
    assert MAGRPOConfig(agent_devices=("cpu", "cuda:1")).agent_devices == ["cpu", "cuda:1"]
    with pytest.raises(ConfigError, match="one device per agent"):
        MAGRPOConfig(agent_devices="cuda:0")
    with pytest.raises(ConfigError, match="one device per agent"):
        MAGRPOConfig(agent_devices=[])
    with pytest.raises(ConfigError, match=r"entry 1 \(agent 1\) 'gpu1' is not a device"):
        MAGRPOConfig(agent_devices=["cpu", "gpu1"])
    with pytest.raises(ConfigError, match=r"entry 0 \(agent 0\) is int"):
        MAGRPOConfig(agent_devices=[0, 1])
    with pytest.raises(ConfigError, match="use_vllm"):
        MAGRPOConfig(agent_devices=["cpu", "cpu"], use_vllm=True)


def test_agent_devices_trainer_checks(monkeypatch, tmp_path):
    """Construction fails on a list of another length (naming both counts), under torchrun (pointing to placement)
    and on a CUDA device that does not exist (naming the agent and the device)."""
    with pytest.raises(ConfigError, match="agent_devices has 3 entries for 2 agents"):
        team(agent_devices=["cpu"] * 3, output_dir=str(tmp_path))
    missing = f"cuda:{torch.cuda.device_count() if torch.cuda.is_available() else 0}"
    with pytest.raises(ConfigError, match=rf"agent_devices\[1\]='{missing}': agent 1's device does not exist"):
        team(agent_devices=["cpu", missing], output_dir=str(tmp_path))
    monkeypatch.setenv("WORLD_SIZE", "2")  # refused before the process group would wait for a second rank
    with pytest.raises(ConfigError, match="under torchrun.*set placement"):
        team(agent_devices=["cpu", "cpu"], output_dir=str(tmp_path))
