"""`sparsemla sim --gpu` / SPARSEMLA_SIM_GPU: the simulator runs that GPU's calibration and says in /server_info,
/get_model_info and its start-up line whether it is measured or PROJECTED, what "flags off" is there, and flags on vs
sglang's fast path (the calibration's reference state, never served) or why there is none."""

from __future__ import annotations

import json
import subprocess
import sys

import httpx
import pytest

from sparsemla import flags
from sparsemla.ops.sim import gpus
from sparsemla.ops.sim.calibration import GPU_FILES, PROVISIONAL_PATH, load_calibration
from sparsemla.ops.sim.testing import run_sim

pytestmark = pytest.mark.slow
REF = "flashmla_decode+triton_indexer"  # the decode-step benchmark's reference state: sglang's fast decode on Hopper


@pytest.mark.parametrize("gpu", flags.SIM_GPUS)
def test_server_info_carries_measured_or_projected(gpu: str) -> None:
    with run_sim(args=("--gpu", gpu)) as sim:
        info = httpx.get(f"{sim.url}/server_info", timeout=10).json()["sparsemla"]["calibration"]
        model_info = httpx.get(f"{sim.url}/get_model_info", timeout=10).json()["sparsemla"]["calibration"]
        banner = " ".join(sim.output().split())
    assert info == model_info
    assert info["kind"] == ("measured" if gpu == "h200" else "projected")
    assert info["path"] == str(GPU_FILES[gpu]) and info["gpu"]["key"] == gpu
    assert info["baseline"]["label"] == gpus.BASELINES[gpu].label and info["baseline"]["models_default"] is False
    assert info["provenance"]["kind"] == info["kind"] and info["provenance"]["sources"]
    assert ("PROJECTED" in info["label"]) is (gpu != "h200")
    assert ("PROJECTED" in banner) is (
        gpu != "h200"
    ) and f"flags off on this GPU = {info['baseline']['label']}" in banner
    # sglang's fast path: listed, never served; measured on the H200 only, the projected files say why not
    cal = load_calibration(GPU_FILES[gpu])
    assert info["references"] == json.loads(json.dumps(cal.summary()["references"]))
    assert set(info["references"]) == {REF} and REF not in info["states"] and info["flags_on_speedup_over_baseline"]
    ref = info["references"][REF]
    if gpu == "h200":
        x = cal.references[REF].flags_on_speedup[4096][64]
        assert ref["measured"] is True and ref["flags_on_speedup"]["4096"]["64"] == round(x, 4)
        assert f"vs sglang's fast path ({REF}, measured in the decode-step benchmark, not served)" in banner
        assert f"its step time / flags on's at B=64: {x:.2f}x (4k context)" in banner
    else:
        assert ref == {"description": ref["description"], "measured": False, "reason": gpus.FAST_PATH_NOT_MEASURED[gpu]}
        assert f"sglang's fast path ({REF}, not served): not measured: {ref['reason']}" in banner


def test_the_variable_selects_the_gpu_and_conflicts_are_refused() -> None:
    with run_sim({"SPARSEMLA_SIM_GPU": "rtx-pro-6000", "SPARSEMLA_SIM_CALIBRATION": None}) as sim:
        info = httpx.get(f"{sim.url}/server_info", timeout=10).json()["sparsemla"]["calibration"]
    assert info["gpu"]["key"] == "rtx-pro-6000" and info["kind"] == "projected"
    argv = [sys.executable, "-c", "from sparsemla.ops.sim.cli import app; app()"]
    both = subprocess.run([*argv, "--gpu", "l40s", "--calibration", str(PROVISIONAL_PATH)], capture_output=True,
                          text=True, timeout=60, env=flags.child_env({}))  # fmt: skip
    assert both.returncode == 2 and "not both" in both.stderr
    unknown = subprocess.run([*argv, "--gpu", "v100"], capture_output=True, text=True, timeout=60,
                             env=flags.child_env({}))  # fmt: skip
    assert unknown.returncode == 2 and "unknown GPU 'v100'" in " ".join(unknown.stderr.split())
    clash = flags.child_env({"SPARSEMLA_SIM_GPU": "a100", "SPARSEMLA_SIM_CALIBRATION": str(PROVISIONAL_PATH)})
    env_both = subprocess.run([*argv, "--openapi", "/dev/null"], capture_output=True, text=True, timeout=60, env=clash)
    assert env_both.returncode == 2 and "both set" in " ".join(env_both.stderr.split())
