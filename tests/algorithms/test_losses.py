import math

import pytest
import torch
from tiny import grouped_batch, tiny_model

from comlrl.algorithms.losses import loss_weights, policy_loss, token_logprobs
from comlrl.engine.logprobs import completion_logprobs
from comlrl.engine.models import left_pad
from comlrl.rollout.rollout import completion_mask

PAD = 0
# (prompt tokens, completion tokens incl. EOS=2, advantage)
SEQS = [([5, 6, 7, 8], [9, 10, 2], 1.5), ([11, 12], [13, 2], -0.5), ([14, 15, 16], [17, 18, 19, 20], -1.0)]


def batch(extra_left=0, extra_right=0):
    p_ids, p_mask = left_pad([[PAD] * 0 + p for p, _, _ in SEQS], PAD)
    if extra_left:
        p_ids = torch.cat([torch.full((len(SEQS), extra_left), PAD), p_ids], 1)
        p_mask = torch.cat([torch.zeros(len(SEQS), extra_left, dtype=torch.long), p_mask], 1)
    width = max(len(c) for _, c, _ in SEQS) + extra_right
    c_ids = torch.full((len(SEQS), width), PAD)
    for i, (_, c, _) in enumerate(SEQS):
        c_ids[i, : len(c)] = torch.tensor(c)
    # mask from lengths: a truncated completion (no EOS) followed by padding is still masked right
    c_mask = (torch.arange(width).unsqueeze(0) < torch.tensor([[len(c)] for _, c, _ in SEQS])).long()
    adv = torch.tensor([a for _, _, a in SEQS])
    return p_ids, p_mask, c_ids, c_mask, adv


def loss_and_grads(model, loss_type="token_mean", **pad):
    model.zero_grad()
    p_ids, p_mask, c_ids, c_mask, adv = batch(**pad)
    logp = completion_logprobs(model, p_ids, p_mask, c_ids, c_mask)
    (w,) = loss_weights([c_mask], loss_type)
    loss, _ = policy_loss(logp, logp.detach(), adv, weights=w)
    loss.backward()
    return loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}


def test_completion_mask_stops_at_first_eos_even_when_pad_is_eos():
    ids = torch.tensor([[4, 2, 2, 2], [4, 5, 6, 7], [2, 2, 2, 2]])
    mask, truncated = completion_mask(ids, [2])
    assert mask.tolist() == [[1, 1, 0, 0], [1, 1, 1, 1], [1, 0, 0, 0]]
    assert truncated.tolist() == [False, True, False]


def test_token_logprobs_matches_log_softmax():
    logits = torch.randn(2, 3, 7)
    labels = torch.randint(0, 7, (2, 3))
    ref = torch.log_softmax(logits, -1).gather(-1, labels.unsqueeze(-1)).squeeze(-1)
    torch.testing.assert_close(token_logprobs(logits, labels), ref)


@pytest.mark.parametrize("loss_type", ["token_mean", "seq_mean_token_mean", "seq_sum"])
def test_loss_ignores_prompt_padding_and_completion_padding(loss_type):
    model = tiny_model()
    base_loss, base_grads = loss_and_grads(model, loss_type)
    padded_loss, padded_grads = loss_and_grads(model, loss_type, extra_left=5, extra_right=4)
    torch.testing.assert_close(padded_loss, base_loss, atol=1e-6, rtol=1e-5)
    for name in base_grads:
        torch.testing.assert_close(padded_grads[name], base_grads[name], atol=1e-6, rtol=1e-4)


def test_gradient_changes_when_a_completion_token_changes():
    # (the loss *value* is -sum w*A at ratio 1; the gradient carries the tokens)
    model = tiny_model()
    _, base = loss_and_grads(model)
    SEQS[0][1][0] += 1
    try:
        _, changed = loss_and_grads(model)
    finally:
        SEQS[0][1][0] -= 1
    assert not torch.allclose(base["lm_head.weight"], changed["lm_head.weight"])


def test_gradient_equals_hand_computed_reinforce_estimator():
    model = tiny_model()
    _, grads = loss_and_grads(model, "token_mean")
    # By hand: one unpadded sequence at a time, per-token log-probs from a full log-softmax,
    # estimator g = -(1/N_tokens) * sum_i A_i * sum_t grad log p(y_it | prefix).
    n_tokens = sum(len(c) for _, c, _ in SEQS)
    model.zero_grad()
    for prompt, comp, adv in SEQS:
        ids = torch.tensor([prompt + comp])
        logits = model(input_ids=ids).logits[0, len(prompt) - 1 : -1]
        logp = torch.log_softmax(logits, -1).gather(-1, torch.tensor(comp).unsqueeze(-1)).sum()
        (-(adv / n_tokens) * logp).backward()
    for name, p in model.named_parameters():
        torch.testing.assert_close(grads[name], p.grad, atol=1e-6, rtol=1e-4)


def test_batched_logprobs_equal_one_at_a_time():
    model = tiny_model()
    p_ids, p_mask, c_ids, c_mask, _ = batch(extra_left=2)
    with torch.no_grad():
        batched = completion_logprobs(model, p_ids, p_mask, c_ids, c_mask)
        for i, (prompt, comp, _) in enumerate(SEQS):
            single = completion_logprobs(
                model,
                torch.tensor([prompt]),
                torch.ones(1, len(prompt), dtype=torch.long),
                torch.tensor([comp]),
                torch.ones(1, len(comp), dtype=torch.long),
            )
            torch.testing.assert_close(batched[i, : len(comp)], single[0], atol=1e-5, rtol=1e-5)


def test_loss_weights_hand_computed():
    m1 = torch.tensor([[1, 1, 0], [1, 0, 0]])
    m2 = torch.tensor([[1, 1, 1]])
    tm = loss_weights([m1, m2], "token_mean")
    torch.testing.assert_close(tm[0], torch.tensor([[1 / 6, 1 / 6, 0], [1 / 6, 0, 0]]))
    sm = loss_weights([m1, m2], "seq_mean_token_mean")
    torch.testing.assert_close(sm[0], torch.tensor([[1 / 6, 1 / 6, 0], [1 / 3, 0, 0]]))
    torch.testing.assert_close(sm[1], torch.tensor([[1 / 9, 1 / 9, 1 / 9]]))
    ss = loss_weights([m1, m2], "seq_sum")
    torch.testing.assert_close(ss[1], torch.tensor([[1 / 3, 1 / 3, 1 / 3]]))
    with pytest.raises(ValueError, match="unknown loss_type"):
        loss_weights([m1], "sum")


def test_ratio_clipping_and_kl():
    logp = torch.tensor([[-1.0, -1.0]], requires_grad=True)
    old = torch.tensor([[-1.5, -0.5]])  # ratios e^0.5 = 1.65, e^-0.5 = 0.61
    w = torch.tensor([[0.5, 0.5]])
    loss, m = policy_loss(logp, old, torch.tensor([1.0]), weights=w, epsilon=0.2)
    # A > 0: token 1 clipped at 1.2 (no gradient), token 2 unclipped ratio 0.61 (min of the two surrogates)
    expected = -(0.5 * 1.2 + 0.5 * torch.exp(torch.tensor(-0.5)))
    torch.testing.assert_close(loss, expected)
    loss.backward()
    assert logp.grad[0, 0] == 0 and logp.grad[0, 1] < 0
    assert m["clip_frac"] == pytest.approx(0.5)
    ref = torch.tensor([[-1.0, -2.0]])
    loss_kl, mk = policy_loss(logp.detach(), logp.detach(), torch.tensor([0.0]), weights=w, ref_logp=ref, beta=0.1)
    k3 = torch.exp(torch.tensor(-1.0)) - (-1.0) - 1  # delta = ref - logp = -1 on token 2
    torch.testing.assert_close(mk["kl"], 0.5 * k3)
    torch.testing.assert_close(loss_kl, 0.1 * 0.5 * k3)


def test_bf16_training_forward_runs_eager_attention_and_matches_sdpa():
    """On CPU, a bf16 forward with grad switches SDPA to eager attention for the block only (same values)."""
    model = tiny_model()
    assert model.config._attn_implementation == "sdpa"
    seen = []
    model.model.layers[0].self_attn.register_forward_pre_hook(lambda m, a: seen.append(m.config._attn_implementation))
    p_ids, p_mask, c_ids, c_mask, _ = batch(extra_left=2)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        trained = completion_logprobs(model, p_ids, p_mask, c_ids, c_mask)
        with torch.no_grad():
            reference = completion_logprobs(model, p_ids, p_mask, c_ids, c_mask)
    fp32 = completion_logprobs(model, p_ids, p_mask, c_ids, c_mask)
    assert seen == ["eager", "sdpa", "sdpa"]
    assert model.config._attn_implementation == "sdpa"
    mask = c_mask.bool()
    torch.testing.assert_close(trained[mask], reference[mask], atol=3e-2, rtol=0)
    torch.testing.assert_close(trained[mask], fp32[mask], atol=5e-2, rtol=0)
    (trained * c_mask).sum().backward()
    bf16_grad = torch.cat([p.grad.flatten() for p in model.parameters()])
    model.zero_grad(set_to_none=True)
    (completion_logprobs(model, p_ids, p_mask, c_ids, c_mask) * c_mask).sum().backward()
    fp32_grad = torch.cat([p.grad.flatten() for p in model.parameters()])
    # the eager bf16 backward follows the fp32 gradient up to bf16 rounding
    assert float(torch.nn.functional.cosine_similarity(bf16_grad, fp32_grad, dim=0)) > 0.99


def test_bf16_training_forward_with_gradient_checkpointing_keeps_its_attention():
    """Checkpointed layers recompute during backward, after the forward block: the attention must not switch."""
    model = tiny_model()
    model.gradient_checkpointing_enable()
    model.train()
    p_ids, p_mask, c_ids, c_mask, _ = batch(extra_left=2)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        logp = completion_logprobs(model, p_ids, p_mask, c_ids, c_mask)
    (logp * c_mask).sum().backward()
    assert model.config._attn_implementation == "sdpa"
    assert all(p.grad is not None for p in model.parameters() if p.requires_grad)


def _logits_path(model, p_ids, p_mask, c_ids, c_mask):
    from comlrl.engine.logprobs import _logits_logprobs

    ids, mask = torch.cat([p_ids, c_ids], 1), torch.cat([p_mask, c_mask], 1)
    return _logits_logprobs(
        model,
        ids=ids,
        mask=mask,
        position_ids=(mask.cumsum(1) - 1).clamp(min=0),
        completion_ids=c_ids,
        completion_mask=c_mask,
    )


def _logp_and_grads(model, fn, tensors, weights):
    """fn's log-probs and the gradients of sum(weights * log-probs), fresh."""
    model.zero_grad()
    logp = fn(model, *tensors)
    (logp * weights).sum().backward()
    return logp.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def _assert_same_learning(got, expected, c_mask):
    """Log-probs (0 on padding) and every gradient equal to fp32 tolerance."""
    torch.testing.assert_close(got[0], expected[0], atol=1e-5, rtol=1e-5)
    assert (got[0][c_mask == 0] == 0).all()
    assert got[1].keys() == expected[1].keys()
    for name in expected[1]:
        torch.testing.assert_close(got[1][name], expected[1][name], atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("tied", [False, True])
def test_chunked_head_logprobs_equal_the_models_logits(tied):
    """The decoder + chunked output-layer path gives the model's own log-probs and gradients (fp32, to 1e-5)."""
    from comlrl.accel.head import head_logprobs
    from comlrl.engine.logprobs import _decoder_and_head

    model = tiny_model(seed=3)
    if tied:
        model.lm_head.weight = model.model.embed_tokens.weight
    assert _decoder_and_head(model) is not None
    p_ids, p_mask, c_ids, c_mask, adv = batch(extra_left=1, extra_right=2)
    tensors, weights = (p_ids, p_mask, c_ids, c_mask), torch.randn(c_ids.shape) * c_mask
    _assert_same_learning(
        _logp_and_grads(model, completion_logprobs, tensors, weights),
        _logp_and_grads(model, _logits_path, tensors, weights),
        c_mask,
    )
    # chunking changes nothing: 3 rows of logits at a time vs all at once
    h = torch.randn(10, 32, requires_grad=True)
    labels = torch.randint(0, 259, (10,))
    a = head_logprobs(
        h, model.lm_head.weight, bias=None, labels=labels, chunk=3, keep_bytes=0
    )  # recomputed in backward
    b = head_logprobs(h, model.lm_head.weight, bias=None, labels=labels, chunk=100)  # kept
    torch.testing.assert_close(a, b)
    first = torch.autograd.grad(b.sum(), h, retain_graph=True)[0]
    torch.testing.assert_close(torch.autograd.grad(a.sum(), h)[0], first)
    torch.testing.assert_close(torch.autograd.grad(b.sum(), h)[0], first)  # a 2nd backward recomputes the logits


def test_chunked_head_path_with_lora_and_bf16_autocast():
    """LoRA adapters get the same gradients through the chunked head; a LoRA-wrapped head uses the model's logits."""
    from peft import LoraConfig, get_peft_model

    from comlrl.engine.logprobs import _decoder_and_head

    p_ids, p_mask, c_ids, c_mask, _ = batch(extra_left=2)
    model = get_peft_model(
        tiny_model(seed=4), LoraConfig(r=4, lora_alpha=8, target_modules="all-linear", init_lora_weights=False)
    )
    grads = []
    for fn in (completion_logprobs, _logits_path):
        model.zero_grad()
        with torch.autocast("cpu", dtype=torch.bfloat16):
            logp = fn(model, p_ids, p_mask, c_ids, c_mask)
        (logp * c_mask).sum().backward()
        grads.append({n: p.grad.clone() for n, p in model.named_parameters() if p.requires_grad})
    assert grads[0].keys() == grads[1].keys() and grads[0]
    for name in grads[0]:
        scale = grads[1][name].abs().max().clamp(min=1e-3)
        assert (grads[0][name] - grads[1][name]).abs().max() / scale < 0.1, name
    headed = get_peft_model(tiny_model(seed=4), LoraConfig(r=4, target_modules=["lm_head", "q_proj"]))
    assert _decoder_and_head(headed) is None
    logp = completion_logprobs(headed, p_ids, p_mask, c_ids, c_mask)
    torch.testing.assert_close(logp, _logits_path(headed, p_ids, p_mask, c_ids, c_mask))


@pytest.mark.parametrize("keep_bytes", [0, 1 << 20])
def test_head_logprobs_gradcheck(keep_bytes):
    """Analytic gradients of the chunked output-layer log-probs (recomputed or kept logits) match finite differences."""
    from comlrl.accel.head import head_logprobs

    torch.manual_seed(0)
    h, w, b = (torch.randn(*shape, dtype=torch.float64, requires_grad=True) for shape in [(5, 4), (7, 4), (7,)])
    labels = torch.randint(0, 7, (5,))
    # nondet_tol: kept logits are consumed by the first backward; a repeated backward recomputes them (same values up
    # to rounding)
    assert torch.autograd.gradcheck(
        lambda h, w, b: head_logprobs(h, w, bias=b, labels=labels, chunk=2, keep_bytes=keep_bytes),
        (h, w, b),
        nondet_tol=1e-12,
    )


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
def test_rows_sharing_a_prompt_are_packed_with_the_same_logprobs_and_gradients(attn, monkeypatch):
    """One packed sequence per distinct prompt gives the log-probs and gradients of the separate rows (fp32, 1e-5)."""
    from comlrl.accel import packing
    from comlrl.engine import logprobs

    model = tiny_model(seed=6, hidden=64)
    model.set_attn_implementation(attn)
    p_ids, p_mask, c_ids, c_mask = grouped_batch()
    positions = (torch.cat([p_mask, c_mask], 1).cumsum(1) - 1).clamp(min=0)
    layout = packing.shared_prompt_layout(
        p_ids, p_mask, completion_ids=c_ids, completion_mask=c_mask, position_ids=positions, config=model.config
    )
    assert layout is not None and layout[0].shape == (3, 6 + 3 * 5)  # 3 prompts, at most 3 completions each
    tensors, weights = (p_ids, p_mask, c_ids, c_mask), torch.randn(c_ids.shape)
    packed = _logp_and_grads(model, completion_logprobs, tensors, weights)
    monkeypatch.setattr(logprobs, "shared_prompt_layout", lambda *args, **kwargs: None)
    _assert_same_learning(packed, _logp_and_grads(model, completion_logprobs, tensors, weights), c_mask)


def test_packed_rows_with_lora_under_bf16_autocast_match_separate_rows(monkeypatch):
    from peft import LoraConfig, get_peft_model

    from comlrl.engine import logprobs

    p_ids, p_mask, c_ids, c_mask = grouped_batch()
    model = get_peft_model(
        tiny_model(seed=7, hidden=64),
        LoraConfig(r=4, lora_alpha=8, target_modules="all-linear", init_lora_weights=False),
    )
    results = []
    for packed in (True, False):
        if not packed:
            monkeypatch.setattr(logprobs, "shared_prompt_layout", lambda *args, **kwargs: None)
        model.zero_grad()
        with torch.autocast("cpu", dtype=torch.bfloat16):
            logp = completion_logprobs(model, p_ids, p_mask, c_ids, c_mask)
        (logp * c_mask).sum().backward()
        results.append((logp.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.requires_grad}))
    torch.testing.assert_close(results[0][0], results[1][0], atol=0.05, rtol=0.02)
    for name, grad in results[1][1].items():
        scale = grad.abs().max().clamp(min=1e-3)
        assert (results[0][1][name] - grad).abs().max() / scale < 0.1, name


def test_packing_is_declined_when_it_would_not_pay():
    from comlrl.accel.packing import shared_prompt_layout

    config = tiny_model(hidden=64).config
    p_ids, p_mask, c_ids, c_mask = grouped_batch()
    positions = (torch.cat([p_mask, c_mask], 1).cumsum(1) - 1).clamp(min=0)
    assert (
        shared_prompt_layout(
            p_ids, p_mask, completion_ids=c_ids, completion_mask=c_mask, position_ids=positions, config=config
        )
        is not None
    )
    # every prompt distinct: nothing to share
    distinct = p_ids.clone()
    distinct[:, -1] = torch.arange(7) + 3
    assert (
        shared_prompt_layout(
            distinct, p_mask, completion_ids=c_ids, completion_mask=c_mask, position_ids=positions, config=config
        )
        is None
    )
    # 16 long completions of a short prompt: the packed attention rows would cost more than the prompt saved
    many = torch.randint(3, 259, (1, 4)).repeat(16, 1)
    long_ids = torch.randint(3, 259, (16, 200))
    ones = lambda t: torch.ones_like(t)  # noqa: E731
    pos = torch.arange(204).repeat(16, 1)
    assert (
        shared_prompt_layout(
            many, ones(many), completion_ids=long_ids, completion_mask=ones(long_ids), position_ids=pos, config=config
        )
        is None
    )
    # ... unless attention runs by blocks (each slot over [prompt; slot]): then it always pays
    assert (
        shared_prompt_layout(
            many,
            ones(many),
            completion_ids=long_ids,
            completion_mask=ones(long_ids),
            position_ids=pos,
            config=config,
            blocked=True,
        )
        is not None
    )
    # a sliding window shorter than the rows: the custom mask would drop it
    config.model_type, config.sliding_window = "mistral", 8
    assert (
        shared_prompt_layout(
            p_ids, p_mask, completion_ids=c_ids, completion_mask=c_mask, position_ids=positions, config=config
        )
        is None
    )


def test_truncated_importance_weights_on_a_mismatched_rollout():
    """rollout_logp: token t's policy term is scaled by min(p_old / p_rollout, cap), held constant (no gradient
    through the weight); equal log-probs leave the loss and its gradient as they were."""
    logp = torch.tensor([[-1.0, -2.0, -0.5]], requires_grad=True)
    w = torch.tensor([[0.25, 0.25, 0.5]])
    adv = torch.tensor([2.0])
    rollout = torch.tensor([[-1.2, -2.0, -2.0]])  # weights e^0.2 = 1.22, 1, e^1.5 = 4.48 -> capped at 2
    loss, m = policy_loss(logp, logp.detach(), adv, weights=w, rollout_logp=rollout, is_cap=2.0)
    loss.backward()
    iw = torch.tensor([[float(torch.exp(torch.tensor(0.2))), 1.0, 2.0]])
    torch.testing.assert_close(logp.grad, -adv * w * iw)
    torch.testing.assert_close(loss, -(adv * w * iw).sum())
    torch.testing.assert_close(m["rollout_is_weight"], (w * iw).sum())
    torch.testing.assert_close(m["rollout_is_capped"], torch.tensor(0.5))
    torch.testing.assert_close(m["rollout_kl"], (w * (rollout - logp.detach())).sum())
    plain_logp = logp.detach().clone().requires_grad_()
    plain, _ = policy_loss(plain_logp, logp.detach(), adv, weights=w)
    same_logp = logp.detach().clone().requires_grad_()
    same, ms = policy_loss(same_logp, logp.detach(), adv, weights=w, rollout_logp=logp.detach())
    plain.backward()
    same.backward()
    torch.testing.assert_close(same, plain)
    torch.testing.assert_close(same_logp.grad, plain_logp.grad)
    assert ms["rollout_is_capped"] == 0 and ms["rollout_is_weight"] == pytest.approx(1.0)


# --- the sampler's log-probs: what the importance weight compares with the rollout's --------------------------------


def test_sampler_logprobs_by_hand():
    """The log-prob of a token under the distribution the sampler draws from: repetition penalty, temperature,
    top-k, top-p, renormalized over the kept tokens; -inf for a token they drop."""
    from comlrl.accel.sampler import SamplerSettings, sampler_logprobs

    logits = torch.tensor([[2.0, 1.0, 0.0, -1.0]]).repeat(3, 1)  # softmax: 0.644, 0.237, 0.087, 0.032
    tokens = torch.tensor([0, 1, 2])
    # top_p 0.7: token 1 has 0.644 above it (< 0.7, kept), token 2 has 0.881 (dropped); kept {0, 1}
    got = sampler_logprobs(logits, tokens, SamplerSettings(top_p=0.7))
    z = math.log(math.exp(2) + math.exp(1))
    assert got[:2].tolist() == pytest.approx([2 - z, 1 - z], abs=1e-6) and got[2] == -math.inf
    # temperature 2, then top_k 3: logits / 2 = [1, 0.5, 0, -0.5], token 3 dropped
    got = sampler_logprobs(logits, torch.tensor([0, 2, 3]), SamplerSettings(temperature=2.0, top_k=3))
    z = math.log(math.exp(1) + math.exp(0.5) + 1)
    assert got[:2].tolist() == pytest.approx([1 - z, -z], abs=1e-6) and got[2] == -math.inf
    # repetition penalty 2 on tokens 0 and 3 first: [1, 1, 0, -2]; top_k 2 keeps both tied at the 2nd value
    seen = torch.tensor([[True, False, False, True]]).repeat(3, 1)
    got = sampler_logprobs(logits, tokens, SamplerSettings(top_k=2, repetition_penalty=2.0), seen)
    assert got[:2].tolist() == pytest.approx([math.log(0.5)] * 2, abs=1e-6) and got[2] == -math.inf
    # no filter: the full softmax at the temperature, as token_logprobs scores it
    plain = sampler_logprobs(logits, tokens, SamplerSettings(temperature=0.7))
    torch.testing.assert_close(plain, token_logprobs(logits[None] / 0.7, tokens[None])[0])


def test_completion_sampler_logprobs_penalize_what_the_row_holds_so_far():
    """Position t's penalized tokens are the row's real prompt tokens and its completion before t (the pad token of
    the left-padded prompt is not one); padding scores 0."""
    from comlrl.accel.sampler import SamplerSettings, completion_sampler_logprobs

    logits = torch.tensor([2.0, 1.0, 0.0, -1.0]).expand(1, 4, 4)  # the same logits at every position
    prompt_ids, prompt_mask = torch.tensor([[0, 3]]), torch.tensor([[0, 1]])
    completion_ids, completion_mask = torch.tensor([[1, 0, 2, 0]]), torch.tensor([[1, 1, 1, 0]])
    got = completion_sampler_logprobs(
        lambda rows, cols: logits[rows, cols],
        prompt_ids=prompt_ids,
        prompt_mask=prompt_mask,
        completion_ids=completion_ids,
        completion_mask=completion_mask,
        settings=SamplerSettings(repetition_penalty=2.0),
        vocab=4,
    )
    e = math.exp
    expected = [
        1 - math.log(e(2) + e(1) + e(0) + e(-2)),  # seen {3}: [2, 1, 0, -2]
        2 - math.log(e(2) + e(0.5) + e(0) + e(-2)),  # seen {3, 1}: [2, 0.5, 0, -2]
        0 - math.log(e(1) + e(0.5) + e(0) + e(-2)),  # seen {3, 1, 0}: [1, 0.5, 0, -2]
        0.0,  # padding
    ]
    assert got[0].tolist() == pytest.approx(expected, abs=1e-6)


def test_importance_weight_compares_the_sampler_logprobs():
    """With ``sampler_logp`` (the trainer's log-probs under the rollout's top-k / top-p / penalty) the weight is
    min(exp(sampler_logp - rollout_logp), cap); a token the trainer's own filter drops weighs 0 and is counted in
    rollout_is_filtered, not in rollout_kl."""
    logp = torch.tensor([[-1.0, -2.0, -0.5]], requires_grad=True)
    sampler = torch.tensor([[-0.5, -math.inf, -0.25]])
    rollout = torch.tensor([[-0.5, -1.0, -0.5]])  # weights 1, 0, e^0.25
    w, adv = torch.tensor([[0.25, 0.25, 0.5]]), torch.tensor([2.0])
    loss, m = policy_loss(logp, logp.detach(), adv, weights=w, rollout_logp=rollout, is_cap=3.0, sampler_logp=sampler)
    loss.backward()
    iw = torch.tensor([[1.0, 0.0, math.exp(0.25)]])
    torch.testing.assert_close(logp.grad, -adv * w * iw)
    assert m["rollout_is_weight"].item() == pytest.approx(0.25 + 0.5 * math.exp(0.25))
    assert m["rollout_is_filtered"].item() == pytest.approx(0.25)
    assert m["rollout_kl"].item() == pytest.approx(0.5 * (-0.5 + 0.25))


def test_token_entropy_by_hand():
    """Uniform over V tokens: log V; one token certain: 0; p = (1/4, 3/4): -(1/4 log 1/4 + 3/4 log 3/4); a -inf logit
    adds nothing."""
    from comlrl.algorithms.losses import token_entropy

    torch.testing.assert_close(token_entropy(torch.zeros(2, 3, 7)), torch.full((2, 3), math.log(7)))
    peaked = torch.full((5,), -1e4)
    peaked[2] = 0.0
    assert float(token_entropy(peaked)) == pytest.approx(0.0, abs=1e-6)
    two = torch.log(torch.tensor([0.25, 0.75]))
    assert float(token_entropy(two)) == pytest.approx(-(0.25 * math.log(0.25) + 0.75 * math.log(0.75)))
    assert float(token_entropy(torch.tensor([1.0, 1.0, -math.inf]))) == pytest.approx(math.log(2))
    assert float(token_entropy(torch.tensor([3.0, 3.0]) * 10)) == pytest.approx(math.log(2))  # shift-invariant


@pytest.mark.parametrize("keep_bytes", [0, 1 << 20])
def test_head_logprobs_entropy_from_each_chunks_logits(keep_bytes):
    """The chunked output layer's entropy equals the entropy of the full logits; asking for it changes neither the
    log-probs nor their gradients, and it carries no gradient."""
    from comlrl.accel.head import head_logprobs
    from comlrl.algorithms.losses import token_entropy

    torch.manual_seed(1)
    h, w = torch.randn(10, 32, requires_grad=True), torch.randn(259, 32)
    labels = torch.randint(0, 259, (10,))
    logp, ent = head_logprobs(h, w, bias=None, labels=labels, chunk=3, keep_bytes=keep_bytes, entropy=True)
    plain = head_logprobs(h, w, bias=None, labels=labels, chunk=3, keep_bytes=keep_bytes)
    torch.testing.assert_close(ent, token_entropy(h.detach() @ w.T))
    torch.testing.assert_close(logp, plain)
    assert not ent.requires_grad
    torch.testing.assert_close(torch.autograd.grad(logp.sum(), h)[0], torch.autograd.grad(plain.sum(), h)[0])


def test_completion_logprobs_entropy_on_the_chunked_and_the_logits_path():
    """completion_logprobs(entropy=True): each completion position's entropy of softmax(logits / T), 0 on padding,
    through the chunked head (a Llama layout) and through the model's own logits (a LoRA-wrapped head)."""
    from peft import LoraConfig, get_peft_model

    from comlrl.algorithms.losses import token_entropy
    from comlrl.engine.logprobs import _decoder_and_head

    p_ids, p_mask, c_ids, c_mask, _ = batch(extra_left=1, extra_right=2)
    headed = get_peft_model(tiny_model(seed=4), LoraConfig(r=4, target_modules=["lm_head", "q_proj"]))
    for model in (tiny_model(seed=4), headed):
        ids, mask = torch.cat([p_ids, c_ids], 1), torch.cat([p_mask, c_mask], 1)
        with torch.no_grad():
            logits = model(input_ids=ids, attention_mask=mask, position_ids=(mask.cumsum(1) - 1).clamp(min=0)).logits
        want = token_entropy(logits[:, p_ids.shape[1] - 1 : -1] / 0.7) * c_mask
        logp, ent = completion_logprobs(model, p_ids, p_mask, c_ids, c_mask, temperature=0.7, entropy=True)
        torch.testing.assert_close(ent, want, atol=1e-4, rtol=1e-4)
        torch.testing.assert_close(logp, completion_logprobs(model, p_ids, p_mask, c_ids, c_mask, temperature=0.7))
        assert (_decoder_and_head(model) is None) == (model is headed)
