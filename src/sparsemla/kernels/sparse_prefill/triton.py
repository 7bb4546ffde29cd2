"""Head-batched tensor-core Triton kernel for sparse-MLA prefill (DeepSeek-V3.2 DSA, bf16 KV, h_kv = 1).

One program = (query token, head block): all heads of a token share its index set, so each gathered KV tile
[BLOCK_N, d_qk] is loaded ONCE per program and feeds a [BLOCK_H, d_qk] x [d_qk, BLOCK_N] score dot (the 512 NoPE
columns, plus the 64 RoPE columns in a second small dot), an online softmax in base 2 with fp32 statistics, and a
[BLOCK_H, BLOCK_N] x [BLOCK_N, 512] P x V dot into one fp32 accumulator, V being the first 512 columns of the same
tile. The index row of the next tile is loaded one tile ahead. Programs are numbered head block fastest, so the head
blocks of one token (which gather the same rows) and neighbouring tokens (whose top-k sets overlap) run together and
share the gathered rows in L2. The grid is one-dimensional: s_q may exceed 65,535.

Portability: :func:`choose_config` picks the tile from :class:`~sparsemla.kernels.device.DeviceInfo`. With two
pipeline stages the gathered tiles land in shared memory (cp.async) and both dots read them there; wgmma targets also
stage q, mma.sync targets (sm_80..sm_89, sm_120) keep it in registers. The Hopper tile (221,184 B) does not fit the
101,376 B of sm_86/89/120, so those get 16-head x 64-token tiles (94,208 B), which were also the fastest mma.sync tile
measured; the aot cases (:mod:`sparsemla.kernels.aot`) check every target. No fp8 anywhere: sm_80/86 compile the same
code.

No host sync, no data-dependent allocation (CUDA-graph safe); no atomics, fixed reduction order (deterministic).
The Triton path never imports the fp32 reference; semantics are those documented in ``reference.py``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from sparsemla.kernels import device as dev

LOG2E = 1.4426950408889634
NOPE_DIM = 512  # the MLA latent: the NoPE part of a key and the whole value row
ROPE_DIM = 64


@dataclass(frozen=True)
class PrefillConfig:
    """Launch shape: block_h heads per program, block_n gathered tokens per tile, Triton's num_warps / num_stages."""

    block_h: int
    block_n: int
    num_warps: int
    num_stages: int = 2

    def __post_init__(self) -> None:
        for name in ("block_h", "block_n"):
            value = getattr(self, name)
            if value < 16 or value & (value - 1):
                raise ValueError(f"{name} must be a power of two >= 16 (an MMA tile side), got {value}")


def choose_config(info: dev.DeviceInfo, num_heads: int) -> PrefillConfig:
    """The launch configuration for ``num_heads`` query heads on ``info`` (every program is one token, so any
    prefill chunk fills the GPU and the token count does not enter).

    All of them use two pipeline stages: the gathered rows then go from global memory straight into shared memory
    (cp.async) instead of through registers, and both dots read that one buffer, which on mma.sync targets needs
    less shared memory than one stage and spills less everywhere.

    Measured on the H200 (Triton 3.6, s_q 8192, topk 2048, s_kv 32768; both code paths; benchmarks/prefill.py
    --configs sweep of 12 tiles):

    * mma.sync targets (sm_80, 86, 89, 120), any H, and every target at H <= 16: 16-head blocks, 64-token tiles,
      4 warps (94,208 B on every target; 56..200 B spilled per thread). sm_89 path: H=16 4.2 ms, H=128 32.3 ms;
      32 x 64 tiles (8 warps; over 101,376 B except on sm_80) 34.2 ms, 32 x 32 54.6 ms, 16 x 64 at 8 warps 49.5 ms.
      16 rows are also what mma.sync computes per instruction, and wgmma needs 64.
    * sm_90, H > 16: 64-head blocks, 64-token tiles, 8 warps (221,184 B, 216 B spilled): H=128 20.0 ms vs 25.8 ms
      for 32-token tiles and 32.3 ms for 16-head blocks.
    * sm_100, H > 16: 64 x 32 (213,552 B; 64 x 64 needs 352,816 B there). Not measured.

    Interpreter: small tiles (its dots run in fp32 on the CPU)."""
    if info is dev.INTERPRETER:
        return PrefillConfig(block_h=max(16, min(64, triton.next_power_of_2(num_heads))), block_n=16, num_warps=4)
    if num_heads <= 16 or not info.has_wgmma:
        return PrefillConfig(16, 64, 4, 2)
    return PrefillConfig(64, 64 if info.capability[0] == 9 else 32, 8, 2)


# --------------------------------------------------------------------------------------------------------------------
# kernel
# --------------------------------------------------------------------------------------------------------------------
@triton.jit
def _sparse_prefill_kernel(
    q, kv, idx, length, sink, out, max_logits, lse,
    H, s_kv, qk_scale,
    stride_qs, stride_qh, stride_qd, stride_kvs, stride_is,
    TOPK: tl.constexpr, D_ROPE: tl.constexpr, DV: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_N: tl.constexpr,
    HAS_LEN: tl.constexpr, HAS_SINK: tl.constexpr, DOT_F32: tl.constexpr, DOT_PREC: tl.constexpr,
):  # fmt: skip
    """Grid (s_q * cdiv(H, BLOCK_H),). qk_scale = sm_scale * log2(e). Writes out [s_q, H, DV] (fp32 under the
    interpreter, else bf16), max_logits and lse [s_q, H] fp32 in natural units (lse +inf, max_logits -inf and out 0
    for a token with no valid entry)."""
    pid = tl.program_id(0)
    n_hb = tl.cdiv(H, BLOCK_H)
    i_s = pid // n_hb
    i_hb = pid % n_hb
    o_h = i_hb * BLOCK_H + tl.arange(0, BLOCK_H)
    m_h = o_h < H
    o_d = tl.arange(0, 512)
    p_q = q + i_s.to(tl.int64) * stride_qs + o_h.to(tl.int64)[:, None] * stride_qh
    b_qn = tl.load(p_q + o_d[None, :] * stride_qd, mask=m_h[:, None], other=0.0)  # [BLOCK_H, 512] bf16 NoPE
    if DOT_F32:
        b_qn = b_qn.to(tl.float32)
    if D_ROPE > 0:
        o_r = tl.arange(0, D_ROPE)
        b_qr = tl.load(p_q + (512 + o_r)[None, :] * stride_qd, mask=m_h[:, None], other=0.0)  # [BLOCK_H, D_ROPE]
        if DOT_F32:
            b_qr = b_qr.to(tl.float32)

    n_valid = TOPK
    if HAS_LEN:
        n_valid = tl.minimum(tl.maximum(tl.load(length + i_s), 0), TOPK)
    n_tiles = tl.cdiv(n_valid, BLOCK_N)
    p_idx = idx + i_s.to(tl.int64) * stride_is
    o_n = tl.arange(0, BLOCK_N)

    acc = tl.zeros([BLOCK_H, 512], dtype=tl.float32)
    m_i = tl.full([BLOCK_H], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_H], dtype=tl.float32)
    b_idx_next = tl.load(p_idx + o_n, mask=o_n < n_valid, other=-1)  # [BLOCK_N] int32 rows of tile 0
    for i_t in range(0, n_tiles):
        b_idx = b_idx_next
        o_next = (i_t + 1) * BLOCK_N + o_n
        b_idx_next = tl.load(p_idx + o_next, mask=o_next < n_valid, other=-1)  # one tile ahead
        m_n = (b_idx >= 0) & (b_idx < s_kv)
        p_row = kv + tl.where(m_n, b_idx, 0).to(tl.int64) * stride_kvs  # [BLOCK_N] row pointers
        b_kn = tl.load(p_row[:, None] + o_d[None, :], mask=m_n[:, None], other=0.0)  # [BLOCK_N, 512] bf16 = V
        if DOT_F32:
            b_kn = b_kn.to(tl.float32)
        b_s = tl.dot(b_qn, tl.trans(b_kn), input_precision=DOT_PREC)  # [BLOCK_H, BLOCK_N]
        if D_ROPE > 0:
            b_kr = tl.load(p_row[:, None] + (512 + o_r)[None, :], mask=m_n[:, None], other=0.0)  # [BLOCK_N, D_ROPE]
            if DOT_F32:
                b_kr = b_kr.to(tl.float32)
            b_s = tl.dot(b_qr, tl.trans(b_kr), b_s, input_precision=DOT_PREC)  # [BLOCK_H, BLOCK_N]
        b_s = tl.where(m_n[None, :], b_s * qk_scale, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(b_s, 1))
        m_use = tl.where(m_new == float("-inf"), 0.0, m_new)  # heads with nothing valid yet stay at zero weight
        alpha = tl.math.exp2(m_i - m_use)
        b_p = tl.math.exp2(b_s - m_use[:, None])  # [BLOCK_H, BLOCK_N]
        l_i = l_i * alpha + tl.sum(b_p, 1)
        m_i = m_new
        if DOT_F32:
            b_pd = b_p
        else:
            b_pd = b_p.to(tl.bfloat16)
        acc = tl.dot(b_pd, b_kn, acc * alpha[:, None], input_precision=DOT_PREC)  # [BLOCK_H, 512]

    alive = l_i > 0.0
    lse2 = m_i + tl.math.log2(tl.where(alive, l_i, 1.0))
    scale = tl.where(alive, 1.0 / tl.where(alive, l_i, 1.0), 0.0)
    if HAS_SINK:  # exp(lse) / (exp(lse) + exp(sink)): +inf -> 0, -inf -> 1
        b_sink = tl.load(sink + o_h, mask=m_h, other=float("-inf")) * 1.4426950408889634
        scale = tl.where(alive, scale / (1.0 + tl.math.exp2(b_sink - lse2)), 0.0)
    o_sh = i_s.to(tl.int64) * H + o_h  # [BLOCK_H] row of max_logits / lse
    tl.store(max_logits + o_sh, tl.where(alive, m_i * 0.6931471805599453, float("-inf")), mask=m_h)
    tl.store(lse + o_sh, tl.where(alive, lse2 * 0.6931471805599453, float("inf")), mask=m_h)
    p_o = out + o_sh[:, None] * DV + o_d[None, :]
    b_o = acc * scale[:, None]
    tl.store(p_o, b_o.to(out.dtype.element_ty), mask=m_h[:, None] & (o_d < DV)[None, :])


# --------------------------------------------------------------------------------------------------------------------
# launcher
# --------------------------------------------------------------------------------------------------------------------
def _is_interpreted() -> bool:
    """True when this module's kernel was defined for Triton's CPU interpreter."""
    return dev.defined_interpreted(_sparse_prefill_kernel)


def sparse_prefill_fwd(
    q: torch.Tensor,
    kv: torch.Tensor,
    indices: torch.Tensor,
    sm_scale: float,
    d_v: int = NOPE_DIM,
    topk_length: torch.Tensor | None = None,
    attn_sink: torch.Tensor | None = None,
    *,
    config: PrefillConfig | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Launch the prefill kernel: ``(out [s_q, h_q, d_v] bf16, max_logits [s_q, h_q] fp32, lse [s_q, h_q] fp32)``.

    q [s_q, h_q, 576 or 512] bf16 (any strides); kv [s_kv, 1, d_qk] bf16 with unit stride along d_qk; indices
    [s_q, 1, topk] int32 (unit stride along topk); topk_length [s_q] int32 or None; attn_sink [h_q] fp32 or None.
    Conventions in ``reference.py``. Under Triton's CPU interpreter the dots run in fp32 with small tiles."""
    interpret = dev.check_interpreting(_is_interpreted(), "the kernel was built")
    if q.dim() != 3 or q.shape[-1] not in (NOPE_DIM, NOPE_DIM + ROPE_DIM) or q.dtype != torch.bfloat16:
        raise ValueError(f"q must be [s_q, h_q, 576 or 512] bf16, got {list(q.shape)} {q.dtype}")
    s_q, heads, d_qk = q.shape
    if kv.dim() != 3 or kv.shape[1] != 1 or kv.shape[2] != d_qk or kv.dtype != torch.bfloat16:
        raise ValueError(f"kv must be [s_kv, 1, {d_qk}] bf16 (h_kv = 1), got {list(kv.shape)} {kv.dtype}")
    if kv.stride(2) != 1:
        raise ValueError("kv must be contiguous along d_qk")
    if indices.dim() != 3 or tuple(indices.shape[:2]) != (s_q, 1) or indices.dtype != torch.int32:
        raise ValueError(f"indices must be [s_q={s_q}, 1, topk] int32, got {list(indices.shape)} {indices.dtype}")
    if indices.stride(2) != 1:
        raise ValueError("indices must be contiguous along topk")
    if not 0 < d_v <= NOPE_DIM:
        raise ValueError(f"d_v must be in 1..{NOPE_DIM}, got {d_v}")
    if topk_length is not None and (topk_length.shape != (s_q,) or topk_length.dtype not in (torch.int32, torch.int64)):
        raise ValueError(f"topk_length must be [s_q={s_q}] int32, got {list(topk_length.shape)} {topk_length.dtype}")
    if attn_sink is not None and (attn_sink.shape != (heads,) or attn_sink.dtype != torch.float32):
        raise ValueError(f"attn_sink must be [h_q={heads}] fp32, got {list(attn_sink.shape)} {attn_sink.dtype}")

    cfg = config or choose_config(dev.launch_info(q.device), heads)
    topk = indices.shape[2]
    # The interpreter truncates fp32 -> bf16 stores (Triton 3.8); there the kernel writes fp32 and torch rounds.
    out = torch.empty(s_q, heads, d_v, dtype=torch.float32 if interpret else torch.bfloat16, device=q.device)
    max_logits = torch.empty(s_q, heads, dtype=torch.float32, device=q.device)
    lse = torch.empty(s_q, heads, dtype=torch.float32, device=q.device)
    if s_q == 0:
        return out.to(torch.bfloat16), max_logits, lse
    dummy = indices  # any tensor for absent optional pointers (never dereferenced: constexpr-guarded)
    grid = (s_q * triton.cdiv(heads, cfg.block_h),)
    _sparse_prefill_kernel[grid](
        q, kv, indices, topk_length if topk_length is not None else dummy,
        attn_sink if attn_sink is not None else dummy, out, max_logits, lse,
        heads, kv.shape[0], float(sm_scale) * LOG2E,
        q.stride(0), q.stride(1), q.stride(2), kv.stride(0), indices.stride(0),
        TOPK=topk, D_ROPE=d_qk - NOPE_DIM, DV=d_v, BLOCK_H=cfg.block_h, BLOCK_N=cfg.block_n,
        HAS_LEN=topk_length is not None, HAS_SINK=attn_sink is not None, DOT_F32=interpret,
        DOT_PREC="ieee" if interpret else "tf32",
        num_warps=cfg.num_warps, num_stages=cfg.num_stages,
    )  # fmt: skip
    return out.to(torch.bfloat16), max_logits, lse


def flops_and_bytes(s_q: int, heads: int, topk: int, d_qk: int = NOPE_DIM + ROPE_DIM) -> tuple[float, float]:
    """(FLOPs, minimum HBM bytes if every gathered row came from DRAM once per token) of one call: QK over d_qk + PV
    over 512 (FlashMLA's count); per token its topk rows (bf16) and indices, q in, out, max_logits and lse out."""
    flops = 2.0 * s_q * heads * topk * (d_qk + NOPE_DIM)
    nbytes = s_q * topk * (d_qk * 2 + 4) + s_q * heads * (d_qk * 2 + NOPE_DIM * 2 + 8)
    return flops, float(nbytes)


__all__ = ["PrefillConfig", "choose_config", "flops_and_bytes", "sparse_prefill_fwd"]
