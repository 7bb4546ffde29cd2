"""Running one decode-step point of ``make bench-step``: CUDA-graph capture, replay timing, profile, hook overhead.

A *point* is (flag state, B, ctx). On a GPU the whole 43-layer step is captured once into one CUDA graph (as sglang
captures its decode step per batch size) after one eager warm-up run (which also compiles the Triton kernels), then
replayed: one untimed replay, then ``reps`` replays each timed with a pair of CUDA events (median reported), then one
replay under ``torch.profiler`` (CUDA activity only) whose chrome trace becomes the kernel-share table through
:mod:`sparsemla.traces`. On a CPU (tests) the step runs eagerly and is timed with ``time.perf_counter``; nothing is
profiled.
"""

from __future__ import annotations

import gzip
import importlib
import shutil
import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import torch

from sparsemla import traces

TOP_N = 15


@dataclass
class Prepared:
    """A runnable step: ``run()`` executes it once (graph replay on a GPU); ``release()`` frees the graph's memory."""

    run: Callable[[], Any]
    graph: Any = None
    mode: str = "eager"
    eager: Callable[[], Any] | None = None  # the uncaptured step (profiled instead if a graph replay shows no kernels)

    def release(self) -> None:
        self.graph = None
        self.run = _released
        if torch.cuda.is_available():
            torch.cuda.synchronize()
            torch.cuda.empty_cache()


def _released() -> None:
    raise RuntimeError("this step's CUDA graph was released")


def prepare(step: Callable[[], Any], device: torch.device) -> Prepared:
    """Warm ``step`` up once eagerly, then capture it into a CUDA graph (GPU) or return it as is (CPU)."""
    if device.type != "cuda":
        step()
        return Prepared(run=step)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        step()
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()
    torch.cuda.synchronize()
    return Prepared(run=graph.replay, graph=graph, mode="cuda_graph", eager=step)


def time_one(prepared: Prepared, device: torch.device) -> float:
    """Microseconds of one run (CUDA events on a GPU)."""
    if device.type != "cuda":
        t0 = time.perf_counter()
        prepared.run()
        return (time.perf_counter() - t0) * 1e6
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    prepared.run()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) * 1e3


def time_step(
    prepared: Prepared, device: torch.device, target_s: float, min_reps: int, max_reps: int
) -> dict[str, Any]:
    """One untimed run, then ``reps`` timed runs (as many as fit ``target_s``, within [min_reps, max_reps])."""
    first = time_one(prepared, device)
    reps = int(min(max_reps, max(min_reps, target_s * 1e6 // max(first, 1.0))))
    samples = sorted(time_one(prepared, device) for _ in range(reps))
    return {
        "us": statistics.median(samples),
        "min_us": samples[0],
        "max_us": samples[-1],
        "reps": reps,
        "mode": prepared.mode,
    }


def profile_step(run: Callable[[], Any], trace_path: Path) -> Path:
    """One ``run()`` under torch.profiler (CUDA activity); the chrome trace gzipped at ``trace_path``."""
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        run()
        torch.cuda.synchronize()
    raw = trace_path.with_name(trace_path.name.removesuffix(".gz"))
    trace_path.parent.mkdir(parents=True, exist_ok=True)
    prof.export_chrome_trace(str(raw))
    with raw.open("rb") as src, gzip.open(trace_path, "wb", compresslevel=9) as dst:
        shutil.copyfileobj(src, dst)
    raw.unlink()
    return trace_path


def profile_summary(prepared: Prepared, step_us: float, trace_path: Path) -> tuple[traces.TraceSummary, str]:
    """Kernel times of one profiled step: a graph replay, or the eager step when the replay's trace holds (almost) no
    kernels (CUPTI builds that do not report kernels inside graphs). Returns (summary, what was profiled)."""
    try:
        summary = traces.summarize([profile_step(prepared.run, trace_path)])
        if summary.total_us >= 0.5 * step_us or prepared.eager is None:
            return summary, prepared.mode
    except traces.TraceError:
        if prepared.eager is None:
            raise
    return traces.summarize([profile_step(prepared.eager, trace_path)]), "eager"


def kernel_share(summary: traces.TraceSummary, step_us: float, top_n: int = TOP_N) -> dict[str, Any]:
    """The kernel-share entry of one point: top-N table, category shares (and µs), every kernel group (for the
    simulator calibration), and the check that the categories add up to the profiled GPU time within 1%."""
    category_us = {c: summary.category_us.get(c, 0.0) for c in summary.category_shares}
    cat_sum = sum(category_us.values())
    return {
        "step_us": step_us,
        "total_gpu_us": summary.total_us,
        "gpu_busy": summary.total_us / step_us if step_us else None,
        "categories": summary.category_shares,
        "category_us": category_us,
        "categories_sum_within_1pct": abs(cat_sum - summary.total_us) <= 0.01 * summary.total_us,
        "top": [asdict(k) for k in summary.top(top_n)],
        "kernels": [
            {"name": k.name, "category": k.category, "time_us": k.time_us, "calls": k.calls} for k in summary.kernels
        ],
        "files": [Path(f).name for f in summary.files],
    }


def load_hook(spec: str) -> Callable[..., Any]:
    """``module:function`` -> the AROUND hook (``hook(original, *args)``), e.g. the per-step metric hook."""
    module, _, attr = spec.partition(":")
    if not module or not attr:
        raise ValueError(f"hook must be 'module:function', got {spec!r}")
    return getattr(importlib.import_module(module), attr)


def hook_overhead(
    prepared: Prepared,
    batch: int,
    hook: Callable[..., Any],
    enable: Callable[[], Any],
    rounds: int = 7,
    steps: int = 20,
) -> dict[str, Any]:
    """Per-step cost of running each captured step through ``hook`` (the per-step metric hook: CUDA events recorded
    around the step, read lazily) against plain replays. Rounds alternate the order; per round ``steps`` back-to-back
    steps are timed by host clock (synchronised at the end) and by CUDA events around the whole batch of steps.
    ``enable()`` returns a context manager that turns the hook on (its flag)."""
    forward_batch = SimpleNamespace(forward_mode=SimpleNamespace(name="DECODE"), batch_size=batch)

    def original(runner: Any, fb: Any) -> None:
        prepared.run()

    def plain() -> None:
        prepared.run()

    def hooked() -> None:
        hook(original, None, forward_batch)

    def measure(fn: Callable[[], None]) -> tuple[float, float]:
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        t0 = time.perf_counter()
        start.record()
        for _ in range(steps):
            fn()
        end.record()
        end.synchronize()
        wall = (time.perf_counter() - t0) * 1e6 / steps
        return wall, start.elapsed_time(end) * 1e3 / steps

    results: dict[str, list[tuple[float, float]]] = {"plain": [], "hooked": []}
    with enable():
        hooked()  # first call creates the recorder and its histogram
        for r in range(rounds):
            order = (("plain", plain), ("hooked", hooked)) if r % 2 == 0 else (("hooked", hooked), ("plain", plain))
            for name, fn in order:
                results[name].append(measure(fn))
        torch.cuda.synchronize()
        hooked()  # drains the last completed timings into the histogram
    module = importlib.import_module(hook.__module__)
    recorder = getattr(module, "_recorder", None)
    wall = {k: statistics.median(v[0] for v in vals) for k, vals in results.items()}
    gpu = {k: statistics.median(v[1] for v in vals) for k, vals in results.items()}
    return {
        "B": batch,
        "steps_per_round": steps,
        "rounds": rounds,
        "plain_us": wall["plain"],
        "hooked_us": wall["hooked"],
        "overhead_pct": 100.0 * (wall["hooked"] / wall["plain"] - 1.0),
        "gpu_plain_us": gpu["plain"],
        "gpu_hooked_us": gpu["hooked"],
        "gpu_overhead_pct": 100.0 * (gpu["hooked"] / gpu["plain"] - 1.0),
        "observed_steps": getattr(recorder, "observed", None),
    }
