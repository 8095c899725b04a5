"""fast_generate reproduces model.generate: greedy tokens exactly, sampling in distribution, EOS stop and padding."""

from __future__ import annotations

import copy

import pytest
import torch
from greedy_decode import PROMPTS, greedy, hf_greedy
from tiny import tiny_model
from transformers import (
    GPT2Config,
    GPT2LMHeadModel,
    Qwen2Config,
    Qwen2ForCausalLM,
    T5Config,
    T5ForConditionalGeneration,
)
from transformers.generation.logits_process import TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper

from comlrl.accel import fastgen
from comlrl.accel.decode_weights import can_prepack
from comlrl.accel.fastgen import fast_generate, sample_tokens, supports_fast_generate
from comlrl.accel.llama_decoder import LlamaDecoder
from comlrl.accel.sampler import top_p_filter, warp_logits
from comlrl.engine.models import left_pad

# chi-square critical value for 7 degrees of freedom at p = 1e-4 (the tests are seeded: a margin, not a flake rate)
CHI2_7DF = 29.9


def tiny_qwen2() -> Qwen2ForCausalLM:
    torch.manual_seed(0)
    cfg = Qwen2Config(
        vocab_size=259,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        eos_token_id=2,
        pad_token_id=0,
    )
    model = Qwen2ForCausalLM(cfg)
    for layer in model.model.layers:  # Qwen2's q/k/v biases start at zero; make them matter
        for proj in (layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj):
            torch.nn.init.normal_(proj.bias, std=0.5)
    return model


def tiny_gpt2() -> GPT2LMHeadModel:
    torch.manual_seed(0)
    return GPT2LMHeadModel(
        GPT2Config(
            vocab_size=259,
            n_embd=32,
            n_layer=2,
            n_head=4,
            n_positions=128,
            eos_token_id=2,
            bos_token_id=1,
            pad_token_id=0,
        )
    )


# --- greedy equality --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("pad", [0, 2], ids=["pad!=eos", "pad==eos"])
@pytest.mark.parametrize("backend", ["llama", "generic"])
def test_greedy_matches_generate_tiny_llama(pad, backend):
    model = tiny_model().eval()
    ids, mask = left_pad(PROMPTS, pad)
    ref = hf_greedy(model, ids, mask, pad, [2], 24)
    assert torch.equal(greedy(model, ids, mask, pad, [2], 24, backend=backend), ref)


def tiny_gpt2_dynamic_cache() -> GPT2LMHeadModel:
    model = tiny_gpt2()
    model._can_compile_fullgraph = False  # the generic path then lets the model build its own DynamicCache
    return model


@pytest.mark.parametrize(
    "make",
    [tiny_qwen2, tiny_gpt2, tiny_gpt2_dynamic_cache],
    ids=["qwen2-llama-path", "gpt2-generic-static-cache", "gpt2-generic-dynamic-cache"],
)
def test_greedy_matches_generate_other_architectures(make):
    model = make().eval()
    ids, mask = left_pad(PROMPTS, 0)
    assert torch.equal(greedy(model, ids, mask, 0, [2], 16), hf_greedy(model, ids, mask, 0, [2], 16))


def test_repeated_prompts_prefill_once_and_match():
    """Rollout batches repeat each prompt G times; the distinct-row prefill must give every copy the same result."""
    model = tiny_model().eval()
    ids, mask = left_pad([p for p in PROMPTS[:3] for _ in range(4)], 0)
    assert torch.equal(greedy(model, ids, mask, 0, [2], 12), hf_greedy(model, ids, mask, 0, [2], 12))


def test_stops_at_eos_pads_after_and_stops_early():
    model = tiny_model().eval()
    ids, mask = left_pad(PROMPTS, 0)
    free = hf_greedy(model, ids, mask, 0, [2], 12)  # (B, 12): what each row says without our stop ids
    stop = sorted({int(free[0, 3]), int(free[1, 1]), int(free[2, 0]), *(int(r[2]) for r in free)})
    out = greedy(model, ids, mask, 0, stop, 12)
    assert torch.equal(out, hf_greedy(model, ids, mask, 0, stop, 12))
    assert out.shape[1] <= 3  # every row finished by step 3 -> the loop stopped early
    for row in out:
        hits = torch.isin(row, torch.tensor(stop)).nonzero()
        assert len(hits) > 0
        assert (row[int(hits[0]) + 1 :] == 0).all()  # pad after the first EOS


def test_max_new_tokens_zero_and_all_pad_row():
    model = tiny_model().eval()
    ids, mask = left_pad([[1, 5, 6], []], 0)
    assert greedy(model, ids, mask, 0, [2], 0).shape == (2, 0)
    out = fast_generate(
        model,
        ids,
        mask,
        max_new_tokens=6,
        eos_token_ids=[2],
        pad_token_id=0,
        generator=torch.Generator().manual_seed(0),
    )
    assert out.shape[0] == 2 and int(out.min()) >= 0 and int(out.max()) < 259  # no NaN from the empty prompt


def test_bf16_logits_close_to_hf_bf16():
    """dtype=bf16 computes what the model cast to bf16 computes, up to bf16 rounding."""
    model = tiny_model().eval()
    ids, mask = left_pad(PROMPTS, 0)
    with torch.no_grad():
        ref = copy.deepcopy(model).to(torch.bfloat16)(input_ids=ids, attention_mask=mask).logits[:, -1].float()
        ours = LlamaDecoder(model, batch=len(PROMPTS), max_len=ids.shape[1] + 4, dtype=torch.bfloat16).prefill(
            ids, mask
        )
        fp32 = model(input_ids=ids, attention_mask=mask).logits[:, -1]
    assert ours.dtype == torch.float32
    assert (ours - ref).abs().max() < 0.05 * fp32.abs().max()
    out = greedy(model, ids, mask, 0, [2], 8, dtype=torch.bfloat16)
    assert out.shape == (len(PROMPTS), 8)


# --- PEFT ------------------------------------------------------------------------------------------------------------


def lora_model(adapters=("one",)):
    peft = pytest.importorskip("peft")
    model = tiny_model()
    targets = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
    wrapped = None
    for i, name in enumerate(adapters):
        cfg = peft.LoraConfig(r=4, lora_alpha=8, target_modules=targets, lora_dropout=0.1)
        if wrapped is None:
            wrapped = peft.get_peft_model(model, cfg, adapter_name=name)
        else:
            wrapped.add_adapter(name, cfg)
        torch.manual_seed(10 + i)
        for module in wrapped.modules():  # lora_B starts at zero: randomise so the adapters change the outputs
            if hasattr(module, "lora_B") and name in module.lora_B:
                torch.nn.init.normal_(module.lora_B[name].weight, std=0.3)
    return wrapped.eval()


@pytest.mark.parametrize("backend", ["llama", "generic"])
def test_peft_lora_matches_generate(backend):
    model = lora_model()
    assert supports_fast_generate(model)
    ids, mask = left_pad(PROMPTS, 0)
    ref = hf_greedy(model, ids, mask, 0, [2], 16)
    assert torch.equal(greedy(model, ids, mask, 0, [2], 16, backend=backend), ref)
    with model.disable_adapter():
        base = hf_greedy(model, ids, mask, 0, [2], 16)
        assert torch.equal(greedy(model, ids, mask, 0, [2], 16, backend=backend), base)
    assert not torch.equal(ref, base)  # the adapter does change the outputs


@pytest.mark.parametrize("backend", ["llama", "generic"])
def test_peft_adapter_names(backend):
    model = lora_model(("one", "two"))
    ids, mask = left_pad(PROMPTS, 0)
    # one adapter for all rows (folded into the snapshot) / mixed adapters (shared base + per-row LoRA deltas)
    for names in (["two"] * len(PROMPTS), ["one", "two", "__base__", "two", "one"]):
        ref = hf_greedy(model, ids, mask, 0, [2], 12, adapter_names=names)
        assert torch.equal(greedy(model, ids, mask, 0, [2], 12, adapter_names=names, backend=backend), ref)


def test_mixed_adapters_same_prompt_not_merged():
    """A shared-base team batch: the same prompt for every agent, agent-major rows, G samples each. The prefill of
    distinct rows must keep one row per (prompt, adapter), and each agent's rows must match that agent alone."""
    model = lora_model(("agent_0", "agent_1", "agent_2"))
    prompts = [PROMPTS[0], PROMPTS[2]] * 3  # agent-major: agent i gets rows 2i, 2i+1
    names = [f"agent_{i}" for i in range(3) for _ in range(2)]
    ids, mask = left_pad(prompts, 0)
    mixed = greedy(model, ids, mask, 0, [2], 10, adapter_names=names, backend="llama")
    alone = []
    for i in range(3):
        model.set_adapter(f"agent_{i}")
        alone.append(greedy(model, ids[2 * i : 2 * i + 2], mask[2 * i : 2 * i + 2], 0, [2], 10, backend="llama"))
    assert torch.equal(mixed[:2, : alone[0].shape[1]], alone[0])
    assert torch.equal(mixed[2:4, : alone[1].shape[1]], alone[1])
    assert torch.equal(mixed[4:, : alone[2].shape[1]], alone[2])
    assert not torch.equal(alone[0], alone[1])  # the adapters do differ
    # bf16 decode with routed adapters stays close to the fp32 logits of the model itself
    dec = LlamaDecoder(
        model.base_model.model,
        batch=len(names),
        max_len=ids.shape[1] + 1,
        dtype=torch.bfloat16,
        adapter="__base__",
        routed=names,
    )
    logits = dec.prefill(ids, mask)
    with torch.no_grad():
        pos = (mask.cumsum(-1) - 1).clamp(min=0)
        ref = torch.cat(
            [
                model(
                    input_ids=ids[r : r + 1],
                    attention_mask=mask[r : r + 1],
                    position_ids=pos[r : r + 1],
                    adapter_names=[n],
                ).logits[:, -1]
                for r, n in enumerate(names)
            ]
        )
    assert torch.allclose(logits, ref, atol=0.03 * ref.abs().max().item())
    assert (logits.argmax(-1) == ref.argmax(-1)).all()


# --- sampling distribution --------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def vocab8():
    """A tiny Llama over 8 tokens with a spread-out first-step distribution, and its fp32 first-step logits."""
    model = tiny_model(vocab_size=8).eval()
    torch.manual_seed(1)
    torch.nn.init.normal_(model.lm_head.weight, std=0.3)
    prompt = torch.tensor([[1, 3, 5, 7]])
    with torch.no_grad():
        logits = model(input_ids=prompt).logits[0, -1]
    return model, prompt, logits


def hf_probs(logits: torch.Tensor, temperature: float, top_k: int, top_p: float) -> torch.Tensor:
    """The distribution generate samples from: its own warpers in its own order, then softmax."""
    scores = logits[None].clone()
    for warp in [
        TemperatureLogitsWarper(temperature) if temperature != 1.0 else None,
        TopKLogitsWarper(top_k) if top_k else None,
        TopPLogitsWarper(top_p) if top_p < 1.0 else None,
    ]:
        if warp is not None:
            scores = warp(None, scores)
    return scores.softmax(-1)[0]


@pytest.mark.parametrize("backend", ["llama", "generic"])
@pytest.mark.parametrize(
    "temperature,top_k,top_p", [(1.0, 0, 1.0), (0.6, 0, 1.0), (1.3, 3, 1.0), (1.0, 0, 0.7), (0.8, 5, 0.8)]
)
def test_first_token_distribution(vocab8, backend, temperature, top_k, top_p):
    model, prompt, logits = vocab8
    n = 4000
    ids, mask = prompt.expand(n, -1), torch.ones((n, prompt.shape[1]), dtype=torch.long)
    out = fast_generate(
        model,
        ids,
        mask,
        max_new_tokens=1,
        eos_token_ids=[],
        pad_token_id=0,
        temperature=temperature,
        top_k=top_k,
        top_p=top_p,
        generator=torch.Generator().manual_seed(123),
        backend=backend,
    )
    counts = torch.bincount(out[:, 0], minlength=8).double()
    probs = hf_probs(logits, temperature, top_k, top_p).double()
    assert (counts[probs == 0] == 0).all(), "a filtered token was sampled"
    support = probs > 0
    chi2 = (((counts - n * probs) ** 2)[support] / (n * probs[support])).sum()
    assert chi2 < CHI2_7DF, f"chi2 {chi2:.1f}: counts {counts.tolist()} vs expected {(n * probs).tolist()}"


@pytest.mark.parametrize("scale", [0.3, 3.0, 8.0])  # flat rows take the full-sort fallback, peaky rows the top-k path
@pytest.mark.parametrize("top_p", [0.3, 0.9, 0.99])
def test_top_p_keeps_the_same_tokens_as_hf(scale, top_p):
    logits = torch.randn(6, 5000, generator=torch.Generator().manual_seed(0)) * scale
    logits[::2] *= 4  # mix peaky and flat rows in one batch
    ref = TopPLogitsWarper(top_p)(None, logits)
    assert torch.equal(torch.isinf(top_p_filter(logits, top_p)), torch.isinf(ref))


@pytest.mark.parametrize("scale", [0.3, 3.0, 8.0])
@pytest.mark.parametrize("top_p", [0.3, 0.9, 0.99])
def test_top_k_then_top_p_keeps_the_same_tokens_as_hf(scale, top_p):
    """top-p searches only the top-k survivors: the kept tokens are HF's, and as many as HF keeps where more than k
    tokens tie at the k-th logit (rows 4 and 5: 7 tokens tie for k = 5; which of them a sort ranks first is
    arbitrary, HF's included) and the nucleus can span more than the k candidates."""
    logits = torch.randn(6, 5000, generator=torch.Generator().manual_seed(1)) * scale
    logits[::2] *= 4
    logits[4:, :7] = (
        logits[4:].max(dim=-1, keepdim=True).values + 1.0
    )  # 7 tied top logits (1/7 each: no top_p on a boundary)
    top_k = 5
    ref = TopPLogitsWarper(top_p)(None, TopKLogitsWarper(top_k)(None, logits / 0.6))
    ours = warp_logits(logits, 0.6, top_k, top_p)
    assert torch.equal(torch.isinf(ours[:4]), torch.isinf(ref[:4]))
    assert torch.equal(ours[:4][~torch.isinf(ours[:4])], ref[:4][~torch.isinf(ref[:4])])
    kept, ref_kept = ~torch.isinf(ours[4:]), ~torch.isinf(ref[4:])
    assert kept.sum(dim=-1).tolist() == ref_kept.sum(dim=-1).tolist() and not kept[:, 7:].any()


@pytest.mark.parametrize("top_p", [1.0, 0.9, 0.6])
def test_top_k_draw_within_the_survivors_picks_the_vocabulary_draws_tokens(top_p):
    """The samplers draw within each row's top-k survivors. With the same uniforms they pick the token the draw over
    the whole vocabulary picks (warped logits, softmax, inverse CDF), rows with ties at the k-th included. Where
    logits tie at top-p's boundary (bf16 logits), which tied token top-p keeps follows the sort's order, as in
    transformers: there the draw is one of as many kept tokens, none below the vocabulary draw's lowest kept logit."""
    from comlrl.accel.sampler import _inverse_cdf_sample, inverse_cdf_pick, token_sampler, top_k_survivors
    from comlrl.rollout.sampling import RowSeededSampler

    rows = [torch.randn(8, 3000, generator=torch.Generator().manual_seed(i)) * (0.5 + i % 4) for i in range(40)]
    rows[3][:, :9] = 10.0  # 9 tied top logits for k = 5, all among the 2k candidates
    rows[4][:, :12] = 10.0  # 12: ties past the candidates, the draw over the vocabulary
    full, within = torch.Generator().manual_seed(7), torch.Generator().manual_seed(7)
    sample = token_sampler(True, temperature=0.6, top_k=5, top_p=top_p, generator=within)
    for logits in rows:
        expected = _inverse_cdf_sample(warp_logits(logits, 0.6, 5, top_p).softmax(dim=-1), full)
        assert torch.equal(sample(logits), expected)
    # the trainer's per-row seeded sampler: the token transformers' warpers and a draw over the vocabulary pick
    within = RowSeededSampler(range(8), temperature=0.6, top_k=5, top_p=top_p)
    over_vocab = RowSeededSampler(range(8), temperature=0.6, top_k=5, top_p=top_p)
    for logits in rows:
        u = torch.stack([torch.rand(1, generator=g) for g in over_vocab.generators])
        assert torch.equal(within.sample(logits), inverse_cdf_pick(over_vocab.warp(logits).softmax(dim=-1), u))
    for i in range(20):
        logits = (torch.randn(8, 3000, generator=torch.Generator().manual_seed(100 + i)) * 3).bfloat16().float()
        warped = over_vocab.warp(logits)
        kept = warped.isfinite()
        drawn = within.sample(logits)
        lowest = logits.masked_fill(~kept, float("inf")).min(dim=-1).values
        assert (logits.gather(-1, drawn[:, None])[:, 0] >= lowest).all()
        assert (kept.sum(dim=-1) == top_k_survivors(logits, 0.6, 5, top_p)[1].gt(0).sum(dim=-1)).all()


def test_sampler_never_draws_zero_probability_tokens():
    logits = torch.full((64, 50), float("-inf"))
    logits[:, [3, 17, 49]] = torch.tensor([0.0, 1.0, -2.0])
    draws = torch.stack([sample_tokens(logits, generator=torch.Generator().manual_seed(s)) for s in range(50)])
    assert set(draws.unique().tolist()) <= {3, 17, 49}
    assert torch.equal(sample_tokens(logits, do_sample=False), torch.full((64,), 17))


def test_generator_makes_sampling_reproducible():
    model = tiny_model().eval()
    ids, mask = left_pad(PROMPTS, 0)

    def run(seed):
        return fast_generate(
            model,
            ids,
            mask,
            max_new_tokens=10,
            eos_token_ids=[2],
            pad_token_id=0,
            generator=torch.Generator().manual_seed(seed),
        )

    assert torch.equal(run(5), run(5)) and not torch.equal(run(5), run(6))


def test_sample_fn_row_seeded_matches_generate():
    """With rollout's per-row seeded sampler plugged in, fast_generate samples exactly generate's tokens."""
    from transformers import LogitsProcessorList

    from comlrl.rollout.sampling import RowSeededSampler

    model = tiny_model().eval()
    ids, mask = left_pad(PROMPTS, 0)
    seeds = [11, 12, 13, 14, 15]
    processors = LogitsProcessorList([RowSeededSampler(seeds, temperature=0.9, top_k=0, top_p=0.95)])
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
    ref = ref[:, ids.shape[1] :]
    sampler = RowSeededSampler(seeds, temperature=0.9, top_k=0, top_p=0.95)
    out = fast_generate(
        model,
        ids,
        mask,
        max_new_tokens=12,
        eos_token_ids=[2],
        pad_token_id=0,
        sample_fn=lambda logits: sampler(None, logits).argmax(-1),
    )
    assert torch.equal(out, ref)


# --- support detection ------------------------------------------------------------------------------------------------


def test_supports_fast_generate():
    assert supports_fast_generate(tiny_model()) and supports_fast_generate(tiny_gpt2())
    t5 = T5ForConditionalGeneration(T5Config(vocab_size=32, d_model=16, d_ff=32, num_layers=1, num_heads=2, d_kv=8))
    assert not supports_fast_generate(t5)
    penalised = tiny_model()
    penalised.generation_config.repetition_penalty = 1.3  # generate would apply a processor we do not
    assert not supports_fast_generate(penalised)
    peft = pytest.importorskip("peft")
    prompt_cfg = peft.PromptTuningConfig(task_type="CAUSAL_LM", num_virtual_tokens=2)
    prompt_tuned = peft.get_peft_model(tiny_model(), prompt_cfg)
    assert not supports_fast_generate(prompt_tuned)


def test_unsupported_layout_falls_back_to_generic():
    model = tiny_gpt2().eval()
    with pytest.raises(ValueError, match="Llama fast path"):
        fast_generate(
            model,
            torch.tensor([[1, 5]]),
            torch.ones(1, 2, dtype=torch.long),
            max_new_tokens=2,
            eos_token_ids=[2],
            pad_token_id=0,
            backend="llama",
        )
    assert isinstance(fastgen._make_decoder(model, batch=1, max_len=8, dtype=None), fastgen._HFDecoder)


def test_gradient_checkpointing_keeps_the_llama_path_but_other_hooks_do_not():
    model = tiny_model()
    model.gradient_checkpointing_enable()  # puts a requires_grad hook on the input embeddings
    model.enable_input_require_grads()
    model.eval()
    assert isinstance(fastgen._make_decoder(model, batch=1, max_len=8, dtype=None), LlamaDecoder)
    ids, mask = left_pad(PROMPTS, 0)
    assert torch.equal(greedy(model, ids, mask, 0, [2], 8, backend="llama"), hf_greedy(model, ids, mask, 0, [2], 8))
    model.model.layers[0].mlp.register_forward_hook(lambda module, args, out: out * 2)  # changes the outputs
    assert isinstance(fastgen._make_decoder(model, batch=1, max_len=8, dtype=None), fastgen._HFDecoder)


# --- the real model ---------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def smollm():
    from comlrl.engine.models import load_model, load_tokenizer
    from comlrl.errors import ModelLoadError

    try:
        return load_model("embedded").eval(), load_tokenizer("embedded")
    except ModelLoadError as exc:
        pytest.skip(f"embedded SmolLM2 unavailable: {exc}")


@pytest.mark.slow  # loads the real model; ~5 s on an idle CPU
def test_greedy_matches_generate_smollm2(smollm):
    """SmolLM2-135M (fp32): 32 greedy tokens for 3 chat prompts of different lengths, token for token."""
    from comlrl.rollout.rollout import eos_ids, format_prompt

    model, tok = smollm
    texts = [
        "Say hi.",
        "Summarize: my cat learned to open the fridge and now eats all the cheese at night.",
        "Name three colors.",
    ]
    ids, mask = left_pad([format_prompt(tok, t, chat=True) for t in texts], tok.pad_token_id)
    stop = eos_ids(model, tok)
    ref = hf_greedy(model, ids, mask, tok.pad_token_id, stop, 32)
    assert torch.equal(greedy(model, ids, mask, tok.pad_token_id, stop, 32, backend="llama"), ref)


# --- several models at once -------------------------------------------------------------------------------------------


@pytest.fixture
def sample_threads(monkeypatch):
    """Whether each rollout ``_sample`` call ran on the main thread, in call order; torch on 2 threads (the cores the
    models split) for the test."""
    import threading

    from comlrl.rollout import rollout

    on_main, sample = [], rollout._sample

    def recording(*args):
        on_main.append(threading.current_thread() is threading.main_thread())
        return sample(*args)

    monkeypatch.setattr(rollout, "_sample", recording)
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    yield on_main
    torch.set_num_threads(before)


def test_distinct_models_decode_concurrently_with_the_samples_of_one_at_a_time(sample_threads):
    """Two models' rollouts run in two threads (one core each) and give exactly what separate calls give; requests
    drawing from the global RNG stay on the calling thread, one after another."""
    from tiny import tiny_tokenizer

    from comlrl.rollout.protocol import GenerationSettings
    from comlrl.rollout.rollout import GenerationRequest, generate, generate_concurrently

    models, tok = [tiny_model(seed=1).eval(), tiny_model(seed=2).eval()], tiny_tokenizer()
    settings = GenerationSettings(max_new_tokens=8, temperature=1.0, do_sample=True)
    prompts = ["ab", "hello there"]
    requests = [
        GenerationRequest(
            model=m,
            tokenizer=tok,
            prompts=prompts,
            num_generations=3,
            settings=settings,
            row_seeds=[100 * i + k for k in range(6)],
        )
        for i, m in enumerate(models)
    ]
    threads = sample_threads
    together = generate_concurrently(requests)
    assert threads == [False, False]
    alone = [
        generate(r.model, tok, prompts, num_generations=3, settings=settings, row_seeds=r.row_seeds) for r in requests
    ]
    for a, b in zip(together, alone):
        assert torch.equal(a.completion_ids, b.completion_ids) and a.texts == b.texts
    assert not torch.equal(together[0].completion_ids, together[1].completion_ids)
    threads.clear()
    generate_concurrently(  # global RNG
        [
            GenerationRequest(model=m, tokenizer=tok, prompts=prompts, num_generations=3, settings=settings)
            for m in models
        ]
    )
    assert threads == [True, True]
    threads.clear()
    off = GenerationSettings(max_new_tokens=8, temperature=1.0, do_sample=True, concurrent=False)
    generate_concurrently(
        [
            GenerationRequest(
                model=r.model, tokenizer=tok, prompts=prompts, num_generations=3, settings=off, row_seeds=r.row_seeds
            )
            for r in requests
        ]
    )
    assert threads == [True, True]


# --- rollout log-probs --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("fast", [True, False], ids=["fastgen", "hf-generate"])
@pytest.mark.parametrize("dtype", [None, torch.bfloat16], ids=["fp32", "bf16"])
def test_rollout_logprobs_are_the_sampled_tokens_logprobs(fast, dtype):
    """Samples.rollout_logprobs: each sampled token's log-prob under the distribution it was drawn from (the rollout's
    own logits / temperature, top-k applied and renormalized), 0 on padding. In the model's dtype they equal what the
    loss forward computes under the same processing (1e-5); a bf16 rollout differs from the fp32 loss by a little, not
    by nothing."""
    from tiny import tiny_tokenizer

    from comlrl.accel.sampler import SamplerSettings
    from comlrl.engine.logprobs import completion_logprobs
    from comlrl.rollout.protocol import GenerationSettings
    from comlrl.rollout.rollout import generate

    model, tok = tiny_model(seed=3).eval(), tiny_tokenizer()
    settings = GenerationSettings(max_new_tokens=12, temperature=0.7, top_k=50, fast=fast, logprobs=True)
    s = generate(
        model,
        tok,
        ["ab", "hello there"],
        num_generations=3,
        settings=settings,
        autocast_dtype=dtype,
        row_seeds=list(range(6)),
    )
    assert s.rollout_logprobs.shape == s.completion_ids.shape
    assert torch.all(s.rollout_logprobs[s.completion_mask == 0] == 0)
    real = s.completion_mask.bool()
    assert torch.all(s.rollout_logprobs[real] < 0)
    with torch.no_grad():
        full, ref = completion_logprobs(
            model,
            s.prompt_ids,
            s.prompt_mask,
            s.completion_ids,
            s.completion_mask,
            temperature=0.7,
            sampler=SamplerSettings(temperature=0.7, top_k=50),
        )
    # a bf16 rollout may draw a token at the 50th place that the fp32 top-50 drops (the weight is 0 then)
    kept = real & ref.isfinite()
    assert kept.sum() >= (0.9 if dtype else 1.0) * real.sum()
    assert torch.all(ref[kept] > full[kept])  # renormalized over the 50 kept tokens of 259
    gap = (s.rollout_logprobs - ref)[kept].abs().max()
    if dtype is None:
        assert gap < 1e-5
    else:
        assert 1e-4 < gap < 0.5
    plain = generate(
        model,
        tok,
        ["ab", "hello there"],
        num_generations=3,
        settings=GenerationSettings(max_new_tokens=12, temperature=0.7, top_k=50, fast=fast),
        autocast_dtype=dtype,
        row_seeds=list(range(6)),
    )
    assert plain.rollout_logprobs is None and torch.equal(plain.completion_ids, s.completion_ids)


def test_fp32_decode_reads_wide_projections_in_place():
    """fp32: q/k/v, o and gate/up run on the model's own weight tensors (no copy); the down projection and the output
    layer run on packed copies where oneDNN can pack; the prefill's logits are the model's own."""
    model = tiny_qwen2()  # q/k/v biases too
    ids, mask = left_pad([[1, 5, 6, 7], [1, 20]], 0)
    decoder = LlamaDecoder(model, batch=2, max_len=16, dtype=None)
    weights, layer = decoder.layers[0], model.model.layers[0]
    assert all(p.weight_first for p in weights.qkv + weights.o + weights.gate_up)
    attn = layer.self_attn
    own = [attn.q_proj, attn.k_proj, attn.v_proj, attn.o_proj, layer.mlp.gate_proj, layer.mlp.up_proj]
    assert all(p.weight is m.weight for p, m in zip(weights.qkv + weights.o + weights.gate_up, own))
    if can_prepack(torch.float32, torch.device("cpu")):
        assert weights.down[0].packed is not None and decoder.lm_head[0].packed is not None
    logits = decoder.prefill(ids, mask)
    ref = model(input_ids=ids, attention_mask=mask, position_ids=(mask.cumsum(1) - 1).clamp(min=0)).logits[:, -1]
    torch.testing.assert_close(logits, ref, atol=1e-5, rtol=1e-5)


# --- fp32 weights on loan to the decode -------------------------------------------------------------------------------


def _params(model) -> dict[str, tuple[torch.nn.Parameter, int, torch.Tensor]]:
    return {name: (p, p.data_ptr(), p.detach().clone()) for name, p in model.named_parameters()}


def _assert_given_back(model, before: dict) -> None:
    """Every parameter is the same object on the same memory, with the same values."""
    for name, p in model.named_parameters():
        same, ptr, values = before[name]
        assert p is same and p.requires_grad and p.data_ptr() == ptr, name
        assert p.shape == values.shape and torch.equal(p.detach(), values), name


@pytest.mark.skipif(not can_prepack(torch.float32, torch.device("cpu")), reason="needs oneDNN packing")
@pytest.mark.parametrize("make", [tiny_model, tiny_qwen2], ids=["llama", "qwen2-biases"])
def test_lent_weights_decode_like_generate_and_come_back_bit_for_bit(make):
    """With ``lend_weights`` the decode holds the fp32 projections packed in place of the parameters (empty during
    the call), picks generate's greedy tokens, and every parameter is itself again afterwards, value for value."""
    model = make().eval()
    ids, mask = left_pad(PROMPTS, 0)
    ref = hf_greedy(model, ids, mask, 0, [2], 24)
    before, seen = _params(model), []
    layer = model.model.layers[-1]

    def argmax_watching(logits):
        seen.append((layer.self_attn.q_proj.weight.numel(), layer.mlp.down_proj.weight.numel()))
        return logits.argmax(-1)

    out = greedy(model, ids, mask, 0, [2], 24, lend_weights=True, sample_fn=argmax_watching)
    assert torch.equal(out, ref)
    assert seen and all(lent == (0, 0) for lent in seen)
    _assert_given_back(model, before)
    assert model.lm_head.weight is model.model.embed_tokens.weight or model.lm_head.weight.numel() > 0


@pytest.mark.skipif(not can_prepack(torch.float32, torch.device("cpu")), reason="needs oneDNN packing")
def test_lent_weights_come_back_when_the_decode_or_its_build_fails(monkeypatch):
    model = tiny_model().eval()
    ids, mask = left_pad(PROMPTS, 0)
    before = _params(model)

    def fails(logits):
        raise RuntimeError("sampler failed")

    with pytest.raises(RuntimeError, match="sampler failed"):
        greedy(model, ids, mask, 0, [2], 4, lend_weights=True, sample_fn=fails)
    _assert_given_back(model, before)

    # the last layer cannot be built: the layers already lent come back and the generic path decodes the model
    ref = hf_greedy(model, ids, mask, 0, [2], 8)
    build, last = LlamaDecoder._layer_weights, model.model.layers[-1]

    def refuse_last(self, layer):
        if layer is last:
            raise fastgen.Unsupported("test: last layer")
        return build(self, layer)

    monkeypatch.setattr(LlamaDecoder, "_layer_weights", refuse_last)
    assert torch.equal(greedy(model, ids, mask, 0, [2], 8, lend_weights=True), ref)
    _assert_given_back(model, before)
    monkeypatch.undo()

    # every layer lent, then the decoder's construction fails (out of memory for the KV cache, say)
    make = fastgen._make_decoder

    def built_then_failed(*args, **kwargs):
        make(*args, **kwargs)
        raise MemoryError("test: KV cache")

    monkeypatch.setattr(fastgen, "_make_decoder", built_then_failed)
    with pytest.raises(MemoryError):
        greedy(model, ids, mask, 0, [2], 4, lend_weights=True)
    _assert_given_back(model, before)


@pytest.mark.skipif(not can_prepack(torch.float32, torch.device("cpu")), reason="needs oneDNN packing")
def test_frozen_weights_are_read_in_place_not_lent():
    model = tiny_model().eval().requires_grad_(False)
    ids, mask = left_pad(PROMPTS, 0)
    ref, sizes = hf_greedy(model, ids, mask, 0, [2], 8), []
    q = model.model.layers[0].self_attn.q_proj

    def argmax_watching(logits):
        sizes.append(q.weight.numel())
        return logits.argmax(-1)

    assert torch.equal(greedy(model, ids, mask, 0, [2], 8, lend_weights=True, sample_fn=argmax_watching), ref)
    assert sizes and all(n > 0 for n in sizes)


@pytest.mark.skipif(not can_prepack(torch.float32, torch.device("cpu")), reason="needs oneDNN packing")
def test_a_weight_viewing_a_larger_buffer_is_read_in_place_not_lent():
    model = tiny_model().eval()
    down = model.model.layers[0].mlp.down_proj
    flat = torch.full((2 * down.weight.numel(),), 7.0)  # the weight, then a neighbour's values
    flat[: down.weight.numel()].copy_(down.weight.detach().flatten())
    down.weight.data = flat[: down.weight.numel()].view(down.weight.shape)
    ids, mask = left_pad(PROMPTS, 0)
    ref = hf_greedy(model, ids, mask, 0, [2], 8)
    before, sizes = _params(model), []

    def argmax_watching(logits):
        sizes.append(down.weight.numel())
        return logits.argmax(-1)

    assert torch.equal(greedy(model, ids, mask, 0, [2], 8, lend_weights=True, sample_fn=argmax_watching), ref)
    assert sizes and all(n > 0 for n in sizes)
    assert torch.all(flat[down.weight.numel() :] == 7.0)
    _assert_given_back(model, before)


def test_requests_on_shared_weights_decode_one_after_another(sample_threads):
    """Two requests on one model (or on models sharing parameters) never decode in two threads: the decode may hold
    a model's weights for the call."""
    from tiny import tiny_tokenizer

    from comlrl.rollout.protocol import GenerationSettings
    from comlrl.rollout.rollout import GenerationRequest, generate_concurrently

    model, tok = tiny_model(seed=1).eval(), tiny_tokenizer()
    twin = copy.deepcopy(model)
    twin.model.layers[0].mlp.down_proj.weight = model.model.layers[0].mlp.down_proj.weight  # one shared parameter
    settings = GenerationSettings(max_new_tokens=4, temperature=1.0, do_sample=True)
    for pair in ([model, model], [model, twin]):
        sample_threads.clear()
        generate_concurrently(
            [
                GenerationRequest(
                    model=m, tokenizer=tok, prompts=["ab"], num_generations=2, settings=settings, row_seeds=[1, 2]
                )
                for m in pair
            ]
        )
        assert sample_threads == [True, True]
