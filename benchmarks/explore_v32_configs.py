"""Exploration (not a benchmark claim): V3.2 sparse-decode launch configurations beyond what
:func:`~sparsemla.kernels.sparse_decode.triton_v32.choose_v32_config` picks, timed as CUDA-graph replays on the GPU:
``python -m benchmarks.explore_v32_configs --out-dir DIR --git-sha SHA``.

Each (shape, config, splits) row is checked against the chosen configuration's output (rel err) and timed with
``triton.testing.do_bench`` (median, L2 flushed) over one graph replay. ``--cubins DIR`` also times each row from
DIR/<code path>'s Triton 3.8 cubins (``us_t38``; built here, without a GPU, by ``--build-cubins DIR --path P``:
benchmarks/prod_cubins.py), since the GPU machine's Triton 3.6 compiles some tiles very differently (the lazy rescale
on sm_90's 64-head tile: 816 B spilled on 3.6, none on 3.8). Writes
``<out-dir>/v32_configs-<gpu>-<date>.json``: ``{"op", "gpu", "git_sha", "torch", "triton", "code_path", "rows":
[{"B", "H", "kv_format", "config", "nope_chunks", "stage_k", "splits", "us", "rel_err", "shared_bytes", "error"}]}``
and prints a table.
Results belong in ``results/bench/explore/``; what they change goes into ``choose_v32_config``.
"""

from __future__ import annotations

import contextlib
import json
from pathlib import Path

import torch
import typer

from benchmarks.decode import graphed, rel_err, result_path
from benchmarks.decode_v32 import Shape, make_inputs

app = typer.Typer(add_completion=False, help=__doc__)

# (block_h, block_n, num_warps, num_stages, nope_chunks, stage_k, int_dequant[, opaque_k[, lazy_rescale[, q_lift
# [, l2_prefetch[, prefetch_stride[, heads_fastest[, f16]]]]]]]); a
# Triton compile is ~5 s per config, format and split/unsplit. The references: the chosen 32x32-w8-s1 and the 2026-12-02
# winners (64x32-w8-s2: 278 us at fp8 B=64 H=128, 32x32-w4-s2: 487 us, 16x32-w4-s2: 227 us at B=128 H=16). The variants
# that pass the ahead-of-time gate (Triton 3.8): nope_chunks=4 64-head tiles (0 B spilled on sm_90 at 1-3 stages, 64
# tokens too; <= 170 B on sm_80/86/89/120; not sm_100), the 101-KB-safe 64x16, and the 4-warp tiles with nope_chunks=4
# (+ stage_k for fp8). Then the 64x64 neighbours of the c4 sweep's winner (64x64-w8-s2-c4: 245 us): 3 stages (fp8 only:
# 231,424 B of the H200's 232,448), 16 warps (4 warpgroups, a quarter of the accumulator each), 2 chunks, the fp8
# conversion instructions instead of the integer dequant (``-cvt``; sm_89+), and 128-token tiles at one stage. Last, the
# small-batch and 101-KB bf16 candidates: the chosen 16x16-w8-s1 of B <= 8, 4-warp 16-token tiles, 32x32 at 1 stage;
# then mma.sync neighbours of the chosen 32x32-w4-s2-c4-stage_k (16 tokens x 3 stages, 8 warps) and 16 x 64 tokens.
CONFIGS = (
    (32, 32, 8, 1, 1, False, True),
    (64, 32, 8, 2, 1, False, True),
    (64, 32, 8, 1, 4, False, True),
    (64, 32, 8, 2, 4, False, True),
    (64, 32, 8, 3, 4, False, True),
    (64, 64, 8, 2, 4, False, True),
    (64, 16, 8, 2, 4, False, True),
    (64, 32, 8, 2, 4, True, True),
    (32, 32, 4, 2, 1, False, True),
    (32, 32, 4, 2, 4, True, True),
    (32, 32, 4, 3, 4, True, True),
    (16, 32, 4, 2, 1, False, True),
    (16, 32, 4, 2, 4, False, True),
    (16, 32, 4, 3, 4, False, True),
    (64, 64, 8, 3, 4, False, True),
    (64, 64, 16, 2, 4, False, True),
    (64, 64, 8, 2, 2, False, True),
    (64, 64, 8, 2, 4, False, False),
    (64, 128, 8, 1, 4, False, True),
    (16, 16, 8, 1, 1, False, True),
    (16, 16, 4, 2, 4, False, True),
    (32, 16, 4, 2, 4, False, True),
    (32, 32, 4, 1, 4, False, True),
    (32, 16, 4, 3, 4, True, True),
    (32, 32, 8, 2, 4, True, True),
    (16, 64, 4, 2, 4, False, True),
    # the chosen mma.sync tiles with the K chunks through the opaque move (V32Config.opaque_k: bf16 operand layout)
    (16, 32, 4, 3, 4, False, True, True),
    (32, 32, 4, 2, 4, True, True, True),
    (32, 32, 4, 2, 4, False, True, True),
    # the lazy rescale (V32Config.lazy_rescale) on the chosen tiles: sm_90 fp8 / bf16, <= 16 heads, mma.sync H > 16
    (64, 64, 8, 3, 4, False, True, False, True),
    (64, 64, 8, 2, 4, False, True, False, True),
    (16, 32, 4, 3, 4, False, True, True, True),
    (32, 32, 4, 2, 4, False, True, True, True),
    # the chosen fp8 tiles without the lift (V32Config.q_lift: on by default since the twenty-fourth session)
    (64, 64, 8, 3, 4, False, True, False, False, False),
    (16, 32, 4, 3, 4, False, True, True, False, False),
    (32, 32, 4, 2, 4, False, True, True, False, False),
    # the lift forced on sm_90's wgmma tile (off there by default; ahead of time 1,816 -> 1,691 loop instructions a
    # thread per tile, 80 B spilled)
    (64, 64, 8, 3, 4, False, True, False, False, True),
    # the rows of tiles beyond the pipeline's copies prefetched into L2 (V32Config.l2_prefetch: how many tiles beyond,
    # prefetch_stride: bytes between addresses)
    (64, 64, 8, 3, 4, False, True, False, False, None, 1),
    (64, 64, 8, 3, 4, False, True, False, False, None, 2),
    (64, 64, 8, 3, 4, False, True, False, False, None, 1, 32),
    (32, 32, 4, 2, 4, False, True, True, False, None, 1),
    (32, 32, 4, 2, 4, False, True, True, False, None, 2),
    (16, 32, 4, 3, 4, False, True, True, False, None, 1),
    # a row's head blocks adjacent in the grid (V32Config.heads_fastest): sm_90 fp8 / bf16 and mma.sync H > 16
    (64, 64, 8, 3, 4, False, True, False, False, None, 0, 128, True),
    (64, 64, 8, 2, 4, False, True, False, False, None, 0, 128, True),
    (32, 32, 4, 2, 4, False, True, True, False, None, 0, 128, True),
    # the chosen Triton tiles in f16 (V32Config.f16), the integer bits and the conversion instructions
    (32, 32, 4, 2, 4, False, True, True, False, None, 0, 128, False, True),
    (32, 32, 4, 2, 4, False, False, True, False, None, 0, 128, False, True),
    (16, 32, 4, 3, 4, False, True, True, False, None, 0, 128, False, True),
    (16, 32, 4, 3, 4, False, False, True, False, None, 0, 128, False, True),
    (64, 64, 8, 3, 4, False, True, False, False, None, 0, 128, False, True),
    (64, 64, 8, 3, 4, False, False, False, False, None, 0, 128, False, True),
)
SHAPES = "64:128:fp8_656,128:16:fp8_656,64:128:bf16_576"  # B:H:kv_format


def config_name(cfg) -> str:  # noqa: ANN001 - a V32Config
    """``64x32-w8-s2`` (the 2026-12-02 file's names), then ``-c4`` for nope_chunks, ``-stage_k``, ``-cvt``,
    ``-opaque``, ``-lazy``, ``-nolift`` / ``-lift`` (q_lift forced), ``-pf<tiles ahead>[s<stride>]``, ``-hf``
    (heads_fastest), ``-f16``."""
    name = f"{cfg.block_h}x{cfg.block_n}-w{cfg.num_warps}-s{cfg.num_stages}"
    name += (f"-c{cfg.nope_chunks}" if cfg.nope_chunks > 1 else "") + ("-stage_k" if cfg.stage_k else "")
    name += ("" if cfg.int_dequant else "-cvt") + ("-opaque" if cfg.opaque_k else "")
    name += ("-lazy" if cfg.lazy_rescale else "") + {None: "", False: "-nolift", True: "-lift"}[cfg.q_lift]
    if cfg.l2_prefetch:
        name += f"-pf{cfg.l2_prefetch}" + (f"s{cfg.prefetch_stride}" if cfg.prefetch_stride != 128 else "")
    return name + ("-hf" if cfg.heads_fastest else "") + ("-f16" if cfg.f16 else "")


def _configs(v32, wanted: list[str], fmt: str, info, exact: bool = False) -> list:  # noqa: ANN001 - module, DeviceInfo
    """The CONFIGS whose name contains one of ``wanted`` (``exact``: is one of them) and that fit ``info``'s shared
    memory with ``fmt`` rows."""
    out = []
    for bh, bn, warps, stages, chunks, stage_k, int_dequant, *extra in CONFIGS:
        defaults = (False, False, None, 0, 128, False, False)
        opaque, lazy, lift, ahead, stride, hf, f16 = (*extra, *defaults[len(extra) :])
        cfg = v32.V32Config(bh, bn, warps, stages, True, int_dequant, nope_chunks=chunks, stage_k=stage_k,
                            opaque_k=opaque, lazy_rescale=lazy, q_lift=lift, l2_prefetch=ahead,
                            prefetch_stride=stride, heads_fastest=hf, f16=f16)  # fmt: skip
        if f16 and fmt != "fp8_656":
            continue  # (f16 dequantizes the fp8 cache)
        if (
            config_name(cfg) in wanted if exact else any(part in config_name(cfg) for part in wanted)
        ) and v32.shared_bytes_v32(cfg, fmt, info) <= info.smem_per_block:
            out.append(cfg)  # (over the budget: the launcher refuses it; no row to spend a compile on)
    return out


@app.command()
def main(
    out_dir: Path = typer.Option(Path("results/bench/explore"), help="Folder of the JSON."),
    git_sha: str = typer.Option("", help="Commit measured (the GPU machine's copy has no .git)."),
    ctx: int = typer.Option(8192, help="kv slots per request."),
    only: str = typer.Option("", help="Only the configs whose name contains one of these comma-separated parts."),
    exact: bool = typer.Option(False, help="--only lists whole config names."),
    only_t38: bool = typer.Option(False, "--only-t38", help="With --cubins: time the 3.8 cubins only (no JIT)."),
    splits_: str = typer.Option("auto,4", "--splits", help="Comma-separated split counts ('auto' or ints)."),
    shapes: str = typer.Option(SHAPES, help="Comma-separated B:H:kv_format points."),
    build_cubins: Path = typer.Option(None, help="Here, no GPU: compile the rows' launches into DIR/<--path>."),
    build_path: str = typer.Option("native", "--path", help="With --build-cubins: the code path (native or sm89)."),
    cubins: Path = typer.Option(None, help="GPU: also time each row from DIR/<code path>'s Triton 3.8 cubins."),
) -> None:
    import triton

    from sparsemla import flags
    from sparsemla.kernels import device as dev
    from sparsemla.kernels.sparse_decode import triton_v32 as v32

    wanted = [part for part in only.split(",") if part] or [""]
    split_counts = [int(x) if x.isdigit() else x for x in splits_.split(",") if x]
    points = [(int(b), int(h), f) for b, h, f in (point.split(":") for point in shapes.split(","))]
    if build_cubins is not None:
        from benchmarks import prod_cubins

        facts = prod_cubins.path_info(build_path)[0]

        def workload() -> None:
            for B, H, fmt in points:
                kw = make_inputs(Shape(B=B, s_q=1, H=H, topk=2048, kv_format=fmt, ctx=ctx), 0, "cpu", fill=False)
                args = (kw["q"], kw["kv_cache"], kw["indices"], kw["sm_scale"])
                v32.sparse_decode_v32_fwd(*args, kv_format=fmt)  # the reference row's launch
                for cfg in _configs(v32, wanted, fmt, facts, exact):
                    for splits in split_counts:
                        v32.sparse_decode_v32_fwd(*args, kv_format=fmt, num_splits=splits, config=cfg)

        added = prod_cubins.build(workload, prod_cubins.path_dir(build_cubins, build_path), build_path)
        print(f"{len(added)} cubins added to {build_cubins}/{build_path}")
        return
    info = dev.device_info()
    code_path = flags.TRITON_OVERRIDE_ARCH.get() or "native"
    modes = [("", None)]  # (row key suffix, Replayer): this machine's Triton, then the 3.8 cubins when given
    if cubins is not None:
        from benchmarks import prod_cubins

        modes.append(("_t38", prod_cubins.Replayer(prod_cubins.path_dir(cubins, code_path))))
        if only_t38:  # production's compiler only: the GPU machine's JIT compiles are most of a run's time
            modes = modes[1:]
    rows: list[dict] = []
    doc = {
        "op": "v32_configs",
        "gpu": torch.cuda.get_device_name(),
        "git_sha": git_sha,
        "torch": torch.__version__,
        "triton": triton.__version__,
        "code_path": code_path,
        "ctx": ctx,
        "cubins": str(cubins) if cubins else None,
        "rows": rows,
    }
    op = "v32_configs" if code_path == "native" else f"v32_configs-{code_path}"
    path = result_path(out_dir, op, doc["gpu"])

    def write() -> None:  # after every row: a run cut short by its time limit keeps what it measured
        path.write_text(json.dumps(doc, indent=1) + "\n")

    for B, H, fmt in points:
        kw = make_inputs(Shape(B=B, s_q=1, H=H, topk=2048, kv_format=fmt, ctx=ctx), seed=B + H)
        args = (kw["q"], kw["kv_cache"], kw["indices"], kw["sm_scale"])
        want, _ = v32.sparse_decode_v32_fwd(*args, kv_format=fmt)
        for cfg in _configs(v32, wanted, fmt, info, exact):
            for splits in split_counts:
                shared = v32.shared_bytes_v32(cfg, fmt, info)
                row = dict(B=B, H=H, kv_format=fmt, config=config_name(cfg), nope_chunks=cfg.nope_chunks,
                           stage_k=cfg.stage_k, splits=splits, shared_bytes=shared)  # fmt: skip
                for suffix, rep in modes:

                    def call(args=args, fmt=fmt, cfg=cfg, splits=splits, rep=rep):
                        with rep or contextlib.nullcontext():
                            return v32.sparse_decode_v32_fwd(*args, kv_format=fmt, num_splits=splits, config=cfg)

                    try:
                        out, _ = call()
                        row["rel_err" + suffix] = rel_err(out, want)
                        graph = graphed(call)
                        row["us" + suffix] = 1e3 * triton.testing.do_bench(
                            graph, warmup=10, rep=50, return_mode="median"
                        )
                    except Exception as exc:  # noqa: BLE001 -- an exploration row records why a config failed
                        row["error" + suffix] = f"{type(exc).__name__}: {str(exc)[:200]}"
                rows.append(row)
                write()
                print(json.dumps(row), flush=True)
    write()
    print(f"wrote {path}")


if __name__ == "__main__":
    app()
