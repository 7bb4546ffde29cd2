"""The two real H200 decode-step traces (tests/fixtures/traces/step-*.trace.json.gz, from the committed
results/bench/step-h200-*.json run) through the shared trace parser: they reproduce the committed kernel shares, the
categories add up to the profiled GPU time, and each state's kernels are where the model says they are."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks import step_run
from sparsemla import traces

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "tests" / "fixtures" / "traces"
RESULT = ROOT / "results" / "bench" / "step-h200-2026-11-29.json"
CASES = {  # fixture -> (variant, ctx, B)
    "step-baseline-B64-ctx4096.trace.json.gz": ("baseline", "4096", "64"),
    "step-mma_decode_triton_indexer-B64-ctx4096.trace.json.gz": ("mma_decode+triton_indexer", "4096", "64"),
}
LAYERS, COMPRESSED, INDEXER = 43, 41, 21  # DeepSeek-V4-Flash: 2 SWA-only, 21 ratio-4 (indexer), 20 ratio-128


@pytest.fixture(scope="module")
def result() -> dict:
    return json.loads(RESULT.read_text())


@pytest.mark.parametrize("name", sorted(CASES))
def test_fixture_is_small_and_reproduces_the_committed_shares(name: str, result: dict) -> None:
    path = FIXTURES / name
    assert path.stat().st_size < 2 * 1024 * 1024
    variant, ctx, b = CASES[name]
    committed = result["kernel_share"][variant][ctx][b]
    assert committed["files"] == [name]
    entry = step_run.kernel_share(traces.summarize([path]), committed["step_us"])
    assert entry["total_gpu_us"] == pytest.approx(committed["total_gpu_us"])
    assert entry["categories"] == pytest.approx(committed["categories"])
    assert [k["name"] for k in entry["top"]] == [k["name"] for k in committed["top"]]
    assert entry["categories_sum_within_1pct"] and committed["categories_sum_within_1pct"]
    assert sum(entry["category_us"].values()) == pytest.approx(entry["total_gpu_us"], rel=0.01)
    assert sum(k["share"] for k in entry["top"]) == pytest.approx(1.0)
    assert len(entry["top"]) == step_run.TOP_N + 1
    # one replay of the 43-layer graph was profiled; its kernels fill (almost) the whole timed step
    assert 0.8 < entry["gpu_busy"] < 1.05


def _calls(path: Path) -> dict[str, int]:
    return {k.name: k.calls for k in traces.summarize([path]).kernels}


def test_baseline_trace_has_sglangs_per_head_decode_twice_per_compressed_layer() -> None:
    calls = _calls(FIXTURES / "step-baseline-B64-ctx4096.trace.json.gz")
    # flash_mla_sparse_decode_triton runs the kernel once on the SWA cache and once more on the compressed cache
    assert calls["_tiled_sparse_decode_kernel"] == LAYERS + COMPRESSED
    assert not any(n.startswith(("_sparse_decode", "_indexer")) for n in calls)
    summary = traces.summarize([FIXTURES / "step-baseline-B64-ctx4096.trace.json.gz"])
    assert summary.category_shares["attention"] > 0.5  # the per-head kernel dominates the flags-off step


def test_sparsemla_trace_has_our_kernels_once_per_layer() -> None:
    calls = _calls(FIXTURES / "step-mma_decode_triton_indexer-B64-ctx4096.trace.json.gz")
    assert calls["_sparse_decode_kernel"] == LAYERS  # both caches in one launch
    assert calls["_indexer_logits_kernel"] == INDEXER and calls["_indexer_topk_kernel"] == INDEXER
    assert "_tiled_sparse_decode_kernel" not in calls
    summary = traces.summarize([FIXTURES / "step-mma_decode_triton_indexer-B64-ctx4096.trace.json.gz"])
    assert summary.category_shares["gemm"] > summary.category_shares["attention"]  # weights dominate once fixed


def test_committed_result_meets_its_own_schema(result: dict) -> None:
    assert result["op"] == "step" and result["gpu"].startswith("NVIDIA H200") and len(result["git_sha"]) == 40
    assert result["errors"] == []
    rows = {(r["provider"], r["ctx"], r["B"]): r for r in result["rows"]}
    assert {p for p, _, _ in rows} == {"baseline", "sparsemla"}
    assert {(c, b) for _, c, b in rows} == {(c, b) for c in (4096, 65536) for b in (1, 16, 32, 64)}
    for (_, c, b), r in rows.items():
        assert set(r) == {"B", "ctx", "provider", "us", "tok_s"}
        assert result["speedup"][str(c)][str(b)] == pytest.approx(
            rows[("baseline", c, b)]["us"] / rows[("sparsemla", c, b)]["us"]
        )
    for h in result["hook_overhead"]:
        assert h["observed_steps"] > 0 and abs(h["overhead_pct"]) < 1.0
    assert result["checks"]["indexer_topk_agreement"] > 0.99
    assert result["checks"]["decode_rel_err_c4"] < 1e-2 and result["checks"]["decode_rel_err_c128"] < 1e-2
