"""Decode-step benchmark harness on the CPU: model shapes, a tiny end-to-end run, kernel shares from synthetic traces,
and the calibration adapter (the GPU run itself is `make bench-step`)."""

from __future__ import annotations

import gzip
import json
import random
from pathlib import Path

import pytest
import torch

from benchmarks import step, step_model, step_run
from sparsemla import flags, traces
from sparsemla.metric_names import KERNEL_CATEGORIES
from sparsemla.ops.sim.calibrate_from_step import StepResultError, calibrate, calibration_args
from sparsemla.ops.sim.calibration import load_calibration

KERNEL_NAMES = [
    "_sparse_decode_kernel",
    "_sparse_decode_combine_kernel",
    "_tiled_sparse_decode_kernel",
    "_indexer_logits_kernel",
    "_indexer_topk_kernel",
    "nvjet_tst_128x64_64x8_2x1_v_bz_TNT",
    "void cutlass::Kernel2<cutlass_80_simt_sgemm_64x128_8x5_tn_align1>(Params)",
    "void at::native::elementwise_kernel<128, 4, direct_copy_kernel_cuda>(int, F)",
    "void at::native::vectorized_elementwise_kernel<4, silu>(int, F)",
    "void at::native::elementwise_kernel<128, 4, mul_kernel>(int, F)",
    "void at::native::sbtopk::gatherTopK<float, unsigned int, 2, false>(...)",
    "void at::native::reduce_kernel<512, 1>(R)",
    "Memcpy DtoD (Device -> Device)",
    "ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevKernelArgsStorage<4096ul>)",
    "some_unknown_kernel",
] + [f"triton_poi_fused_{i}" for i in range(10)]


@pytest.fixture(autouse=True)
def _reference_kernels():
    """The fp32 references, not Triton's CPU interpreter (conftest turns it on): a whole step per test must be fast."""
    with flags.TRITON_INTERPRET.override(False):
        yield


def synthetic_trace(path: Path, rng: random.Random, scale: float = 1.0) -> tuple[Path, float]:
    """A torch-profiler-like chrome trace of random GPU kernels (+ CPU noise); returns (path, summed GPU µs)."""
    events, t, total = [], 0.0, 0.0
    for _ in range(rng.randint(200, 400)):
        name = rng.choice(KERNEL_NAMES)
        dur = rng.uniform(1.0, 50.0) * scale
        cat = "gpu_memcpy" if name.startswith("Memcpy") else "kernel"
        events.append({"ph": "X", "cat": cat, "name": name, "pid": 0, "tid": 7, "ts": t, "dur": dur})
        events.append({"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1, "ts": t, "dur": 3.0})
        t += dur + 1.0
        total += dur
    path.parent.mkdir(parents=True, exist_ok=True)
    with gzip.open(path, "wt") as f:
        json.dump({"traceEvents": events}, f)
    return path, total


def test_v4_flash_layer_mix_and_experts() -> None:
    shape = step_model.V4_FLASH
    ratios = shape.compress_ratios
    assert len(ratios) == 43 and ratios[:2] == (0, 0)
    assert ratios.count(4) == 21 == shape.indexer_layers and ratios.count(128) == 20
    assert all(ratios[i] != ratios[i + 1] for i in range(2, 42))  # 4 and 128 alternate
    prev = (0, 0)
    for b in (1, 2, 8, 16, 32, 64, 128):
        experts, per = shape.active_experts(b)
        assert 1 <= experts <= shape.local_experts and experts * per >= b * shape.experts_per_token
        assert experts >= prev[0]
        prev = (experts, per)
    assert shape.active_experts(1)[0] == 6  # 8 tokens x 6 experts over 256: 32 * 0.173 -> 6 touched
    assert shape.active_experts(64)[0] == shape.local_experts


@pytest.mark.parametrize("variant", step_model.VARIANTS)
def test_variant_flags_roundtrip(variant: str) -> None:
    mma, idx = step_model.variant_flags(variant)
    assert variant == ("+".join(p for p, on in (("mma_decode", mma), ("triton_indexer", idx)) if on) or "baseline")


def test_bad_variant_and_inputs_are_refused() -> None:
    with pytest.raises(ValueError, match="unknown variant"):
        step_model.variant_flags("fast")
    gen = torch.Generator().manual_seed(0)
    with pytest.raises(ValueError, match="multiple of 512"):
        step_model.make_inputs(step_model.TINY, 1, 1000, 16384, torch.device("cpu"), gen)
    with pytest.raises(ValueError, match="ctx <= cap"):
        step_model.make_inputs(step_model.TINY, 1, 32768, 16384, torch.device("cpu"), gen)


def test_point_order_puts_the_targets_first() -> None:
    assert step.point_order((16, 1, 64, 32), (4096, 65536))[:4] == [(4096, 1), (4096, 64), (4096, 16), (4096, 32)]
    assert step.variant_order(step_model.VARIANTS)[:2] == ["baseline", "mma_decode+triton_indexer"]


def test_inputs_match_sglang_geometry() -> None:
    """SWA window of the last 128 positions on the request's own page; the c128 table is cap/128 wide, -1 past
    ctx/128, and maps block t to page_table[t // 2] * 2 + t % 2 (sglang's c128 page size 256 / 128)."""
    gen = torch.Generator().manual_seed(1)
    shape, b, ctx, cap = step_model.TINY, 3, 4096, 16384
    inp = step_model.make_inputs(shape, b, ctx, cap, torch.device("cpu"), gen)
    assert inp.swa_idx.shape == (b, 1, 128) and inp.page_table.shape == (b, cap // 256)
    for r in range(b):
        assert set((inp.swa_idx[r, 0] // 256).tolist()) == {r}
    assert inp.c128_idx.shape == (b, 1, cap // 128)
    n = ctx // 128
    assert (inp.c128_idx[:, 0, n:] == -1).all() and (inp.c128_idx[:, 0, :n] >= 0).all()
    t = torch.arange(n)
    want = inp.page_table[:, t // 2].long() * 2 + t % 2
    assert torch.equal(inp.c128_idx[:, 0, :n].long(), want)
    pages = inp.page_table[:, : ctx // 256]
    assert len(set(pages.flatten().tolist())) == pages.numel()  # real pages are not shared
    assert inp.c4_len.tolist() == [ctx // 4] * b and inp.c4_topk_len.tolist() == [512] * b


def test_tiny_run_writes_the_schema(tmp_path: Path) -> None:
    """A CPU smoke run of two states: the issue's row schema, speedups, marginal cost, the indexer agreement check,
    and a rerun of the JSON file that survives every point."""
    from sparsemla.kernels import sparse_decode

    out = tmp_path / "step-cpu.json"
    doc = step.run_bench(
        shape=step_model.TINY, device=torch.device("cpu"), batches=(1, 2), contexts=(2048,), cap=16384,
        variants=("baseline", "mma_decode+triton_indexer"), out_path=out, trace_dir=None,
        baseline_decode=sparse_decode, baseline_label="reference", target_s=0.0, min_reps=1, max_reps=1,
        log=lambda _: None,
    )  # fmt: skip
    assert json.loads(out.read_text()) == json.loads(json.dumps(doc))
    assert doc["op"] == "step" and doc["errors"] == [] and doc["skipped"] == []
    assert {(r["provider"], r["B"], r["ctx"]) for r in doc["rows"]} == {
        (p, b, 2048) for p in ("baseline", "sparsemla") for b in (1, 2)
    }
    for r in doc["rows"]:
        assert set(r) == {"B", "ctx", "provider", "us", "tok_s"} and r["us"] > 0
        assert r["tok_s"] == pytest.approx(r["B"] / (r["us"] * 1e-6))
    cell = {(r["provider"], r["B"]): r["us"] for r in doc["rows"]}
    assert doc["speedup"]["2048"]["2"] == pytest.approx(cell[("baseline", 2)] / cell[("sparsemla", 2)])
    assert doc["marginal_us"]["baseline"]["2048"] == pytest.approx(cell[("baseline", 2)] - cell[("baseline", 1)])
    assert doc["checks"]["indexer_topk_agreement"] == 1.0  # torch fallback + torch.topk vs our indexer path
    assert doc["model"]["compress_ratios"] == [0, 0, 4, 128]


def test_tiny_step_is_the_same_function_in_every_state() -> None:
    """On the CPU both decodes are the fp32 reference; the two indexer paths must pick the same slots, so every state
    yields the same tokens from the same inputs."""
    from sparsemla.kernels import sparse_decode

    gen = torch.Generator().manual_seed(3)
    shape = step_model.TINY
    layers, lm_head, norm = step_model.make_weights(shape, torch.device("cpu"), gen)
    tokens = []
    for variant in step_model.VARIANTS:
        inp = step_model.make_inputs(shape, 2, 2048, 16384, torch.device("cpu"), torch.Generator().manual_seed(5))
        tokens.append(step_model.DecodeStep(shape, layers, lm_head, norm, inp, variant, sparse_decode)())
    assert all(torch.equal(t, tokens[0]) for t in tokens[1:])


def test_kernel_share_from_a_synthetic_trace(tmp_path: Path) -> None:
    rng = random.Random(7)
    path, total = synthetic_trace(tmp_path / "a.trace.json.gz", rng)
    summary = traces.summarize([path])
    entry = step_run.kernel_share(summary, step_us=total * 1.1)
    assert entry["total_gpu_us"] == pytest.approx(total)
    assert entry["gpu_busy"] == pytest.approx(1 / 1.1)
    assert set(entry["categories"]) == set(KERNEL_CATEGORIES)
    assert sum(entry["categories"].values()) == pytest.approx(1.0)
    assert sum(entry["category_us"].values()) == pytest.approx(total)
    assert entry["categories_sum_within_1pct"] is True
    assert len(entry["top"]) == step_run.TOP_N + 1 and entry["top"][-1]["name"] == "other"
    assert sum(k["share"] for k in entry["top"]) == pytest.approx(1.0)
    assert sum(k["time_us"] for k in entry["kernels"]) == pytest.approx(total)
    assert entry["files"] == ["a.trace.json.gz"]


def _doc_with_shares(tmp_path: Path, scale: float = 0.5) -> dict:
    """A CPU smoke-run document whose kernel shares come from synthetic traces (kernel time = scale x step)."""
    from sparsemla.kernels import sparse_decode

    doc = step.run_bench(
        shape=step_model.TINY, device=torch.device("cpu"), batches=(1, 2), contexts=(2048, 4096), cap=16384,
        variants=("baseline", "mma_decode+triton_indexer"), out_path=tmp_path / "s.json", trace_dir=None,
        baseline_decode=sparse_decode, baseline_label="reference", target_s=0.0, min_reps=1, max_reps=1,
        log=lambda _: None,
    )  # fmt: skip
    rng = random.Random(11)
    for r in doc["variant_rows"]:
        path, total = synthetic_trace(tmp_path / f"{r['variant']}-{r['B']}-{r['ctx']}.trace.json.gz", rng)
        factor = scale * r["us"] / total  # rescale so the kernels take `scale` of the step
        times = [(name, us * factor) for name, us in traces.gpu_kernel_times(traces.load_events(path))]
        summary = traces.summarize_times(times, files=[str(path)])
        entry = step_run.kernel_share(summary, r["us"])
        doc["kernel_share"].setdefault(r["variant"], {}).setdefault(str(r["ctx"]), {})[str(r["B"])] = entry
    return doc


def test_calibration_from_a_step_result(tmp_path: Path) -> None:
    doc = _doc_with_shares(tmp_path)
    src = tmp_path / "step-cpu-2026-01-01.json"
    src.write_text(json.dumps(doc))
    out = calibrate(src, tmp_path / "default.json")
    cal = load_calibration(out)
    assert set(cal.states) == {"baseline", "mma_decode+triton_indexer"}
    assert cal.provenance.provisional is False and cal.provenance.git_sha == doc["git_sha"]
    assert cal.model.num_layers == 4 and cal.model.context_length == 16384
    assert "Prefill" in cal.provenance.notes and "mma_decode left out" in cal.provenance.notes
    for r in doc["variant_rows"]:
        state = cal.state(r["variant"])
        assert state.step_seconds(r["B"], r["ctx"]) == pytest.approx(r["us"] * 1e-6, rel=1e-6)
        times = state.kernel_times_us(r["B"], r["ctx"])
        assert sum(times.values()) == pytest.approx(0.5 * r["us"], rel=1e-4)
        assert state.flags["sparsemla_mma_decode"] == ("on" if r["variant"] != "baseline" else "off")
    names = [k.name for k in cal.state("baseline").kernels]
    assert len(names) == len(set(names))
    # one short name in two categories (elementwise_kernel: copy and elementwise) is told apart
    assert any(n.endswith("[copy]") for n in names) and any(n.endswith("[elementwise]") for n in names)


def test_calibration_raises_steps_shorter_than_their_kernels(tmp_path: Path) -> None:
    doc = _doc_with_shares(tmp_path, scale=1.2)
    args = calibration_args(doc, "x.json")
    state = args["states"]["baseline"]
    for i in range(len(state.batch)):
        for j in range(len(state.context)):
            assert state.step_us[i][j] == pytest.approx(sum(g[i][j] for g in state.kernel_us.values()))
    assert "raised to the profiled kernel sum: 8" in args["provenance"].notes


def test_calibration_refuses_bad_results(tmp_path: Path) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"op": "decode", "rows": []}))
    with pytest.raises(StepResultError, match="missing"):
        calibrate(bad, tmp_path / "out.json")
    bad.write_text("{not json")
    with pytest.raises(StepResultError, match="not valid JSON"):
        calibrate(bad, tmp_path / "out.json")
    doc = _doc_with_shares(tmp_path)
    for variant in doc["kernel_share"]:
        for ctx in ("2048", "4096"):
            doc["kernel_share"][variant][ctx].pop("2")  # a hole at every context of every state
    bad.write_text(json.dumps(doc))
    with pytest.raises(StepResultError, match="complete batch grid"):
        calibrate(bad, tmp_path / "out.json")
    assert not (tmp_path / "out.json").exists()


def test_calibration_keeps_the_complete_contexts_of_a_state(tmp_path: Path) -> None:
    """A run cut short by its time budget: the state keeps the contexts it has in full, the notes say what was cut."""
    doc = _doc_with_shares(tmp_path)
    doc["variant_rows"] = [
        r for r in doc["variant_rows"] if not (r["variant"] == "baseline" and r["ctx"] == 4096 and r["B"] == 2)
    ]
    args = calibration_args(doc, "x.json")
    assert args["states"]["baseline"].context == (2048,) and args["states"]["baseline"].batch == (1, 2)
    assert args["states"]["mma_decode+triton_indexer"].context == (2048, 4096)
    assert "state baseline: contexts [4096] left out" in args["provenance"].notes
