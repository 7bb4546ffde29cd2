"""sparsemla.traces: chrome-trace parsing, kernel classification, shares, top-N tables, bad files."""

from __future__ import annotations

import gzip
import json
import random
from pathlib import Path

import pytest

from sparsemla import traces
from sparsemla.metric_names import KERNEL_CATEGORIES

# Real kernel names as torch profiler / sglang traces show them, with the category each must get.
NAMED_KERNELS = [
    ("_sparse_decode_mma_kernel", "attention"),
    (
        "void flash::flash_fwd_splitkv_mla_kernel<Flash_fwd_kernel_traits_mla<576, 64>>(Flash_fwd_mla_params)",
        "attention",
    ),
    ("fmha_v2_flash_attention_bf16_64_128_S_qk_192_sm90_kernel", "attention"),
    ("_indexer_logits_kernel", "indexer"),
    ("fp8_paged_mqa_logits_kernel", "indexer"),
    ("void at::native::sbtopk::gatherTopK<float, unsigned int, 2, false>(...)", "indexer"),
    ("mla_indexer_topk_kernel", "indexer"),  # indexer outranks attention
    ("ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevKernelArgsStorage<4096ul>)", "communication"),
    ("cross_device_reduce_1stage<__nv_bfloat16, 8>", "communication"),
    ("gemm_allreduce_fused_kernel", "communication"),  # communication outranks gemm
    ("nvjet_tst_128x64_64x8_2x1_v_bz_TNT", "gemm"),
    (
        "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64_warpgroupsize1x1x1_execute_segment_k_off_kernel__5x_cublas",
        "gemm",
    ),
    ("void cutlass::Kernel2<cutlass_80_wmma_tensorop_bf16_s161616gemm_bf16_32x32_128x1_tn_align8>(Params)", "gemm"),
    ("fused_moe_kernel", "gemm"),
    ("Memcpy DtoD (Device -> Device)", "copy"),
    ("Memset (Device)", "copy"),
    ("void at::native::(anonymous namespace)::CatArrayBatchedCopy<float, unsigned int, 3, 128, 1>(...)", "copy"),
    (
        "void at::native::elementwise_kernel<128, 4, at::native::direct_copy_kernel_cuda(at::TensorIteratorBase&)>",
        "copy",
    ),
    (
        "void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<c10::BFloat16>>(int)",
        "elementwise",
    ),
    ("void at::native::reduce_kernel<512, 1, at::native::ReduceOp<float>>(...)", "elementwise"),
    ("fused_add_rmsnorm_kernel", "elementwise"),
    ("act_and_mul_kernel<silu>", "elementwise"),
    ("rotary_embedding_kernel", "elementwise"),
    ("void at::native::(anonymous namespace)::cunn_SoftMaxForward<4, float>(...)", "elementwise"),
    ("triton_poi_fused_0", "other"),
    ("some_unknown_kernel", "other"),
]


@pytest.mark.parametrize(("name", "category"), NAMED_KERNELS, ids=[c + "-" + n[:30] for n, c in NAMED_KERNELS])
def test_classify_real_names(name: str, category: str) -> None:
    assert traces.classify(name) == category


def test_short_name_strips_templates_and_arguments() -> None:
    assert traces.short_name("void at::native::elementwise_kernel<128, 4, F<int>>(int, F)") == (
        "at::native::elementwise_kernel"
    )
    assert traces.short_name("Memcpy HtoD (Pageable -> Device)") == "Memcpy HtoD"
    assert traces.short_name("plain_kernel") == "plain_kernel"
    assert traces.short_name("void at::native::(anonymous namespace)::cunn_SoftMaxForward<4>(float*)") == (
        "at::native::cunn_SoftMaxForward"
    )
    assert len(traces.short_name("k" * 500)) == 96


def _event(name: str, dur: float, cat: str = "kernel", ts: float = 0.0) -> dict:
    return {"ph": "X", "cat": cat, "name": name, "pid": 0, "tid": 7, "ts": ts, "dur": dur, "args": {"device": 0}}


def _write_trace(path: Path, events: list[dict], gz: bool = True) -> Path:
    data = json.dumps({"schemaVersion": 1, "traceEvents": events}).encode()
    path.write_bytes(gzip.compress(data) if gz else data)
    return path


def _random_events(rng: random.Random, n: int) -> list[dict]:
    events = []
    for i in range(n):
        name, _ = rng.choice(NAMED_KERNELS)
        cat = "gpu_memcpy" if name.startswith("Memcpy") else "gpu_memset" if name.startswith("Memset") else "kernel"
        events.append(_event(name, rng.uniform(0.5, 500.0), cat, ts=float(i)))
    # CPU-side and non-complete events that must be ignored
    events.append({"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "ts": 0, "dur": 1e6})
    events.append({"ph": "X", "cat": "cpu_op", "name": "aten::mm", "ts": 0, "dur": 1e6})
    events.append({"ph": "i", "cat": "kernel", "name": "instant", "ts": 0})
    events.append({"ph": "M", "name": "process_name", "args": {"name": "python"}})
    return events


def test_shares_sum_to_one_and_match_a_direct_sum(tmp_path: Path) -> None:
    rng = random.Random(1234)
    events = _random_events(rng, 400)
    path = _write_trace(tmp_path / "a-TP-0.trace.json.gz", events)
    summary = traces.summarize([path])

    gpu = [e for e in events if e.get("ph") == "X" and e["cat"] in ("kernel", "gpu_memcpy", "gpu_memset")]
    assert summary.total_us == pytest.approx(sum(e["dur"] for e in gpu))
    assert sum(k.share for k in summary.kernels) == pytest.approx(1.0, abs=1e-9)
    assert sum(summary.category_shares.values()) == pytest.approx(1.0, abs=1e-9)
    assert set(summary.category_shares) == set(KERNEL_CATEGORIES)
    expected: dict[str, float] = {}
    for e in gpu:
        c = traces.classify(e["name"])
        expected[c] = expected.get(c, 0.0) + e["dur"]
    for c in KERNEL_CATEGORIES:
        assert summary.category_us.get(c, 0.0) == pytest.approx(expected.get(c, 0.0))
    assert sum(k.calls for k in summary.kernels) == len(gpu)
    assert [k.time_us for k in summary.kernels] == sorted((k.time_us for k in summary.kernels), reverse=True)


def test_several_files_are_summed_and_plain_json_is_read(tmp_path: Path) -> None:
    a = _write_trace(tmp_path / "p-TP-0.trace.json.gz", [_event("nvjet_gemm", 30.0), _event("_sparse_decode_k", 10.0)])
    b = _write_trace(tmp_path / "p-TP-1.trace.json", [_event("nvjet_gemm", 20.0), _event("ncclKernel", 40.0)], gz=False)
    summary = traces.summarize([a, b])
    assert summary.total_us == pytest.approx(100.0)
    assert summary.category_shares["gemm"] == pytest.approx(0.5)
    assert summary.category_shares["communication"] == pytest.approx(0.4)
    assert summary.category_shares["attention"] == pytest.approx(0.1)
    assert summary.files == [str(a), str(b)]


def test_bare_event_list_format(tmp_path: Path) -> None:
    path = tmp_path / "list.trace.json"
    path.write_text(json.dumps([_event("gemm_a", 3.0), _event("softmax_b", 1.0)]))
    assert traces.summarize([path]).category_shares["gemm"] == pytest.approx(0.75)


@pytest.mark.parametrize("n", [0, 1, 3, 10, 1000])
def test_top_n_with_one_other_row(tmp_path: Path, n: int) -> None:
    rng = random.Random(n)
    summary = traces.summarize_times((f"kernel_{i}", rng.uniform(1, 100)) for i in range(40))
    rows = summary.top(n)
    assert sum(r.share for r in rows) == pytest.approx(1.0, abs=1e-9)
    assert rows[: min(n, 40)] == summary.kernels[: min(n, 40)]
    if n < 40:
        assert rows[-1].name == "other" and len(rows) == n + 1
        assert rows[-1].calls == 40 - n
    else:
        assert len(rows) == 40


def test_top_n_other_by_category_preserves_category_sums() -> None:
    rng = random.Random(7)
    times = [(rng.choice(NAMED_KERNELS)[0] + f"_{i}", rng.uniform(1, 100)) for i in range(200)]
    summary = traces.summarize_times(times)
    rows = summary.top(5, other_by_category=True)
    by_cat: dict[str, float] = {}
    for r in rows:
        by_cat[r.category] = by_cat.get(r.category, 0.0) + r.share
    for c, share in summary.category_shares.items():
        assert by_cat.get(c, 0.0) == pytest.approx(share, abs=1e-12)
    assert len({(r.name, r.category) for r in rows}) == len(rows)


def test_same_short_name_in_two_categories_stays_apart() -> None:
    summary = traces.summarize_times(
        [
            ("void at::native::elementwise_kernel<128, 4, direct_copy_kernel_cuda>(int)", 10.0),
            ("void at::native::elementwise_kernel<128, 4, CUDAFunctor_add>(int)", 30.0),
        ]
    )
    cats = {(k.name, k.category): k.share for k in summary.kernels}
    assert cats == {
        ("at::native::elementwise_kernel", "elementwise"): pytest.approx(0.75),
        ("at::native::elementwise_kernel", "copy"): pytest.approx(0.25),
    }


def test_to_dict_is_json_and_table_renders() -> None:
    summary = traces.summarize_times([("nvjet_x", 2.0), ("flash_mla_y", 1.0), ("z", 1.0)])
    data = json.loads(json.dumps(summary.to_dict(top_n=2)))
    assert [k["name"] for k in data["kernels"]] == ["nvjet_x", "flash_mla_y", "other"]
    assert data["categories"]["gemm"] == pytest.approx(0.5)
    table = traces.format_table(summary, top_n=2)
    assert "nvjet_x" in table and "gemm=50.0%" in table


@pytest.mark.parametrize(
    "content",
    [b"", b"{not json", gzip.compress(b'{"traceEvents": [')[:-5], b'{"traceEvents": 3}', b"\x1f\x8b\x08garbage"],
    ids=["empty", "bad-json", "truncated-gzip", "no-list", "bad-gzip"],
)
def test_corrupt_files_raise_trace_error(tmp_path: Path, content: bytes) -> None:
    path = tmp_path / "bad.trace.json.gz"
    path.write_bytes(content)
    with pytest.raises(traces.TraceError, match="bad.trace.json.gz"):
        traces.summarize([path])


def test_missing_file_and_cpu_only_trace(tmp_path: Path) -> None:
    with pytest.raises(traces.TraceError, match="no such trace file"):
        traces.summarize([tmp_path / "nope.trace.json.gz"])
    cpu_only = _write_trace(
        tmp_path / "cpu.trace.json.gz", [{"ph": "X", "cat": "cpu_op", "name": "aten::mm", "dur": 5}]
    )
    with pytest.raises(traces.TraceError, match="no GPU kernel events"):
        traces.summarize([cpu_only])
    with pytest.raises(traces.TraceError, match="no trace files"):
        traces.summarize([])


def test_find_traces_filters_by_profile_id(tmp_path: Path) -> None:
    for name in ["p1-TP-0.trace.json.gz", "p1-TP-1.trace.json.gz", "p2-TP-0.trace.json.gz", "p1-notes.txt"]:
        (tmp_path / name).write_bytes(b"x")
    assert [p.name for p in traces.find_traces(tmp_path, "p1")] == ["p1-TP-0.trace.json.gz", "p1-TP-1.trace.json.gz"]
    assert len(traces.find_traces(tmp_path)) == 3
    assert traces.find_traces(tmp_path / "missing") == []


FIXTURES = Path(__file__).parent / "fixtures" / "traces"


def test_real_h200_trace() -> None:
    """A torch-profiler trace captured on an H200 (5 iterations of bf16 GEMM, fp32 softmax, top-k, copy, cat, SiLU,
    and a small GEMM + SiLU + RMSNorm). At capture time torch's own ``prof.key_averages()`` summed the kernels' self
    device time to 3822.1 us; the parser must agree within 1%."""
    summary = traces.summarize([FIXTURES / "h200-eager-small.trace.json.gz"])
    assert summary.total_us == pytest.approx(3822.1, rel=0.01)
    shares = summary.category_shares
    assert sum(shares.values()) == pytest.approx(1.0, abs=1e-9)
    assert shares["gemm"] > 0.2 and shares["indexer"] > 0.3 and shares["copy"] > 0.1 and shares["elementwise"] > 0.1
    by_name = {(k.name, k.category): k for k in summary.kernels}
    assert by_name[("at::native::::cunn_SoftMaxForwardReg".replace("::::", "::"), "elementwise")].calls == 5
    assert by_name[("Memcpy DtoD", "copy")].calls == 5
    gemms = [k for k in summary.kernels if k.name.startswith("nvjet_sm90")]
    assert gemms and all(k.category == "gemm" for k in gemms)
    assert sum(k.calls for k in gemms) == 10  # the big and the small GEMM, five iterations each
