"""GPU benchmark of the DeepSeek-V4 lightning indexer: ``python -m benchmarks.indexer``.

Sweeps B x ctx (real compressed length) x cap (page-table width = sglang's ``max_compressed_seq_len`` under decode
CUDA graphs) and times, in one run, these providers (``triton.testing.do_bench`` medians, L2 flushed before every
call, microseconds):

* ``sparsemla``: our Triton logits (``clean_logits=False``, the contract sglang uses).
* ``sparsemla_graph``: the same launch replayed from a CUDA graph (no Python dispatch in the number).
* ``sparsemla_topk``: logits + top-k in one fused launch (k = ``--k``, positions; what the decode path needs).
* ``sparsemla_topk_unfused``: our logits kernel then our top-k kernel (two launches, logits materialized).
* ``torch_fallback``: a faithful re-implementation of sglang 0.5.23's ``fp8_paged_mqa_logits_torch_sm120`` (gather
  every page up to ``cap``, dequant to bf16, bmm, relu, weighted head sum, scale, mask); sglang's own function is not
  importable on the GPU machine (its package needs dependencies that machine lacks). ``tests/test_indexer_cpu.py``
  checks that it equals sglang's function.
* ``torch_topk``: a faithful re-implementation of sglang's ``topk_transform_pytorch_vectorized`` (``--dsa-topk-backend
  torch``) over the ``[B, cap]`` logits, top-k alone.
* ``floor``: bytes that must move (keys + scales read once, q and weights read, logits written) over the copy
  bandwidth measured in the same run.

Writes ``<out-dir>/indexer-<gpu>-<date>.json`` =
``{"op": "indexer", "gpu", "git_sha", "torch", "triton", "rows": [{"B", "ctx", "cap", "provider", "us"}], ...}``.
"""

from __future__ import annotations

import datetime as _dt
import json
import re
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
import typer

from benchmarks import paths as code_paths
from benchmarks.report import cells_by
from sparsemla.kernels.layouts import IDX_BYTES_PER_TOKEN, IDX_DIM, IDX_PAGE, IDX_PAGE_BYTES, IDX_SCALE_OFFSET

HEADS = 64
app = typer.Typer(add_completion=False)


# -- baselines (faithful re-implementations of sglang 0.5.23's torch paths) ------------------------------------------
def torch_fallback_logits(
    q_fp8: torch.Tensor,
    kvcache_fp8: torch.Tensor,
    weight: torch.Tensor,
    seq_lens: torch.Tensor,
    page_table: torch.Tensor,
    max_seq_len: int,
) -> torch.Tensor:
    """sglang's ``fp8_paged_mqa_logits_torch_sm120`` algorithm (next_n = 1): every page up to ``max_seq_len`` is
    gathered and scored, whatever the real length. fp32 ``[B, max_seq_len]``, ``-inf`` past the length."""
    batch, _, _, head_dim = q_fp8.shape
    max_pages = -(-max_seq_len // IDX_PAGE)
    padded = max_pages * IDX_PAGE
    flat = kvcache_fp8.view(-1, IDX_PAGE * (head_dim + 4))
    gathered = flat[page_table[:, :max_pages]]
    values = gathered[..., :IDX_SCALE_OFFSET].contiguous().view(torch.float8_e4m3fn).to(torch.bfloat16)
    values = values.view(batch, padded, head_dim)
    scales = gathered[..., IDX_SCALE_OFFSET:].contiguous().view(torch.float32).view(batch, padded)
    q = q_fp8[:, 0].to(torch.bfloat16)
    score = F.relu(torch.bmm(values, q.transpose(1, 2)))
    score = (score * weight.unsqueeze(1)).sum(dim=2) * scales
    width = min(padded, max_seq_len)
    logits = score.new_full((batch, max_seq_len), float("-inf"))
    logits[:, :width] = score[:, :width]
    positions = torch.arange(max_seq_len, device=q_fp8.device)
    logits.masked_fill_(positions.unsqueeze(0) >= seq_lens.reshape(-1, 1), float("-inf"))
    return logits


def torch_topk_transform(
    scores: torch.Tensor, seq_lens: torch.Tensor, page_tables: torch.Tensor, out: torch.Tensor, page_size: int
) -> None:
    """sglang's ``topk_transform_pytorch_vectorized`` algorithm: mask, ``torch.topk`` over the whole row width, the
    short-row sequential path, then the page-table transform into ``out`` [B, k]."""
    k = out.shape[1]
    batch, width = scores.shape
    device = scores.device
    bits = (page_size - 1).bit_length()
    positions = torch.arange(width, device=device).unsqueeze(0).expand(batch, -1)
    masked = scores.clone()
    masked.masked_fill_(positions >= seq_lens.unsqueeze(1), float("-inf"))
    actual = min(k, width)
    _, raw = torch.topk(masked, actual, dim=1, largest=True, sorted=False)
    raw = raw.to(torch.int32)
    if actual < k:
        raw = F.pad(raw, (0, k - actual), value=0)
    rows = torch.arange(batch, device=device).unsqueeze(1).expand(-1, k)
    valid = scores[rows.flatten(), raw.clamp(min=0).flatten()].view(batch, k) != float("-inf")
    seq = torch.arange(k, device=device, dtype=torch.int32).unsqueeze(0).expand(batch, -1)
    seq_valid = seq < seq_lens.unsqueeze(1)
    short = (seq_lens <= k).unsqueeze(1).expand(-1, k)
    raw = torch.where(short, seq.masked_fill(~seq_valid, -1), raw)
    valid = torch.where(short, seq_valid, valid)
    pages = torch.gather(page_tables, 1, (raw >> bits).clamp(min=0).long())
    slots = ((pages << bits) | (raw & (page_size - 1))).to(torch.int32)
    out.copy_(slots.masked_fill(~valid, -1))


# -- inputs -----------------------------------------------------------------------------------------------------------
def gpu_indexer_cache(num_pages: int, device: torch.device, generator: torch.Generator) -> torch.Tensor:
    """Random ``[num_pages, 64, 1, 132]`` uint8 pages built on the GPU: fp8 keys ~ N(0, 1), scales in [0.01, 0.1]."""
    keys = torch.randn(num_pages, IDX_PAGE * IDX_DIM, device=device, generator=generator).to(torch.float8_e4m3fn)
    scales = 0.01 + 0.09 * torch.rand(num_pages, IDX_PAGE, device=device, generator=generator)
    page = torch.cat([keys.view(torch.uint8), scales.view(torch.uint8)], dim=1)
    return page.view(num_pages, IDX_PAGE, 1, IDX_BYTES_PER_TOKEN)


def unfilled_indexer_cache(num_pages: int) -> torch.Tensor:
    """An unfilled CPU cache of :func:`gpu_indexer_cache`'s shape, dtype and strides: what ``--build-cubins``
    compiles from (torch.empty does not touch its memory, so the GPU run's page count costs nothing here)."""
    return torch.empty(num_pages, IDX_PAGE, 1, IDX_BYTES_PER_TOKEN, dtype=torch.uint8)


@dataclass
class Case:
    batch: int
    ctx: int
    cap: int
    q: torch.Tensor
    kv: torch.Tensor
    weights: torch.Tensor
    seq_lens: torch.Tensor
    page_table: torch.Tensor


def make_case(batch: int, ctx: int, cap: int, kv: torch.Tensor, generator: torch.Generator) -> Case:
    device = kv.device
    pages_per_req = -(-ctx // IDX_PAGE)
    max_pages = cap // IDX_PAGE
    need = batch * pages_per_req
    if need > kv.shape[0]:
        raise ValueError(f"cache has {kv.shape[0]} pages, case needs {need}")
    perm = torch.randperm(kv.shape[0], device=device, generator=generator)[:need].view(batch, pages_per_req)
    table = torch.randint(0, kv.shape[0], (batch, max_pages), device=device, generator=generator)
    table[:, :pages_per_req] = perm
    q = torch.randn(batch, 1, HEADS, IDX_DIM, device=device, generator=generator).to(torch.float8_e4m3fn)
    weights = torch.randn(batch, HEADS, device=device, generator=generator) * HEADS**-0.5
    seq_lens = torch.full((batch,), ctx, dtype=torch.int32, device=device)
    return Case(batch, ctx, cap, q, kv, weights, seq_lens, table.to(torch.int32))


def floor_bytes(case: Case) -> int:
    keys = case.batch * case.ctx * IDX_BYTES_PER_TOKEN
    q_w = case.batch * HEADS * (IDX_DIM + 4)
    logits = case.batch * case.ctx * 4
    return keys + q_w + logits


def copy_bandwidth(device: torch.device) -> float:
    """Device-to-device copy bandwidth in bytes/s (read + write counted), 1 GiB buffers."""
    import triton.testing

    src = torch.empty(1 << 30, dtype=torch.uint8, device=device).random_(0, 255)
    dst = torch.empty_like(src)
    ms = triton.testing.do_bench(lambda: dst.copy_(src), warmup=20, rep=200, return_mode="median")
    return 2 * src.numel() / (ms * 1e-3)


def _bench(fn, rep: int = 60) -> float:
    import triton.testing

    return 1e3 * triton.testing.do_bench(fn, warmup=10, rep=rep, return_mode="median")


def _graph(fn) -> torch.cuda.CUDAGraph:
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        fn()
        fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return graph


def gpu_slug(name: str) -> str:
    m = re.search(r"(H200|H100|H800|H20|B200|B300|A100|L40S|L4|RTX ?\w+|\w+)", name.replace("NVIDIA ", ""))
    return (m.group(1) if m else name).lower().replace(" ", "")


def graphed_calls(case: Case, k: int) -> dict[str, object]:
    """The two launches the ``*_graph`` providers replay: the logits alone (``_launch_logits`` into a preallocated
    output, what a captured decode step runs) and the fused logits + top-k (positions into a preallocated output).
    ``--build-cubins`` compiles exactly these on the build machine."""
    from sparsemla.kernels.indexer.triton import _launch_logits, indexer_logits_topk_fwd

    args = (case.q, case.kv, case.weights, case.seq_lens, case.page_table)
    out = torch.empty(case.batch, case.cap, dtype=torch.float32, device=case.q.device)
    idx = torch.empty(case.batch, k, dtype=torch.int32, device=case.q.device)
    return {
        "logits": lambda: _launch_logits(*args, out, case.cap),
        "topk": lambda: indexer_logits_topk_fwd(*args, k, case.cap, out=idx),
    }


def run_case(case: Case, k: int, providers: list[str], bw: float, replayer: object = None) -> list[dict]:
    """Rows (µs) of ``providers`` on one case; with ``replayer`` (a benchmarks.prod_cubins.Replayer) also
    ``sparsemla_t38_graph`` / ``sparsemla_topk_t38_graph``: the graphed launches from Triton 3.8 cubins."""
    from sparsemla.kernels.indexer.topk import indexer_topk_fwd
    from sparsemla.kernels.indexer.triton import indexer_logits_fwd, indexer_logits_topk_fwd

    rows: list[dict] = []
    args = (case.q, case.kv, case.weights, case.seq_lens, case.page_table, case.cap)

    def add(provider: str, us: float) -> None:
        rows.append({"B": case.batch, "ctx": case.ctx, "cap": case.cap, "provider": provider, "us": round(us, 2)})

    calls = graphed_calls(case, k)
    if "sparsemla" in providers:
        add("sparsemla", _bench(lambda: indexer_logits_fwd(*args)))
    if "sparsemla_graph" in providers:
        add("sparsemla_graph", _bench(_graph(calls["logits"]).replay))
    if "sparsemla_topk" in providers:
        idx = torch.empty(case.batch, k, dtype=torch.int32, device=case.q.device)
        add("sparsemla_topk", _bench(lambda: indexer_logits_topk_fwd(*args[:5], k, case.cap, out=idx)))
    if "sparsemla_topk_graph" in providers:
        add("sparsemla_topk_graph", _bench(_graph(calls["topk"]).replay))
    if replayer is not None:
        for name, call in (("sparsemla_t38_graph", calls["logits"]), ("sparsemla_topk_t38_graph", calls["topk"])):
            with replayer:  # every kernel of the call from its Triton 3.8 cubin (the capture records the launches)
                graph = _graph(call)
            add(name, _bench(graph.replay))
    if "sparsemla_topk_unfused" in providers:
        idx = torch.empty(case.batch, k, dtype=torch.int32, device=case.q.device)
        add(
            "sparsemla_topk_unfused",
            _bench(lambda: indexer_topk_fwd(indexer_logits_fwd(*args), case.seq_lens, k, out=idx)),
        )
    if "torch_fallback" in providers:
        add("torch_fallback", _bench(lambda: torch_fallback_logits(*args), rep=40))
    if "torch_topk" in providers:
        logits = indexer_logits_fwd(*args, clean_logits=True)
        slots = torch.empty(case.batch, k, dtype=torch.int32, device=case.q.device)
        add("torch_topk", _bench(lambda: torch_topk_transform(logits, case.seq_lens, case.page_table, slots, IDX_PAGE)))
    if "floor" in providers:
        add("floor", floor_bytes(case) / bw * 1e6)
    return rows


def tune_logits(kv: torch.Tensor, gen: torch.Generator) -> None:
    """Print the logits kernel's time over block size, stages, warps and programs per SM on a few shapes."""
    from sparsemla.kernels.indexer.triton import _launch_logits, num_splits_for

    shapes = [
        (b, c) for b, c in ((1, 4096), (1, 65536), (8, 16384), (64, 4096), (64, 65536)) if b * c // 64 <= kv.shape[0]
    ]
    cases = [make_case(b, c, 65536, kv, gen) for b, c in shapes]
    outs = [torch.empty(c.batch, c.cap, dtype=torch.float32, device=kv.device) for c in cases]
    print("swap block_n stages warps per_sm | " + " ".join(f"B{c.batch}/{c.ctx}" for c in cases))
    for swap in (False, True):
        for block_n in (64, 128, 256):
            for stages in (2, 3):
                for warps in (4, 8):
                    for per_sm in (4, 8):
                        times = []
                        for case, out in zip(cases, outs, strict=True):
                            sms = torch.cuda.get_device_properties(kv.device).multi_processor_count
                            splits = num_splits_for(case.batch, sms, programs_per_sm=per_sm)
                            args = (case.q, case.kv, case.weights, case.seq_lens, case.page_table, out, case.cap)
                            kw = dict(block_n=block_n, swap_ab=swap, num_splits=splits, num_warps=warps)
                            kw["num_stages"] = stages
                            try:
                                times.append(_bench(lambda a=args, k=kw: _launch_logits(*a, **k), rep=20))
                            except Exception as exc:  # noqa: BLE001 - a config that does not compile is skipped
                                print(f"{swap:d} {block_n} {stages} {warps} {per_sm}: {type(exc).__name__}")
                                break
                        else:
                            line = " ".join(f"{t:9.1f}" for t in times)
                            print(f"{swap:d} {block_n} {stages} {warps} {per_sm} | {line}")


PROVIDERS = (
    "sparsemla",
    "sparsemla_graph",
    "sparsemla_topk",
    "sparsemla_topk_graph",
    "sparsemla_topk_unfused",
    "torch_fallback",
    "torch_topk",
    "floor",
)


def print_table(rows: list[dict], providers: list[str]) -> None:
    cells = cells_by(rows, ("B", "ctx", "cap"))
    short = [p.replace("sparsemla", "sm").replace("torch_", "t_") for p in providers]
    print("B ctx cap | " + " ".join(f"{s:>12}" for s in short))
    for (b, ctx, cap), vals in sorted(cells.items()):
        line = " ".join(f"{vals[p]:12.1f}" if p in vals else f"{'-':>12}" for p in providers)
        print(f"{b} {ctx} {cap} | {line}")


@app.command()
def main(
    out_dir: Path = typer.Option(Path("results/bench"), help="Folder for indexer-<gpu>-<date>.json."),
    batches: str = typer.Option("1,8,64", help="Comma-separated batch sizes."),
    ctxs: str = typer.Option("1024,4096,16384,65536", help="Comma-separated real lengths (compressed tokens)."),
    caps: str = typer.Option("65536,262144,1048576", help="Comma-separated page-table widths (tokens)."),
    providers: str = typer.Option(",".join(PROVIDERS), help="Comma-separated providers."),
    k: int = typer.Option(512, help="Top-k size for the top-k providers (512, 1024 or 2048)."),
    git_sha: str = typer.Option("", help="Commit of the code measured (the GPU machine's copy has no .git)."),
    seed: int = typer.Option(0, help="Random seed."),
    tune: bool = typer.Option(False, help="Only sweep the logits kernel's launch parameters on a few shapes."),
    paths: str = typer.Option(
        "native,sm89", help="Code paths (each in its own process): native and/or sm89 (TRITON_OVERRIDE_ARCH=sm89)."
    ),
    child_out: Path = typer.Option(None, hidden=True, help="(internal) write this process's rows here."),
    build_cubins: Path = typer.Option(
        None,
        help="No GPU: compile the graphed logits and fused launches of the grid with this Triton (3.8) in each of "
        "--paths, as the GPU machine (sm_90) runs them, into DIR/<path>.",
    ),
    cubins: Path = typer.Option(
        None, help="GPU: also time sparsemla[_topk]_t38_graph from DIR/<path>'s Triton 3.8 cubins in each code path."
    ),
) -> None:
    """Benchmark the indexer providers on the current CUDA GPU in each code path and write the JSON."""
    import sys
    import tempfile

    import triton

    from sparsemla.console import fail

    try:
        path_list = code_paths.parse(paths)
    except ValueError as exc:
        fail(str(exc), "e.g. --paths native,sm89")
    chosen = [p.strip() for p in providers.split(",") if p.strip()]
    unknown = sorted(set(chosen) - set(PROVIDERS))
    if unknown:
        fail(f"unknown providers {unknown}", f"choose from {', '.join(PROVIDERS)}")
    bs = [int(x) for x in batches.split(",")]
    cs = [int(x) for x in ctxs.split(",")]
    cps = [int(x) for x in caps.split(",")]
    if any(c % IDX_PAGE for c in cps) or any(c > cap for c in cs for cap in cps):
        fail("every cap must be a multiple of 64 and >= every ctx", f"ctxs={cs} caps={cps}")
    if build_cubins is not None:
        for code_path in path_list:
            added = build_cubins_for(bs, cs, cps, k, seed, build_cubins, code_path)
            print(f"{added} cubins added to {build_cubins}/{code_path} (Triton {triton.__version__}, sm_90)")
        return
    if cubins is not None:
        from benchmarks import prod_cubins

        prod_cubins.require(cubins, path_list)
    if not torch.cuda.is_available():
        fail("the indexer benchmark needs a CUDA GPU", "run it on the device machine (make bench-indexer)")
    device = torch.device("cuda")
    if child_out is None and not tune:
        rows: list[dict] = []
        with tempfile.TemporaryDirectory() as tmp:
            for path in path_list:
                argv = sys.argv[1:]
                rows += code_paths.run_child("benchmarks.indexer", argv, path, Path(tmp) / "c.json")["rows"]
        bw = copy_bandwidth(device)
        _write(out_dir, rows, bw, k, git_sha, path_list, triton.__version__)
        print_table(rows, list(dict.fromkeys(r["provider"] for r in rows)))
        return
    code_path = path_list[0]
    if code_path != "native":
        chosen = [p for p in chosen if p.startswith("sparsemla")]  # the torch baselines do not change with the target
    gen = torch.Generator(device=device).manual_seed(seed)
    bw = copy_bandwidth(device)
    kv = gpu_indexer_cache(max(bs) * -(-max(cs) // IDX_PAGE), device, gen)
    if tune:
        tune_logits(kv, gen)
        return
    replayer = None
    if cubins is not None:
        from benchmarks import prod_cubins

        replayer = prod_cubins.Replayer(prod_cubins.path_dir(cubins, code_path))  # this code path's cubins
    rows = []
    for batch in bs:
        for ctx in cs:
            for cap in cps:
                case = make_case(batch, ctx, cap, kv, gen)
                for row in run_case(case, k, chosen, bw, replayer):
                    if code_path != "native" and row["provider"] == "floor":
                        continue
                    rows.append({**row, "provider": code_paths.provider(row["provider"], code_path)})
                del case
                torch.cuda.empty_cache()
                child_out.write_text(json.dumps({"rows": rows}))


def build_cubins_for(
    bs: list[int], cs: list[int], cps: list[int], k: int, seed: int, out_dir: Path, code_path: str
) -> int:
    """No GPU: compile the graphed launches (:func:`graphed_calls`) of every (B, ctx, cap) in ``code_path`` with this
    machine's Triton into ``out_dir/<code_path>`` (benchmarks/prod_cubins.py). The inputs have the GPU run's shapes,
    dtypes and strides (an unfilled cache of as many pages, never read here), so the GPU run makes the same launches.
    Returns how many cubins were added."""
    from benchmarks import prod_cubins

    kv = unfilled_indexer_cache(max(bs) * -(-max(cs) // IDX_PAGE))
    gen = torch.Generator().manual_seed(seed)

    def workload() -> None:
        for batch in bs:
            for ctx in cs:
                for cap in cps:
                    for call in graphed_calls(make_case(batch, ctx, cap, kv, gen), k).values():
                        call()

    return len(prod_cubins.build(workload, prod_cubins.path_dir(out_dir, code_path), code_path))


def _write(out_dir: Path, rows: list[dict], bw: float, k: int, git_sha: str, paths: list[str], triton_v: str) -> None:
    from sparsemla import artifacts
    from sparsemla.kernels import device as dev

    name = torch.cuda.get_device_name()
    result = {
        "op": "indexer",
        "gpu": name,
        "device": dev.device_info().__dict__,
        "code_paths": paths,
        "git_sha": git_sha or artifacts.git_sha() or "unknown",
        "torch": torch.__version__,
        "triton": triton_v,
        "date": _dt.date.today().isoformat(),
        "copy_bandwidth_tb_s": round(bw / 1e12, 3),
        "k": k,
        "heads": HEADS,
        "page_bytes": IDX_PAGE_BYTES,
        "timing": "triton.testing.do_bench median, L2 flushed before each call, us; each code path in its own process",
        "providers": {
            "sparsemla": "Triton logits, clean_logits=False",
            "sparsemla_graph": "same launch replayed from a CUDA graph",
            "sparsemla_topk": f"fused logits + top-{k} (one launch, no logits output)",
            "sparsemla_topk_graph": "the fused launch replayed from a CUDA graph",
            "sparsemla_topk_unfused": f"Triton logits then Triton top-{k} (two launches)",
            "sparsemla_sm89path*": "the same sparsemla providers in the sm_89 code path (TRITON_OVERRIDE_ARCH=sm89: "
            "mma.sync, fp8 MMAs as on sm_89/sm_120)",
            "sparsemla_t38_graph / sparsemla_topk_t38_graph": "the graphed logits / fused launches with every kernel "
            "compiled by Triton 3.8 (production's) on the build machine, in the code path of the row, for this GPU, "
            "and launched from those cubins (benchmarks/prod_cubins.py; --cubins)",
            "torch_fallback": "faithful re-implementation of sglang 0.5.23 fp8_paged_mqa_logits_torch_sm120 "
            "(sglang not importable on the GPU machine)",
            "torch_topk": f"faithful re-implementation of sglang 0.5.23 topk_transform_pytorch_vectorized, k={k}",
            "floor": "keys+scales+q+weights read once, logits written once, over the measured copy bandwidth",
        },
        "rows": rows,
    }
    out_dir.mkdir(parents=True, exist_ok=True)
    # A run of the full provider list is the indexer's report; a reduced one (some providers left out) is a code-path
    # comparison and must not replace it in docs/performance.md.
    full = set(PROVIDERS) <= {r["provider"] for r in rows}
    stem = "indexer" if full else "indexer_paths"
    result["op"] = stem
    path = out_dir / f"{stem}-{gpu_slug(name)}-{result['date']}.json"
    path.write_text(json.dumps(result, indent=1) + "\n")
    print(f"copy bandwidth {bw / 1e12:.2f} TB/s; wrote {path}")


if __name__ == "__main__":
    app()
