"""The weights the Llama decode path (:mod:`.llama_decoder`) multiplies by: each linear projection as the decode
applies it, PEFT LoRA deltas folded in or routed per row, in the compute dtype; q/k/v and gate/up fused and prepacked
for oneDNN where a copy is made anyway, and the copies of frozen weights cached between calls.
"""

from __future__ import annotations

import dataclasses
import functools
import weakref
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from .pages import discard_pages


class Unsupported(Exception):
    """The Llama fast path cannot reproduce this model exactly (the generic path or ``generate`` must be used)."""


BASE_ADAPTER = "__base__"  # PEFT's adapter name for "no adapter" in ``adapter_names``


def _linear_weight(module: nn.Module, adapter: str | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(weight, bias) this projection actually applies: plain ``nn.Linear``, or a PEFT LoRA layer with its deltas added.

    PEFT semantics mirrored: ``adapter`` None -> adapters disabled or merged: the base layer alone, else base + every
    active adapter's ``get_delta_weight`` (dropout is the identity in eval mode); ``adapter`` given (one name for the
    whole batch, as ``adapter_names`` routes it) -> base + that adapter's delta, or the base for ``"__base__"``.
    DoRA, LoRA bias and other PEFT layer types raise ``Unsupported``.
    """
    if type(module) is nn.Linear:
        return module.weight, module.bias
    base = getattr(module, "base_layer", None)
    if type(base) is not nn.Linear or not hasattr(module, "lora_A") or not hasattr(module, "get_delta_weight"):
        raise Unsupported(f"projection {type(module).__name__}")
    disabled, merged = bool(getattr(module, "disable_adapters", False)), bool(getattr(module, "merged", False))
    if adapter is not None:
        if merged:
            raise Unsupported("adapter_names with merged adapters")  # PEFT refuses this too
        names = [] if adapter == BASE_ADAPTER else [adapter]
    elif disabled and merged:
        raise Unsupported("disabled but merged adapters")
    else:
        names = [] if disabled or merged else list(module.active_adapters)
    weight = base.weight
    for name in names:
        if name not in module.lora_A:
            continue
        if getattr(module, "use_dora", {}).get(name) or getattr(module, "lora_bias", {}).get(name):
            raise Unsupported("DoRA / LoRA bias")
        weight = weight + module.get_delta_weight(name).to(weight.dtype)
    return weight, base.bias


class Routing:
    """Which rows of the current forward go through which LoRA adapter (shared by every projection of a decoder).

    ``slots`` (B,): each batch row's adapter index into ``names`` (-1: the base alone). ``use`` sets the rows of the
    forward being run (the B rows when decoding, the distinct rows during prefill). A projection stacks every
    adapter's factors, A (sum R, in) and B (sum R, out), and keeps each row's own columns with a 0/1 mask, so all
    adapters cost two small matmuls per projection whatever the batch's mix.
    """

    def __init__(self, adapter_names: list[str], device: torch.device) -> None:
        self.names = sorted({n for n in adapter_names if n != BASE_ADAPTER})
        index = {n: j for j, n in enumerate(self.names)}
        self.slots = torch.tensor([index.get(n, -1) for n in adapter_names], dtype=torch.long, device=device)  # (B,)
        self.use(self.slots)

    def use(self, slots: torch.Tensor) -> None:
        """Route the next forwards' rows by ``slots`` (one adapter index per input row)."""
        self.rows = slots
        self._masks: dict[tuple, torch.Tensor] = {}
        # Rows in equal contiguous blocks, one per adapter in order (a LoRA team's rollout): rows per block, else None.
        n, k = len(self.names), len(slots) // max(len(self.names), 1)
        blocks = torch.arange(n, device=slots.device).repeat_interleave(k)
        self.block_rows = k if n and k * n == len(slots) and torch.equal(slots, blocks) else None

    def mask(self, ranks: tuple[int, ...]) -> torch.Tensor:
        """(N, sum ranks) fp32 0/1: row n keeps the columns of its own adapter (ranks[j] columns for adapter j)."""
        if ranks not in self._masks:
            device = self.rows.device
            cols = torch.repeat_interleave(torch.arange(len(ranks), device=device), torch.tensor(ranks, device=device))
            self._masks[ranks] = (self.rows[:, None] == cols[None, :]).float()
        return self._masks[ranks]


@dataclass
class StackedLoRA:
    """Every adapter's factors of one (possibly fused) projection, stacked: rows routed to adapter j get
    x A_j^T B_j (the scaling folded into B), as PEFT's unmerged mixed-batch forward adds lora_B(lora_A(x)) * scaling.

    The factors stay fp32 whatever the decode dtype: at these shapes (a few rows x rank 16) fp32 matmuls are ~5x
    faster than bf16 ones on CPU (measured 5-7 us vs 24-33 us), and the delta is added onto the base output.
    """

    a: torch.Tensor  # (in, sum R) fp32 (A transposed: x @ a beats F.linear(x, A) ~2x at these shapes)
    b: torch.Tensor  # (sum R, out) fp32
    ranks: tuple[int, ...]  # R_j per adapter slot (0: that adapter does not touch this projection)
    routing: Routing

    def __post_init__(self) -> None:
        # Per-adapter views (n, in, R) / (n, R, out) for rows in adapter blocks: two bmm, no mask, half the FLOPs
        # (measured 52 vs 63 us per projection at 8 rows; the LoRA deltas were ~24% of a routed decode step).
        r, n = self.ranks[0], len(self.ranks)
        same = r > 0 and all(rank == r for rank in self.ranks)
        self.a_blocks = self.a.view(self.a.shape[0], n, r).permute(1, 0, 2).contiguous() if same else None
        self.b_blocks = self.b.view(n, r, self.b.shape[1]) if same else None

    def add_to(self, y: torch.Tensor, x: torch.Tensor) -> None:
        """y (N, S, out) += each row's own low-rank delta of x (N, S, in), in place."""
        k = self.routing.block_rows
        if k is not None and self.a_blocks is not None and y.is_contiguous():
            n, seq = len(self.ranks), x.shape[1]
            xs = x.reshape(n, k * seq, x.shape[-1]).float()  # (n adapters, rows*S, in)
            y.view(n, k * seq, -1).add_(torch.bmm(torch.bmm(xs, self.a_blocks), self.b_blocks))
            return
        xa = torch.matmul(x.float(), self.a) * self.routing.mask(self.ranks)[:, None, :]  # (N, S, sum R)
        y.add_(torch.matmul(xa, self.b))


@dataclass
class Projection:
    """One projection y = x W^T + b in compute dtype; W may be prepacked into oneDNN's blocked layout; ``lora`` adds
    per-row adapter deltas on top."""

    weight: torch.Tensor | None  # (out, in); None when only the packed copy is kept
    bias: torch.Tensor | None  # (out,)
    packed: torch.Tensor | None = None  # opaque oneDNN weight, same values as ``weight``
    lora: StackedLoRA | None = None
    weight_first: bool = False  # compute (W x^T)^T: the weight as gemm's first operand

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if self.packed is not None:
            # The oneDNN kernel reads x by its dense layout, ignoring strides: a non-contiguous x gives wrong results.
            y = torch.ops.mkldnn._linear_pointwise(x.contiguous(), self.packed, self.bias, "none", [], "")
        elif self.weight_first:
            y = torch.mm(self.weight, x.reshape(-1, x.shape[-1]).T).T.contiguous().view(*x.shape[:-1], -1)
            if self.bias is not None:
                y = y + self.bias
        else:
            y = F.linear(x, self.weight, self.bias)
        if self.lora is not None:
            self.lora.add_to(y, x)
        return y


def can_prepack(dtype: torch.dtype, device: torch.device) -> bool:
    """Whether weights in ``dtype`` can be fused and prepacked for oneDNN (x86 CPU builds with mkldnn).

    Why: at decode shapes (a few rows) oneDNN's kernels on a blocked weight layout stream weights much faster than
    ``F.linear``. bf16: bitwise equal to ``F.linear`` and ~15-30% faster per decode step. fp32: MKL's sgemm at 4
    rows streamed ~11 GB/s against oneDNN's ~39 GB/s on the (V, H) output layer; a 64-token rollout of SmolLM2-135M
    at batch 4 went 4.23 -> 3.41 s (median of 5 interleaved, the per-call fused copy included). fp32 results differ
    from ``F.linear`` in summation order only (~1e-7 relative).
    """
    return (
        dtype in (torch.bfloat16, torch.float32)
        and device.type == "cpu"
        and torch.backends.mkldnn.is_available()
        and hasattr(torch.ops.mkldnn, "_reorder_linear_weight")
        and (dtype != torch.bfloat16 or _mkldnn_bf16_supported())
    )


@functools.cache
def _mkldnn_bf16_supported() -> bool:
    """Whether this CPU has oneDNN's bf16 kernels (AVX-512 BF16 / AMX / AVX-NE-CONVERT); an AVX2-only CPU does
    not, and the packed bf16 path raises there."""
    check = getattr(torch.ops.mkldnn, "_is_mkldnn_bf16_supported", None)
    return bool(check is not None and check())


def build_projections(
    mods: list[nn.Module],
    dtype: torch.dtype,
    *,
    adapter: str | None,
    pack_rows: int,
    routing: Routing | None = None,
    output_layer: bool = False,
    loan: WeightLoan | None = None,
) -> list[Projection]:
    """Projections that read the same input, in ``dtype``: fused into one when a copy is made anyway, prepacked for
    oneDNN when possible (``pack_rows``: the batch size to tune the packing for). ``routing``: add each row's own
    LoRA adapter on top of the base weights (``adapter`` is then ``BASE_ADAPTER``). ``loan``: fp32 weights the
    model's own parameters hold are packed on it (:class:`WeightLoan`) instead of read in place or copied."""
    linears = _base_projections(mods, dtype, adapter=adapter, pack_rows=pack_rows, output_layer=output_layer, loan=loan)
    if routing is not None:
        groups = [[m] for m in mods] if len(linears) == len(mods) else [mods]
        for linear, group in zip(linears, groups):
            linear.lora = stacked_lora(group, routing)
    return linears


@torch.no_grad()
def stacked_lora(mods: list[nn.Module], routing: Routing) -> StackedLoRA | None:
    """Every routed adapter's factors over projections fused on their output dim, fp32: adapter j's A rows
    stacked, its B block-diagonal over the fused outputs with the scaling folded in. None if no adapter applies."""
    a_parts, b_parts, ranks = [], [], []
    outs = [getattr(m, "base_layer", m).out_features for m in mods]  # not the weight: it may be on loan
    for name in routing.names:
        rank = 0
        for k, m in enumerate(mods):
            if name not in getattr(m, "lora_A", {}):
                continue
            if getattr(m, "use_dora", {}).get(name) or getattr(m, "lora_bias", {}).get(name):
                raise Unsupported("DoRA / LoRA bias")
            a, b = m.lora_A[name].weight, m.lora_B[name].weight  # (r, in), (out_k, r)
            block = b.new_zeros(a.shape[0], sum(outs))  # (r, sum out): zero outside projection k's outputs
            block[:, sum(outs[:k]) : sum(outs[: k + 1])] = (b * m.scaling[name]).T
            a_parts.append(a)
            b_parts.append(block)
            rank += a.shape[0]
        ranks.append(rank)
    if not a_parts:
        return None
    return StackedLoRA(torch.cat(a_parts).float().T.contiguous(), torch.cat(b_parts).float(), tuple(ranks), routing)


class WeightLoan:
    """fp32 weights a decode holds in oneDNN's packed layout *instead of* the model's own tensors, for one call.

    Why: at decode rows oneDNN streams packed fp32 weights ~1.5x faster than MKL's sgemm streams the dense ones (10.6
    against ~7 GB/s on one thread for SmolLM2-135M's projections), but a packed copy beside the dense weights adds
    the model's size to the rollout's memory. On loan, each parameter's memory pages go back to the OS once its
    packed copy exists (:func:`comlrl.accel.pages.discard_pages`) and the parameter is left empty, so any use
    before :meth:`give_back` fails instead of reading stale values. :meth:`give_back` writes the values back into
    the same tensors, bit for bit (the packed layout is a reordering, not a rounding), discarding each packed copy's
    pages as it goes: the rollout's memory never holds a weight twice. Only a trained parameter that spans its own
    storage goes on loan (not a frozen base, not a view into a flat buffer), and each once (tied weights are lent
    through their first module).
    """

    def __init__(self) -> None:
        self._lent: list[tuple[list[nn.Parameter], list[torch.Tensor], Projection]] = []
        self._ids: set[int] = set()

    def holds(self, weights: list[torch.Tensor]) -> bool:
        """Whether any of ``weights`` is already on this loan (a weight tied to another projection's)."""
        return any(id(w) in self._ids for w in weights)

    def take(self, params: list[nn.Parameter], projection: Projection) -> None:
        """Put ``params`` on loan: ``projection.packed`` holds their values concatenated on the output dim."""
        own = [p.data for p in params]
        for p, data in zip(params, own):
            discard_pages(data)
            p.data = data.new_empty(0)
            self._ids.add(id(p))
        self._lent.append((params, own, projection))

    def give_back(self) -> None:
        """Write every lent parameter's values back from its packed copy, and drop the copy."""
        while self._lent:
            params, own, projection = self._lent.pop()
            dense = projection.packed.to_dense()
            discard_pages(projection.packed)  # a freed block would stay resident until the heap is trimmed
            projection.packed = None
            if dense.shape != (sum(t.shape[0] for t in own), *own[0].shape[1:]):
                raise RuntimeError(f"a packed weight unpacked to {tuple(dense.shape)}, not to {[t.shape for t in own]}")
            for p, data, part in zip(params, own, dense.split([t.shape[0] for t in own])):
                data.copy_(part)
                p.data = data
            del dense
        self._ids.clear()


@functools.cache
def _packing_round_trips() -> bool:
    """Whether an fp32 weight packed for oneDNN unpacks to exactly itself in this build (a loan's precondition)."""
    weight = torch.randn(48, 40, generator=torch.Generator().manual_seed(0))
    try:
        return torch.equal(torch.ops.mkldnn._reorder_linear_weight(weight, 4).to_dense(), weight)
    except (RuntimeError, AttributeError):
        return False


def can_lend(params: list[torch.Tensor], loan: WeightLoan | None) -> bool:
    """Whether ``params`` (fp32 weights of projections that read the same input) can go on ``loan``."""
    return (
        loan is not None
        and all(isinstance(p, nn.Parameter) and p.dtype == torch.float32 and p.numel() > 0 for p in params)
        # trained weights only: a frozen one loaded memory-mapped lives in the OS's page cache (shared, reclaimable),
        # and written back it would become this process's own memory for the rest of the run
        and all(p.requires_grad for p in params)
        # a weight viewing part of a larger buffer (a flat parameter) shares pages with its neighbours
        and all(p.untyped_storage().nbytes() == p.numel() * p.element_size() for p in params)
        and len({id(p) for p in params}) == len(params)
        and can_prepack(torch.float32, params[0].device)
        and not loan.holds(params)
        and _packing_round_trips()
    )


# Cast/fused/prepacked copies of frozen weights (a LoRA team's shared base), reused by later calls while the weights
# are unchanged: building them costs ~0.2 s per call for SmolLM2-135M in bf16, ~7% of a 64-token rollout.
_SNAPSHOTS: "weakref.WeakKeyDictionary[nn.Module, tuple[tuple, list[Projection]]]" = weakref.WeakKeyDictionary()


def _base_projections(
    mods: list[nn.Module],
    dtype: torch.dtype,
    *,
    adapter: str | None,
    pack_rows: int,
    output_layer: bool = False,
    loan: WeightLoan | None = None,
) -> list[Projection]:
    """The projections' weights (LoRA deltas of ``adapter`` folded in) in ``dtype``, fused/prepacked as above
    (``output_layer``: the vocabulary projection, never lent: its weight is often the embedding's too)."""
    pairs = [_linear_weight(m, adapter) for m in mods]
    own = [getattr(m, "base_layer", m) for m in mods]
    frozen = all(w is o.weight and b is o.bias and not w.requires_grad for (w, b), o in zip(pairs, own))
    weights = [w for w, _ in pairs]
    if dtype == torch.float32 and not output_layer and all(w is o.weight for w, o in zip(weights, own)):
        if can_lend(weights, loan):
            linears = _copied_projections(pairs, dtype, pack_rows)
            loan.take(weights, linears[0])
            return linears
    if pairs[0][0].dtype == dtype and not can_prepack(dtype, pairs[0][0].device):
        return [Projection(w, b) for w, b in pairs]  # the model's own tensors (or merged LoRA weights), no copy
    if (
        dtype == torch.float32
        and not output_layer
        and all(w.dtype == dtype for w, _ in pairs)
        and sum(w.shape[0] for w, _ in pairs) >= pairs[0][0].shape[1]
    ):
        # fp32 projections with at least as many outputs as inputs (q/k/v, o, gate/up): the weights as they are, as
        # gemm's first operand. At decode rows (4, one thread) MKL streams them at 11-15 GB/s this way, about as fast
        # as oneDNN's packed copy (gate 0.64 vs 0.89 ms, q/k/v-sized 0.15 vs 0.13 ms), and no fp32 copy of them is
        # made (2 agents' full fine-tune decoding at once: peak 4.55 -> 4.37-4.39 GB, same rollout time). The down
        # projection and the output layer stream ~1.5-2x faster packed (0.22 vs 0.50 ms, 6.0 vs 8.8 ms): copied.
        return [Projection(w, b, weight_first=True) for w, b in pairs]
    # Frozen weights: the copy is made once and cached -- except in fp32, where a kept copy would double the weights'
    # resident memory; there it lives for one call (a transient ~1x of the weights, ~0.15 s for SmolLM2-135M).
    cache = frozen and dtype != torch.float32
    key = (dtype, pack_rows, tuple((t.data_ptr(), t._version) for w, b in pairs for t in (w, b) if t is not None))
    if cache and mods[0] in _SNAPSHOTS and _SNAPSHOTS[mods[0]][0] == key:
        return [dataclasses.replace(linear) for linear in _SNAPSHOTS[mods[0]][1]]
    linears = _copied_projections(pairs, dtype, pack_rows)
    if cache:
        _SNAPSHOTS[mods[0]] = (key, linears)
        linears = [dataclasses.replace(linear) for linear in linears]
    return linears


def _copied_projections(
    pairs: list[tuple[torch.Tensor, torch.Tensor | None]], dtype: torch.dtype, pack_rows: int
) -> list[Projection]:
    """One projection over the (weight, bias) pairs concatenated on the output dim, cast to ``dtype``."""
    if len(pairs) == 1:
        weight = pairs[0][0].to(dtype)
    else:
        weight = _cat_cast([w for w, _ in pairs], dtype)  # (sum out, in)
    bias = None
    if any(b is not None for _, b in pairs):
        bias = torch.cat(
            [b.to(dtype) if b is not None else torch.zeros(w.shape[0], dtype=dtype, device=w.device) for w, b in pairs]
        )
    if can_prepack(dtype, weight.device):
        return [Projection(None, bias, torch.ops.mkldnn._reorder_linear_weight(weight, pack_rows))]
    return [Projection(weight, bias)]


def _cat_cast(tensors: list[torch.Tensor], dtype: torch.dtype) -> torch.Tensor:
    """``torch.cat`` along dim 0 into ``dtype`` in one pass (cast-then-cat would write every weight twice)."""
    out = torch.empty((sum(t.shape[0] for t in tensors), *tensors[0].shape[1:]), dtype=dtype, device=tensors[0].device)
    offset = 0
    for t in tensors:
        out[offset : offset + t.shape[0]].copy_(t)
        offset += t.shape[0]
    return out


def apply_projections(x: torch.Tensor, projections: list[Projection]) -> torch.Tensor:
    """Outputs of the (possibly fused) projections of x, concatenated on the last dim."""
    if len(projections) == 1:
        return projections[0](x)
    return torch.cat([proj(x) for proj in projections], dim=-1)


Projections = list[Projection]
