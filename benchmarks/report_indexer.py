"""The indexer section of ``docs/performance.md``, rendered from one ``results/bench/indexer-*.json``.

``indexer_section(data)`` is the per-op function ``benchmarks/report.py`` calls; ``python -m
benchmarks.report_indexer results/bench/indexer-h200-<date>.json`` prints the section on its own."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from benchmarks.indexer import PROVIDERS
from benchmarks.report import cells_by, fmt_us
from sparsemla.kernels.layouts import IDX_DIM  # the indexer's head dim: 2 x H x IDX_DIM MMA FLOPs per key

# (B, ctx) -> logits-only target in us; (B, ctx, "topk") for the logits + top-k target (issue 4)
TARGETS: dict[tuple, float] = {(64, 4096): 14.0, (64, 16384): 45.0, (64, 65536): 160.0, (1, 4096): 8.0}
TOPK_TARGETS: dict[tuple, float] = {(1, 4096): 15.0}
COLUMNS = ("floor", *(p for p in PROVIDERS if p != "floor"))  # the benchmark's providers, the floor first


def _median(vals: list[float]) -> float:
    vals = sorted(vals)
    return vals[len(vals) // 2]


def indexer_section(data: dict) -> str:
    """Markdown: the measured table, the targets with their gaps, and the cap-independence check."""
    cells = cells_by(data["rows"], ("B", "ctx", "cap"))
    seen = list(dict.fromkeys(r["provider"] for r in data["rows"]))
    cols = [c for c in COLUMNS if c in seen] + [c for c in seen if c not in COLUMNS]  # code-path variants last
    out = [
        "## Lightning indexer (DeepSeek-V4, 64 heads x 128, fp8 keys, page 64)",
        "",
        f"{data['gpu']}, torch {data['torch']}, Triton {data['triton']}, commit `{data['git_sha'][:10]}`, "
        f"{data.get('date', '')}; copy bandwidth {data.get('copy_bandwidth_tb_s', '?')} TB/s. "
        f"{data.get('timing', '')}. Top-k providers use k = {data.get('k', 512)}. "
        "`ctx` is the real (compressed) length, `cap` the page-table width sglang passes under decode CUDA graphs.",
        "",
        "| B | ctx | cap | " + " | ".join(cols) + " |",
        "|---|---|---|" + "---|" * len(cols),
    ]
    for (b, ctx, cap), vals in sorted(cells.items()):
        out.append(f"| {b} | {ctx} | {cap} | " + " | ".join(fmt_us(vals.get(c)) for c in cols) + " |")
    out += ["", "Providers: " + "; ".join(f"`{k}`: {v}" for k, v in data.get("providers", {}).items()) + ".", ""]
    out += ["**Targets** (median over caps; `sparsemla` = with Python dispatch, `graph` = CUDA-graph replay):", ""]
    out += ["| target | limit (us) | sparsemla | graph | gap (graph / limit) |", "|---|---|---|---|---|"]
    for (b, ctx), limit in TARGETS.items():
        per_cap = [v for (bb, cc, _), v in cells.items() if (bb, cc) == (b, ctx)]
        if not per_cap:
            continue
        eager = _median([v.get("sparsemla", float("nan")) for v in per_cap])
        graph = _median([v.get("sparsemla_graph", float("nan")) for v in per_cap])
        out.append(
            f"| B={b} ctx={ctx} logits | {limit:.0f} | {fmt_us(eager)} | {fmt_us(graph)} | {graph / limit:.2f}x |"
        )
    for (b, ctx), limit in TOPK_TARGETS.items():
        per_cap = [v for (bb, cc, _), v in cells.items() if (bb, cc) == (b, ctx)]
        if per_cap:
            fused = _median([v.get("sparsemla_topk", float("nan")) for v in per_cap])
            graph = _median([v.get("sparsemla_topk_graph", float("nan")) for v in per_cap])
            gap = graph if graph == graph else fused  # older results have no graph replay of the fused path
            out.append(
                f"| B={b} ctx={ctx} logits + top-k | {limit:.0f} | {fmt_us(fused)} | {fmt_us(graph)} | "
                f"{gap / limit:.2f}x |"
            )
    out += ["", "**Cap independence** (same B and ctx, `sparsemla_graph` at the largest cap over the smallest):", ""]
    spreads = []
    for b, ctx in sorted({(b, c) for b, c, _ in cells}):
        caps = sorted(cap for bb, cc, cap in cells if (bb, cc) == (b, ctx))
        lo = cells[(b, ctx, caps[0])].get("sparsemla_graph")
        hi = cells[(b, ctx, caps[-1])].get("sparsemla_graph")
        if lo and hi:
            spreads.append((abs(hi / lo - 1), b, ctx, caps[0], caps[-1]))
    if spreads:
        worst = max(spreads)
        out.append(
            f"largest change {100 * worst[0]:.1f}% (B={worst[1]}, ctx={worst[2]}, cap {worst[3]} -> {worst[4]}) "
            f"over {len(spreads)} (B, ctx) pairs."
        )
    out += ["", NOTES]
    return "\n".join(out) + "\n"


def code_paths_section(data: dict) -> str:
    """Markdown of a code-path run (``make bench-indexer`` with both paths, a reduced grid): logits and fused
    logits + top-k graph replay in the native and the sm_89 path, one run."""
    cells = cells_by(data["rows"], ("B", "ctx", "cap"))
    out = [
        "## Lightning indexer in both code paths",
        "",
        f"{data['gpu']}, torch {data['torch']}, Triton {data['triton']}, commit `{data['git_sha'][:10]}`, "
        f"{data.get('date', '')}; {data.get('timing', '')}. Native = wgmma; sm_89 path = `TRITON_OVERRIDE_ARCH=sm89` "
        "(mma.sync with fp8 MMAs, the code sm_89 and sm_120 get).",
    ]
    out += _code_path_lines(cells)
    topk = [(k, v) for k, v in sorted(cells.items()) if "sparsemla_topk_graph" in v]
    if topk:
        out += [
            "",
            "Fused logits + top-k (graph replay), µs:",
            "",
            "| B | ctx | native | sm_89 path | sglang torch top-k (eager) |",
        ]
        out += ["|---|---|---|---|---|"]
        for (b, ctx, _), v in topk:
            out.append(
                f"| {b} | {ctx} | {fmt_us(v['sparsemla_topk_graph'])} | "
                f"{fmt_us(v.get('sparsemla_sm89path_topk_graph'))} | {fmt_us(v.get('torch_topk'))} |"
            )
    note = (
        "In the sm_89 path the logits tie the native ones at B=1 and fall behind at B=64: the same 128-token tiles "
        "and 5 stages with fp8 mma.sync instead of wgmma; from 32 rows that path runs at most 4 programs per SM "
        "(`choose_logits_config`)."
    )
    out += ["", note]
    out += _mma_ceiling_lines(cells, data.get("heads", 64))
    out += t38_lines()
    return "\n".join(out) + "\n"


EXPLORE = Path(__file__).resolve().parents[1] / "results" / "bench" / "explore"


def _best_tflops(path: Path) -> dict[str, float]:
    """{operand dtype: the best TFLOP/s of the GEMM configurations} of one mma_ceiling JSON."""
    best: dict[str, float] = {}
    for r in json.loads(path.read_text())["rows"]:
        if "tflops" in r:
            best[r["dtype"]] = max(best.get(r["dtype"], 0.0), r["tflops"])
    return best


def _mma_ceiling_lines(cells: dict, heads: int, explore: Path = EXPLORE) -> list[str]:
    """How close the sm_89 path's longest B=64 logits come to that path's fp8 MMA rate on this GPU, from the newest
    exploratory GEMM ceilings (``results/bench/explore/mma_ceiling.py``), when both are there."""
    s89 = sorted(explore.glob("mma_ceiling-sm89-*.json"))
    nat = sorted(explore.glob("mma_ceiling-native-*.json"))
    longest = max((k for k, v in cells.items() if k[0] == 64 and "sparsemla_sm89path_graph" in v), default=None)
    if not s89 or not nat or longest is None:
        return []
    ceil89, ceilnat = _best_tflops(s89[-1]), _best_tflops(nat[-1])
    if "fp8_e4m3" not in ceil89 or "bf16" not in ceil89 or "fp8_e4m3" not in ceilnat:
        return []
    b, ctx, _ = longest
    v = cells[longest]
    gflop = 2.0 * b * ctx * heads * IDX_DIM / 1e9
    rate = gflop / v["sparsemla_sm89path_graph"] * 1e3  # TFLOP/s
    bound = gflop / ceil89["fp8_e4m3"] * 1e3  # us at that rate
    need = gflop / (1.2 * v["sparsemla_graph"]) * 1e3
    return [
        "",
        f"What bounds the sm_89 path on this GPU (exploratory: a Triton fp8 / bf16 GEMM per code path, "
        f"`{s89[-1].relative_to(explore.parents[2])}`): its fp8 MMAs (mma.sync) peak at "
        f"{ceil89['fp8_e4m3']:.0f} TFLOP/s against {ceilnat['fp8_e4m3']:.0f} with wgmma, and below its own bf16 "
        f"mma.sync ({ceil89['bf16']:.0f}) (a property of the H200: not measured on an Ada or Blackwell GPU). "
        f"B={b} at {ctx // 1024}k is {gflop:.1f} GFLOP of MMAs: {fmt_us(bound)} µs at that peak "
        f"({bound / v['sparsemla_graph']:.2f}x the native time); the kernel runs at {rate:.0f} TFLOP/s "
        f"({rate / ceil89['fp8_e4m3']:.0%} of it), and 1.2x of native would take {need / ceil89['fp8_e4m3']:.0%}."
        + _fp8_lowering_sentence(explore),
    ]


def _fp8_lowering_sentence(explore: Path = EXPLORE) -> str:
    """Why the H200's fp8 mma.sync is slow, from the newest ``fp8_mma_lowering-*.json``
    (``results/bench/explore/fp8_mma_lowering.py``): the indexer logits' sm_89 PTX assembled for sm_89 / sm_120 and for
    sm_90a (what the H200 runs), with their tensor-core and conversion instruction counts; empty without the file."""
    files = sorted(explore.glob("fp8_mma_lowering-*.json"))
    if not files:
        return ""
    data = json.loads(files[-1].read_text())
    by_arch = {
        r["assembled_for"]: r["ops"]
        for r in data["rows"]
        if r["kernel"] == "_indexer_logits_kernel" and r["case"].startswith("indexer logits")
    }
    if not {"sm_89", "sm_90a"} <= by_arch.keys():
        return ""

    def ops(arch: str) -> str:
        return ", ".join(f"{n} `{op}`" for op, n in by_arch[arch].items())

    native = [a for a in ("sm_89", "sm_120") if a in by_arch]
    return (
        f" Why (ahead of time, `{files[-1].relative_to(explore.parents[2])}`, ptxas {data['meta']['ptxas']}): "
        "Triton lowers the sm_89 path for capability 89 but hands ptxas the GPU's own sm_90a, and for sm_90 ptxas "
        "turns each fp8 mma.sync into f16 conversions and two f16 MMAs. "
        f"The logits kernel assembled for sm_90a has {ops('sm_90a')}; assembled for "
        f"{' / '.join(native)} the same PTX has {ops('sm_89')}, the native fp8 MMA. So in this path the H200 times "
        "an emulation of the fp8 MMAs that those GPUs do not run."
    )


def t38_lines(explore: Path = EXPLORE) -> list[str]:
    """The code-path table on Triton 3.8 (production's compiler), from the newest ``indexer_paths_t38-*.json``
    (``results/bench/explore/gpu_t38.sh paths``: cubins built here per code path, replayed on the GPU), beside the GPU
    machine's Triton 3.6 in the same run."""
    files = sorted(explore.glob("indexer_paths_t38-*.json"))
    if not files:
        return []
    data = json.loads(files[-1].read_text())
    cells = cells_by(data["rows"], ("B", "ctx", "cap"))
    out = [
        "",
        f"**Code paths on Triton 3.8** (production's compiler; CUDA-graph replay, µs; {data['gpu']}, commit "
        f"`{data['git_sha'][:10]}`, {data['date']}; `3.8` = compiled by Triton 3.8 on the build machine for that code "
        "path and launched from the cubins, `3.6` = the GPU machine's Triton in the same run; "
        f"`{files[-1].relative_to(explore.parents[2])}`):",
        "",
        "| B | ctx | cap | logits native 3.6 / 3.8 | logits sm_89 path 3.6 / 3.8 | sm_89 / native (3.8) "
        "| fused top-k native 3.6 / 3.8 | fused top-k sm_89 path 3.6 / 3.8 |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for (b, ctx, cap), v in sorted(cells.items()):
        nat, s89 = v.get("sparsemla_t38_graph"), v.get("sparsemla_sm89path_t38_graph")

        def pair(a: str, b_: str, v: dict = v) -> str:
            return f"{fmt_us(v.get(a))} / {fmt_us(v.get(b_))}"

        out.append(
            f"| {b} | {ctx} | {cap} | {pair('sparsemla_graph', 'sparsemla_t38_graph')} "
            f"| {pair('sparsemla_sm89path_graph', 'sparsemla_sm89path_t38_graph')} "
            f"| {f'{s89 / nat:.2f}x' if nat and s89 else '-'} "
            f"| {pair('sparsemla_topk_graph', 'sparsemla_topk_t38_graph')} "
            f"| {pair('sparsemla_sm89path_topk_graph', 'sparsemla_sm89path_topk_t38_graph')} |"
        )
    return out


def _code_path_lines(cells: dict) -> list[str]:
    """Logits graph replay in the sm_89 code path (mma.sync, fp8 MMAs as on sm_89/sm_120) over the native path."""
    pairs = [(k, v["sparsemla_graph"], v["sparsemla_sm89path_graph"]) for k, v in sorted(cells.items())
             if "sparsemla_graph" in v and "sparsemla_sm89path_graph" in v]  # fmt: skip
    if not pairs:
        return []
    out = ["", "**Code paths** (logits, CUDA-graph replay; target: the sm_89 path within 1.2x of the native one):", ""]
    out += ["| B | ctx | cap | native (wgmma) | sm_89 path | ratio |", "|---|---|---|---|---|---|"]
    for (b, ctx, cap), nat, s89 in pairs:
        out.append(f"| {b} | {ctx} | {cap} | {fmt_us(nat)} | {fmt_us(s89)} | {s89 / nat:.2f}x |")
    return out


NOTES = """**Notes on the gaps** (bounds from the `floor` column; the graph column is the kernel, the eager column adds
the Python launcher's host time, which is noisy on the GPU machine -- sglang decodes under CUDA graphs):

- Logits at B=64 are memory-bound; the kernel reaches ~35% (4k), ~60% (16k) and ~78% (64k) of the copy-bandwidth
  floor. The per-(request, split) programs walk 128-token tiles with a page-id gather, an fp8 `[128 tokens x 128] x
  [128 x 64 heads]` dot (swap-AB: the head sum stays in a thread quad) and a masked store, 5 cp.async stages deep at
  B > 4 (re-swept on the H200: 3 -> 5 stages took 64k from 204 to 171 us; results/bench/explore/). ncu at B=64: 3
  programs of 4 warps per SM (137 registers), ~40% of the warp samples waiting on the key tiles; the remaining gap is
  load latency per program at short lengths (a 4k row is 32 tiles over 17 programs) -- DeepGEMM's persistent TMA
  kernel is the reference point (published H200: 20 / 48 / 149 us at 4k / 16k / 64k).
- The top-k is exact and deterministic (ties go to the smaller position). Rows up to 4096 are loaded once and
  selected in registers (8-bit `tl.histogram` radix passes on the in-register keys with an early exit, a compaction
  scan within rows of 32 adjacent keys and then over their totals; the bitonic sort of the k winners only with
  `sorted=True`). Longer rows are shared by up to 32 programs that
  merge each radix pass's histogram through per-row atomics and barriers (times in the top-k section below); a
  participant whose span fits the launch's span tile (1024 or 4096 keys) holds it in registers and runs 5-bit passes
  there (k = 2048: B=64 16k 39 -> 31 us, B=8 16k 26 -> 17; k = 512, launched with `.maxnreg` 128 so that ptxas
  allocates 96 registers instead of 64: B=64 16k 44 -> 30, 32k 73 -> 51; exploratory, results/bench/explore/README.md);
  longer spans and k = 1024 stream 8-bit passes. In split
  launches of >= 2 programs per SM, rows whose span reaches 8192 (k = 512) or 32768 (k = 2048) positions take a
  two-pass filter instead: group maxima bound the threshold, and the candidates above it are selected in one
  register tile (B=64, top-512: 64k rows 92 vs 143 us, 256k 170 vs 481; exploratory, results/bench/explore/README.md).
  Tried and removed: a coarse 12-bit first digit (one 4096-bin histogram, one shared atomic per key on Triton 3.8;
  a few hundred keys of a 64k row of real logits in its threshold bin, then an exact refine among them) in place of
  up to four merged 8-bit passes. On 3.8 cubins (native path, H200, 20 launches per graph, k = 512 / 2048) it lost at
  every shape that reaches it: B=64 16k 19.5 -> 22.7 / 19.6 -> 25.1 us, 64k 42.0 -> 67.2 / 59.7 -> 70.2, B=1 64k
  14.3 -> 17.9 / 13.9 -> 18.3; in one program's register rows B=64 4k 8.3 -> 11.0 / 7.4 -> 11.1, and in the fused
  B=1 4k tail 10.6 -> 13.2. The histogram's atomics cost more than the passes they save
  (`results/bench/explore/topk_coarse_ab-native-h200.json`, `topk_coarse_fused_ab-native-h200.json`, measured at
  `bec8b17`; candidate counts: `topk_coarse_bins-cpu-2026-12-04.json`).
  The fused B=1 logits + top-512 at 4k, from Triton 3.8 cubins (the top-k section below), replays in 15.7 us alone
  in a graph (native; 16.8 in the sm_89 path) and 10.6 per call among 20 against its 15 us target: the register-tile
  radix passes are the chain. At B >= 8 and for rows past 4k the unfused path (logits, then the top-k kernel) is the
  faster one, and it is the one the plugin's top-k hook uses.
- fp8 `tl.dot` on Hopper accumulates with reduced precision (as DeepGEMM's fast accumulation): logits differ from the
  fp32 reference by ~1e-4 relative; the bf16 path (sm_80/86: integer-dequantized keys, no e4m3 type there) matches
  to 1e-5."""


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python -m benchmarks.report_indexer results/bench/indexer-<gpu>-<date>.json")
        return 2
    print(indexer_section(json.loads(Path(argv[0]).read_text())))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
