"""A DeepSeek-V4-Flash decode step in plain torch around the kernels under test (the model of ``make bench-step``).

Shapes are sglang 0.5.23's (``configs/deepseek_v4.py``, ``models/deepseek_v4.py``, ``layers/attention/dsv4/``) with
the published DeepSeek-V4-Flash config: hidden 4096, 64 query heads of 512 (448 NoPE + 64 RoPE; 64 heads need no
padding: sglang pads to 64 only below 64), ``q_lora_rank`` 1024, grouped output projection (8 groups, ``o_lora_rank``
1024), SWA window 128 on 256-token pages, indexer 64 heads x 128 with top-512, 256 routed experts (6 per token,
``moe_intermediate_size`` 2048) + 1 shared expert, vocabulary 129280, 43 layers with ``compress_ratios`` = 0, 0, then
4 and 128 alternating (2 SWA-only layers, 21 CSA layers with an indexer, 20 HCA layers; sglang reads the list from
the checkpoint's config.json, its ``DeepSeekV4Config`` default is empty).

Per layer and decode token (B requests, one token each), in order:

1. RMSNorm; fused ``wq_a``+``wkv`` GEMM (4096 -> 1024 + 512); q RMSNorm; ``wq_b`` (1024 -> 64 x 512); per-head RMSNorm
   and RoPE on q; KV RMSNorm + RoPE and the new token's fp8 row written into the SWA cache (one index copy).
2. Compressed layers: the compressor's ``wkv_gate`` GEMM (4096 -> 2 x coff x 512, coff = 2 for ratio 4, 1 for 128),
   its gated pooling over the ratio window (softmax + weighted sum in torch; sglang runs one fused kernel) and the
   compressed row written to the compressed cache.
3. Ratio-4 layers: the indexer: its own compressor (4096 -> 512) writing an fp8 key, ``wq_b`` (1024 -> 64 x 128), the
   rotation (a 128 x 128 GEMM standing in for sglang's fused RoPE + Hadamard + fp8 quant), ``weights_proj`` (4096 ->
   64), then logits over the compressed context and top-512 -> slot ids of the compressed cache (page 64).
4. The sparse decode: SWA indices (last 128 positions, 256-token pages) + the extra cache: ratio 4 -> the 512 indexer
   slots (page 64); ratio 128 -> every compressed block so far through sglang's c128 page-index table, whose width is
   ``cap / 128`` under decode CUDA graphs (page 2; entries past ``ctx / 128`` are -1).
5. Inverse RoPE on the output's RoPE part, ``wo_a`` as a batched GEMM over the 8 groups (8 heads x 512 -> 1024 each),
   ``wo_b`` (8192 -> 4096), residual.
6. MoE FFN as one rank of a DP-attention + EP8 deployment (the simulator's deployment): router GEMM (4096 -> 256) with
   sqrt-softplus top-6; the rank's 32 local experts, of which ``E = ceil(32 * (1 - (1 - 6/256)^(8B)))`` are touched by
   the 8B tokens in flight, each processing ``m = ceil(6B / E)`` tokens: a gather, two batched GEMMs of exactly the
   active-expert size (4096 -> 2 x 2048 -> 4096) and a scatter-add; the shared expert on the rank's B tokens. The
   all-to-all between ranks is not modelled (one GPU).

After the layers: final RMSNorm, LM head (4096 -> 129280) and argmax.

Flag states (the ``variant`` label): the decode is sglang 0.5.23's SM120 Triton kernel
``flash_mla_sparse_decode_triton`` (per (request, head) program; loaded from sglang's source file) unless
``mma_decode`` is on (then :func:`sparsemla.kernels.sparse_decode`); the indexer is sglang's
``fp8_paged_mqa_logits_torch_sm120`` algorithm + ``torch.topk`` over the page-table width (faithful
re-implementations in :mod:`benchmarks.indexer`; both follow the cap, not the context) unless
``triton_indexer`` is on (then our kernels through sglang's call contract,
:mod:`sparsemla.kernels.indexer.sglang_compat`).

Reference states (:data:`REFERENCES`, not sparsemla flag states: never a simulator state): what stock sglang runs
where the GPU has a fast path. ``flashmla_decode+triton_indexer`` is the flags-on step with the decode swapped for
sglang's Hopper decode, FlashMLA's ``flash_mla_with_kvcache`` (sgl-flash-mla, legacy SM90 kernel,
:class:`benchmarks.decode.FlashMLADecode`); its indexer is ours, standing in for DeepGEMM's ``fp8_paged_mqa_logits``
+ sglang's JIT ``topk_transform_paged_v2`` (DeepGEMM does not load on the benchmark machine), so flags on vs it
compares the two decodes with everything else equal.

Approximations (the same in every state, so they shift both step times alike): weights are bf16 (the checkpoint is
fp8, so weight-streaming GEMMs take up to 2x their fp8 time); the mHC hyper-connections (``hc_mult`` 4) and MTP are
not modelled; glue that sglang fuses (KV quant+write, compressor pooling, q rotation+quant) is a few plain torch
kernels; the 21 ratio-4 layers share one set of weights and caches (likewise the 20 ratio-128 and the 2 SWA-only
layers): every layer streams >= 250 MB of weights, far more than the 50 MB L2, so the reuse gives no cache hits.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

import torch
import torch.nn.functional as F

from sparsemla import flags
from sparsemla import variant as kernel_variant
from sparsemla.kernels.layouts import IDX_BYTES_PER_TOKEN, IDX_DIM, IDX_PAGE, V4_DATA_BYTES

VARIANTS = kernel_variant.VARIANTS
# The two states the issue compares, with their bench provider names: every flag off, every flag on.
MAIN_VARIANTS = {kernel_variant.BASELINE: "baseline", kernel_variant.ALL_ON: "sparsemla"}


# Reference states measured next to the flag states (see the module docstring), with what each one is.
FLASHMLA_REFERENCE = "flashmla_decode+triton_indexer"
REFERENCES: dict[str, str] = {
    FLASHMLA_REFERENCE: "sglang's fast decode on Hopper (FlashMLA) with our Triton indexer standing in for DeepGEMM's",
}
# Which decode a state runs: sglang's fallback (the baseline decode), ours, or FlashMLA's.
DECODE_BASELINE, DECODE_SPARSEMLA, DECODE_FLASHMLA = "baseline", "sparsemla", "flashmla"


def variant_flags(name: str) -> tuple[bool, bool]:
    """(decode kernel on, indexer kernels on) of a variant name; ValueError (VariantError) outside the closed set."""
    state = kernel_variant.parse(name)
    return state.is_on(flags.SPARSEMLA_MMA_DECODE), state.is_on(flags.SPARSEMLA_TRITON_INDEXER)


def state_kernels(name: str) -> tuple[str, bool]:
    """(which decode: DECODE_*, our Triton indexer on) of a flag state or a reference state; ValueError otherwise."""
    if name == FLASHMLA_REFERENCE:
        return DECODE_FLASHMLA, True
    mma, triton_indexer = variant_flags(name)
    return (DECODE_SPARSEMLA if mma else DECODE_BASELINE), triton_indexer


@dataclass(frozen=True)
class ModelShape:
    """Dimensions of the modelled model and deployment (defaults: DeepSeek-V4-Flash, one rank of DP-attn + EP8)."""

    hidden: int = 4096
    heads: int = 64
    head_dim: int = 512
    rope_dim: int = 64
    q_lora: int = 1024
    o_lora: int = 1024
    o_groups: int = 8
    window: int = 128
    swa_page: int = 256
    index_heads: int = 64
    index_dim: int = IDX_DIM
    index_topk: int = 512
    experts: int = 256
    experts_per_token: int = 6
    moe_inter: int = 2048
    vocab: int = 129280
    num_layers: int = 43
    ep: int = 8
    routed_scale: float = 1.5
    eps: float = 1e-6

    @property
    def local_experts(self) -> int:
        return self.experts // self.ep

    @property
    def compress_ratios(self) -> tuple[int, ...]:
        """Per-layer ratios: 0, 0, then 4 and 128 alternating (DeepSeek-V4-Flash's config.json)."""
        return tuple(0 if i < 2 else (4 if i % 2 == 0 else 128) for i in range(self.num_layers))

    @property
    def indexer_layers(self) -> int:
        return sum(1 for r in self.compress_ratios if r == 4)

    def active_experts(self, batch: int) -> tuple[int, int]:
        """(touched local experts E, tokens per touched expert m) for ``batch`` tokens per rank, every rank alike."""
        tokens = self.ep * batch  # tokens routed over all experts in one step
        p_touch = 1.0 - (1.0 - self.experts_per_token / self.experts) ** tokens
        touched = max(1, min(self.local_experts, math.ceil(self.local_experts * p_touch - 1e-9)))
        pairs = batch * self.experts_per_token  # expected (token, expert) pairs landing on this rank
        return touched, max(1, math.ceil(pairs / touched))


V4_FLASH = ModelShape()
# CPU-test shape: same attention/indexer geometry (the kernels' contracts), small dense dims and 4 layers.
TINY = replace(V4_FLASH, hidden=256, q_lora=128, o_lora=64, experts=32, moe_inter=64, vocab=512, num_layers=4)


# -- weights ----------------------------------------------------------------------------------------------------------
def _w(gen: torch.Generator, device: torch.device, *shape: int) -> torch.Tensor:
    """bf16 ``[*shape]`` ~ N(0, 1/fan_in) (fan_in = last dim) so activations stay O(1) through the stack."""
    return (torch.randn(*shape, generator=gen, device=device) * shape[-1] ** -0.5).to(torch.bfloat16)


@dataclass
class LayerWeights:
    """One layer's parameters in ``F.linear`` layout ([out, in]); compressor/indexer ones only on compressed layers."""

    ratio: int
    attn_norm: torch.Tensor
    wqkv_a: torch.Tensor
    q_norm: torch.Tensor
    wq_b: torch.Tensor
    kv_norm: torch.Tensor
    sink: torch.Tensor
    wo_a: torch.Tensor  # [groups, o_lora, heads / groups * head_dim]
    wo_b: torch.Tensor
    ffn_norm: torch.Tensor
    gate: torch.Tensor
    w13: torch.Tensor  # [local experts, 2 * inter, hidden]
    w2: torch.Tensor  # [local experts, hidden, inter]
    shared_w13: torch.Tensor
    shared_w2: torch.Tensor
    comp_wkv_gate: torch.Tensor | None = None
    comp_ape: torch.Tensor | None = None
    idx_wq_b: torch.Tensor | None = None
    idx_weights_proj: torch.Tensor | None = None
    idx_rotation: torch.Tensor | None = None
    idx_comp_wkv_gate: torch.Tensor | None = None
    idx_comp_ape: torch.Tensor | None = None


def make_layer_weights(shape: ModelShape, ratio: int, device: torch.device, gen: torch.Generator) -> LayerWeights:
    """Random weights of one layer with compress ratio ``ratio`` (0, 4 or 128)."""
    s, d = shape, shape.head_dim
    ones = lambda n: torch.ones(n, dtype=torch.bfloat16, device=device)  # noqa: E731
    w = LayerWeights(
        ratio=ratio,
        attn_norm=ones(s.hidden),
        wqkv_a=_w(gen, device, s.q_lora + d, s.hidden),
        q_norm=ones(s.q_lora),
        wq_b=_w(gen, device, s.heads * d, s.q_lora),
        kv_norm=ones(d),
        sink=torch.randn(s.heads, generator=gen, device=device),
        wo_a=_w(gen, device, s.o_groups, s.o_lora, s.heads // s.o_groups * d),
        wo_b=_w(gen, device, s.hidden, s.o_groups * s.o_lora),
        ffn_norm=ones(s.hidden),
        gate=_w(gen, device, s.experts, s.hidden),
        w13=_w(gen, device, s.local_experts, 2 * s.moe_inter, s.hidden),
        w2=_w(gen, device, s.local_experts, s.hidden, s.moe_inter),
        shared_w13=_w(gen, device, 2 * s.moe_inter, s.hidden),
        shared_w2=_w(gen, device, s.hidden, s.moe_inter),
    )
    if ratio in (4, 128):
        coff = 2 if ratio == 4 else 1
        w.comp_wkv_gate = _w(gen, device, 2 * coff * d, s.hidden)
        w.comp_ape = torch.randn(ratio, coff * d, generator=gen, device=device)
    if ratio == 4:
        w.idx_wq_b = _w(gen, device, s.index_heads * s.index_dim, s.q_lora)
        w.idx_weights_proj = _w(gen, device, s.index_heads, s.hidden)
        w.idx_rotation = _w(gen, device, s.index_dim, s.index_dim)
        w.idx_comp_wkv_gate = _w(gen, device, 2 * 2 * s.index_dim, s.hidden)
        w.idx_comp_ape = torch.randn(4, 2 * s.index_dim, generator=gen, device=device)
    return w


# -- caches and per-(B, ctx) inputs ------------------------------------------------------------------------------------
def random_v4_pages(num_pages: int, page_size: int, gen: torch.Generator, device: torch.device) -> torch.Tensor:
    """A random V4 ``k_cache`` view ``[num_pages, page_size, 1, 584]`` (the decode benchmark's GPU builder)."""
    from benchmarks.decode import random_v4_cache_gpu

    return random_v4_cache_gpu(num_pages, page_size, gen, str(device))


def random_indexer_pages(num_pages: int, gen: torch.Generator, device: torch.device) -> torch.Tensor:
    """A random indexer key cache ``[num_pages, 64, 1, 132]`` (the indexer benchmark's GPU builder)."""
    from benchmarks.indexer import gpu_indexer_cache

    return gpu_indexer_cache(num_pages, device, gen)


def _flat_bytes(k_cache: torch.Tensor) -> torch.Tensor:
    """The flat uint8 storage behind a cache view (pages back to back, ``stride(0)`` bytes each)."""
    total = k_cache.shape[0] * k_cache.stride(0)
    return k_cache.view(torch.uint8).as_strided((total,), (1,))


def v4_row_offsets(k_cache: torch.Tensor, slots: torch.Tensor) -> torch.Tensor:
    """Byte offsets ``[len(slots), 576]`` of the data rows (NoPE fp8 + RoPE bf16) of ``slots`` in a V4 cache."""
    page_size, page_bytes = k_cache.shape[1], k_cache.stride(0)
    base = (slots // page_size) * page_bytes + (slots % page_size) * V4_DATA_BYTES
    return base.long()[:, None] + torch.arange(V4_DATA_BYTES, device=slots.device)


@dataclass
class LayerCaches:
    """The caches one layer instance reads for a (B, ctx) point, and where this step's new rows go."""

    swa: torch.Tensor
    swa_write: torch.Tensor  # [B, 576] byte offsets of the new token's SWA row
    extra: torch.Tensor | None = None  # c4 (page 64) or c128 (page 2) V4 cache
    extra_write: torch.Tensor | None = None  # [B, 576] byte offsets of the compressed row written this step
    idx_keys: torch.Tensor | None = None  # [pages, 64, 1, 132] indexer keys (ratio 4)
    idx_write: torch.Tensor | None = None  # [B, 128] byte offsets of this step's fp8 key
    comp_state: torch.Tensor | None = None  # [B, ratio, 2 * coff * 512] fp32 compressor window
    idx_comp_state: torch.Tensor | None = None  # [B, 4, 2 * 2 * 128] fp32
    topk_slots: torch.Tensor | None = None  # [B, 512] int32, written by the indexer, read by the decode


@dataclass
class StepInputs:
    """Everything a decode step at (B, ctx, cap) reads besides weights. ``cap`` is the server's context length."""

    batch: int
    ctx: int
    cap: int
    x: torch.Tensor  # [B, hidden] bf16 residual stream entering layer 0
    cos: torch.Tensor  # [B, 1, rope/2] fp32 at the new token's position
    sin: torch.Tensor
    swa_idx: torch.Tensor  # [B, 1, window] int32
    swa_len: torch.Tensor  # [B] int32
    page_table: torch.Tensor  # [B, cap / swa_page] int32 main pages (compressed caches share them)
    c4_len: torch.Tensor  # [B] int32 compressed (ratio 4) length = indexer sequence length
    c4_topk_len: torch.Tensor  # [B] int32 min(index_topk, c4_len)
    c128_idx: torch.Tensor  # [B, 1, cap / 128] int32 slots of every compressed block so far, -1 after
    c128_len: torch.Tensor  # [B] int32
    route_idx: torch.Tensor  # [E * m] int64 token of each routed (expert, slot) pair
    experts: tuple[int, int]  # (E, m)
    caches: dict[int, LayerCaches] = field(default_factory=dict)  # by compress ratio

    def nbytes(self) -> int:
        total = 0
        for c in self.caches.values():
            for t in (c.swa, c.extra, c.idx_keys, c.comp_state, c.idx_comp_state):
                if t is not None:
                    total += t.shape[0] * t.stride(0) * t.element_size()
        return total


def make_inputs(
    shape: ModelShape, batch: int, ctx: int, cap: int, device: torch.device, gen: torch.Generator
) -> StepInputs:
    """Random caches and indices for ``batch`` requests of ``ctx`` tokens each (ctx a multiple of 512, <= cap)."""
    if ctx % 512 or cap % shape.swa_page or not 0 < ctx <= cap:
        raise ValueError(f"need 0 < ctx <= cap, ctx a multiple of 512 and cap of {shape.swa_page}: {ctx=}, {cap=}")
    s, B = shape, batch
    ar = torch.arange(B, device=device)
    half = s.rope_dim // 2
    # Position ctx - 1 (the token being decoded), YaRN-free plain RoPE frequencies: glue cost only.
    inv_freq = 10000.0 ** (-torch.arange(half, device=device, dtype=torch.float32) / half)
    angle = (ctx - 1) * inv_freq
    cos = angle.cos().expand(B, 1, half).contiguous()
    sin = angle.sin().expand(B, 1, half).contiguous()

    # SWA: one 256-token page per request holds its last window; the new token goes to position ctx - 1.
    window_pos = torch.arange(ctx - s.window, ctx, device=device) % s.swa_page
    swa_idx = (ar[:, None] * s.swa_page + window_pos[None, :]).to(torch.int32).view(B, 1, s.window)
    swa_len = torch.full((B,), s.window, dtype=torch.int32, device=device)
    new_slot = ar * s.swa_page + (ctx - 1) % s.swa_page

    # Main pages: ctx / 256 real pages per request in random order, the rest of the capture-width table random valid.
    pages_per_req = ctx // s.swa_page
    num_pages = B * pages_per_req
    width = cap // s.swa_page
    perm = torch.randperm(num_pages, generator=gen, device=device).view(B, pages_per_req)
    table = torch.randint(0, num_pages, (B, width), generator=gen, device=device)
    table[:, :pages_per_req] = perm
    page_table = table.to(torch.int32)

    c4_page, c128_page = s.swa_page // 4, s.swa_page // 128
    c4_len = torch.full((B,), ctx // 4, dtype=torch.int32, device=device)
    c4_topk_len = torch.clamp(c4_len, max=s.index_topk)
    n128 = ctx // 128
    t = torch.arange(cap // 128, device=device)
    c128_slots = page_table.long().gather(1, (t // c128_page).expand(B, -1)) * c128_page + t % c128_page
    c128_idx = torch.where(t < n128, c128_slots, -1).to(torch.int32).view(B, 1, -1)
    c128_len = torch.full((B,), n128, dtype=torch.int32, device=device)

    experts, per_expert = shape.active_experts(B)
    route_idx = torch.arange(experts * per_expert, device=device) % B

    inp = StepInputs(
        batch=B, ctx=ctx, cap=cap,
        x=torch.randn(B, s.hidden, generator=gen, device=device).to(torch.bfloat16),
        cos=cos, sin=sin, swa_idx=swa_idx, swa_len=swa_len, page_table=page_table,
        c4_len=c4_len, c4_topk_len=c4_topk_len, c128_idx=c128_idx, c128_len=c128_len,
        route_idx=route_idx, experts=(experts, per_expert),
    )  # fmt: skip
    # Compressed rows written this step: the block holding position ctx - 1 (page of that block, offset in page).
    last_page = page_table[:, pages_per_req - 1].long()
    for ratio in sorted(set(s.compress_ratios)):
        swa = random_v4_pages(B, s.swa_page, gen, device)
        caches = LayerCaches(swa=swa, swa_write=v4_row_offsets(swa, new_slot))
        if ratio in (4, 128):
            page = c4_page if ratio == 4 else c128_page
            extra = random_v4_pages(num_pages, page, gen, device)
            caches.extra = extra
            caches.extra_write = v4_row_offsets(extra, last_page * page + page - 1)
            coff = 2 if ratio == 4 else 1
            caches.comp_state = torch.randn(B, ratio, 2 * coff * s.head_dim, generator=gen, device=device)
        if ratio == 4:
            keys = random_indexer_pages(num_pages, gen, device)
            caches.idx_keys = keys
            key_slot = last_page * IDX_PAGE + IDX_PAGE - 1
            base = (key_slot // IDX_PAGE) * (IDX_PAGE * IDX_BYTES_PER_TOKEN) + (key_slot % IDX_PAGE) * IDX_DIM
            caches.idx_write = base[:, None] + torch.arange(IDX_DIM, device=device)
            caches.idx_comp_state = torch.randn(B, 4, 2 * 2 * s.index_dim, generator=gen, device=device)
            caches.topk_slots = torch.full((B, s.index_topk), -1, dtype=torch.int32, device=device)
        inp.caches[ratio] = caches
    return inp


# -- the step -------------------------------------------------------------------------------------------------------
DecodeFn = Callable[..., tuple[torch.Tensor, torch.Tensor]]


def _rms(x: torch.Tensor, weight: torch.Tensor | None, eps: float) -> torch.Tensor:
    return F.rms_norm(x, (x.shape[-1],), weight, eps)


def _rope_tail(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, rope: int, inverse: bool = False) -> torch.Tensor:
    """Rotate the last ``rope`` dims of ``x`` [B, H, D] as interleaved pairs (sglang's non-neox style)."""
    nope, r = x[..., :-rope], x[..., -rope:].float().unflatten(-1, (rope // 2, 2))
    a, b = r[..., 0], r[..., 1]
    s = -sin if inverse else sin
    rot = torch.stack((a * cos - b * s, a * s + b * cos), dim=-1).flatten(-2)
    return torch.cat((nope, rot.to(x.dtype)), dim=-1)


def _write_v4_row(k_cache: torch.Tensor, offsets: torch.Tensor, row: torch.Tensor, nope: int) -> None:
    """Store bf16 rows [B, 512] as fp8 NoPE + bf16 RoPE bytes at ``offsets`` (scales left as they are)."""
    data = torch.cat(
        (row[:, :nope].to(torch.float8_e4m3fn).view(torch.uint8), row[:, nope:].contiguous().view(torch.uint8)), 1
    )
    _flat_bytes(k_cache)[offsets] = data


def _compress(
    h: torch.Tensor, wkv_gate: torch.Tensor, ape: torch.Tensor, state: torch.Tensor, slot: int
) -> torch.Tensor:
    """Gated pooling over the ratio window: [B, coff * dim] fp32 (sglang fuses this into one kernel)."""
    state[:, slot] = F.linear(h, wkv_gate).float()
    kv, gate = state.chunk(2, dim=-1)
    weights = torch.softmax(gate + ape, dim=1)
    return (weights * kv).sum(dim=1)


class DecodeStep:
    """One decode step of the whole model for one flag state; ``__call__`` returns the argmax token ids [B]."""

    def __init__(
        self,
        shape: ModelShape,
        layers: dict[int, LayerWeights],
        lm_head: torch.Tensor,
        final_norm: torch.Tensor,
        inputs: StepInputs,
        variant: str,
        baseline_decode: DecodeFn,
        fast_decode: DecodeFn | None = None,
    ) -> None:
        """``variant``: a flag state or a reference state; ``fast_decode``: the FlashMLA decode a reference state runs
        (one per inputs: it may keep a schedule; its ``new_step()``, if any, is called at the start of every step)."""
        self.shape, self.layers, self.lm_head, self.final_norm, self.inp = shape, layers, lm_head, final_norm, inputs
        self.variant = variant
        decode, triton_indexer = state_kernels(variant)
        if decode == DECODE_SPARSEMLA:
            from sparsemla.kernels import sparse_decode

            self.decode: DecodeFn = sparse_decode
        elif decode == DECODE_FLASHMLA:
            if fast_decode is None:
                raise ValueError(f"state {variant} runs FlashMLA's decode: pass fast_decode")
            self.decode = fast_decode
        else:
            self.decode = baseline_decode
        self._new_step: Callable[[], Any] | None = getattr(self.decode, "new_step", None)
        self.triton_indexer = triton_indexer
        if triton_indexer:
            from sparsemla.kernels.indexer.sglang_compat import fp8_paged_mqa_logits, topk_transform_paged

            self._logits, self._topk = fp8_paged_mqa_logits, topk_transform_paged
        else:
            from benchmarks.indexer import torch_fallback_logits, torch_topk_transform

            self._logits = lambda q, kv, w, lens, pt, meta, width, clean: torch_fallback_logits(
                q, kv, w, lens, pt, width
            )
            self._topk = torch_topk_transform
        self.softmax_scale = shape.head_dim**-0.5
        self.index_weight_scale = shape.index_dim**-0.5 * shape.index_heads**-0.5

    # one piece at a time, so the profile's CPU side names them (the GPU side is named by kernel)
    def indexer(self, w: LayerWeights, c: LayerCaches, h: torch.Tensor, q_lora: torch.Tensor) -> torch.Tensor:
        s, inp, B = self.shape, self.inp, self.inp.batch
        key = _compress(h, w.idx_comp_wkv_gate, w.idx_comp_ape, c.idx_comp_state, (inp.ctx - 1) % 4)
        key = key.view(B, 2, s.index_dim).sum(1)
        _flat_bytes(c.idx_keys)[c.idx_write] = key.to(torch.float8_e4m3fn).view(torch.uint8)
        q = F.linear(q_lora, w.idx_wq_b).view(B, s.index_heads, s.index_dim)
        q_fp8 = (q @ w.idx_rotation).to(torch.float8_e4m3fn).view(B, 1, s.index_heads, s.index_dim)
        weights = F.linear(h, w.idx_weights_proj).float() * self.index_weight_scale
        logits = self._logits(q_fp8, c.idx_keys, weights, inp.c4_len, inp.page_table, None, inp.cap // 4, False)
        self._topk(logits, inp.c4_len, inp.page_table, c.topk_slots, IDX_PAGE)
        return c.topk_slots.view(B, 1, s.index_topk)

    def attention(self, w: LayerWeights, x: torch.Tensor) -> torch.Tensor:
        s, inp, B = self.shape, self.inp, self.inp.batch
        c = inp.caches[w.ratio]
        h = _rms(x, w.attn_norm, s.eps)
        q_lora, kv = F.linear(h, w.wqkv_a).split((s.q_lora, s.head_dim), dim=-1)
        q_lora = _rms(q_lora, w.q_norm, s.eps)
        q = _rms(F.linear(q_lora, w.wq_b).view(B, s.heads, s.head_dim), None, s.eps)
        q = _rope_tail(q, inp.cos, inp.sin, s.rope_dim)
        kv = _rope_tail(_rms(kv, w.kv_norm, s.eps).view(B, 1, s.head_dim), inp.cos, inp.sin, s.rope_dim).view(B, -1)
        nope = s.head_dim - s.rope_dim
        _write_v4_row(c.swa, c.swa_write, kv, nope)
        extra: dict[str, Any] = {}
        if w.ratio in (4, 128):
            comp = _compress(h, w.comp_wkv_gate, w.comp_ape, c.comp_state, (inp.ctx - 1) % w.ratio)
            comp = comp.view(B, -1, s.head_dim).sum(1)
            _write_v4_row(c.extra, c.extra_write, _rms(comp, None, s.eps).to(torch.bfloat16), nope)
            if w.ratio == 4:
                slots, lens = self.indexer(w, c, h, q_lora), inp.c4_topk_len
            else:
                slots, lens = inp.c128_idx, inp.c128_len
            extra = dict(extra_k_cache=c.extra, extra_indices_in_kvcache=slots, extra_topk_length=lens)
        out, _ = self.decode(
            q=q.view(B, 1, s.heads, s.head_dim), k_cache=c.swa, indices=inp.swa_idx, topk_length=inp.swa_len,
            attn_sink=w.sink, head_dim_v=s.head_dim, softmax_scale=self.softmax_scale, **extra,
        )  # fmt: skip
        o = _rope_tail(out.view(B, s.heads, s.head_dim), inp.cos, inp.sin, s.rope_dim, inverse=True)
        o = torch.bmm(o.view(B, s.o_groups, -1).transpose(0, 1), w.wo_a.transpose(1, 2))  # [G, B, o_lora]
        return F.linear(o.transpose(0, 1).reshape(B, -1), w.wo_b)

    def moe(self, w: LayerWeights, x: torch.Tensor) -> torch.Tensor:
        s, inp = self.shape, self.inp
        h = _rms(x, w.ffn_norm, s.eps)
        scores = F.softplus(F.linear(h, w.gate).float()).sqrt()
        top_w, _ = scores.topk(s.experts_per_token, dim=-1)
        experts, per_expert = inp.experts
        xe = h.index_select(0, inp.route_idx).view(experts, per_expert, s.hidden)
        gu = torch.bmm(xe, w.w13[:experts].transpose(1, 2))
        act = F.silu(gu[..., : s.moe_inter]) * gu[..., s.moe_inter :]
        ye = torch.bmm(act, w.w2[:experts].transpose(1, 2)).view(-1, s.hidden)
        coef = (top_w.sum(-1, keepdim=True) / s.experts_per_token).to(ye.dtype)  # router weight per token
        routed = torch.zeros_like(h).index_add_(0, inp.route_idx, ye * coef.index_select(0, inp.route_idx))
        sh = F.linear(h, w.shared_w13)
        sh = F.linear(F.silu(sh[:, : s.moe_inter]) * sh[:, s.moe_inter :], w.shared_w2)
        return routed * s.routed_scale + sh

    def __call__(self) -> torch.Tensor:
        if self._new_step is not None:
            self._new_step()
        x = self.inp.x
        for ratio in self.shape.compress_ratios:
            w = self.layers[ratio]
            x = x + self.attention(w, x)
            x = x + self.moe(w, x)
        logits = F.linear(_rms(x, self.final_norm, self.shape.eps), self.lm_head)
        return logits.argmax(dim=-1)


def make_weights(
    shape: ModelShape, device: torch.device, gen: torch.Generator
) -> tuple[dict[int, LayerWeights], torch.Tensor, torch.Tensor]:
    """(one layer's weights per compress ratio, LM head [vocab, hidden], final norm weight)."""
    layers = {r: make_layer_weights(shape, r, device, gen) for r in sorted(set(shape.compress_ratios))}
    lm_head = _w(gen, device, shape.vocab, shape.hidden)
    return layers, lm_head, torch.ones(shape.hidden, dtype=torch.bfloat16, device=device)


def weight_bytes(shape: ModelShape, layers: dict[int, LayerWeights], lm_head: torch.Tensor, batch: int) -> float:
    """Bytes of weights one step streams at batch ``batch`` (touched experts only): the GEMMs' memory floor."""
    experts, _ = shape.active_experts(batch)
    per_type = {}
    for ratio, w in layers.items():
        total = 0
        for name, t in vars(w).items():
            if isinstance(t, torch.Tensor):
                total += (t[:experts] if name in ("w13", "w2") else t).numel() * t.element_size()
        per_type[ratio] = total
    return float(sum(per_type[r] for r in shape.compress_ratios) + lm_head.numel() * lm_head.element_size())
