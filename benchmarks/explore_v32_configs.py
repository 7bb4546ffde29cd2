"""Exploration (not a benchmark claim): V3.2 sparse-decode launch configurations beyond what
:func:`~sparsemla.kernels.sparse_decode.triton_v32.choose_v32_config` picks, timed as CUDA-graph replays on the GPU:
``python -m benchmarks.explore_v32_configs --out-dir DIR --git-sha SHA``.

Each (shape, config, splits) row is checked against the chosen configuration's output (rel err) and timed with
``triton.testing.do_bench`` (median, L2 flushed) over one graph replay. Writes
``<out-dir>/v32_configs-<gpu>-<date>.json``: ``{"op", "gpu", "git_sha", "torch", "triton", "code_path", "rows":
[{"B", "H", "kv_format", "config", "nope_chunks", "stage_k", "splits", "us", "rel_err", "shared_bytes", "error"}]}``
and prints a table.
Results belong in ``results/bench/explore/``; what they change goes into ``choose_v32_config``.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
import typer

from benchmarks.decode import graphed, rel_err, result_path
from benchmarks.decode_v32 import Shape, make_inputs

app = typer.Typer(add_completion=False, help=__doc__)

# (block_h, block_n, num_warps, num_stages, nope_chunks, stage_k); 14 configs (a Triton compile is ~5 s per config,
# format and split/unsplit). The references: the chosen 32x32-w8-s1 and the 2026-12-02 winners (64x32-w8-s2: 278 us at
# fp8 B=64 H=128, 32x32-w4-s2: 487 us, 16x32-w4-s2: 227 us at B=128 H=16). The variants that pass the ahead-of-time
# gate (Triton 3.8): nope_chunks=4 64-head tiles (0 B spilled on sm_90 at 1-3 stages, 64 tokens too; <= 170 B on
# sm_80/86/89/120; not sm_100), the 101-KB-safe 64x16, and the 4-warp tiles with nope_chunks=4 (+ stage_k for fp8).
CONFIGS = (
    (32, 32, 8, 1, 1, False),
    (64, 32, 8, 2, 1, False),
    (64, 32, 8, 1, 4, False),
    (64, 32, 8, 2, 4, False),
    (64, 32, 8, 3, 4, False),
    (64, 64, 8, 2, 4, False),
    (64, 16, 8, 2, 4, False),
    (64, 32, 8, 2, 4, True),
    (32, 32, 4, 2, 1, False),
    (32, 32, 4, 2, 4, True),
    (32, 32, 4, 3, 4, True),
    (16, 32, 4, 2, 1, False),
    (16, 32, 4, 2, 4, False),
    (16, 32, 4, 3, 4, False),
)
SHAPES = ((64, 128, "fp8_656"), (128, 16, "fp8_656"), (64, 128, "bf16_576"))
SPLITS = ("auto", 4)


def config_name(cfg) -> str:  # noqa: ANN001 - a V32Config
    """``64x32-w8-s2`` (the 2026-12-02 file's names), then ``-c4`` for nope_chunks and ``-stage_k``."""
    name = f"{cfg.block_h}x{cfg.block_n}-w{cfg.num_warps}-s{cfg.num_stages}"
    return name + (f"-c{cfg.nope_chunks}" if cfg.nope_chunks > 1 else "") + ("-stage_k" if cfg.stage_k else "")


@app.command()
def main(
    out_dir: Path = typer.Option(Path("results/bench/explore"), help="Folder of the JSON."),
    git_sha: str = typer.Option("", help="Commit measured (the GPU machine's copy has no .git)."),
    ctx: int = typer.Option(8192, help="kv slots per request."),
    only: str = typer.Option("", help="Only the configs whose name contains this (e.g. '-c4'); default all."),
) -> None:
    import triton

    from sparsemla import flags
    from sparsemla.kernels import device as dev
    from sparsemla.kernels.sparse_decode import triton_v32 as v32

    info = dev.device_info()
    code_path = flags.TRITON_OVERRIDE_ARCH.get() or "native"
    rows: list[dict] = []
    doc = {
        "op": "v32_configs",
        "gpu": torch.cuda.get_device_name(),
        "git_sha": git_sha,
        "torch": torch.__version__,
        "triton": triton.__version__,
        "code_path": code_path,
        "ctx": ctx,
        "rows": rows,
    }
    op = "v32_configs" if code_path == "native" else f"v32_configs-{code_path}"
    path = result_path(out_dir, op, doc["gpu"])

    def write() -> None:  # after every row: a run cut short by its time limit keeps what it measured
        path.write_text(json.dumps(doc, indent=1) + "\n")

    for B, H, fmt in SHAPES:
        kw = make_inputs(Shape(B=B, s_q=1, H=H, topk=2048, kv_format=fmt, ctx=ctx), seed=B + H)
        args = (kw["q"], kw["kv_cache"], kw["indices"], kw["sm_scale"])
        want, _ = v32.sparse_decode_v32_fwd(*args, kv_format=fmt)
        for bh, bn, warps, stages, chunks, stage_k in CONFIGS:
            cfg = v32.V32Config(bh, bn, warps, stages, partial_bf16=True, nope_chunks=chunks, stage_k=stage_k)
            if only not in config_name(cfg):
                continue
            for splits in SPLITS:
                row = dict(B=B, H=H, kv_format=fmt, config=config_name(cfg), nope_chunks=chunks, stage_k=stage_k,
                           splits=splits, shared_bytes=v32.shared_bytes_v32(cfg, fmt, info))  # fmt: skip

                def call(args=args, fmt=fmt, cfg=cfg, splits=splits):
                    return v32.sparse_decode_v32_fwd(*args, kv_format=fmt, num_splits=splits, config=cfg)

                try:
                    out, _ = call()
                    row["rel_err"] = rel_err(out, want)
                    row["us"] = 1e3 * triton.testing.do_bench(graphed(call), warmup=10, rep=50, return_mode="median")
                except Exception as exc:  # noqa: BLE001 -- an exploration row records why a config failed
                    row["error"] = f"{type(exc).__name__}: {str(exc)[:200]}"
                rows.append(row)
                write()
                print(json.dumps(row), flush=True)
    write()
    print(f"wrote {path}")


if __name__ == "__main__":
    app()
