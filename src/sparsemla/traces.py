"""Kernel-time shares from torch-profiler (chrome) traces: the one trace parser of sparsemla.

Used by the decode-step benchmark (``make bench-step``) and by the kernel-share exporter (``sparsemla exporter``).
A trace is the ``.trace.json`` or ``.trace.json.gz`` that ``torch.profiler`` writes with ``export_chrome_trace`` (what
sglang's ``/start_profile`` writes per rank: ``<profile_id>-TP-<r>.trace.json.gz``). Only GPU activity counts: complete
events (``ph == "X"``) of category ``kernel``, ``gpu_memcpy`` or ``gpu_memset``. GPU time is the sum of their durations
(kernels on concurrent streams are counted in full, as HolisticTraceAnalysis's kernel breakdown does), so shares are
"fraction of summed kernel time", and they sum to 1.

Kernel names are grouped by a short name (C++ ``void`` prefix, template arguments and parameter lists removed), so the
dozens of instantiations of one CUTLASS or ATen template become one row, and each group gets one category from
:data:`CATEGORY_RULES` (the first matching rule in precedence order; matched on the full, lower-cased name).
"""

from __future__ import annotations

import gzip
import json
import zlib
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from sparsemla.metric_names import KERNEL_CATEGORIES

# Event categories that are GPU activity in torch-profiler traces (lower-cased; older Kineto wrote "Kernel", "Memcpy").
GPU_EVENT_CATEGORIES = frozenset({"kernel", "gpu_memcpy", "gpu_memset", "memcpy", "memset"})

# (category, substrings) in precedence order: the first category with a substring of the lower-cased name wins.
# indexer before attention (indexer kernels often say "mqa"/"mla" too), communication before gemm (fused
# all-reduce+gemm kernels count as communication), copy before elementwise (ATen copies run in elementwise_kernel).
CATEGORY_RULES: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("indexer", ("indexer", "mqa_logits", "topk")),
    ("attention", ("sparse_decode", "flash_mla", "attention", "fmha", "mla")),
    ("communication", ("nccl", "all_reduce", "allreduce", "cross_device")),
    ("gemm", ("gemm", "nvjet", "cutlass", "matmul", "moe", "xmma")),
    ("copy", ("copy", "memcpy", "memset", "catarraybatched")),
    ("elementwise", ("elementwise", "reduce_kernel", "norm", "silu", "rotary", "softmax", "act_and_mul")),
)
OTHER = "other"
# Most bytes one trace may decompress to (and a plain one may have). sglang's traces of 10 DeepSeek-V4 decode steps on
# 8 ranks are a few MB each; this bounds the exporter's memory against a gzip bomb in the shared trace directory.
MAX_TRACE_BYTES = 512 * 1024 * 1024
assert {c for c, _ in CATEGORY_RULES} | {OTHER} == set(KERNEL_CATEGORIES), "rules and metric_names disagree"


class TraceError(ValueError):
    """A trace file is missing, truncated, not JSON, or has no GPU events; the message names the file."""


@dataclass(frozen=True)
class KernelShare:
    """One kernel group: short name, category, summed GPU time in microseconds, launch count, share of total (0..1)."""

    name: str
    category: str
    time_us: float
    calls: int
    share: float


@dataclass
class TraceSummary:
    """GPU time of one or more traces, per kernel group (sorted by time, descending) and per category."""

    total_us: float
    kernels: list[KernelShare]
    category_us: dict[str, float]
    files: list[str] = field(default_factory=list)

    @property
    def category_shares(self) -> dict[str, float]:
        """Share of total GPU time per category, every category of KERNEL_CATEGORIES present (0.0 when absent)."""
        return {c: (self.category_us.get(c, 0.0) / self.total_us if self.total_us else 0.0) for c in KERNEL_CATEGORIES}

    def top(self, n: int = 15, *, other_by_category: bool = False) -> list[KernelShare]:
        """The ``n`` largest kernel groups plus the rest folded into rows named ``other``.

        With ``other_by_category=False`` the rest is one row (category ``other``): the benchmark's table. With True
        there is one ``other`` row per category that has a remainder, so that summing the rows by category gives the
        category shares exactly: the exporter's gauges."""
        if n < 0:
            raise ValueError(f"n must be >= 0, got {n}")
        head, rest = self.kernels[:n], self.kernels[n:]
        if not rest:
            return list(head)
        groups: dict[str, list[KernelShare]] = {}
        for k in rest:
            groups.setdefault(k.category if other_by_category else OTHER, []).append(k)
        folded = [
            KernelShare(
                name=OTHER,
                category=cat,
                time_us=sum(k.time_us for k in ks),
                calls=sum(k.calls for k in ks),
                share=sum(k.share for k in ks),
            )
            for cat, ks in groups.items()
        ]
        folded.sort(key=lambda k: k.time_us, reverse=True)
        return list(head) + folded

    def to_dict(self, top_n: int = 15) -> dict[str, Any]:
        """JSON-ready: total GPU time (us), category shares, the top-N table with one ``other`` row, source files."""
        return {
            "total_gpu_us": self.total_us,
            "categories": self.category_shares,
            "kernels": [asdict(k) for k in self.top(top_n)],
            "files": list(self.files),
        }


def classify(name: str) -> str:
    """The category of a kernel name (one of KERNEL_CATEGORIES) by the first matching rule of CATEGORY_RULES."""
    low = name.lower()
    for category, needles in CATEGORY_RULES:
        if any(n in low for n in needles):
            return category
    return OTHER


def short_name(name: str, max_len: int = 96) -> str:
    """A kernel name without ``void``, template arguments and parameter list, cut to ``max_len`` characters.

    ``void at::native::elementwise_kernel<128, 4, F>(int, F)`` -> ``at::native::elementwise_kernel``.
    Names that are nothing but a template (rare) keep their full text."""
    text = name.strip()
    if text.startswith("void "):
        text = text[5:]
    out: list[str] = []
    depth = 0
    prev = ""
    for ch in text:
        if ch in "<(":
            depth += 1
        elif ch == ")" or (ch == ">" and prev != "-"):  # "->" (e.g. "Pageable -> Device") is not a bracket
            depth = max(0, depth - 1)
        elif depth == 0:
            out.append(ch)
        prev = ch
    short = "".join(out).strip() or name.strip()
    while "::::" in short:  # "ns::(anonymous namespace)::f" leaves an empty scope behind
        short = short.replace("::::", "::")
    return short[:max_len]


def _read_bounded(path: Path, limit: int) -> bytes:
    """The file's bytes, gunzipped when it starts with the gzip magic (whatever the suffix says), streamed so that at
    most ``limit`` + 1 bytes are ever held; TraceError when there are more."""
    with open(path, "rb") as fh:
        gzipped = fh.read(2) == b"\x1f\x8b"
        fh.seek(0)
        if gzipped:
            with gzip.GzipFile(fileobj=fh) as gz:
                raw = gz.read(limit + 1)
        else:
            raw = fh.read(limit + 1)
    if len(raw) > limit:
        raise TraceError(
            f"{path}: more than {limit / 2**20:.0f} MiB {'decompressed' if gzipped else 'of JSON'} "
            "(a gzip bomb, or a profile of too many steps: profile fewer --num-steps, or raise the limit)"
        )
    return raw


def load_events(path: Path | str, max_bytes: int | None = None) -> list[dict[str, Any]]:
    """The trace events of one chrome trace file (``.json`` or ``.json.gz``; object with ``traceEvents`` or a list).

    At most ``max_bytes`` (default :data:`MAX_TRACE_BYTES`) are decompressed. Raises TraceError when the file is
    missing, truncated, larger than that, or not a chrome trace."""
    path = Path(path)
    limit = MAX_TRACE_BYTES if max_bytes is None else max_bytes
    if limit < 1:
        raise ValueError(f"max_bytes must be >= 1, got {limit}")
    try:
        data = json.loads(_read_bounded(path, limit))
    except FileNotFoundError:
        raise TraceError(f"{path}: no such trace file") from None
    except (OSError, EOFError, zlib.error, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise TraceError(f"{path}: not a readable chrome trace ({type(exc).__name__}: {exc})") from None
    events = data.get("traceEvents") if isinstance(data, dict) else data
    if not isinstance(events, list):
        raise TraceError(f"{path}: no traceEvents list (is this a torch-profiler chrome trace?)")
    return events


def gpu_kernel_times(events: Iterable[dict[str, Any]]) -> list[tuple[str, float]]:
    """(name, duration in us) of every GPU activity event (kernels, memcpy, memset) in ``events``."""
    out = []
    for ev in events:
        if not isinstance(ev, dict) or ev.get("ph") != "X":
            continue
        if str(ev.get("cat", "")).lower() not in GPU_EVENT_CATEGORIES:
            continue
        dur = ev.get("dur")
        if isinstance(dur, (int, float)) and dur >= 0:
            out.append((str(ev.get("name", "")), float(dur)))
    return out


def summarize_times(times: Iterable[tuple[str, float]], files: Sequence[str] = ()) -> TraceSummary:
    """Group (full kernel name, us) pairs by (short name, category) and compute shares of the summed time."""
    groups: dict[tuple[str, str], list[float]] = {}
    for name, dur in times:
        key = (short_name(name), classify(name))
        acc = groups.setdefault(key, [0.0, 0])
        acc[0] += dur
        acc[1] += 1
    total = sum(acc[0] for acc in groups.values())
    kernels = [
        KernelShare(name=n, category=c, time_us=t, calls=int(k), share=(t / total if total else 0.0))
        for (n, c), (t, k) in groups.items()
    ]
    kernels.sort(key=lambda k: (-k.time_us, k.name))
    category_us: dict[str, float] = {}
    for k in kernels:
        category_us[k.category] = category_us.get(k.category, 0.0) + k.time_us
    return TraceSummary(total_us=total, kernels=kernels, category_us=category_us, files=[str(f) for f in files])


def summarize(paths: Sequence[Path | str], max_bytes: int | None = None) -> TraceSummary:
    """Kernel shares over all ``paths`` together (e.g. every TP rank of one profile).

    Raises TraceError if a file cannot be read (or decompresses to more than ``max_bytes``, see :func:`load_events`)
    or if the traces hold no GPU event at all (a CPU-only profile)."""
    if not paths:
        raise TraceError("no trace files given")
    times: list[tuple[str, float]] = []
    for path in paths:
        times.extend(gpu_kernel_times(load_events(path, max_bytes)))
    if not times:
        raise TraceError(
            f"{', '.join(map(str, paths))}: no GPU kernel events (was the profile taken with GPU activity?)"
        )
    return summarize_times(times, files=[str(p) for p in paths])


def find_traces(directory: Path | str, profile_id: str | None = None) -> list[Path]:
    """Trace files in ``directory`` (``*.trace.json`` / ``*.trace.json.gz``), only those of ``profile_id`` if given.

    sglang names them ``[<prefix>-]<profile_id>-TP-<r>[...][-DECODE|-EXTEND].trace.json.gz``."""
    directory = Path(directory)
    if not directory.is_dir():
        return []
    found = [
        p
        for p in directory.iterdir()
        if p.is_file() and (p.name.endswith(".trace.json") or p.name.endswith(".trace.json.gz"))
    ]
    if profile_id is not None:
        found = [p for p in found if profile_id in p.name]
    return sorted(found)


def find_partial_traces(directory: Path | str, profile_id: str) -> list[Path]:
    """Temporary files of ``profile_id``'s traces (``<name>.trace.json.gz.tmp``, renamed by the writer when done):
    traces still being written, or left behind by a writer that failed (a full disk)."""
    directory = Path(directory)
    if not directory.is_dir():
        return []
    return sorted(p for p in directory.iterdir() if p.name.endswith(".tmp") and profile_id in p.name and p.is_file())


def format_table(summary: TraceSummary, top_n: int = 15) -> str:
    """A plain-text table: top-N kernels (share, time, calls, category), then category shares (for logs and docs)."""
    lines = [f"{'share':>7}  {'time_ms':>9}  {'calls':>6}  {'category':<13}  kernel"]
    for k in summary.top(top_n):
        lines.append(f"{k.share:7.1%}  {k.time_us / 1e3:9.3f}  {k.calls:6d}  {k.category:<13}  {k.name}")
    lines.append("")
    lines.append("  ".join(f"{c}={s:.1%}" for c, s in summary.category_shares.items()))
    return "\n".join(lines)
