"""The decode section of ``docs/performance.md``, rendered from one ``results/bench/decode-*.json``.

``decode_section(data)`` is the per-op function ``benchmarks/report.py`` calls; ``python -m
benchmarks.report_decode results/bench/decode-h200-<date>.json`` prints the section on its own."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from benchmarks.report import cells_by, fmt_us

# issue 3 targets, H=64, swa_topk 128, extra_topk 512: B -> µs
TARGETS: dict[int, float] = {1: 10.0, 8: 12.0, 32: 20.0, 64: 25.0, 128: 40.0}
TARGET_SHAPE = (64, 128, 512)
# issue 13: the wgmma path's graph replay before the portability work (results/bench/decode-h200-2026-11-29.json) and
# the sm_89 path's limits (<= 18 µs at B=1, <= 55 µs at B=64, everywhere within 1.3x of the wgmma path)
BEFORE_WGMMA: dict[int, float] = {1: 14.5, 8: 26.2, 32: 41.4, 64: 46.1, 128: 73.6}
SM89_LIMITS: dict[int, float] = {1: 18.0, 64: 55.0}
SM89_RATIO = 1.3
COLUMNS = ("floor", "sparsemla", "sparsemla_graph", "sparsemla_t38_graph", "sparsemla_sm89path_graph", "flashmla",
           "sglang_triton", "reference")  # fmt: skip
# Projection targets: (name, target key in sparsemla.kernels.device.TARGETS, SMs, DRAM bytes/s)
PROJECTED = (
    ("RTX PRO 6000 Blackwell", "sm_120", 188, 1.79e12),
    ("RTX 5090", "sm_120", 170, 1.79e12),
    ("L40S", "sm_89", 142, 0.86e12),
    ("A100 80 GB", "sm_80", 108, 2.0e12),
)


def decode_section(data: dict) -> str:
    """Markdown: the target table with gaps and speed-ups, then the whole grid."""
    cells = cells_by(data["rows"], ("extra_topk", "H", "B", "swa_topk"))
    ceil = data.get("ceilings", {})
    bw = ceil.get("copy_bytes_per_s", 0) / 1e12
    mm = ceil.get("bf16_flops_per_s", 0) / 1e12
    out = [
        "## Sparse-MLA decode (DeepSeek-V4, V4 fp8 page-split KV, head dim 512)",
        "",
        f"{data['gpu']}, torch {data['torch']}, Triton {data['triton']}, commit `{data['git_sha'][:10]}`, "
        f"{data.get('date', '')}. Ceilings measured in the same run: copy {bw:.2f} TB/s, bf16 matmul {mm:.0f} TFLOP/s. "
        f"{data.get('method', '')}. `floor` = max(bytes / copy bandwidth, FLOPs / bf16 rate). "
        "`flashmla` pads H < 64 to 64 heads (its only sizes are 64 and 128), as sglang does.",
        "",
        "**Targets** (H=64, SWA top-k 128 + extra top-k 512, sink; graph replay unless marked), µs. `wgmma` = the "
        "native Hopper path; `sm_89 path` = `TRITON_OVERRIDE_ARCH=sm89` on the same GPU: the mma.sync code and the "
        "configurations (101,376 B budget) that sm_80, 86, 89 and 120 get; `before` = the wgmma path on 2026-11-29:",
        "",
        "| B | wgmma | before | sm_89 path | sm_89 / wgmma | sm_89 limit | FlashMLA (eager) | sglang Triton | floor "
        "| issue-3 target | vs FlashMLA |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    h, swa, x = TARGET_SHAPE
    for b, limit in TARGETS.items():
        v = cells.get((x, h, b, swa))
        if not v or "sparsemla" not in v:
            continue
        ours = min(v["sparsemla"], v.get("sparsemla_graph", float("inf")))  # GPU-side time: graph replay if timed
        fm, sg, s89 = v.get("flashmla"), v.get("sglang_triton"), v.get("sparsemla_sm89path_graph")
        ratio = f"{s89 / ours:.2f}x" if s89 else "-"
        lim = SM89_LIMITS.get(b)
        lim_txt = f"{lim:g} ({'met' if s89 <= lim else 'missed'})" if lim and s89 else "-"
        out.append(
            f"| {b} | {fmt_us(ours)} | {fmt_us(BEFORE_WGMMA.get(b))} | {fmt_us(s89)} | {ratio} | {lim_txt} "
            f"| {fmt_us(fm)} | {fmt_us(sg)} | {fmt_us(v.get('floor'))} "
            f"| {limit:g}: {'met' if ours <= limit else f'{ours / limit:.1f}x over'} | "
            f"{'faster' if fm and ours < fm else f'{ours / fm:.1f}x slower' if fm else '-'} |"
        )
    out += [
        "",
        "Comparisons use the faster of eager and graph replay (the eager `sparsemla` column includes the Python "
        "launcher's host time, which leaks into do_bench between the L2 flush and the kernels; sglang runs decode "
        "under CUDA graphs); FlashMLA and sglang Triton are timed eagerly (host time included; FlashMLA's is a "
        "C++ launch). `floor` is the bf16-MMA term at these shapes (fp8 KV, 64 heads: ~190 FLOP/byte). "
        f"sm_89-path rule: within {SM89_RATIO}x of the wgmma path at every measured shape. The eager FlashMLA "
        "times of a run carry the GPU machine's host noise (2026-11-29's quiet run: 17 / 19 / 30 / 48 / 52 µs at "
        "B = 1 .. 128), so a `faster` at B = 8 or 32 against a FlashMLA figure far above those is not a win.",
    ]
    out += _prefill_lines(cells)
    out += t38_lines()
    out += native_lines()
    out += anatomy_lines()
    out += lift_lines()
    out += occupancy_lines()
    out += _projection_lines(cells, data)
    out += _sweep_lines(data.get("sweep"))
    cols = [c for c in COLUMNS if any(c in v for v in cells.values())]
    out += ["", "**All measured shapes** (SWA top-k 128, sink on), µs:", ""]
    out += ["| extra top-k | H | B | " + " | ".join(cols) + " |", "|---|---|---|" + "---|" * len(cols)]
    for (x_, h_, b_, _), v in sorted(cells.items()):
        out.append(f"| {x_} | {h_} | {b_} | " + " | ".join(fmt_us(v.get(c)) for c in cols) + " |")
    errs = [c for c in data.get("checks", []) if c.get("rel_err_vs_sparsemla")]
    if errs:
        worst: dict[str, float] = {}
        for c in errs:
            for k, e in c["rel_err_vs_sparsemla"].items():
                worst[k] = max(worst.get(k, 0.0), e)
        out += ["", "Largest relative error of each provider's output against sparsemla's on the same inputs: "]
        out[-1] += ", ".join(f"`{k}` {e:.1e}" for k, e in worst.items() if k != "sparsemla") + "."
    return "\n".join(out) + "\n"


BOUND_NOTE = (
    "Where the time goes (ncu on the H200 at B=64 with the 64-head x 64-token config; exploratory sweeps and their "
    "JSON in results/bench/explore/): one 8-warp program per SM (255 registers, ~90 bytes spilled per thread, 128 KB "
    "of shared memory) and ~8 µs per 64-token tile, its stages back to back: slot ids -> row gather (~2.7 µs of "
    "exposed load latency) -> dequant and shared-memory store (~1.8 µs with the conversion instructions; the integer "
    "dequant took 2-9 % off the whole call) -> 64 chained 64x32x16 QK wgmmas (~2.4 µs: Triton computes the scores in "
    "both warpgroups because each needs all of P for its 256 PV columns) -> softmax and PV (~1.5 µs). Bytes (the "
    "floor) and the MMA rate are not the bound; the serial per-tile chain with one resident program per SM is, and "
    "at B=32..64 the split partials were (fp32 partials cost as much as the attention; they are bf16 now). Closing "
    "the rest needs overlap inside the program -- producer warps gathering the next tile while two consumer "
    "warpgroups, each owning half of the output columns, share one score tile through shared memory (FlashMLA's "
    "design) -- which Triton's `tl.dot` API does not express; sm_90's decode is that design now, written in Gluon "
    "(`sparse_decode/gluon_sm90.py`: the split score tile, from 8 programs; `gluon_ws_sm90.py`: the producer "
    "warpgroup, from 4 tiles a program)."
)


EXPLORE = Path(__file__).resolve().parents[1] / "results" / "bench" / "explore"


def t38_lines(explore: Path = EXPLORE) -> list[str]:
    """Both code paths on Triton 3.8 (production's compiler), from the newest ``decode_paths_t38-*.json``
    (``results/bench/explore/gpu_t38.sh paths``: cubins built here per code path, replayed on the GPU), next to the
    GPU machine's Triton 3.6 in the same run: the sm_89-path rules on the compiler production runs. One table per GPU
    (the device tool lends H200s and H100s; their times are never compared), the newest run of each by its date."""
    runs = _runs(explore, "decode_paths_t38-*.json")
    out: list[str] = []
    for gpu in sorted({data["gpu"] for _, data in runs}, reverse=True):  # H200 first
        out += _t38_table(*max((r for r in runs if r[1]["gpu"] == gpu), key=_run_order), explore)
    return out


def _runs(explore: Path, pattern: str) -> list[tuple[Path, dict]]:
    """Every run file matching ``pattern`` with its JSON."""
    return [(f, json.loads(f.read_text())) for f in explore.glob(pattern)]


def _run_order(run: tuple[Path, dict]) -> tuple[str, str]:
    """Newest last: a run's date, then its file name (file names carry a date or a commit, not an order)."""
    return run[1].get("date", ""), run[0].name


def _t38_table(path: Path, data: dict, explore: Path) -> list[str]:
    cells = cells_by(data["rows"], ("extra_topk", "H", "B", "swa_topk"))
    h, swa, x = TARGET_SHAPE
    occ = any("sparsemla_sm89path_t38occ_graph" in v for v in cells.values())
    occ_name = "/".join(sorted({r["occupancy_of"] for r in data["rows"] if r.get("occupancy_of")})) or "the target"
    out = [
        "",
        f"**Triton 3.8 (production's compiler), both code paths** (graph replay, µs; {data['gpu']}, commit "
        f"`{data['git_sha'][:10]}`, {data.get('date', '')[:10]}; `3.8` = kernels compiled by Triton 3.8 on the build "
        "machine for that code path and launched from their cubins, `3.6` = the GPU machine's Triton in the same run; "
        f"`{path.relative_to(explore.parents[2])}`"
        + (
            f"; `at {occ_name}'s occupancy` = the sm_89 path's 3.8 cubins with as many programs per SM as an "
            f"{occ_name} SM holds and the launcher given {occ_name}'s facts: `benchmarks/prod_cubins.py`, "
            "`padded_shared`"
            if occ
            else ""
        )
        + "):",
        "",
        "| H | B | wgmma 3.6 | wgmma 3.8 | sm_89 path 3.6 | sm_89 path 3.8 | sm_89 / wgmma (3.8) | sm_89 limit (3.8) |"
        + (f" at {occ_name}'s occupancy (3.8) |" if occ else ""),
        "|---|---|---|---|---|---|---|---|" + ("---|" if occ else ""),
    ]
    for (x_, h_, b_, swa_), v in sorted(cells.items(), key=lambda kv: (kv[0][1], kv[0][2])):
        if (x_, swa_) != (x, swa):
            continue
        nat, s89 = v.get("sparsemla_t38_graph"), v.get("sparsemla_sm89path_t38_graph")
        lim = SM89_LIMITS.get(b_) if h_ == h else None
        ratio = s89 / nat if nat and s89 else None
        ratio_txt = "-"
        if ratio:
            ratio_txt = f"{ratio:.2f}x" if abs(ratio - SM89_RATIO) >= 0.005 else f"{ratio:.3f}x"
            ratio_txt += "" if ratio <= SM89_RATIO else " (over 1.3x)"
        lim_txt = f"{lim:g} ({'met' if s89 <= lim else 'missed'})" if lim and s89 else "-"
        out.append(
            f"| {h_} | {b_} | {fmt_us(v.get('sparsemla_graph'))} | {fmt_us(nat)} "
            f"| {fmt_us(v.get('sparsemla_sm89path_graph'))} | {fmt_us(s89)} "
            f"| {ratio_txt} | {lim_txt} |" + (f" {fmt_us(v.get('sparsemla_sm89path_t38occ_graph'))} |" if occ else "")
        )
    prefill = [
        (b_, v["sparsemla_t38_graph"], v["flashmla"])
        for (x_, h_, b_, swa_), v in sorted(cells.items(), key=lambda kv: kv[0][2])
        if (x_, h_, swa_) == (x, h, swa) and b_ > 128 and v.get("flashmla") and v.get("sparsemla_t38_graph")
    ]
    if prefill:  # the prefill goal on the production compiler, FlashMLA in the same run (eager, C++ launch)
        out += ["", "Prefill-sized calls of this run against FlashMLA (goal: no slower per row): "
                + "; ".join(f"{b_} rows wgmma 3.8 {fmt_us(n)} / FlashMLA {fmt_us(f)} = {n / f:.2f}x"
                            for b_, n, f in prefill) + "."]  # fmt: skip
    return out


def native_lines(explore: Path = EXPLORE) -> list[str]:
    """The native path alone next to FlashMLA, from the newest ``decode_native_t38-*.json`` (a run of
    ``benchmarks.decode --paths native`` with Triton 3.8 cubins; where a device window was too short for both
    paths): per shape our graph replay from 3.8 cubins, FlashMLA's time and their ratio."""
    runs = _runs(explore, "decode_native_t38-*.json")
    if not runs:
        return []
    path, data = max(runs, key=_run_order)
    cells = cells_by(data["rows"], ("H", "B", "swa_topk", "extra_topk"))
    out = [
        "",
        f"**The wgmma path alone next to FlashMLA** (Triton 3.8 cubins, graph replay; FlashMLA eager as above; µs; "
        f"{data['gpu']}, commit `{data['git_sha'][:10]}`, {data.get('date', '')[:10]}; "
        f"`{path.relative_to(explore.parents[2])}`):",
        "",
        "| H | B (rows) | wgmma 3.8 | FlashMLA | wgmma / FlashMLA |",
        "|---|---|---|---|---|",
    ]
    for (h_, b_, _, _), v in sorted(cells.items()):
        ours, flash = v.get("sparsemla_t38_graph"), v.get("flashmla")
        if ours and flash:
            out.append(f"| {h_} | {b_} | {fmt_us(ours)} | {fmt_us(flash)} | {ours / flash:.2f}x |")
    return out


ANATOMY_NOTE = (
    "Reading the table: built from uint8 bytes, the gathered tile reaches the dots with 8-bit operand runs (Triton "
    "sizes an mma.sync operand's per-thread K run, kWidth, from the narrowest type it finds walking back through "
    "elementwise ops: 4 instead of bf16's 2). Both operands then take that layout: q and the tile are read with "
    "64-bit shared loads instead of `ldmatrix`, the tile is stored twice (one copy per dot) and register moves "
    "repack every MMA's operands (ncu, sm_89 path on the H200, B = 64: a third of the loop's executed instructions "
    "were MOV / IMAD.MOV; `explore/ncu/`). The opaque move (`dequant.opaque_bf16`, a non-pure register move that "
    "ends that walk at the bf16 tile) gives bf16's layout back: `ldmatrix`, one copy of the tile, 0 spills on sm_89, "
    "and ~40 % fewer loop instructions on every mma.sync target; the launcher applies it wherever the dots are "
    "mma.sync (`opaque_tile_default`). wgmma reads its operands from shared memory: unchanged. What remains on "
    "mma.sync: Triton gives the two chained dots one layout with the 4 warps along the 512 output columns, so every "
    "warp still re-reads the whole q (32 KB) from shared memory each tile. An H200 SM holds two programs of 67,584 B "
    "(registers bound it) where an sm_86 / 89 / 120 part (100 KB per SM) holds one, so the sm_89 path's times on the "
    "H200 flatter those GPUs more with the move than without (measured at their blocks per SM below)."
)


OCCUPANCY_NOTE = (
    "`auto` is the launcher since 18ebfcc: the opaque mma.sync tiles sized exactly in the split count (an sm_86 / 89 "
    "/ 120 SM holds two 16 x 32 programs of 50,176 B, an A100 SM two 32 x 32 of 67,584 B), and 32 x 16 tiles from 256 "
    "programs where an SM holds one 32 x 32 program. Before it the launcher chose, for sm_89's facts on these 132 SMs: "
    "16 x 32 tiles with half the splits at H <= 16 (16 / 32 / 64 / 128 rows: 8 / 4 / 2 / 1 splits, the `/sN` "
    "columns) and the 32 x 32 tile at >= 256 programs (`32:32:4:1:1c/s1`); for sm_80's, 32 x 32 tiles with half the "
    "splits from 8 rows (8 x 64: 8, 16 x 64: 4, 32 x 64: 2, 8 x 128: 4, 16 x 128: 2; the forced counts measured "
    "bracket them). The H200's native choices did not change; in its sm_89 path only the 32 x 16 tile at <= 2 "
    "programs (B = 1 at H = 64) counts two programs per SM instead of three (its 228-238 registers allow two): with "
    "2048 / 8192 extra indices it takes 68 / 130 splits instead of 136 / 174 (not re-timed). `auto` here is the "
    "launcher of that run: since b147edb, 100 KB SMs take 32 x 64 tiles in two half tiles (`DecodeConfig.sub_tiles`, "
    "100,352 B) from 64 programs instead of 32 x 32 / 32 x 16 (sm_89's blocks per SM, H100: B = 64 H = 64 66.8 -> "
    "56.4 us, 1024 rows 970 -> 750; `results/bench/explore/sub_tiles-sm89-h100-cfaf665.json`), since 664d3f4 with "
    "their row maximum and sum reduced over both halves at once (`DecodeConfig.sub_joint_reduce`; 1024 rows 747 -> 716 "
    "us; `h64_sub2-sm89-h100-932c7ab.json`), and since 7f94e32 a row's programs are launched side by side "
    "(`DecodeConfig.heads_fastest`: the second 32-head program of a row reads its tokens from L2; 1024 rows 593 -> "
    "520 us at the H100's blocks per SM, 739 -> 703 at sm_89's; `heads_fastest-sm89-h100-6bd2634.json`). The "
    "both-paths table above is of that launcher."
)


def occupancy_lines(explore: Path = EXPLORE) -> list[str]:
    """The sm_89 path at other GPUs' blocks per SM (``gpu_t38.sh occ3``: 3.8 cubins, each launch asking for enough
    dynamic shared memory that an H200 SM holds as many of its programs as the target's SM would, the launcher
    configured with the target's facts on the H200's SMs): the launcher's choice against forced ones."""
    files = sorted(explore.glob("decode_t38_configs_occupancy3_sm*-h200.json"))
    if not files:
        return []
    out = [
        "",
        "**The sm_89 path at those GPUs' blocks per SM** (an H200 SM holds two 67,584 B programs where an sm_86 / 89 "
        "/ 120 SM, 100 KB, holds one: `benchmarks/prod_cubins.py` pads every replayed launch's dynamic shared memory "
        "so that an H200 SM holds as many programs as the target's, and the launcher is configured with that target's "
        "facts on the H200's 132 SMs; Triton 3.8 cubins, CUDA-graph replay, H200 clocks, L2 and bandwidth), µs; "
        "`bh:bn:warps:stages:dv[c]/sN` = a forced tile and split count; fastest in bold:",
    ]
    for f in files:
        data = json.loads(f.read_text())
        rows, target = data["rows"], data["meta"].get("occupancy_of") or "?"
        cfgs = list(dict.fromkeys(r["cfg"] for r in rows))
        cells = {(r["B"], r["H"], r["cfg"]): r.get("us_t38occ") for r in rows}
        out += ["", f"{target} (`{f.relative_to(explore.parents[2])}`, commit `{data['meta'].get('code')}`):", ""]
        out += ["| B | H | " + " | ".join(f"`{c}`" for c in cfgs) + " |", "|---|---|" + "---|" * len(cfgs)]
        for b, h in dict.fromkeys((r["B"], r["H"]) for r in rows):
            vals = [cells.get((b, h, c)) for c in cfgs]
            best = min((v for v in vals if v is not None), default=None)
            txt = [f"**{fmt_us(v)}**" if v is not None and v == best else fmt_us(v) for v in vals]
            out.append(f"| {b} | {h} | " + " | ".join(txt) + " |")
    return [*out, "", OCCUPANCY_NOTE]


def anatomy_lines(explore: Path = EXPLORE, batch: int = 64, heads: int = 64) -> list[str]:
    """The decode loop per target at B = 64, H = 64, the tile's opaque move off and on, from the newest
    ``decode_loop_anatomy-*.json`` (``results/bench/explore/decode_loop_anatomy.py``: the installed Triton's compile,
    CPU only), and the H200 A/B of the move from the newest ``opaque_tile_ab-*.json``."""
    files = sorted(explore.glob("decode_loop_anatomy-*.json"))
    if not files:
        return []
    data = json.loads(files[-1].read_text())
    out = [
        "",
        f"**One tile of the decode loop per target** (B = {batch}, H = {heads}; Triton {data['meta']['triton']} "
        f"compiled ahead of time, SASS of the loop body per thread; `{files[-1].relative_to(explore.parents[2])}`):",
        "",
        "| target | tile | opaque move | shared B | registers | spilled B | loop instructions | shared loads "
        "(LDS / LDSM) | shared stores | MMA | q re-read per tile | tile stored |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in data["rows"]:
        if (r["B"], r["H"]) != (batch, heads):
            continue
        ops = r["loop_ops"]
        mma = f"{ops['HGMMA']} HGMMA" if ops.get("HGMMA") else f"{ops.get('HMMA', 0)} HMMA"
        if not ops.get("HGMMA") and not ops.get("HMMA"):
            mma = "tcgen05"
        q_reread = "yes" if any(name == "b_q" for name, _ in r["local_load"]) else "no"
        tile_n = int(r["config"].split("x")[1].split()[0])
        stored = sum(1 for _, shape in r["local_alloc"] if shape.startswith(f"{tile_n}x512"))
        out.append(
            f"| {r['arch']} | {r['config']} | {'on' if r.get('opaque_tile') else 'off'} | {r['shared']:,} "
            f"| {r['registers']} | {r['spilled']} | {r['loop_instructions']:,} | {ops.get('LDS', 0)} / "
            f"{ops.get('LDSM', 0)} | {ops.get('STS', 0)} | {mma} | {q_reread} | {stored}x |"
        )
    out += ["", ANATOMY_NOTE]
    ab = sorted(explore.glob("opaque_tile_ab-*.json"))
    if ab:
        out += [
            "",
            "**The opaque move on the H200** (Triton 3.6, graph replay, the launcher's configuration, µs; "
            + ", ".join(f"`{f.relative_to(explore.parents[2])}`" for f in ab)
            + "):",
            "",
            "| code path | B | H | off | on | on / off | shared B off -> on |",
            "|---|---|---|---|---|---|---|",
        ]
        for f in ab:
            rows = json.loads(f.read_text())["rows"]
            cells = {(r["B"], r["H"], r["opaque"]): r for r in rows if "us" in r}
            for b, h in dict.fromkeys((r["B"], r["H"]) for r in rows):
                off, on = cells.get((b, h, False)), cells.get((b, h, True))
                if off and on:
                    out.append(
                        f"| {rows[0]['path']} | {b} | {h} | {fmt_us(off['us'])} | {fmt_us(on['us'])} "
                        f"| {on['us'] / off['us']:.2f}x | {off['smem']:,} -> {on['smem']:,} |"
                    )
    return out


def lift_lines(explore: Path = EXPLORE) -> list[str]:
    """The integer dequant's lift (``DecodeConfig.q_lift``) on the H200 from the newest ``q_lift-<path>-*.json`` per
    code path (``gpu_t38.sh lift``: Triton 3.8 cubins, graph replay): the launcher's choice, the lift off and forced
    on, each at the H200's blocks per SM (``t38``) and, in the sm_89 path, at sm_89's (``t38occ``)."""
    files = [sorted(explore.glob(f"q_lift-{path}-*.json"))[-1:] for path in ("native", "sm89")]
    files = [f for group in files for f in group]
    if not files:
        return []
    out = [
        "",
        "**The integer dequant's lift** (`DecodeConfig.q_lift`: the 2^-120 of the integer e4m3 path folded into the "
        "tile's scale multiply, q's NoPE and the output scaled by 2^8 once per program instead; Triton 3.8 cubins, "
        "graph replay, µs; `launcher` = the measured commit's choice: every tile lifted (by 2^60) at `a3fa148`, "
        "mma.sync tiles from 4 tiles a program since `f258a19`; "
        + ", ".join(f"`{f.relative_to(explore.parents[2])}`" for f in files)
        + f", commit `{json.loads(files[0].read_text()).get('git_sha', '?')}`):",
        "",
        "| code path | blocks per SM of | B | H | launcher | lift off | lift on | launcher / off |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for f in files:
        rows = [r for r in json.loads(f.read_text())["rows"] if "us" in r]
        cells = {(r["mode"], r["B"], r["H"], r["variant"]): r["us"] for r in rows}
        for mode, b, h in dict.fromkeys((r["mode"], r["B"], r["H"]) for r in rows):
            base, off, on = (cells.get((mode, b, h, v)) for v in ("base", "nolift", "lift"))
            ratio = f"{base / off:.2f}x" if base and off else "-"
            occ = "sm_89" if mode == "t38occ" else "H200"
            out.append(
                f"| {rows[0]['path']} | {occ} | {b} | {h} | {fmt_us(base)} | {fmt_us(off)} | {fmt_us(on)} | {ratio} |"
            )
    return out


def _prefill_lines(cells: dict) -> list[str]:
    """Extend chunks (q [num_tokens, 1, H, 512] reach the same entry): per-row cost in both paths and FlashMLA's."""
    rows = sorted(b for (x, h, b, swa) in cells if (h, swa, x) == TARGET_SHAPE and b > 128)
    if not rows:
        return []
    out = ["", "**Prefill-sized calls** (H=64, 128 + 512 indices per row; goal: no slower than FlashMLA per row), µs:"]
    out += [
        "",
        "| rows | wgmma | sm_89 path | FlashMLA | wgmma / FlashMLA | ns per row (wgmma) |",
        "|---|---|---|---|---|---|",
    ]
    for b in rows:
        v = cells[(TARGET_SHAPE[2], TARGET_SHAPE[0], b, TARGET_SHAPE[1])]
        ours = min(v.get("sparsemla", float("inf")), v.get("sparsemla_graph", float("inf")))
        fm = v.get("flashmla")
        out.append(
            f"| {b} | {fmt_us(ours)} | {fmt_us(v.get('sparsemla_sm89path_graph'))} | {fmt_us(fm)} "
            f"| {f'{ours / fm:.2f}x' if fm else '-'} | {1000 * ours / b:.0f} |"
        )
    return out


def _projection_lines(cells: dict, data: dict) -> list[str]:
    """A PROJECTION (not a measurement) of the target shapes on GPUs this project has not run on: the bytes floor at
    the GPU's bandwidth, and the sm_89-path time measured on the H200 scaled by waves: the GPU's own configuration's
    programs over its SMs x programs per SM (``resident_programs``: its shared memory per SM) against the measured
    configuration's on the H200. (Where the GPU's own tile differs from the measured one -- an A100 keeps 32 x 32
    tiles, two per SM, where the H200's sm_89 path takes 32 x 64 half tiles from 128 programs -- the measured time
    stands for it, though 32 x 32 tiles ran 2-12 % slower than the half tiles at an H100's blocks per SM,
    results/bench/explore/sub_tiles-sm89-h100-cfaf665.json.)"""
    from dataclasses import replace

    from sparsemla.kernels import device as dev
    from sparsemla.kernels.sparse_decode.triton import choose_config, flops_and_bytes

    h200 = data.get("device") or {}
    if not h200:
        return []
    h200_sms, h200_smem = h200["num_sms"], h200["smem_per_sm"]
    h, swa, x = TARGET_SHAPE
    lines = ["", "**Projection (not a measurement)** for the target shapes on the GPUs this project is for, µs: "
             "`floor` = KV bytes / the GPU's DRAM bandwidth; `projected` = max(floor, the sm_89-path graph replay "
             "measured above x the ratio of waves: programs / (SMs x programs that fit one SM's shared memory) of that "
             "GPU's own configuration against the measured one on the H200). It ignores clock and L2 differences: a "
             "scale, not a promise.", ""]  # fmt: skip
    lines += ["| GPU | SMs | TB/s | " + " | ".join(f"B={b} floor / projected" for b in TARGETS) + " |"]
    lines += ["|---|---|---|" + "---|" * len(TARGETS)]
    measured = dev.running_as(dev.target("sm_90"), (8, 9))  # what the sm_89 path configures on the H200
    here = replace(measured, num_sms=h200_sms, smem_per_sm=h200_smem)
    for name, key, sms, bw in PROJECTED:
        target = replace(dev.TARGETS[key], num_sms=sms)
        cells_txt = []
        for b in TARGETS:
            v = cells.get((x, h, b, swa), {})
            s89 = v.get("sparsemla_sm89path_graph")
            _, nbytes = flops_and_bytes(b, h, swa + x)
            floor = nbytes / bw * 1e6
            if s89 is None:
                cells_txt.append(f"{fmt_us(floor)} / -")
                continue
            cfg, own = choose_config(measured, h, b), choose_config(target, h, b)
            scale = _waves(_launch_shape(b, own), own, target) / _waves(_launch_shape(b, cfg), cfg, here)
            cells_txt.append(f"{fmt_us(floor)} / {fmt_us(max(floor, s89 * scale))}")
        lines.append(f"| {name} | {sms} | {bw / 1e12:.2f} | " + " | ".join(cells_txt) + " |")
    return lines


def _launch_shape(batch: int, cfg: object) -> tuple[int, int, int]:
    """(rows, head blocks, tiles per row) of the target shape's decode launch with ``cfg``."""
    h, swa, x = TARGET_SHAPE
    return batch, -(-h // cfg.block_h) * cfg.dv_split, -(-swa // cfg.block_n) + -(-x // cfg.block_n)


def _waves(shape: tuple[int, int, int], cfg: object, info: object) -> int:
    """Waves of programs of a decode launch (rows, head blocks, tiles) of ``cfg`` on ``info``'s SMs."""
    from sparsemla.kernels.sparse_decode.triton import choose_num_splits, resident_programs

    rows, blocks, tiles = shape
    slots = info.num_sms * resident_programs(cfg, info)
    programs = rows * blocks * choose_num_splits(rows, blocks, tiles, slots)
    return -(-programs // slots)


def _sweep_lines(sweep: dict | None) -> list[str]:
    """The tile-config sweep of the same run (graph replay), if the JSON carries one, plus where the time goes."""
    if not sweep or not sweep.get("rows"):
        return ["", BOUND_NOTE]
    rows = sweep["rows"]
    configs = list(dict.fromkeys(r["config"] for r in rows))
    batches = list(dict.fromkeys(r["B"] for r in rows))
    cell = {(r["B"], r["config"]): r["us"] for r in rows}
    out = ["", f"**Tile configs** ({sweep.get('note', '')}), µs:", ""]
    out += ["| B | " + " | ".join(f"`{c}`" for c in configs) + " |", "|---|" + "---|" * len(configs)]
    for b in batches:
        out.append(f"| {b} | " + " | ".join(fmt_us(cell.get((b, c))) for c in configs) + " |")
    out += ["", BOUND_NOTE]
    return out


def main(argv: list[str]) -> None:
    print(decode_section(json.loads(Path(argv[0]).read_text())))


if __name__ == "__main__":
    main(sys.argv[1:])
