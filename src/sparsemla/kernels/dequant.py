"""Integer e4m3 -> bf16 conversion shared by the decode and indexer kernels (a Triton device function).

Triton has no e4m3 type on sm_80/86 (``tl.float8e4nv`` does not compile there), and where it has one the conversion
runs on the 16-per-clock conversion unit. This path reads the raw bytes as uint8 and builds the bf16 bits with
full-rate integer instructions, so it compiles on every target and is bit-identical to the fp8 -> bf16 conversion.
"""

from __future__ import annotations

import triton
import triton.language as tl

# e4m3_bits_to_bf16 returns the value times 2^-120; multiply by this (exact in bf16) to get the value itself.
TWO_POW_120 = tl.constexpr(1.329227995784916e36)
# The decode kernels' lift (DecodeConfig.q_lift, V32Config.q_lift): instead of restoring the 2^-120 with a multiply per
# element of every gathered tile, they fold 2^(120 - LIFT_LOG2) into the tile's scale multiply (one multiply per
# element, not two), so the tile's NoPE comes out times 2^-LIFT_LOG2; q's NoPE columns are scaled by 2^LIFT_LOG2 once
# per program (the products q * k are unchanged) and the output's NoPE columns by 2^LIFT_LOG2 at the end. All powers
# of two, so the results are the same bits while nothing leaves fp32's / bf16's normal range: |q| < 2^119, V4 ue8m0
# scales 2^-111 .. 2^15 (exponents 16 .. 142; real caches sit near 2^-8 .. 2^0), V3.2 fp32 scales below 2^16, and
# accumulated outputs above 2^-118 in magnitude. The lift is small on purpose: with 2^60 the accumulator's NoPE
# columns sat 60 binades lower, and outputs below 2^-66 flushed to zero in the tensor cores (the H200 showed it:
# results/bench/explore/lift_diag-*-h200-2026-12-05.txt).
LIFT_LOG2 = tl.constexpr(8)
TWO_POW_LIFT = tl.constexpr(256.0)  # 2 ** LIFT_LOG2
TWO_POW_120_LESS_LIFT = tl.constexpr(5.192296858534828e33)  # 2 ** (120 - LIFT_LOG2): V3.2's fp32 scale factor


# e4m3_bits_to_bf16's PTX, four bytes $2 -> two bf16x2 $0 (bytes 0, 1) and $1 (bytes 2, 3). prmt spreads the bytes
# into 16-bit lanes whose high byte replicates the byte's sign bit (selector nibbles 8..B), so one shift by 4 puts the
# 7 exponent/mantissa bits at bf16's bits 4..10 and a copy of the sign at bit 15, and one mask clears the rest
# (tests/test_dequant.py runs this text on every byte through a model of the three instructions).
E4M3_TO_BF16_PTX = tl.constexpr("""{
        .reg .b32 t0, t1;
        prmt.b32 t0, $2, 0, 0x9180;
        prmt.b32 t1, $2, 0, 0xB3A2;
        shl.b32 t0, t0, 4;
        shl.b32 t1, t1, 4;
        and.b32 $0, t0, 0x87F087F0;
        and.b32 $1, t1, 0x87F087F0;
        }""")


@triton.jit
def e4m3_bits_to_bf16(x):
    """uint8 e4m3 bytes -> bf16 equal to the e4m3 value times 2^-120, exactly (subnormals included: both formats put
    the exponent field right below the sign, so moving the 7 exponent/mantissa bits up by 4 and the sign up by 8
    rescales every value by 2^(127 - 7)). Integer ops only (PRMT/SHL/AND, full rate; PTX ISA 7.0, every target from
    sm_80): :data:`E4M3_TO_BF16_PTX`, four bytes per asm block."""
    return tl.inline_asm_elementwise(
        asm=E4M3_TO_BF16_PTX,
        constraints="=r,=r,r",
        args=[x],
        dtype=tl.bfloat16,
        is_pure=True,
        pack=4,
    )


# e4m3_bits_to_f16's PTX: the same spread, the 7 exponent/mantissa bits moved up by 7 to f16's bits 7..13 (its
# exponent field's top bit stays 0) and the replicated sign to bit 15; the shift carries lane 0's sign copies into
# lane 1's bits 0..6, which the mask clears with the rest.
E4M3_TO_F16_PTX = tl.constexpr("""{
        .reg .b32 t0, t1;
        prmt.b32 t0, $2, 0, 0x9180;
        prmt.b32 t1, $2, 0, 0xB3A2;
        shl.b32 t0, t0, 7;
        shl.b32 t1, t1, 7;
        and.b32 $0, t0, 0xBF80BF80;
        and.b32 $1, t1, 0xBF80BF80;
        }""")
TWO_POW_8 = tl.constexpr(256.0)  # e4m3_bits_to_f16's factor: its result times this is the e4m3 value


@triton.jit
def e4m3_bits_to_f16(x):
    """uint8 e4m3 bytes -> f16 equal to the e4m3 value times 2^-8, exactly (f16's exponent bias is 15 against e4m3's
    7, and its subnormals reach 2^-24, below e4m3's 2^-9 times 2^-8). Integer ops only, every target from sm_80:
    :data:`E4M3_TO_F16_PTX`, four bytes per asm block."""
    return tl.inline_asm_elementwise(
        asm=E4M3_TO_F16_PTX,
        constraints="=r,=r,r",
        args=[x],
        dtype=tl.float16,
        is_pure=True,
        pack=4,
    )


@triton.jit
def e4m3_bits_to_bf16_value(x):
    """uint8 e4m3 bytes -> their bf16 value (exact: every e4m3 value is a bf16 value)."""
    two_120 = tl.full([1], TWO_POW_120, tl.bfloat16)
    return e4m3_bits_to_bf16(x) * two_120


@triton.jit
def opaque_bf16(x):
    """``x`` unchanged (bf16), through a register move Triton cannot look through.

    Why: for mma.sync (sm_80..sm_89, sm_120) Triton sizes a dot operand's per-thread K run (``kWidth``) from the
    narrowest element type it finds walking back through elementwise ops; a tile dequantized from uint8 bytes gets
    kWidth 4 instead of bf16's 2. Both operands then take that layout, so they are read from shared memory with
    64-bit loads instead of ``ldmatrix`` and re-packed with register moves before every MMA. A non-pure inline asm
    ends the walk at this bf16 value. wgmma reads its operands from shared memory and does not need it."""
    return tl.inline_asm_elementwise(
        asm="mov.b32 $0, $1;", constraints="=r,r", args=[x], dtype=tl.bfloat16, is_pure=False, pack=2
    )


@triton.jit
def opaque_f16(x):
    """:func:`opaque_bf16` for an f16 ``x`` (the f16 tiles' operand layout)."""
    return tl.inline_asm_elementwise(
        asm="mov.b32 $0, $1;", constraints="=r,r", args=[x], dtype=tl.float16, is_pure=False, pack=2
    )
