"""The checks that need a GPU: bf16 training, the fast decode path and NCCL under torchrun, on CUDA.

    bash scripts/gpu_check.sh                                     # prints the environment, then runs these
    python -m pytest -q -m cuda -rs tests/gpu/test_cuda.py            # the same tests, without the setup
    COMLRL_TEST_DEVICE=cpu python -m pytest -q tests/gpu/test_cuda.py # the same checks on CPU (NCCL skips)

Without a GPU every test skips with its reason. ``COMLRL_TEST_DEVICE`` (default ``cuda``) picks the device, so the
test code itself can be run on a CPU machine. The CPU versions of these checks are in test_trainer.py,
test_fastgen.py and test_distributed.py; their shared inputs and references are in tests/tiny_team.py,
tests/greedy_decode.py and tests/torchrun_jobs.py.
"""

from __future__ import annotations

import copy
import json
import math
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import dist_worker
import pytest
import torch
from greedy_decode import PROMPTS, greedy, hf_greedy
from tiny import tiny_model, tiny_tokenizer
from tiny_team import ROWS, cfg, length_reward, weights
from torchrun_jobs import agent_weights, history
from transformers import LogitsProcessorList

from comlrl.accel.fastgen import fast_generate
from comlrl.accel.llama_decoder import LlamaDecoder
from comlrl.accel.sampler import SamplerSettings
from comlrl.engine.logprobs import completion_logprobs
from comlrl.engine.models import left_pad
from comlrl.parallel import distributed
from comlrl.rollout.protocol import GenerationSettings
from comlrl.rollout.rollout import generate
from comlrl.rollout.sampling import RowSeededSampler
from comlrl.trainers.magrpo import MAGRPOTrainer

pytestmark = pytest.mark.cuda

DEVICE = os.environ.get("COMLRL_TEST_DEVICE", "cuda")
TESTS = Path(__file__).resolve().parents[1]


@pytest.fixture
def device() -> torch.device:
    """The device under test; skips when it is a GPU and none is visible."""
    device = torch.device(DEVICE)
    if device.type == "cuda" and not torch.cuda.is_available():
        pytest.skip("torch.cuda.is_available() is False (COMLRL_TEST_DEVICE=cpu runs these checks on CPU)")
    return device


@pytest.fixture
def bf16_device(device: torch.device) -> torch.device:
    if device.type == "cuda" and not torch.cuda.is_bf16_supported():
        pytest.skip(f"{torch.cuda.get_device_name(device)} does not support bf16")
    return device


def on(device: torch.device, *tensors: torch.Tensor) -> list[torch.Tensor]:
    return [t.to(device) for t in tensors]


# --- 1. bf16 training ------------------------------------------------------------------------------------------------


def test_bf16_team_trains_two_steps(bf16_device, monkeypatch):
    """bf16=True: two steps run, every loss forward runs under bf16 autocast (its matmuls output bf16), losses and
    gradient norms are finite, and the fp32 weights on the device change."""
    from comlrl.trainers import update

    device, seen, forward = bf16_device, [], update.completion_logprobs

    def spy(model, *args, **kw):  # the loss forward; a hook only here, so the rollout keeps its fast decode path
        out_dtypes = []
        handle = model.model.layers[0].self_attn.q_proj.register_forward_hook(
            lambda module, inputs, out: out_dtypes.append(out.dtype)
        )
        try:
            out = forward(model, *args, **kw)
        finally:
            handle.remove()
        logp = out[0] if isinstance(out, tuple) else out  # a tuple when the entropy or sampler log-probs come along
        autocast = torch.get_autocast_dtype(device.type) if torch.is_autocast_enabled(device.type) else None
        seen.append((autocast, out_dtypes, torch.isfinite(logp).all().item()))
        return out

    monkeypatch.setattr(update, "completion_logprobs", spy)
    t = MAGRPOTrainer(
        model=tiny_model(),
        tokenizer=tiny_tokenizer(),
        train_dataset=ROWS,
        reward_func=length_reward,
        formatters=[lambda e: e["prompt"], lambda e: e["prompt"] + " More detail:"],
        args=cfg(seed=1, device=str(device), bf16=True),
    )
    before = weights(t)
    out = t.train()
    assert t.state["step"] == 2
    assert seen and all(ac == torch.bfloat16 and set(dt) == {torch.bfloat16} and ok for ac, dt, ok in seen), seen
    logged = [(k, v) for h in out["history"] for k, v in h.items() if k.endswith(("/pg_loss", "/grad_norm"))]
    assert any(k.endswith("/pg_loss") for k, _ in logged) and all(math.isfinite(v) for _, v in logged), logged
    for agent in t.agents:
        assert all(p.device.type == device.type and p.dtype == torch.float32 for p in agent.model.parameters())
    for w, w0 in zip(weights(t), before):
        assert torch.isfinite(w).all() and not torch.equal(w, w0)


@pytest.mark.parametrize("dtype", [None, torch.bfloat16], ids=["fp32", "bf16"])
def test_logprobs_bf16_close_to_fp32_but_not_equal(bf16_device, dtype):
    """The rollout's log-probs (fast decode) and the loss forward's under autocast, against the fp32 loss forward:
    equal to float noise in fp32; in bf16 different by a little, not by nothing (bf16 matmuls did run)."""
    device = bf16_device
    model, tok = tiny_model(seed=3).to(device).eval(), tiny_tokenizer()
    # the rollout's log-probs are renormalized over its top-50: the fp32 forward's under the same top-50 compare
    settings = GenerationSettings(max_new_tokens=12, temperature=1.0, top_k=50, fast=True, logprobs=True)
    s = generate(
        model,
        tok,
        ["ab", "hello there"],
        num_generations=3,
        settings=settings,
        autocast_dtype=dtype,
        row_seeds=list(range(6)),
    )
    tensors = on(device, s.prompt_ids, s.prompt_mask, s.completion_ids, s.completion_mask)
    with torch.no_grad():
        ref, ref_top50 = completion_logprobs(model, *tensors, sampler=SamplerSettings(top_k=50))
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=dtype is not None):
            loss_forward = completion_logprobs(model, *tensors)
    real = tensors[3].bool() & ref_top50.isfinite()  # a bf16 draw at the 50th place may fall outside the fp32 top-50
    assert real.sum() >= 0.9 * tensors[3].sum()
    for got, want in ((s.rollout_logprobs.to(device), ref_top50), (loss_forward, ref)):
        gap = (got - want)[real].abs().max()
        if dtype is None:
            assert gap < 1e-4  # CUDA's decode and loss kernels differ: float noise, not exactly 0
        else:
            assert 1e-4 < gap < 0.5


# --- 2. the fast decode path -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("backend", ["llama", "generic"])
def test_fast_greedy_matches_generate_fp32(device, backend):
    model = tiny_model().to(device).eval()
    ids, mask = on(device, *left_pad(PROMPTS, 0))
    ref = hf_greedy(model, ids, mask, 0, [2], 24)
    assert torch.equal(greedy(model, ids, mask, 0, [2], 24, backend=backend).cpu(), ref.cpu())


def test_fast_bf16_prefill_close_to_hf_bf16(bf16_device):
    """dtype=bf16 computes what the model cast to bf16 computes, up to bf16 rounding (test_fastgen's check)."""
    model = tiny_model().to(bf16_device).eval()
    ids, mask = on(bf16_device, *left_pad(PROMPTS, 0))
    with torch.no_grad():
        ref = copy.deepcopy(model).to(torch.bfloat16)(input_ids=ids, attention_mask=mask).logits[:, -1].float()
        ours = LlamaDecoder(model, batch=len(PROMPTS), max_len=ids.shape[1] + 4, dtype=torch.bfloat16).prefill(
            ids, mask
        )
        fp32 = model(input_ids=ids, attention_mask=mask).logits[:, -1]
    assert ours.dtype == torch.float32
    assert (ours - ref).abs().max() < 0.05 * fp32.abs().max()
    assert (ours - fp32).abs().max() > 0  # it did not run in fp32


def test_fast_bf16_greedy_picks_the_argmax_of_hf_bf16(bf16_device):
    """bf16 greedy tokens need not equal generate's (rounding can flip near-ties), so: every token fast_generate
    picks is, under the model cast to bf16 reading the same prefix, within bf16 rounding of that step's max logit."""
    device, n = bf16_device, 16
    model = tiny_model().to(device).eval()
    ids, mask = on(device, *left_pad(PROMPTS, 0))
    out = greedy(model, ids, mask, 0, [], n, dtype=torch.bfloat16)  # no stop ids: every row has n real tokens
    assert out.shape == (len(PROMPTS), n)
    full_ids, full_mask = torch.cat([ids, out], 1), torch.cat([mask, torch.ones_like(out)], 1)
    with torch.no_grad():
        logits = (
            copy.deepcopy(model)
            .to(torch.bfloat16)(
                input_ids=full_ids, attention_mask=full_mask, position_ids=(full_mask.cumsum(1) - 1).clamp(min=0)
            )
            .logits
        )
        scale = model(input_ids=ids, attention_mask=mask).logits.abs().max()
    steps = logits[:, ids.shape[1] - 1 : -1].float()  # (B, n, V): the logits each generated token was picked from
    gap = steps.max(-1).values - steps.gather(-1, out[..., None]).squeeze(-1)  # (B, n), 0 where it is the argmax
    assert gap.max() < 0.1 * scale, (gap.max(), scale)


def test_row_seeded_sampling_reproducible_and_matches_generate(device):
    """rollout's per-row seeded sampler with its generators on the device: fast_generate samples generate's tokens,
    the same seeds give the same tokens and other seeds other tokens; so does the built-in sampler's generator."""
    model = tiny_model().to(device).eval()
    ids, mask = on(device, *left_pad(PROMPTS, 0))
    seeds = [11, 12, 13, 14, 15]

    def fast(seeds):
        sampler = RowSeededSampler(seeds, temperature=0.9, top_k=0, top_p=0.95, device=device)
        return fast_generate(
            model,
            ids,
            mask,
            max_new_tokens=12,
            eos_token_ids=[2],
            pad_token_id=0,
            sample_fn=lambda logits: sampler(None, logits).argmax(-1),
        ).cpu()

    processors = LogitsProcessorList([RowSeededSampler(seeds, temperature=0.9, top_k=0, top_p=0.95, device=device)])
    ref = model.generate(
        input_ids=ids,
        attention_mask=mask,
        max_new_tokens=12,
        do_sample=False,
        temperature=None,
        top_p=None,
        top_k=None,
        pad_token_id=0,
        eos_token_id=[2],
        logits_processor=processors,
    )
    out = fast(seeds)
    assert torch.equal(out, ref[:, ids.shape[1] :].cpu())
    assert torch.equal(fast(seeds), out) and not torch.equal(fast([s + 100 for s in seeds]), out)

    def builtin(seed):
        return fast_generate(
            model,
            ids,
            mask,
            max_new_tokens=10,
            eos_token_ids=[2],
            pad_token_id=0,
            generator=torch.Generator(device=device).manual_seed(seed),
        ).cpu()

    assert torch.equal(builtin(5), builtin(5)) and not torch.equal(builtin(5), builtin(6))


# --- 3. NCCL under torchrun ------------------------------------------------------------------------------------------

# dist_worker's run, then what the rank ran on: the default group's backend and the devices of its saved weights.
NCCL_DRIVER = textwrap.dedent("""
    import json, sys
    from pathlib import Path
    sys.path.insert(0, {tests!r})
    import torch, torch.distributed as dist
    import dist_worker
    out = Path(sys.argv[1])
    dist_worker.run(out, json.loads(sys.argv[2]))
    rank = dist.get_rank()
    saved = torch.load(out / f"weights.rank{{rank}}.pt")
    devices = sorted({{str(v.device) for state in saved.values() for v in state.values()}})
    (out / f"backend.rank{{rank}}.json").write_text(json.dumps({{"backend": dist.get_backend(), "devices": devices}}))
""")


def test_nccl_data_parallel_two_gpus_equal_single_process(tmp_path):
    """2 ranks on 2 GPUs, each holding both agents as one replica (placement {agent: [0, 1]}): the default group is
    NCCL (the device is cuda:LOCAL_RANK) and so are the agents' gradient all-reduces. The replicas stay bitwise
    equal, sample what one process on one GPU samples, and make its update up to float summation order."""
    out = _nccl_run_against_one_process(tmp_path, {"max_steps": 2})
    got = agent_weights(out)
    for i, (a, b) in got.items():
        assert all(torch.equal(v, b[k]) for k, v in a.items()), i  # the all-reduce gave both replicas one gradient


def test_nccl_fsdp_two_gpus_shard_both_agents(tmp_path):
    """The same job with fsdp='full_shard': each agent sharded over both GPUs (NCCL all-gather / reduce-scatter),
    gathered for its rollouts. Mixed precision off: autocast computes in bf16 as in the one-process run, while FSDP's
    bf16 parameters would also round the gradients (that policy is exercised on CPU by tests/parallel/test_fsdp.py's CLI runs)."""
    _nccl_run_against_one_process(
        tmp_path, {"max_steps": 2, "fsdp": "full_shard", "fsdp_config": {"mixed_precision": False}}
    )


def test_nccl_fsdp_offload_two_gpus_clips_gradients(tmp_path):
    """fsdp='full_shard offload' with max_grad_norm on 2 GPUs: the shards and their gradients live in CPU memory, so
    the gradient norm's all-reduce runs on CPU tensors; the default group must be "cuda:nccl,cpu:gloo". The run
    matches one process on one GPU like the sharded one above."""
    _nccl_run_against_one_process(
        tmp_path,
        {
            "max_steps": 2,
            "max_grad_norm": 0.01,
            "fsdp": "full_shard offload",
            "fsdp_config": {"mixed_precision": False},
        },
    )


def test_fsdp_offload_one_gpu_world_of_one_clips_gradients(tmp_path, device):
    """The same update path on one GPU: a world of one rank with the backend comlrl picks for offload, a tiny model
    sharded over a 1-rank mesh with its shards in CPU memory, the trainer's gradient norm (clipped) and its AdamW
    step; the norm and the updated weights match the unsharded model's on the GPU."""
    import torch.distributed as dist

    from comlrl.configs.policy import MAGRPOConfig
    from comlrl.parallel import distributed, sharding
    from comlrl.trainers.build import build_optimizer

    if device.type != "cuda":
        pytest.skip("offload moves shards from a GPU to CPU memory; nothing to offload on CPU")
    if dist.is_initialized():
        pytest.skip("a process group is already up in this process")
    backend = distributed.backend_for("cuda", offload=True)
    dist.init_process_group(backend, init_method=f"file://{tmp_path / 'pg'}", rank=0, world_size=1)
    try:
        torch.cuda.set_device(device)
        plan = sharding.sharding_plan("full_shard offload", {"mixed_precision": False})
        ids = torch.randint(3, 200, (2, 12), device=device)
        args = MAGRPOConfig(max_grad_norm=0.01)
        results = []
        for sharded in (False, True):
            model = tiny_model(seed=3).to(device)
            if sharded:
                mesh = sharding.agent_mesh((0,), plan, "cuda", 1)
                sharding.shard_model(model, mesh, plan=plan, bf16=False)
                assert all(p.device.type == "cpu" for p in model.parameters())  # offloaded
            params = [p for p in model.parameters() if p.requires_grad]
            opt, _ = build_optimizer(params, args, lr=1e-2, total_updates=1)
            model(ids).logits.float().pow(2).mean().backward()
            norm = torch.nn.utils.clip_grad_norm_(params, args.max_grad_norm)
            norm = float(norm.full_tensor() if sharding.is_shard(norm) else norm)  # as trainers/update.py does
            opt.step()
            state = {k: dist_worker.full(v).detach().cpu() for k, v in model.state_dict().items()}
            results.append((norm, state))
        (ref_norm, ref), (got_norm, got) = results
        assert ref_norm > args.max_grad_norm  # the clipping did something
        assert got_norm == pytest.approx(ref_norm, rel=1e-4)
        for k, v in ref.items():
            torch.testing.assert_close(got[k], v, rtol=1e-4, atol=1e-5, msg=k)
    finally:
        dist.destroy_process_group()


def _nccl_run_against_one_process(tmp_path: Path, spec: dict) -> Path:
    """Run ``spec`` in one process and on 2 GPUs (both agents on both ranks); check backend, devices, samples and
    weights; return the 2-rank run's folder."""
    if not torch.cuda.is_available() or torch.cuda.device_count() < 2:
        pytest.skip(f"NCCL needs 2 GPUs; {torch.cuda.device_count() if torch.cuda.is_available() else 0} visible")
    dist_worker.run(
        tmp_path / "ref", {k: v for k, v in spec.items() if not k.startswith("fsdp")}
    )  # one process on cuda
    driver = tmp_path / "driver.py"
    driver.write_text(NCCL_DRIVER.format(tests=str(TESTS)))
    out = tmp_path / "dp"
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node=2",
        str(driver),
        str(out),
        json.dumps({**spec, "placement": {"0": [0, 1], "1": [0, 1]}}),
    ]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false", "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(cmd, cwd=TESTS.parent, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    ran = [json.loads((out / f"backend.rank{r}.json").read_text()) for r in (0, 1)]
    offload = "offload" in spec.get("fsdp", "")
    backend = distributed.backend_for("cuda", offload)
    assert [r["backend"] for r in ran] == [backend, backend]
    for r, held in enumerate(ran):  # offloaded shards: the gathered weights come back in CPU memory
        assert "cpu" in held["devices"] if offload else held["devices"] == [f"cuda:{r}"], (r, held)
    got, ref = agent_weights(out), agent_weights(tmp_path / "ref")
    assert {i: len(s) for i, s in got.items()} == {0: 2, 1: 2}
    exact = [{k: v for k, v in h.items() if "/policy/" not in k} for h in history(out)]
    assert exact == [{k: v for k, v in h.items() if "/policy/" not in k} for h in history(tmp_path / "ref")]
    for mine, theirs in zip(history(out), history(tmp_path / "ref")):
        for k in (k for k in theirs if "/policy/" in k):  # grad_norm: a mean instead of a sum would halve it
            assert mine[k] == pytest.approx(theirs[k], rel=1e-2, abs=1e-6), k
    # Adam divides by sqrt(v): coordinates whose gradient is ~0 turn summation-order noise into steps of up to lr,
    # so a few coordinates may differ by ~1e-2 (gloo on CPU, this spec: 0.2% off by more than 1e-3, median 7e-6).
    diff = torch.cat([(v - ref[i][0][k]).abs().flatten() for i, (a, _) in got.items() for k, v in a.items()])
    assert (diff > 1e-3).float().mean() < 0.01 and diff.median() < 1e-4, (diff.max(), diff.median())
    return out


# --- 4. agent_devices: one GPU per agent in one process ----------------------------------------------------------------


def test_agent_devices_two_gpus_one_agent_each(tmp_path):
    """agent_devices=['cuda:0', 'cuda:1']: two MAGRPO steps (with a KL reference) in one process; each agent's
    parameters, reference and optimizer state stay on its GPU, its weights move, and a resume puts the optimizer
    state back on it."""
    if not torch.cuda.is_available() or torch.cuda.device_count() < 2:
        pytest.skip("needs 2 CUDA devices (torch.cuda.device_count() >= 2)")
    devices = [torch.device("cuda", 0), torch.device("cuda", 1)]

    def build(**kw):
        return MAGRPOTrainer(
            model=tiny_model(),
            tokenizer=tiny_tokenizer(),
            train_dataset=ROWS,
            reward_func=length_reward,
            formatters=[lambda e: e["prompt"], lambda e: e["prompt"] + " More detail:"],
            args=cfg(seed=1, agent_devices=[str(d) for d in devices], beta=0.1, output_dir=str(tmp_path), **kw),
        )

    def state_devices(optimizer):
        return {t.device for state in optimizer.state.values() for t in state.values() if torch.is_tensor(t)}

    t = build(save_steps=2)
    before = weights(t)
    t.train()
    assert t.state["step"] == 2
    for a, w, w0 in zip(t.agents, weights(t), before):
        d = devices[a.index]
        assert all(p.device == d for p in a.model.parameters()), a.index
        assert all(p.device == d for p in a.ref_model.parameters()), a.index
        assert state_devices(a.optimizer) == {d}, (a.index, state_devices(a.optimizer))
        assert torch.isfinite(w).all() and not torch.equal(w, w0)
    resumed = build(max_steps=3)
    resumed.train(resume_from_checkpoint=str(tmp_path / "checkpoint-2"))
    assert [state_devices(a.optimizer) for a in resumed.agents] == [{d} for d in devices]
