"""The decode-step benchmark's reference state for sglang's fast path (FlashMLA's decode, our indexer standing in for
DeepGEMM's) on the CPU: the state's kernels, FlashMLA's scheduler contract through a CPU test double, the state
skipped with its reason where FlashMLA does not load, the step report's comparison and goal check computed from the
rows, and the simulator calibration unchanged by the extra state but for its ``references`` and provenance notes
(the reference numbers; never a state)."""

from __future__ import annotations

import copy
import json
import sys
from dataclasses import dataclass, fields
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from typer.testing import CliRunner

from benchmarks import decode, step, step_model, step_report, step_run
from sparsemla import flags
from sparsemla import variant as kernel_variant
from sparsemla.kernels.sparse_decode.reference import sparse_decode_reference
from sparsemla.ops.sim.calibrate_from_step import calibrate, calibration_args
from sparsemla.ops.sim.calibration import DEFAULT_PATH, CalibrationError, ReferenceState, load_calibration

ROOT = Path(__file__).resolve().parent.parent
H200 = ROOT / "results" / "bench" / "step-h200-2026-11-29.json"  # measured before the reference state existed
H200_WITH_REF = ROOT / "results" / "bench" / "step-h200-2026-12-02.json"  # the reference state measured
REF = step_model.FLASHMLA_REFERENCE
ON = kernel_variant.ALL_ON


@pytest.fixture(autouse=True)
def _reference_kernels():
    """The fp32 references, not Triton's CPU interpreter (conftest turns it on): a whole step per test must be fast."""
    with flags.TRITON_INTERPRET.override(False):
        yield


@dataclass
class _Meta:
    config: tuple | None = None
    tile_scheduler_metadata: Any = None


class FakeFlashMLA:
    """CPU test double of sgl-flash-mla 1.0.0's decode entry with the real wheel's contract: ``get_mla_metadata()``
    returns an empty schedule filled by its first call; a reused schedule must see the same shapes and lengths; only
    the sparse fp8 legacy path, 64 or 128 heads, head_dim_v 512. Computes the fp32 reference."""

    __version__ = "1.0.0+cpu-test-double"

    def __init__(self, fail: str = "") -> None:
        self.schedules = 0  # schedules computed (first call on an empty FlashMLASchedMeta)
        self.calls = 0
        self.fail = fail  # "capture": computing a schedule while `capturing` raises (as a CUDA capture may); "always"
        self.capturing = False

    def get_mla_metadata(self, *args: Any, **kwargs: Any) -> tuple[_Meta, None]:
        return _Meta(), None

    def flash_mla_with_kvcache(self, q, k_cache, block_table, cache_seqlens, head_dim_v, tile_scheduler_metadata,
                               softmax_scale=None, is_fp8_kvcache=None, indices=None, attn_sink=None,
                               extra_k_cache=None, extra_indices_in_kvcache=None, topk_length=None,
                               extra_topk_length=None, use_legacy=False):  # fmt: skip
        assert use_legacy and is_fp8_kvcache and indices is not None and head_dim_v == 512
        assert q.shape[2] in (64, 128), "FlashMLA takes 64 or 128 query heads"
        geometry = tuple(None if t is None else tuple(t.shape) for t in (q, k_cache, indices, extra_k_cache,
                                                                          extra_indices_in_kvcache))  # fmt: skip
        lengths = tuple(None if t is None else tuple(t.tolist()) for t in (topk_length, extra_topk_length))
        meta = tile_scheduler_metadata
        if self.fail == "always":
            raise RuntimeError("no kernel image is available for execution on the device")
        if meta.config is None:
            if self.fail == "capture" and self.capturing:
                raise RuntimeError("operation not permitted when stream is capturing")
            meta.config, meta.tile_scheduler_metadata = (geometry, lengths), object()
            self.schedules += 1
        assert meta.config == (geometry, lengths), "a FlashMLASchedMeta reused with other shapes or lengths"
        self.calls += 1
        return sparse_decode_reference(
            q=q, k_cache=k_cache, indices=indices, topk_length=topk_length, attn_sink=attn_sink, head_dim_v=512,
            softmax_scale=softmax_scale, extra_k_cache=extra_k_cache, extra_indices_in_kvcache=extra_indices_in_kvcache,
            extra_topk_length=extra_topk_length,
        )  # fmt: skip


def test_reference_state_kernels_and_order() -> None:
    assert REF not in kernel_variant.VARIANTS  # a benchmark reference, not a sparsemla flag state
    with pytest.raises(ValueError):
        kernel_variant.parse(REF)
    assert step_model.state_kernels(REF) == (step_model.DECODE_FLASHMLA, True)
    assert step_model.state_kernels(ON) == (step_model.DECODE_SPARSEMLA, True)
    assert step_model.state_kernels("baseline") == (step_model.DECODE_BASELINE, False)
    assert step_model.state_kernels("triton_indexer") == (step_model.DECODE_BASELINE, True)
    with pytest.raises(ValueError):
        step_model.state_kernels("flashmla")
    order = step.variant_order(step_model.VARIANTS, (REF,))
    assert order[:3] == ["baseline", ON, REF] and len(order) == 5
    impl = step.state_impl(REF, "sglang per-head", FakeFlashMLA(), "not installed")
    assert impl["decode"].startswith("flash_mla.flash_mla_with_kvcache (sgl-flash-mla 1.0.0+cpu-test-double")
    assert impl["indexer_logits"] == step.state_impl(ON, "x")["indexer_logits"]  # the same indexer as flags on
    assert impl["top_k"] == step.state_impl(ON, "x")["top_k"]
    assert "DeepGEMM" in impl["stands_in_for"] and "deep_gemm here: not installed" in impl["stands_in_for"]
    assert impl["kind"].startswith("reference") and step.state_impl("baseline", "sglang per-head")["decode"] == (
        "sglang per-head"
    )
    with pytest.raises(ValueError, match="pass fast_decode"):
        step_model.DecodeStep(step_model.TINY, {}, torch.empty(0), torch.empty(0), None, REF, lambda **kw: None)


def test_load_flash_mla_says_why_not(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "flash_mla", None)  # `import flash_mla` raises ImportError
    module, why = decode.load_flash_mla(torch.device("cpu"))
    assert (
        module is None and why.startswith("flash_mla is not importable (ModuleNotFoundError") and "sgl-flash-mla" in why
    )
    fake = SimpleNamespace(__version__="1.0.0")
    monkeypatch.setitem(sys.modules, "flash_mla", fake)
    module, why = decode.load_flash_mla(torch.device("cpu"))
    assert module is None and "need a CUDA GPU" in why and "on cpu" in why


def _tiny_step(inp, variant: str, fast: Any = None) -> step_model.DecodeStep:
    shape = step_model.TINY
    layers, lm_head, norm = step_model.make_weights(shape, torch.device("cpu"), torch.Generator().manual_seed(3))
    return step_model.DecodeStep(shape, layers, lm_head, norm, inp, variant, sparse_decode_reference, fast)


@pytest.mark.parametrize("per_step", [True, False])
def test_flashmla_decode_schedules_once_per_layer_type(per_step: bool) -> None:
    """One FlashMLASchedMeta per layer type (ratios 0, 4, 128): filled by the first layer of its type and reused by
    the others; emptied at every step when per_step (sglang's captured step), else kept from the first step on. The
    reference state computes the same tokens as flags on."""
    inp = step_model.make_inputs(step_model.TINY, 2, 2048, 16384, torch.device("cpu"), torch.Generator().manual_seed(5))
    fake = FakeFlashMLA()
    fast = decode.FlashMLADecode(fake, per_step=per_step)
    ref_step = _tiny_step(inp, REF, fast)
    tokens = ref_step()
    ref_step()
    layer_types = len(set(step_model.TINY.compress_ratios))
    assert layer_types == 3 and fake.calls == 2 * step_model.TINY.num_layers
    assert fake.schedules == (2 * layer_types if per_step else layer_types)
    assert torch.equal(tokens, _tiny_step(inp, ON)())


def test_flashmla_decode_pads_heads_and_trims_the_output() -> None:
    """Fewer than 64 heads are padded to 64 (sink -inf on the pad heads) as sglang does on SM90; the output and lse
    come back with the real heads only and equal the reference's."""
    gen = torch.Generator().manual_seed(2)
    inp = step_model.make_inputs(step_model.TINY, 2, 2048, 16384, torch.device("cpu"), gen)
    c = inp.caches[4]
    extra_idx = torch.randint(0, c.extra.shape[0] * c.extra.shape[1], (2, 1, 512), generator=gen, dtype=torch.int32)
    kw = dict(q=torch.randn(2, 1, 16, 512, generator=gen).to(torch.bfloat16), k_cache=c.swa, indices=inp.swa_idx,
              topk_length=inp.swa_len, attn_sink=torch.randn(16, generator=gen), head_dim_v=512,
              softmax_scale=512**-0.5, extra_k_cache=c.extra, extra_indices_in_kvcache=extra_idx,
              extra_topk_length=inp.c4_topk_len)  # fmt: skip
    out, lse = decode.FlashMLADecode(FakeFlashMLA())(**kw)
    want_out, want_lse = sparse_decode_reference(**kw)
    assert out.shape == want_out.shape and lse.shape == want_lse.shape
    assert torch.allclose(out.float(), want_out.float(), atol=1e-2) and torch.allclose(lse, want_lse, atol=1e-4)
    with pytest.raises(ValueError, match="head_dim_v = 512"):
        decode.FlashMLADecode(FakeFlashMLA())(**{**kw, "head_dim_v": 448})


def test_tiny_run_with_the_fast_path_state(tmp_path: Path) -> None:
    """A CPU run with FlashMLA's test double: the reference is timed right after the two compared states, has its
    rows, its speed-up over it comes from those rows, the JSON says exactly which kernels it ran, and the consistency
    check compares its decode with ours."""
    from sparsemla.kernels import sparse_decode

    fake = FakeFlashMLA()
    lines: list[str] = []
    doc = step.run_bench(
        shape=step_model.TINY, device=torch.device("cpu"), batches=(1, 2), contexts=(2048,), cap=16384,
        variants=("baseline", ON), out_path=tmp_path / "s.json", trace_dir=None, baseline_decode=sparse_decode,
        baseline_label="reference", references=(REF,), flash_mla=fake, deep_gemm="not installed", target_s=0.0,
        min_reps=1, max_reps=1, log=lines.append,
    )  # fmt: skip
    assert doc["errors"] == [] and json.loads((tmp_path / "s.json").read_text()) == json.loads(json.dumps(doc))
    assert [line.split()[0] for line in lines[:3]] == ["baseline", ON, REF]
    cell = {(r["provider"], r["B"]): r["us"] for r in doc["rows"]}
    assert {p for p, _ in cell} == {"baseline", "sparsemla", REF}
    for b in (1, 2):
        assert doc["speedup_vs_reference"][REF]["2048"][str(b)] == pytest.approx(
            cell[(REF, b)] / cell[("sparsemla", b)]
        )
    assert set(doc["marginal_us"]) == {"baseline", ON, REF}
    ref = doc["references"][REF]
    assert (
        ref["measured"] is True and ref["flash_mla"] == FakeFlashMLA.__version__ and "every step" in ref["sched_meta"]
    )
    states = doc["impl"]["states"]
    assert set(states) == {"baseline", ON, REF}
    assert (
        states[REF]["decode"].startswith("flash_mla.flash_mla_with_kvcache")
        and "DeepGEMM" in states[REF]["stands_in_for"]
    )
    assert doc["checks"]["flashmla_rel_err_c4"] < 1e-6 and doc["checks"]["flashmla_rel_err_c128"] < 1e-6
    assert "flashmla_error" not in doc["checks"]
    step.print_summary(doc, lines.append)
    assert f"{REF} ms, on vs it" in lines[-3]


@pytest.mark.parametrize("fail", ["capture", "always"])
def test_fast_path_whose_per_step_schedule_fails(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fail: str) -> None:
    """prepare() as on a GPU (a warm-up, then the captured step): where FlashMLA cannot compute its schedule inside
    the captured step, the state falls back to one schedule per point and says so; where FlashMLA fails either way,
    the point's error is FlashMLA's first one and the rest of the run stands."""
    from sparsemla.kernels import sparse_decode

    fake = FakeFlashMLA(fail)

    def gpu_like_prepare(s: Any, device: torch.device) -> step_run.Prepared:
        fake.capturing = False
        s()  # the eager warm-up
        fake.capturing = True
        try:
            s()  # the capture
        finally:
            fake.capturing = False
        return step_run.Prepared(run=s)

    monkeypatch.setattr(step, "prepare", gpu_like_prepare)
    doc = step.run_bench(
        shape=step_model.TINY, device=torch.device("cpu"), batches=(1,), contexts=(2048,), cap=16384,
        variants=(ON,), out_path=tmp_path / "s.json", trace_dir=None, baseline_decode=sparse_decode,
        baseline_label="reference", references=(REF,), flash_mla=fake, target_s=0.0, min_reps=1,
        max_reps=2, log=lambda _: None,
    )  # fmt: skip
    states = {r["variant"] for r in doc["variant_rows"]}
    note = doc["references"][REF]["sched_meta"]
    if fail == "capture":
        assert states == {ON, REF} and doc["errors"] == []
        assert note.startswith("one FlashMLASchedMeta per layer type, computed once per point in the eager warm-up")
        assert "operation not permitted when stream is capturing" in note
    else:
        assert states == {ON} and "every step" in note
        assert [e["variant"] for e in doc["errors"]] == [REF] and "no kernel image" in doc["errors"][0]["error"]


def test_cli_tiny_run_records_why_the_fast_path_is_missing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Where FlashMLA does not load (this CPU), the requested reference is not measured, the JSON says why, the run
    goes on, and the report says so."""
    monkeypatch.setitem(sys.modules, "flash_mla", None)
    args = ["--tiny", "--batches", "1", "--contexts", "2048", "--cap", "16384", "--variants", ON,
            "--out-dir", str(tmp_path), "--git-sha", "abc"]  # fmt: skip
    result = CliRunner().invoke(step.app, args)
    assert result.exit_code == 0, result.output
    (path,) = tmp_path.glob("step-cpu-*.json")
    doc = json.loads(path.read_text())
    ref = doc["references"][REF]
    assert ref["measured"] is False and ref["reason"].startswith("flash_mla is not importable")
    assert {r["variant"] for r in doc["variant_rows"]} == {ON} and doc["speedup_vs_reference"] == {}
    assert REF not in doc["impl"]["states"] and f"{REF}: not measured: flash_mla is not importable" in result.output
    text = step_report.step_section(doc)
    assert f"sglang's fast decode (`{REF}`): not measured in this run: flash_mla is not importable" in text
    bad = CliRunner().invoke(step.app, [*args, "--references", "deepgemm"])
    assert bad.exit_code != 0 and "unknown reference state" in bad.output


def _with_reference(doc: dict, factor_b64: float, factor: float = 1.3) -> dict:
    """The committed H200 result plus a synthetic reference state: its step = flags-on step x factor (x factor_b64 at
    B = 64), its kernel shares the flags-on ones (test data, not a measurement)."""
    out = copy.deepcopy(doc)
    for r in doc["variant_rows"]:
        if r["variant"] == ON:
            us = r["us"] * (factor_b64 if r["B"] == 64 else factor)
            out["variant_rows"].append({**r, "variant": REF, "us": us, "tok_s": r["B"] / (us * 1e-6)})
    out["kernel_share"][REF] = copy.deepcopy(doc["kernel_share"][ON])
    out["references"] = {REF: {"description": step_model.REFERENCES[REF], "measured": True, "flash_mla": "1.0.0",
                               "sched_meta": "per step (test)"}}  # fmt: skip
    out["impl"]["states"] = {REF: step.state_impl(REF, doc["impl"]["baseline_decode"], FakeFlashMLA(), "not installed")}
    out["speedup_vs_reference"] = step.speedup_vs_references(out["variant_rows"])
    return out


@pytest.mark.parametrize("factor_b64", [1.25, 1.05])
def test_report_compares_with_the_fast_path_from_the_rows(factor_b64: float) -> None:
    doc = _with_reference(json.loads(H200.read_text()), factor_b64)
    doc["speedup_vs_reference"] = {REF: {"4096": {"64": 99.0}}}  # the report must not read the stored ratios
    text = step_report.step_section(doc)
    assert "flags off vs on vs sglang's fast decode" in text
    assert f"| `{REF}` ms |" in text and f"on vs `{REF}` |" in text
    verdict = "met" if factor_b64 >= 1.1 else "missed"
    assert f"B=64: **{factor_b64:.2f}x** (goal >= 1.1x, {verdict})" in text
    assert "99.00x" not in text
    on = next(r["us"] for r in doc["variant_rows"] if (r["variant"], r["B"], r["ctx"]) == (ON, 64, 4096))
    indexer = doc["kernel_share"][REF]["4096"]["64"]["category_us"]["indexer"]
    assert indexer > 0
    assert f"; {(on * factor_b64 - indexer) / on:.2f}x if the fast path's indexer kernels took no time at all" in text
    assert f"#### sglang's fast decode (`{REF}`), B = 64, 4k context" in text
    assert "DeepGEMM's fp8_paged_mqa_logits" in text and "FlashMLA's split schedule: per step (test)" in text
    # flags on vs fallback is unchanged
    assert "B=64: **54.6x** (target >= 20x, met)" in text


def test_report_of_a_result_without_the_state_says_so() -> None:
    text = step_report.step_section(json.loads(H200.read_text()))
    assert "the result predates the reference state" in text and "on vs `" not in text


def test_h200_calibration_is_unchanged_by_the_reference_state(tmp_path: Path) -> None:
    """The H200 calibration regenerated from a step result with a reference state added equals the one without it
    in every state, the model, prefill, GPU and baseline; it differs only in its ``references`` (the reference's step
    times and the flags-on speed-up over them, never a state) and its provenance only in the notes, which gain the
    same in a sentence, and the source's sha256. The committed default.json is the one regenerated from the committed
    result that measured the reference state."""
    plain = json.loads(H200.read_text())
    with_ref = _with_reference(plain, 1.25)
    a_path, b_path = tmp_path / "step-h200-a.json", tmp_path / "step-h200-b.json"
    a_path.write_text(json.dumps(plain))
    b_path.write_text(json.dumps(with_ref))
    a = load_calibration(calibrate(a_path, tmp_path / "a.json"))
    b = load_calibration(calibrate(b_path, tmp_path / "b.json"))
    assert a.states == b.states and REF not in b.states
    for name in ("model", "prefill", "gpu", "baseline", "deployment", "schema_version"):
        assert getattr(a, name) == getattr(b, name)
    assert a.references == {} and set(b.references) == {REF} and b.references[REF].measured
    differ = {f.name for f in fields(a) if getattr(a, f.name) != getattr(b, f.name)}
    assert differ <= {"references", "provenance", "path"}
    for f in fields(a.provenance):
        if f.name not in ("notes", "source", "sources"):
            assert getattr(a.provenance, f.name) == getattr(b.provenance, f.name), f.name
    committed, fresh = load_calibration(DEFAULT_PATH), load_calibration(calibrate(H200_WITH_REF, tmp_path / "c.json"))
    assert committed.states == fresh.states and REF not in committed.states
    for name in ("model", "prefill", "gpu", "baseline", "references"):
        assert getattr(committed, name) == getattr(fresh, name)
    with pytest.raises(CalibrationError, match="no state"):
        committed.state(REF)  # compared with, never served
    assert committed.provenance.notes == fresh.provenance.notes and f"Reference state {REF} (" in fresh.provenance.notes
    assert b.provenance.notes.startswith(a.provenance.notes + " ")
    added = b.provenance.notes[len(a.provenance.notes) + 1 :]
    assert added.startswith(f"Reference state {REF} (") and "not a simulator state" in added
    ref = b.references[REF]
    for r in with_ref["variant_rows"]:
        if r["variant"] == REF:
            on = next(
                x["us"] for x in plain["variant_rows"] if (x["variant"], x["B"], x["ctx"]) == (ON, r["B"], r["ctx"])
            )
            assert f"ctx {r['ctx']} B={r['B']}: {r['us']:.1f} us (it / flags on = {r['us'] / on:.3f}x)" in added
            assert ref.step_us[r["ctx"]][r["B"]] == pytest.approx(r["us"], abs=1e-3)
            assert ref.flags_on_speedup[r["ctx"]][r["B"]] == pytest.approx(r["us"] / on, abs=1e-4)
    # a requested reference that could not run is named with its reason
    missing = copy.deepcopy(plain) | {"references": {REF: {"measured": False, "reason": "flash_mla is not importable"}}}
    args = calibration_args(missing, "x.json")
    assert args["provenance"].notes.endswith(f"Reference state {REF} not measured: flash_mla is not importable.")
    assert args["references"][REF] == ReferenceState(
        "a reference state of the decode-step benchmark", False, reason="flash_mla is not importable"
    )
