"""FSDP2 sharding of agents under torchrun (comlrl.parallel.sharding): real gloo jobs on CPU against one process.

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
from torchrun_jobs import (
    SharedLaunch,
    agent_weights,
    assert_same_weights,
    cli_runs_under_torchrun,
    critic_params,
    history,
    in_process_runs,
    run_in_process,
    torchrun,
)

from comlrl.errors import ConfigError
from comlrl.parallel import checkpoint, distributed, job
from comlrl.parallel.placement import resolve_placement
from comlrl.parallel.sharding import ShardingPlan, clip_grad_norm_, mesh_layout, mesh_shape, sharding_plan

FSDP_ATOL = 5e-5
BASE = {"max_steps": 4, "save_steps": 2, "num_turns": 2, "per_device_train_batch_size": 3, "bf16": False}
BOTH_ON_2 = {"0": [0, 1], "1": [0, 1]}  # each agent on both ranks: sharded over them
SHARDED = {**BASE, "fsdp": "full_shard", "placement": BOTH_ON_2}
LORA = {"r": 4, "lora_alpha": 8, "lora_dropout": 0.0, "target_modules": ["q_proj", "v_proj"]}
ON_4 = {"0": [0, 1, 2, 3], "1": [0, 1, 2, 3]}  # each agent on all 4 ranks
LORA_SPEC = {**BASE, "max_steps": 3, "num_turns": 1, "lora": LORA}
CKPT_SPEC = {**BASE, "max_steps": 2, "num_turns": 1}
MAAC_SPEC = {**BASE, "num_turns": 1, "trainer": "maac"}
# One process: the references the sharded runs are compared with.
REFS = {
    "base": BASE,
    "lora": LORA_SPEC,
    "activation_checkpointing": {**CKPT_SPEC, "gradient_checkpointing": True},
    "maac": MAAC_SPEC,
}
# 2 ranks, one launch: both agents (and MAAC's critic) sharded over the two ranks.
ON_2_RANKS = {
    "sharded": SHARDED,
    "lora": {**LORA_SPEC, "fsdp": "full_shard", "placement": BOTH_ON_2},
    "activation_checkpointing": {
        **CKPT_SPEC,
        "fsdp": "full_shard",
        "placement": BOTH_ON_2,
        "fsdp_config": {"activation_checkpointing": True},
    },
    "maac": {**MAAC_SPEC, "fsdp": "full_shard", "placement": BOTH_ON_2},
}
# 4 ranks, one launch; 'resumed' continues the 2-rank 'sharded' run from its step-2 checkpoint.
ON_4_RANKS = {
    "shards": {**BASE, "fsdp": "full_shard"},  # default placement: 2 ranks each
    "hybrid": {**BASE, "fsdp": "hybrid_shard", "fsdp_config": {"hybrid_shard_size": 2}, "placement": ON_4},
    "resumed": {**SHARDED, "placement": ON_4, "resume": True},
}


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
    from comlrl.configs.policy import MAGRPOConfig

    with pytest.raises(ConfigError, match="unknown option"):
        MAGRPOConfig(fsdp="zero3")
    assert MAGRPOConfig(fsdp="full_shard", fsdp_config={"reshard_after_forward": False}).fsdp == "full_shard"


def test_mesh_shapes():
    assert mesh_shape(range(4), ShardingPlan(), 8) == (4,)
    assert mesh_shape(range(8), ShardingPlan(hybrid=True), 4) == (2, 4)  # default: shard within a node
    assert mesh_shape(range(4), ShardingPlan(hybrid=True, shard_size=2), 8) == (2, 2)
    with pytest.raises(ConfigError, match="shard groups of 3 ranks"):
        mesh_shape(range(4), ShardingPlan(hybrid=True, shard_size=3), 8)


def _hybrid_meshes(agents: int, nodes: int, per_node: int) -> list[list[list[int]]]:
    """Each agent's hybrid_shard mesh (rows: replicas, each a shard group) under the default placement."""
    placement = resolve_placement(agents, nodes * per_node)
    return [mesh_layout(ranks, ShardingPlan(hybrid=True), per_node) for ranks in placement.ranks]


@pytest.mark.parametrize(
    "agents, nodes, per_node, shape",
    [
        (2, 1, 8, (1, 4)),  # one node: the agent's 4 ranks there form its one shard group
        (2, 2, 8, (2, 4)),  # agent 0 on ranks 0, 2, ..., 14: 4 per node, a replica per node
        (2, 4, 8, (4, 4)),
        (3, 1, 6, (1, 2)),  # 3 agents on 8-GPU nodes run 6 ranks a node (8 is not a multiple of 3)
        (3, 2, 6, (2, 2)),
        (3, 4, 6, (4, 2)),
    ],
)
def test_hybrid_shard_groups_are_the_agents_own_ranks_on_one_node(agents, nodes, per_node, shape):
    meshes = _hybrid_meshes(agents, nodes, per_node)
    placement = resolve_placement(agents, nodes * per_node)
    for i, (rows, ranks) in enumerate(zip(meshes, placement.ranks)):
        assert (len(rows), len(rows[0])) == shape, i
        assert all(len({r // per_node for r in row}) == 1 for row in rows), (i, rows)  # a group stays in its node
        assert sorted(r for row in rows for r in row) == sorted(ranks), i
        assert mesh_shape(ranks, ShardingPlan(hybrid=True), per_node) == shape
        assert rows == [list(range(n * per_node + i, (n + 1) * per_node, agents)) for n in range(nodes)]


@pytest.mark.parametrize("nodes", [1, 2, 4])
def test_three_agents_on_eight_gpu_nodes_need_a_placement(nodes):
    with pytest.raises(ConfigError, match="multiple of num_agents"):
        _hybrid_meshes(3, nodes, 8)


def test_hybrid_shard_uneven_ranks_per_node_ask_for_a_shard_size():
    # 3 agents on 3 x 8 ranks: agent 0 holds ranks 0, 3, 6 | 9, 12, 15 | 18, 21 -- 3, 3 and 2 on the three nodes
    with pytest.raises(ConfigError, match=r"agent on ranks \[0, 3, .*\[3, 3, 2\].*hybrid_shard_size.*\[1, 2, 4, 8\]"):
        _hybrid_meshes(3, 3, 8)
    ranks = resolve_placement(3, 24).ranks[0]
    assert mesh_layout(ranks, ShardingPlan(hybrid=True, shard_size=2), 8) == [[0, 3], [6, 9], [12, 15], [18, 21]]


def test_hybrid_mesh_rows_follow_the_nodes_whatever_the_placement_order():
    assert mesh_layout((9, 1, 8, 0), ShardingPlan(hybrid=True), 8) == [[0, 1], [8, 9]]
    assert mesh_layout((9, 1, 8, 0), ShardingPlan(), 8) == [[9, 1, 8, 0]]  # fully sharded: one row, as placed
    assert mesh_layout(range(16), ShardingPlan(hybrid=True), 8) == [list(range(8)), list(range(8, 16))]  # MAAC critic


def test_process_group_backend_has_a_cpu_backend_when_a_gpu_job_offloads():
    assert distributed.backend_for("cpu", offload=False) == distributed.backend_for("cpu", offload=True) == "gloo"
    assert distributed.backend_for("cuda", offload=False) == "nccl"
    # offloaded shards have their gradients in CPU memory: the norm's all-reduce runs on CPU tensors
    assert distributed.backend_for("cuda", offload=True) == "cuda:nccl,cpu:gloo"
    assert distributed.has_cpu_backend("gloo") and distributed.has_cpu_backend("cuda:nccl,cpu:gloo")
    assert not distributed.has_cpu_backend("nccl") and not distributed.has_cpu_backend("cuda:nccl")


@pytest.fixture
def fake_gpu_job(monkeypatch):
    """A 2-rank job on cuda:0 whose process group calls are recorded, not made: the backends asked for."""
    asked: list[str] = []
    monkeypatch.setattr(distributed, "launched", lambda: True)
    monkeypatch.setattr(distributed, "device_for", lambda name: torch.device("cuda", 0))
    monkeypatch.setattr(torch.cuda, "set_device", lambda device: None)
    monkeypatch.setattr(distributed.dist, "is_initialized", lambda: bool(asked))
    monkeypatch.setattr(distributed.dist, "init_process_group", lambda backend, **kw: asked.append(backend))
    monkeypatch.setattr(distributed.dist, "get_backend", lambda group=None: asked[-1])
    monkeypatch.setattr(distributed.dist, "get_world_size", lambda group=None: 2)
    monkeypatch.setattr(job, "DistTeam", lambda placement, device, timeout, plan: plan)
    return asked


@pytest.mark.parametrize("fsdp, backend", [("full_shard", "nccl"), ("full_shard offload", "cuda:nccl,cpu:gloo")])
def test_setup_initializes_the_backend_the_fsdp_plan_needs(fake_gpu_job, fsdp, backend):
    args = type("Args", (), {"fsdp": fsdp, "fsdp_config": None, "placement": None})()
    plan = job.setup(args, num_agents=2)
    assert fake_gpu_job == [backend] and plan.offload_params == ("offload" in fsdp)


def test_offload_on_a_gpu_refuses_a_process_group_without_a_cpu_backend(fake_gpu_job):
    fake_gpu_job.append("nccl")  # initialized before, by the user
    with pytest.raises(ConfigError, match=r"cuda:nccl,cpu:gloo"):
        distributed.init(device=torch.device("cuda", 0), offload=True)
    assert distributed.init(device=torch.device("cuda", 0)) and fake_gpu_job == ["nccl"]  # without offload: fine


def test_clip_grad_norm_over_whole_tensors_by_hand():
    a, b, c = (torch.zeros(2, requires_grad=True) for _ in range(3))
    a.grad, b.grad = torch.tensor([3.0, 0.0]), torch.tensor([0.0, 4.0])  # c has no gradient
    assert clip_grad_norm_([a, b, c], None) == pytest.approx(5.0) and a.grad[0] == 3.0  # measured, not clipped
    assert clip_grad_norm_([a, b, c], 1.0) == pytest.approx(5.0)
    torch.testing.assert_close(torch.cat([a.grad, b.grad]), torch.tensor([0.6, 0.0, 0.0, 0.8]), rtol=1e-5, atol=0)
    assert clip_grad_norm_([a, b], 10.0) == pytest.approx(1.0, rel=1e-5) and b.grad[1] == pytest.approx(0.8, rel=1e-5)


# --- jobs -----------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def refs(tmp_path_factory):
    """REFS in one process, each computed when first asked for."""
    return in_process_runs(tmp_path_factory.mktemp("ref"), REFS)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """ON_2_RANKS: one torchrun job, started when a test first asks for one of them."""
    return SharedLaunch(2, tmp_path_factory.mktemp("fsdp2"), ON_2_RANKS)


@pytest.fixture(scope="module")
def runs_4(tmp_path_factory, runs):
    """ON_4_RANKS: one torchrun job, after the 2-rank one ('resumed' starts from a copy of its 'sharded' run)."""

    def copy_step_2(root: Path) -> None:
        shutil.copytree(runs("sharded") / "run", root / "resumed" / "run")
        shutil.rmtree(root / "resumed" / "run" / "checkpoint-4")

    return SharedLaunch(4, tmp_path_factory.mktemp("fsdp4"), ON_4_RANKS, prepare=copy_step_2)


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


def test_two_ranks_sharding_both_agents_equal_one_process_and_hold_half(refs, runs):
    ref, got = refs("base"), runs("sharded")
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
def test_two_rank_checkpoint_resumes_on_one_process_and_on_four_ranks(runs, runs_4, tmp_path, ranks):
    """DCP reshards: the 2-rank step-2 checkpoint continues in one process (whole agents) or sharded over 4 ranks."""
    if ranks == 1:
        shutil.copytree(runs("sharded") / "run", tmp_path / "run")
        shutil.rmtree(tmp_path / "run" / "checkpoint-4")
        resumed = run_in_process(tmp_path, {**BASE, "resume": True})
    else:
        resumed = runs_4("resumed")
    got = agent_weights(resumed)
    assert {i: len(s) for i, s in got.items()} == {0: ranks, 1: ranks}
    assert_same_weights(agent_weights(runs("sharded")), got, atol=FSDP_ATOL)
    assert history(resumed)[:2] == history(runs("sharded"))[:2]  # the checkpoint's steps, restored
    _same_samples(resumed, runs("sharded"))


def test_four_ranks_two_agents_by_two_shards_and_hybrid_two_by_two(refs, runs, runs_4):
    ref = agent_weights(refs("base"))
    shards = runs_4("shards")
    assert_same_weights(ref, agent_weights(shards), atol=FSDP_ATOL)
    assert {i: len(s) for i, s in _bytes(shards).items()} == {0: 2, 1: 2}  # ranks (0, 2) and (1, 3)
    hybrid = runs_4("hybrid")
    assert_same_weights(ref, agent_weights(hybrid), atol=FSDP_ATOL)
    _same_samples(hybrid, refs("base"))
    held = _bytes(hybrid)[0]
    whole = _bytes(refs("base"))[0][0]["params"]
    assert sorted(s["params"] for s in held) == sorted([s["params"] for s in _bytes(runs("sharded"))[0]] * 2)
    assert held[0]["params"] + held[1]["params"] == whole  # sharded in 2, replicated in 2: half on every rank


def test_lora_adapters_train_on_a_sharded_base_as_in_one_process(refs, runs):
    ref, sharded = refs("lora"), runs("lora")
    got = agent_weights(sharded)
    assert {i: len(s) for i, s in got.items()} == {0: 2, 1: 2}
    assert all(".agent_%d." % i in k for i, states in got.items() for k in states[0])  # adapters, replicated
    assert_same_weights(agent_weights(ref), got, atol=FSDP_ATOL)
    _same_samples(sharded, ref)
    held, whole = _bytes(sharded)[0][0], _bytes(ref)[0][0]
    assert held["params"] < whole["params"]  # the frozen base is sharded; each rank holds half of it


def test_activation_checkpointing_composes_with_sharding(refs, runs):
    """fsdp_config.activation_checkpointing (= gradient_checkpointing): backward recomputes each layer's forward,
    which gathers its shards again; the update is one process's with checkpointing (measured 1.6e-6)."""
    ref, sharded = refs("activation_checkpointing"), runs("activation_checkpointing")
    assert_same_weights(agent_weights(ref), agent_weights(sharded), atol=FSDP_ATOL)
    held = [json.loads(p.read_text()) for p in sharded.glob("bytes.rank*.json")]
    assert len(held) == 2 and all(h["checkpointing"] for h in held)


def test_maac_critic_is_sharded_over_every_rank_and_resumes_in_one_process(refs, runs, tmp_path):
    """MAAC's centralized critic (its own backbone) lives on every rank: sharded over all of them, its value head
    whole (gradients summed). Actors and critic as in one process; its DCP checkpoint continues in one process."""
    ref_dir, sharded = refs("maac"), runs("maac")
    assert_same_weights(agent_weights(ref_dir), agent_weights(sharded), atol=FSDP_ATOL)
    ref, got = critic_params(ref_dir)[0][0], critic_params(sharded)[0]
    assert len(got) == 2  # one copy per rank, gathered
    for params in got:
        for p, q in zip(params, ref, strict=True):
            torch.testing.assert_close(p, q, atol=FSDP_ATOL, rtol=0)
    ckpt = sharded / "run" / "checkpoint-2"
    assert (ckpt / "critic_0" / "sharded").is_dir() and checkpoint.verify(ckpt) is None
    shutil.copytree(sharded / "run", tmp_path / "one" / "run")
    shutil.rmtree(tmp_path / "one" / "run" / "checkpoint-4")
    run_in_process(tmp_path / "one", {**MAAC_SPEC, "resume": True})
    for p, q in zip(critic_params(tmp_path / "one")[0][0], got[0], strict=True):
        torch.testing.assert_close(p, q, atol=FSDP_ATOL, rtol=0)
    assert history(tmp_path / "one")[:2] == history(sharded)[:2]


@pytest.fixture(scope="module")
def cli_runs(tmp_path_factory):
    """``comlrl train`` of each algorithm, sharded on 2 ranks for 2 steps: one torchrun job runs the three."""
    runs = {
        algorithm: {
            "sections": {"algorithm": algorithm, "evaluation": {"before": False, "after": False}},
            "fsdp": "full_shard",
            "placement": BOTH_ON_2,
        }
        for algorithm in ("magrpo", "iac", "maac")
    }
    return cli_runs_under_torchrun(tmp_path_factory.mktemp("cli"), runs)[0]


@pytest.mark.parametrize("algorithm", ["magrpo", "iac", "maac"])
def test_cli_trains_two_sharded_steps(cli_runs, algorithm):
    run_dir, _ = cli_runs(algorithm)
    assert len((run_dir / "metrics.jsonl").read_text().splitlines()) == 2
    assert checkpoint.verify(run_dir / "checkpoint-2") is None
    assert (run_dir / "checkpoint-2" / "agent_1" / "sharded").is_dir()
    if algorithm != "magrpo":  # the critics' own backbones are sharded too
        assert (run_dir / "checkpoint-2" / "critic_0" / "sharded").is_dir()
    for i in (0, 1):
        assert (run_dir / "final" / f"agent_{i}" / "model.safetensors").is_file()
