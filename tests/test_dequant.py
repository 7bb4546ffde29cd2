"""The integer e4m3 -> bf16 conversion's PTX (``dequant.E4M3_TO_BF16_PTX``), run on the CPU through a model of the
instructions it uses (``prmt.b32`` in its default mode, ``shl.b32``, ``and.b32``): every byte value in every position
of the 32-bit word gives the bf16 bits of its e4m3 value times 2^-120. The interpreter cannot run inline PTX, and the
GPU tier checks the kernels that use it against the conversion unit (test_sparse_decode_gpu.py)."""

from __future__ import annotations

import re

import pytest
import torch

from sparsemla.kernels.dequant import (
    E4M3_TO_BF16_PTX,
    E4M3_TO_F16_PTX,
    LIFT_LOG2,
    TWO_POW_8,
    TWO_POW_120,
    TWO_POW_120_LESS_LIFT,
    TWO_POW_LIFT,
)

MASK32 = 0xFFFFFFFF


def _prmt(a: int, b: int, sel: int) -> int:
    """PTX ``prmt.b32 d, a, b, sel`` (default mode): byte i of d is byte sel[i] & 7 of {b, a}; with bit 3 of the
    selector nibble set, that byte's sign bit replicated into all 8 bits."""
    src = ((b & MASK32) << 32) | (a & MASK32)
    out = 0
    for i in range(4):
        nib = (sel >> (4 * i)) & 0xF
        byte = (src >> (8 * (nib & 7))) & 0xFF
        if nib & 8:
            byte = 0xFF if byte & 0x80 else 0x00
        out |= byte << (8 * i)
    return out


def run_ptx(text: str, inputs: dict[str, int]) -> dict[str, int]:
    """Execute the asm block's instructions in order on 32-bit registers (operands: registers, ``$n`` or
    integer literals); only the three instructions the conversion uses are modelled (anything else fails)."""
    regs = dict(inputs)

    def val(tok: str) -> int:
        tok = tok.strip()
        return regs[tok] if tok in regs else int(tok, 0)

    for line in text.splitlines():
        line = line.strip().rstrip(";")
        if not line or line in "{}" or line.startswith(".reg"):
            continue
        op, rest = line.split(None, 1)
        dst, *srcs = (t.strip() for t in rest.split(","))
        if op == "prmt.b32":
            regs[dst] = _prmt(val(srcs[0]), val(srcs[1]), val(srcs[2]))
        elif op == "shl.b32":
            regs[dst] = (val(srcs[0]) << val(srcs[1])) & MASK32
        elif op == "and.b32":
            regs[dst] = val(srcs[0]) & val(srcs[1])
        else:
            raise AssertionError(f"instruction not modelled: {line}")
    return regs


def _bf16_bits(x: torch.Tensor) -> list[int]:
    return x.to(torch.bfloat16).view(torch.int16).to(torch.int32).bitwise_and(0xFFFF).tolist()


def test_the_model_knows_prmt():
    # PTX ISA example values: selector 0x3210 is the identity, 0x0123 reverses, nibble 8 replicates byte 0's sign
    assert _prmt(0x80FF0102, 0, 0x3210) == 0x80FF0102
    assert _prmt(0x80FF0102, 0, 0x0123) == 0x0201FF80
    assert _prmt(0x00000080, 0, 0x8888) == 0xFFFFFFFF
    assert _prmt(0x0000007F, 0x000000AB, 0x0004) == 0x7F7F7FAB


NAN_FREE = [b for b in range(256) if b & 0x7F != 0x7F]  # every e4m3 byte but the NaNs (0x7F, 0xFF)


def _check_every_byte(text: str, want: list[int], position: int, seed: int, rounds: int) -> None:
    """Run the conversion's PTX ``text`` on words holding each NaN-free byte at ``position`` (the other bytes random,
    ``rounds`` words a byte) and compare the byte's 16-bit lane with ``want`` (bits per NAN_FREE byte)."""
    assert set(re.findall(r"\$(\d)", text)) == {"0", "1", "2"}
    gen = torch.Generator().manual_seed(seed)
    for byte, bits in zip(NAN_FREE, want, strict=True):
        for _ in range(rounds):
            others = torch.randint(0, 256, (4,), generator=gen).tolist()
            others[position] = byte
            word = sum(b << (8 * i) for i, b in enumerate(others))
            regs = run_ptx(text, {"$2": word})
            out = regs["$0"] if position < 2 else regs["$1"]
            got = (out >> (16 * (position % 2))) & 0xFFFF
            assert got == bits, f"byte 0x{byte:02x} at {position}: 0x{got:04x}, want 0x{bits:04x}"


@pytest.mark.parametrize("position", [0, 1, 2, 3], ids=lambda p: f"byte{p}")
def test_every_byte_converts_exactly(position):
    """The e4m3 value times 2^-120 in bf16 (exact: subnormals and +-0 included), the other bytes of the word random;
    NaN bytes (0x7F, 0xFF) convert like their bit pattern (the caches hold none)."""
    values = torch.tensor(NAN_FREE, dtype=torch.uint8).view(torch.float8_e4m3fn).float() / float(TWO_POW_120.value)
    _check_every_byte(E4M3_TO_BF16_PTX.value, _bf16_bits(values), position, seed=position, rounds=1)


@pytest.mark.parametrize("position", [0, 1, 2, 3], ids=lambda p: f"byte{p}")
def test_every_byte_converts_exactly_to_f16(position):
    """E4M3_TO_F16_PTX (V32Config.f16's integer path): the e4m3 value times 2^-8 in f16, exactly (subnormals and +-0
    included), whatever the other bytes of the word hold (lane 0's shifted sign copies must not reach lane 1)."""
    values = torch.tensor(NAN_FREE, dtype=torch.uint8).view(torch.float8_e4m3fn).float() / float(TWO_POW_8.value)
    assert torch.equal(values.to(torch.float16).float(), values), "e4m3 / 2^8 is exact in f16"
    want = values.to(torch.float16).view(torch.int16).to(torch.int32).bitwise_and(0xFFFF).tolist()
    _check_every_byte(E4M3_TO_F16_PTX.value, want, position, seed=10 + position, rounds=3)


def _e4m3_values() -> torch.Tensor:
    """Every finite e4m3 value (NaN bytes excluded), fp64."""
    nan_free = [b for b in range(256) if b & 0x7F != 0x7F]
    return torch.tensor(nan_free, dtype=torch.uint8).view(torch.float8_e4m3fn).double()


def test_lift_constants_agree():
    assert float(TWO_POW_LIFT.value) == 2.0**LIFT_LOG2.value
    assert float(TWO_POW_120_LESS_LIFT.value) == 2.0 ** (120 - LIFT_LOG2.value)


def test_v4_lift_gives_the_same_bits_over_its_scale_range():
    """The V4 tile's lifted dequant -- (e4m3 * 2^-120 in bf16) * 2^(e - 7 - LIFT_LOG2) in one bf16 multiply -- is the
    dequantized value e4m3 * 2^(e - 127) times 2^-LIFT_LOG2 exactly, for every e4m3 value and every ue8m0 exponent of
    the documented range (16 .. 142); above it the factor overflows bf16."""
    x = _e4m3_values()
    bits = (x * 2.0**-120).to(torch.bfloat16)  # what e4m3_bits_to_bf16 returns (exact)
    lift = LIFT_LOG2.value
    for e in range(16, 143):
        factor = torch.tensor(2.0 ** (e - 7 - lift)).to(torch.bfloat16)
        got = (bits * factor).double() * 2.0**lift  # bf16 product (one rounding), then back to scale exactly
        want = (x * 2.0 ** (e - 127)).to(torch.bfloat16).double()
        assert torch.equal(got, want), f"ue8m0 {e}"
    assert torch.tensor(2.0 ** (143 - 7 - lift)).to(torch.bfloat16).isinf()


def test_v32_lift_gives_the_same_bits_for_fp32_scales():
    """The V3.2 tile's lifted dequant -- fp32(e4m3 * 2^-120) * fp32(scale * 2^(120 - LIFT_LOG2)), rounded once to
    bf16 -- is sglang's dequant (fp32 e4m3 * scale rounded to bf16) times 2^-LIFT_LOG2, for random fp32 scales from
    2^-100 to 2^15.9 and every e4m3 value."""
    x = _e4m3_values()
    gen = torch.Generator().manual_seed(3)
    scales = torch.exp2(torch.empty(400, dtype=torch.float64).uniform_(-100, 15.9, generator=gen)).float()
    lift = LIFT_LOG2.value
    bits = (x * 2.0**-120).float()  # e4m3_bits_to_bf16's value widened to fp32 (exact)
    for sc in scales:
        got = (bits * (sc * float(TWO_POW_120_LESS_LIFT.value))).to(torch.bfloat16).double() * 2.0**lift
        want = (x.float() * sc).to(torch.bfloat16).double()
        assert torch.equal(got, want), f"scale {sc.item()!r}"
