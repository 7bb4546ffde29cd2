"""Exploratory A/B (not a benchmark claim): split participants that hold their span in registers (5- or 8-bit radix
digits, one merged histogram and barrier per pass; ``reg_span`` / ``reg_bits`` of ``indexer_topk_fwd``) against the
8-bit streaming passes of the code before (``--old``, a copy of kernels/indexer/topk.py) and against the new code with
the register path off (``reg_span=0``); ``span2k`` / ``span1k`` also split rows longer than 2048 / 1024 positions
(``span`` and ``split_row``), e.g. 4k rows into two or four participants. Real indexer logits, cap 65536, position
order with page slots (what the sglang hooks call); CUDA-graph replay (do_bench median, L2 flushed), one call per graph
and 20 per graph; every output checked against the torch.topk set.

    PYTHONPATH=/tmp/site:. python results/bench/explore/topk_split_regs_ab.py --old F --path native --out F.json
"""

import argparse
import contextlib
import importlib.util
import json
import sys
from pathlib import Path

import torch
import triton

sys.path.insert(0, str(Path(__file__).parent))
from topk_filter_sweep import DEV, graph_us, same_set  # noqa: E402

from benchmarks.indexer import gpu_indexer_cache, make_case  # noqa: E402
from sparsemla.kernels.indexer import topk as new  # noqa: E402
from sparsemla.kernels.indexer import triton as tri  # noqa: E402

p = argparse.ArgumentParser()
p.add_argument("--old", default="", help="a copy of kernels/indexer/topk.py from before (the 'old' variant)")
p.add_argument("--path", default="native", help="native or sm89 (set TRITON_OVERRIDE_ARCH to match)")
p.add_argument("--out", default="")
p.add_argument(
    "--build-cubins", default="", help="no GPU: compile every launch with this Triton (3.8) for sm_90 into DIR"
)
p.add_argument("--cubins", default="", help="GPU: launch the top-k kernel from DIR's Triton 3.8 cubins (prod_cubins)")
p.add_argument("--shapes", default="64x16384,8x16384,1x16384,64x65536,1x65536,128x16384,64x8192")
p.add_argument("--ks", default="512,2048")
p.add_argument("--code", default="", help="what the package's code is (the GPU copy has no .git)")
p.add_argument("--variants", default="old,stream,regs5,regs8,regs5_8k,regs5_8k_nofilter")
args = p.parse_args()
if args.old:
    spec = importlib.util.spec_from_file_location("topk_old", args.old)
    old = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = old  # its frozen dataclasses look their module up while it executes
    spec.loader.exec_module(old)
else:  # no older copy: the 'old' variant is the package's own code with its defaults
    old = new

VARIANTS = {
    "old": (old, {}),
    "stream": (new, dict(reg_span=0)),
    "default": (new, {}),
    "regs5": (new, dict(reg_span=4096, reg_bits=5)),
    "regs8": (new, dict(reg_span=4096, reg_bits=8)),
    "regs5_8k": (new, dict(reg_span=8192, reg_bits=5)),
    "regs5_8k_nofilter": (new, dict(reg_span=8192, reg_bits=5, filter_tiles=(0, 0))),
    "regs5_span2k": (new, dict(reg_span=4096, reg_bits=5, span=2048, split_row=2048)),
    "regs5_span1k": (new, dict(reg_span=4096, reg_bits=5, span=1024, split_row=1024)),
    "regs5_1k": (new, dict(reg_span=1024, reg_bits=5)),
    "regs5_2k": (new, dict(reg_span=2048, reg_bits=5)),
    "regs8_1k": (new, dict(reg_span=1024, reg_bits=8)),
    # the top-k kernel at 4 warps instead of TOPK_WARPS (8): k = 512's tile then takes ~168 registers, no spill (AOT)
    "stream_w4": (new, dict(reg_span=0, _warps=4)),
    "regs5_w4": (new, dict(reg_span=4096, reg_bits=5, _warps=4)),
    "regs5_1k_w4": (new, dict(reg_span=1024, reg_bits=5, _warps=4)),
    # 8 warps with a .maxnreg cap: k = 512 then compiles to 96 registers without spills (ptxas's default: 64 + spills)
    "stream_r128": (new, dict(reg_span=0, _maxnreg=128)),
    "regs5_r128": (new, dict(reg_span=4096, reg_bits=5, _maxnreg=128)),
    "regs5_1k_r128": (new, dict(reg_span=1024, reg_bits=5, _maxnreg=128)),
    "default_r128": (new, dict(_maxnreg=128)),
    # next levers (the default has .maxnreg 128): 16 participants per row (64k rows in 4096-key tiles), an 8192-key
    # tile (~225 registers, no spill at .maxnreg 255: one 8-warp program per SM), 4k rows split into 2048 / 1024 spans
    "splits16": (new, dict(splits=16)),
    # 64k rows in 4 / 2 participants of 16384 / 32768 keys, streaming and through the two-pass filter (explicit
    # filter tiles: by default a launch this small does not compile the filter)
    "splits4": (new, dict(splits=4)),
    "splits2": (new, dict(splits=2)),
    "splits4_filter": (new, dict(splits=4, _filter=True)),  # _filter: filter_tiles = FILTER_TILES[k]
    "splits2_filter": (new, dict(splits=2, _filter=True)),
    "regs5_8k_r255": (new, dict(reg_span=8192, reg_bits=5, filter_tiles=(0, 0), _maxnreg=255)),
    "span2k_tile": (new, dict(reg_span=2048, reg_bits=5, span=2048, split_row=2048)),
    "span1k_tile": (new, dict(reg_span=1024, reg_bits=5, span=1024, split_row=1024)),
    # digit widths (fifteenth session; for Triton 3.8, whose tl.histogram is one shared atomic per key whatever the
    # bins, so wider digits mean fewer passes and barriers): the one-program register search (`bits`, also the
    # filter's selections), the split span tile (`reg_bits`), the streaming passes (`stream_bits`), and all three
    "bits8": (new, dict(bits=8)),
    "bits11": (new, dict(bits=11)),
    "reg8": (new, dict(reg_bits=8)),
    "reg11": (new, dict(reg_bits=11)),
    "stream11": (new, dict(stream_bits=11)),
    "stream12": (new, dict(stream_bits=12)),
    "wide8": (new, dict(bits=8, reg_bits=8, stream_bits=8)),
    "wide11": (new, dict(bits=11, reg_bits=11, stream_bits=11)),
    "wide11_nofilter": (new, dict(bits=11, reg_bits=11, stream_bits=11, filter_tiles=(0, 0))),
    "wide11_splits16": (new, dict(bits=11, reg_bits=11, stream_bits=11, splits=16)),
    # fewer, longer participants (B = 64: 2 or 4 per row, one wave of programs instead of several spinning ones)
    "wide11_splits4": (new, dict(bits=11, reg_bits=11, stream_bits=11, splits=4)),
    "wide11_splits2": (new, dict(bits=11, reg_bits=11, stream_bits=11, splits=2)),
    # (the coarse-digit variants coarse12 ... coarse12_both ran at bec8b17: topk_coarse_ab-native-h200.json; the
    # selection lost everywhere and was removed, see docs/performance.md)
    # (the coarse fp16-like first digit -- coarse, coarse1_w8/16/32, coarse1_w16/32_t16k, c10_/c12_w16/32_t16k,
    # s4_r16k_w16_c8 -- ran at 464c4ec..650bc78: topk_coarse1_ab*-native-h200.json; it lost to the plain radix
    # everywhere and was removed.) One program per row at 16 / 32 warps with a 16k register tile (splits=1), and
    # 64k rows in 16k / 8k spans held in registers (or streamed) by 16-warp participants: the wide launch's candidates
    "one_w8": (new, dict(splits=1)),
    "one_w16_t16k": (new, dict(splits=1, _warps=16, row_tiles=(4096, 16384))),
    "one_w32_t16k": (new, dict(splits=1, _warps=32, row_tiles=(4096, 16384))),
    "one_w16_t16k_b11": (new, dict(splits=1, _warps=16, row_tiles=(4096, 16384), bits=11)),
    "s4_r16k_w16": (new, dict(splits=4, span=16384, reg_span=16384, split_row=16384, row_tiles=(4096, 16384),
                              _warps=16)),  # fmt: skip
    "s4_r16k_w16_r64": (new, dict(splits=4, span=16384, reg_span=16384, split_row=16384, row_tiles=(4096, 16384),
                                  _warps=16, _maxnreg=64)),  # fmt: skip
    "s4_st16k_w16": (new, dict(splits=4, span=16384, reg_span=0, split_row=16384, row_tiles=(4096, 16384),
                               _warps=16)),  # fmt: skip
    "s8_r8k_w16": (new, dict(splits=8, span=8192, reg_span=8192, split_row=16384, row_tiles=(4096, 16384),
                             _warps=16)),  # fmt: skip
    "s4_r16k_w16_f": (new, dict(splits=4, span=16384, reg_span=16384, split_row=16384, row_tiles=(4096, 16384),
                                _warps=16, _filter=True)),  # fmt: skip
    "s4_r16k_w16_rb11": (new, dict(splits=4, span=16384, reg_span=16384, split_row=16384, row_tiles=(4096, 16384),
                                   _warps=16, reg_bits=11)),  # fmt: skip
    "s2_r32k_w32": (new, dict(splits=2, span=32768, reg_span=32768, split_row=16384, row_tiles=(4096, 16384),
                              _warps=32)),  # fmt: skip
    # (the twenty-second session's `wide2` / `wide3` variants -- 16k rows in two 8k or four 4k register spans through
    # a second span tile, 64k rows in eight 8k spans, the two-level winner scan -- ran at 02f172c with the code of
    # 51ef8e4: topk_wide2_ab-native-h200.json, topk_wide3_ab-native-h200.json; concluded and removed)
    # the launch before the wide shape (twenty-first session), forced
    "narrow": (new, dict(wide=False)),
    # the fused logits + top-k launch (fuse=True; the B = 1 4k target)
    "fused": (new, dict(_fused=True)),
}
# session 41: streaming participants of 8 warps with 4k solo tiles (64-80 registers a thread, ahead of time: three
# programs an SM, so B = 64 x 64k runs in one wave where the 16k register spans take two), rows past 4k split into up
# to 4 (`st4`) or 8 (`st8`) spans, each pass in `block` pieces loaded in place or one piece ahead (`pf`)
for _s in (4, 8):
    for _b in (1024, 2048, 4096):
        for _pf in (False, True):
            VARIANTS[f"st{_s}_b{_b}{'_pf' if _pf else ''}"] = (
                new,
                dict(splits=_s, span=4096, reg_span=0, split_row=4096, row_tiles=(4096, 4096), filter_tiles=(0, 0),
                     block=_b, prefetch=_pf),
            )  # fmt: skip
# (session 43's `slabs` / `slabs_spec` -- split rows' histograms merged through per-participant slabs, no count
# exchange; and the second radix pass computed ahead from each span's guess of the first digit -- ran at 1286052:
# topk_slabs_ab-native-h100-1286052.json; no gain at B = 32 / 64 / 128, slower at B = 1 / 8: removed)
# (session 43's `wpf` -- register-span participants prefetching the next wave's span into L2 after their search --
# ran at 154e919: topk_wpf_ab-native-h100-154e919.json, 1 % slower at 64 x 64k; removed)
VARIANTS["smem"] = (new, dict(smem=True))  # session 43: the spans in shared memory (topk_smem, Gluon)
VARIANTS["regs"] = (new, dict(smem=False))  # session 44: the register spans once smem_spans picks shared memory
# session 45: rows up to 16k in the register launch, longer ones in shared memory on a forked stream (LENGTH_SPLIT)
VARIANTS["split"] = (new, dict(_length_split=True))
# (session 46's `fork` A/B -- the split's side stream at normal priority, the register launch on the side stream, the
# register rows' page slots written by the compaction (DIRECT_SLOTS) alone and in the split -- ran at 1d4ce53 with the
# code of that commit: topk_fork_ab-native-h200-1d4ce53.json; the register launch first won 0.5-0.9 us at 4k-16k and
# lost 6-9 us at 64k, the rest tied or lost; removed)
# (session 47's `split_scan` -- the split's shared-memory programs reading every length first and exiting without a
# start ticket where no row is longer than WIDE_SPAN, topk.LENGTH_SPLIT_SCAN -- ran in session 48 at ce7efee with the
# code of that commit: topk_scan_ab-native-h100-ce7efee.json; +0.2 us at 16k, -0.4..0.8 us at 64k; removed)
# (sessions 44-45's `smem_packed*` / `smem_unpacked` -- topk_smem's packed sums, direct page slots, SMEM_MIN_SPAN 8k /
# 16k, 5- to 7-bit digits -- ran at e2b3370: topk_direct_ab-native-h100-e2b3370.json; all slower; removed)
VARIANTS["spf"] = (new, dict(prefetch=True))  # the launcher's own launch, its streaming loops a piece ahead
VARIANTS["spf_b2048"] = (new, dict(prefetch=True, block=2048))

# (session 43's `lanes1/4/16` -- the register searches' first pass counted in sub-histograms by lane, 8 in the package
# then -- ran at 729449b: topk_lanes_ab-native-h100-729449b.json; one histogram (the code before) was fastest at
# every shape but B = 1: removed)
CAP = 65536
MODS = {old, new} | {mod for mod, _ in VARIANTS.values()}
WARPS = {mod: mod.TOPK_WARPS for mod in MODS}  # each module's own default, restored after a 4-warp variant
MAXNREG = {mod: getattr(mod, "TOPK_MAXNREG", None) for mod in MODS}
WIDE = {mod: getattr(mod, "WIDE_WARPS", None) for mod in MODS}
LENGTH_SPLIT = new.LENGTH_SPLIT  # the package's default, restored after the `split` variant


def fused(name: str) -> bool:
    """Whether a variant times the fused logits + top-k launch instead of the top-k kernel."""
    return bool(VARIANTS[name][1].get("_fused"))


def run_variant(mod, kw: dict, fuse: bool, case, logits, k: int, out, slots) -> None:  # noqa: ANN001
    """One call of a variant: the top-k kernel on ``logits`` (position order, page slots), or the fused launch."""
    if fuse:
        tri.indexer_logits_topk_fwd(case.q, case.kv, case.weights, case.seq_lens, case.page_table, k, CAP, out=out,
                                    sorted=False, fuse=True, **kw)  # fmt: skip
    else:
        mod.indexer_topk_fwd(logits, case.seq_lens, k, out=out, sorted=False, page_table=case.page_table,
                             out_slots=slots, page_size=64, **kw)  # fmt: skip


def slots_match(out: torch.Tensor, slots: torch.Tensor, case) -> bool:  # noqa: ANN001
    """The page slots equal the positions' transform through ``case.page_table`` (64-token pages), -1 where none."""
    pos = out.clamp(min=0).long()
    want = case.page_table.long().gather(1, pos // 64) * 64 + pos % 64
    return bool(torch.equal(slots.long(), torch.where(out >= 0, want, -1)))


def variant(name: str, k: int) -> tuple:
    """(module, launcher keywords) of a variant, its module-level knobs set (restore with ``restore``)."""
    mod, kw = VARIANTS[name]
    kw = dict(kw)
    kw.pop("_fused", None)
    if kw.pop("_filter", False):
        kw["filter_tiles"] = new.FILTER_TILES[k]
    mod.TOPK_WARPS = kw.pop("_warps", WARPS[mod])  # read at every launch, graph capture included
    if hasattr(mod, "WIDE_WARPS"):  # a wide launch's (twenty-first session) warps: the same override
        mod.WIDE_WARPS = mod.TOPK_WARPS if mod.TOPK_WARPS != WARPS[mod] else WIDE[mod]
    mod.TOPK_MAXNREG = kw.pop("_maxnreg", MAXNREG[mod])
    new.LENGTH_SPLIT = kw.pop("_length_split", LENGTH_SPLIT)  # read at every launch
    return mod, kw


def restore(mod) -> None:  # noqa: ANN001
    mod.TOPK_WARPS, mod.TOPK_MAXNREG = WARPS[mod], MAXNREG[mod]
    new.LENGTH_SPLIT = LENGTH_SPLIT
    if hasattr(mod, "WIDE_WARPS"):
        mod.WIDE_WARPS = WIDE[mod]


# BxCTX: every row at CTX positions; BxCTXr (session 45): lengths drawn uniformly from 1 .. CTX (a mixed decode batch)
SHAPES = [(*(int(x) for x in shape.rstrip("r").split("x")), shape.endswith("r")) for shape in args.shapes.split(",")]
KS = [int(x) for x in args.ks.split(",")]
if args.build_cubins:  # here, no GPU: the same launches on CPU tensors of the same shapes, compiled for sm_90
    from benchmarks import prod_cubins

    from benchmarks.indexer import Case, unfilled_indexer_cache

    def workload() -> None:
        for b, ctx, _ in SHAPES:
            lens = torch.full((b,), ctx, dtype=torch.int32)
            table = torch.zeros(b, CAP // 64, dtype=torch.int32)
            q = torch.empty(b, 1, 64, 128, dtype=torch.float8_e4m3fn)
            case = Case(b, ctx, CAP, q, unfilled_indexer_cache(b * CAP // 64 + 64), torch.empty(b, 64), lens, table)
            logits = torch.empty(b, CAP)
            if any(fused(name) for name in args.variants.split(",")):  # the GPU run then replays the logits too
                logits = tri.indexer_logits_fwd(q, case.kv, case.weights, lens, table, CAP, True)
            for k in KS:
                for name in args.variants.split(","):
                    mod, kw = variant(name, k)
                    out = torch.empty(b, k, dtype=torch.int32)
                    run_variant(mod, kw, fused(name), case, logits, k, out, torch.empty_like(out))
                    restore(mod)

    added = prod_cubins.build(workload, Path(args.build_cubins))
    print(f"{len(added)} cubins added to {args.build_cubins} (Triton {triton.__version__})")
    sys.exit(0)
if not args.out:
    sys.exit("--out is required (or --build-cubins)")
replaying = contextlib.nullcontext({})
if args.cubins:
    from benchmarks import prod_cubins

    kernels = {"_indexer_topk_kernel", "_topk_smem_kernel"}
    if any(fused(name) for name in args.variants.split(",")):
        kernels.add("_indexer_logits_kernel")
    replaying = prod_cubins.replay(Path(args.cubins), kernels)


def save(rows: list, replayed: dict) -> None:
    gpu = torch.cuda.get_device_name()
    kernels = f"Triton 3.8 cubins from {args.cubins} ({replayed})" if args.cubins else f"Triton {triton.__version__}"
    meta = dict(gpu=gpu, torch=torch.__version__, triton=triton.__version__, path=args.path, cap=CAP,
                old=args.old, variants={k: str(v[1]) for k, v in VARIANTS.items()},
                code=args.code, topk_kernel=kernels)  # fmt: skip
    Path(args.out).write_text(json.dumps(dict(meta=meta, rows=rows), indent=1) + "\n")


gen = torch.Generator(device=DEV).manual_seed(0)
kv = gpu_indexer_cache(max(b * -(-ctx // 64) for b, ctx, _ in SHAPES) + 64, DEV, gen)  # pages for the largest case
rows = []
replayed = replaying.__enter__()
for b, ctx, mixed in SHAPES:
    case = make_case(b, ctx, CAP, kv, gen)
    if mixed:
        case.seq_lens = torch.randint(1, ctx + 1, (b,), generator=gen, device=DEV, dtype=torch.int32)
    logits = tri.indexer_logits_fwd(case.q, case.kv, case.weights, case.seq_lens, case.page_table, CAP, True)
    info = new.dev.launch_info(DEV)
    for k in KS:
        for name in args.variants.split(","):
            mod, kw = variant(name, k)
            out = torch.full((b, k), -7, dtype=torch.int32, device=DEV)
            slots = torch.empty_like(out)

            def call(mod=mod, out=out, slots=slots, k=k, logits=logits, case=case, kw=kw, fuse=fused(name)):
                run_variant(mod, kw, fuse, case, logits, k, out, slots)

            try:
                call()
                exact = same_set(out, logits, case.seq_lens, k) and (fused(name) or slots_match(out, slots, case))
                us1, us20 = graph_us(call), graph_us(call, 20)
                err = None
            except Exception as exc:  # a variant that fails to compile or launch is a row, not the end of the run
                exact, us1, us20, err = False, None, None, repr(exc)[:300]
            restore(mod)
            launch = new.choose_topk_launch(b, CAP, k, info, kw.get("wide"))  # the launcher's, unless the variant's
            splits = kw.get("splits", launch.splits)
            span = kw.get("span", launch.span if "splits" not in kw else new.topk_span(b, splits, info))
            row = dict(path=args.path, B=b, ctx=ctx, lengths="1..ctx" if mixed else "ctx", k=k, variant=name,
                       us_graph=us1 and round(us1, 2),
                       us_graph20=us20 and round(us20, 2), exact=exact, splits=splits, span=span,
                       wide=launch.wide, error=err)  # fmt: skip
            print(json.dumps(row), flush=True)
            rows.append(row)
            save(rows, replayed)  # after every row: a run cut by its timeout keeps what it measured
replaying.__exit__(None, None, None)
save(rows, replayed)
