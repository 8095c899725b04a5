"""FSDP2 sharding of agents under torchrun (comlrl.sharding): real gloo jobs on CPU against one process.

Every job trains tests/dist_worker.py's tiny 2-agent team in fp32 (bf16 off, so no mixed-precision policy) and is
compared with the single-process run of the same config. Sampling is keyed per row, so the samples are bitwise
equal; the weights agree within ``FSDP_ATOL``: each rank backpropagates its share of the rows and FSDP's
reduce-scatter adds the shares (then averages, which we undo by a power of two, exactly), so the gradient sums are
reassociated (relative ~1e-7) and Adam's division by sqrt(v) magnifies that in coordinates whose gradient is near
zero. Measured after 4 steps at lr 1e-2: 7.1e-6 (2 ranks), 7.1e-6 (2 agents x 2 shards on 4 ranks), 1.7e-5 (hybrid
2 x 2), 3e-7 (LoRA on a sharded base).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from test_distributed import (
    agent_weights,
    assert_same_weights,
    cached_runs,
    cli_under_torchrun,
    critic_params,
    history,
    run_in_process,
    torchrun,
)

from comlrl import checkpoint
from comlrl.errors import ConfigError
from comlrl.sharding import ShardingPlan, clip_grad_norm_, mesh_shape, sharding_plan

FSDP_ATOL = 5e-5
BASE = {"max_steps": 4, "save_steps": 2, "num_turns": 2, "per_device_train_batch_size": 3, "bf16": False}
BOTH_ON_2 = {"0": [0, 1], "1": [0, 1]}  # each agent on both ranks: sharded over them
SHARDED = {**BASE, "fsdp": "full_shard", "placement": BOTH_ON_2}
LORA = {"r": 4, "lora_alpha": 8, "lora_dropout": 0.0, "target_modules": ["q_proj", "v_proj"]}


# --- the plan (no processes) ----------------------------------------------------------------------


def test_fsdp_options_parse_like_transformers_and_bad_ones_are_named():
    assert sharding_plan("") is None and sharding_plan(None) is None
    assert sharding_plan("full_shard auto_wrap") == ShardingPlan()
    assert sharding_plan("shard_grad_op").reshard_after_forward is False
    plan = sharding_plan("hybrid_shard", {"hybrid_shard_size": 2, "mixed_precision": False})
    assert plan.hybrid and plan.shard_size == 2 and plan.mixed_precision is False
    assert sharding_plan("full_shard offload").offload_params
    with pytest.raises(ConfigError, match=r"unknown option\(s\) \['ful_shard'\]"):
        sharding_plan("ful_shard")
    with pytest.raises(ConfigError, match=r"unknown key\(s\) \['reshard'\]"):
        sharding_plan("full_shard", {"reshard": True})
    with pytest.raises(ConfigError, match="fsdp_config is set but fsdp is off"):
        sharding_plan("", {"reshard_after_forward": False})
    with pytest.raises(ConfigError, match="FSDP2"):
        sharding_plan("full_shard", {"version": 1})
    with pytest.raises(ConfigError, match="hybrid_shard_size needs fsdp='hybrid_shard'"):
        sharding_plan("full_shard", {"hybrid_shard_size": 2})


def test_config_checks_the_fsdp_fields():
    from comlrl.config import MAGRPOConfig

    with pytest.raises(ConfigError, match="unknown option"):
        MAGRPOConfig(fsdp="zero3")
    assert MAGRPOConfig(fsdp="full_shard", fsdp_config={"reshard_after_forward": False}).fsdp == "full_shard"


def test_mesh_shapes():
    assert mesh_shape(4, ShardingPlan(), 8) == (4,)
    assert mesh_shape(8, ShardingPlan(hybrid=True), 4) == (2, 4)  # default: shard within a node
    assert mesh_shape(4, ShardingPlan(hybrid=True, shard_size=2), 8) == (2, 2)
    with pytest.raises(ConfigError, match="shard groups of 3 ranks"):
        mesh_shape(4, ShardingPlan(hybrid=True, shard_size=3), 8)


def test_clip_grad_norm_over_whole_tensors_by_hand():
    a, b, c = (torch.zeros(2, requires_grad=True) for _ in range(3))
    a.grad, b.grad = torch.tensor([3.0, 0.0]), torch.tensor([0.0, 4.0])  # c has no gradient
    assert clip_grad_norm_([a, b, c], None) == pytest.approx(5.0) and a.grad[0] == 3.0  # measured, not clipped
    assert clip_grad_norm_([a, b, c], 1.0) == pytest.approx(5.0)
    torch.testing.assert_close(torch.cat([a.grad, b.grad]), torch.tensor([0.6, 0.0, 0.0, 0.8]), rtol=1e-5, atol=0)
    assert clip_grad_norm_([a, b], 10.0) == pytest.approx(1.0, rel=1e-5) and b.grad[1] == pytest.approx(0.8, rel=1e-5)


# --- jobs -----------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Lazily computed runs shared by the tests: 'ref' (one process) and 'sharded' (2 ranks, both agents sharded)."""
    return cached_runs(tmp_path_factory.mktemp("fsdp"), BASE, SHARDED)


def _same_samples(got: Path, ref: Path) -> None:
    exact = [{k: v for k, v in h.items() if "/policy/" not in k} for h in history(got)]
    assert exact == [{k: v for k, v in h.items() if "/policy/" not in k} for h in history(ref)]


def _bytes(out: Path) -> dict[int, list[dict]]:
    found: dict[int, list[dict]] = {}
    for path in sorted(out.glob("bytes.rank*.json")):
        for i, held in json.loads(path.read_text()).items():
            if i.isdigit():
                found.setdefault(int(i), []).append(held)
    return found


def test_two_ranks_sharding_both_agents_equal_one_process_and_hold_half(runs):
    ref, got = runs("ref"), runs("sharded")
    weights = agent_weights(got)
    assert {i: len(s) for i, s in weights.items()} == {0: 2, 1: 2}  # both agents on both ranks
    assert_same_weights(agent_weights(ref), weights, atol=FSDP_ATOL)
    _same_samples(got, ref)
    full, shards = _bytes(ref), _bytes(got)
    for i in (0, 1):
        whole = full[i][0]["params"]
        assert sum(s["params"] for s in shards[i]) == whole  # dim 0 split in two (odd sizes: one row more on rank 0)
        assert all(s["params"] <= 0.51 * whole for s in shards[i])
        for s in shards[i]:
            assert s["optimizer"] == pytest.approx(full[i][0]["optimizer"] / 2, rel=0.01)  # + the step counters
    ckpt = got / "run" / "checkpoint-4"
    assert checkpoint.verify(ckpt) is None  # every rank's shard files are in the manifest
    assert sorted(p.name for p in (ckpt / "agent_0" / "sharded").glob("*.distcp")) == ["__0_0.distcp", "__1_0.distcp"]
    assert not (ckpt / "agent_0" / "model.safetensors").exists()  # weights live in the shards


def test_save_model_gathers_a_sharded_agent_into_one_loadable_folder(runs):
    from transformers import AutoModelForCausalLM

    got = runs("sharded")
    folder = got / "final" / "agent_1"
    assert json.loads((folder / "config.json").read_text())["architectures"] == ["LlamaForCausalLM"]
    model = AutoModelForCausalLM.from_pretrained(folder)
    trained = agent_weights(got)[1][0]
    for k, v in model.state_dict().items():
        assert torch.equal(v, trained[k]), k


def test_sigkilled_sharded_run_resumes_bitwise(runs, tmp_path):
    rc, log, _ = torchrun(2, tmp_path, {**SHARDED, "kill_at": [1, 3]})
    assert rc != 0 and "SIGKILL at step 3" in log, log[-3000:]
    assert [s for s, _ in checkpoint.checkpoints(tmp_path / "run")] == [2]
    rc, log, _ = torchrun(2, tmp_path, {**SHARDED, "resume": True})
    assert rc == 0, log[-4000:]
    assert_same_weights(agent_weights(runs("sharded")), agent_weights(tmp_path))  # bitwise
    assert history(tmp_path) == history(runs("sharded"))


@pytest.mark.parametrize("ranks", [1, 4])
def test_two_rank_checkpoint_resumes_on_one_process_and_on_four_ranks(runs, tmp_path, ranks):
    """DCP reshards: the 2-rank step-2 checkpoint continues in one process (whole agents) or sharded over 4 ranks."""
    shutil.copytree(runs("sharded") / "run", tmp_path / "run")
    shutil.rmtree(tmp_path / "run" / "checkpoint-4")
    if ranks == 1:
        run_in_process(tmp_path, {**BASE, "resume": True})
    else:
        rc, log, _ = torchrun(
            4, tmp_path, {**SHARDED, "placement": {"0": [0, 1, 2, 3], "1": [0, 1, 2, 3]}, "resume": True}
        )
        assert rc == 0, log[-4000:]
    got = agent_weights(tmp_path)
    assert {i: len(s) for i, s in got.items()} == {0: ranks, 1: ranks}
    assert_same_weights(agent_weights(runs("sharded")), got, atol=FSDP_ATOL)
    assert history(tmp_path)[:2] == history(runs("sharded"))[:2]  # the checkpoint's steps, restored
    _same_samples(tmp_path, runs("sharded"))


def test_four_ranks_two_agents_by_two_shards_and_hybrid_two_by_two(runs, tmp_path):
    ref = agent_weights(runs("ref"))
    rc, log, _ = torchrun(4, tmp_path / "shards", {**BASE, "fsdp": "full_shard"})  # default placement: 2 ranks each
    assert rc == 0, log[-4000:]
    assert_same_weights(ref, agent_weights(tmp_path / "shards"), atol=FSDP_ATOL)
    assert {i: len(s) for i, s in _bytes(tmp_path / "shards").items()} == {0: 2, 1: 2}  # ranks (0, 2) and (1, 3)
    hybrid = {
        **BASE,
        "fsdp": "hybrid_shard",
        "fsdp_config": {"hybrid_shard_size": 2},
        "placement": {"0": [0, 1, 2, 3], "1": [0, 1, 2, 3]},
    }
    rc, log, _ = torchrun(4, tmp_path / "hybrid", hybrid)
    assert rc == 0, log[-4000:]
    assert_same_weights(ref, agent_weights(tmp_path / "hybrid"), atol=FSDP_ATOL)
    _same_samples(tmp_path / "hybrid", runs("ref"))
    held = _bytes(tmp_path / "hybrid")[0]
    whole = _bytes(runs("ref"))[0][0]["params"]
    assert sorted(s["params"] for s in held) == sorted([s["params"] for s in _bytes(runs("sharded"))[0]] * 2)
    assert held[0]["params"] + held[1]["params"] == whole  # sharded in 2, replicated in 2: half on every rank


def test_lora_adapters_train_on_a_sharded_base_as_in_one_process(tmp_path):
    spec = {**BASE, "max_steps": 3, "num_turns": 1, "lora": LORA}
    run_in_process(tmp_path / "ref", spec)
    rc, log, _ = torchrun(2, tmp_path / "sharded", {**spec, "fsdp": "full_shard", "placement": BOTH_ON_2})
    assert rc == 0, log[-4000:]
    got = agent_weights(tmp_path / "sharded")
    assert {i: len(s) for i, s in got.items()} == {0: 2, 1: 2}
    assert all(".agent_%d." % i in k for i, states in got.items() for k in states[0])  # adapters, replicated
    assert_same_weights(agent_weights(tmp_path / "ref"), got, atol=FSDP_ATOL)
    _same_samples(tmp_path / "sharded", tmp_path / "ref")
    held, whole = _bytes(tmp_path / "sharded")[0][0], _bytes(tmp_path / "ref")[0][0]
    assert held["params"] < whole["params"]  # the frozen base is sharded; each rank holds half of it


def test_activation_checkpointing_composes_with_sharding(tmp_path):
    """fsdp_config.activation_checkpointing (= gradient_checkpointing): backward recomputes each layer's forward,
    which gathers its shards again; the update is one process's with checkpointing (measured 1.6e-6)."""
    spec = {**BASE, "max_steps": 2, "num_turns": 1, "gradient_checkpointing": True}
    run_in_process(tmp_path / "ref", spec)
    sharded = {**BASE, "max_steps": 2, "num_turns": 1, "fsdp": "full_shard", "placement": BOTH_ON_2}
    rc, log, _ = torchrun(2, tmp_path / "sharded", {**sharded, "fsdp_config": {"activation_checkpointing": True}})
    assert rc == 0, log[-4000:]
    assert_same_weights(agent_weights(tmp_path / "ref"), agent_weights(tmp_path / "sharded"), atol=FSDP_ATOL)
    assert all(json.loads(p.read_text())["checkpointing"] for p in (tmp_path / "sharded").glob("bytes.rank*.json"))


def test_maac_critic_is_sharded_over_every_rank_and_resumes_in_one_process(tmp_path):
    """MAAC's centralized critic (its own backbone) lives on every rank: sharded over all of them, its value head
    whole (gradients summed). Actors and critic as in one process; its DCP checkpoint continues in one process."""
    spec = {**BASE, "num_turns": 1, "trainer": "maac"}
    run_in_process(tmp_path / "ref", spec)
    rc, log, _ = torchrun(2, tmp_path / "sharded", {**spec, "fsdp": "full_shard", "placement": BOTH_ON_2})
    assert rc == 0, log[-4000:]
    assert_same_weights(agent_weights(tmp_path / "ref"), agent_weights(tmp_path / "sharded"), atol=FSDP_ATOL)
    ref, got = critic_params(tmp_path / "ref")[0][0], critic_params(tmp_path / "sharded")[0]
    assert len(got) == 2  # one copy per rank, gathered
    for params in got:
        for p, q in zip(params, ref, strict=True):
            torch.testing.assert_close(p, q, atol=FSDP_ATOL, rtol=0)
    ckpt = tmp_path / "sharded" / "run" / "checkpoint-2"
    assert (ckpt / "critic_0" / "sharded").is_dir() and checkpoint.verify(ckpt) is None
    shutil.copytree(tmp_path / "sharded" / "run", tmp_path / "one" / "run")
    shutil.rmtree(tmp_path / "one" / "run" / "checkpoint-4")
    run_in_process(tmp_path / "one", {**spec, "resume": True})
    for p, q in zip(critic_params(tmp_path / "one")[0][0], got[0], strict=True):
        torch.testing.assert_close(p, q, atol=FSDP_ATOL, rtol=0)
    assert history(tmp_path / "one")[:2] == history(tmp_path / "sharded")[:2]


@pytest.mark.parametrize("algorithm", ["magrpo", "iac", "maac"])
def test_cli_trains_two_sharded_steps(tmp_path, algorithm):
    sections = {"algorithm": algorithm, "evaluation": {"before": False, "after": False}}
    run_dir, _, _ = cli_under_torchrun(tmp_path, sections, fsdp="full_shard", placement=BOTH_ON_2)
    assert len((run_dir / "metrics.jsonl").read_text().splitlines()) == 2
    assert checkpoint.verify(run_dir / "checkpoint-2") is None
    assert (run_dir / "checkpoint-2" / "agent_1" / "sharded").is_dir()
    if algorithm != "magrpo":  # the critics' own backbones are sharded too
        assert (run_dir / "checkpoint-2" / "critic_0" / "sharded").is_dir()
    for i in (0, 1):
        assert (run_dir / "final" / f"agent_{i}" / "model.safetensors").is_file()
