"""Exploratory (not in the package): issue #15's split top-k with each participant's span in SHARED memory, written in
Gluon, so that three participants fit an sm_90 SM (64 KB of keys each) and B = 64 x 64k runs in one wave of 256
participants where the package's register spans (16k keys need ~128 registers x 512 threads) take two.

Session 43's timeline (README.md) puts a package participant's wave at ~20 us: load 3.25, four global barriers ~7,
the search's own work ~4, the winners' compaction ~5.75. Here each of those steps is the same protocol as the
package's (start tickets, int32 atomics into the row's histogram, an arrival counter per row, the spans' winner counts
exchanged, winners at their position-order slots; sglang's order-invariant consumer, so no sort), over keys read back
from shared memory one CH-key chunk at a time instead of held in registers. What it asks: whether three resident
participants an SM (their barrier waits overlapping) beat two waves of one.

Scope of the prototype: rows of more than K positions split into SPLITS spans of at most SPAN (B = 64 x 64k: 4 of
16k), 8-bit digits (four passes at most, early stop), positions only (no page slots), every output checked against
torch.topk's set on the GPU. Shorter rows and the finish (sort, page slots) are the package's.

    PYTHONPATH=src:. .venv/bin/python results/bench/explore/topk_gluon_span.py build    # here: .gpu-cubins/gluon_span
    PYTHONPATH=/tmp/site:. python3 results/bench/explore/topk_gluon_span.py bench --cubins .gpu-cubins/gluon_span
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
import triton
import typer
from triton.experimental import gluon
from triton.experimental.gluon import language as gl

sys.path.insert(0, str(Path(__file__).resolve().parent))

_barrier = getattr(gl, "barrier", None) or gl.thread_barrier  # Triton 3.8's name; 3.6 (the GPU machine): thread_barrier

app = typer.Typer(add_completion=False)

NB: gl.constexpr = gl.constexpr(256)  # 8-bit digits
PASSES: gl.constexpr = gl.constexpr(4)
MIN_I32: gl.constexpr = gl.constexpr(-2147483648)
CAP = 65536


@gluon.jit
def _order_key(v):
    """int32 image of fp32 ``v`` whose signed order is the float order (-0.0 onto +0.0), as the package's."""
    x = v.to(gl.int32, bitcast=True)
    x = gl.where(x == MIN_I32, 0, x)
    return x ^ ((x >> 31) & 0x7FFFFFFF)


@gluon.jit
def _add(a, b):
    return a + b


@gluon.jit
def _arrive_and_wait(bar_ptr, target):
    _barrier()
    n = gl.atomic_add(bar_ptr, 1, sem="acq_rel", scope="gpu") + 1
    while n < target:
        n = gl.atomic_add(bar_ptr, 0, sem="acquire", scope="gpu")
    _barrier()


@gluon.jit
def _gluon_split_topk_kernel(
    logits_ptr,  # fp32 [rows, >= lengths]
    lens_ptr,  # int32 [rows]
    idx_ptr,  # int32 [rows, K]: positions, ascending, -1 padded
    pt_ptr,  # int32 [rows, max_pages] page table (WRITE_SLOTS)
    slot_ptr,  # int32 [rows, K]: page-table slots of the positions, -1 padded (WRITE_SLOTS)
    ws_ptr,  # int32 [1 + rows * (1 + PASSES * NB + 2 * SPLITS)], zero between launches
    stride_l,
    stride_idx,
    stride_pt,
    stride_slot,
    n_cols,
    n_rows,
    K: gl.constexpr,
    WRITE_SLOTS: gl.constexpr,
    PAGE_BITS: gl.constexpr,
    SPLITS: gl.constexpr,
    SPAN: gl.constexpr,
    CH: gl.constexpr,
    NUM_WARPS: gl.constexpr,
):
    NCH: gl.constexpr = SPAN // CH
    L1: gl.constexpr = gl.BlockedLayout([4], [32], [NUM_WARPS], [0])  # a chunk: 4 contiguous keys a thread
    LH: gl.constexpr = gl.BlockedLayout([1], [32], [NUM_WARPS], [0])  # a histogram: bins over the threads
    SL: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, [0])
    keys = gl.allocate_shared_memory(gl.int32, [NCH, CH], SL)  # the span's order keys, chunk by chunk

    ticket = gl.atomic_add(ws_ptr, 1, sem="relaxed", scope="gpu")
    if ticket == n_rows * SPLITS - 1:
        gl.atomic_xchg(ws_ptr, 0, sem="relaxed", scope="gpu")  # the last ticket: ready for the next launch
    i_r = (ticket // SPLITS).to(gl.int64)
    part = ticket % SPLITS
    n = gl.minimum(gl.maximum(gl.load(lens_ptr + i_r), 0), n_cols)
    n_part = gl.minimum(gl.maximum(gl.cdiv(n, SPAN), 1), SPLITS)  # a row of at most SPAN: one program
    o_k = gl.arange(0, K, layout=LH)
    if (n <= K) & (part == 0):  # no selection: every position, then -1
        pos = gl.where(o_k < n, o_k, -1)
        gl.store(idx_ptr + i_r * stride_idx + o_k, pos)
        if WRITE_SLOTS:
            page = gl.load(pt_ptr + i_r * stride_pt + (o_k >> PAGE_BITS), mask=o_k < n, other=0)
            gl.store(
                slot_ptr + i_r * stride_slot + o_k,
                gl.where(o_k < n, (page << PAGE_BITS) | (o_k & ((1 << PAGE_BITS) - 1)), -1),
            )
    if (n > K) & (part < n_part):
        rows64 = i_r * 0 + n_rows
        p_bar = ws_ptr + 1 + i_r
        p_hist = ws_ptr + 1 + rows64 + i_r * (PASSES * NB)
        p_cnt = ws_ptr + 1 + rows64 * (1 + PASSES * NB) + i_r * (2 * SPLITS)
        src = logits_ptr + i_r * stride_l
        p_idx = idx_ptr + i_r * stride_idx
        span = gl.cdiv(n, n_part)
        lo = part * span
        hi = gl.minimum(lo + span, n)
        o_c = gl.arange(0, CH, layout=L1)
        o_h = gl.arange(0, NB, layout=LH)
        for c in range(NCH):  # global -> order keys -> shared memory (a runtime loop: one chunk live at a time)
            offs = lo + c * CH + o_c
            v = gl.load(src + offs, mask=offs < hi, other=0.0)  # [CH] fp32
            keys.index(c).store(_order_key(v))
        _barrier()
        zero = n * 0
        prefix = zero  # sign-flipped (unsigned-order) bits of the threshold, digit by digit
        k_rem = zero + K
        low = zero + 32
        more = zero + 1
        phase = zero
        n_above = zero
        n_in = zero
        for p in gl.static_range(PASSES):
            top = 32 - 8 * p  # constexpr: p is a static index
            shift = top - 8
            if more != 0:
                hist = gl.zeros([NB], gl.int32, layout=LH)
                for c in range(NCH):
                    u = keys.index(c).load(L1) ^ MIN_I32  # [CH] sign flipped: digit order is key order
                    m = (lo + c * CH + o_c) < hi
                    if p > 0:
                        m = m & ((u >> top) == (prefix >> top))
                    hist += gl.histogram((u >> shift) & (NB - 1), NB, mask=m, layout=LH)
                own = hist
                gl.atomic_add(p_hist + p * NB + o_h, hist, mask=hist > 0, sem="relaxed", scope="gpu")
                phase += 1
                _arrive_and_wait(p_bar, phase * n_part)
                hist = gl.load(p_hist + p * NB + o_h, cache_modifier=".cg")  # [NB] the row's
                ge = gl.associative_scan(hist, 0, _add, reverse=True)  # keys at or above each bin
                d = gl.sum((ge >= k_rem).to(gl.int32), axis=0) - 1
                above = gl.sum(gl.where(o_h > d, hist, 0), axis=0)
                in_bin = gl.sum(gl.where(o_h == d, hist, 0), axis=0)
                n_above += gl.sum(gl.where(o_h > d, own, 0), axis=0)
                n_in = gl.sum(gl.where(o_h == d, own, 0), axis=0)
                k_rem -= above
                prefix = prefix | (d << shift)
                low = zero + shift
                more = (in_bin != k_rem).to(gl.int32)
        # the spans' counts above / at the threshold, exchanged: where this span's winners start
        gl.store(p_cnt + part * 2, n_above)
        gl.store(p_cnt + part * 2 + 1, n_in)
        phase += 1
        _arrive_and_wait(p_bar, phase * n_part)
        o_s = gl.arange(0, SPLITS, layout=LH)
        earlier = o_s < part
        gt_before = gl.sum(gl.load(p_cnt + o_s * 2, mask=earlier, other=0, cache_modifier=".cg"), axis=0)
        eq_before = gl.sum(gl.load(p_cnt + o_s * 2 + 1, mask=earlier, other=0, cache_modifier=".cg"), axis=0)
        thr = (prefix ^ MIN_I32) >> low  # signed order-key form
        for c in range(NCH):  # the winners, chunk by chunk, at their position-order slots
            offs = lo + c * CH + o_c
            valid = offs < hi
            hk = keys.index(c).load(L1) >> low
            gt = (valid & (hk > thr)).to(gl.int32)
            eq = (valid & (hk == thr)).to(gl.int32)
            both = gt | (eq << 16)
            before = gl.associative_scan(both, 0, _add) - both
            eq_rank = eq_before + (before >> 16)
            take = (gt != 0) | ((eq != 0) & (eq_rank < k_rem))
            slot = gt_before + (before & 0xFFFF) + gl.minimum(eq_rank, k_rem)
            gl.store(p_idx + slot, offs, mask=take)
            gt_before += gl.sum(gt, axis=0)
            eq_before += gl.sum(eq, axis=0)
        _barrier()
        arrived = gl.atomic_add(p_bar, 1, sem="acq_rel", scope="gpu") + 1
        if arrived == (phase + 1) * n_part:  # the last participant: every other one is past the row's workspace
            gl.store(p_hist + gl.arange(0, PASSES * NB, layout=LH), gl.zeros([PASSES * NB], gl.int32, layout=LH))
            gl.store(p_cnt + o_s, gl.zeros([SPLITS], gl.int32, layout=LH))
            gl.store(p_cnt + SPLITS + o_s, gl.zeros([SPLITS], gl.int32, layout=LH))
            gl.atomic_xchg(p_bar, 0, sem="relaxed", scope="gpu")
            if WRITE_SLOTS:  # every participant's winners are in (their stores came before their arrival)
                pos = gl.load(p_idx + o_k, cache_modifier=".cg")  # [K] positions, ascending
                page = gl.load(pt_ptr + i_r * stride_pt + (pos >> PAGE_BITS))
                gl.store(slot_ptr + i_r * stride_slot + o_k, (page << PAGE_BITS) | (pos & ((1 << PAGE_BITS) - 1)))


_WS: dict = {}


def gluon_split_topk(logits: torch.Tensor, lens: torch.Tensor, k: int, out: torch.Tensor, splits: int = 4,
                     span: int = 16384, ch: int = 2048, num_warps: int = 8, page_table: torch.Tensor | None = None,
                     out_slots: torch.Tensor | None = None, page_size: int = 64) -> torch.Tensor:  # fmt: skip
    """Positions [rows, k] of each row's top-``k`` among ``t < lens[row]`` in ascending order, -1 padded (ties at the
    threshold to the smaller positions); with ``page_table`` also ``out_slots``, as the package's
    ``indexer_topk_fwd(sorted=False)``. Rows of at most ``span`` positions take one program."""
    rows = logits.shape[0]
    need = 1 + rows * (1 + 4 * 256 + 2 * splits)
    ws = _WS.get(logits.device)
    if ws is None or ws.numel() < need:
        ws = _WS[logits.device] = torch.zeros(need, dtype=torch.int32, device=logits.device)
    slots = out_slots if page_table is not None else out
    pt = page_table if page_table is not None else lens
    _gluon_split_topk_kernel[(rows * splits,)](
        logits, lens, out, pt, slots, ws, logits.stride(0), out.stride(0), pt.stride(0), slots.stride(0),
        logits.shape[1], rows, K=k, WRITE_SLOTS=page_table is not None, PAGE_BITS=page_size.bit_length() - 1,
        SPLITS=splits, SPAN=span, CH=ch, NUM_WARPS=num_warps, num_warps=num_warps,
    )  # fmt: skip
    return out


SHAPES = "64x65536,32x65536,128x65536"  # the build adds CHECK_ROWS x 65536 (check)
VARIANTS = {"w8": dict(num_warps=8), "w4": dict(num_warps=4), "w8_ch4k": dict(num_warps=8, ch=4096)}


@app.command()
def build(out: Path = Path(".gpu-cubins/gluon_span"), shapes: str = SHAPES, ks: str = "512,2048") -> None:
    """Compile every launch of ``bench`` for sm_90 with this Triton (3.8) into OUT (benchmarks/prod_cubins.py)."""
    from benchmarks import prod_cubins

    def workload() -> None:
        for shape in [*shapes.split(","), f"{CHECK_ROWS}x{CAP}"]:
            b, _ctx = (int(x) for x in shape.split("x"))
            for k in (int(x) for x in ks.split(",")):
                for kw in VARIANTS.values():
                    o = torch.empty(b, k, dtype=torch.int32)
                    gluon_split_topk(torch.empty(b, CAP), torch.empty(b, dtype=torch.int32), k, o,
                                     page_table=torch.zeros(b, CAP // 64, dtype=torch.int32),
                                     out_slots=torch.empty_like(o), **kw)  # fmt: skip

    added = prod_cubins.build(workload, out, "native")
    print(f"{len(added)} cubins added to {out} (Triton {triton.__version__})")


@app.command()
def bench(cubins: Path = Path(".gpu-cubins/gluon_span"), shapes: str = SHAPES, ks: str = "512,2048", code: str = "",
          out: Path = Path("")) -> None:  # fmt: skip
    """GPU: the prototype (3.8 cubins) against the package's launcher (its Triton 3.8 cubins when ``--pkg-cubins``
    exist, else the GPU machine's Triton), every output checked against torch.topk's set."""
    from topk_filter_sweep import DEV, graph_us, same_set

    from benchmarks import prod_cubins
    from benchmarks.indexer import gpu_indexer_cache, make_case
    from sparsemla.kernels.indexer import triton as tri

    print(
        "registers / shared per variant: see the manifest; the package's launcher on the same H100 today: "
        "64 x 64k 42.28 / 42.63 us (k = 512 / 2048), topk_wpf_ab-native-h100-154e919.json",
        flush=True,
    )
    gen = torch.Generator(device=DEV).manual_seed(0)
    kv = gpu_indexer_cache(128 * CAP // 64 + 64, DEV, gen)
    rows = []
    for shape in shapes.split(","):
        b, ctx = (int(x) for x in shape.split("x"))
        case = make_case(b, ctx, CAP, kv, gen)
        logits = tri.indexer_logits_fwd(case.q, case.kv, case.weights, case.seq_lens, case.page_table, CAP, True)
        for k in (int(x) for x in ks.split(",")):
            for name, kw in VARIANTS.items():
                o = torch.full((b, k), -7, dtype=torch.int32, device=DEV)
                slots = torch.full_like(o, -7)
                row = dict(B=b, ctx=ctx, k=k, variant=name)
                try:
                    with prod_cubins.replay(cubins, {"_gluon_split_topk_kernel"}):

                        def fn(o=o, k=k, kw=kw, x=logits, c=case, sl=slots) -> None:  # noqa: ANN001
                            gluon_split_topk(x, c.seq_lens, k, o, page_table=c.page_table, out_slots=sl, **kw)

                        fn()
                        torch.cuda.synchronize()
                        row.update(exact=same_set(o, logits, case.seq_lens, k), us_graph20=round(graph_us(fn, 20), 2))
                except Exception as exc:  # noqa: BLE001 - a variant that fails is a row
                    row.update(error=repr(exc)[:300])
                print(json.dumps(row), flush=True)
                rows.append(row)
    if str(out):
        meta = dict(gpu=torch.cuda.get_device_name(), torch=torch.__version__, triton=triton.__version__, code=code,
                    kernel=f"Triton 3.8 cubins from {cubins}")  # fmt: skip
        out.write_text(json.dumps(dict(meta=meta, rows=rows), indent=1) + "\n")


CHECK_ROWS = 32  # the check's launch (a row count the build also compiles for: the same specialisation)


def check_rows(k: int, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """[CHECK_ROWS, CAP] fp32 rows and their lengths: 0, 1, k - 1, k, k + 1, around one program's span (16k) and
    two, 64k; random, all equal, all -inf, many ties (half steps), tiny values, and a few larger keys in a flat row."""
    lens = [0, 1, k - 1, k, k + 1, 3000, 4096, 16383, 16384, 16385, 20000, 40000, 65535, 65536]
    lens += [65536] * 6 + [16384, 30000] * 6
    rows = torch.randn(CHECK_ROWS, CAP, generator=generator)
    rows[14] = 0.75  # all equal
    rows[15] = float("-inf")
    rows[16] = torch.round(torch.randn(CAP, generator=generator) * 2) / 2  # many ties
    rows[17] = torch.randn(CAP, generator=generator) * 1e-30
    rows[18] = 0.5
    rows[18, torch.randperm(CAP, generator=generator)[:100]] = 2.0  # fewer larger keys than k
    rows[19] = -torch.rand(CAP, generator=generator)
    return rows, torch.tensor(lens[:CHECK_ROWS], dtype=torch.int32)


def reference(rows: torch.Tensor, lens: torch.Tensor, k: int, table: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Positions (ascending, -1 padded) and page slots of each row's top-k, ties to the smaller positions."""
    pos = torch.full((rows.shape[0], k), -1, dtype=torch.int64)
    for i in range(rows.shape[0]):
        n = int(lens[i])
        top = torch.sort(rows[i, :n], descending=True, stable=True).indices[: min(k, n)].sort().values
        pos[i, : top.numel()] = top
    page = table.gather(1, (pos.clamp(min=0) >> 6)).long()
    slots = torch.where(pos >= 0, (page << 6) | (pos & 63), -1)
    return pos.to(torch.int32), slots.to(torch.int32)


@app.command()
def check(cubins: Path = Path(".gpu-cubins/gluon_span"), ks: str = "512,2048", out: Path = Path("")) -> None:
    """GPU: the prototype's positions and page slots equal to the reference on the corner-case rows of
    ``check_rows`` (outputs poisoned with -7 first; each launch twice, the second on the workspace the first left)."""
    from benchmarks import prod_cubins

    gen = torch.Generator().manual_seed(0)
    results = []
    for k in (int(x) for x in ks.split(",")):
        rows, lens = check_rows(k, gen)
        table = torch.randint(0, 1 << 20, (CHECK_ROWS, CAP // 64), generator=gen, dtype=torch.int32)
        ref_pos, ref_slots = reference(rows, lens, k, table)
        for name, kw in VARIANTS.items():
            for attempt in range(2):
                o = torch.full((CHECK_ROWS, k), -7, dtype=torch.int32, device="cuda")
                sl = torch.full_like(o, -7)
                with prod_cubins.replay(cubins, {"_gluon_split_topk_kernel"}):
                    gluon_split_topk(rows.cuda(), lens.cuda(), k, o, page_table=table.cuda(), out_slots=sl, **kw)
                torch.cuda.synchronize()
                same = (o.cpu() == ref_pos).all(dim=1) & (sl.cpu() == ref_slots).all(dim=1)
                bad = [i for i in range(CHECK_ROWS) if not bool(same[i])]
                r = dict(k=k, variant=name, launch=attempt, ok=not bad, bad_rows=[(i, int(lens[i])) for i in bad])
                print(json.dumps(r), flush=True)
                results.append(r)
    if str(out):
        out.write_text(json.dumps(dict(gpu=torch.cuda.get_device_name(), rows=results), indent=1) + "\n")


if __name__ == "__main__":
    app()
