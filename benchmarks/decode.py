"""GPU benchmark of DeepSeek-V4 sparse-MLA decode: ``python -m benchmarks.decode``.

Providers, all measured in the same run on the same inputs:

* ``sparsemla``      this project's Triton kernel (:func:`sparsemla.kernels.sparse_decode.triton.sparse_decode_fwd`);
  ``sparsemla_graph`` the same calls replayed from a CUDA graph (every shape); ``sparsemla_sm89path`` /
  ``sparsemla_sm89path_graph`` the same in the sm_89 code path (``TRITON_OVERRIDE_ARCH=sm89`` in a child process:
  mma.sync with the configurations sm_80..sm_120 get, within their 101,376 B budget);
* ``sglang_triton``  sglang 0.5.23's per-head kernel ``flash_mla_sparse_decode_triton`` (loaded by file path; it imports
  only torch and triton), measured on the target shapes (H=64, extra 512) only: it is ~1000x slower elsewhere;
* ``flashmla``       sgl-flash-mla 1.0.0's SM90 kernel (``use_legacy=True``); it only takes 64 or 128 heads, so H < 64
  is padded to 64 heads as sglang does (the padded call is what is timed);
* ``reference``      the fp32 torch spec (target shapes only);
* ``floor``          max(bytes / measured copy bandwidth, FLOPs / measured bf16 matmul rate), both measured in the run.

Inputs are random (never zeros): fp8 NoPE ~ N(0, 4), ue8m0 scales 2^-5..2^0, bf16 RoPE, random pads; each request's SWA
indices lie in its own 256-token page, extra indices are distinct random slots of a compressed cache (page 64).
Timings are ``triton.testing.do_bench`` medians of eager calls (do_bench flushes L2 before each repetition) over
``ROTATE`` input sets used in turn, the method of the baselines in notes/h200-baselines.md; ``sparsemla_graph`` times
one CUDA-graph replay of the same call per repetition. Prefill-sized calls (``--prefill-rows``: extend chunks reach the
same entry as q [num_tokens, 1, H, 512]) are measured at H=64, 128 + 512 indices.
Writes ``results/bench/decode-<gpu>-<date>.json``:
``{"op": "decode", "gpu", "git_sha", "torch", "triton", "rows": [{"B", "H", "swa_topk", "extra_topk", "provider",
"us"}], ...}`` and prints a table.
"""

from __future__ import annotations

import datetime as _dt
import importlib.util
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import typer

from benchmarks import paths as code_paths
from sparsemla import artifacts
from sparsemla.kernels import device as dev
from sparsemla.kernels.layouts import V4_DATA_BYTES, V4_NOPE_DIM, V4_NUM_SCALES, V4_SCALE_BYTES, v4_page_bytes

app = typer.Typer(add_completion=False, help=__doc__)

SWA_PAGE = 256
EXTRA_PAGE = 64
ROTATE = 2
TARGET = {"H": 64, "swa_topk": 128, "extra_topk": 512}


@dataclass(frozen=True)
class Shape:
    """One benchmark point: batch, query heads, SWA indices, extra (compressed-cache) indices."""

    B: int
    H: int
    swa_topk: int
    extra_topk: int

    @property
    def is_target(self) -> bool:
        return (self.H, self.swa_topk, self.extra_topk) == tuple(TARGET.values())


def random_v4_cache_gpu(
    num_pages: int, page_size: int, gen: torch.Generator, device: str, fill: bool = True
) -> torch.Tensor:
    """A random V4 ``k_cache`` view built on the GPU (the CPU builder in layouts.py is too slow for GBs);
    ``fill=False``: the same view of an unfilled buffer (compiling launches ahead of time needs only the layout)."""
    page_bytes = v4_page_bytes(page_size)
    if not fill:
        buf = torch.empty((num_pages, page_bytes), dtype=torch.uint8, device=device)
        return buf[:, : page_size * 584].view(num_pages, page_size, 1, 584)
    buf = torch.randint(0, 256, (num_pages, page_bytes), dtype=torch.uint8, device=device, generator=gen)
    tokens = num_pages * page_size
    nope = (torch.randn(tokens, V4_NOPE_DIM, device=device, generator=gen) * 2.0).to(torch.float8_e4m3fn)
    rope = torch.randn(tokens, 64, device=device, generator=gen).to(torch.bfloat16)
    data = torch.cat([nope.view(torch.uint8), rope.view(torch.uint8)], dim=1)
    buf[:, : page_size * V4_DATA_BYTES] = data.view(num_pages, page_size * V4_DATA_BYTES)
    scales = torch.randint(122, 128, (tokens, V4_NUM_SCALES), dtype=torch.uint8, device=device, generator=gen)
    rows = buf[:, page_size * V4_DATA_BYTES : page_size * (V4_DATA_BYTES + V4_SCALE_BYTES)]
    rows.view(num_pages, page_size, V4_SCALE_BYTES)[:, :, :V4_NUM_SCALES] = scales.view(num_pages, page_size, -1)
    return buf[:, : page_size * 584].view(num_pages, page_size, 1, 584)


def make_inputs(shape: Shape, seed: int, device: str = "cuda", fill: bool = True) -> dict[str, Any]:
    """sglang-contract kwargs for one shape (full lengths, sink on, softmax scale 512^-0.5); ``fill=False``: tensors
    of the same shapes, dtypes and strides left unfilled (``--build-cubins``: the launches compile from those)."""
    gen = torch.Generator(device=device).manual_seed(seed)
    B, H = shape.B, shape.H
    x_pages = -(-2 * B * shape.extra_topk // EXTRA_PAGE)
    k_cache = random_v4_cache_gpu(B, SWA_PAGE, gen, device, fill)
    if not fill:
        extra = random_v4_cache_gpu(x_pages, EXTRA_PAGE, gen, device, fill)
        indices = torch.empty((B, 1, shape.swa_topk), dtype=torch.int32, device=device)
        extra_idx = torch.empty((B, 1, shape.extra_topk), dtype=torch.int32, device=device)
        q, sink = torch.empty((B, 1, H, 512), dtype=torch.bfloat16, device=device), torch.empty(H, device=device)
    else:  # the generator's draws in the order of every earlier run (the same inputs per seed)
        own = torch.stack([torch.randperm(SWA_PAGE, device=device, generator=gen)[: shape.swa_topk] for _ in range(B)])
        indices = (own + torch.arange(B, device=device)[:, None] * SWA_PAGE).to(torch.int32).view(B, 1, -1)
        extra = random_v4_cache_gpu(x_pages, EXTRA_PAGE, gen, device)
        perm = torch.randperm(x_pages * EXTRA_PAGE, device=device, generator=gen)[: B * shape.extra_topk]
        extra_idx = perm.to(torch.int32).view(B, 1, shape.extra_topk)
        q = torch.randn(B, 1, H, 512, device=device, generator=gen).to(torch.bfloat16)
        sink = torch.randn(H, device=device, generator=gen)
    return dict(
        q=q,
        k_cache=k_cache,
        indices=indices,
        topk_length=torch.full((B,), shape.swa_topk, dtype=torch.int32, device=device),
        attn_sink=sink,
        head_dim_v=512,
        softmax_scale=512**-0.5,
        extra_k_cache=extra,
        extra_indices_in_kvcache=extra_idx,
        extra_topk_length=torch.full((B,), shape.extra_topk, dtype=torch.int32, device=device),
    )


def measure_ceilings() -> dict[str, float]:
    """Device copy bandwidth (bytes read + written per second) and bf16 8192^3 matmul rate, medians of do_bench."""
    from triton.testing import do_bench

    src = torch.empty(1 << 30, dtype=torch.uint8, device="cuda").random_()
    dst = torch.empty_like(src)
    ms = do_bench(lambda: dst.copy_(src), warmup=25, rep=200, return_mode="median")
    bw = 2 * src.numel() / (ms * 1e-3)
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    ms = do_bench(lambda: a @ b, warmup=25, rep=200, return_mode="median")
    return {"copy_bytes_per_s": bw, "bf16_flops_per_s": 2 * 8192**3 / (ms * 1e-3)}


def floor_us(shape: Shape, ceilings: dict[str, float]) -> tuple[float, float, float]:
    """(floor, bytes term, FLOP term) in µs: KV rows read once (584 B + 4 B index), q and out once; 2*H*T*1024 FLOPs."""
    from sparsemla.kernels.sparse_decode.triton import flops_and_bytes

    flops, nbytes = flops_and_bytes(shape.B, shape.H, shape.swa_topk + shape.extra_topk)
    t_mem = nbytes / ceilings["copy_bytes_per_s"] * 1e6
    t_mma = flops / ceilings["bf16_flops_per_s"] * 1e6
    return max(t_mem, t_mma), t_mem, t_mma


def load_sglang_triton(path: Path):
    """sglang 0.5.23's ``flash_mla_sparse_decode_triton`` from its source file (imports only torch and triton)."""
    spec = importlib.util.spec_from_file_location("sglang_flash_mla_sm120_triton", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.flash_mla_sparse_decode_triton


def flashmla_call(flash_mla, kw: dict[str, Any], pad_heads: int, meta: Any = None) -> Any:
    """A FlashMLA (legacy SM90) call on the same inputs; q and sink padded to ``pad_heads`` when H is smaller.

    ``meta``: the ``FlashMLASchedMeta`` to use (FlashMLA fills an empty one on its first call and requires the same
    shapes and lengths on every reuse); a new one when None."""
    q, sink = kw["q"], kw["attn_sink"]
    H = q.shape[2]
    if pad_heads > H:
        q = torch.cat([q, q.new_zeros(*q.shape[:2], pad_heads - H, q.shape[3])], dim=2)
        sink = torch.cat([sink, sink.new_full((pad_heads - H,), float("-inf"))])
    if meta is None:
        meta = flash_mla.get_mla_metadata()[0]

    def run():
        return flash_mla.flash_mla_with_kvcache(
            q, kw["k_cache"], None, None, head_dim_v=512, tile_scheduler_metadata=meta,
            softmax_scale=kw["softmax_scale"], is_fp8_kvcache=True, indices=kw["indices"], attn_sink=sink,
            extra_k_cache=kw["extra_k_cache"], extra_indices_in_kvcache=kw["extra_indices_in_kvcache"],
            topk_length=kw["topk_length"], extra_topk_length=kw["extra_topk_length"], use_legacy=True,
        )  # fmt: skip

    return run


def load_flash_mla(device: torch.device) -> tuple[Any, str]:
    """(the ``flash_mla`` module of sgl-flash-mla, "") where its decode can run on ``device``, else (None, why not)."""
    try:
        import flash_mla  # type: ignore[import-not-found]
    except Exception as exc:  # noqa: BLE001 -- ImportError, or the CUDA extension failing to load (OSError, symbols)
        return None, (
            f"flash_mla is not importable ({type(exc).__name__}: {str(exc)[:200]}); it comes from the sgl-flash-mla "
            "1.0.0 wheel (.gpu/wheels, installed by benchmarks/gpu-setup.sh)"
        )
    if device.type != "cuda":
        return None, f"FlashMLA's decode kernels need a CUDA GPU (sm_90 or sm_100); this run is on {device.type}"
    major, minor = torch.cuda.get_device_capability(device)
    if major not in (9, 10):
        return None, f"sgl-flash-mla's sparse decode is built for sm_90 and sm_100; this GPU is sm_{major}{minor}"
    return flash_mla, ""


def flashmla_pad_heads(heads: int) -> int:
    """The head count FlashMLA's decode is called with: 64 or 128 (sglang pads smaller counts to 64 on SM90)."""
    return 64 if heads <= 64 else 128


class FlashMLADecode:
    """sglang 0.5.23's DeepSeek-V4 decode on Hopper behind the sparse-decode kwargs contract (a ``DecodeFn``).

    Each call is :func:`flashmla_call`: ``flash_mla.flash_mla_with_kvcache(..., is_fp8_kvcache=True,
    use_legacy=True)`` with the kwargs ``DeepseekV4AttnBackend._forward_attention`` passes for the V4 (non-interleaved)
    layout. sglang keeps one ``FlashMLASchedMeta`` per compress ratio per forward batch, filled by the first layer of
    that ratio; here one per call geometry (q, cache and index shapes: one per layer type within a step), emptied by
    :meth:`new_step` when ``per_step`` (so a captured step computes the split schedule once per layer type, as sglang's
    captured step does), else kept from the first step on (the schedule is computed once, outside later steps).
    Make one instance per set of inputs: a kept schedule is only valid for the lengths it was computed from."""

    def __init__(self, flash_mla: Any, per_step: bool = True) -> None:
        self.flash_mla = flash_mla
        self.per_step = per_step
        self._metas: dict[tuple, Any] = {}

    def new_step(self) -> None:
        if self.per_step:
            self._metas.clear()

    def __call__(self, q, k_cache, indices, topk_length, attn_sink, head_dim_v, softmax_scale, extra_k_cache=None,
                 extra_indices_in_kvcache=None, extra_topk_length=None):  # fmt: skip
        if head_dim_v != 512:
            raise ValueError(f"FlashMLA's decode takes head_dim_v = 512 only, got {head_dim_v}")
        geometry = (q, k_cache, indices, extra_k_cache, extra_indices_in_kvcache)
        key = tuple(None if t is None else tuple(t.shape) for t in geometry)
        if key not in self._metas:
            self._metas[key] = self.flash_mla.get_mla_metadata()[0]
        kw = dict(q=q, k_cache=k_cache, indices=indices, topk_length=topk_length, attn_sink=attn_sink,
                  softmax_scale=softmax_scale, extra_k_cache=extra_k_cache,
                  extra_indices_in_kvcache=extra_indices_in_kvcache, extra_topk_length=extra_topk_length)  # fmt: skip
        heads = q.shape[2]
        out, lse = flashmla_call(self.flash_mla, kw, flashmla_pad_heads(heads), self._metas[key])()
        return out[:, :, :heads], lse[:, :heads]


def graphed(call):
    """``call`` captured in a CUDA graph (after a warm-up on a side stream); returns its replay function.

    Decode runs under CUDA graphs in sglang, so the graph replay is what a decode step pays; do_bench then times one
    replay per repetition with L2 flushed before it. Falls back to the eager call when capture fails."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        call()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    try:
        with torch.cuda.graph(graph):
            call()
    except RuntimeError as exc:
        print(f"capture failed, timing eagerly: {str(exc)[:120]}")
        return call
    return graph.replay


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.float() - b.float()).norm() / b.float().norm().clamp_min(1e-30))


def bench_shape(
    shape: Shape,
    providers: list[str],
    ceilings: dict[str, float],
    sglang_fn,
    flash_mla,
    splits: int | str,
    code_path: str = "native",
    replayer: Any = None,
    occupancy: tuple[Any, Any] | None = None,
) -> tuple[list[dict[str, Any]], dict[str, float]]:
    """Rows (µs) of every provider on one shape, and each provider's relative error against sparsemla's output.
    ``replayer`` (a :class:`benchmarks.prod_cubins.Replayer`): also ``sparsemla_t38`` / ``sparsemla_t38_graph``, the
    same calls launched from Triton 3.8 cubins. ``occupancy`` (a Replayer made with ``occupancy_of``, and the
    DeviceInfo the launcher is given: that target's facts on this GPU's SMs): also ``sparsemla_t38occ_graph``, the
    same calls at that target's blocks per SM."""
    from triton.testing import do_bench

    from sparsemla.kernels.sparse_decode.reference import sparse_decode_reference
    from sparsemla.kernels.sparse_decode.triton import sparse_decode_fwd

    sets = [make_inputs(shape, seed=1000 * shape.B + 10 * shape.H + i) for i in range(ROTATE)]
    fns: dict[str, list] = {}
    if "sparsemla" in providers:
        fns["sparsemla"] = [lambda kw=kw: sparse_decode_fwd(**kw, num_splits=splits) for kw in sets]
    if replayer is not None:

        def from_cubins(kw: dict) -> Any:
            with replayer:  # every decode kernel from its Triton 3.8 cubin (graph capture records the launches)
                return sparse_decode_fwd(**kw, num_splits=splits)

        fns["sparsemla_t38"] = [lambda kw=kw: from_cubins(kw) for kw in sets]
    if occupancy is not None:
        occ_replayer, occ_info = occupancy

        def at_target_occupancy(kw: dict) -> Any:
            with dev.assume(occ_info), occ_replayer:  # the target's facts, its blocks per SM (padded launches)
                return sparse_decode_fwd(**kw, num_splits=splits)

        fns["sparsemla_t38occ"] = [lambda kw=kw: at_target_occupancy(kw) for kw in sets]
    if "sglang_triton" in providers and sglang_fn is not None and shape.is_target and shape.B <= 128:
        fns["sglang_triton"] = [
            lambda kw=kw: sglang_fn(
                kw["q"],
                kw["k_cache"],
                kw["indices"],
                kw["topk_length"],
                kw["attn_sink"],
                512,
                kw["softmax_scale"],
                kw["extra_k_cache"],
                kw["extra_indices_in_kvcache"],
                kw["extra_topk_length"],
            )  # fmt: skip
            for kw in sets
        ]
    if "flashmla" in providers and flash_mla is not None:
        pad = flashmla_pad_heads(shape.H)
        fns["flashmla"] = [flashmla_call(flash_mla, kw, pad) for kw in sets]
    if "reference" in providers and shape.is_target and shape.B <= 128:
        fns["reference"] = [lambda kw=kw: sparse_decode_reference(**kw) for kw in sets]

    for name in ("sparsemla", "sparsemla_t38", "sparsemla_t38occ"):
        if name in fns:
            fns[f"{name}_graph"] = fns[name]  # same calls, one CUDA-graph replay per repetition
    errs: dict[str, float] = {}
    ours = fns["sparsemla"][0]()[0] if "sparsemla" in fns else None
    rows = []
    for name, calls in fns.items():
        out = calls[0]()[0][:, :, : shape.H]
        if ours is not None and not name.endswith("_graph"):
            errs[name] = rel_err(out, ours)
        if name in ("sparsemla_t38", "sparsemla_t38occ"):  # eager replay = ctypes calls from Python: host time
            continue
        runs = [graphed(c) for c in calls] if name.endswith("_graph") else calls
        if "_t38" in name and any(r is c for r, c in zip(runs, calls, strict=True)):
            raise RuntimeError("a Triton 3.8 replay did not capture into a CUDA graph: its eager time is Python's")
        state = {"i": 0}

        def step(runs=runs, state=state):
            state["i"] += 1
            return runs[state["i"] % len(runs)]()

        us = do_bench(step, warmup=10, rep=60, return_mode="median") * 1e3
        row = {**shape.__dict__, "provider": code_paths.provider(name, code_path), "us": round(us, 3)}
        if name == "sparsemla_t38occ_graph" and occupancy is not None:  # the target and the blocks per SM it ran at
            row["occupancy_of"] = occupancy[0].occupancy_of.name
            row["occupancy"] = occupancy[0].occupancy.get("_sparse_decode_kernel", [])
        if name.startswith("sparsemla") and "_t38" not in name:  # SHARED: the launches of this Triton
            main = ("_sparse_decode_sm90_ws_kernel", "_sparse_decode_sm90_kernel", "_sparse_decode_kernel")
            row["shared_bytes"] = next((SHARED[k] for k in main if k in SHARED), None)
        rows.append(row)
    if ceilings:  # a code-path child has none: its parent adds the floors
        fl, _, _ = floor_us(shape, ceilings)
        rows.append({**shape.__dict__, "provider": "floor", "us": round(fl, 3)})
    del sets, fns
    torch.cuda.empty_cache()
    return rows, errs


def _print_table(rows: list[dict[str, Any]]) -> None:
    from rich.console import Console
    from rich.table import Table

    provs = list(dict.fromkeys(r["provider"] for r in rows))
    keys = list(dict.fromkeys((r["B"], r["H"], r["swa_topk"], r["extra_topk"]) for r in rows))
    cell = {(r["B"], r["H"], r["swa_topk"], r["extra_topk"], r["provider"]): r["us"] for r in rows}
    table = Table(title="sparse-MLA decode (µs, do_bench median)")
    for col in ("B", "H", "swa", "extra", *provs):
        table.add_column(col, justify="right")
    for k in keys:
        table.add_row(*map(str, k), *[f"{cell[(*k, p)]:.2f}" if (*k, p) in cell else "-" for p in provs])
    Console(width=160).print(table)


def shape_grid(batches: str, heads: str, extra_topks: str, prefill_rows: str, swa_topk: int) -> list[Shape]:
    """The run's shapes: every extra top-k x heads x batch, then the prefill-sized calls (H=64, extra 512)."""
    shapes = [
        Shape(int(b), int(h), swa_topk, int(x))
        for x in extra_topks.split(",")
        for h in heads.split(",")
        for b in batches.split(",")
    ]
    return shapes + [Shape(int(b), 64, swa_topk, 512) for b in prefill_rows.split(",") if b.strip()]


SHARED: dict[str, int] = {}  # kernel name -> metadata.shared of its last launch (recorded next to the timings)


@app.command()
def main(
    out_dir: Path = typer.Option(Path("results/bench"), help="Where decode-<gpu>-<date>.json is written."),
    batches: str = typer.Option("1,8,32,64,128", help="Comma-separated batch sizes."),
    heads: str = typer.Option("8,16,64,128", help="Comma-separated query head counts."),
    extra_topks: str = typer.Option("512,2048,8192", help="Comma-separated extra-cache top-k sizes."),
    prefill_rows: str = typer.Option("1024,8192", help="Extend-chunk rows (H=64, 128 + 512) measured as well."),
    swa_topk: int = typer.Option(128, help="SWA (main cache) top-k."),
    providers: str = typer.Option("sparsemla,sglang_triton,flashmla,reference", help="Providers to time."),
    paths: str = typer.Option(
        "native,sm89",
        help="Code paths: native (wgmma on Hopper) and/or sm89 (TRITON_OVERRIDE_ARCH=sm89: the "
        "mma.sync code and configurations of sm_80..sm_120), each in its own process.",
    ),
    child_out: Path = typer.Option(None, hidden=True, help="(internal) write this process's rows here."),
    sglang_src: Path = typer.Option(
        Path(".gpu/sglang_src/flash_mla_sm120_triton.py"), help="sglang 0.5.23's flash_mla_sm120_triton.py."
    ),
    splits: str = typer.Option("auto", help="Split count for sparsemla (auto or an int)."),
    git_sha: str = typer.Option("", help="Commit the numbers belong to (default: `git rev-parse HEAD` here)."),
    build_cubins: Path = typer.Option(
        None,
        help="No GPU: compile sparsemla's launches of the grid with this Triton (3.8) in each of --paths, as the "
        "GPU machine (sm_90) runs them, into DIR/<path>.",
    ),
    cubins: Path = typer.Option(
        None, help="GPU: also time sparsemla_t38[_graph] from DIR/<path>'s Triton 3.8 cubins in each code path."
    ),
    occupancy_of: str = typer.Option(
        "",
        help="A target (sm_89): in the paths other than native, also time sparsemla_t38occ_graph, the 3.8 cubins at "
        "that target's blocks per SM and with its facts on this GPU's SMs (with --build-cubins: build those launches).",
    ),
) -> None:
    """Time every provider over the shape grid in each code path and write the JSON (needs a CUDA GPU)."""
    import sys

    from sparsemla.console import fail

    split_arg: int | str = "auto" if splits == "auto" else int(splits)
    shapes = shape_grid(batches, heads, extra_topks, prefill_rows, swa_topk)
    try:
        path_list = code_paths.parse(paths)
    except ValueError as exc:
        fail(str(exc), "e.g. --paths native,sm89")
    occ_target = None
    if occupancy_of:
        try:
            occ_target = dev.target(occupancy_of)
        except ValueError as exc:
            fail(f"--occupancy-of: {exc}", "e.g. --occupancy-of sm_89")
        if occ_target.has_wgmma:
            fail(f"--occupancy-of {occupancy_of}: its tiles are wgmma, which the sm_89 path does not run",
                 "a target of mma.sync code: sm_80, sm_86, sm_89 or sm_120")  # fmt: skip
        if cubins is None and build_cubins is None:
            fail("--occupancy-of needs --cubins DIR (or --build-cubins DIR)", "its provider replays Triton 3.8 cubins")
    if build_cubins is not None:
        import triton

        from benchmarks import prod_cubins
        from sparsemla.kernels.sparse_decode.triton import sparse_decode_fwd

        def workload(occ_info: object = None) -> None:
            for shape in shapes:
                kw = make_inputs(shape, 0, "cpu", fill=False)
                sparse_decode_fwd(**kw, num_splits=split_arg)
                if occ_info is not None:  # the launches the occupancy-matched provider makes (the target's splits)
                    with dev.assume(occ_info):
                        sparse_decode_fwd(**kw, num_splits=split_arg)

        for code_path in path_list:
            occ_info = None
            if occ_target is not None and code_path != "native":
                occ_info = prod_cubins.occupancy_facts(occ_target, prod_cubins.path_info(code_path)[0].num_sms)
            where = prod_cubins.path_dir(build_cubins, code_path)
            added = prod_cubins.build(lambda occ_info=occ_info: workload(occ_info), where, code_path)
            print(f"{len(added)} cubins added to {where} (Triton {triton.__version__}, {code_path} path on sm_90)")
        return
    if cubins is not None:
        from benchmarks import prod_cubins

        prod_cubins.require(cubins, path_list)
    if not torch.cuda.is_available():
        fail("the decode benchmark needs a CUDA GPU", "run it on the GPU machine (make bench-decode)")
    gpu = torch.cuda.get_device_name()
    ceilings = measure_ceilings() if child_out is None else {}
    if child_out is None:
        rows, checks = code_paths.run_children("benchmarks.decode", sys.argv[1:], path_list)
        floors = []
        for key in dict.fromkeys((r["B"], r["H"], r["swa_topk"], r["extra_topk"]) for r in rows):
            fl, _, _ = floor_us(Shape(*key), ceilings)
            floors.append({**Shape(*key).__dict__, "provider": "floor", "us": round(fl, 3)})
        rows += floors
        path = result_path(out_dir, "decode", gpu)
        _write(path, gpu, git_sha, ceilings, rows, checks, path_list)
        _print_table(rows)
        print(f"wrote {path}")
        return

    code_path = path_list[0]
    from sparsemla.kernels.aot import watch_launches

    provs = [p.strip() for p in providers.split(",") if p.strip()]
    if code_path != "native":
        provs = [p for p in provs if p == "sparsemla"]  # the baselines do not change with Triton's target
    sglang_fn = load_sglang_triton(sglang_src) if "sglang_triton" in provs and sglang_src.exists() else None
    flash_mla, _ = load_flash_mla(torch.device("cuda"))
    replayer, occupancy = None, None
    if cubins is not None:
        from benchmarks import prod_cubins

        replayer = prod_cubins.Replayer(prod_cubins.path_dir(cubins, code_path))  # this code path's cubins
        if occ_target is not None and code_path != "native":
            occupancy = (
                prod_cubins.Replayer(prod_cubins.path_dir(cubins, code_path), occupancy_of=occ_target),
                prod_cubins.occupancy_facts(occ_target, prod_cubins.physical_gpu(torch.device("cuda")).num_sms),
            )
    rows, checks = [], []
    with watch_launches(lambda name, kernel: SHARED.__setitem__(name, kernel.metadata.shared)):
        for shape in shapes:
            SHARED.clear()  # this shape's launches only (the main kernel's name depends on the tile chosen)
            r, errs = bench_shape(shape, provs, ceilings, sglang_fn, flash_mla, split_arg, code_path, replayer,
                                  occupancy)  # fmt: skip
            rows += [{**x, "code_path": code_path} for x in r if x["provider"] != "floor"]
            checks.append({**shape.__dict__, "rel_err_vs_sparsemla": errs})
            print(json.dumps(r), flush=True)
            child_out.write_text(json.dumps({"rows": rows, "checks": checks}))  # a cut-short run keeps what it measured


def _write(path: Path, gpu: str, git_sha: str, ceilings: dict, rows: list, checks: list, paths: list[str]) -> None:
    code_paths_doc = {
        p: (
            "native (this GPU's own code: on Hopper wgmma / Gluon tiles, mma.sync ones at few programs)"
            if p == "native"
            else f"TRITON_OVERRIDE_ARCH={p}: mma.sync, the configurations chosen for sm_{p[2:]}"
        )
        for p in paths
    }  # fmt: skip
    method = (
        f"triton.testing.do_bench median of eager calls (L2 flushed before each rep), inputs rotated over {ROTATE} "
        "sets (the method of notes/h200-baselines.md); `*_graph` = one CUDA-graph replay per rep; each code path "
        "in its own process; `shared_bytes` = metadata.shared of the decode kernel as launched"
    )
    if any("_t38" in r["provider"] for r in rows):
        method += (
            "; `sparsemla_t38*` / `sparsemla_sm89path_t38*` = the same calls with every decode kernel compiled by "
            "Triton 3.8 (production's) on the build machine (`--build-cubins`), in that code path for this GPU, "
            "and launched from those cubins (benchmarks/prod_cubins.py)"
        )
    if targets := sorted({r["occupancy_of"] for r in rows if r.get("occupancy_of")}):
        method += (
            f"; `*_t38occ_graph` = that code path's 3.8 cubins at the blocks per SM of {', '.join(targets)} (each "
            "launch asks for enough dynamic shared memory that an SM of this GPU holds as many programs as that "
            "target's SM would: prod_cubins.padded_shared; each row's `occupancy` lists the driver's counts) with "
            "the launcher given that target's facts on this GPU's SMs"
        )
    write_doc(path, "decode", gpu, git_sha, ceilings, rows, checks, code_paths_doc, method)


def result_path(out_dir: Path, op: str, gpu: str) -> Path:
    """``out_dir/<op>-<gpu>-<date>.json`` (``out_dir`` created)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    slug = gpu.lower().replace("nvidia ", "").replace(" ", "-")
    return out_dir / f"{op}-{slug}-{_dt.date.today().isoformat()}.json"


def write_doc(
    path: Path,
    op: str,
    gpu: str,
    git_sha: str,
    ceilings: dict,
    rows: list,
    checks: list,
    code_paths_doc: dict,
    method: str,
) -> None:
    """The JSON of a kernel benchmark run (decode, prefill): the device, versions and ceilings, then the rows."""
    import triton

    doc = {
        "op": op,
        "gpu": gpu,
        "device": dev.device_info().__dict__,
        "code_paths": code_paths_doc,
        "git_sha": git_sha or artifacts.git_sha() or "unknown",
        "torch": torch.__version__,
        "triton": triton.__version__,
        "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "ceilings": ceilings,
        "method": method,
        "rows": rows,
        "checks": checks,
    }
    path.write_text(json.dumps(doc, indent=1) + "\n")


if __name__ == "__main__":
    app()
