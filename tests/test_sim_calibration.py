"""Calibration schema: loading, validation errors, write/read round trip, interpolation, flag -> state."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from sparsemla import flags, variant
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
