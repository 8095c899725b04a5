"""Probe (not a library path): how fast a ``torch.compile``d decode step of the embedded SmolLM2-135M could be on CPU.

The step is a plain-PyTorch Llama decode over a static KV cache at batch 8 in bf16. The base weights are frozen
parameters, so inductor's ``freezing`` prepacks them for oneDNN. The cache is read-only inside the compiled graph:
the new token's keys and values are attended to separately, and the two softmax parts are merged (flash-decoding
style). The step returns them, and one eager ``index_copy_`` per step writes all layers into the cache. Why: inductor
turned in-graph cache writes (``index_copy_`` or index assignment) into ~30-40 ms of copies per step
(benchmarks/README). Printed: compile time, steady-state ms per step of the compiled and eager step, and the largest
logit difference of each against the model's own forward, and our eager
fastgen step (oneDNN-packed weights) at the same batch for comparison.

    python benchmarks/probe_compiled_decode.py [--steps 48] [--threads 2]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.nn.functional as F
from torch import nn

from comlrl.fastgen import fast_generate
from comlrl.models import load_model


class DecodeStep(nn.Module):
    """One decode step: tokens (B,) at cache slot ``pos`` -> (logits (B, V) fp32, new keys, new values (L, B, Hkv, 1, D))."""

    def __init__(self, base: nn.Module, batch: int) -> None:
        super().__init__()
        config, inner = base.config, base.model
        self.n_q, self.n_kv = config.num_attention_heads, config.num_key_value_heads
        self.d = config.hidden_size // self.n_q
        self.batch, self.eps = batch, config.rms_norm_eps
        frozen = lambda t: nn.Parameter(t.detach().clone(), requires_grad=False)  # noqa: E731
        self.embed = frozen(inner.embed_tokens.weight)
        layers = inner.layers
        self.qkv = nn.ParameterList(frozen(torch.cat([l.self_attn.q_proj.weight, l.self_attn.k_proj.weight,
                                                      l.self_attn.v_proj.weight])) for l in layers)
        self.o = nn.ParameterList(frozen(l.self_attn.o_proj.weight) for l in layers)
        self.gate_up = nn.ParameterList(frozen(torch.cat([l.mlp.gate_proj.weight, l.mlp.up_proj.weight])) for l in layers)
        self.down = nn.ParameterList(frozen(l.mlp.down_proj.weight) for l in layers)
        self.ln1 = nn.ParameterList(frozen(l.input_layernorm.weight) for l in layers)
        self.ln2 = nn.ParameterList(frozen(l.post_attention_layernorm.weight) for l in layers)
        self.norm, self.head = frozen(inner.norm.weight), frozen(base.lm_head.weight)

    def _rms(self, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        h = x.float()
        return w * (h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)).to(x.dtype)

    def forward(self, tokens, cos, sin, bias, k_cache, v_cache):
        b, nq, nkv, d = self.batch, self.n_q, self.n_kv, self.d
        x = F.embedding(tokens[:, None], self.embed)  # (B, 1, H)
        new_k, new_v = [], []
        for i in range(len(self.qkv)):
            qkv = F.linear(self._rms(x, self.ln1[i]), self.qkv[i]).view(b, 1, nq + 2 * nkv, d)
            qk = qkv[:, :, : nq + nkv]
            qk = qk * cos + qk.roll(d // 2, dims=-1) * sin
            q = qk[:, 0, :nq].reshape(b, nkv, nq // nkv, d).float()  # (B, Hkv, rep, D)
            k, v = qk[:, 0, nq:, None], qkv[:, 0, nq + nkv :, None]  # (B, Hkv, 1, D)
            new_k.append(k)
            new_v.append(v)
            scale = d ** -0.5
            s_cache = (q @ k_cache[i].float().transpose(-1, -2)) * scale + bias  # (B, Hkv, rep, T)
            s_new = (q * k.float()).sum(-1, keepdim=True) * scale  # (B, Hkv, rep, 1)
            m = torch.maximum(s_cache.amax(-1, keepdim=True), s_new)
            p_cache, p_new = (s_cache - m).exp(), (s_new - m).exp()
            att = (p_cache @ v_cache[i].float() + p_new * v.float()) / (p_cache.sum(-1, keepdim=True) + p_new)
            x = x + F.linear(att.to(x.dtype).reshape(b, 1, nq * d), self.o[i])
            gate, up = F.linear(self._rms(x, self.ln2[i]), self.gate_up[i]).chunk(2, dim=-1)
            x = x + F.linear(F.silu(gate) * up, self.down[i])
        return F.linear(self._rms(x[:, -1], self.norm), self.head).float(), torch.stack(new_k), torch.stack(new_v)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=48)
    parser.add_argument("--threads", type=int, default=2)
    ns = parser.parse_args()
    torch.set_num_threads(ns.threads)
    import torch._inductor.config as inductor_config

    inductor_config.freezing = True
    base = load_model("embedded").to(torch.bfloat16).eval()
    batch, length = 8, 128
    step = DecodeStep(base, batch).eval()
    # A real prompt prefilled by the model itself: its K/V fill the cache, and HF's logits for the next token
    # are what the step must reproduce.
    torch.manual_seed(0)
    ids = torch.randint(0, base.config.vocab_size, (batch, 40))
    prompt = ids.shape[1] - 1
    with torch.no_grad():
        out = base(input_ids=ids[:, :prompt], use_cache=True)
        want = base(input_ids=ids, use_cache=False).logits[:, -1].float()  # (B, V)
        cos, sin = base.model.rotary_emb(torch.zeros(1, dtype=torch.bfloat16), torch.full((batch, 1), prompt))
    cache = getattr(out, "cache", None) or out.past_key_values
    shape = (len(step.qkv), batch, step.n_kv, length, step.d)
    k_cache, v_cache = torch.zeros(shape, dtype=torch.bfloat16), torch.zeros(shape, dtype=torch.bfloat16)
    for i, layer in enumerate(cache.layers):
        k_cache[i, :, :, :prompt], v_cache[i, :, :, :prompt] = layer.keys, layer.values
    half = step.d // 2
    sin = torch.cat([-sin[..., :half], sin[..., half:]], dim=-1)  # rotate_half folded into roll (as fastgen does)
    cos, sin = cos[:, :, None, :], sin[:, :, None, :]  # (B, 1, 1, D)
    tokens = ids[:, -1]

    def key_bias(t: int) -> torch.Tensor:
        bias = torch.full((batch, 1, 1, length), float("-inf"))
        bias[..., : prompt + t] = 0.0  # slots written so far; the new token is attended separately
        return bias

    def run(fn, t: int):
        logits, k, v = fn(tokens, cos, sin, key_bias(t), k_cache, v_cache)
        if t:  # t = 0 is the real next token: keep the prompt's cache intact for the checks
            k_cache.index_copy_(3, torch.tensor([prompt + t]), k)  # one eager write per step, all layers at once
            v_cache.index_copy_(3, torch.tensor([prompt + t]), v)
        return logits

    def timed(fn) -> float:
        times = []
        for t in range(1, ns.steps + 1):
            start = time.perf_counter()
            run(fn, t % (length - prompt - 1) + 1)
            times.append(time.perf_counter() - start)
        return statistics.median(times) * 1000

    with torch.no_grad():
        eager = run(step, 0)
        compiled = torch.compile(step, dynamic=False, fullgraph=True)
        start = time.perf_counter()
        got = run(compiled, 0)
        print(f"compile: {time.perf_counter() - start:.1f} s")
        for name, logits in (("eager step", eager), ("compiled step", got)):
            print(f"{name} vs HF forward: max |logit diff| {(logits - want).abs().max():.3g} (logit scale "
                  f"{want.abs().max():.3g}), greedy tokens equal {bool((logits.argmax(-1) == want.argmax(-1)).all())}")
        base.requires_grad_(False)  # a frozen base: fastgen keeps its packed copy between calls, as for a LoRA team
        mask = torch.ones_like(ids)
        fast = lambda n: fast_generate(base, ids, mask, max_new_tokens=n, eos_token_ids=[], pad_token_id=0)  # noqa: E731
        fast(2)
        for _ in range(3):
            start = time.perf_counter()
            fast(ns.steps + 1)
            middle = time.perf_counter()
            fast(1)  # prefill and setup only
            per_step = ((middle - start) - (time.perf_counter() - middle)) / ns.steps * 1000
            print(f"ms per step: compiled {timed(compiled):.2f}, eager {timed(step):.2f}, "
                  f"fastgen (eager, packed weights) {per_step:.2f}")


if __name__ == "__main__":
    main()
