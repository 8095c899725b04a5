"""Scale-out with torchrun (comlrl.parallel): placement, per-row sampling, and real gloo jobs on CPU.

The multi-process tests launch ``python -m torch.distributed.run`` on tests/dist_worker.py (a tiny 2-agent team)
and compare each rank's agents with the single-process run of the same config:

* agent parallelism (2 ranks, one agent each): bitwise equal -- each agent sees the same samples and does the same
  float operations in the same order as in one process;
* data parallelism (4 ranks = 2 agents x 2 replicas): samples bitwise equal (per-row sampling keys), weights within
  ``DP_ATOL``: each replica backpropagates half of the rows and the all-reduce adds the two halves, so the gradient
  sums are reassociated (relative differences ~1e-7); Adam divides by sqrt(v), which magnifies that noise in
  coordinates whose gradient is near zero. Measured: max |diff| 2.6e-6 after 4 steps at lr 1e-2.
"""

from __future__ import annotations

import json
import os
import sys

import pytest
import torch
from tiny import tiny_model, tiny_tokenizer
from torchrun_jobs import (
    SharedLaunch,
    agent_weights,
    assert_same_weights,
    cli_under_torchrun,
    critic_params,
    history,
    in_process_runs,
    run_in_process,
    torchrun,
)

from comlrl.errors import ConfigError
from comlrl.parallel import checkpoint, distributed
from comlrl.parallel.placement import Placement, resolve_placement, shard_bounds
from comlrl.rollout.protocol import GenerationSettings
from comlrl.rollout.rollout import concat_samples, generate
from comlrl.rollout.sampling import derive_seed, gumbel_sample, row_generators

DP_ATOL = 5e-5  # 0.5% of one lr=1e-2 step; see the module docstring
# Every run below trains the same 4 steps (checkpoints do not change them): 2 turns, 3 prompts per step (then 2,
# at the end of the 8-row epoch), so replica shards are uneven (2 + 1 nodes) and later turns are sharded too.
SPEC = {"max_steps": 4, "save_steps": 2, "num_turns": 2, "per_device_train_batch_size": 3}
LORA = {"r": 4, "lora_alpha": 8, "lora_dropout": 0.0, "target_modules": ["q_proj", "v_proj"]}
# The 2-rank runs compared with one process; one launch runs them all (runs_2 below).
SCENARIOS = {
    "ap": SPEC,
    "lora": {"max_steps": 3, "lora": LORA},
    "iac": {**SPEC, "trainer": "iac", "critic_learning_rate": 1e-2},
    "maac": {**SPEC, "trainer": "maac", "critic_type": "q", "critic_learning_rate": 1e-2},
    # topologies: one agent per rank, so answers shown to the other agent cross ranks
    "chain": {"max_steps": 2, "per_device_train_batch_size": 3, "topology": "chain"},
    "leader": {"max_steps": 2, "num_turns": 2, "per_device_train_batch_size": 3, "topology": "leader"},
}


# --- placement and sharding (no processes) -------------------------------------------------------


def test_default_placement_round_robin_then_replicas():
    assert resolve_placement(2, 2).ranks == ((0,), (1,))
    assert resolve_placement(4, 2).ranks == ((0,), (1,), (0,), (1,))  # two agents per rank
    dp = resolve_placement(2, 4)  # rank = replica * num_agents + agent
    assert dp.ranks == ((0, 2), (1, 3)) and dp.replicas == 2
    assert [dp.agents_on(r) for r in range(4)] == [[0], [1], [0], [1]]
    assert [dp.replica_of(r) for r in range(4)] == [0, 0, 1, 1]
    assert resolve_placement(4, 4).ranks == ((0,), (1,), (2,), (3,))


def test_explicit_placement_and_its_errors():
    p = resolve_placement(2, 4, {"0": [0, 1], 1: [2, 3]})  # keys may come from JSON as strings
    assert p.ranks == ((0, 1), (2, 3)) and p.replica_of(1) == 1 and p.replica_of(2) == 0
    assert resolve_placement(2, 2, {0: 1, 1: 0}).ranks == ((1,), (0,))
    cases = [
        ((2, 3, None), "multiple of num_agents"),
        ((2, 2, {0: 0}), "every agent"),
        ((2, 2, {0: 0, 1: 5}), "distinct ranks in 0..1"),
        ((2, 4, {0: [0, 1], 1: [2]}), "same number of replicas"),
        ((2, 2, {0: [0, 1], 1: [1, 0]}), "different replicas"),
        ((2, 2, {0: "x", 1: 0}), "agent index -> rank"),
    ]
    for (n, w, placement), message in cases:
        with pytest.raises(ConfigError, match=message):
            resolve_placement(n, w, placement)


def test_shards_are_contiguous_and_balanced():
    assert shard_bounds(5, 2) == [(0, 3), (3, 5)]
    assert shard_bounds(4, 2) == [(0, 2), (2, 4)]
    assert shard_bounds(1, 2) == [(0, 1), (1, 1)]  # more replicas than prompts: an empty shard
    assert Placement(((0, 2), (1, 3)), 4).describe().startswith("rank 0: agent 0 (replica 0)")


# --- per-row sampling ----------------------------------------------------------------------------


def stop_early_model():
    model = tiny_model()
    model.generation_config.eos_token_id = [2, *range(60, 90)]  # some rows stop early: ragged widths
    return model


def test_row_seeded_samples_do_not_depend_on_the_batch():
    model, tok = stop_early_model(), tiny_tokenizer()
    prompts = ["Hi", "A much longer prompt here.", "Mid-size prompt"]
    settings = GenerationSettings(max_new_tokens=8, temperature=0.9, top_k=50, logprobs=True)
    g = 2
    seeds = [derive_seed(7, k) for k in range(len(prompts) * g)]
    full = generate(model, tok, prompts, num_generations=g, settings=settings, row_seeds=seeds)
    torch.manual_seed(123)  # the global RNG plays no part
    parts = [
        generate(model, tok, prompts[:1], num_generations=g, settings=settings, row_seeds=seeds[:2]),
        generate(model, tok, prompts[1:], num_generations=g, settings=settings, row_seeds=seeds[2:]),
    ]
    joined = concat_samples(parts, tok.pad_token_id)
    assert (
        parts[0].completion_ids.shape[1] != parts[1].completion_ids.shape[1]
        or parts[0].prompt_ids.shape[1] != parts[1].prompt_ids.shape[1]
    )  # re-padding was exercised
    for name in ("prompt_ids", "prompt_mask", "completion_ids", "completion_mask", "truncated"):
        assert torch.equal(getattr(joined, name), getattr(full, name)), name
    assert joined.texts == full.texts
    torch.testing.assert_close(joined.rollout_logprobs, full.rollout_logprobs, atol=1e-5, rtol=0)  # re-padded too
    other = generate(model, tok, prompts, num_generations=g, settings=settings, row_seeds=[s + 1 for s in seeds])
    assert other.texts != full.texts


def test_gumbel_sampling_draws_from_the_softmax():
    logits = torch.tensor([[2.0, 1.0, 0.0, -1.0, float("-inf")]]).repeat(20000, 1)
    tokens = gumbel_sample(logits, row_generators(range(20000)))
    freq = torch.bincount(tokens, minlength=5).float() / len(tokens)
    torch.testing.assert_close(freq, logits[0].softmax(-1), atol=0.015, rtol=0)
    assert freq[4] == 0  # filtered tokens are never sampled


def test_row_seeded_inverse_cdf_sampling_draws_from_the_warped_softmax():
    from comlrl.rollout.sampling import RowSeededSampler

    logits = torch.tensor([[2.0, 1.0, 0.0, -1.0, float("-inf")]]).repeat(20000, 1)
    sampler = RowSeededSampler(range(20000), temperature=0.7, top_k=3)
    tokens = sampler.sample(logits)
    freq = torch.bincount(tokens, minlength=5).float() / len(tokens)
    expected = torch.cat([(logits[0, :3] / 0.7).softmax(-1), torch.zeros(2)])  # top-3 after temperature
    torch.testing.assert_close(freq, expected, atol=0.015, rtol=0)
    assert freq[3:].sum() == 0  # top-k and -inf tokens are never sampled
    # row k's token depends on its own seed only: the last 10 rows alone draw what they drew in the big batch
    alone = RowSeededSampler(range(19990, 20000), temperature=0.7, top_k=3).sample(logits[:10])
    assert torch.equal(alone, tokens[-10:])


# --- launching -----------------------------------------------------------------------------------


def test_nproc_execs_torchrun(monkeypatch, tmp_path):
    from comlrl.cli import main

    seen = []

    def execv(path, argv):  # stands in for the process being replaced by torchrun
        seen.append(argv)
        raise SystemExit(0)

    monkeypatch.setattr(os, "execv", execv)
    cfg = tmp_path / "run.yaml"
    with pytest.raises(SystemExit):
        main(["-v", "train", str(cfg), "--nproc", "2", "--set", "training.max_steps=3", "--resume"])
    assert seen[0] == [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node=2",
        "-m",
        "comlrl",
        "-v",
        "train",
        str(cfg),
        "--set",
        "training.max_steps=3",
        "--resume",
    ]


@pytest.fixture(scope="module")
def refs(tmp_path_factory):
    """The single-process runs of SCENARIOS, each computed when first asked for."""
    return in_process_runs(tmp_path_factory.mktemp("ref"), SCENARIOS)


@pytest.fixture(scope="module")
def runs_2(tmp_path_factory):
    """SCENARIOS on 2 ranks, plus 'maac_path' (a bf16 LoRA MAAC team loaded from a saved model): one torchrun job,
    started when a test first asks for one of them."""
    root = tmp_path_factory.mktemp("dist")
    spec = {"trainer": "maac", "max_steps": 1, "model_dir": str(root / "tiny"), "lora": LORA, "bf16": True}

    def save_tiny(root):
        tiny_model().save_pretrained(root / "tiny")
        tiny_tokenizer().save_pretrained(root / "tiny")

    return SharedLaunch(2, root, {**SCENARIOS, "maac_path": spec}, prepare=save_tiny)


def test_agent_parallel_two_ranks_equal_single_process(refs, runs_2):
    ref, ap = refs("ap"), runs_2("ap")
    got = agent_weights(ap)
    assert {i: len(s) for i, s in got.items()} == {0: 1, 1: 1}  # one agent per rank, nothing loaded twice
    assert_same_weights(agent_weights(ref), got)  # bitwise
    assert history(ap) == history(ref)  # same rewards, lengths, losses at every step
    lines = [json.loads(line) for line in (ap / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in lines] == [1, 2, 3, 4]  # written once, by rank 0, with both agents' metrics
    assert "agent/1/policy/grad_norm" in lines[0] and "agent/0/policy/grad_norm" in lines[0]
    ckpt = ap / "run" / "checkpoint-4"
    assert checkpoint.verify(ckpt) is None  # every rank's files are in the manifest
    assert (ckpt / "agent_0" / "model.safetensors").is_file() and (ckpt / "agent_1" / "model.safetensors").is_file()
    assert (ckpt / "rng_state.rank1.pt").is_file()


def test_lora_team_split_across_ranks_equals_single_process(refs, runs_2):
    """One process: both adapters on one shared base; two ranks: one base + one adapter each. Bitwise equal."""
    ref, ap = refs("lora"), runs_2("lora")
    got = agent_weights(ap)
    assert all(".agent_%d." % i in k for i, states in got.items() for k in states[0])  # each rank: its own adapter
    assert_same_weights(agent_weights(ref), got)
    assert history(ap) == history(ref)


@pytest.mark.parametrize("topology", ["chain", "leader"])
def test_topology_across_two_ranks_equals_single_process(refs, runs_2, tmp_path, topology):
    """Agent 1 (rank 1) sees agent 0's answers (rank 0) in its prompts: weights and metrics bitwise those of one
    process, which differ from the same team's parallel run."""
    ref, ap = refs(topology), runs_2(topology)
    assert_same_weights(agent_weights(ref), agent_weights(ap))
    assert history(ap) == history(ref)
    parallel = run_in_process(tmp_path, {**SCENARIOS[topology], "topology": "parallel"})
    assert history(parallel) != history(ref)  # the topology changed the prompts, so the test above could fail


def test_data_parallel_two_agents_by_two_replicas_equal_single_process(refs, tmp_path):
    ref = refs("ap")
    rc, log, _ = torchrun(4, tmp_path, SPEC)
    assert rc == 0, log[-4000:]
    got = agent_weights(tmp_path)
    assert {i: len(s) for i, s in got.items()} == {0: 2, 1: 2}
    for states in got.values():  # the replicas of an agent stay identical
        assert all(torch.equal(states[0][k], states[1][k]) for k in states[0])
    assert_same_weights(agent_weights(ref), got, atol=DP_ATOL)
    exact = [{k: v for k, v in h.items() if "/policy/" not in k} for h in history(tmp_path)]
    assert exact == [{k: v for k, v in h.items() if "/policy/" not in k} for h in history(ref)]  # same samples
    for mine, theirs in zip(history(tmp_path), history(ref)):
        for k in (k for k in theirs if "/policy/" in k):
            assert mine[k] == pytest.approx(theirs[k], rel=1e-4, abs=1e-6), k
    ckpt = tmp_path / "run" / "checkpoint-4"
    assert checkpoint.verify(ckpt) is None


def test_dead_rank_stops_the_job_and_the_run_resumes_to_the_same_weights(runs_2, tmp_path):
    rc, log, seconds = torchrun(2, tmp_path, {**SPEC, "die_at": [1, 3]})
    assert rc != 0 and seconds < 120, log[-3000:]
    assert "dying at step 3" in log and "exitcode  : 1" in log and "rank      : 1" in log  # torchrun names the rank
    assert [s for s, _ in checkpoint.checkpoints(tmp_path / "run")] == [2]
    rc, log, _ = torchrun(2, tmp_path, {**SPEC, "resume": True})
    assert rc == 0, log[-4000:]
    assert_same_weights(agent_weights(runs_2("ap")), agent_weights(tmp_path))  # bitwise, as uninterrupted
    assert history(tmp_path) == history(runs_2("ap"))
    steps = [json.loads(line)["step"] for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert steps == [1, 2, 3, 4]


def test_hung_rank_times_out_with_a_clear_error(tmp_path):
    rc, log, seconds = torchrun(2, tmp_path, {"max_steps": 2, "dist_timeout": 5, "hang_at": [1, 2]})
    assert rc != 0 and seconds < 120, log[-3000:]
    assert "DistributedError: rank 0/2: collective 'gather completions' failed" in log
    assert "dist_timeout=5s" in log


def test_reward_error_on_rank_0_is_raised_on_every_rank(tmp_path):
    rc, log, seconds = torchrun(2, tmp_path, {"max_steps": 2, "reward_error_at": [0, 2]})
    assert rc != 0 and seconds < 120
    assert log.count("RewardError: reward_func (joint action 0, dataset row") >= 2, log[-3000:]
    assert "raised on rank 0 in score_turn; this is rank 1" in log


def test_cli_under_torchrun_writes_each_file_once(tmp_path):
    run_dir, cfg, log = cli_under_torchrun(tmp_path)
    assert len((run_dir / "metrics.jsonl").read_text().splitlines()) == 2
    assert len(json.loads((run_dir / "run.json").read_text())["starts"]) == 1
    assert checkpoint.verify(run_dir / "checkpoint-2") is None
    for i in (0, 1):
        assert (run_dir / "final" / f"agent_{i}" / "model.safetensors").is_file()
    assert (run_dir / "eval_before.json").is_file() and (run_dir / "eval_after.json").is_file()
    assert log.count("run directory:") == 1  # the summary is printed by rank 0 only
    assert distributed.torchrun_command(2, ["train", cfg])[-3:] == ["comlrl", "train", cfg]


# --- actor-critic under torchrun -----------------------------------------------------------------


def test_iac_critics_live_with_their_agents_and_resume_bitwise(refs, runs_2, tmp_path):
    """IAC on 2 ranks: each rank holds one agent and that agent's critic; actors, critics and metrics are bitwise
    those of one process, the checkpoint holds both critics in one critics.pt, and a run killed at step 3
    resumes to the same weights."""
    spec = SCENARIOS["iac"]
    ref, ap = refs("iac"), runs_2("iac")
    got = critic_params(ap)
    assert {i: len(c) for i, c in got.items()} == {0: 1, 1: 1}  # one critic per rank, with its agent
    assert sorted(torch.load(ap / "critics.rank1.pt")) == [1]
    for i, copies in got.items():
        assert all(torch.equal(a, b) for a, b in zip(copies[0], critic_params(ref)[i][0])), i
    assert_same_weights(agent_weights(ref), agent_weights(ap))
    assert history(ap) == history(ref)
    assert "critic/1/value_loss" in history(ap)[-1]  # rank 1's critic reaches rank 0's metrics
    ckpt = ap / "run" / "checkpoint-4"
    assert checkpoint.verify(ckpt) is None and not list(ckpt.glob("critics.rank*"))
    saved = torch.load(ckpt / "critics.pt", weights_only=False)
    assert len(saved) == 2 and all(torch.equal(a, b) for a, b in zip(saved[1]["params"], got[1][0]))

    rc, log, _ = torchrun(2, tmp_path / "resumed", {**spec, "die_at": [1, 3]})
    assert rc != 0 and "dying at step 3" in log
    rc, log, _ = torchrun(2, tmp_path / "resumed", {**spec, "resume": True})
    assert rc == 0, log[-4000:]
    assert_same_weights(agent_weights(ref), agent_weights(tmp_path / "resumed"))
    for i, copies in critic_params(tmp_path / "resumed").items():
        assert all(torch.equal(a, b) for a, b in zip(copies[0], got[i][0])), i


def test_maac_critic_is_data_parallel_on_every_rank_and_its_checkpoint_loads_in_one_process(refs, runs_2, tmp_path):
    """MAAC (Q critic) on 2 ranks: the centralized critic has a copy on each rank, each copy values and updates on
    its half of the rows (values exchanged, gradients summed), so the copies stay bitwise equal and match one process to float reassociation.
    A torchrun checkpoint resumes in one process."""
    import shutil

    spec = SCENARIOS["maac"]
    ref, ap = refs("maac"), runs_2("maac")
    copies = critic_params(ap)[0]
    assert len(copies) == 2 and all(torch.equal(a, b) for a, b in zip(*copies))
    rows = [json.loads((ap / f"critic_rows.rank{r}.json").read_text()) for r in (0, 1)]
    assert rows[0] + rows[1] == json.loads((ref / "critic_rows.rank0.json").read_text())  # each copy: its shard only
    for a, b in zip(copies[0], critic_params(ref)[0][0]):
        torch.testing.assert_close(a, b, atol=DP_ATOL, rtol=0)
    assert_same_weights(agent_weights(ref), agent_weights(ap), atol=DP_ATOL)
    for mine, theirs in zip(history(ap), history(ref)):
        assert mine.keys() == theirs.keys()
        for k in theirs:
            assert mine[k] == pytest.approx(theirs[k], rel=1e-4, abs=1e-6), k
    # one process continues the torchrun run from its step-2 checkpoint
    single = tmp_path / "single"
    (single / "run").mkdir(parents=True)
    shutil.copytree(ap / "run" / "checkpoint-2", single / "run" / "checkpoint-2")
    run_in_process(single, {**spec, "resume": True})
    for a, b in zip(critic_params(single)[0][0], critic_params(ref)[0][0]):
        torch.testing.assert_close(a, b, atol=DP_ATOL, rtol=0)
    assert_same_weights(agent_weights(ref), agent_weights(single), atol=DP_ATOL)


def test_gradient_buckets_coalesce_small_tensors_in_order():
    from comlrl.parallel.placement import grad_buckets

    small = [torch.zeros(10) for _ in range(5)]  # 40 bytes each
    big, half = torch.zeros(100), torch.zeros(10, dtype=torch.float64)  # 400 bytes; 80 bytes of another dtype
    buckets = grad_buckets([small[0], small[1], big, small[2], half, small[3], small[4]], cap_bytes=100)
    assert [[id(t) for t in b] for b in buckets] == [
        [id(small[0]), id(small[1])],  # 80 bytes; a third would pass the cap
        [id(big)],  # at or over the cap: alone
        [id(small[2])],  # the next tensor has another dtype
        [id(half)],
        [id(small[3]), id(small[4])],
    ]
    assert grad_buckets([]) == []


def test_maac_critic_built_from_a_path_on_a_rank_without_agent_0_matches_agent_0s_rank(runs_2):
    """A LoRA team in bf16 stores its bases in bf16; rank 1 (agent 1 only) loads agent 0's source for the
    centralized critic itself and must store it the same way as rank 0's copy of agent 0's model."""
    ap = runs_2("maac_path")
    dtypes = [json.loads((ap / f"critic_dtypes.rank{r}.json").read_text()) for r in (0, 1)]
    assert dtypes == [{"0": "torch.bfloat16"}, {"0": "torch.bfloat16"}]
