"""`sparsemla sim --model deepseek-v3.2`: the V3.2 calibration (from the committed step_v32 benchmark result) loads,
validates, reproduces the measured step times and kernel times, is what its adapter gives, and is served under the
V3.2 name with the flags-on state; unknown models and flags that select no V3.2 state are exit 2."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from sparsemla import flags, variant
from sparsemla.ops.sim import calibrate_from_step, calibrate_from_step_v32, models
from sparsemla.ops.sim.calibrate_from_step import StepResultError
from sparsemla.ops.sim.calibration import DEFAULT_PATH, load_calibration
from sparsemla.ops.sim.testing import run_sim

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "results" / "bench"
CAL_PATH = calibrate_from_step_v32.OUT_PATH
NAME = "deepseek-ai/DeepSeek-V3.2"
FLAGS_ON = {"SPARSEMLA_DSA_V32": "1", "SPARSEMLA_TRITON_INDEXER": "1"}
STATE = "triton_indexer"  # the variant SPARSEMLA_DSA_V32 + SPARSEMLA_TRITON_INDEXER report
SIM = [sys.executable, "-c", "from sparsemla.ops.sim.cli import app; app()"]


def _source() -> Path:
    (source,) = load_calibration(CAL_PATH).provenance.sources
    return BENCH / source.path


def _doc() -> dict:
    return json.loads(_source().read_text())


def _rows(state: str) -> list[dict]:
    return [r for r in _doc()["rows"] if r["state"] == state]


def _point_id(row: dict) -> str:
    return f"B{row['B']}-ctx{row['ctx']}"


def test_calibration_loads_validates_and_says_where_it_comes_from() -> None:
    cal = load_calibration(CAL_PATH)
    doc = _doc()
    assert cal.kind == "measured" and cal.provenance.provisional is False
    assert (cal.model.name, cal.model.num_layers, cal.model.indexer_layers) == (NAME, 61, 61)
    assert cal.model.context_length == doc["cap"] == 163840
    assert set(cal.states) == {STATE} and set(cal.references) == {"flashmla"}
    assert cal.gpu is not None and cal.gpu.key == "h200" and cal.baseline is None
    (source,) = cal.provenance.sources
    assert source.path == _source().name and source.git_sha == doc["git_sha"]
    assert source.sha256 == calibrate_from_step.sha256_of(_source()), f"{source.path} changed: regenerate"
    assert cal.states[STATE].flags == {**variant.parse(STATE).flag_labels(), "sparsemla_dsa_v32": "on"}
    assert "not a V3.2 measurement" in cal.provenance.notes and "No baseline state" in cal.provenance.notes
    assert models.V32.files == {"h200": CAL_PATH}


def test_flags_on_select_the_calibrated_state() -> None:
    with flags.SPARSEMLA_DSA_V32.override(True), flags.SPARSEMLA_TRITON_INDEXER.override(True):
        assert variant.current() == STATE
        assert models.problem(models.V32, load_calibration(CAL_PATH)) is None
    with flags.SPARSEMLA_TRITON_INDEXER.override(True):  # no SPARSEMLA_DSA_V32: no V3.2 path
        assert "select no measured DeepSeek-V3.2 state" in str(models.problem(models.V32, load_calibration(CAL_PATH)))


@pytest.mark.parametrize("row", _rows("sparsemla"), ids=_point_id)
def test_step_time_at_a_measured_point_is_the_benchmarks(row: dict) -> None:
    state = load_calibration(CAL_PATH).state(STATE)
    assert state.step_seconds(row["B"], row["ctx"]) * 1e6 == pytest.approx(row["us"], abs=1e-3)
    share = _doc()["kernel_share"]["sparsemla"][str(row["ctx"])][str(row["B"])]
    by_category: dict[str, float] = {}
    for k in state.kernels:
        by_category[k.category] = by_category.get(k.category, 0.0) + state.kernel_times_us(row["B"], row["ctx"])[k.name]
    for category, us in share["category_us"].items():
        assert by_category.get(category, 0.0) == pytest.approx(us, abs=0.05), category


@pytest.mark.parametrize("row", _rows("flashmla"), ids=_point_id)
def test_reference_holds_the_stock_sglang_step_and_the_speedup(row: dict) -> None:
    ref = load_calibration(CAL_PATH).references["flashmla"]
    assert ref.measured and ref.step_us[row["ctx"]][row["B"]] == pytest.approx(row["us"], abs=1e-3)
    speedup = _doc()["speedup"][str(row["ctx"])][str(row["B"])]
    assert ref.flags_on_speedup[row["ctx"]][row["B"]] == pytest.approx(speedup, abs=1e-4)


def test_committed_calibration_is_what_the_adapter_gives(tmp_path: Path) -> None:
    assert calibrate_from_step_v32.stale(CAL_PATH, BENCH) is None, (
        "run `python -m sparsemla.ops.sim.calibrate_from_step_v32`"
    )
    rebuilt = calibrate_from_step_v32.calibrate(_source(), tmp_path / CAL_PATH.name)
    assert json.loads(rebuilt.read_text()) == json.loads(CAL_PATH.read_text())


def test_stale_check_notices_a_changed_measurement(tmp_path: Path) -> None:
    doc = _doc()
    for row in doc["rows"]:
        if row["state"] == "sparsemla":
            row["us"] *= 1.5
    (tmp_path / _source().name).write_text(json.dumps(doc))
    problem = calibrate_from_step_v32.stale(CAL_PATH, tmp_path)
    assert problem is not None and "differs" in problem and "states" in problem


@pytest.mark.parametrize(
    ("change", "message"),
    [
        pytest.param({"op": "step"}, "expected 'step_v32'", id="v4-step-result"),
        pytest.param({"model": None}, "missing 'model'", id="no-model"),
        pytest.param({"flags": ["SPARSEMLA_TRITON_INDEXER"]}, "not a V3.2 state", id="flags-without-dsa-v32"),
    ],
)
def test_adapter_refuses_a_result_it_cannot_map(change: dict, message: str) -> None:
    doc = _doc()
    if "flags" in change:
        doc["states"]["sparsemla"]["flags"] = change["flags"]
    elif change.get("model", 1) is None:
        del doc["model"]
    else:
        doc.update(change)
    with pytest.raises(StepResultError, match=message):
        calibrate_from_step_v32.calibration_args(doc, "x.json")


def test_v32_server_reports_the_model_state_and_metrics() -> None:
    with run_sim(FLAGS_ON, ("--model", "deepseek-v3.2")) as sim:
        assert httpx.get(f"{sim.url}/health", timeout=10).status_code == 200
        listed = httpx.get(f"{sim.url}/v1/models", timeout=10).json()["data"]
        info = httpx.get(f"{sim.url}/server_info", timeout=10).json()
        done = httpx.post(f"{sim.url}/v1/completions", json={"prompt": "hi", "max_tokens": 2, "ignore_eos": True},
                          timeout=30).json()  # fmt: skip
        metrics = httpx.get(f"{sim.url}/metrics", timeout=10).text
        banner = " ".join(sim.output().split())
    assert [m["id"] for m in listed] == [NAME] and info["model_path"] == info["served_model_name"] == NAME
    assert info["context_length"] == 163840
    sp = info["sparsemla"]
    assert sp["variant"] == STATE and sp["flags"]["sparsemla_dsa_v32"] == "on"
    assert sp["calibration"]["path"] == str(CAL_PATH) and sp["calibration"]["model"]["name"] == NAME
    assert sp["calibration"]["kind"] == "measured" and "flashmla" in sp["calibration"]["references"]
    assert done["model"] == NAME and done["usage"]["completion_tokens"] == 2
    assert f'model_name="{NAME}"' in metrics
    info_line = next(line for line in metrics.splitlines() if line.startswith("sparsemla_kernel_flags_info{"))
    assert f'variant="{STATE}"' in info_line and 'sparsemla_dsa_v32="on"' in info_line
    assert f"sim: {NAME} variant={STATE}" in banner and "vs sglang's fast path (flashmla" in banner


def _refused(args: list[str], env: dict[str, str | None]) -> subprocess.CompletedProcess:
    return subprocess.run([*SIM, *args, "--openapi", "/dev/null"], capture_output=True, text=True, timeout=60,
                          env=flags.child_env(env))  # fmt: skip


@pytest.mark.parametrize(
    ("args", "env", "words"),
    [
        pytest.param(["--model", "deepseek-v5"], FLAGS_ON, "valid choices: deepseek-v4-flash, deepseek-v3.2",
                     id="unknown-model"),
        pytest.param(["--model", "deepseek-v3.2"], {"SPARSEMLA_DSA_V32": None}, "SPARSEMLA_DSA_V32=1",
                     id="v32-flags-off"),
        pytest.param(["--model", "deepseek-v3.2"], {**FLAGS_ON, "SPARSEMLA_MMA_DECODE": "1"},
                     "variant mma_decode+triton_indexer", id="v32-with-v4-decode-flag"),
        pytest.param(["--model", "deepseek-v3.2", "--gpu", "l40s"], FLAGS_ON, "only h200 was measured",
                     id="v32-unmeasured-gpu"),
        pytest.param(["--model", "deepseek-v3.2", "--gpus", "8", "--tp", "8"], FLAGS_ON, "no multi-GPU calibration",
                     id="v32-multi-gpu"),
        pytest.param(["--model", "deepseek-v3.2", "--calibration", str(DEFAULT_PATH)], FLAGS_ON,
                     "describes deepseek-ai/DeepSeek-V4-Flash", id="v32-with-v4-file"),
        pytest.param(["--calibration", str(CAL_PATH)], FLAGS_ON, "--model deepseek-v3.2", id="v4-with-v32-file"),
    ],
)  # fmt: skip
def test_what_cannot_be_honoured_is_exit_2(args: list[str], env: dict, words: str) -> None:
    out = _refused(args, {"SPARSEMLA_SIM_GPU": None, "SPARSEMLA_SIM_CALIBRATION": None, **env})
    assert out.returncode == 2, out.stdout + out.stderr
    assert words in " ".join(out.stderr.split())


def test_default_model_is_unchanged() -> None:
    out = _refused([], {"SPARSEMLA_SIM_GPU": None, "SPARSEMLA_SIM_CALIBRATION": None})
    assert out.returncode == 0, out.stderr
    assert models.DEFAULT == "deepseek-v4-flash" and models.get(models.DEFAULT).name == "deepseek-ai/DeepSeek-V4-Flash"


def test_reports_name_the_v32_flags_on_state_in_the_fast_path_sentence() -> None:
    from sparsemla.loadtest.calibration_label import fast_path_text

    text = fast_path_text(load_calibration(CAL_PATH).summary())
    assert f"flags on (`{STATE}`)" in text and "mma_decode" not in text, text
    assert "goal >= 1.1x at B=64: missed" in text, text  # 0.93x at B=64 in the committed step_v32 result
    assert "flags on (`mma_decode+triton_indexer`)" in fast_path_text(load_calibration(DEFAULT_PATH).summary())
