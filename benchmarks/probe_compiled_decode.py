"""Probe (not a library path): how fast a ``torch.compile``d decode step of the embedded SmolLM2-135M could be on CPU.

The step is a plain-PyTorch Llama decode over a static KV cache at batch 8 in bf16. The base weights are frozen
parameters, so inductor's ``freezing`` prepacks them for oneDNN. The cache is read-only inside the compiled graph:
the new token's keys and values are attended to separately, and the two softmax parts are merged (flash-decoding
style). The step returns them, and one eager ``index_copy_`` per step writes all layers into the cache. Why: inductor
turned in-graph cache writes (``index_copy_`` or index assignment) into ~30-40 ms of copies per step
(benchmarks/README). Printed: compile time, steady-state ms per step of the compiled and eager step, and the largest
logit difference of each against the model's own forward, and our eager
fastgen step (oneDNN-packed weights) at the same batch for comparison. ``--lora N``: N adapters on the base,
each block of rows routed through its own (fastgen's stacked factors as graph inputs), checked against PEFT's
``adapter_names`` forward and timed against fastgen's routed decode.

    python benchmarks/probe_compiled_decode.py [--steps 48] [--threads 2] [--lora 2]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.nn.functional as F
from torch import nn

from comlrl.accel import decode_weights
from comlrl.accel.fastgen import fast_generate
from comlrl.accel.lean import rms_norm_values
from comlrl.engine.models import load_model
from comlrl.engine.team import adapter_parameters, build_lora_team


class DecodeStep(nn.Module):
    """One decode step: tokens (B,) -> (logits (B, V) fp32, the token's keys and values (L, B, Hkv, 1, D)); the
    cache is only read (``bias`` masks its unwritten slots)."""

    def __init__(self, base: nn.Module, batch: int) -> None:
        super().__init__()
        config, inner = base.config, base.model
        self.n_q, self.n_kv = config.num_attention_heads, config.num_key_value_heads
        self.d = config.hidden_size // self.n_q
        self.batch, self.eps = batch, config.rms_norm_eps
        frozen = lambda t: nn.Parameter(t.detach().clone(), requires_grad=False)  # noqa: E731
        self.embed = frozen(inner.embed_tokens.weight)
        layers = inner.layers
        self.qkv = nn.ParameterList(
            frozen(
                torch.cat([layer.self_attn.q_proj.weight, layer.self_attn.k_proj.weight, layer.self_attn.v_proj.weight])
            )
            for layer in layers
        )
        self.o = nn.ParameterList(frozen(layer.self_attn.o_proj.weight) for layer in layers)
        self.gate_up = nn.ParameterList(
            frozen(torch.cat([layer.mlp.gate_proj.weight, layer.mlp.up_proj.weight])) for layer in layers
        )
        self.down = nn.ParameterList(frozen(layer.mlp.down_proj.weight) for layer in layers)
        self.ln1 = nn.ParameterList(frozen(layer.input_layernorm.weight) for layer in layers)
        self.ln2 = nn.ParameterList(frozen(layer.post_attention_layernorm.weight) for layer in layers)
        self.norm, self.head = frozen(inner.norm.weight), frozen(base.lm_head.weight)

    @staticmethod
    def _linear(h: torch.Tensor, weight: torch.Tensor, lora: tuple[torch.Tensor, ...]) -> torch.Tensor:
        """F.linear plus, with ``lora`` = (A (n, in, R), B (n, R, out)) fp32, each block of rows' own adapter delta
        (rows in n equal blocks, one per adapter), added in fp32 and rounded once, as fastgen's routed decode does."""
        y = F.linear(h, weight)
        if not lora:
            return y
        a, b = lora
        xs = h.reshape(a.shape[0], -1, h.shape[-1]).float()  # (n, rows*S, in)
        return (y.float() + torch.bmm(torch.bmm(xs, a), b).view(y.shape)).to(y.dtype)

    def forward(self, tokens, cos, sin, bias, k_cache, v_cache, *lora):
        """``lora``: empty, or per layer the (A, B) pairs of qkv, o, gate_up, down (8 tensors per layer)."""
        b, nq, nkv, d = self.batch, self.n_q, self.n_kv, self.d
        part = lambda i, j: lora[8 * i + 2 * j : 8 * i + 2 * j + 2] if lora else ()  # noqa: E731
        x = F.embedding(tokens[:, None], self.embed)  # (B, 1, H)
        new_k, new_v = [], []
        for i in range(len(self.qkv)):
            qkv = self._linear(rms_norm_values(x, self.ln1[i], self.eps), self.qkv[i], part(i, 0)).view(
                b, 1, nq + 2 * nkv, d
            )
            qk = qkv[:, :, : nq + nkv]
            qk = qk * cos + qk.roll(d // 2, dims=-1) * sin
            q = qk[:, 0, :nq].reshape(b, nkv, nq // nkv, d).float()  # (B, Hkv, rep, D)
            k, v = qk[:, 0, nq:, None], qkv[:, 0, nq + nkv :, None]  # (B, Hkv, 1, D)
            new_k.append(k)
            new_v.append(v)
            scale = d**-0.5
            s_cache = (q @ k_cache[i].float().transpose(-1, -2)) * scale + bias  # (B, Hkv, rep, T)
            s_new = (q * k.float()).sum(-1, keepdim=True) * scale  # (B, Hkv, rep, 1)
            m = torch.maximum(s_cache.amax(-1, keepdim=True), s_new)
            p_cache, p_new = (s_cache - m).exp(), (s_new - m).exp()
            att = (p_cache @ v_cache[i].float() + p_new * v.float()) / (p_cache.sum(-1, keepdim=True) + p_new)
            x = x + self._linear(att.to(x.dtype).reshape(b, 1, nq * d), self.o[i], part(i, 1))
            gate, up = self._linear(rms_norm_values(x, self.ln2[i], self.eps), self.gate_up[i], part(i, 2)).chunk(
                2, dim=-1
            )
            x = x + self._linear(F.silu(gate) * up, self.down[i], part(i, 3))
        return (
            F.linear(rms_norm_values(x[:, -1], self.norm, self.eps), self.head).float(),
            torch.stack(new_k),
            torch.stack(new_v),
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=48)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--lora", type=int, default=0, help="LoRA adapters (r=16, all-linear), rows routed in blocks")
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
    model, extra, lora = base, {}, ()
    if ns.lora:  # a LoRA team on the frozen base: each block of rows through its own adapter (PEFT adapter_names)
        from peft import LoraConfig

        config = LoraConfig(r=16, lora_alpha=32, lora_dropout=0.0, target_modules="all-linear", init_lora_weights=False)
        team = build_lora_team([base] * ns.lora, [0] * ns.lora, config)  # the trainer's builder: one shared base
        model = team[0][0].eval()
        for _, name in team:
            adapter_parameters(model, name)  # adapters in fp32, as the trainer keeps them
        extra["adapter_names"] = [name for _, name in team for _ in range(batch // ns.lora)]
        routing = decode_weights.Routing(extra["adapter_names"], ids.device)
        for layer in base.model.layers:  # fastgen's own stacked factors of each (fused) projection
            attn, mlp = layer.self_attn, layer.mlp
            for mods in (
                [attn.q_proj, attn.k_proj, attn.v_proj],
                [attn.o_proj],
                [mlp.gate_proj, mlp.up_proj],
                [mlp.down_proj],
            ):
                stacked = decode_weights.stacked_lora(mods, routing)
                lora += (stacked.a_blocks, stacked.b_blocks)
    with torch.no_grad():
        out = model(input_ids=ids[:, :prompt], use_cache=True, **extra)
        want = model(input_ids=ids, use_cache=False, **extra).logits[:, -1].float()  # (B, V)
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
        logits, k, v = fn(tokens, cos, sin, key_bias(t), k_cache, v_cache, *lora)
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
            print(
                f"{name} vs HF forward: max |logit diff| {(logits - want).abs().max():.3g} (logit scale "
                f"{want.abs().max():.3g}), greedy tokens equal {bool((logits.argmax(-1) == want.argmax(-1)).all())}"
            )
        base.requires_grad_(False)  # a frozen base: fastgen keeps its packed copy between calls, as for a LoRA team
        mask = torch.ones_like(ids)

        def fast(n: int) -> torch.Tensor:
            return fast_generate(
                model, ids, mask, max_new_tokens=n, eos_token_ids=[], pad_token_id=0, dtype=torch.bfloat16, **extra
            )

        fast(2)
        for _ in range(3):
            start = time.perf_counter()
            fast(ns.steps + 1)
            middle = time.perf_counter()
            fast(1)  # prefill and setup only
            per_step = ((middle - start) - (time.perf_counter() - middle)) / ns.steps * 1000
            print(
                f"ms per step: compiled {timed(compiled):.2f}, eager {timed(step):.2f}, "
                f"fastgen (eager, packed weights) {per_step:.2f}"
            )


if __name__ == "__main__":
    main()
