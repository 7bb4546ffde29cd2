"""Exploration (not a benchmark claim): V3.2 sparse-decode launch configurations beyond what
:func:`~sparsemla.kernels.sparse_decode.triton_v32.choose_v32_config` picks, timed as CUDA-graph replays on the GPU:
``python -m benchmarks.explore_v32_configs --out-dir DIR --git-sha SHA``.

Each (shape, config, splits) row is checked against the chosen configuration's output (rel err) and timed with
``triton.testing.do_bench`` (median, L2 flushed) over one graph replay. Writes
``<out-dir>/v32_configs-<gpu>-<date>.json``: ``{"op", "gpu", "git_sha", "torch", "triton", "code_path", "rows":
[{"B", "H", "kv_format", "config", "splits", "us", "rel_err", "shared_bytes", "error"}]}`` and prints a table.
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

# (block_h, block_n, num_warps, num_stages): the chosen ones, fewer warps (two programs per SM), a pipelined gather
# and the 64-head tile (spills on sm_90 at 8 warps: measured here whether it matters).
CONFIGS = ((32, 32, 8, 1), (32, 32, 4, 1), (32, 32, 4, 2), (32, 32, 8, 2), (16, 32, 4, 2), (64, 32, 8, 1),
           (64, 32, 8, 2), (64, 16, 4, 2))  # fmt: skip
SHAPES = ((64, 128, "fp8_656"), (128, 16, "fp8_656"), (64, 128, "bf16_576"))
SPLITS = ("auto", 4)


@app.command()
def main(
    out_dir: Path = typer.Option(Path("results/bench/explore"), help="Folder of the JSON."),
    git_sha: str = typer.Option("", help="Commit measured (the GPU machine's copy has no .git)."),
    ctx: int = typer.Option(8192, help="kv slots per request."),
) -> None:
    import triton

    from sparsemla.kernels.sparse_decode import triton_v32 as v32

    rows = []
    for B, H, fmt in SHAPES:
        kw = make_inputs(Shape(B=B, s_q=1, H=H, topk=2048, kv_format=fmt, ctx=ctx), seed=B + H)
        args = (kw["q"], kw["kv_cache"], kw["indices"], kw["sm_scale"])
        want, _ = v32.sparse_decode_v32_fwd(*args, kv_format=fmt)
        for bh, bn, warps, stages in CONFIGS:
            cfg = v32.V32Config(bh, bn, warps, stages, partial_bf16=True)
            for splits in SPLITS:
                row = dict(B=B, H=H, kv_format=fmt, config=f"{bh}x{bn}-w{warps}-s{stages}", splits=splits,
                           shared_bytes=v32.shared_bytes_v32(cfg, fmt))  # fmt: skip

                def call(args=args, fmt=fmt, cfg=cfg, splits=splits):
                    return v32.sparse_decode_v32_fwd(*args, kv_format=fmt, num_splits=splits, config=cfg)

                try:
                    out, _ = call()
                    row["rel_err"] = rel_err(out, want)
                    row["us"] = 1e3 * triton.testing.do_bench(graphed(call), warmup=10, rep=50, return_mode="median")
                except Exception as exc:  # noqa: BLE001 -- an exploration row records why a config failed
                    row["error"] = f"{type(exc).__name__}: {str(exc)[:200]}"
                rows.append(row)
                print(json.dumps(row), flush=True)
    doc = {
        "op": "v32_configs",
        "gpu": torch.cuda.get_device_name(),
        "git_sha": git_sha,
        "torch": torch.__version__,
        "triton": triton.__version__,
        "code_path": "native",
        "ctx": ctx,
        "rows": rows,
    }
    out_dir.mkdir(parents=True, exist_ok=True)
    path = result_path(out_dir, "v32_configs", doc["gpu"])
    path.write_text(json.dumps(doc, indent=1) + "\n")
    print(f"wrote {path}")


if __name__ == "__main__":
    app()
