"""Calibration schema: loading, validation errors, write/read round trip, interpolation, flag -> state, and the
reference states (sglang's fast path: measured on the H200 only, compared with and never served)."""

from __future__ import annotations

import dataclasses
import json
import random
from pathlib import Path

import pytest

from sparsemla import flags, variant
from sparsemla.ops.sim import calibrate_from_step, gpus, project
from sparsemla.ops.sim import calibration as cal_mod
from sparsemla.ops.sim.calibration import (
    PROVISIONAL_PATH,
    VARIANTS,
    CalibrationError,
    KernelSpec,
    StateCalibration,
    load_calibration,
    write_calibration,
)
from sparsemla.ops.sim.provisional import provisional_calibration


def test_shipped_provisional_file_is_current_and_labelled() -> None:
    shipped = load_calibration(PROVISIONAL_PATH)
    assert shipped.provenance.provisional
    assert "h200-baselines" in shipped.provenance.notes
    assert set(shipped.states) == set(VARIANTS)
    rebuilt = json.loads(json.dumps(provisional_calibration().to_dict()))
    assert json.loads(PROVISIONAL_PATH.read_text()) == rebuilt, "run `python -m sparsemla.ops.sim.provisional`"


def test_provisional_orders_states_like_the_kernels() -> None:
    cal = load_calibration(PROVISIONAL_PATH)
    for batch in (1, 16, 64, 200):
        base = cal.state("baseline").step_seconds(batch, 8192)
        both = cal.state("mma_decode+triton_indexer").step_seconds(batch, 8192)
        assert both < cal.state("mma_decode").step_seconds(batch, 8192) < base
        assert both < cal.state("triton_indexer").step_seconds(batch, 8192) < base


def test_kernel_categories_match_the_shared_trace_parser() -> None:
    traces = pytest.importorskip("sparsemla.traces")
    cal = load_calibration(PROVISIONAL_PATH)
    for state in cal.states.values():
        for k in state.kernels:
            assert traces.classify(k.name) == k.category, k.name


def _random_state(rng: random.Random, variant: str) -> StateCalibration:
    batch = tuple(sorted(rng.sample(range(1, 300), 4)))
    context = tuple(sorted(rng.sample(range(256, 100_000), 3)))
    kernels = (KernelSpec("_sparse_decode_kernel", "attention", 43), KernelSpec("fused_moe_kernel", "gemm", 86))
    kernel_us = {k.name: tuple(tuple(rng.uniform(1, 500) for _ in context) for _ in batch) for k in kernels}
    step = tuple(
        tuple(sum(kernel_us[k.name][i][j] for k in kernels) * rng.uniform(1.0, 1.2) for j in range(len(context)))
        for i in range(len(batch))
    )
    return StateCalibration(variant, {"sparsemla_mma_decode": "on"}, batch, context, step, kernels, kernel_us)


def test_write_then_load_round_trip_and_interpolation(tmp_path: Path) -> None:
    rng = random.Random(7)
    base = provisional_calibration()
    states = {v: _random_state(rng, v) for v in VARIANTS}
    path = write_calibration(tmp_path / "c.json", model=base.model, prefill=base.prefill,
                             provenance=base.provenance, states=states)  # fmt: skip
    loaded = load_calibration(path)
    st, src = loaded.state("mma_decode"), states["mma_decode"]
    for i, b in enumerate(src.batch):
        for j, c in enumerate(src.context):
            assert st.step_seconds(b, c) == pytest.approx(src.step_us[i][j] * 1e-6, abs=1e-9)
    # midpoints interpolate linearly in B (context on a grid point)
    b0, b1 = src.batch[0], src.batch[1]
    mid = st.step_seconds((b0 + b1) / 2, src.context[0])
    assert mid == pytest.approx((src.step_us[0][0] + src.step_us[1][0]) / 2 * 1e-6, abs=1e-9)
    # context outside the grid clamps; shares sum to one
    assert st.step_seconds(b0, 1) == pytest.approx(st.step_seconds(b0, src.context[0]))
    assert sum(s for _, s in st.kernel_shares(b1, src.context[1]).values()) == pytest.approx(1.0)


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda d: d.update(schema_version=99), "schema_version"),
        (lambda d: d["model"].pop("num_layers"), "$.model.num_layers: missing"),
        (lambda d: d["states"]["baseline"]["step_us"][0].pop(), "step_us[0]"),
        (lambda d: d["states"]["baseline"]["batch"].reverse(), "strictly increasing"),
        (lambda d: d["states"]["baseline"]["kernels"][0].update(category="magic"), "category"),
        (lambda d: d["states"].update(turbo=d["states"]["baseline"]), "unknown state"),
        (lambda d: d["provenance"].update(provisional="yes"), "provisional"),
        (lambda d: d["states"]["baseline"]["step_us"][0].__setitem__(0, 1e-3), "more than step_us"),
    ],
)
def test_bad_files_are_rejected_with_the_field(tmp_path: Path, mutate, message: str) -> None:
    doc = json.loads(PROVISIONAL_PATH.read_text())
    mutate(doc)
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(doc))
    with pytest.raises(CalibrationError, match=message.replace("$", r"\$").replace("[", r"\[")):
        load_calibration(path)


def test_missing_and_malformed_files(tmp_path: Path) -> None:
    with pytest.raises(CalibrationError, match="cannot read"):
        load_calibration(tmp_path / "none.json")
    (tmp_path / "x.json").write_text("{not json")
    with pytest.raises(CalibrationError, match="not valid JSON"):
        load_calibration(tmp_path / "x.json")


def test_flag_overrides_path_and_variant(tmp_path: Path) -> None:
    target = tmp_path / "mine.json"
    target.write_text(PROVISIONAL_PATH.read_text())
    with flags.SPARSEMLA_SIM_CALIBRATION.override(str(target)):
        assert cal_mod.resolve_path() == target
    with flags.SPARSEMLA_MMA_DECODE.override(True):
        assert variant.current() == "mma_decode"
        assert load_calibration(target).state(variant.current()).variant == "mma_decode"
    with pytest.raises(CalibrationError, match="no state"):
        load_calibration(target).state("mma_decode+reference")


# -- one calibration per GPU: measured / projected, provenance, baseline -----------------------------------------------

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "results" / "bench"


def _inputs() -> project.Inputs:
    return project.Inputs.default(results_dir=BENCH)


def test_the_selectable_gpus_are_one_list() -> None:
    assert flags.SIM_GPUS == tuple(cal_mod.GPU_FILES) == tuple(gpus.GPUS) == tuple(gpus.BASELINES)
    assert project.PROJECTABLE == tuple(g for g in flags.SIM_GPUS if g != "h200")


@pytest.mark.parametrize("gpu", flags.SIM_GPUS)
def test_each_gpu_file_says_measured_or_projected_and_what_flags_off_is(gpu: str) -> None:
    cal = load_calibration(gpu=gpu)
    assert cal.path == cal_mod.GPU_FILES[gpu]
    assert cal.gpu == gpus.GPUS[gpu] and cal.baseline == gpus.BASELINES[gpu]
    assert cal.kind == ("measured" if gpu == "h200" else "projected")
    assert cal.provenance.provisional is (gpu != "h200")
    assert ("PROJECTED" in cal.label()) is (gpu != "h200") and cal.baseline.label in cal.label()
    # no file claims to model stock sglang's default path: none was measured
    assert cal.baseline.models_default is False and "not" in cal.baseline.note
    assert set(cal.states) == set(VARIANTS)
    assert {n: s.description for n, s in cal.states.items()} == gpus.state_descriptions(gpu)
    summary = cal.summary()
    assert summary["kind"] == cal.kind and summary["gpu"]["key"] == gpu and summary["baseline"]["label"]
    assert cal.provenance.method and cal.provenance.sources
    for source in cal.provenance.sources:  # every source names a committed file, its sha256 and the sha it measured
        path = ROOT / source.path if "/" in source.path else BENCH / source.path
        assert path.is_file(), source
        assert source.sha256 == calibrate_from_step.sha256_of(path), f"{source.path} changed: regenerate"
        assert source.git_sha not in ("", "n/a"), source


@pytest.mark.parametrize("gpu", project.PROJECTABLE)
def test_projected_file_is_what_the_committed_measurements_give(gpu: str) -> None:
    assert project.stale(gpu, _inputs()) is None, "run `sparsemla calibrate --project all`"
    cal = load_calibration(gpu=gpu)
    assert "sm_89-path / wgmma ratio" in cal.provenance.method and "Not modelled" in cal.provenance.notes
    if gpu == "a100":
        assert "bf16 variant" in cal.baseline.note and "never measured" in cal.baseline.note
    if gpu == "rtx-pro-6000":
        assert "FlashInfer SM120" in cal.baseline.sglang_default and "SGLANG_SM120_FLASHMLA_BACKEND=triton" in (
            cal.baseline.label
        )


def test_measured_h200_file_is_what_its_step_result_gives(tmp_path: Path) -> None:
    cal = load_calibration(gpu="h200")
    (source,) = cal.provenance.sources
    rebuilt = calibrate_from_step.calibrate(BENCH / source.path, tmp_path / "default.json")
    assert json.loads(rebuilt.read_text()) == json.loads(cal_mod.DEFAULT_PATH.read_text()), (
        "run `python -m sparsemla.ops.sim.calibrate_from_step`"
    )


def test_stale_check_notices_a_changed_measurement(tmp_path: Path) -> None:
    inputs = _inputs()
    doc = json.loads(inputs.decode.read_text())
    for row in doc["rows"]:
        if row["provider"] == "sparsemla_sm89path_graph":
            row["us"] *= 1.5
    changed = tmp_path / inputs.decode.name
    changed.write_text(json.dumps(doc))
    assert "differs" in project.stale("l40s", dataclasses.replace(inputs, decode=changed))


def test_projection_follows_its_stated_method() -> None:
    measured, cal = load_calibration(gpu="h200"), project.project_calibration("rtx-pro-6000", _inputs())
    f = project.Factors.of("rtx-pro-6000")
    assert f.bandwidth == pytest.approx(4.8 / 1.79) and f.sms == pytest.approx(132 / 188)
    paths = project.CodePaths.from_docs(json.loads(_inputs().decode.read_text()),
                                        json.loads(_inputs().indexer.read_text()))  # fmt: skip
    assert paths.decode[1] == pytest.approx(14.496 / 14.88) and paths.decode[64] == pytest.approx(73.568 / 46.464)
    both_h, both_p = measured.state("mma_decode+triton_indexer"), cal.state("mma_decode+triton_indexer")
    b, j = both_h.batch.index(64), 0
    gemm = "nvjet_sm90_tst_512x16_64x3_2x1_v_bz_TNT"  # weight streaming: x bandwidth
    assert both_p.kernel_us[gemm][b][j] == pytest.approx(both_h.kernel_us[gemm][b][j] * f.bandwidth, rel=1e-6)
    ours = both_h.kernel_us[project.OUR_DECODE][b][j] * paths.decode_ratio(64)  # more SMs do not help ours
    assert both_p.kernel_us[project.OUR_DECODE][b][j] == pytest.approx(ours, rel=1e-6)
    base_h, base_p = measured.state("baseline"), cal.state("baseline")  # sglang's per-head decode: x sm
    sglang = base_h.kernel_us[project.SGLANG_DECODE][b][j] * f.sms
    assert base_p.kernel_us[project.SGLANG_DECODE][b][j] == pytest.approx(sglang, rel=1e-6)
    gap = both_h.step_us[b][j] - sum(g[b][j] for g in both_h.kernel_us.values())
    assert both_p.step_us[b][j] == pytest.approx(sum(g[b][j] for g in both_p.kernel_us.values()) + gap, rel=1e-6)


def test_projection_floors_kernels_at_their_bytes_over_bandwidth() -> None:
    cal = project.project_calibration("l40s", _inputs())
    state = cal.state("mma_decode+triton_indexer")
    shape = project.StepShape(tuple(json.loads(_inputs().step.read_text())["model"]["compress_ratios"]))
    for i, b in enumerate(state.batch):
        for j, c in enumerate(state.context):
            floor = shape.logits_bytes(b, c) / 0.86e12 * 1e6
            assert state.kernel_us[project.OUR_LOGITS][i][j] >= floor * (1 - 1e-6)
    b64, ctx64k = state.batch.index(64), state.context.index(65536)
    big = shape.logits_bytes(64, 65536) / 0.86e12 * 1e6  # 21 layers x 64 x 16384 keys x 132 B: bandwidth-bound here
    assert state.kernel_us[project.OUR_LOGITS][b64][ctx64k] == pytest.approx(big, rel=1e-6)


@pytest.mark.parametrize("gpu", flags.SIM_GPUS)
def test_flags_on_beats_flags_off_on_every_gpu_and_point(gpu: str) -> None:
    cal = load_calibration(gpu=gpu)
    base, both = cal.state("baseline"), cal.state("mma_decode+triton_indexer")
    for b in (1, 16, 64):
        for c in (4096, 65536):
            assert both.step_seconds(b, c) < base.step_seconds(b, c) / 2


def test_h200_cannot_be_projected_and_unknown_gpus_are_refused() -> None:
    with pytest.raises(project.ProjectionError, match="h200 is measured"):
        project.project_calibration("h200")
    with pytest.raises(CalibrationError, match="unknown GPU 'v100'"):
        load_calibration(gpu="v100")


def test_gpu_selection_and_conflicts(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    target = tmp_path / "mine.json"
    target.write_text(PROVISIONAL_PATH.read_text())
    with flags.SPARSEMLA_SIM_GPU.override("l40s"):
        assert cal_mod.resolve_path() == cal_mod.GPU_FILES["l40s"]
        assert cal_mod.resolve_path(gpu="a100") == cal_mod.GPU_FILES["a100"]  # the command line beats the variable
        assert cal_mod.resolve_path(target) == target
        with flags.SPARSEMLA_SIM_CALIBRATION.override(str(target)), pytest.raises(CalibrationError, match="both"):
            cal_mod.resolve_path()
    with pytest.raises(CalibrationError, match="not both"):
        cal_mod.resolve_path(target, gpu="l40s")
    monkeypatch.setenv("SPARSEMLA_SIM_GPU", "h100")
    with pytest.raises(flags.FlagError, match="SPARSEMLA_SIM_GPU='h100' is not valid.*a100"):
        load_calibration()


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda d: d["provenance"].update(kind="guessed"), "kind"),
        (lambda d: d["provenance"].update(provisional=False), "contradicts kind 'projected'"),
        (lambda d: d["provenance"].update(method=""), "method and list its sources"),
        (lambda d: d["provenance"].update(sources=[]), "method and list its sources"),
        (lambda d: d.pop("baseline"), r"\$.baseline: missing"),
        (lambda d: d.pop("gpu"), r"\$.gpu: missing"),
        (lambda d: d["gpu"].update(sms=0), "sms"),
        (lambda d: d["baseline"].update(models_default="no"), "models_default"),
        (lambda d: d["provenance"]["sources"][0].pop("sha256"), "sha256: missing"),
    ],
)
def test_projected_files_must_say_how_and_what(tmp_path: Path, mutate, message: str) -> None:
    doc = json.loads(cal_mod.GPU_FILES["rtx-pro-6000"].read_text())
    mutate(doc)
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(doc))
    with pytest.raises(CalibrationError, match=message):
        load_calibration(path)


def test_older_files_without_the_new_blocks_still_load(tmp_path: Path) -> None:
    doc = json.loads(cal_mod.DEFAULT_PATH.read_text())
    for key in ("gpu", "baseline", "references"):
        doc.pop(key)
    for key in ("kind", "method", "sources"):
        doc["provenance"].pop(key)
    path = tmp_path / "old.json"
    path.write_text(json.dumps(doc))
    cal = load_calibration(path)
    assert cal.kind == "measured" and cal.gpu is None and cal.baseline is None and cal.references == {}
    assert cal.summary()["references"] == {} and "references" not in cal.to_dict()
    assert load_calibration(PROVISIONAL_PATH).kind == "derived"


def test_calibrate_check_command_passes_on_the_committed_files() -> None:
    from typer.testing import CliRunner

    from sparsemla.cli import app

    result = CliRunner().invoke(app, ["calibrate", "--check"])
    assert result.exit_code == 0, result.output
    assert "current: rtx-pro-6000, l40s, a100" in result.output
    refused = CliRunner().invoke(app, ["calibrate", "--project", "h200"])
    assert refused.exit_code == 2


# -- reference states: sglang's fast path, compared with, never served ------------------------------------------------

REF = "flashmla_decode+triton_indexer"


def _step_doc() -> dict:
    (source,) = load_calibration(gpu="h200").provenance.sources
    return json.loads((BENCH / source.path).read_text())


def test_h200_file_carries_the_measured_reference_from_its_step_rows() -> None:
    """default.json's ``references`` hold the reference state's step time at every point the step result measured
    it, and its step time / flags on's there (the rows' medians, as the step report and ``speedup_vs_reference``)."""
    doc, cal = _step_doc(), load_calibration(gpu="h200")
    rows = {(r["variant"], r["ctx"], r["B"]): r["us"] for r in doc["variant_rows"]}
    ref_points = {(c, b) for v, c, b in rows if v == REF}
    assert ref_points and REF not in cal.states and REF not in VARIANTS
    with pytest.raises(CalibrationError, match="no state"):
        cal.state(REF)
    ref = cal.references[REF]
    assert ref.measured and ref.reason == "" and ref.description == doc["references"][REF]["description"]
    assert {(c, b) for c, row in ref.step_us.items() for b in row} == ref_points
    assert {(c, b) for c, row in ref.flags_on_speedup.items() for b in row} == ref_points
    for c, b in ref_points:
        assert ref.step_us[c][b] == pytest.approx(rows[(REF, c, b)], abs=1e-3)
        assert ref.flags_on_speedup[c][b] == pytest.approx(rows[(REF, c, b)] / rows[(variant.ALL_ON, c, b)], abs=1e-4)
        assert ref.flags_on_speedup[c][b] == pytest.approx(doc["speedup_vs_reference"][REF][str(c)][str(b)], abs=1e-4)
    assert ref.speedups_at(64) == [(c, ref.flags_on_speedup[c][64]) for c in sorted(ref.flags_on_speedup)]
    base, on = cal.state("baseline"), cal.state(variant.ALL_ON)
    over = cal.summary()["flags_on_speedup_over_baseline"]  # flags on vs sglang's fallback, next to it
    assert over["4096"]["64"] == round(base.step_seconds(64, 4096) / on.step_seconds(64, 4096), 4)
    summary = cal.summary()["references"][REF]  # what /server_info shows
    assert summary["measured"] is True
    assert summary["flags_on_speedup"] == {str(c): {str(b): round(x, 4) for b, x in sorted(row.items())}
                                           for c, row in sorted(ref.flags_on_speedup.items())}  # fmt: skip


@pytest.mark.parametrize("gpu", project.PROJECTABLE)
def test_projected_files_say_why_they_have_no_fast_path(gpu: str) -> None:
    cal, measured = load_calibration(gpu=gpu), load_calibration(gpu="h200")
    assert set(cal.references) == set(measured.references) == {REF}
    ref = cal.references[REF]
    assert not ref.measured and ref.step_us == {} and ref.flags_on_speedup == {}
    assert ref.reason == gpus.FAST_PATH_NOT_MEASURED[gpu] and f"FlashMLA has no {cal.gpu.arch} build" in ref.reason
    assert ("never measured" if gpu == "rtx-pro-6000" else "no fast path") in ref.reason
    summary = cal.summary()["references"][REF]
    assert summary == {"description": ref.description, "measured": False, "reason": ref.reason}


def test_references_round_trip_and_are_validated(tmp_path: Path) -> None:
    cal = load_calibration(gpu="h200")
    out = write_calibration(tmp_path / "c.json", model=cal.model, prefill=cal.prefill, provenance=cal.provenance,
                            states=cal.states, gpu=cal.gpu, baseline=cal.baseline,
                            references=cal.references)  # fmt: skip
    again = load_calibration(out)
    assert again.references == cal.references and again.states == cal.states
    assert json.loads(out.read_text()) == json.loads(cal_mod.DEFAULT_PATH.read_text())
    unmeasured = cal_mod.ReferenceState("x", False, reason="flash_mla is not importable")
    doc = dataclasses.replace(cal, references={REF: unmeasured}).to_dict()
    assert cal_mod.calibration_from_dict(doc).references == {REF: unmeasured}
    with pytest.raises(ValueError, match="says why"):
        cal_mod.ReferenceState("x", False)
    with pytest.raises(ValueError, match="needs its step times"):
        cal_mod.ReferenceState("x", True)


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda d: d["references"].update({"baseline": d["references"][REF]}), "cannot be a flag state"),
        (lambda d: d["references"][REF].update(measured="yes"), "measured: expected true or false"),
        (lambda d: d["references"][REF].pop("description"), "description: missing"),
        (lambda d: d["references"][REF].update(measured=False), "was not measured has no numbers"),
        (lambda d: d["references"][REF].update(step_us={}), "needs its step times"),
        (lambda d: d["references"][REF]["step_us"].update({"4k": {"1": 1.0}}), "keys must be integers"),
        (lambda d: d["references"][REF]["step_us"]["4096"].update({"1": -1.0}), "finite number"),
        (lambda d: d["references"][REF]["step_us"]["4096"].pop("64"), "batch sizes \\[64\\] have no step_us"),
        (lambda d: d["provenance"].update(kind="derived", provisional=True), "derived file cannot carry a measured"),
    ],
)
def test_bad_references_are_rejected_with_the_field(tmp_path: Path, mutate, message: str) -> None:
    doc = json.loads(cal_mod.DEFAULT_PATH.read_text())
    mutate(doc)
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(doc))
    with pytest.raises(CalibrationError, match=message):
        load_calibration(path)


def test_a_projected_reference_needs_its_reason(tmp_path: Path) -> None:
    doc = json.loads(cal_mod.GPU_FILES["l40s"].read_text())
    doc["references"][REF]["reason"] = " "
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(doc))
    with pytest.raises(CalibrationError, match="say why the reference was not measured"):
        load_calibration(path)
    doc["references"][REF] = json.loads(cal_mod.DEFAULT_PATH.read_text())["references"][REF]
    path.write_text(json.dumps(doc))
    with pytest.raises(CalibrationError, match="projected file cannot carry a measured reference"):
        load_calibration(path)
