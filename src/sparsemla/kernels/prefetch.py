"""L2 prefetch of gathered rows (``prefetch.global.L2``: PTX ISA 2.0, every target from sm_80; SASS ``CCTL.E.PF2``).

Why: the decode kernels gather their KV rows through indices, so the hardware sees no stream to run ahead of, and
the copies of the software pipeline (``num_stages``) are bounded by shared memory: sm_90's 64-head V3.2 tile holds 3
stages in 231,424 of its 232,448 B, the sm_86/89/120 tiles 1-2. A prefetch puts the rows of a tile a few iterations
ahead into L2 without taking shared memory or registers (it returns nothing), so the pipeline's own copies of that
tile later hit in L2. It changes no value: the kernels compute the same bits with and without it. Every address a
kernel prefetches lies in a row that the same program loads a few iterations later, and masked lanes are predicated
off (the PTX ISA does not say what a prefetch of an unmapped address does).
"""

import triton
import triton.language as tl

STRIDES = (32, 64, 128)  # bytes between a row's prefetch addresses: one per 32-byte sector .. one per 128-byte line


def check_prefetch(l2_prefetch: int, stride: int) -> None:
    """Raise ValueError unless ``l2_prefetch`` (tiles, 0: off) and ``stride`` (bytes) are a valid prefetch setting
    (``DecodeConfig`` / ``V32Config.l2_prefetch`` and ``prefetch_stride``)."""
    if l2_prefetch < 0 or stride not in STRIDES:
        raise ValueError(f"l2_prefetch must be >= 0 tiles and prefetch_stride one of {STRIDES} bytes, got "
                         f"{l2_prefetch} / {stride}")  # fmt: skip


def prefetch_ahead(l2_prefetch: int, num_stages: int, interpreted: bool) -> int:
    """The kernels' ``PREFETCH``: how many tiles past the current one iteration i prefetches, ``l2_prefetch`` tiles
    beyond the last one the software pipeline already copies (i + num_stages - 1); 0 (off) under the interpreter,
    which runs no PTX."""
    return 0 if interpreted or not l2_prefetch else l2_prefetch + num_stages - 1


# prefetch_l2's PTX, one address $1 where the int32 $2 is non-zero; the result $0 is a dummy (Gluon's sm_90 tile
# issues the same text)
PREFETCH_L2_PTX = tl.constexpr("{ .reg .pred p; setp.ne.b32 p, $2, 0; @p prefetch.global.L2 [$1]; mov.b32 $0, 0; }")


@triton.jit
def prefetch_l2(ptrs, mask):
    """Prefetch into L2 the line holding each of ``ptrs`` where ``mask`` (any shape; the asm's result is unused)."""
    return tl.inline_asm_elementwise(
        asm=PREFETCH_L2_PTX,
        constraints="=r,l,r",
        args=[ptrs, mask.to(tl.int32)],
        dtype=tl.int32,
        is_pure=False,
        pack=1,
    )


@triton.jit
def prefetch_rows_l2(base, o_row, m_row, ROW_BYTES: tl.constexpr, STRIDE: tl.constexpr):
    """Prefetch into L2 the ``ROW_BYTES``-byte rows at byte offsets ``o_row`` [N] (int64) of the uint8 pointer
    ``base``, where ``m_row`` [N]: one address every ``STRIDE`` bytes from each row's start and its last byte, so
    every ``STRIDE``-byte granule the row touches gets one (whatever the row's alignment)."""
    o_b, m_b = prefetch_offsets(ROW_BYTES, STRIDE)  # [NP]
    prefetch_l2(base + o_row[:, None] + o_b[None, :], m_row[:, None] & m_b[None, :])  # [N, NP]


@triton.jit
def prefetch_offsets(ROW_BYTES: tl.constexpr, STRIDE: tl.constexpr):
    """(byte offsets [NP] within a row, which of them are used [NP]): 0, STRIDE, 2 * STRIDE, ... and the row's last
    byte, NPF = ceil((ROW_BYTES - 1) / STRIDE) + 1 of them, NP the next power of two."""
    NPF: tl.constexpr = (ROW_BYTES - 1 + STRIDE - 1) // STRIDE + 1
    o_c = tl.arange(0, triton.next_power_of_2(NPF))
    return tl.minimum(o_c * STRIDE, ROW_BYTES - 1), o_c < NPF
