"""vLLM rollouts (use_vllm=True) on vLLM's CPU build: the engine samples as comlrl's decode loop does (greedy tokens,
per-row seeds, log-probs), follows the trainer's weights after every optimizer step (LoRA adapters and full
weights), and every trainer runs on it. The models are tiny Llamas with a head size vLLM's CPU attention supports
(32); vLLM engines start in a few seconds each, so tests share models where they can."""

from __future__ import annotations

import contextlib
import dataclasses
import math
import tempfile

import pytest
import torch
from peft import LoraConfig
from tiny import tiny_model, tiny_tokenizer
from torchrun_jobs import agent_weights, assert_same_weights, history, run_in_process, torchrun

from comlrl import (
    CentralizedMAGRPOTrainer,
    IACConfig,
    IACTrainer,
    MAACConfig,
    MAACTrainer,
    MADPOConfig,
    MADPOTrainer,
    MAGRPOConfig,
    MAGRPOTrainer,
    MARLHFConfig,
    MARLHFTrainer,
)
from comlrl.accel.sampler import SamplerSettings
from comlrl.algorithms.losses import policy_loss
from comlrl.engine.logprobs import completion_logprobs
from comlrl.engine.models import left_pad
from comlrl.engine.team import build_lora_team
from comlrl.errors import ConfigError
from comlrl.rollout.generation import DECODE_LOOP, TRANSFORMERS, VLLM_ENGINE, vllm_installed
from comlrl.rollout.protocol import GenerationSettings, PromptBatch, VLLMOptions
from comlrl.rollout.rollout import completion_mask, generate
from comlrl.rollout.vllm_engine import ColocatedEngine
from comlrl.rollout.vllm_server import ServerEngine

pytestmark = pytest.mark.skipif(not vllm_installed(), reason="vllm is not installed (scripts/setup.sh installs it)")

ROWS = [{"prompt": f"Task {i}: say something."} for i in range(6)]
LORA = LoraConfig(r=8, lora_alpha=16, target_modules=["q_proj", "v_proj", "o_proj"], lora_dropout=0.0)
PROMPTS = ["hello world", "abc", "the quick brown fox", "x"]


def vllm_model(seed: int = 0) -> torch.nn.Module:
    """A tiny Llama whose head size (128 / 4 = 32) vLLM's CPU attention runs."""
    return tiny_model(seed, hidden=128).eval()


@pytest.fixture(scope="module")
def model():
    return vllm_model()


@pytest.fixture(scope="module")
def team():
    """A LoRA team of two on one base, its adapters' B factors random (a fresh adapter changes nothing)."""
    base = vllm_model(1)
    peft = build_lora_team([base, base], [0, 0], LORA, seeds=[1, 2])[0][0]
    with torch.no_grad():
        for name, p in peft.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.3)
    return peft.eval()


def batch(prompts=PROMPTS, **kw) -> PromptBatch:
    tok = tiny_tokenizer()
    ids, mask = left_pad([tok(p)["input_ids"] for p in prompts], tok.pad_token_id)
    return PromptBatch(prompt_ids=ids, prompt_mask=mask, stop_ids=[tok.eos_token_id], pad_id=tok.pad_token_id, **kw)


GREEDY = GenerationSettings(max_new_tokens=12, do_sample=False, engine="vllm")


def test_greedy_tokens_equal_the_decode_loops(model):
    b = batch()
    ours, theirs = DECODE_LOOP.sample(model, b, GREEDY), VLLM_ENGINE.sample(model, b, GREEDY)
    assert torch.equal(ours.ids, theirs.ids)
    assert completion_mask(theirs.ids, b.stop_ids)[1].tolist() == [True] * 4  # 12 tokens, no stop id drawn


def test_a_stop_id_ends_the_row_and_is_kept(model):
    b = batch()
    first = DECODE_LOOP.sample(model, b, GREEDY).ids
    stop = int(first[0, 3])  # the 4th greedy token of row 0 becomes a stop id
    end = first[0].tolist().index(stop) + 1  # the row ends at its first occurrence, which is kept
    b.stop_ids = [stop]
    out = VLLM_ENGINE.sample(model, b, GREEDY)
    assert out.ids[0, :end].tolist() == first[0, :end].tolist() and not completion_mask(out.ids, [stop])[1][0]
    assert (out.ids[0, end:] == b.pad_id).all()


def test_a_row_whose_last_allowed_token_is_a_stop_id_is_not_truncated(model, monkeypatch):
    """vLLM versions that check the length before the stop ids report finish_reason 'length' for a row whose last
    allowed token is a stop id (emulated here over vLLM's own outputs): the flag comes from the stop-id scan, as on
    the other engines, so mask_truncated_completions treats the row alike on every engine."""
    tok = tiny_tokenizer()
    loop = dataclasses.replace(GREEDY, engine="comlrl")
    first = generate(model, tok, ["hello world"], num_generations=1, settings=loop)
    row = first.completion_ids[0, : int(first.completion_mask[0].sum())].tolist()
    last = next(p for p in range(2, len(row)) if row[p] not in row[:p])  # a token the row first draws at p
    monkeypatch.setattr(model.generation_config, "eos_token_id", row[last])  # a stop id (eos_ids reads it)
    loop, vllm = (dataclasses.replace(s, max_new_tokens=last + 1) for s in (loop, GREEDY))
    VLLM_ENGINE.prepare(model, vllm)
    llm, reported = VLLM_ENGINE.engines[model].llm, []
    vllm_generate = llm.generate

    def length_first(prompts, params, **kw):
        outputs = vllm_generate(prompts, params, **kw)
        for output, p in zip(outputs, params):
            out = output.outputs[0]
            if len(out.token_ids) >= p.max_tokens:
                out.finish_reason = "length"
            reported.append(out.finish_reason)
        return outputs

    monkeypatch.setattr(llm, "generate", length_first)
    ours = generate(model, tok, ["hello world"], num_generations=1, settings=loop)
    theirs = generate(model, tok, ["hello world"], num_generations=1, settings=vllm)
    assert reported == ["length"] and theirs.completion_ids[0, -1] == row[last]
    assert torch.equal(theirs.completion_ids, ours.completion_ids)
    assert theirs.truncated.tolist() == ours.truncated.tolist() == [False]


def test_sleep_mode_holds_one_engine_per_process(monkeypatch):
    """vLLM's sleep mode allocates through one allocator per process (CuMemAllocator): a second engine with sleep
    mode is refused before vLLM starts it, naming what to do; engines without sleep mode start beside it, and the
    claim is free again once the sleeping engine is closed (a fake LLM stands in for vLLM's GPU engine)."""
    import vllm

    from comlrl.rollout import vllm_engine

    started = []

    class FakeLLM:
        llm_engine = None

        def __init__(self, **kwargs):
            started.append(kwargs["enable_sleep_mode"])

    monkeypatch.setattr(vllm, "LLM", FakeLLM)
    monkeypatch.setattr(vllm_engine, "on_gpu", lambda model: True)
    sleepy = VLLMOptions(enable_sleep_mode=True)
    first = ColocatedEngine(vllm_model(), sleepy, torch.float32)
    with pytest.raises(ConfigError, match="vllm_enable_sleep_mode.*one vLLM engine per process") as refused:
        ColocatedEngine(vllm_model(1), sleepy, torch.float32)
    assert "peft_config" in str(refused.value) and "placement" in str(refused.value)
    assert started == [True]  # refused before a second engine started
    awake = ColocatedEngine(vllm_model(1), VLLMOptions(), torch.float32)
    first.close()
    second = ColocatedEngine(vllm_model(1), sleepy, torch.float32)
    assert started == [True, False, True]
    for engine in (awake, second):
        engine.close()


class RecordingServer(ServerEngine):
    """A ServerEngine whose HTTP requests are answered here: a server serving ``base``, every request recorded."""

    def request(self, method, path, body=None, timeout=None):
        self.__dict__.setdefault("calls", []).append((path, body))
        return {"data": [{"id": "base", "max_model_len": 256}]} if path == "/v1/models" else ""


def test_server_adapter_folders_honour_tmpdir_and_names_are_unique_per_run_and_rank(team, tmp_path, monkeypatch):
    """Server mode writes adapter versions under TMPDIR (or vllm_server_adapter_dir), where a server on another host
    can read them, never /dev/shm; two ranks (replicas of one agent) or two runs sharing a server load distinct
    adapter names, so one never unloads what another samples from."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    (tmp_path / "tmp").mkdir()
    engines = []
    for rank in ("0", "1", "0"):  # replicas on ranks 0 and 1, then a second run on rank 0
        monkeypatch.setenv("RANK", rank)
        engine = RecordingServer(team, VLLMOptions(mode="server"))
        engine.sync(team)
        engines.append(engine)
    loaded = [{b["lora_name"]: b["lora_path"] for p, b in e.calls if p == "/v1/load_lora_adapter"} for e in engines]
    assert all(len(names) == 2 for names in loaded)  # one version per agent
    assert not (loaded[0].keys() & loaded[1].keys()) and not (loaded[0].keys() & loaded[2].keys())
    assert all(name.startswith(("agent_0-", "agent_1-")) and "-r1-" in name for name in loaded[1])
    paths = [path for names in loaded for path in names.values()]
    assert all(str(path).startswith(str(tmp_path / "tmp")) for path in paths), paths
    shared = tmp_path / "shared"
    explicit = RecordingServer(team, VLLMOptions(mode="server", server_adapter_dir=str(shared)))
    explicit.sync(team)
    assert explicit.folder.parent == shared and all(v.path.is_relative_to(shared) for v in explicit.versions.values())
    for engine in [*engines, explicit]:
        engine.close()
    assert not any(shared.iterdir())


def sampled(**kw) -> GenerationSettings:
    return GenerationSettings(max_new_tokens=10, do_sample=True, temperature=0.7, engine="vllm", **kw)


def test_row_seeds_reproduce_and_do_not_depend_on_the_batch(model):
    seeds = [11, 12, 13, 14]
    one = VLLM_ENGINE.sample(model, batch(row_seeds=seeds), sampled()).ids
    two = VLLM_ENGINE.sample(model, batch(row_seeds=seeds), sampled()).ids
    assert torch.equal(one, two)
    alone = VLLM_ENGINE.sample(model, batch(PROMPTS[2:3], row_seeds=seeds[2:3]), sampled()).ids
    assert alone[0].tolist() == one[2, : alone.shape[1]].tolist()
    other = VLLM_ENGINE.sample(model, batch(row_seeds=[s + 100 for s in seeds]), sampled()).ids
    assert not torch.equal(one, other)


def test_global_rng_and_thread_count_are_left_alone(model):
    torch.manual_seed(5)
    expected = torch.rand(3)
    torch.manual_seed(5)
    threads = torch.get_num_threads()
    VLLM_ENGINE.sample(model, batch(row_seeds=[1, 2, 3, 4]), sampled())
    assert torch.equal(torch.rand(3), expected)
    torch.set_num_threads(1)
    assert torch.get_num_threads() == 1  # set_num_threads works again (vLLM's CPU worker disables it)
    torch.set_num_threads(threads)


def test_sampling_logprobs_are_the_trainers_at_the_temperature(model):
    b = batch(row_seeds=[1, 2, 3, 4])
    out = VLLM_ENGINE.sample(model, b, sampled(logprobs=True))
    mask = (out.ids != -1).long()
    with torch.no_grad():
        trainer = completion_logprobs(model, b.prompt_ids, b.prompt_mask, out.ids, mask, temperature=0.7)
    assert out.logprobs.shape == out.ids.shape
    assert torch.allclose(out.logprobs, trainer, atol=2e-4), (out.logprobs - trainer).abs().max()


@pytest.mark.parametrize(
    "filters", [dict(top_p=0.6), dict(top_p=0.6, top_k=40, repetition_penalty=1.3)], ids=["top_p", "top_k+penalty"]
)
def test_importance_weights_are_one_where_vllm_and_the_decode_loop_agree(model, filters):
    """Under top-p (and top-k with a repetition penalty) each engine's log-probs are renormalized over the tokens its
    filter keeps, and the trainer's log-probs for the weight are too: on the same fp32 weights every token weighs 1
    (rollout_kl 0) with vLLM and with the decode loop alike. Against the trainer's full softmax each token would weigh
    its nucleus mass instead."""
    settings = sampled(logprobs=True, **filters)
    sampler = SamplerSettings(
        temperature=settings.temperature,
        top_k=settings.top_k,
        top_p=settings.top_p,
        repetition_penalty=settings.repetition_penalty,
    )
    for engine in (VLLM_ENGINE, DECODE_LOOP):
        b = batch(row_seeds=[1, 2, 3, 4])
        out = engine.sample(model, b, settings)
        mask = completion_mask(out.ids, b.stop_ids)[0]
        with torch.no_grad():
            full, train = completion_logprobs(
                model, b.prompt_ids, b.prompt_mask, out.ids, mask, temperature=0.7, sampler=sampler
            )
        real = mask.bool()
        # where the engines agree: a token at the filter's edge may be kept by one and dropped by the other's rounding
        agree = real & train.isfinite()
        assert agree.sum() >= 0.9 * real.sum(), engine.name
        weight = (train - out.logprobs).exp()[agree]
        assert (weight - 1).abs().max() < 1e-3, (engine.name, weight)
        assert (full - out.logprobs).exp()[real].mean() < 0.9, engine.name  # the nucleus mass
        tokens = mask / mask.sum()
        _, m = policy_loss(full, full, torch.ones(4), weights=tokens, rollout_logp=out.logprobs, sampler_logp=train)
        filtered = m["rollout_is_filtered"].item()
        assert m["rollout_is_weight"].item() == pytest.approx(1.0 - filtered, abs=1e-4)
        assert abs(m["rollout_kl"].item()) < 1e-4


def test_importance_weight_is_truncated_at_the_vllm_cap():
    """TRL's token_truncate: each token's policy term times min(p_train / p_vllm, cap), by hand for cap 3."""
    logp = torch.log(torch.tensor([[0.5, 0.2, 0.9]]))
    rollout = torch.log(torch.tensor([[0.25, 0.05, 0.9]]))  # ratios 2, 4 (capped to 3), 1
    weights = torch.tensor([[1.0, 1.0, 0.0]])  # the third token is padding
    loss, metrics = policy_loss(
        logp, logp.detach(), torch.tensor([2.0]), weights=weights, rollout_logp=rollout, is_cap=3.0
    )
    assert loss.item() == pytest.approx(-2.0 * (2.0 + 3.0))  # -A * ratio(=1) * w_is, summed over real tokens
    assert metrics["rollout_is_weight"].item() == pytest.approx(5.0)
    assert metrics["rollout_is_capped"].item() == pytest.approx(1.0)
    kl = math.log(0.25 / 0.5) + math.log(0.05 / 0.2)
    assert metrics["rollout_kl"].item() == pytest.approx(kl, rel=1e-5)


def test_lora_team_rows_go_through_their_own_adapters_and_follow_updates(team):
    b = batch(["hello world", "abc"] * 2, adapter_names=["agent_0"] * 2 + ["agent_1"] * 2)
    assert torch.equal(VLLM_ENGINE.sample(team, b, GREEDY).ids, TRANSFORMERS.sample(team, b, GREEDY).ids)
    before = VLLM_ENGINE.sample(team, b, GREEDY).ids
    with torch.no_grad():  # an in-place write, as an optimizer step makes, to agent 1's adapter only
        for name, p in team.named_parameters():
            if "lora_B" in name and ".agent_1." in name:
                p.add_(torch.randn_like(p))
    after = VLLM_ENGINE.sample(team, b, GREEDY).ids
    assert torch.equal(after, TRANSFORMERS.sample(team, b, GREEDY).ids)
    assert torch.equal(after[:2], before[:2]) and not torch.equal(after[2:], before[2:])
    engine = VLLM_ENGINE.engines[team]
    assert len(engine.adapters) == 2 and len(list(engine.folder.iterdir())) == 3  # config + one version each


def cfg(config=MAGRPOConfig, **kw):
    base = dict(
        use_vllm=True,
        per_device_train_batch_size=2,
        num_generations=2,
        max_new_tokens=6,
        max_steps=2,
        learning_rate=5e-2,
        logging_steps=0,
        disable_tqdm=True,
        seed=3,
    )
    base.update(kw)
    return config(**base)


def length_reward(a, b):
    return [float(len(b[0]) - len(a[0]))]


def greedy_equal_after_training(trainer) -> None:
    """The engine's greedy tokens equal the trained model's own (transformers' generate), agent by agent."""
    for agent in trainer.agents:
        names = None if agent.adapter is None else [agent.adapter] * 2
        b = batch(PROMPTS[:2], adapter_names=names)
        assert torch.equal(
            VLLM_ENGINE.sample(agent.model, b, GREEDY).ids, TRANSFORMERS.sample(agent.model, b, GREEDY).ids
        )


@pytest.mark.parametrize("lora, topology", [(True, "parallel"), (False, "chain")], ids=["lora-team", "full-chain"])
def test_magrpo_trains_on_vllm_rollouts_and_the_engine_follows_each_step(lora, topology):
    t = MAGRPOTrainer(
        model=vllm_model(),
        num_agents=2,
        tokenizer=tiny_tokenizer(),
        train_dataset=ROWS,
        reward_func=length_reward,
        args=cfg(topology=topology),
        peft_config=LORA if lora else None,
    )
    before = [[p.detach().clone() for p in a.params] for a in t.agents]
    history = t.train()["history"]
    assert len(history) == 2
    assert all(any(k.endswith("policy/rollout_kl") for k in h) for h in history), history[0].keys()
    for a, old in zip(t.agents, before):
        assert any(not torch.equal(p, q) for p, q in zip(a.params, old)), f"agent {a.index} did not move"
    engines = {id(VLLM_ENGINE.engines[a.model]) for a in t.agents}
    assert len(engines) == (1 if lora else 2)  # a LoRA team on one base shares one engine
    greedy_equal_after_training(t)
    ep = t.rollout(ROWS[:1], [0], settings=t.generation_settings(), num_generations=2, reward_func=t.reward_func)
    shapes = [[s.completion_ids.shape[0] for s in turn.samples] for turn in ep.turns]
    assert shapes == ([[2, 2]] if topology == "parallel" else [[2, 0], [0, 4]])  # each engine serves its stage


def tiny_kwargs(**kw):
    return dict(
        model=vllm_model(), num_agents=2, tokenizer=tiny_tokenizer(), train_dataset=ROWS, eval_dataset=ROWS[:2], **kw
    )


@pytest.mark.parametrize(
    "make",
    [
        lambda: MAGRPOTrainer(
            **tiny_kwargs(reward_func=lambda a, b: [float(len(a[0]) + len(b[0]))] * 1, peft_config=LORA),
            args=cfg(joint_mode="cross", max_steps=1),
        ),
        lambda: MAGRPOTrainer(
            **tiny_kwargs(reward_func=length_reward, peft_config=LORA),
            external_transition=lambda agent_completions: [f"Revise: {c}" for c in agent_completions],
            args=cfg(num_turns=2, max_steps=1),
        ),
        lambda: IACTrainer(**tiny_kwargs(reward_func=length_reward, peft_config=LORA), args=cfg(IACConfig)),
        lambda: MAACTrainer(**tiny_kwargs(reward_func=length_reward, peft_config=LORA), args=cfg(MAACConfig)),
        lambda: CentralizedMAGRPOTrainer(**tiny_kwargs(reward_func=length_reward), args=cfg()),
    ],
    ids=["magrpo-cross", "magrpo-multi-turn", "iac", "maac", "centralized"],
)
def test_every_rl_trainer_runs_two_steps_on_vllm(make):
    t = make()
    history = t.train()["history"]
    assert history and all(math.isfinite(h["loss"]) for h in history if "loss" in h)
    assert VLLM_ENGINE.engines.get(t.agents[0].model) is not None  # the rollouts went through vLLM
    evaluation = t.evaluate()
    assert any(k.startswith("eval") for k in evaluation), evaluation


def test_magrpo_chain_on_vllm_serves_each_stage_its_acting_agents_with_the_answers_before():
    """A LoRA team under topology chain: stage 1 samples agent 0 alone (G per row), stage 2 agent 1 alone, G per
    answer of agent 0 (G * G per row), from prompts holding the answer its node carries; both agents train."""
    g, rows, tok = 2, ROWS[:2], tiny_tokenizer()
    t = MAGRPOTrainer(**tiny_kwargs(reward_func=length_reward, peft_config=LORA), args=cfg(topology="chain"))
    history = t.train()["history"]
    assert len(history) == 2, history
    for h in history:  # agent 1 trains on stage-2 samples that carry vLLM's log-probs
        assert "agent/1/policy/pg_loss" in h and "agent/1/policy/rollout_kl" in h, h.keys()
    ep = t.rollout(rows, [0, 1], settings=t.generation_settings(), num_generations=g, reward_func=t.reward_func)
    assert [[s.completion_ids.shape[0] for s in turn.samples] for turn in ep.turns] == [[4, 0], [0, 8]]
    first, second = ep.turns
    for n in range(len(rows) * g):  # stage-2 node n: agent 0's answer n % g to row n // g
        answer, base = first.samples[0].texts[n].strip(), rows[n // g]["prompt"]
        shown = f"{base}\n\nAgent 1's answer (this turn):\n{answer}"
        assert answer and second.nodes[n].prompts == [base, shown]
        ids, masks = (x[n * g : (n + 1) * g] for x in (second.samples[1].prompt_ids, second.samples[1].prompt_mask))
        assert all(i[m.bool()].tolist() == tok(shown)["input_ids"] for i, m in zip(ids, masks))  # what vLLM got


def test_madpo_candidate_rounds_on_vllm(tmp_path, monkeypatch):
    """Two rounds against the initial team: while the comparator's weights are swapped in, the engine samples them
    (greedy tokens equal the swapped model's), and the trained ones again after."""
    checked = []
    swap = MADPOTrainer._comparator_weights

    @contextlib.contextmanager
    def checked_swap(self, round_index):
        with swap(self, round_index):
            greedy_equal_after_training(self)
            checked.append(round_index)
            yield

    monkeypatch.setattr(MADPOTrainer, "_comparator_weights", checked_swap)
    t = MADPOTrainer(
        **tiny_kwargs(reward_func=length_reward, peft_config=LORA),
        args=cfg(
            MADPOConfig,
            max_steps=-1,
            output_dir=str(tmp_path / "run"),
            num_generations=3,
            num_rounds=2,
            steps_per_round=1,
            prompts_per_round=4,
            per_device_train_batch_size=3,
            comparator="initial",
        ),
    )
    assert len(t.train()["history"]) == 2
    assert checked == [0, 1]
    greedy_equal_after_training(t)


def test_marlhf_on_vllm(tmp_path):
    t = MARLHFTrainer(
        **tiny_kwargs(reward_func=length_reward),
        args=cfg(
            MARLHFConfig,
            output_dir=str(tmp_path / "run"),
            preference_prompts=4,
            candidates_per_prompt=3,
            reward_model_training="full",
            reward_model_epochs=1,
            reward_model_batch_size=4,
            reward_model_eval_fraction=0.25,
            rl_args={"advantage_mode": "none"},
        ),
    )
    out = t.train()
    assert out["history"]


def test_two_rank_torchrun_equals_one_process(tmp_path):
    """Each rank starts the engine of its own agent; per-row seeds make the 2-rank run draw the single process's
    samples, so both train the same weights: a seeded vLLM run reproduces, across process layouts too."""
    spec = {"use_vllm": True, "model": {"hidden": 128}, "max_steps": 2}
    rc, log, _ = torchrun(2, tmp_path / "ranks", spec, timeout=400)
    assert rc == 0, log[-4000:]
    assert log.count("Initializing a V1 LLM engine") == 2  # one engine per rank: its own agent's
    ref = run_in_process(tmp_path / "one", spec)
    assert history(tmp_path / "ranks") == history(ref)
    assert_same_weights(agent_weights(ref), agent_weights(tmp_path / "ranks"), atol=1e-6)


def test_sharded_agents_stream_their_weights_into_vllm(tmp_path):
    """Both agents sharded over both ranks (fsdp) with vLLM rollouts: before each rollout every rank gathers its
    agents' weights one at a time into its engines (no gathered copy of the model), so both steps sample what one
    process samples, and the updates agree within FSDP's float reassociation (this model: hidden 128, gradient norms
    ~9 at lr 1e-2; measured 6.5e-5)."""
    spec = {"use_vllm": True, "model": {"hidden": 128}, "max_steps": 2, "bf16": False}
    sharded = {**spec, "fsdp": "full_shard", "placement": {"0": [0, 1], "1": [0, 1]}}
    rc, log, _ = torchrun(2, tmp_path / "ranks", sharded, timeout=400)
    assert rc == 0, log[-4000:]
    assert log.count("Initializing a V1 LLM engine") == 4  # each rank: an engine per agent
    ref = run_in_process(tmp_path / "one", spec)
    exact = [{k: v for k, v in h.items() if "/policy/" not in k} for h in history(tmp_path / "ranks")]
    assert exact == [{k: v for k, v in h.items() if "/policy/" not in k} for h in history(ref)]  # same samples
    assert_same_weights(agent_weights(ref), agent_weights(tmp_path / "ranks"), atol=2e-4)


def test_cli_trains_and_evaluates_with_use_vllm(tmp_path):
    import json

    import toy_env

    from comlrl.cli import main

    folder = tmp_path / "model"
    vllm_model().save_pretrained(folder)
    tiny_tokenizer().save_pretrained(folder)
    with toy_env.registered():
        rows = toy_env.write_rows(tmp_path / "rows.jsonl")
        cfg = toy_env.write_config(tmp_path / "toy.yaml", rows, str(folder), max_steps=2, eval_steps=2)
        run = tmp_path / "run"
        assert main(["train", cfg, "--set", "training.use_vllm=true", "--set", f"output_dir={run}"]) == 0
    lines = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in lines] == [1, 2] and "agent/0/policy/rollout_kl" in lines[0]
    assert "eval/reward/mean" in lines[1]


def test_greedy_tokens_equal_the_decode_loops_on_the_embedded_model():
    """SmolLM2-135M-Instruct in fp32, chat prompts, 24 tokens: token for token (no tolerance; in bf16 the two
    engines' kernels round differently and a near-tie can flip a token, so the check is fp32)."""
    import dataclasses

    from comlrl.engine.models import load_model, load_tokenizer
    from comlrl.rollout.protocol import VLLMOptions
    from comlrl.rollout.rollout import eos_ids, format_prompt

    try:
        model, tok = load_model("embedded").eval(), load_tokenizer("embedded")
    except Exception as exc:  # noqa: BLE001 - the package is optional outside scripts/setup.sh
        pytest.skip(f"embedded SmolLM2 unavailable: {exc}")
    texts = ["Summarize: my cat opened the fridge.", "Name three colours.", "What is 2 + 3?", "Say hello."]
    ids, mask = left_pad([format_prompt(tok, t, chat=True) for t in texts], tok.pad_token_id)
    b = PromptBatch(prompt_ids=ids, prompt_mask=mask, stop_ids=eos_ids(model, tok), pad_id=tok.pad_token_id)
    settings = dataclasses.replace(GREEDY, max_new_tokens=24, vllm=VLLMOptions(max_model_length=256))
    ours, theirs = DECODE_LOOP.sample(model, b, settings).ids, VLLM_ENGINE.sample(model, b, settings).ids
    width = max(ours.shape[1], theirs.shape[1])
    pad = lambda t: torch.nn.functional.pad(t, (0, width - t.shape[1]), value=tok.pad_token_id)  # noqa: E731
    from comlrl.rollout.rollout import completion_mask

    for o, v in zip(pad(ours), pad(theirs)):
        end = int(completion_mask(o[None], b.stop_ids)[0].sum())
        assert o[:end].tolist() == v[:end].tolist()


def close_engines(trainer) -> None:
    """Stop the vLLM engines of a trainer's agents (a sleep-mode engine holds its process's claim until closed)."""
    for agent in trainer.agents:
        engine = VLLM_ENGINE.engines.pop(agent.model, None)
        if engine is not None:
            engine.close()


def sleeping_team(lora: bool, agents: int = 2) -> MAGRPOTrainer:
    return MAGRPOTrainer(
        model=vllm_model().cuda(),
        num_agents=agents,
        tokenizer=tiny_tokenizer(),
        train_dataset=ROWS,
        reward_func=length_reward,
        args=cfg(vllm_enable_sleep_mode=True, vllm_gpu_memory_utilization=0.2, bf16=False),
        peft_config=LORA if lora else None,
    )


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU (scripts/gpu_check.sh runs it)")
@pytest.mark.parametrize("lora", [True, False], ids=["lora-team", "full-one-agent"])
def test_colocated_on_cuda_with_sleep_mode_follows_the_steps(lora):
    """On a GPU: the process's one engine (a LoRA team's, or a single fully fine-tuned agent's) sleeps between
    rollouts (weights offloaded, KV cache dropped), wakes before each weight push, and after two steps its greedy
    tokens equal the trained model's; closed, it frees the process's sleep mode for the next engine."""
    t = sleeping_team(lora, agents=2 if lora else 1)
    t.train()
    engine = VLLM_ENGINE.engines[t.agents[0].model]
    assert engine.sleep_between_rollouts and engine.sleeping
    greedy_equal_after_training(t)
    close_engines(t)


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU (scripts/gpu_check.sh runs it)")
def test_sleep_mode_refuses_a_second_engine_on_cuda():
    """Two fully fine-tuned agents in one process need two engines: with sleep mode the second is refused, naming
    what to do, before vLLM starts it; the first engine still samples the trained weights."""
    t = sleeping_team(lora=False)
    with pytest.raises(ConfigError, match="one vLLM engine per process"):
        t.train()
    assert VLLM_ENGINE.engines.get(t.agents[1].model) is None
    first = t.agents[0]
    b = batch(PROMPTS[:2])
    assert torch.equal(VLLM_ENGINE.sample(first.model, b, GREEDY).ids, TRANSFORMERS.sample(first.model, b, GREEDY).ids)
    close_engines(t)


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU (scripts/gpu_check.sh runs it)")
def test_vllm_sleep_mode_allocator_holds_one_engine_per_process(monkeypatch):
    """Why sleep mode runs one engine per process: vLLM's sleep-mode allocator (CuMemAllocator) is one per process
    and refuses a second engine's weights. Should a vLLM version start the second one, sleeping and waking every
    engine of a process together (one allocator) may become possible: revisit SleepModeClaim."""
    from comlrl.rollout import vllm_engine

    sleepy = VLLMOptions(enable_sleep_mode=True, gpu_memory_utilization=0.2)
    first = ColocatedEngine(vllm_model().cuda(), sleepy, torch.float32)
    monkeypatch.setattr(vllm_engine.SLEEP_MODE, "claim", lambda engine, model: None)
    try:
        with pytest.raises(AssertionError, match="one instance per process"):
            ColocatedEngine(vllm_model(1).cuda(), sleepy, torch.float32)
    finally:
        first.close()
