"""Exploratory (CPU, ahead of time, not a timing): can the wide top-k launch hold B = 64 rows of 64k in one wave on a
132-SM GPU? Today each row is four 16-warp participants of 16,384 keys held in registers (256 programs), and a
participant takes 128 registers a thread (``TOPK_MAXNREG``), so an SM holds one: two waves, and B = 64 takes about
twice B = 32 (44.2 / 23.1 us at k = 512, topk_wide_ab-native-h200.json). One wave needs two participants an SM, i.e.
at most 64 registers a thread at 16 warps, about 2 registers a key.

This compiles with Triton 3.8 for sm_90 (registers and spilled bytes a thread from ``cuobjdump -res-usage``):

- the package's launch at B = 64, capacity 64k, k = 512 / 2048, under ``.maxnreg`` caps (255: what ptxas takes
  when allowed more than the 128 a thread that a 512-thread block's launch bound leaves);
- a participant alone (:func:`sparsemla.kernels.indexer.topk._select_split_registers`, the split protocol around
  it), with its parts removed to see which one holds the registers: ``radix`` (the merged radix passes only: the
  winners' compaction skipped), ``compact`` (the compaction scan only: the threshold read from memory), ``both``;
  also ``lean``: keys padded with the smallest order key instead of a ``valid`` mask, one key image kept.

    PYTHONPATH=src:. .venv/bin/python results/bench/explore/topk_regs_aot.py --out F.json
"""

import argparse
import json
import time

import torch
import triton
import triton.language as tl

from sparsemla.kernels import aot
from sparsemla.kernels import device as dev
from sparsemla.kernels.indexer import topk as T

SMALLEST = tl.constexpr(-2147483647 - 1)


@triton.jit
def _write_winners_lean(ukey, payload, uprefix, low, k_rem, gt_before, eq_before, idx_out_ptr):
    """:func:`T._write_winners` on sign-flipped keys ``ukey`` (padding keys are 0: below every real key)."""
    hi = (ukey ^ SMALLEST) >> low
    thr = (uprefix ^ SMALLEST) >> low
    gt = hi > thr
    eq = hi == thr
    both = gt.to(tl.int32) | (eq.to(tl.int32) << 16)
    before = tl.cumsum(both, axis=0) - both
    eq_rank = eq_before + (before >> 16)
    take = gt | (eq & (eq_rank < k_rem))
    slot = gt_before + (before & 0xFFFF) + tl.minimum(eq_rank, k_rem)
    T._scatter_store(idx_out_ptr + slot, payload, take)


@triton.jit
def _participant_kernel(
    src_ptr,  # fp32 [rows, n]
    ws_ptr,  # int32 workspace (laid out as the package's split launch)
    idx_ptr,  # int32 [rows, K]
    n,
    n_rows,
    n_part,  # participants per row: a runtime value, as in the package (a constexpr count changes the tile's layout)
    K: tl.constexpr,
    TILE: tl.constexpr,
    SPLITS: tl.constexpr,
    BITS: tl.constexpr,
    HIST_REGION: tl.constexpr,
    PART: tl.constexpr,  # 0 both, 1 radix only, 2 compaction only, 3 lean (both)
):
    pid = tl.program_id(0)
    i_r = (pid // n_part).to(tl.int64)
    part = pid % n_part
    rows64 = i_r * 0 + n_rows
    p_bar = ws_ptr + 1 + i_r
    p_hist = ws_ptr + 1 + rows64 + i_r * HIST_REGION
    p_cnt = ws_ptr + 1 + rows64 * (1 + HIST_REGION) + i_r * (SPLITS * 3)
    span = tl.cdiv(n, n_part)
    lo = part * span
    hi = tl.minimum(lo + span, n)
    zero = lo * 0
    if PART == 0:
        phase = T._select_split_registers(src_ptr + i_r * n, lo, hi, part, n_part, p_hist, p_cnt, p_bar,
                                          idx_ptr + i_r * K, K, TILE, SPLITS, BITS, HIST_REGION, 0)  # fmt: skip
    else:
        offs = lo + tl.arange(0, TILE)
        if PART == 3:
            bits = tl.load((src_ptr + i_r * n).to(tl.pointer_type(tl.int32)) + offs, mask=offs < hi, other=-1)
            x = tl.where(bits == SMALLEST, 0, bits)
            ukey = (x ^ ((x >> 31) & 0x7FFFFFFF)) ^ SMALLEST  # [TILE] padding -> 0
            valid = tl.full([TILE], 1, tl.int1)
        else:
            valid = offs < hi
            ukey = T._order_key(T._load_row(src_ptr + i_r * n + offs, valid, False)) ^ SMALLEST  # [TILE]
        if PART == 2:
            prefix = tl.load(p_hist + 5)
            low = zero + 8
            k_rem = tl.load(p_hist + 6)
            phase = zero
            n_gt = tl.load(p_hist + 7)
            n_eq = tl.load(p_hist + 8)
        else:
            prefix, low, k_rem, phase, n_gt, n_eq = T._radix_threshold(ukey, valid, zero, K, BITS, 2147483647, p_hist,
                                                                       p_bar, n_part, 0, True, zero, zero, zero, 0,
                                                                       False, True)  # fmt: skip
        phase += 1
        gt_before, eq_before = T._exchange_counts(n_gt, n_eq, p_cnt, part, p_bar, phase * n_part, SPLITS)
        if PART == 3:
            _write_winners_lean(ukey, offs, prefix, low, k_rem, gt_before, eq_before, idx_ptr + i_r * K)
        elif PART == 2:
            key = ukey ^ SMALLEST
            T._write_winners(key, valid, offs, prefix ^ SMALLEST, low, k_rem, gt_before, eq_before, idx_ptr + i_r * K)
    tl.store(ws_ptr + pid, phase)


def compiled(call) -> tuple[int, int]:  # noqa: ANN001
    records: list = []
    with aot.compile_only("sm_90", dev.target("sm_90"), "x", records):
        call()
    (r,) = records
    return r.registers, r.spilled


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    args = p.parse_args()
    rows = []

    def add(row: dict) -> None:
        print(json.dumps(row), flush=True)
        rows.append(row)

    for k in (512, 2048):
        for cap in (255, 128, 96, 64):
            T.TOPK_MAXNREG = cap
            case = aot._topk_case(64, 65536, k)
            t = time.time()
            regs, spilled = compiled(case)
            add(dict(what="package wide launch", k=k, rows=64, cols=65536, warps=T.WIDE_WARPS, tile=T.WIDE_SPAN,
                     maxnreg=cap, registers=regs, spilled=spilled, compile_s=round(time.time() - t, 1)))  # fmt: skip
    T.TOPK_MAXNREG = 128
    part_names = {0: "both", 1: "radix", 2: "compact", 3: "lean"}
    for tile, warps in ((16384, 16), (8192, 16), (16384, 8)):
        for part, name in part_names.items():
            for cap in (255, 128, 64) if tile == 16384 and warps == 16 else (255,):
                k = 2048

                def call(tile=tile, warps=warps, part=part, cap=cap, k=k) -> None:
                    src = torch.empty(64, 65536)
                    ws = torch.empty(1 << 20, dtype=torch.int32)
                    idx = torch.empty(64, k, dtype=torch.int32)
                    kw = dict(K=k, TILE=tile, SPLITS=65536 // tile, BITS=8, HIST_REGION=1024, PART=part)
                    _participant_kernel[(64 * 65536 // tile,)](src, ws, idx, 65536, 64, 65536 // tile, **kw,
                                                               num_warps=warps, maxnreg=cap)  # fmt: skip

                regs, spilled = compiled(call)
                add(dict(what=f"participant {name}", k=k, tile=tile, warps=warps, keys_per_thread=tile // (32 * warps),
                         maxnreg=cap, registers=regs, spilled=spilled))  # fmt: skip
    meta = dict(target="sm_90", triton=triton.__version__, torch=torch.__version__, note=__doc__.split("\n\n")[0])
    with open(args.out, "w") as f:
        json.dump(dict(meta=meta, rows=rows), f, indent=1)
        f.write("\n")


if __name__ == "__main__":
    main()
