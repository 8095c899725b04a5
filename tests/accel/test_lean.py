"""The lean training layers (comlrl.accel.lean): same values and gradients as the eager ops, fewer saved activations."""

import pytest
import torch
from tiny import tiny_model
from transformers import Qwen2Config, Qwen2ForCausalLM
from transformers.models.llama import modeling_llama

from comlrl.accel.lean import _SwiGLU, _SwiGLULinear, apply_rotary, lean_layers, rms_norm, rms_norm_values


def _forward_backward(model, ids, lean: bool, autocast: bool = False):
    model.zero_grad()
    ctx = lean_layers(model) if lean else torch.enable_grad()
    with ctx, torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        logits = model(input_ids=ids, use_cache=False).logits
    weights = torch.linspace(-1, 1, logits.shape[-1])
    (logits.float() * weights).sum().backward()
    return logits.detach().float(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("family", ["llama", "qwen2"])
def test_lean_layers_give_the_eager_values_and_gradients(family):
    """fp32: logits and every parameter's gradient equal the eager model's (to 1e-5)."""
    if family == "llama":
        model = tiny_model(seed=5)
    else:
        torch.manual_seed(5)
        model = Qwen2ForCausalLM(
            Qwen2Config(
                vocab_size=259,
                hidden_size=32,
                intermediate_size=64,
                num_hidden_layers=2,
                num_attention_heads=4,
                num_key_value_heads=2,
                max_position_embeddings=64,
            )
        )
    ids = torch.randint(3, 259, (3, 11))
    ref, ref_grads = _forward_backward(model, ids, lean=False)
    out, grads = _forward_backward(model, ids, lean=True)
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)
    assert grads.keys() == ref_grads.keys() and len(grads) == len(list(model.parameters()))
    for name in ref_grads:
        torch.testing.assert_close(grads[name], ref_grads[name], atol=1e-5, rtol=1e-4, msg=name)


def test_lean_layers_under_bf16_autocast_and_lora():
    """bf16 autocast (fp32 weights) and a LoRA'd MLP (the product goes through PEFT's down_proj) stay close to eager."""
    from peft import LoraConfig, get_peft_model

    ids = torch.randint(3, 259, (2, 9))
    model = tiny_model(seed=6)
    ref, ref_grads = _forward_backward(model, ids, lean=False, autocast=True)
    out, grads = _forward_backward(model, ids, lean=True, autocast=True)
    torch.testing.assert_close(out, ref, atol=2e-2, rtol=2e-2)
    for name in ref_grads:
        scale = ref_grads[name].abs().max().clamp(min=1e-3)
        assert (grads[name] - ref_grads[name]).abs().max() / scale < 0.05, name
    lora = get_peft_model(
        tiny_model(seed=6), LoraConfig(r=4, lora_alpha=8, target_modules="all-linear", init_lora_weights=False)
    )
    ref, ref_grads = _forward_backward(lora, ids, lean=False)
    out, grads = _forward_backward(lora, ids, lean=True)
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)
    assert ref_grads and all("lora_" in n for n in ref_grads)
    for name in ref_grads:
        torch.testing.assert_close(grads[name], ref_grads[name], atol=1e-5, rtol=1e-4, msg=name)


def test_lean_functions_gradcheck():
    """Analytic gradients of each Function match finite differences (float64)."""
    torch.manual_seed(0)
    x, w = (
        torch.randn(2, 3, 6, dtype=torch.float64, requires_grad=True),
        torch.randn(6, dtype=torch.float64, requires_grad=True),
    )
    assert torch.autograd.gradcheck(lambda a, b: rms_norm(a, b, 1e-6), (x, w))
    q = torch.randn(2, 4, 3, 8, dtype=torch.float64, requires_grad=True)
    k = torch.randn(2, 2, 3, 8, dtype=torch.float64, requires_grad=True)
    cos, sin = torch.randn(2, 3, 8, dtype=torch.float64), torch.randn(2, 3, 8, dtype=torch.float64)
    assert torch.autograd.gradcheck(lambda a, b: apply_rotary(a, b, cos, sin), (q, k))
    expected = modeling_llama.apply_rotary_pos_emb(q, k, cos, sin)
    for got, want in zip(apply_rotary(q, k, cos, sin), expected):
        torch.testing.assert_close(got, want)
    g, u = (torch.randn(2, 3, 5, dtype=torch.float64, requires_grad=True) for _ in range(2))
    wd, bd = (
        torch.randn(4, 5, dtype=torch.float64, requires_grad=True),
        torch.randn(4, dtype=torch.float64, requires_grad=True),
    )
    assert torch.autograd.gradcheck(_SwiGLU.apply, (g, u))
    assert torch.autograd.gradcheck(lambda *a: _SwiGLULinear.apply(*a, torch.float64), (g, u, wd, bd))
    torch.testing.assert_close(
        _SwiGLULinear.apply(g, u, wd, bd, torch.float64),
        torch.nn.functional.linear(torch.nn.functional.silu(g) * u, wd, bd),
    )


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rms_norm_values_and_function_match_hf_bitwise(dtype):
    """The decode path's RMSNorm (rms_norm_values) and the training Function give HF LlamaRMSNorm's exact values."""
    torch.manual_seed(0)
    norm = modeling_llama.LlamaRMSNorm(48, eps=1e-5).to(dtype)
    with torch.no_grad():
        norm.weight.copy_(torch.randn(48))
    x = (torch.randn(3, 5, 48) * 7).to(dtype)
    want = norm(x)
    assert torch.equal(rms_norm_values(x, norm.weight, norm.variance_epsilon), want)
    assert torch.equal(rms_norm(x, norm.weight, norm.variance_epsilon), want)
    assert not torch.equal(rms_norm_values(x, norm.weight, 1e-1), want)  # eps is honoured


def _saved_bytes(model, ids, lean: bool) -> int:
    total = 0

    def pack(t):
        nonlocal total
        total += t.numel() * t.element_size()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        with lean_layers(model) if lean else torch.enable_grad():
            model.model(input_ids=ids, use_cache=False)
    return total


def test_lean_layers_save_fewer_activations_and_are_scoped():
    """The decoder's saved tensors shrink; the classes are restored after the block; checkpointing and no-grad skip."""
    model = tiny_model(seed=7, layers=2, hidden=64)
    ids = torch.randint(3, 259, (2, 32))
    eager, lean = _saved_bytes(model, ids, False), _saved_bytes(model, ids, True)
    assert lean < 0.75 * eager, (lean, eager)
    original = modeling_llama.LlamaMLP.forward, modeling_llama.LlamaRMSNorm.forward, modeling_llama.apply_rotary_pos_emb
    with lean_layers(model):
        assert modeling_llama.LlamaMLP.forward is not original[0]
    assert (
        modeling_llama.LlamaMLP.forward,
        modeling_llama.LlamaRMSNorm.forward,
        modeling_llama.apply_rotary_pos_emb,
    ) == original
    with torch.no_grad(), lean_layers(model):
        assert modeling_llama.LlamaMLP.forward is original[0]
    model.gradient_checkpointing_enable()
    model.train()
    with lean_layers(model):
        assert modeling_llama.LlamaMLP.forward is original[0]
