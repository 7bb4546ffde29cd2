"""GPU benchmark of the lightning indexer's top-k with every provider in one run: ``python -m benchmarks.topk``.

Issue #15 item 4. On real indexer logits (``benchmarks.indexer.make_case`` + ``indexer_logits_fwd``; page-table
width ``cap = max(length, 64k)``, every row of a batch at the real ``length``) it times, for B x length x k:

* ``sparsemla_split``: ``indexer_topk_fwd`` with the launcher's choices (split rows, tiles), ``sorted=False``
  (ascending positions), page-table slots written: what the plugin's sglang top-k hooks call.
* ``sparsemla_split_sorted``: the same with ``sorted=True`` (by value).
* ``sparsemla_fused`` / ``sparsemla_logits_topk`` / ``sparsemla_logits`` (length 4k only): the fused logits + top-k
  launch (``fuse=True``), the launcher's own choice (``fuse=None``: at cap >= 64k the logits launch then the split
  top-k) and the logits launch alone, side by side -- logits + top-k times, not top-k times (the fused top-k runs
  in the tail of the logits programs, so "fused minus logits" is no top-k cost).
* ``sparsemla_split_t38`` (with ``--cubins DIR``, in every code path): ``sparsemla_split`` with its top-k kernel
  compiled by Triton 3.8 -- what production runs (sglang 0.5.23's torch 2.14.1 installs it; the GPU machine has 3.6,
  which lowers ``tl.histogram`` to other code) -- on the build machine for sm_90 in that code path (``--build-cubins
  DIR --paths native,sm89``, no GPU, the same shapes; ``sm89``: the mma.sync code of sm_80..sm_120) and launched here
  from its cubins (``benchmarks/prod_cubins.py``). ``sparsemla_fused_t38``: the
  same for ``sparsemla_fused`` (its logits kernel and any top-k launch it makes).
* ``torch_topk``: ``torch.topk(logits[:, :length], min(k, length), sorted=False)``, positions only.
* ``sglang_jit_v1`` / ``sglang_jit_v2``: sglang 0.5.23's ``topk_transform_paged`` (``deepseek_v4/topk_v1.cuh``,
  k <= 1024) and ``topk_transform_paged_v2`` with its ``plan_topk_v2`` plan (``topk_v2.cuh``, sglang's default),
  JIT-built with nvcc through ``sglang.kernels.jit.utils.load_jit`` and apache-tvm-ffi from the source tree that
  ``benchmarks/gpu-sglang-jit.sh`` unpacks into ``.gpu/sglang_src`` (sglang itself is not installed on the GPU
  machine). The build runs in a subprocess while our providers are timed; if it fails, every sglang row says why
  and the JSON cites the published figures.

Two timings per row, both CUDA-graph replay medians of ``triton.testing.do_bench`` with the L2 flushed before each
replay (see ``METHODS``): ``us_graph`` (one call per graph; this method has a launch floor of ~4.5 us -- an empty
kernel replays in 4.3-5.0 us) and ``us_graph20`` (per call in a graph of 20 back-to-back calls: what a call costs
inside sglang's decode-step graph). Each code path (native = wgmma on Hopper; ``sm89`` = ``TRITON_OVERRIDE_ARCH=sm89``,
the mma.sync code of sm_80..sm_120) runs in its own process; the path-independent providers (torch, sglang) run in
the native one only. Every row is checked against the ``torch.topk`` set of its own path's logits (``exact``).

``--warm-workers N`` (a fresh machine): before a code path's timed loop, N processes of that path call each of this
Triton's providers once at a share of the points, so its compiles run N at a time and the timed loop finds them
cached (the JSON's ``warm_up`` says how long that took, per code path). The timings do not change: every provider is
still called once before it is timed.

``--merge a.json --merge b.json`` (no GPU needed) joins runs of one commit on one GPU made path by path (one device
call each, to stay inside its time limit) into one JSON: rows concatenated, the shapes kept per path, the targets
evaluated again over all rows (the sm89 rows are compared with the native run's torch / sglang rows).

Writes ``<out-dir>/topk-<gpu>-<date>.json`` with the rows, the versions, the methods and the issue's targets
(``TARGETS``) evaluated per code path and method from the measured rows.
"""

from __future__ import annotations

import datetime as _dt
import functools
import json
import platform
import re
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import typer

from benchmarks import paths as code_paths
from sparsemla import flags

app = typer.Typer(add_completion=False)

PROVIDERS: dict[str, str] = {
    "sparsemla_split": "indexer_topk_fwd with the launcher's split count and tiles, sorted=False (ascending "
    "positions: what the plugin's sglang top-k hooks call), page-table slots written",
    "sparsemla_split_sorted": "the same, sorted=True (by value desc, position asc)",
    "sparsemla_split_t38": "sparsemla_split with its top-k kernel compiled by Triton 3.8 (production: sglang 0.5.23's "
    "torch 2.14.1) for sm_90 in the row's code path on the build machine (--build-cubins) and launched from those "
    "cubins on the GPU (benchmarks/prod_cubins.py)",
    "sparsemla_fused": "indexer_logits_topk_fwd(fuse=True, sorted=False): logits + top-k in one launch (length 4k)",
    "sparsemla_fused_t38": "sparsemla_fused with its kernels compiled by Triton 3.8 for sm_90 here and launched from "
    "those cubins (as sparsemla_split_t38)",
    "sparsemla_logits_topk": "indexer_logits_topk_fwd with the launcher's choice (fuse=None; at cap >= 64k the logits "
    "launch then the split top-k), sorted=False (length 4k)",
    "sparsemla_logits": "indexer_logits_fwd alone, the logits the two rows above include (length 4k)",
    "torch_topk": "torch.topk(logits[:, :length], min(k, length), sorted=False): positions only, the real length",
    "sglang_jit_v1": "sglang 0.5.23 topk_transform_paged: deepseek_v4/topk_v1.cuh JIT-built by load_jit (k <= 1024), "
    "page-table slots written",
    "sglang_jit_v2": "sglang 0.5.23 topk_transform_paged_v2 (topk_v2.cuh, sglang's default SGLANG_OPT_USE_TOPK_V2=1) "
    "with its plan_topk_v2 plan built once outside the timed call, page-table slots written",
}
T38 = "sparsemla_split_t38"
FUSED_T38 = "sparsemla_fused_t38"
# Kernels each Triton 3.8 provider launches from cubins: the split top-k alone (its logits come from the logits launch
# before the timing), and the fused launch's logits kernel with the top-k it may start.
T38_KERNELS = {
    T38: {"_indexer_topk_kernel", "_topk_smem_kernel"},
    FUSED_T38: {"_indexer_logits_kernel", "_indexer_topk_kernel", "_topk_smem_kernel"},
}
DEFAULT_PROVIDERS = tuple(p for p in PROVIDERS if p not in T38_KERNELS)  # the 3.8 providers join with --cubins
LOGITS_PROVIDERS = ("sparsemla_fused", "sparsemla_logits_topk", "sparsemla_logits")  # at FUSED_LENGTH only
SGLANG_PROVIDERS = ("sglang_jit_v1", "sglang_jit_v2")
PARTIAL_DIR = "topk-partial"  # under --out-dir while a run measures: each code path's rows so far
PATH_INDEPENDENT = ("torch_topk", *SGLANG_PROVIDERS)  # the same code in every path: timed in the native one only
SGLANG_V1_MAX_K = 1024  # topk_v1.cuh: kMaxTopK = 1024
BATCHES = (1, 8, 64)
LENGTHS = (1024, 4096, 16384, 65536, 262144)
KS = (512, 2048)
CAP_MIN = 65536  # page-table width at least sglang's 64k-context decode graphs
FUSED_LENGTH = 4096
GRAPH_CALLS = 20
METHODS: dict[str, str] = {
    "graph": "one call captured in a CUDA graph, its replay timed by triton.testing.do_bench (median, L2 flushed "
    "before each replay); includes the ~4.5 us floor of this method (an empty kernel replays in 4.3-5.0 us)",
    "graph20": f"{GRAPH_CALLS} back-to-back calls captured in one CUDA graph, do_bench median of its replay (L2 "
    f"flushed before each replay) / {GRAPH_CALLS}: the cost of a call inside sglang's decode-step graph (no per-call "
    "launch floor; calls after the first find the logits in L2 where they fit, as right after the logits kernel)",
}
# The targets (H200, CUDA-graph replay), evaluated per code path and method from the measured rows. A target
# passes when the best of its providers is exact and meets every condition ("all") or any condition ("any");
# ratio_to / faster_than compare with the native path's row of that provider measured in the same run.
TARGETS: dict[str, dict[str, Any]] = {
    **{
        f"k512_B64_{n}": {
            "k": 512, "B": 64, "length": length, "providers": ("sparsemla_split", T38), "limit_us": limit,
            "ratio_to": ("torch_topk", 0.5), "mode": "all",
        }
        for n, length, limit in (("4k", 4096, 10.0), ("16k", 16384, 20.0), ("64k", 65536, 40.0))
    },
    **{
        f"k2048_B64_{n}": {
            "k": 2048, "B": 64, "length": length, "providers": ("sparsemla_split", T38), "limit_us": limit,
            "faster_than": SGLANG_PROVIDERS, "mode": "any",
        }
        for n, length, limit in (("4k", 4096, 13.0), ("16k", 16384, 16.0), ("64k", 65536, 38.0))
    },
    "fused_k512_B1_4k": {
        "k": 512, "B": 1, "length": 4096, "providers": ("sparsemla_fused", "sparsemla_logits_topk", FUSED_T38),
        "limit_us": 15.0, "mode": "all",
    },
}  # fmt: skip
# h200-baselines.md (sglang HISA result files, H200, torch 2.9): fast_topk_v2, k = 2048, B = 64.
SGLANG_PUBLISHED = {
    "source": "sglang HISA result files as cited in shared/notes/h200-baselines.md (H200, torch 2.9)",
    "kernel": "fast_topk_v2",
    "k": 2048,
    "us": {"4096": 13.0, "16384": 16.0, "65536": 38.0},
    "ranges_us": {"4096": "13", "16384": "15-17", "65536": "37-39"},
}


# -- pure helpers (CPU-tested) -----------------------------------------------------------------------------------------
def parse_providers(text: str) -> list[str]:
    """Comma-separated provider names, in the given order; ValueError naming the unknown ones and the valid ones."""
    chosen = list(dict.fromkeys(p.strip() for p in text.split(",") if p.strip()))
    unknown = [p for p in chosen if p not in PROVIDERS]
    if unknown or not chosen:
        raise ValueError(f"unknown providers {unknown or text!r}: choose from {', '.join(PROVIDERS)}")
    return chosen


def parse_ints(text: str, name: str) -> list[int]:
    try:
        out = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise ValueError(f"--{name} takes comma-separated integers, got {text!r}") from None
    if not out or any(v <= 0 for v in out):
        raise ValueError(f"--{name} takes positive integers, got {text!r}")
    return out


def _combine(results: list[bool | None], mode: str) -> bool | None:
    """``all``: False if any is False, None if any is unknown, else True; ``any``: True if any is True, None if any is
    unknown, else False."""
    if mode == "any":
        return True if True in results else (None if None in results else False)
    return False if False in results else (None if None in results else True)


def evaluate_targets(rows: list[dict], targets: dict[str, dict] | None = None) -> list[dict]:
    """One verdict per target x code path x method: the best measured provider, each condition and ``pass`` (True,
    False, or None when a needed row is missing or failed)."""
    targets = TARGETS if targets is None else targets
    ok = [r for r in rows if not r.get("error")]
    index = {(r["path"], r["provider"], r["B"], r["length"], r["k"]): r for r in ok}
    paths = list(dict.fromkeys(r["path"] for r in rows)) or ["native"]
    out: list[dict] = []
    for tid, t in targets.items():
        shape = (t["B"], t["length"], t["k"])
        for path in paths:
            for method in METHODS:
                key = f"us_{method}"
                cands = [(index[(path, p, *shape)], p) for p in t["providers"] if (path, p, *shape) in index]
                cands = [(r[key], p, r) for r, p in cands if r.get(key) is not None]
                verdict: dict[str, Any] = {"target": tid, "path": path, "method": method, **dict(zip(
                    ("B", "length", "k"), shape, strict=True))}  # fmt: skip
                if not cands:
                    out.append({**verdict, "measured_us": None, "provider": None, "conditions": [], "pass": None,
                                "why": "not measured"})  # fmt: skip
                    continue
                us, provider, row = min(cands, key=lambda c: c[0])
                speed: list[dict] = [{"what": f"<= {t['limit_us']:g} us", "pass": us <= t["limit_us"]}]
                if "ratio_to" in t:
                    ref_name, ratio = t["ratio_to"]
                    ref = index.get(("native", ref_name, *shape), {}).get(key)
                    speed.append({"what": f"<= {ratio:g} x {ref_name}", "ref_us": ref,
                                  "pass": None if ref is None else us <= ratio * ref})  # fmt: skip
                if "faster_than" in t:
                    refs = [(index[("native", p, *shape)].get(key), p) for p in t["faster_than"]
                            if ("native", p, *shape) in index]  # fmt: skip
                    refs = [(v, p) for v, p in refs if v is not None]
                    if refs:
                        ref, ref_name = min(refs)
                        speed.append({"what": f"< {ref_name} (same run)", "ref_us": ref, "pass": us < ref})
                    else:
                        pub = SGLANG_PUBLISHED["us"].get(str(t["length"]))
                        why = f"sglang JIT not measured here; published {pub} us (another run, not comparable)"
                        speed.append({"what": "< sglang JIT (same run)", "ref_us": None, "pass": None, "why": why})
                exact = row.get("exact")
                verdict.update(
                    measured_us=us,
                    provider=provider,
                    exact=exact,
                    conditions=speed,
                    mode=t["mode"],
                    **{"pass": False if exact is False else _combine([c["pass"] for c in speed], t["mode"])},
                )
                out.append(verdict)
    return out


def gpu_slug(name: str) -> str:
    m = re.search(r"(H200|H100|H800|H20|B200|B300|A100|L40S|L4|RTX ?\w+|\w+)", name.replace("NVIDIA ", ""))
    return (m.group(1) if m else name).lower().replace(" ", "")


# -- toolchain ---------------------------------------------------------------------------------------------------------
def cuda_home() -> str | None:
    """The CUDA root whose nvcc and lib64/libcudart the sglang JIT build should use: $CUDA_HOME / $CUDA_PATH, the
    root above ``nvcc`` on PATH, /usr/local/cuda, /usr/local/cuda-*. sglang takes the root above ``nvcc`` on PATH
    as is, which is wrong when that nvcc is a wrapper script in /usr/local/bin (it then links -L/usr/local/lib64)."""
    env = flags.child_env()
    found = shutil.which("nvcc")
    cands = [env.get("CUDA_HOME"), env.get("CUDA_PATH")]
    cands += [str(Path(found).resolve().parent.parent)] if found else []
    cands += ["/usr/local/cuda", *sorted((str(p) for p in Path("/usr/local").glob("cuda-*")), reverse=True)]
    for c in cands:
        if c and (Path(c) / "bin" / "nvcc").exists() and any((Path(c) / d).exists() for d in (
                "lib64/libcudart.so", "targets/x86_64-linux/lib/libcudart.so")):  # fmt: skip
            return c
    return None


def nvcc_version(home: str | None) -> str | None:
    nvcc = str(Path(home) / "bin" / "nvcc") if home else shutil.which("nvcc")
    if not nvcc:
        return None
    try:
        text = subprocess.run([nvcc, "--version"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError) as exc:
        return f"unavailable: {exc}"
    m = re.search(r"release [\d.]+, V[\d.]+", text)
    return m.group(0) if m else text.strip()[-200:]


def child_env(path: str) -> dict[str, str]:
    """The environment of a code path's process (and of the sglang build): the path's TRITON_OVERRIDE_ARCH, the CUDA
    root for the JIT build, and this Python's bin folder first on PATH (pip's ``ninja`` lives there)."""
    env = flags.child_env({"TRITON_OVERRIDE_ARCH": None if path == "native" else path})
    home = cuda_home()
    if home:
        env["CUDA_HOME"] = home
    env["PATH"] = f"{Path(sys.executable).parent}:{env.get('PATH', '')}"
    return env


def _child_argv(argv: list[str], path: str, out: Path) -> list[str]:
    return code_paths.child_argv("benchmarks.topk", argv, path, out)


# -- sglang's JIT top-k ------------------------------------------------------------------------------------------------
def _sglang_topk_module(src: Path):
    """sglang 0.5.23's ``sglang.kernels.ops.attention.dsv4.topk`` from the carried source tree (ImportError with the
    fix when the tree is missing)."""
    if not (src / "sglang" / "kernels" / "jit" / "utils").is_dir():
        raise ImportError(f"no sglang JIT tree under {src}: run benchmarks/gpu-sglang-jit.sh here and carry .gpu")
    if str(src) not in sys.path:
        sys.path.insert(0, str(src))
    import sglang.kernels.ops.attention.dsv4.topk as sgl_topk

    return sgl_topk


def build_sglang(src: Path, out: Path) -> None:
    """Build (or load from sglang's JIT cache) the v1 and v2 top-k modules; write what happened to ``out``."""
    info: dict[str, Any] = {"cuda_home": cuda_home(), "nvcc": nvcc_version(cuda_home()), "src": str(src)}
    try:
        import torch
        import tvm_ffi

        torch.cuda.init()  # the v2 build probes the GPU's cluster occupancy

        info["tvm_ffi"] = getattr(tvm_ffi, "__version__", "?")
        sgl_topk = _sglang_topk_module(src)
    except Exception as exc:  # noqa: BLE001 - every failure is a result: the JSON says why
        info.update(
            v1={"error": f"{type(exc).__name__}: {exc}"[:4000]}, v2={"error": f"{type(exc).__name__}: {exc}"[:4000]}
        )
        out.write_text(json.dumps(info))
        return
    for name, builder in (("v1", "_jit_topk_v1_module"), ("v2", "_jit_topk_v2_module")):
        t0 = time.perf_counter()
        try:
            getattr(sgl_topk, builder)()
            info[name] = {"built": True, "build_s": round(time.perf_counter() - t0, 1)}
        except Exception as exc:  # noqa: BLE001
            info[name] = {
                "error": f"{type(exc).__name__}: {exc}"[-4000:],
                "build_s": round(time.perf_counter() - t0, 1),
            }
        out.write_text(json.dumps(info))


# -- timing ------------------------------------------------------------------------------------------------------------
def graph_us(fn, calls: int) -> float:
    """Median replay time (us) per call of ``calls`` back-to-back ``fn()`` captured in one CUDA graph, L2 flushed."""
    import torch
    import triton.testing

    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):  # warm-up outside the capture: compiles, workspaces grow, JIT modules load
        fn()
        fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(calls):
            fn()
    ms = triton.testing.do_bench(graph.replay, warmup=10, rep=40, return_mode="median")
    del graph
    return 1e3 * ms / calls


def _err(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"[:2000]


# -- one code path -----------------------------------------------------------------------------------------------------
def _check(torch, got_pos, got_slots, ref_pos, ref_slots, logits) -> dict:
    """``exact``: the same set as torch.topk (positions, and page-table slots where written); ``values_match``: the
    same multiset of logit values (a tie at the threshold resolved otherwise still matches)."""
    res: dict[str, Any] = {}
    exact = True
    if got_pos is not None:
        exact &= bool(torch.equal(got_pos.sort(dim=1).values, ref_pos))
        vals = lambda p: torch.where(p >= 0, logits.gather(1, p.clamp(min=0).long()), float("-inf"))  # noqa: E731
        res["values_match"] = bool(torch.equal(vals(got_pos).sort(dim=1).values, vals(ref_pos).sort(dim=1).values))
    if got_slots is not None:
        exact &= bool(torch.equal(got_slots.sort(dim=1).values, ref_slots))
    res["exact"] = exact
    return res


@dataclass
class Shape:
    """One (B, length, k) point: its case, logits and the torch.topk reference (sorted, -1 padding first)."""

    case: Any
    logits: Any
    k: int
    ref_pos: Any
    ref_slots: Any


class PathRun:
    """The rows of one code path's process, saved after every shape (a crash keeps what was measured)."""

    def __init__(self, path: str, out: Path) -> None:
        self.path, self.out = path, out
        self.rows: list[dict] = []
        self.meta: dict[str, Any] = {"path": path}

    def save(self) -> None:
        self.out.write_text(json.dumps({"rows": self.rows, "meta": self.meta}))

    def add(self, provider: str, shape: Shape, k: int | None, fn, check=None, error: str | None = None) -> None:
        """Time ``fn`` both ways after ``check()`` (a dict: exact, values_match) ran it once; a failure is a row."""
        import torch

        case = shape.case
        row: dict[str, Any] = {"path": self.path, "provider": provider, "B": case.batch, "length": case.ctx,
                               "cap": case.cap, "k": k}  # fmt: skip
        try:
            if error is not None:
                raise RuntimeError(error)
            if check is not None:
                row.update(check())
            row["us_graph"] = round(graph_us(fn, 1), 2)
            row["us_graph20"] = round(graph_us(fn, GRAPH_CALLS), 2)
        except Exception as exc:  # noqa: BLE001 - a provider that fails is a result, the others still run
            row["error"] = _err(exc)
            try:
                torch.cuda.synchronize()
            except Exception as sticky:  # noqa: BLE001 - a sticky CUDA error ends this path; its rows are saved
                row["error"] += f" (then {_err(sticky)})"
                self.rows.append(row)
                self.save()
                raise
        self.rows.append(row)


def make_shape(case, logits, k: int) -> Shape:
    import torch

    from sparsemla.kernels.layouts import IDX_PAGE

    length = case.ctx
    kk = min(k, length)
    top = torch.topk(logits[:, :length], kk, dim=1).indices.to(torch.int32)
    ref_pos = torch.nn.functional.pad(top, (0, k - kk), value=-1).sort(dim=1).values
    pages = torch.gather(case.page_table, 1, (ref_pos.clamp(min=0) // IDX_PAGE).long())
    ref_slots = torch.where(ref_pos >= 0, pages * IDX_PAGE + ref_pos % IDX_PAGE, -1).to(torch.int32)
    return Shape(case, logits, k, ref_pos, ref_slots.sort(dim=1).values)


SPLIT_ORDERS = (("sparsemla_split", False), ("sparsemla_split_sorted", True))  # provider -> sorted=
FUSED_MODES = (("sparsemla_fused", True), ("sparsemla_logits_topk", None))  # provider -> fuse= (None: the launcher's)


def split_call(case, logits, k: int, pos, slots, srt: bool):  # noqa: ANN001, ANN201
    """``indexer_topk_fwd`` on ``logits`` as the split providers call it (page-table slots written)."""
    from sparsemla.kernels.indexer.topk import indexer_topk_fwd
    from sparsemla.kernels.layouts import IDX_PAGE

    return functools.partial(indexer_topk_fwd, logits, case.seq_lens, k, out=pos, page_table=case.page_table,
                             page_size=IDX_PAGE, out_slots=slots, sorted=srt)  # fmt: skip


def fused_call(case, k: int, pos, fuse: bool | None):  # noqa: ANN001, ANN201
    """``indexer_logits_topk_fwd`` (position order) as the logits + top-k providers call it."""
    from sparsemla.kernels.indexer.triton import indexer_logits_topk_fwd

    return functools.partial(indexer_logits_topk_fwd, case.q, case.kv, case.weights, case.seq_lens, case.page_table, k,
                             case.cap, out=pos, sorted=False, fuse=fuse)  # fmt: skip


def time_ours(run: PathRun, shape: Shape, chosen: list[str], replayers: dict | None = None) -> None:
    """Our top-k (split, both orders; with ``replayers``, a prod_cubins.Replayer per Triton 3.8 provider, also from
    Triton 3.8 cubins), torch.topk, and at FUSED_LENGTH the logits + top-k calls, on one shape."""
    import torch

    case, logits, k = shape.case, shape.logits, shape.k
    length = case.ctx
    pos = torch.empty(case.batch, k, dtype=torch.int32, device=logits.device)
    slots = torch.empty_like(pos)

    def checked(fn, got_slots=None):
        def check() -> dict:
            got = fn()
            if isinstance(got, tuple):  # torch.topk: (values, indices) of min(k, length) columns
                got = torch.nn.functional.pad(got.indices.to(torch.int32), (0, k - got.indices.shape[1]), value=-1)
            else:
                got = pos
            return _check(torch, got, got_slots, shape.ref_pos, shape.ref_slots if got_slots is not None else None,
                          logits)  # fmt: skip

        return check

    for provider, srt in SPLIT_ORDERS:
        if provider in chosen:
            fn = split_call(case, logits, k, pos, slots, srt)
            run.add(provider, shape, k, fn, checked(fn, slots))
    replayers = replayers or {}

    def from_cubins(provider: str, fn):  # noqa: ANN001, ANN202
        def call() -> None:
            # the provider's kernels from their Triton 3.8 cubins (graph capture records the launches)
            with replayers[provider]:
                fn()

        return call

    if T38 in chosen and T38 in replayers:
        split = split_call(case, logits, k, pos, slots, False)
        run.add(T38, shape, k, from_cubins(T38, split), checked(from_cubins(T38, split), slots))
    if "torch_topk" in chosen:
        fn = functools.partial(torch.topk, logits[:, :length], min(k, length), dim=1, sorted=False)
        run.add("torch_topk", shape, k, fn, checked(fn))
    if length == FUSED_LENGTH:
        for provider, fuse in FUSED_MODES:
            if provider in chosen:
                fn = fused_call(case, k, pos, fuse)
                run.add(provider, shape, k, fn, checked(fn))
        if FUSED_T38 in chosen and FUSED_T38 in replayers:
            fused = fused_call(case, k, pos, True)
            run.add(FUSED_T38, shape, k, from_cubins(FUSED_T38, fused), checked(from_cubins(FUSED_T38, fused)))


def time_sglang(run: PathRun, shapes: list[Shape], wanted: list[str], src: Path, build: dict, progress, task) -> None:
    """sglang's v1 / v2 top-k on the same logits and page tables, after its build finished (loaded from its cache)."""
    import torch

    from sparsemla.kernels.layouts import IDX_PAGE

    sgl, load_err = None, None
    try:
        import tvm_ffi

        sgl = _sglang_topk_module(src)
    except Exception as exc:  # noqa: BLE001
        load_err = _err(exc)

    def on_torch_stream(fn):
        def run_fn():
            with tvm_ffi.use_torch_stream():  # tvm-ffi launches on torch's current stream (the capture's in a graph)
                fn()

        return run_fn

    for shape in shapes:
        case, logits, k = shape.case, shape.logits, shape.k
        progress.update(task, description=f"[native] sglang B={case.batch} length={case.ctx} k={k}")
        slots = torch.empty(case.batch, k, dtype=torch.int32, device=logits.device)
        raw = torch.empty_like(slots)
        base = (logits, case.seq_lens, case.page_table, slots, IDX_PAGE)
        for provider, ver in (("sglang_jit_v1", "v1"), ("sglang_jit_v2", "v2")):
            if provider not in wanted:
                continue
            why = load_err or build.get(ver, {}).get("error")
            if why:  # the row carries the toolchain it failed with
                why += f" [nvcc: {build.get('nvcc')}; CUDA_HOME: {build.get('cuda_home')}]"
            if ver == "v1" and k > SGLANG_V1_MAX_K:
                why = f"topk_v1.cuh supports k <= {SGLANG_V1_MAX_K} (kMaxTopK)"
            if why:
                run.add(provider, shape, k, None, error=why)
                continue
            if ver == "v1":
                fn = on_torch_stream(functools.partial(sgl.topk_transform_paged, *base))
                with_raw = on_torch_stream(functools.partial(sgl.topk_transform_paged, *base, raw))
            else:
                plan = sgl.plan_topk_v2(case.seq_lens)  # sglang builds it once per batch, outside the top-k call
                fn = on_torch_stream(functools.partial(sgl.topk_transform_paged_v2, *base, plan))
                with_raw = on_torch_stream(functools.partial(sgl.topk_transform_paged_v2, *base, plan, raw))

            def check(f=with_raw, s=slots, r=raw, sh=shape) -> dict:
                f()
                return _check(torch, r, s, sh.ref_pos, sh.ref_slots, sh.logits)

            run.add(provider, shape, k, fn, check)
        progress.advance(task)


def build_cubins_for(cfg: dict, out_dir: Path, code_path: str = "native") -> int:
    """No GPU: compile the launches ``sparsemla_split`` makes at every (B, length, k) of ``cfg``, and
    ``sparsemla_fused`` at FUSED_LENGTH, with this machine's Triton (3.8 in production's environment) for sm_90 in
    ``code_path`` into ``out_dir`` (benchmarks/prod_cubins.py). The launchers' choices come from shapes and the
    H200's facts only, and the inputs have the GPU run's shapes, dtypes and strides (an unfilled cache of as many
    pages), so the GPU run makes the same launches. Returns how many cubins were added."""
    import torch

    from benchmarks import prod_cubins
    from benchmarks.indexer import make_case, unfilled_indexer_cache
    from sparsemla.kernels.indexer.topk import indexer_topk_fwd
    from sparsemla.kernels.layouts import IDX_PAGE

    def workload() -> None:
        for batch in cfg["B"]:
            for length in cfg["lengths"]:
                cap = max(length, CAP_MIN)
                logits = torch.empty(batch, cap)
                lens = torch.full((batch,), length, dtype=torch.int32)
                table = torch.zeros(batch, cap // IDX_PAGE, dtype=torch.int32)
                for k in cfg["k"]:
                    pos = torch.empty(batch, k, dtype=torch.int32)
                    indexer_topk_fwd(logits, lens, k, out=pos, page_table=table, page_size=IDX_PAGE,
                                     out_slots=torch.empty_like(pos), sorted=False)  # fmt: skip
                if length == FUSED_LENGTH:
                    case = make_case(batch, length, cap, kv, torch.Generator().manual_seed(0))
                    for k in cfg["k"]:
                        fused_call(case, k, torch.empty(batch, k, dtype=torch.int32), True)()

    kv = unfilled_indexer_cache(max(cfg["B"]) * -(-max(cfg["lengths"]) // IDX_PAGE))  # the GPU run's page count

    return len(prod_cubins.build(workload, out_dir, code_path))


WARM_PROVIDERS = ("sparsemla_split", "sparsemla_split_sorted", *LOGITS_PROVIDERS)  # compiled by this Triton
WARM_TIMEOUT_S = 300.0  # the warm-up processes together; the ones still running then are stopped


def warm_chunks(batches: list[int], lengths: list[int], workers: int) -> list[list[tuple[int, int]]]:
    """The (B, length) points dealt to at most ``workers`` warm-up processes, the largest first (their compiles are
    not the slow part, but their inputs take the longest to make), none empty."""
    pairs = sorted(((b, n) for b in batches for n in lengths), key=lambda bn: (-bn[0] * bn[1], bn))
    chunks: list[list[tuple[int, int]]] = [[] for _ in range(max(1, min(workers, len(pairs))))]
    for i, pair in enumerate(pairs):
        chunks[i % len(chunks)].append(pair)
    return chunks


def parse_pairs(text: str) -> list[tuple[int, int]]:
    """``"1:1024,64:4096"`` -> [(1, 1024), (64, 4096)] (B:length points of --warm-only)."""
    try:
        pairs = [tuple(int(x) for x in part.split(":")) for part in text.split(",") if part.strip()]
    except ValueError:
        pairs = []
    if not pairs or any(len(pr) != 2 or min(pr) < 1 for pr in pairs):
        raise ValueError(f"--warm-only takes B:length points like 1:1024,64:4096, got {text!r}")
    return pairs  # type: ignore[return-value]


def warm_points(pairs: list[tuple[int, int]], chosen: list[str], ks: list[int], seed: int, device: str = "cuda") -> int:
    """One eager call of each chosen provider this machine's Triton compiles (WARM_PROVIDERS) at every (B, length)
    point and k, made as the timed loop makes it (:func:`split_call`, :func:`fused_call`): fills the Triton cache
    that the timing process then reads (a warm-up process of ``run_path``). Returns the number of calls."""
    import torch

    from benchmarks.indexer import gpu_indexer_cache, make_case
    from sparsemla.kernels.indexer.triton import indexer_logits_fwd
    from sparsemla.kernels.layouts import IDX_PAGE

    dev = torch.device(device)
    gen = torch.Generator(device=dev).manual_seed(seed)
    kv = gpu_indexer_cache(max(b * -(-n // IDX_PAGE) for b, n in pairs), dev, gen)
    calls = 0
    for batch, length in pairs:
        case = make_case(batch, length, max(length, CAP_MIN), kv, gen)
        logits = indexer_logits_fwd(case.q, case.kv, case.weights, case.seq_lens, case.page_table, case.cap)
        for k in ks:
            pos = torch.empty(batch, k, dtype=torch.int32, device=dev)
            slots = torch.empty_like(pos)
            for provider, srt in SPLIT_ORDERS:
                if provider in chosen:
                    split_call(case, logits, k, pos, slots, srt)()
                    calls += 1
            if length == FUSED_LENGTH:
                for provider, fuse in FUSED_MODES:
                    if provider in chosen:
                        fused_call(case, k, pos, fuse)()
                        calls += 1
    if dev.type == "cuda":
        torch.cuda.synchronize()
    return calls


def warm_up(path: str, chosen: list[str], cfg: dict, seed: int, workers: int) -> float:
    """Compiles this path's kernels in ``workers`` processes at once (each a share of the points, :func:`warm_points`)
    before the timing process needs them: a fresh machine's Triton compiles otherwise run one after another inside
    the timed loop. Returns the seconds it took; a warm-up process that fails only costs its share of the speed-up."""
    wanted = [p for p in chosen if p in WARM_PROVIDERS]
    if workers < 1 or not wanted:
        return 0.0
    t0 = time.monotonic()
    procs, failed = [], 0
    chunks = warm_chunks(cfg["B"], cfg["lengths"], workers)
    for chunk in chunks:
        points = ",".join(f"{b}:{n}" for b, n in chunk)
        cmd = [sys.executable, "-m", "benchmarks.topk", "--warm-only", points, "--providers", ",".join(wanted),
               "--ks", ",".join(map(str, cfg["k"])), "--seed", str(seed)]  # fmt: skip
        try:
            procs.append(subprocess.Popen(cmd, env=child_env(path)))
        except OSError:
            failed += 1
    for proc in procs:  # one deadline for all: a hung warm-up process must not hold the timed run
        try:
            failed += proc.wait(timeout=max(1.0, WARM_TIMEOUT_S - (time.monotonic() - t0))) != 0
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            failed += 1
    if failed:
        print(f"[{path}] warm-up: {failed} of {len(chunks)} processes failed (their kernels compile in the timed run)")
    return time.monotonic() - t0


def run_path(
    path: str,
    chosen: list[str],
    cfg: dict,
    seed: int,
    sglang_src: Path,
    out: Path,
    cubins: Path | None = None,
    warm_workers: int = 0,
) -> None:
    import torch
    from rich.progress import Progress

    from benchmarks.indexer import gpu_indexer_cache, make_case
    from sparsemla.kernels.indexer.triton import indexer_logits_fwd
    from sparsemla.kernels.layouts import IDX_PAGE

    device = torch.device("cuda")
    if path != "native":
        chosen = [p for p in chosen if p not in PATH_INDEPENDENT]
    replayers = {}
    if cubins is not None:
        from benchmarks import prod_cubins

        mine = prod_cubins.path_dir(cubins, path)  # this code path's 3.8 cubins
        replayers = {p: prod_cubins.Replayer(mine, T38_KERNELS[p]) for p in T38_KERNELS if p in chosen}
    sgl_wanted = [p for p in chosen if p in SGLANG_PROVIDERS]
    build_proc, build_out = None, out.with_suffix(".sglang.json")
    if sgl_wanted:  # builds while our providers are timed (its own process: no CUDA calls beside a graph capture)
        cmd = [sys.executable, "-m", "benchmarks.topk", "--build-sglang-only", str(build_out),
               "--sglang-src", str(sglang_src)]  # fmt: skip
        build_proc = subprocess.Popen(cmd, env=child_env("native"))
    run = PathRun(path, out)
    if warm_workers:
        run.meta["warm_up"] = {"workers": warm_workers, "s": round(warm_up(path, chosen, cfg, seed, warm_workers), 1)}
        print(f"[{path}] warm-up ({warm_workers} processes): {run.meta['warm_up']['s']} s", flush=True)
    bs, lengths, ks = cfg["B"], cfg["lengths"], cfg["k"]
    gen = torch.Generator(device=device).manual_seed(seed)
    kv = gpu_indexer_cache(max(bs) * -(-max(lengths) // IDX_PAGE), device, gen)
    shapes: list[Shape] = []
    n_shapes = len(bs) * len(lengths) * len(ks)
    t0 = time.monotonic()
    with Progress() as progress:
        task = progress.add_task(f"[{path}] top-k", total=n_shapes * (2 if sgl_wanted else 1))
        for batch in bs:
            for length in lengths:
                case = make_case(batch, length, max(length, CAP_MIN), kv, gen)
                args = (case.q, case.kv, case.weights, case.seq_lens, case.page_table, case.cap)
                logits = indexer_logits_fwd(*args)
                for k in ks:
                    progress.update(task, description=f"[{path}] B={batch} length={length} k={k}")
                    shape = make_shape(case, logits, k)
                    shapes.append(shape)
                    time_ours(run, shape, chosen, replayers)
                    progress.advance(task)
                    run.save()
                    if not sys.stdout.isatty():  # rich draws nothing there until the end: a line per shape instead
                        print(f"[{path}] B={batch} length={length} k={k}: {time.monotonic() - t0:.0f} s", flush=True)
                if length == FUSED_LENGTH and "sparsemla_logits" in chosen:
                    run.add("sparsemla_logits", shapes[-1], None, functools.partial(indexer_logits_fwd, *args))
        if build_proc is not None:
            progress.update(task, description="[native] waiting for the sglang JIT build")
            try:
                build_proc.wait(timeout=600)
                run.meta["sglang_jit"] = json.loads(build_out.read_text())
            except Exception as exc:  # noqa: BLE001 - the build's failure is a result too
                run.meta["sglang_jit"] = {"v1": {"error": _err(exc)}, "v2": {"error": _err(exc)}}
            run.save()
            time_sglang(run, shapes, sgl_wanted, sglang_src, run.meta["sglang_jit"], progress, task)
    if replayers:
        entries = next(iter(replayers.values())).manifest.values()
        run.meta["triton38_cubins"] = {
            "dir": str(cubins),
            "replayed_launches": {p: r.counts for p, r in replayers.items()},
            "triton": sorted({e["triton"] for e in entries}),
            "targets": sorted({e["target"] for e in entries}),
        }
    run.save()


def merge_results(files: list[Path], out_dir: Path) -> Path:
    """Join per-path runs of one commit on one GPU into one result (see the module docstring); returns the path."""
    runs = [json.loads(f.read_text()) for f in files]
    for key in ("op", "gpu", "git_sha", "torch", "triton"):
        if len({r[key] for r in runs}) != 1:
            raise ValueError(f"cannot merge runs with different {key}: {sorted({str(r[key]) for r in runs})}")
    merged = dict(runs[0])
    merged["code_paths"] = [p for r in runs for p in r["code_paths"]]
    if len(set(merged["code_paths"])) != len(merged["code_paths"]):
        raise ValueError(f"cannot merge runs that repeat a code path: {merged['code_paths']}")
    merged["date"] = max(r["date"] for r in runs)
    merged["shapes"] = {p: r["shapes"] for r in runs for p in r["code_paths"]}
    merged["merged_from"] = [f.name for f in files]
    merged["sglang_jit"] = next((r["sglang_jit"] for r in runs if "v1" in r["sglang_jit"]), runs[0]["sglang_jit"])
    merged["triton38_cubins"] = next((r["triton38_cubins"] for r in runs if r.get("triton38_cubins")), None)
    merged["warm_up"] = {p: w for r in runs for p, w in r.get("warm_up", {}).items()}
    merged["rows"] = [row for r in runs for row in r["rows"]]
    merged["target_results"] = evaluate_targets(merged["rows"])
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"topk-{gpu_slug(merged['gpu'])}-{merged['date']}.json"
    path.write_text(json.dumps(merged, indent=1, default=list) + "\n")
    return path


# -- the run -----------------------------------------------------------------------------------------------------------
def print_table(rows: list[dict]) -> None:
    """Last lines of the run: us_graph / us_graph20 per (k, B, length) and provider@path ('x' = not exact)."""
    cols = list(dict.fromkeys(f"{r['provider']}@{r['path']}" for r in rows if r.get("k")))
    short = {c: c.replace("sparsemla_", "").replace("sglang_jit_", "sgl_").replace("@native", "") for c in cols}
    cells: dict[tuple, dict[str, str]] = {}
    for r in rows:
        if not r.get("k"):
            continue
        v = "err" if r.get("error") else f"{r['us_graph']:.1f}/{r['us_graph20']:.1f}" + ("" if r.get("exact") else "x")
        cells.setdefault((r["k"], r["B"], r["length"]), {})[f"{r['provider']}@{r['path']}"] = v
    print("k B length | " + " ".join(f"{short[c]:>17}" for c in cols))
    for key, vals in sorted(cells.items()):
        print(f"{key[0]} {key[1]} {key[2]} | " + " ".join(f"{vals.get(c, '-'):>17}" for c in cols))


def print_targets(verdicts: list[dict]) -> None:
    mark = {True: "PASS", False: "FAIL", None: "n/a"}
    for v in verdicts:
        us = "-" if v["measured_us"] is None else f"{v['measured_us']:.1f}"
        conds = "; ".join(f"{c['what']}: {mark[c['pass']]}" for c in v["conditions"])
        print(f"{mark[v['pass']]:>4} {v['target']} [{v['path']}, {v['method']}] {us} us ({v['provider']}) {conds}")


def _write(out_dir: Path, rows: list[dict], metas: list[dict], git_sha: str, paths: list[str], cfg: dict) -> Path:
    import torch
    import triton

    from sparsemla import artifacts

    name = torch.cuda.get_device_name()
    sgl = next((m["sglang_jit"] for m in metas if "sglang_jit" in m), None)
    home = cuda_home()
    result = {
        "op": "topk",
        "gpu": name,
        "git_sha": git_sha or artifacts.git_sha() or "unknown",
        "date": _dt.date.today().isoformat(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "triton": triton.__version__,
        "cuda": torch.version.cuda,
        "nvcc": nvcc_version(home),
        "cuda_home": home,
        "code_paths": paths,
        "path_note": "native = the GPU's own code (wgmma on Hopper); sm89 = TRITON_OVERRIDE_ARCH=sm89 (mma.sync, the "
        "code of sm_80..sm_120); torch_topk and sglang_jit_* run in the native path only (no Triton code)",
        "shapes": {**cfg, "cap": f"max(length, {CAP_MIN})", "page_size": 64, "heads": 64},
        "inputs": "real indexer logits: benchmarks.indexer.make_case (fp8 keys ~ N(0,1), random q and weights) + "
        "indexer_logits_fwd; every row of a batch at the real length",
        "correctness": "exact = same set as torch.topk over the real length (positions; page-table slots where "
        "written); values_match = same multiset of selected logits",
        "methods": METHODS,
        "providers": PROVIDERS,
        "sglang_jit": sgl or {"status": "not requested"},
        "triton38_cubins": next((m["triton38_cubins"] for m in metas if "triton38_cubins" in m), None),
        "warm_up": {m["path"]: m["warm_up"] for m in metas if "warm_up" in m},
        "sglang_published": SGLANG_PUBLISHED,
        "targets": TARGETS,
        "target_results": evaluate_targets(rows),
        "rows": rows,
    }
    if sgl and all("error" in sgl.get(v, {}) for v in ("v1", "v2")):
        result["sglang_jit"]["note"] = "not built on the GPU machine (errors above); compare with sglang_published"
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"topk-{gpu_slug(name)}-{result['date']}.json"
    path.write_text(json.dumps(result, indent=1, default=list) + "\n")
    return path


@app.command()
def main(
    out_dir: Path = typer.Option(Path("results/bench"), help="Folder for topk-<gpu>-<date>.json."),
    providers: str = typer.Option(",".join(DEFAULT_PROVIDERS), help="Comma-separated providers."),
    batches: str = typer.Option(",".join(map(str, BATCHES)), help="Comma-separated batch sizes."),
    lengths: str = typer.Option(",".join(map(str, LENGTHS)), help="Comma-separated real lengths (compressed tokens)."),
    ks: str = typer.Option(",".join(map(str, KS)), help="Comma-separated k (512, 1024, 2048)."),
    paths: str = typer.Option("native,sm89", help="Code paths, each in its own process: native and/or smNN."),
    sglang_src: Path = typer.Option(
        Path(".gpu/sglang_src"), help="sglang 0.5.23 JIT source tree (benchmarks/gpu-sglang-jit.sh prepares it)."
    ),
    git_sha: str = typer.Option("", help="Commit of the code measured (the GPU machine's copy has no .git)."),
    seed: int = typer.Option(0, help="Random seed."),
    child_out: Path = typer.Option(None, hidden=True, help="(internal) write this process's rows here."),
    build_sglang_only: Path = typer.Option(None, hidden=True, help="(internal) build sglang's JIT top-k, report here."),
    merge: list[Path] = typer.Option(None, help="Join these per-path result JSONs into one (no GPU needed)."),
    build_cubins: Path = typer.Option(
        None,
        help="No GPU: compile the *_t38 providers' launches of these shapes with this Triton (sm_90) into DIR/<path> "
        "for every --paths.",
    ),
    cubins: Path = typer.Option(
        None, help="GPU: also time the *_t38 providers from DIR/<path> (made by --build-cubins) in every code path."
    ),
    warm_workers: int = typer.Option(
        0, min=0, help="Compile each path's Triton kernels in this many processes at once before timing (cold caches)."
    ),
    warm_only: str = typer.Option("", hidden=True, help="(internal) B:length points to compile for, then exit."),
) -> None:
    """Time every top-k provider in each code path on the current CUDA GPU and write one JSON with target verdicts."""
    from sparsemla.console import fail

    try:
        chosen = parse_providers(providers)
        path_list = code_paths.parse(paths)
        cfg = {
            "B": parse_ints(batches, "batches"),
            "lengths": parse_ints(lengths, "lengths"),
            "k": parse_ints(ks, "ks"),
        }
    except ValueError as exc:
        fail(str(exc))
    if bad := [k for k in cfg["k"] if k not in (512, 1024, 2048)]:
        fail(f"k must be 512, 1024 or 2048, got {bad}")
    if build_sglang_only is not None:
        build_sglang(sglang_src, build_sglang_only)
        return
    if warm_only:
        try:
            points = parse_pairs(warm_only)
        except ValueError as exc:
            fail(str(exc))
        warm_points(points, chosen, cfg["k"], seed)
        return
    if build_cubins is not None:
        import triton

        from benchmarks import prod_cubins

        for code_path in path_list:
            where = prod_cubins.path_dir(build_cubins, code_path)
            added = build_cubins_for(cfg, where, code_path)
            print(f"{added} cubins added to {where} (Triton {triton.__version__}, {code_path} path on sm_90)")
        return
    if cubins is not None:
        from benchmarks import prod_cubins

        prod_cubins.require(cubins, path_list)
        chosen = [*chosen, *(p for p in T38_KERNELS if p not in chosen)]
    elif wrong := [p for p in chosen if p in T38_KERNELS]:
        fail(f"{', '.join(wrong)} needs --cubins DIR",
             "build them first: python -m benchmarks.topk --build-cubins DIR (no GPU)")  # fmt: skip
    if merge:
        try:
            written = merge_results(merge, out_dir)
        except (OSError, ValueError, KeyError) as exc:
            fail(f"--merge: {exc}", "pass result JSONs of one commit on one GPU, one per code path")
        rows = json.loads(written.read_text())["rows"]
        print_table(rows)
        print_targets(evaluate_targets(rows))
        print(f"wrote {written}")
        return
    import torch

    if not torch.cuda.is_available():
        fail("the top-k benchmark needs a CUDA GPU", "run it on the device machine (make bench-topk)")
    if child_out is not None:
        run_path(path_list[0], chosen, cfg, seed, sglang_src, child_out, cubins, warm_workers)
        return
    rows, metas = [], []
    # each path's rows as they are measured, next to the result: a run stopped from outside (the device call's limit)
    # still leaves them there; removed once the result is written
    partial = out_dir / PARTIAL_DIR
    partial.mkdir(parents=True, exist_ok=True)
    for path in path_list:
        out = partial / f"{path}.json"
        out.unlink(missing_ok=True)
        proc = subprocess.run(_child_argv(sys.argv[1:], path, out), env=child_env(path))
        if out.exists():  # a child that died part-way still leaves the rows it measured
            data = json.loads(out.read_text())
            rows += data["rows"]
            metas.append(data["meta"])
        if proc.returncode:
            metas.append({"path": path, "error": f"child exited with {proc.returncode}"})
    written = _write(out_dir, rows, metas, git_sha, path_list, cfg)
    shutil.rmtree(partial, ignore_errors=True)
    print_table(rows)
    print_targets(evaluate_targets(rows))
    print(f"wrote {written}")


if __name__ == "__main__":
    app()
