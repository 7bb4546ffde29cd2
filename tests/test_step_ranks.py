"""The multi-rank decode step on the CPU: 2 gloo processes per deployment through the real launcher, the collectives
sglang 0.5.23 issues, the communication category, the multi-GPU calibration adapter and the simulator's refusal of an
unmeasured 8-GPU server (the GPU run itself: `python -m benchmarks.step --ranks 8`, docs/performance.md)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from benchmarks import step_ranks, step_ranks_model, step_run
from benchmarks.step_model import TINY, V4_FLASH
from sparsemla import traces
from sparsemla.ops.sim import calibrate_ranks
from sparsemla.ops.sim.calibration import CalibrationAbsent, deployment_path, load_calibration

RANKS = 2
GRID = {"batches": "1,2", "contexts": "1024", "cap": 4096}


@pytest.fixture(scope="module", params=["tp", "dp-attention"])
def result(request, tmp_path_factory) -> dict:
    out = tmp_path_factory.mktemp(request.param)
    path = step_ranks.main(ranks=RANKS, deployment=request.param, out_dir=out, trace_dir=out / "t",
                           batches=GRID["batches"], contexts=GRID["contexts"], cap=GRID["cap"], sglang_src=Path("-"),
                           budget_s=300.0, sha="0" * 40, tiny=True, extra_env={"TRITON_INTERPRET": "0"})  # fmt: skip
    assert path.is_file() and path.name.startswith(f"ranks2-{request.param}-step-cpu-")
    return {"path": path, "doc": json.loads(path.read_text())}


def test_the_run_records_ranks_env_topology_and_every_point(result) -> None:
    doc = result["doc"]
    assert doc["op"] == "step_ranks" and doc["ranks"] == RANKS and doc["backend"] == "gloo"
    assert doc["errors"] == [] and doc["skipped"] == []
    for key, value in step_ranks.MULTICAST_OFF.items():
        assert doc["nccl_env"][key] == value
    assert doc["topology"]["nvidia_smi_topo_m"] or doc["topology"]["reason"]
    assert "nccl_version" in doc
    assert {(r["variant"], r["B"]) for r in doc["variant_rows"]} == {
        (v, b) for v in step_ranks.VARIANTS for b in (1, 2)
    }
    for r in doc["variant_rows"]:
        assert len(r["per_rank_us"]) == RANKS and r["us"] >= min(r["per_rank_us"]) > 0
        assert r["B_server"] == r["B"] * (RANKS if doc["deployment"] == "dp-attention" else 1)
        assert r["tok_s"] == pytest.approx(r["B_server"] / (r["us"] * 1e-6))


def test_communication_is_the_collectives_and_sums_with_the_rest(result) -> None:
    doc = result["doc"]
    shape = step_ranks_model.rank_shape(TINY, doc["deployment"], RANKS)
    for variant, by_ctx in doc["kernel_share"].items():
        for b, entry in by_ctx["1024"].items():
            plan = step_ranks_model.collective_plan(shape, doc["deployment"], RANKS, int(b))
            assert entry["collective_calls"] == {c.name: c.per_step for c in plan}, variant
            comm = sum(k["time_us"] for k in entry["kernels"] if k["category"] == "communication")
            assert comm == pytest.approx(entry["category_us"]["communication"]) and comm > 0
            assert sum(entry["category_us"].values()) == pytest.approx(entry["step_us"])
            assert sum(entry["categories"].values()) == pytest.approx(1.0)
            assert entry["categories_sum_within_1pct"] is True
            assert len(entry["per_rank"]) == RANKS and entry["slowest_rank"] in range(RANKS)


def test_the_adapter_turns_the_run_into_a_server_calibration(result, tmp_path: Path) -> None:
    doc = result["doc"]
    with pytest.raises(calibrate_ranks.StepResultError, match="harness test"):
        calibrate_ranks.calibrate(result["path"])  # a gloo run never lands in the shipped files
    cal = load_calibration(calibrate_ranks.calibrate(result["path"], tmp_path / "c.json"))
    dp = doc["deployment"] == "dp-attention"
    assert cal.deployment is not None and cal.deployment.dp_attention is dp and cal.deployment.gpus == RANKS
    assert cal.kind == "measured" and set(cal.states) == set(step_ranks.VARIANTS)
    state = cal.state("baseline")
    assert state.batch == ((RANKS, 2 * RANKS) if dp else (1, 2))
    rows = {r["B"]: r["us"] for r in doc["variant_rows"] if r["variant"] == "baseline"}
    for i, b in enumerate((1, 2)):
        assert state.step_us[i][0] >= rows[b] - 1e-3  # the slowest rank's step (raised to its kernel sum if below)
    cats = {k.category for k in state.kernels}
    assert "communication" in cats
    broken = dict(doc, nccl_env={})
    with pytest.raises(calibrate_ranks.StepResultError, match="NCCL_NVLS_ENABLE"):
        calibrate_ranks.calibration_args(broken, "x.json")


def test_collective_plan_of_the_8_gpu_deployments() -> None:
    tp = step_ranks_model.rank_shape(V4_FLASH, "tp", 8)
    assert (tp.heads, tp.o_groups, tp.moe_inter, tp.local_experts, tp.vocab) == (8, 1, 256, 256, 16160)
    plan = {c.name: c for c in step_ranks_model.collective_plan(tp, "tp", 8, 64)}
    assert plan["attn_all_reduce"].per_step == plan["moe_all_reduce"].per_step == 43
    assert plan["attn_all_reduce"].bytes_per_call == 64 * 4096 * 2
    dp = step_ranks_model.rank_shape(V4_FLASH, "dp-attention", 8)
    assert (dp.heads, dp.local_experts) == (64, 32)
    plan = {c.name: c for c in step_ranks_model.collective_plan(dp, "dp-attention", 8, 64)}
    assert plan["moe_dispatch"].bytes_per_call == 64 * 6 * (4096 + 4 * 32)  # fp8 + per-128 fp32 scales
    assert plan["moe_combine"].bytes_per_call == 64 * 6 * 4096 * 2
    assert "attn_all_reduce" not in plan
    assert step_ranks_model.even_splits(6, 8) == [1, 1, 1, 1, 1, 1, 0, 0]


def test_nccl_kernels_are_communication_in_gpu_shares(tmp_path: Path) -> None:
    import gzip

    names = {"ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevKernelArgsStorage<4096ul>)": 30.0,
             "ncclKernel_AllGather_RING_LL_Sum_int8_t(ncclWorkElem)": 12.0, "nvjet_tst_128x64": 50.0,
             "_sparse_decode_kernel": 8.0}  # fmt: skip
    events = [{"ph": "X", "cat": "kernel", "name": n, "pid": 0, "tid": 7, "ts": i * 100.0, "dur": d}
              for i, (n, d) in enumerate(names.items())]  # fmt: skip
    path = tmp_path / "r0.trace.json.gz"
    with gzip.open(path, "wt") as f:
        json.dump({"traceEvents": events}, f)
    entry = step_run.kernel_share(traces.summarize([path]), step_us=120.0)
    assert entry["category_us"]["communication"] == pytest.approx(42.0)
    assert entry["categories_sum_within_1pct"] is True and entry["total_gpu_us"] == pytest.approx(100.0)


def test_ranks_need_multicast_off_and_more_than_one_rank() -> None:
    env = step_ranks.rank_env(1, 8, 1234, {"NCCL_NVLS_ENABLE": "1"})
    assert env["NCCL_NVLS_ENABLE"] == "0" and env["RANK"] == "1" and env["WORLD_SIZE"] == "8"
    with pytest.raises(step_ranks.MulticastNotOff):
        step_ranks.used_env()  # this (test) process was not started by the launcher
    with pytest.raises(ValueError, match="single-rank step"):
        step_ranks.launch(1, [])


def test_the_simulator_refuses_an_unmeasured_8_gpu_server() -> None:
    from sparsemla.cli import app

    for args in (["--gpus", "8", "--tp", "8"], ["--gpus", "8", "--dp-attention"]):
        try:
            deployment_path("h200", 8, "dp-attention" if "--dp-attention" in args else "tp")
            pytest.skip("an 8-GPU calibration is measured now")
        except CalibrationAbsent:
            pass
        res = CliRunner().invoke(app, ["sim", *args, "--openapi", "/dev/null"])
        assert res.exit_code == 2, res.output
        assert "no 8-GPU calibration is measured" in res.output and "--ranks 8" in res.output
    res = CliRunner().invoke(app, ["sim", "--gpus", "8", "--tp", "4"])
    assert res.exit_code == 2


def test_ranks_1_is_the_single_rank_step(tmp_path: Path, monkeypatch) -> None:
    from benchmarks import step

    def refuse(**_: object) -> Path:
        raise AssertionError("--ranks 1 must not start rank processes")

    monkeypatch.setattr(step_ranks, "main", refuse)
    args = ["--tiny", "--ranks", "1", "--batches", "1", "--contexts", "1024", "--cap", "4096", "--variants",
            "baseline", "--out-dir", str(tmp_path), "--budget-s", "60"]  # fmt: skip
    res = CliRunner().invoke(step.app, args)
    assert res.exit_code == 0, res.output
    (written,) = tmp_path.glob("step-*.json")
    assert json.loads(written.read_text())["op"] == "step"
