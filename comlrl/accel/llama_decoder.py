"""comlrl's own decoder for Llama-layout models (``llama``, ``mistral``, ``qwen2``; plain or PEFT-LoRA): a weight
snapshot (:mod:`.decode_weights`), a preallocated KV cache written in place, and a prefill of the distinct prompts
only. In the model's dtype it computes what the model's forward computes op for op.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch
import torch.nn.functional as F
from torch import nn

from .decode_weights import Projections, Routing, Unsupported, WeightLoan, apply_projections, build_projections
from .lean import rms_norm_values

# Decoder-layer layouts LlamaDecoder reproduces exactly: pre-norm RMSNorm, q/k/v/o projections (optional bias),
# RoPE from the model's own rotary module, gated MLP. Qwen3 (q/k norms), Gemma (scaled embeddings), etc. are not.
LLAMA_LAYOUTS = ("llama", "mistral", "qwen2")


def prompt_positions(attention_mask: torch.Tensor) -> torch.Tensor:
    """Position ids (B, P) of a left-padded prompt, as ``generate`` builds them: cumsum - 1, pads at 1."""
    pos = attention_mask.long().cumsum(-1) - 1
    return pos.masked_fill(attention_mask == 0, 1)


@dataclass
class _LayerWeights:
    """One decoder layer's weights in compute dtype; ``qkv``/``gate_up`` outputs are concatenated in that order."""

    ln1: torch.Tensor  # (H,)
    ln1_eps: float
    qkv: Projections  # -> (..., (Hq + 2 Hkv) * D)
    o: Projections  # -> (..., H)
    ln2: torch.Tensor  # (H,)
    ln2_eps: float
    gate_up: Projections  # -> (..., 2 I)
    down: Projections  # -> (..., H)
    act: Callable[[torch.Tensor], torch.Tensor]


def _check_llama_layout(base: nn.Module, max_len: int) -> None:
    """Raise ``Unsupported`` unless ``base`` is a Llama-layout causal LM we reproduce exactly at this length."""
    config = getattr(base, "config", None)
    if config is None or getattr(config, "model_type", None) not in LLAMA_LAYOUTS:
        raise Unsupported(f"model_type {getattr(config, 'model_type', None)}")
    if window_exceeded(config, max_len):
        raise Unsupported("sliding-window attention longer than the window")
    inner = getattr(base, "model", None)
    if inner is None or type(getattr(inner, "embed_tokens", None)) is not nn.Embedding:
        raise Unsupported("embedding")
    for layer in inner.layers:
        attn = layer.self_attn
        extra = {n for n, _ in attn.named_children()} - {"q_proj", "k_proj", "v_proj", "o_proj"}
        if extra or not hasattr(layer.mlp, "gate_proj"):
            raise Unsupported(f"attention/mlp submodules {sorted(extra)}")
    if any(not _harmless_hooks(h) for h in base.modules()):
        raise Unsupported("forward hooks")
    if any(type(p).__name__ == "DTensor" for p in base.parameters()):
        raise Unsupported("sharded weights (FSDP) that are not gathered")


def window_exceeded(config: object, length: int) -> bool:
    """Whether a Llama-layout model's sliding-window attention would act on sequences of ``length`` tokens (the
    window is a no-op while the whole sequence fits in it). Mistral windows every layer, Qwen2 only the layers its
    ``layer_types`` mark as sliding."""
    window = getattr(config, "sliding_window", None)
    layer_types = getattr(config, "layer_types", None) or []
    windowed = getattr(config, "model_type", None) == "mistral" or any(k != "full_attention" for k in layer_types)
    return bool(windowed and window is not None and length > window)


def _harmless_hooks(module: nn.Module) -> bool:
    """Whether the module's forward hooks (if any) leave its outputs' values alone: the ``requires_grad`` switch
    transformers puts on the input embeddings for gradient checkpointing / PEFT, and FSDP2's gather/free hooks (the
    fast path reads the weights directly, so it runs only on gathered weights: see the DTensor check)."""
    hooks = [*module._forward_hooks.values(), *module._forward_pre_hooks.values()]
    return all(
        getattr(h, "__name__", "") == "make_inputs_require_grads"
        or type(getattr(h, "__self__", None)).__name__ == "FSDPState"
        for h in hooks
    )


class LlamaDecoder:
    """Llama-layout forward over a weight snapshot and a static KV cache; the whole batch advances in lockstep."""

    def __init__(
        self,
        base: nn.Module,
        *,
        batch: int,
        max_len: int,
        dtype: torch.dtype | None,
        adapter: str | None = None,
        routed: list[str] | None = None,
        loan: WeightLoan | None = None,
    ) -> None:
        """``loan``: the decode may hold the model's fp32 weights packed in place of its own tensors (see
        :class:`comlrl.accel.decode_weights.WeightLoan`); given back here if building fails, else by the caller."""
        _check_llama_layout(base, max_len)
        self.adapter, self.batch, self.loan = adapter, batch, loan
        config = base.config
        inner = base.model
        self.routing = Routing(routed, inner.embed_tokens.weight.device) if routed is not None else None
        self.dtype = dtype or inner.embed_tokens.weight.dtype
        self.n_heads = config.num_attention_heads
        self.n_kv = getattr(config, "num_key_value_heads", None) or self.n_heads
        self.head_dim = getattr(config, "head_dim", None) or config.hidden_size // self.n_heads
        self.scaling = inner.layers[0].self_attn.scaling
        self.rotary = inner.rotary_emb
        self.embed = inner.embed_tokens.weight  # (V, H): rows are gathered then cast, no full copy
        self.lm_head = build_projections(
            [base.lm_head], self.dtype, adapter=adapter, pack_rows=batch, routing=self.routing, output_layer=True
        )
        self.norm_w = inner.norm.weight.to(self.dtype)
        self.norm_eps = inner.norm.variance_epsilon
        try:
            self.layers = [self._layer_weights(layer) for layer in inner.layers]
        except BaseException:
            if loan is not None:
                loan.give_back()
            raise
        n_layers, device = len(self.layers), self.embed.device
        shape = (n_layers, batch, self.n_kv, max_len, self.head_dim)
        self.k_cache = torch.zeros(shape, dtype=self.dtype, device=device)  # (L, B, Hkv, T, D)
        self.v_cache = torch.zeros(shape, dtype=self.dtype, device=device)
        # Additive key mask (0 / -inf) shared by all layers: SDPA would otherwise convert a bool mask once per layer.
        self.key_bias = torch.zeros((batch, 1, 1, max_len), dtype=self.dtype, device=device)  # (B, 1, 1, T)
        self.next_pos: torch.Tensor | None = None  # (B, 1)
        self.prompt_len = 0

    def _layer_weights(self, layer: nn.Module) -> _LayerWeights:
        attn, mlp = layer.self_attn, layer.mlp
        ln1, ln2 = layer.input_layernorm, layer.post_attention_layernorm

        def project(mods: list[nn.Module]) -> Projections:
            return build_projections(
                mods, self.dtype, adapter=self.adapter, pack_rows=self.batch, routing=self.routing, loan=self.loan
            )

        return _LayerWeights(
            ln1=ln1.weight.to(self.dtype),
            ln1_eps=ln1.variance_epsilon,
            qkv=project([attn.q_proj, attn.k_proj, attn.v_proj]),
            o=project([attn.o_proj]),
            ln2=ln2.weight.to(self.dtype),
            ln2_eps=ln2.variance_epsilon,
            gate_up=project([mlp.gate_proj, mlp.up_proj]),
            down=project([mlp.down_proj]),
            act=mlp.act_fn,
        )

    def prefill(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """Run the prompts once per *distinct* row, fill every row's cache; logits (B, V) of the last position.

        Rollouts repeat each prompt G times, so prefilling only the distinct (ids, mask) rows cuts the prefill --
        a compute-bound pass over B * P tokens -- by G; the rows' K/V and logits are then gathered back to B.
        """
        self.prompt_len = input_ids.shape[1]
        self.next_pos = attention_mask.long().sum(-1, keepdim=True)  # (B, 1)
        self.key_bias[:, 0, 0, : self.prompt_len] = additive_mask(attention_mask.bool(), self.dtype)
        rows = torch.cat([input_ids, attention_mask.to(input_ids.dtype)], dim=1)  # (B, 2P)
        if self.routing is not None:  # rows of different adapters are distinct rows; slot first keeps them grouped
            rows = torch.cat([self.routing.slots[:, None].to(rows.dtype), rows], dim=1)  # (B, 1+2P)
        uniq, inverse = torch.unique(rows, dim=0, return_inverse=True)  # (U, [1+]2P), (B,)
        if self.routing is not None:
            self.routing.use(uniq[:, 0])
            uniq = uniq[:, 1:]
        ids, mask = uniq[:, : self.prompt_len], uniq[:, self.prompt_len :]  # (U, P) each
        real = mask.bool()
        plen = self.prompt_len
        causal = torch.ones((plen, plen), dtype=torch.bool, device=real.device).tril()  # (P, P)
        # Pad queries attend to themselves so their rows never become all-masked NaNs (their K/V are masked anyway,
        # but a NaN value would still poison real rows through 0 * NaN in the value matmul).
        eye = torch.eye(plen, dtype=torch.bool, device=real.device)
        bias = additive_mask((causal & real[:, None, None, :]) | eye, self.dtype)  # (U, 1, P, P)
        logits = self._forward(ids, prompt_positions(mask), bias, start=0, rows=inverse)  # (U, V)
        if self.routing is not None:
            self.routing.use(self.routing.slots)  # decoding runs all B rows
        return logits[inverse]  # (B, V)

    def step(self, tokens: torch.Tensor, t: int) -> torch.Tensor:
        start = self.prompt_len + t
        bias = self.key_bias[..., : start + 1]  # (B, 1, 1, start+1)
        return self._forward(tokens[:, None], self.next_pos + t, bias, start=start)

    def _forward(
        self, ids: torch.Tensor, pos: torch.Tensor, bias: torch.Tensor, start: int, rows: torch.Tensor | None = None
    ) -> torch.Tensor:
        """Run all layers on ids (N, S) at cache slots [start, start+S); return last-position logits (N, V) fp32.

        ``rows`` (B,): prefill of distinct rows only -- cache row b receives the K/V of input row ``rows[b]``.
        """
        x = F.embedding(ids, self.embed).to(self.dtype)  # (N, S, H)
        cos, sin = self.rotary(x, pos)  # (N, S, D) each, already in x.dtype with the rope attention scaling
        half = self.head_dim // 2
        # rotate_half(x) * sin == roll(x, D/2) * [-sin_lo, sin_hi]: one roll instead of slice/neg/cat (exact: only a
        # sign moves between factors).
        sin = torch.cat([-sin[..., :half], sin[..., half:]], dim=-1)
        cos, sin = cos[:, :, None, :], sin[:, :, None, :]  # (N, S, 1, D)
        for i, w in enumerate(self.layers):
            x = x + self._attention(i, w, rms_norm_values(x, w.ln1, w.ln1_eps), cos, sin, bias, start, rows)
            h = apply_projections(rms_norm_values(x, w.ln2, w.ln2_eps), w.gate_up)  # (N, S, 2I)
            gate, up = h.chunk(2, dim=-1)
            x = x + apply_projections(w.act(gate) * up, w.down)
        x = rms_norm_values(x[:, -1], self.norm_w, self.norm_eps)  # (N, H)
        return apply_projections(x, self.lm_head).float()  # (N, V)

    def _attention(
        self,
        i: int,
        w: _LayerWeights,
        h: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        bias: torch.Tensor,
        start: int,
        rows: torch.Tensor | None,
    ) -> torch.Tensor:
        """Self-attention of h (N, S, H) for layer i, writing its K/V into the cache; returns (N, S, H)."""
        n, seq, _ = h.shape
        nq, nkv, d = self.n_heads, self.n_kv, self.head_dim
        qkv = apply_projections(h, w.qkv).view(n, seq, nq + 2 * nkv, d)  # (N, S, Hq+2Hkv, D)
        qk = qkv[:, :, : nq + nkv]
        qk = qk * cos + qk.roll(d // 2, dims=-1) * sin  # RoPE on q and k heads at once, (N, S, Hq+Hkv, D)
        keys = qk[:, :, nq:].transpose(1, 2)  # (N, Hkv, S, D)
        values = qkv[:, :, nq + nkv :].transpose(1, 2)
        end = start + seq
        if rows is None:
            self.k_cache[i, :, :, start:end] = keys
            self.v_cache[i, :, :, start:end] = values
            keys, values = self.k_cache[i, :, :, :end], self.v_cache[i, :, :, :end]  # (B, Hkv, T, D)
        else:
            self.k_cache[i, :, :, start:end] = keys[rows]
            self.v_cache[i, :, :, start:end] = values[rows]
        if seq == 1:
            # Decode: the n_rep query heads sharing a KV head become n_rep "query positions" of that head (HF's
            # pack_gqa), so no K/V repeat is materialised.
            q = qk[:, 0, :nq].reshape(n, nkv, nq // nkv, d)  # (N, Hkv, n_rep, D)
            out = F.scaled_dot_product_attention(q, keys, values, attn_mask=bias, scale=self.scaling)
            out = out.reshape(n, 1, nq * d)
        else:
            # Prefill: repeat K/V like HF's sdpa path does for masked GQA, so the kernel and its rounding match.
            rep = nq // nkv
            keys, values = keys.repeat_interleave(rep, dim=1), values.repeat_interleave(rep, dim=1)  # (N, Hq, S, D)
            q = qk[:, :, :nq].transpose(1, 2)  # (N, Hq, S, D)
            out = F.scaled_dot_product_attention(q, keys, values, attn_mask=bias, scale=self.scaling)
            out = out.transpose(1, 2).reshape(n, seq, nq * d)
        return apply_projections(out, w.o)


def additive_mask(allowed: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Bool mask -> additive attention bias in ``dtype``: 0 where attending is allowed, -inf elsewhere."""
    return torch.zeros(allowed.shape, dtype=dtype, device=allowed.device).masked_fill_(~allowed, float("-inf"))
