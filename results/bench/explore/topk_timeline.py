"""Exploratory (not a benchmark claim): where a split top-k participant's time goes. A copy of the package's
kernels/indexer/topk.py, generated here with timestamps added (``%globaltimer`` and ``%clock64``, one scalar store
each), records per program: its start, each radix pass's "histogram merged in" (arrival) and "threshold bin known"
(after the barrier), the span-count exchange's arrival and return, the winners written, the final arrival and, for
the row's last participant, the end of the finish (sort, page slots). One traced launch per shape after a warm-up,
real indexer logits, cap 65536, position order with page slots (what the sglang hooks call); every output checked
against the torch.topk set. The graph-replay times of the copy and the package are printed beside the traces, so
the stamps' own cost shows.

    PYTHONPATH=src:. .venv/bin/python results/bench/explore/topk_timeline.py --build-cubins .gpu-cubins/timeline
    PYTHONPATH=/tmp/site:. python3 results/bench/explore/topk_timeline.py --cubins .gpu-cubins/timeline --out F.json
"""

import argparse
import contextlib
import importlib.util
import json
import sys
import tempfile
from pathlib import Path

import torch
import triton

ROOT = Path(__file__).resolve().parents[3]
SRC = ROOT / "src/sparsemla/kernels/indexer/topk.py"
CAP = 65536
SLOTS = 64  # int64 per program: [0, 32) globaltimer (ns), [32, 64) clock64; slot 30/31 hold smid and (row, part)
# stamp slots
START, WINNERS, FINAL, FINISH, EXCH_ARRIVE, EXCH_DONE = 0, 11, 12, 13, 9, 10
SCANNED, LOADED = 14, 15


def pass_slots(p: int) -> tuple[int, int]:
    """(arrival, threshold known) slots of radix pass ``p``."""
    return 1 + 2 * p, 2 + 2 * p


STAMP = '''
STAMP_GT = tl.constexpr("mov.u64 $0, %globaltimer;")
STAMP_CK = tl.constexpr("mov.u64 $0, %clock64;")


@triton.jit
def _stamp(trace, SLOT: tl.constexpr, after):
    """globaltimer at trace[SLOT], clock64 at trace[32 + SLOT], read once ``after`` (int32 scalar) is available."""
    a = after.to(tl.int32)
    gt = tl.inline_asm_elementwise(STAMP_GT, "=l,r", [a], dtype=tl.int64, is_pure=False, pack=1)
    ck = tl.inline_asm_elementwise(STAMP_CK, "=l,r", [a], dtype=tl.int64, is_pure=False, pack=1)
    tl.store(trace + SLOT, gt)
    tl.store(trace + 32 + SLOT, ck)


@triton.jit
def _arrive_and_wait('''

# (anchor, replacement): each anchor must occur exactly once in topk.py
EDITS = [
    ("\n\n@triton.jit\ndef _arrive_and_wait(", STAMP),
    (
        "def _merge_histogram(hist, hist_ptr, bar_ptr, target, NB: tl.constexpr):",
        "def _merge_histogram(trace, hist, hist_ptr, bar_ptr, target, NB: tl.constexpr, SLOT: tl.constexpr):",
    ),
    (
        '    tl.atomic_add(hist_ptr + o_bin, hist, mask=hist > 0, sem="relaxed", scope="gpu")\n',
        '    tl.atomic_add(hist_ptr + o_bin, hist, mask=hist > 0, sem="relaxed", scope="gpu")\n'
        "    tl.debug_barrier()\n    _stamp(trace, SLOT, target)\n",
    ),
    ("def _radix_threshold(\n    ukey,", "def _radix_threshold(\n    trace,\n    ukey,"),
    (
        "hist = _merge_histogram(hist, hist_ptr + p * NB, bar_ptr, phase * n_part, NB)",
        "hist = _merge_histogram(trace, hist, hist_ptr + p * NB, bar_ptr, phase * n_part, NB, 1 + 2 * p)",
    ),
    (
        "            d, above, in_bin = _pick_bin(hist, k_rem, BIG)\n",
        "            d, above, in_bin = _pick_bin(hist, k_rem, BIG)\n            if MERGE:\n"
        "                _stamp(trace, 2 + 2 * p, d)\n",
    ),
    (
        "prefix, low, k_rem, _, _, _ = _radix_threshold(ukey, valid, zero, K, BITS, ROW + 1,",
        "prefix, low, k_rem, _, _, _ = _radix_threshold(zero, ukey, valid, zero, K, BITS, ROW + 1,",
    ),
    (
        "prefix, low, k_rem, _, _, _ = _radix_threshold(zero, zero, zero, K, BITS, 2147483647, zero,",
        "prefix, low, k_rem, _, _, _ = _radix_threshold(zero, zero, zero, zero, K, BITS, 2147483647, zero,",
    ),
    ("def _select_split(\n    src_ptr,", "def _select_split(\n    trace,\n    src_ptr,"),
    (
        "prefix, low, k_rem, phase, n_gt, n_eq = _radix_threshold(zero, zero, zero, K, BITS, 2147483647, hist_ptr,",
        "prefix, low, k_rem, phase, n_gt, n_eq = _radix_threshold(trace, zero, zero, zero, K, BITS, 2147483647, "
        "hist_ptr,",
    ),
    ("def _select_split_registers(\n    src_ptr,", "def _select_split_registers(\n    trace,\n    src_ptr,"),
    (
        "prefix, low, k_rem, phase, n_gt, n_eq = _radix_threshold(ukey, valid, zero, K, BITS, 2147483647, hist_ptr,",
        "prefix, low, k_rem, phase, n_gt, n_eq = _radix_threshold(trace, ukey, valid, zero, K, BITS, 2147483647, "
        "hist_ptr,",
    ),
    (
        "    prefix = prefix ^ (-2147483647 - 1)\n    phase += 1\n"
        "    gt_before, eq_before = _exchange_counts(n_gt, n_eq, cnt_ptr, part, bar_ptr, phase * n_part, SPLITS)\n",
        "    prefix = prefix ^ (-2147483647 - 1)\n    phase += 1\n    _stamp(trace, 9, n_gt)\n"
        "    gt_before, eq_before = _exchange_counts(n_gt, n_eq, cnt_ptr, part, bar_ptr, phase * n_part, SPLITS)\n"
        "    _stamp(trace, 10, gt_before)\n",
    ),
    ("    cand_ptr,  # int32 [rows, stride_cand]", "    trace_ptr,\n    cand_ptr,  # int32 [rows, stride_cand]"),
    (
        "    pid = tl.program_id(0)\n    if SPLITS == 1:",
        "    pid = tl.program_id(0)\n"
        "    trace = trace_ptr + pid.to(tl.int64) * 64\n    _stamp(trace, 0, pid)\n    if SPLITS == 1:",
    ),
    (
        "    n = tl.minimum(tl.maximum(tl.load(lens_ptr + i_r), 0), n_cols)\n",
        "    n = tl.minimum(tl.maximum(tl.load(lens_ptr + i_r), 0), n_cols)\n"
        '    smid = tl.inline_asm_elementwise("mov.u32 $0, %smid;", "=r,r", [n], dtype=tl.int32, is_pure=False, '
        "pack=1)\n"
        "    tl.store(trace + 30, smid.to(tl.int64))\n"
        "    tl.store(trace + 31, (i_r << 8) | (part + 1).to(tl.int64))\n",
    ),
    ("phase = _select_split_registers(src, lo,", "phase = _select_split_registers(trace, src, lo,"),
    ("phase = _select_split(src, lo,", "phase = _select_split(trace, src, lo,"),
    (
        '        tl.debug_barrier()\n        arrived = tl.atomic_add(p_bar, 1, sem="acq_rel", scope="gpu") + 1\n',
        "        _stamp(trace, 11, phase)\n"
        '        tl.debug_barrier()\n        arrived = tl.atomic_add(p_bar, 1, sem="acq_rel", scope="gpu") + 1\n'
        "        _stamp(trace, 12, arrived)\n",
    ),
    (
        "            _finish_row(src, n, p_idx, p_slot, p_pt, K, SORT, WRITE_SLOTS, True, PAGE_BITS, False)\n",
        "            _finish_row(src, n, p_idx, p_slot, p_pt, K, SORT, WRITE_SLOTS, True, PAGE_BITS, False)\n"
        "            tl.debug_barrier()\n            _stamp(trace, 13, arrived)\n",
    ),
    (
        "    _indexer_topk_kernel[(grid,)](\n        logits,\n        lengths,\n        pt,\n        out,\n"
        "        slots,\n        ws,\n        cand,\n",
        "    _indexer_topk_kernel[(grid,)](\n        logits,\n        lengths,\n        pt,\n        out,\n"
        "        slots,\n        ws,\n        TRACE[0],\n        cand,\n",
    ),
    # the winners' compaction (its scan, then the stores) and the span's load, split off by a stamp each; each stamp
    # waits for a reduction of what it follows (tl.max), which the kernel does not otherwise compute
    (
        "def _write_winners(key, valid, payload, prefix, low, k_rem, gt_before, eq_before, idx_out_ptr):",
        "def _write_winners(trace, TRACE: tl.constexpr, key, valid, payload, prefix, low, k_rem, gt_before, eq_before,"
        " idx_out_ptr):",
    ),
    (
        "    before = tl.cumsum(both, axis=0) - both\n",
        "    before = tl.cumsum(both, axis=0) - both\n"
        "    if TRACE:\n        _stamp(trace, 14, tl.max(before, axis=0))\n",
    ),
    (
        "    _write_winners(key, valid, payload, prefix, low, k_rem, zero, zero, idx_out_ptr)",
        "    _write_winners(zero, False, key, valid, payload, prefix, low, k_rem, zero, zero, idx_out_ptr)",
    ),
    (
        "    _write_winners(key, valid, offs, prefix, low, k_rem, gt_before, eq_before, idx_out_ptr)",
        "    _write_winners(trace, True, key, valid, offs, prefix, low, k_rem, gt_before, eq_before, idx_out_ptr)",
    ),
    (
        "    ukey = key ^ (-2147483647 - 1)  # sign flipped: digit order is key order (see _radix_threshold)\n",
        "    ukey = key ^ (-2147483647 - 1)  # sign flipped: digit order is key order (see _radix_threshold)\n"
        "    _stamp(trace, 15, tl.max(key, axis=0))\n",
    ),
    (
        "_SPLIT_WS = _SplitWorkspace()\n",
        "_SPLIT_WS = _SplitWorkspace()\nTRACE = [None]  # int64 [grid, 64], set by the caller\n",
    ),
]


def traced_source(src: Path = SRC) -> str:
    text = src.read_text()
    for anchor, new in EDITS:
        n = text.count(anchor)
        if n != 1:
            raise SystemExit(f"anchor found {n} times (topk.py changed?): {anchor[:90]!r}")
        text = text.replace(anchor, new)
    # solo programs (one per row): the end of their selection and finish
    anchor = " " * 26 + "PAGE_BITS, False, SORT, p_cand, 0, 1, 1, RADIX, STREAM_BITS, PREFETCH)  # fmt: skip\n"
    if text.count(anchor) != 1:
        raise SystemExit("anchor of the solo row in a split launch not found")
    text = text.replace(anchor, anchor + "                tl.debug_barrier()\n                _stamp(trace, 13, n)\n")
    return text


def load_traced(src: Path = SRC):
    path = Path(tempfile.mkdtemp()) / "topk_traced.py"
    path.write_text(traced_source(src))
    spec = importlib.util.spec_from_file_location("topk_traced", path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # its frozen dataclasses look their module up while it executes
    spec.loader.exec_module(mod)
    return mod


def grid_rows(mod, b: int) -> int:  # noqa: ANN001
    """Trace rows enough for any launch of ``b`` rows (a solo program per row + up to SPLITS_MAX participants)."""
    return b * (mod.SPLITS_MAX + 1)


def summarize(tr: torch.Tensor, b: int) -> dict:
    """Per-phase durations (us, median and max over the programs that ran the phase) from the stamps [grid, 64]."""
    tr = tr[tr[:, 32 + START] != 0]  # the programs the launch had
    gt = tr[:, :32].double() / 1e3  # us
    ck = tr[:, 32:].double()
    t0 = gt[:, START].min()
    meta = tr[:, 31]
    part = (meta & 0xFF) - 1
    parts = (part >= 0) & (tr[:, WINNERS] != 0)  # participants that took part (a row of one span stays solo)
    out = dict(programs=int(tr.shape[0]), participants=int(parts.sum()))

    def span(a: int, z: int, rows: torch.Tensor, clock: bool = False) -> dict | None:
        src = ck if clock else gt
        ok = rows & (src[:, a] != 0) & (src[:, z] != 0)
        if not ok.any():
            return None
        d = (src[ok, z] - src[ok, a]) / (1.98e3 if clock else 1.0)  # clock: cycles at ~1.98 GHz -> us
        return dict(n=int(ok.sum()), med=round(float(d.median()), 2), max=round(float(d.max()), 2))

    phases = {
        "start->pass0 arrive (load + histogram)": (START, 1),
        "load (start -> keys)": (START, LOADED),
        "pass0 histogram (keys -> arrive)": (LOADED, 1),
    }
    for p in range(4):
        a, d = pass_slots(p)
        phases[f"pass{p} wait (arrive -> bin known)"] = (a, d)
        if p < 3:
            phases[f"pass{p + 1} local (bin known -> arrive)"] = (d, pass_slots(p + 1)[0])
    phases["exchange wait"] = (EXCH_ARRIVE, EXCH_DONE)
    phases["winners written"] = (EXCH_DONE, WINNERS)
    phases["winners: scan"] = (EXCH_DONE, SCANNED)
    phases["winners: stores"] = (SCANNED, WINNERS)
    phases["final arrival"] = (WINNERS, FINAL)
    phases["last: finish"] = (FINAL, FINISH)
    out["participants_us"] = {name: span(a, z, parts) for name, (a, z) in phases.items()}
    out["participants_clock_us"] = {name: span(a, z, parts, True) for name, (a, z) in phases.items()}
    solo = ~parts & (gt[:, FINISH] != 0)
    out["solo_us"] = span(START, FINISH, solo)
    ends = torch.maximum(gt[:, FINISH], gt[:, FINAL])
    out["launch_span_us"] = round(float(ends.max() - t0), 2)
    starts = (gt[parts, START] - t0).sort().values
    out["participant_starts_us"] = [round(float(x), 2) for x in starts[:: max(1, len(starts) // 16)]]
    out["participant_ends_us"] = [
        round(float(x), 2) for x in (ends[parts] - t0).sort().values[:: max(1, int(parts.sum()) // 16)]
    ]
    return out


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--build-cubins", default="", help="no GPU: compile the traced launches (this Triton) into DIR")
    p.add_argument("--cubins", default="", help="GPU: launch the traced kernel from DIR's Triton 3.8 cubins")
    p.add_argument("--shapes", default="64x65536,32x65536,64x16384")
    p.add_argument("--ks", default="512,2048")
    p.add_argument("--code", default="")
    p.add_argument("--out", default="")
    p.add_argument("--src", default=str(SRC), help="the topk.py to trace (a saved copy: the cubins' source)")
    args = p.parse_args()
    shapes = [tuple(int(x) for x in s.split("x")) for s in args.shapes.split(",")]
    ks = [int(x) for x in args.ks.split(",")]
    mod = load_traced(Path(args.src))
    if args.build_cubins:
        from benchmarks import prod_cubins

        def workload() -> None:
            for b, ctx in shapes:
                for k in ks:
                    mod.TRACE[0] = torch.zeros(grid_rows(mod, b) * SLOTS, dtype=torch.int64)
                    lens = torch.full((b,), ctx, dtype=torch.int32)
                    table = torch.zeros(b, CAP // 64, dtype=torch.int32)
                    out = torch.empty(b, k, dtype=torch.int32)
                    mod.indexer_topk_fwd(torch.empty(b, CAP), lens, k, out=out, sorted=False, page_table=table,
                                         out_slots=torch.empty_like(out), page_size=64)  # fmt: skip

        added = prod_cubins.build(workload, Path(args.build_cubins))
        print(f"{len(added)} cubins added to {args.build_cubins} (Triton {triton.__version__})")
        return
    sys.path.insert(0, str(Path(__file__).parent))
    from topk_filter_sweep import DEV, graph_us, same_set

    from benchmarks.indexer import gpu_indexer_cache, make_case
    from sparsemla.kernels.indexer import topk as pkg
    from sparsemla.kernels.indexer import triton as tri

    replaying = contextlib.nullcontext({})
    if args.cubins:
        from benchmarks import prod_cubins

        replaying = prod_cubins.replay(Path(args.cubins), {"_indexer_topk_kernel"})
    gen = torch.Generator(device=DEV).manual_seed(0)
    kv = gpu_indexer_cache(64 * CAP // 64 + 64, DEV, gen)
    rows = []
    with replaying as replayed:
        for b, ctx in shapes:
            case = make_case(b, ctx, CAP, kv, gen)
            logits = tri.indexer_logits_fwd(case.q, case.kv, case.weights, case.seq_lens, case.page_table, CAP, True)
            for k in ks:
                out = torch.full((b, k), -7, dtype=torch.int32, device=DEV)
                slots = torch.empty_like(out)
                trace = torch.zeros(grid_rows(mod, b), SLOTS, dtype=torch.int64, device=DEV)
                mod.TRACE[0] = trace

                def call(m=mod, out=out, slots=slots, k=k, logits=logits, case=case):  # noqa: ANN001
                    m.indexer_topk_fwd(logits, case.seq_lens, k, out=out, sorted=False, page_table=case.page_table,
                                       out_slots=slots, page_size=64)  # fmt: skip

                call()
                torch.cuda.synchronize()
                trace.zero_()
                call()
                torch.cuda.synchronize()
                exact = same_set(out, logits, case.seq_lens, k)
                tr = trace.cpu()
                us_traced = graph_us(call, 20)
                pkg_call = lambda p=pkg, **kw: call(p)  # noqa: E731
                us_pkg = graph_us(pkg_call, 20) if not args.cubins else None  # the package has no cubins here
                row = dict(B=b, ctx=ctx, k=k, exact=exact, us_graph20_traced=round(us_traced, 2),
                           us_graph20_package=us_pkg and round(us_pkg, 2), **summarize(tr, b),
                           stamps=tr.tolist())  # fmt: skip
                rows.append(row)
                show = {kk: v for kk, v in row.items() if kk not in ("stamps", "participants_clock_us")}
                print(json.dumps(show), flush=True)
    if args.out:
        kernel = f"3.8 cubins {replayed}" if args.cubins else triton.__version__
        meta = dict(gpu=torch.cuda.get_device_name(), torch=torch.__version__, triton=triton.__version__,
                    code=args.code, topk_kernel=kernel)  # fmt: skip
        Path(args.out).write_text(json.dumps(dict(meta=meta, rows=rows)) + "\n")


if __name__ == "__main__":
    main()
