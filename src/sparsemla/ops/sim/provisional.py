"""The PROVISIONAL calibration: decode-step times derived from shared/notes/h200-baselines.md, not measured end to end.

It exists until the GPU decode-step benchmark (`make bench-step`) writes ``calibration/default.json``; the simulator
says "provisional" in `/server_info`, `/get_model_info` and its start-up line whenever it runs on it.
``python -m sparsemla.ops.sim.provisional`` rewrites ``calibration/provisional.json`` from this module.

Derivation (one H200 rank of an 8-GPU DP-attention + EP8 DeepSeek-V4-Flash deployment; B = that rank's decode batch,
every rank running the same B):

* Model: DeepSeek-V4-Flash, 43 layers (sglang 0.5.23 ``DeepSeekV4Config``). Layers with an indexer: 21 (assumed: the
  ratio-4 CSA layers alternate with ratio-128 HCA layers after two SWA-only layers; unverified). Every layer runs the
  sparse decode with the benchmarked shape (64 heads, 128 SWA + 512 compressed indices), an upper bound for the
  SWA-only layers. Server ``--context-length`` 65536, the indexer page-table width ("cap") of the baseline table.
* Attention, per layer, ``baseline``: sglang 0.5.23's per-head ``flash_mla_sparse_decode_triton`` times from the
  table (B = 1, 8, 32, 64, 128; independent of context, the kernel reads a fixed 640 rows per request).
  ``mma_decode``: no measurement of our kernel exists yet; FlashMLA's SM90 head-batched tensor-core kernel, measured
  in the same run on the same inputs, stands in for it. Its time is split into the main kernel and a combine kernel
  whose time is the bytes floor of merging the split-K partials (fp32 out + LSE per split, split count filling 132 SMs).
* Indexer, per indexer layer, ``baseline``: the torch fallback (its cost follows the cap, 64k) plus ``torch.topk(512)``
  over the cap, both from the table at B = 1 and 64, linear in B between and beyond. Its time is split among the kernels
  the seed profile attributes to it (FP32 SIMT GEMM 17.0 : direct copy 15.7 : elementwise 23.1).
  ``triton_indexer``: DeepGEMM's published H200 ``fp8_paged_mqa_logits`` times (B = 1: 8/9/11 us, B = 64:
  20/48/149 us at 4k/16k/64k; a kernel that reads each real key once, as ours does) stand in for our logits kernel,
  and ``torch.topk(512)`` over the real context from the table for our top-k kernel; linear in B and in context.
* Everything else (MoE, dense projections, LM head) is weight streaming at the measured 4.27 TB/s copy bandwidth:
  fp8 weights (1 byte/param) from the config (hidden 4096, 256 routed experts of 3 x 4096 x 2048, 6 per token, one
  shared expert, q_lora 1024, 64 heads x 512, o_lora 1024 in 8 groups, indexer 64 x 128) and a bf16 LM head
  (129280 x 4096). Under EP8 the rank holds 32 routed experts per layer; with 8B tokens in flight each is touched with
  probability 1 - (1 - 6/256)^(8B). Norms, RoPE, activations and the all-to-all are not modelled (the step benchmark
  measures them). The step time is the sum of the kernel times (no launch gaps).
* Prefill: compute at the measured 673 TFLOP/s bf16 (2 FLOPs per active parameter per token; fp8 would be faster, so
  this is conservative) plus one full weight stream per chunk of 8192 tokens.
"""

from __future__ import annotations

import math
from pathlib import Path

from sparsemla import flags
from sparsemla import variant as kernel_variant
from sparsemla.ops.sim.calibration import (
    PROVISIONAL_PATH,
    Calibration,
    KernelSpec,
    ModelSpec,
    PrefillModel,
    Provenance,
    Source,
    StateCalibration,
    write_calibration,
)

# -- measured anchors (h200-baselines.md, 2026-11-29; µs, per layer) -------------------------------------------------
BATCH_POINTS = (1, 8, 32, 64, 128)
CONTEXT_POINTS = (4096, 16384, 65536)
ATTN_PER_HEAD_US = {1: 710.0, 8: 997.0, 32: 3672.0, 64: 7264.0, 128: 14792.0}
ATTN_FLASHMLA_US = {1: 28.3, 8: 26.9, 32: 30.1, 64: 49.0, 128: 52.7}
# torch fallback logits at cap 64k, and torch.topk(512) over the cap: {B: (ctx 4k, ctx 64k)} / {B: (4k, 16k, 64k)}.
TORCH_LOGITS_US = {1: {4096: 175.0, 65536: 249.0}, 64: {4096: 5916.0, 16384: 5915.0, 65536: 5915.0}}
TORCH_TOPK_CAP_US = {1: {4096: 90.0, 65536: 69.0}, 64: {4096: 123.0, 16384: 121.0, 65536: 116.0}}
# stand-ins for ours: DeepGEMM published logits, torch.topk(512) over the real context.
FAST_LOGITS_US = {1: {4096: 8.0, 16384: 9.0, 65536: 11.0}, 64: {4096: 20.0, 16384: 48.0, 65536: 149.0}}
TOPK_CTX_US = {1: {4096: 28.0, 65536: 62.0}, 64: {4096: 37.0, 16384: 142.0, 65536: 118.0}}
COPY_BANDWIDTH = 4.27e12  # bytes/s, read + written
BF16_FLOPS = 673e12
NUM_SMS = 132

# -- DeepSeek-V4-Flash shape -----------------------------------------------------------------------------------------
MODEL_NAME = "deepseek-ai/DeepSeek-V4-Flash"
NUM_LAYERS = 43
INDEXER_LAYERS = 21
CONTEXT_LENGTH = 65536
HIDDEN, HEADS, HEAD_DIM, Q_LORA, O_LORA, O_GROUPS, KV_LORA = 4096, 64, 512, 1024, 1024, 8, 512
EXPERTS, EXPERTS_PER_TOKEN, MOE_INTER, EP = 256, 6, 2048, 8
INDEX_HEADS, INDEX_DIM, VOCAB = 64, 128, 129280
PREFILL_CHUNK = 8192

# Seed profile split of the torch indexer's logits time (percent of the step): sgemm, direct copy, two elementwise.
TORCH_INDEXER_SPLIT = {"sgemm": 17.0, "copy": 15.7, "elementwise": 23.1}

K_ATTN_BASE = KernelSpec("_tiled_sparse_decode_kernel", "attention", NUM_LAYERS)
K_ATTN_MMA = KernelSpec("_sparse_decode_kernel", "attention", NUM_LAYERS)
K_ATTN_COMBINE = KernelSpec("_sparse_decode_combine_kernel", "attention", NUM_LAYERS)
K_IDX_SGEMM = KernelSpec("cutlass_80_simt_sgemm_64x128_8x5_tn_align1", "gemm", INDEXER_LAYERS)
K_IDX_COPY = KernelSpec("direct_copy_kernel_cuda", "copy", INDEXER_LAYERS)
K_IDX_ELEMENTWISE = KernelSpec("elementwise_kernel", "elementwise", 2 * INDEXER_LAYERS)
K_IDX_TORCH_TOPK = KernelSpec("at::native::sbtopk::gatherTopK", "indexer", INDEXER_LAYERS)
K_IDX_LOGITS = KernelSpec("_indexer_logits_kernel", "indexer", INDEXER_LAYERS)
K_IDX_TOPK = KernelSpec("_indexer_topk_kernel", "indexer", INDEXER_LAYERS)
K_DENSE = KernelSpec("deep_gemm::sm90_fp8_gemm_1d2d_impl", "gemm", 7 * NUM_LAYERS)
K_MOE = KernelSpec("fused_moe_kernel", "gemm", 2 * NUM_LAYERS)
K_LM_HEAD = KernelSpec("nvjet_tst_192x128_64x4_1x2_h_bz_coopA_TNT", "gemm", 1)


def _linear(points: dict[int, float], x: float) -> float:
    """Piecewise-linear through sorted ``points``, extrapolating along the end segments."""
    xs = sorted(points)
    if len(xs) == 1:
        return points[xs[0]]
    i = 0 if x <= xs[0] else len(xs) - 2 if x >= xs[-1] else max(k for k in range(len(xs) - 1) if xs[k] <= x)
    x0, x1 = xs[i], xs[i + 1]
    return points[x0] + (points[x1] - points[x0]) * (x - x0) / (x1 - x0)


def _table(table: dict[int, dict[int, float]], batch: int, context: int) -> float:
    """A (B, ctx) anchor table: linear in context per measured B, then linear in B."""
    return max(_linear({b: _linear(row, context) for b, row in table.items()}, batch), 0.0)


def expert_bytes() -> float:
    return 3 * HIDDEN * MOE_INTER  # fp8, gate + up + down


def dense_layer_bytes(indexer: bool) -> float:
    """fp8 projection weights of one attention block (+ its shared expert), replicated on every DP-attention rank."""
    attn = HIDDEN * Q_LORA + Q_LORA * HEADS * HEAD_DIM + HIDDEN * KV_LORA
    attn += O_GROUPS * (HEADS // O_GROUPS * HEAD_DIM) * O_LORA + O_GROUPS * O_LORA * HIDDEN
    idx = Q_LORA * INDEX_HEADS * INDEX_DIM + HIDDEN * INDEX_HEADS if indexer else 0
    return attn + idx + expert_bytes()


def other_kernels_us(batch: int) -> dict[str, float]:
    """Weight-streaming time (µs) of the MoE, dense projections and LM head at rank batch ``batch``."""
    touched = 1.0 - (1.0 - EXPERTS_PER_TOKEN / EXPERTS) ** (EP * batch)
    moe = NUM_LAYERS * (EXPERTS // EP) * touched * expert_bytes()
    dense = INDEXER_LAYERS * dense_layer_bytes(True) + (NUM_LAYERS - INDEXER_LAYERS) * dense_layer_bytes(False)
    lm_head = VOCAB * HIDDEN * 2
    return {K_MOE.name: moe / COPY_BANDWIDTH * 1e6, K_DENSE.name: dense / COPY_BANDWIDTH * 1e6,
            K_LM_HEAD.name: lm_head / COPY_BANDWIDTH * 1e6}  # fmt: skip


def combine_us(batch: int) -> float:
    """Bytes floor of the split-K combine: read S partials (512 fp32 + LSE) per head, write bf16 output."""
    splits = max(1, math.ceil(NUM_SMS / (batch * 2)))
    moved = batch * HEADS * (splits * (HEAD_DIM + 1) * 4 + HEAD_DIM * 2)
    return moved / COPY_BANDWIDTH * 1e6


def state_kernels_us(variant: str, batch: int, context: int) -> dict[str, tuple[KernelSpec, float]]:
    """Per-step kernel times (µs, all calls) of one state at (batch, context)."""
    state = kernel_variant.parse(variant)
    mma, triton_idx = state.is_on(flags.SPARSEMLA_MMA_DECODE), state.is_on(flags.SPARSEMLA_TRITON_INDEXER)
    out: dict[str, tuple[KernelSpec, float]] = {}
    if mma:
        combine = combine_us(batch)
        main = max(_linear(ATTN_FLASHMLA_US, batch) - combine, 0.0)
        out[K_ATTN_MMA.name] = (K_ATTN_MMA, NUM_LAYERS * main)
        out[K_ATTN_COMBINE.name] = (K_ATTN_COMBINE, NUM_LAYERS * combine)
    else:
        out[K_ATTN_BASE.name] = (K_ATTN_BASE, NUM_LAYERS * _linear(ATTN_PER_HEAD_US, batch))
    if triton_idx:
        out[K_IDX_LOGITS.name] = (K_IDX_LOGITS, INDEXER_LAYERS * _table(FAST_LOGITS_US, batch, context))
        out[K_IDX_TOPK.name] = (K_IDX_TOPK, INDEXER_LAYERS * _table(TOPK_CTX_US, batch, context))
    else:
        logits = INDEXER_LAYERS * _table(TORCH_LOGITS_US, batch, context)
        total = sum(TORCH_INDEXER_SPLIT.values())
        for spec, key in ((K_IDX_SGEMM, "sgemm"), (K_IDX_COPY, "copy"), (K_IDX_ELEMENTWISE, "elementwise")):
            out[spec.name] = (spec, logits * TORCH_INDEXER_SPLIT[key] / total)
        out[K_IDX_TORCH_TOPK.name] = (K_IDX_TORCH_TOPK, INDEXER_LAYERS * _table(TORCH_TOPK_CAP_US, batch, context))
    for spec in (K_MOE, K_DENSE, K_LM_HEAD):
        out[spec.name] = (spec, other_kernels_us(batch)[spec.name])
    return out


def build_state(variant: str) -> StateCalibration:
    grids = [[state_kernels_us(variant, b, c) for c in CONTEXT_POINTS] for b in BATCH_POINTS]
    specs = [spec for spec, _ in grids[0][0].values()]
    kernel_us = {s.name: tuple(tuple(cell[s.name][1] for cell in row) for row in grids) for s in specs}
    step = tuple(tuple(sum(us for _, us in cell.values()) for cell in row) for row in grids)
    flag_labels = kernel_variant.parse(variant).flag_labels()
    return StateCalibration(variant, flag_labels, BATCH_POINTS, CONTEXT_POINTS, step, tuple(specs), kernel_us)


def prefill_model() -> PrefillModel:
    active = NUM_LAYERS * (EXPERTS_PER_TOKEN * expert_bytes()) + INDEXER_LAYERS * dense_layer_bytes(True)
    active += (NUM_LAYERS - INDEXER_LAYERS) * dense_layer_bytes(False) + VOCAB * HIDDEN  # params (1 byte each)
    full_stream_us = sum(other_kernels_us(10**6).values())
    return PrefillModel(fixed_us=full_stream_us, per_token_us=2 * active / BF16_FLOPS * 1e6, chunk_tokens=PREFILL_CHUNK)


def provisional_calibration() -> Calibration:
    """The provisional calibration (all four states) as a :class:`Calibration`."""
    provenance = Provenance(
        gpu="NVIDIA H200 (derived, not measured end to end)",
        date="2026-11-29",
        torch="2.11.0+cu130",
        triton="3.6.0",
        cuda="13.0",
        git_sha="n/a (derived from ../shared/notes/h200-baselines.md by src/sparsemla/ops/sim/provisional.py)",
        source="provisional: per-layer kernel anchors from h200-baselines.md + weight-streaming model",
        provisional=True,
        notes=" ".join((__doc__ or "").split()),
        kind="derived",
        method="derived by sparsemla.ops.sim.provisional: per-layer kernel anchors of one H200 run + a weight-stream "
        "model of the rest of the step (the notes give the derivation)",
        sources=(Source("shared/notes/h200-baselines.md", "n/a", "n/a", "per-layer kernel anchors, H200, 2026-11-29"),),
    )
    model = ModelSpec(MODEL_NAME, NUM_LAYERS, INDEXER_LAYERS, CONTEXT_LENGTH)
    return Calibration(model, prefill_model(), provenance, {v: build_state(v) for v in kernel_variant.VARIANTS})


def write_provisional(path: Path = PROVISIONAL_PATH) -> Path:
    cal = provisional_calibration()
    return write_calibration(path, model=cal.model, prefill=cal.prefill, provenance=cal.provenance, states=cal.states)


if __name__ == "__main__":
    print(write_provisional())
