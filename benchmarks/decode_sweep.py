"""Tuning sweep of the decode kernel's launch configs on the target shapes: ``python -m
benchmarks.decode_sweep``. Prints µs per (B, config, split count) so the defaults in
``sparse_decode/triton.py`` (``default_config``, ``choose_num_splits``) come from measurements."""

from __future__ import annotations

import json
from pathlib import Path

import torch
import typer

from benchmarks.decode import Shape, graphed, make_inputs
from sparsemla.kernels.sparse_decode.triton import DecodeConfig, sparse_decode_fwd

app = typer.Typer(add_completion=False)


@app.command()
def main(
    batches: str = typer.Option("1,8,32,64,128"),
    heads: int = typer.Option(64),
    extra_topk: int = typer.Option(512),
    configs: str = typer.Option(
        "64:32:8:2,64:32:8:3,64:64:8:1,64:16:8:2", help="block_h:block_n:warps:stages[:wide|chunked],..."
    ),
    splits: str = typer.Option("auto", help="split counts to try per batch, e.g. auto,1,2,4"),
    out: Path = typer.Option(None, help="Optional JSON output path."),
) -> None:
    """Time each config x split count; the reference checks every config's output once per batch."""
    from triton.testing import do_bench

    rows = []
    for b in [int(x) for x in batches.split(",")]:
        shape = Shape(b, heads, 128, extra_topk)
        sets = [make_inputs(shape, seed=7 + i) for i in range(2)]
        base = sparse_decode_fwd(**sets[0])[0].float()
        for c in configs.split(","):
            parts = c.split(":")
            bh, bn, w, st = (int(v) for v in parts[:4])
            cfg = DecodeConfig(bh, bn, w, st, parts[4] if len(parts) > 4 else "wide")
            for sp in splits.split(","):
                sp_arg = sp if sp == "auto" else int(sp)
                try:
                    o = sparse_decode_fwd(**sets[0], config=cfg, num_splits=sp_arg)[0].float()
                    err = float((o - base).norm() / base.norm())
                    runs = [
                        graphed(
                            lambda kw=kw, cfg=cfg, sp_arg=sp_arg: sparse_decode_fwd(**kw, config=cfg, num_splits=sp_arg)
                        )
                        for kw in sets
                    ]
                    state = {"i": 0}

                    def step(state=state, runs=runs):
                        state["i"] += 1
                        return runs[state["i"] % 2]()

                    us = do_bench(step, warmup=10, rep=40, return_mode="median") * 1e3
                except Exception as exc:  # a config that does not compile (smem) is a result too
                    us, err = float("nan"), float("nan")
                    print(f"B={b} {c} splits={sp}: {type(exc).__name__}: {str(exc)[:200]}")
                rows.append({"B": b, "H": heads, "config": c, "splits": sp, "us": round(us, 2), "err": err})
                print(json.dumps(rows[-1]), flush=True)
        del sets
        torch.cuda.empty_cache()
    if out is not None:
        out.write_text(json.dumps(rows, indent=1))
    print_kernel_resources()


def print_kernel_resources() -> None:
    """Registers, spills and shared memory of every compiled variant of the main kernel (Triton's own report)."""
    from sparsemla.kernels.sparse_decode.triton import _sparse_decode_kernel, _sparse_decode_wide_kernel

    for fn in (_sparse_decode_wide_kernel, _sparse_decode_kernel):
        caches = getattr(fn, "device_caches", {})
        for dev, entry in caches.items():
            for key, k in entry[0].items():
                meta = getattr(k, "metadata", None)
                print(
                    f"{fn.__name__} dev {dev}: regs={getattr(k, 'n_regs', '?')} spills={getattr(k, 'n_spills', '?')} "
                    f"smem={getattr(meta, 'shared', '?')} warps={getattr(meta, 'num_warps', '?')} "
                    f"stages={getattr(meta, 'num_stages', '?')} key={str(key)[-120:]}"
                )


if __name__ == "__main__":
    app()
