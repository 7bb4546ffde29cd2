"""GPU benchmark of DeepSeek-V3.2 sparse-MLA prefill (``flash_mla_sparse_fwd``'s contract): ``python -m
benchmarks.prefill``.

Providers, all measured in the same run on the same inputs:

* ``sparsemla`` this project's Triton kernel (:func:`~sparsemla.kernels.sparse_prefill.triton.sparse_prefill_fwd`)
  with the configuration :func:`~sparsemla.kernels.sparse_prefill.triton.choose_config` gives;
  ``sparsemla_sm89path`` the same in the sm_89 code path (``TRITON_OVERRIDE_ARCH=sm89`` in a child process: mma.sync
  with the configurations sm_80..sm_120 get, within their 101,376 B budget); ``--configs`` adds one provider
  ``sparsemla[bh,bn,warps,stages]`` per explicit configuration (a tuning sweep);
* ``flashmla``           sgl-flash-mla's ``flash_mla_sparse_fwd`` (legacy SM90 kernel on Hopper, as sglang 0.5.23 calls
  it); it takes 64 or 128 heads only, so H < 64 is padded to 64 heads as sglang does (the padded call is timed);
* ``reference``          the fp32 torch spec (s_q <= 1024 only);
* ``floor``              max(FLOPs / measured bf16 matmul rate, gathered bytes / measured copy bandwidth), both measured
  in the run (the byte term counts every gathered row as read once per token and head block from DRAM; at s_kv of
  32k the rows fit in L2, so it is a loose bound).

Inputs are random (never zeros): q, kv ~ N(0, 1) in bf16; each query's indices are distinct random rows of kv (as the
indexer's top-k gives), topk_length = topk. Timings are ``triton.testing.do_bench`` medians (L2 flushed before each
repetition) over ``ROTATE`` input sets used in turn. Writes ``results/bench/prefill-<gpu>-<date>.json``:
``{"op": "prefill", "gpu", "git_sha", "torch", "triton", "rows": [{"s_q", "H", "topk", "s_kv", "provider", "us",
"tflops"}], "checks": [...]}`` and prints a table.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import typer

from benchmarks import paths as code_paths
from benchmarks.decode import measure_ceilings, rel_err, result_path, write_doc

app = typer.Typer(add_completion=False, help=__doc__)

ROTATE = 2
D_QK = 576


@dataclass(frozen=True)
class Shape:
    """One benchmark point: query tokens of the chunk, query heads (per rank), top-k, kv rows."""

    s_q: int
    H: int
    topk: int
    s_kv: int


def make_inputs(shape: Shape, seed: int, device: str = "cuda") -> dict[str, Any]:
    """``flash_mla_sparse_fwd`` arguments for one shape (sm_scale 576^-0.5 as V3.2's q . k over the latent)."""
    gen = torch.Generator(device=device).manual_seed(seed)
    rows = []
    for lo in range(0, shape.s_q, 512):
        n = min(512, shape.s_q - lo)
        rows.append(torch.rand(n, shape.s_kv, device=device, generator=gen).topk(shape.topk, dim=-1).indices)
    return dict(
        q=torch.randn(shape.s_q, shape.H, D_QK, device=device, generator=gen).to(torch.bfloat16),
        kv=torch.randn(shape.s_kv, 1, D_QK, device=device, generator=gen).to(torch.bfloat16),
        indices=torch.cat(rows).to(torch.int32).view(shape.s_q, 1, shape.topk),
        sm_scale=D_QK**-0.5,
        d_v=512,
        topk_length=torch.full((shape.s_q,), shape.topk, dtype=torch.int32, device=device),
    )


def floor_us(shape: Shape, ceilings: dict[str, float]) -> float:
    from sparsemla.kernels.sparse_prefill.triton import flops_and_bytes

    flops, nbytes = flops_and_bytes(shape.s_q, shape.H, shape.topk)
    return max(flops / ceilings["bf16_flops_per_s"], nbytes / ceilings["copy_bytes_per_s"]) * 1e6


def flashmla_call(flash_mla, kw: dict[str, Any]):
    """sgl-flash-mla's sparse prefill on the same inputs (q padded to 64 heads when H < 64, as sglang pads)."""
    q = kw["q"]
    heads = q.shape[1]
    pad = 64 if heads <= 64 else 128
    if pad > heads:
        q = torch.cat([q, q.new_zeros(q.shape[0], pad - heads, q.shape[2])], dim=1)
    legacy = torch.cuda.get_device_capability()[0] == 9  # the current kernels are built for sm_100+ only

    def run():
        return flash_mla.flash_mla_sparse_fwd(
            q, kw["kv"], kw["indices"], kw["sm_scale"], 512, None, kw["topk_length"], use_legacy=legacy,
            return_log2_lse=True if legacy else None,
        )  # fmt: skip

    return run


def parse_configs(text: str) -> list[tuple[int, int, int, int]]:
    """``"16,64,8,2;64,32,8,2"`` -> [(block_h, block_n, num_warps, num_stages), ...]."""
    out = []
    for part in text.split(";"):
        if part.strip():
            bh, bn, w, s = (int(x) for x in part.split(","))
            out.append((bh, bn, w, s))
    return out


def bench_shape(
    shape: Shape, providers: list[str], configs: list[tuple[int, int, int, int]], flash_mla, code_path: str
) -> tuple[list[dict[str, Any]], dict[str, float]]:
    """Rows (µs, TFLOP/s) of every provider on one shape, and each provider's relative error against sparsemla's."""
    from triton.testing import do_bench

    from sparsemla.kernels.sparse_prefill import triton as sp
    from sparsemla.kernels.sparse_prefill.reference import sparse_prefill_reference

    sets = [make_inputs(shape, seed=10 * shape.s_q + shape.H + i) for i in range(ROTATE)]
    fns: dict[str, list] = {}
    if "sparsemla" in providers:
        fns["sparsemla"] = [lambda kw=kw: sp.sparse_prefill_fwd(**kw) for kw in sets]
        for c in configs:
            cfg = sp.PrefillConfig(*c)
            fns[f"sparsemla[{','.join(map(str, c))}]"] = [
                lambda kw=kw, cfg=cfg: sp.sparse_prefill_fwd(**kw, config=cfg) for kw in sets
            ]
    if "flashmla" in providers and flash_mla is not None and torch.cuda.get_device_capability()[0] in (9, 10):
        fns["flashmla"] = [flashmla_call(flash_mla, kw) for kw in sets]
    if "reference" in providers and shape.s_q <= 1024:
        fns["reference"] = [lambda kw=kw: sparse_prefill_reference(**kw) for kw in sets]

    flops, _ = sp.flops_and_bytes(shape.s_q, shape.H, shape.topk)
    errs: dict[str, float] = {}
    ours = fns["sparsemla"][0]()[0] if "sparsemla" in fns else None
    rows = []
    for name, calls in fns.items():
        try:
            out = calls[0]()[0][:, : shape.H]
        except Exception as exc:  # noqa: BLE001 - a sweep configuration that does not fit is a row, not a crash
            rows.append({**shape.__dict__, "provider": code_paths.provider(name, code_path), "error": str(exc)[:200]})
            continue
        if ours is not None:
            errs[name] = rel_err(out, ours)
        state = {"i": 0}

        def step(calls=calls, state=state):
            state["i"] += 1
            return calls[state["i"] % len(calls)]()

        us = do_bench(step, warmup=5, rep=40, return_mode="median") * 1e3
        provider = code_paths.provider(name, code_path)
        rows.append({**shape.__dict__, "provider": provider, "us": round(us, 2), "tflops": round(flops / us / 1e6, 1)})
    del sets, fns
    torch.cuda.empty_cache()
    return rows, errs


def _print_table(rows: list[dict[str, Any]]) -> None:
    from rich.console import Console
    from rich.table import Table

    provs = list(dict.fromkeys(r["provider"] for r in rows))
    keys = list(dict.fromkeys((r["s_q"], r["H"], r["topk"], r["s_kv"]) for r in rows))
    cell = {(r["s_q"], r["H"], r["topk"], r["s_kv"], r["provider"]): r for r in rows}
    table = Table(title="sparse-MLA prefill (µs / TFLOP/s, do_bench median)")
    for col in ("s_q", "H", "topk", "s_kv", *provs):
        table.add_column(col, justify="right")
    for k in keys:
        cells = []
        for p in provs:
            r = cell.get((*k, p))
            cells.append("-" if r is None or "us" not in r else f"{r['us']:.0f} / {r.get('tflops', 0):.0f}")
        table.add_row(*map(str, k), *cells)
    Console(width=200).print(table)


@app.command()
def main(
    out_dir: Path = typer.Option(Path("results/bench"), help="Where prefill-<gpu>-<date>.json is written."),
    tokens: str = typer.Option("1024,8192", help="Comma-separated query tokens per call (prefill chunk)."),
    heads: str = typer.Option("16,64,128", help="Comma-separated query heads (per rank)."),
    topk: int = typer.Option(2048, help="Indices per query token."),
    s_kv: int = typer.Option(32768, help="kv rows (context of the chunk)."),
    providers: str = typer.Option("sparsemla,flashmla,reference", help="Providers to time."),
    configs: str = typer.Option("", help="Extra sparsemla configurations 'bh,bn,warps,stages;...' (a sweep)."),
    paths: str = typer.Option("native,sm89", help="Code paths: native and/or sm89, each in its own process."),
    child_out: Path = typer.Option(None, hidden=True, help="(internal) write this process's rows here."),
    git_sha: str = typer.Option("", help="Commit the numbers belong to (default: `git rev-parse HEAD` here)."),
) -> None:
    """Time every provider over the shape grid in each code path and write the JSON (needs a CUDA GPU)."""
    import sys

    from sparsemla.console import fail

    if not torch.cuda.is_available():
        fail("the prefill benchmark needs a CUDA GPU", "run it on the GPU machine (make bench-prefill)")
    try:
        path_list = code_paths.parse(paths)
    except ValueError as exc:
        fail(str(exc), "e.g. --paths native,sm89")
    gpu = torch.cuda.get_device_name()
    if child_out is None:
        ceilings = measure_ceilings()
        rows, checks = code_paths.run_children("benchmarks.prefill", sys.argv[1:], path_list)
        for key in dict.fromkeys((r["s_q"], r["H"], r["topk"], r["s_kv"]) for r in rows):
            rows.append({**Shape(*key).__dict__, "provider": "floor", "us": round(floor_us(Shape(*key), ceilings), 2)})
        path = result_path(out_dir, "prefill", gpu)
        _write(path, gpu, git_sha, ceilings, rows, checks, path_list)
        _print_table(rows)
        print(f"wrote {path}")
        return

    code_path = path_list[0]
    provs = [p.strip() for p in providers.split(",") if p.strip()]
    if code_path != "native":
        provs = [p for p in provs if p == "sparsemla"]  # the baselines do not change with Triton's target
    try:
        import flash_mla  # type: ignore[import-not-found]
    except ImportError:
        flash_mla = None
    shapes = [Shape(int(s), int(h), topk, s_kv) for s in tokens.split(",") for h in heads.split(",")]
    rows, checks = [], []
    for shape in shapes:
        r, errs = bench_shape(shape, provs, parse_configs(configs), flash_mla, code_path)
        rows += [{**x, "code_path": code_path} for x in r]
        checks.append({**shape.__dict__, "rel_err_vs_sparsemla": errs})
        print(json.dumps(r), flush=True)
        child_out.write_text(json.dumps({"rows": rows, "checks": checks}))  # a cut-short run keeps what it measured


def _write(path: Path, gpu: str, git_sha: str, ceilings: dict, rows: list, checks: list, paths: list[str]) -> None:
    code_paths_doc = {
        p: "this GPU's own" if p == "native" else f"TRITON_OVERRIDE_ARCH={p}: mma.sync, sm_{p[2:]}'s configurations"
        for p in paths
    }
    method = (
        f"triton.testing.do_bench median of eager calls (L2 flushed before each rep), inputs rotated over {ROTATE} "
        "sets; each code path in its own process; tflops = 2*s_q*H*topk*(576+512) / time"
    )
    write_doc(path, "prefill", gpu, git_sha, ceilings, rows, checks, code_paths_doc, method)


if __name__ == "__main__":
    app()
