"""The hand trace parser (sparsemla.traces) agrees with HolisticTraceAnalysis's GPU kernel breakdown on the two real
H200 decode-step traces, up to HTA's whole-µs rounding (why the project keeps the hand parser: on a step of 4,400
short kernels that rounding drops ~12% of the GPU time). Runs where HTA is installed (``pip install
holistictraceanalysis``, 0.5.0 when written; not in the test extra because it pulls JupyterLab); skipped otherwise."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from sparsemla import traces

hta_analysis = pytest.importorskip("hta.trace_analysis")

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "traces"
NAMES = ("step-baseline-B64-ctx4096.trace.json.gz", "step-mma_decode_triton_indexer-B64-ctx4096.trace.json.gz")


@pytest.mark.parametrize("name", NAMES)
def test_hand_parser_agrees_with_hta(name: str, tmp_path: Path) -> None:
    shutil.copy(FIXTURES / name, tmp_path / name)
    analysis = hta_analysis.TraceAnalysis(trace_dir=str(tmp_path))
    by_type, by_kernel = analysis.get_gpu_kernel_breakdown(visualize=False, num_kernels=100_000)
    theirs = {str(n): float(s) for n, s in zip(by_kernel["name"], by_kernel["sum (us)"], strict=True)}
    ours: dict[str, float] = {}
    calls: dict[str, int] = {}
    for kernel, dur in traces.gpu_kernel_times(traces.load_events(FIXTURES / name)):
        ours[kernel] = ours.get(kernel, 0.0) + dur
        calls[kernel] = calls.get(kernel, 0) + 1
    assert set(theirs) == set(ours)  # the same GPU events (kernels + memcpy/memset)
    # HTA rounds timestamps to whole µs ("Rounding down ns resolution events"), which truncates every launch by up to
    # 2 µs; the hand parser keeps the profiler's exact durations. So per kernel: HTA <= ours <= HTA + 2 µs x launches,
    # and the long kernels (>= 100 µs a launch) agree within 1%.
    for kernel, us in ours.items():
        assert theirs[kernel] - 1e-6 <= us <= theirs[kernel] + 2.0 * calls[kernel], kernel
        if us / calls[kernel] >= 100.0:
            assert us == pytest.approx(theirs[kernel], rel=0.01), kernel
    assert sum(ours.values()) <= sum(theirs.values()) + 2.0 * sum(calls.values())
    # HTA's COMMUNICATION / MEMORY kernel types against our categories
    types = {str(t): float(s) for t, s in zip(by_type["kernel_type"], by_type["sum"], strict=True)}
    summary = traces.summarize([FIXTURES / name])
    assert types.get("COMMUNICATION", 0.0) == summary.category_us.get("communication", 0.0) == 0.0
    memory = sum(us for kernel, us in ours.items() if kernel.startswith(("Memcpy", "Memset")))
    assert abs(types.get("MEMORY", 0.0) - memory) <= max(
        0.01 * memory, sum(calls[k] for k in ours if k.startswith(("Memcpy", "Memset")))
    )
