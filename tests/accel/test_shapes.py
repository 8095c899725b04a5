"""Token and row counts reach the model in a few buckets (comlrl.accel.shapes), with unchanged values and gradients."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from tiny import tiny_model

from comlrl.accel import head, llama_decoder
from comlrl.accel.fastgen import fast_generate
from comlrl.accel.head import head_logprobs
from comlrl.accel.shapes import ROWS, TOKENS, pad_rows, pad_tokens, round_up
from comlrl.algorithms.losses import token_logprobs
from comlrl.engine.logprobs import completion_logprobs
from comlrl.engine.models import left_pad


def test_round_up_and_padding():
    assert [round_up(n, 8) for n in (0, 1, 7, 8, 9, 16)] == [0, 8, 8, 8, 16, 16]
    ids, mask = torch.tensor([[0, 5, 6], [7, 8, 9]]), torch.tensor([[0, 1, 1], [1, 1, 1]])
    left = pad_tokens(ids, mask, left=True, multiple=4, pad_id=3)
    assert left[0].tolist() == [[3, 0, 5, 6], [3, 7, 8, 9]] and left[1].tolist() == [[0, 0, 1, 1], [0, 1, 1, 1]]
    right = pad_tokens(ids, mask, left=False, multiple=4)
    assert right[0].tolist() == [[0, 5, 6, 0], [7, 8, 9, 0]] and right[1].tolist() == [[0, 1, 1, 0], [1, 1, 1, 0]]
    assert pad_tokens(ids, mask, left=True, multiple=3)[0] is ids  # already a multiple: untouched
    x = torch.randn(5, 2, requires_grad=True)
    padded = pad_rows(x, 4)
    assert padded.shape == (8, 2) and torch.equal(padded[:5], x) and not padded[5:].any()
    padded.sum().backward()
    assert torch.equal(x.grad, torch.ones(5, 2))


def _batch(prompt_width: int, completion_width: int) -> tuple[torch.Tensor, ...]:
    """Three rows, two sharing a prompt; one prompt shorter (left padding), one completion shorter (right padding)."""
    gen = torch.Generator().manual_seed(prompt_width * 100 + completion_width)
    prompts = [torch.randint(3, 259, (prompt_width,), generator=gen).tolist() for _ in range(2)]
    p_ids, p_mask = left_pad([prompts[0], prompts[0], prompts[1][1:]], 0)
    c_ids = torch.randint(3, 259, (3, completion_width), generator=gen)
    c_mask = torch.ones(3, completion_width, dtype=torch.long)
    c_mask[2, completion_width // 2 + 1 :] = 0
    return p_ids, p_mask, c_ids, c_mask


def test_loss_forward_runs_bucketed_lengths_with_the_models_log_probs():
    """Whatever the prompt and completion widths, the decoder sees token counts in multiples of 8; the log-probs and
    gradients are those of the model's own logits over the unpadded rows."""
    model = tiny_model(seed=7)
    seen, widths = [], []
    model.model.register_forward_pre_hook(lambda m, a, kw: seen.append(kw["input_ids"].shape[1]), with_kwargs=True)
    for p, c in [(4, 3), (5, 9), (9, 1), (8, 8)]:
        p_ids, p_mask, c_ids, c_mask = _batch(p, c)
        logp = completion_logprobs(model, p_ids, p_mask, c_ids, c_mask)
        widths += seen
        seen.clear()
        assert logp.shape == (3, c)
        params = list(model.parameters())
        got = torch.autograd.grad((logp * c_mask).sum(), params)
        ids, mask = torch.cat([p_ids, c_ids], 1), torch.cat([p_mask, c_mask], 1)
        logits = model(input_ids=ids, attention_mask=mask, position_ids=(mask.cumsum(1) - 1).clamp(min=0)).logits
        ref = token_logprobs(logits[:, p_ids.shape[1] - 1 : -1], c_ids) * c_mask
        torch.testing.assert_close(logp * c_mask, ref, atol=1e-5, rtol=1e-5)
        want = torch.autograd.grad(ref.sum(), params)
        for g, w in zip(got, want):
            torch.testing.assert_close(g, w, atol=1e-5, rtol=1e-4)
        seen.clear()
    assert len(widths) == 4 and widths and all(w % TOKENS == 0 for w in widths), widths


def test_head_logprobs_runs_bucketed_rows_with_the_same_values_and_gradients(monkeypatch):
    seen = []
    apply = head._HeadLogprobs.apply
    monkeypatch.setattr(head._HeadLogprobs, "apply", lambda h, *a: seen.append(h.shape[0]) or apply(h, *a))
    torch.manual_seed(0)
    h, w = torch.randn(37, 16, requires_grad=True), torch.randn(50, 16, requires_grad=True)
    labels = torch.randint(0, 50, (37,))
    out = head_logprobs(h, w, bias=None, labels=labels)
    assert seen == [round_up(37, ROWS)] and out.shape == (37,)
    ref = F.log_softmax(h @ w.T, dim=-1).gather(1, labels[:, None])[:, 0]
    torch.testing.assert_close(out, ref)
    scale = torch.randn(37)
    got, want = torch.autograd.grad((out * scale).sum(), (h, w)), torch.autograd.grad((ref * scale).sum(), (h, w))
    for g, r in zip(got, want):
        torch.testing.assert_close(g, r)


def test_fast_generate_prefills_a_bucketed_prompt_and_still_matches_generate(monkeypatch):
    model = tiny_model(seed=2)
    widths = []
    prefill = llama_decoder.LlamaDecoder.prefill
    monkeypatch.setattr(
        llama_decoder.LlamaDecoder,
        "prefill",
        lambda self, ids, mask: widths.append(ids.shape[1]) or prefill(self, ids, mask),
    )
    ids, mask = left_pad([[1, 5, 6, 7, 8], [1, 20, 21]], 0)
    out = fast_generate(
        model, ids, mask, max_new_tokens=6, eos_token_ids=[2], pad_token_id=0, do_sample=False, backend="llama"
    )
    ref = model.generate(
        input_ids=ids,
        attention_mask=mask,
        max_new_tokens=6,
        do_sample=False,
        temperature=None,
        top_p=None,
        top_k=None,
        pad_token_id=0,
        eos_token_id=[2],
    )[:, ids.shape[1] :]
    assert widths == [TOKENS]
    assert torch.equal(out, ref)


def test_critic_inputs_come_in_bucketed_widths_with_the_same_values():
    from tiny import tiny_tokenizer

    from comlrl.engine.critic import ValueModel, encode_texts

    tok = tiny_tokenizer()
    texts = ["a short state", "a somewhat longer state for the critic to read", "x"]
    ids, mask = encode_texts(tok, texts)
    seqs = [tok(t)["input_ids"] for t in texts]
    assert ids.shape[1] % TOKENS == 0 and ids.shape[1] > max(map(len, seqs))
    assert mask.sum(dim=1).tolist() == [len(s) for s in seqs]
    critic = ValueModel(tiny_model(seed=3)).eval()
    with torch.no_grad():
        bucketed = critic(ids, mask)
        plain = critic(*left_pad(seqs, tok.pad_token_id))
    torch.testing.assert_close(bucketed, plain, rtol=1e-5, atol=1e-5)
    assert ids[:, -1].ne(tok.pad_token_id).all()  # the value is read at a real last token
    assert encode_texts(tok, texts, max_length=3)[0].shape[1] == TOKENS
