"""`sparsemla export --format llm-d`: runs and A/B pairs as llm-d Benchmark Report v0.2.1 documents that validate
against llm-d-benchmark's own JSON Schema (tests/fixtures/llm-d/, with its source) and its units rules."""

from __future__ import annotations

import json
import random
from dataclasses import asdict
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from sparsemla.cli import app
from sparsemla.loadtest import export_llmd
from sparsemla.loadtest.records import RequestRecord
from sparsemla.loadtest.runner import LoadTestConfig
from sparsemla.loadtest.summary import summarize, write_json_atomic
from sparsemla.ops.sim.calibration import load_calibration

jsonschema_rs = pytest.importorskip("jsonschema_rs")  # an ops-tier test dependency (the GPU machine has none)

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "llm-d"
SCHEMA = json.loads((FIXTURES / "br_v0_2_1_json_schema.json").read_text())
VALIDATOR = jsonschema_rs.validator_for(SCHEMA, validate_formats=True)

# llm-d-benchmark's pydantic model checks the units of each Statistics field (schema_v0_2.py check_units and
# schema_v0_2_1.py UNIT_RULES); a JSON Schema cannot say that, so the same rules are checked here.
TIME, GEN_LATENCY, QUANTITY = {"ms", "s"}, {"ms/token", "s/token"}, {"count", "pixels"}
UNIT_RULES = {
    "requests": {"input_length": QUANTITY, "output_length": QUANTITY, "request_size": {"bytes", "MB", "GB"}},
    "latency": {"time_to_first_token": TIME, "normalized_time_per_output_token": GEN_LATENCY,
                "time_per_output_token": GEN_LATENCY, "inter_token_latency": GEN_LATENCY, "request_latency": TIME},
    "throughput": {"input_token_rate": {"tokens/s"}, "output_token_rate": {"tokens/s"},
                   "total_token_rate": {"tokens/s"}, "request_rate": {"queries/s"}},
}  # fmt: skip


def _check(doc: dict[str, Any]) -> None:
    errors = [f"{e.instance_path}: {e.message}" for e in VALIDATOR.iter_errors(doc)]
    assert not errors, errors
    aggregate = doc["results"]["request_performance"]["aggregate"]
    for group, fields in aggregate.items():
        for name, value in fields.items():
            if isinstance(value, dict) and "units" in value:
                assert value["units"] in UNIT_RULES[group][name], (group, name, value["units"])


def _records(rng: random.Random, start: float, stop: float, in_len: int, out_len: int) -> list[RequestRecord]:
    out, t = [], start - 2.0
    while t < stop - 1.0:
        ttft = rng.uniform(0.02, 0.08)
        offsets = [ttft + 0.05 * k for k in range(out_len)]
        out.append(RequestRecord(t, offsets, None, out_len, in_len, offsets[-1] + 0.001))
        t += rng.uniform(0.05, 0.2)
    out.append(RequestRecord(stop - 0.3, [0.1], None, 1, in_len, 0.4, cut=True))
    out.append(RequestRecord(stop - 2.0, [], None, 0, in_len, 0.2, error="http_error", message="HTTP 500"))
    return out


def _server(gpu: str | None, variant: str) -> dict[str, Any]:
    server: dict[str, Any] = {"model_path": "deepseek-ai/DeepSeek-V4-Flash", "context_length": 1048576,
                              "max_running_requests": 256, "max_total_num_tokens": 1048576, "tp_size": 8,
                              "dp_size": 1, "version": "0.5.23"}  # fmt: skip
    if gpu is not None:  # the simulator's /server_info
        cal = load_calibration(gpu=gpu)
        server.update(tp_size=1, version="0.5.23 (sparsemla simulator)")
        server["sparsemla"] = {"variant": variant, "calibration": cal.summary()}
    return server


def make_run(root: Path, run_id: str, *, gpu: str | None, variant: str, points: tuple[int, ...] = (1, 4),
             workload: str = "random:64:24") -> Path:  # fmt: skip
    """A sweep as `sparsemla sweep` lays it out, its summaries made by the real summarize() from synthetic records."""
    run = root / run_id
    on = "on" if variant != "baseline" else "off"
    server_flags = {"sparsemla_mma_decode": on, "sparsemla_triton_indexer": on, "variant": variant, "version": "0.1.0"}
    write_json_atomic(run / "sweep.json", {"run_id": run_id, "concurrency": list(points), "repeat": 1})
    rng = random.Random(run_id)
    for c in points:
        point = run / f"c{c:04d}-r1"
        point.mkdir(parents=True)
        start = 1_790_000_000.0 + 100 * c
        records = _records(rng, start, start + 10.0, 66, 24)
        (point / "requests.jsonl").write_text("".join(json.dumps(r.to_json()) + "\n" for r in records))
        cfg = LoadTestConfig(target="http://127.0.0.1:30000", concurrency=c, duration_s=10.0, workload=workload)
        config = asdict(cfg)
        config.pop("api_key")
        meta = {"run_id": run_id, "target": cfg.target, "api": cfg.api, "workload": workload, "seed": 0,
                "warmup_s": 2.0, "requested_duration_s": 10.0, "config": config,
                "model": "deepseek-ai/DeepSeek-V4-Flash", "variant": variant, "server": _server(gpu, variant),
                "server_flags": server_flags, "git_sha": "0123456789ab", "sweep_point": point.name,
                "repeat": 1}  # fmt: skip
        summary = summarize(records, measure_start=start, stop=start + 10.0, concurrency=c, ttft_slo_s=2.0,
                            tpot_slo_s=0.1, meta=meta)  # fmt: skip
        summary["test_start"] = start - 2.0
        write_json_atomic(point / "summary.json", summary)
    return run


def test_schema_fixture_is_the_upstream_v0_2_1_schema() -> None:
    assert SCHEMA["title"] == "Benchmark Report v0.2.1"
    assert SCHEMA["properties"]["version"]["default"] == export_llmd.VERSION
    readme = (FIXTURES / "README.md").read_text()
    assert "github.com/llm-d/llm-d-benchmark/blob/8bc9f1ddd873a24f1657d6cca2e0d0fb6947dd36/" in readme


def test_schema_and_unit_rules_reject_broken_reports(tmp_path: Path) -> None:
    run = export_llmd.load_run(make_run(tmp_path, "r", gpu="l40s", variant="baseline", points=(2,)))
    doc = export_llmd.point_report(run, run.points[0], eid="e")
    _check(doc)
    for broken in (
        lambda d: d["run"].pop("uid"),
        lambda d: d["run"]["time"].update(start="yesterday"),
        lambda d: d["scenario"]["stack"][0]["standardized"].update(replicas=0),
        lambda d: d["results"]["request_performance"]["aggregate"]["requests"].update(total=-1),
        lambda d: d["results"]["request_performance"].update(surprise=1),
    ):
        bad = json.loads(json.dumps(doc))
        broken(bad)
        assert list(VALIDATOR.iter_errors(bad)), broken
    bad = json.loads(json.dumps(doc))
    bad["results"]["request_performance"]["aggregate"]["latency"]["time_to_first_token"]["units"] = "tokens/s"
    with pytest.raises(AssertionError, match="time_to_first_token"):
        _check(bad)


def test_sweep_exports_one_valid_report_per_point_that_round_trips(tmp_path: Path) -> None:
    run_dir = make_run(tmp_path, "sweep-1", gpu="rtx-pro-6000", variant="mma_decode+triton_indexer")
    written = export_llmd.export_run(export_llmd.load_run(run_dir), tmp_path / "out")
    assert [p.name for p in written] == ["c0001-r1.json", "c0004-r1.json"]
    for path, c in zip(written, (1, 4), strict=True):
        doc = json.loads(path.read_text())
        _check(doc)
        assert json.loads(json.dumps(doc)) == doc  # plain JSON types only: it round-trips as it validated
        summary = json.loads((run_dir / path.stem / "summary.json").read_text())
        agg = doc["results"]["request_performance"]["aggregate"]
        assert doc["version"] == "0.2.1" and doc["scenario"]["load"]["standardized"]["concurrency"] == c
        assert agg["requests"]["total"] == summary["requests"] + summary["failures"]["total"]
        assert agg["requests"]["failures"] == 1 and agg["requests"]["incomplete"] == 1
        assert agg["latency"]["time_to_first_token"]["p99"] == summary["ttft_s"]["p99"]
        assert agg["throughput"]["output_token_rate"]["mean"] == summary["output_tok_per_s"]
        assert agg["requests"]["output_length"]["mean"] == 24 and agg["requests"]["input_length"]["mean"] == 66
        load = doc["scenario"]["load"]["standardized"]
        assert load["input_seq_len"] == {"distribution": "fixed", "value": 64} and load["source"] == "random"
        engine = doc["scenario"]["stack"][0]
        assert engine["native"]["envars"]["SPARSEMLA_MMA_DECODE"] == "on"
        assert engine["standardized"]["accelerator"]["count"] == 0  # simulated: no accelerator
        assert "NVIDIA RTX PRO 6000 Blackwell (simulated, projected" in engine["standardized"]["accelerator"]["model"]
        assert "PROJECTED" in doc["run"]["description"] and "calibration:projected" in doc["run"]["keywords"]
    first, second = (json.loads(p.read_text())["run"] for p in written)
    assert first["eid"] == second["eid"] and first["uid"] != second["uid"]
    again = export_llmd.export_run(export_llmd.load_run(run_dir), tmp_path / "again")
    assert [p.read_text() for p in again] == [p.read_text() for p in written]  # deterministic ids


def test_ab_pair_shares_one_experiment_id(tmp_path: Path) -> None:
    a = export_llmd.load_run(make_run(tmp_path, "x-off", gpu="l40s", variant="baseline"))
    b = export_llmd.load_run(make_run(tmp_path, "x-on", gpu="l40s", variant="mma_decode+triton_indexer"))
    written = export_llmd.export_pair(a, b, tmp_path / "pair")
    assert sorted(p.name for p in written) == ["A-c0001-r1.json", "A-c0004-r1.json", "B-c0001-r1.json",
                                                "B-c0004-r1.json"]  # fmt: skip
    docs = {p.stem: json.loads(p.read_text()) for p in written}
    for name, doc in docs.items():
        _check(doc)
        side = name[0]
        assert side in doc["run"]["keywords"] and f"A/B side {side} of x-off vs x-on" in doc["run"]["description"]
    assert len({d["run"]["eid"] for d in docs.values()}) == 1 and len({d["run"]["uid"] for d in docs.values()}) == 4
    assert docs["A-c0001-r1"]["scenario"]["stack"][0]["native"]["envars"]["SPARSEMLA_MMA_DECODE"] == "off"


def test_single_point_against_real_sglang_and_other_workloads(tmp_path: Path) -> None:
    run_dir = make_run(tmp_path, "sp", gpu=None, variant="baseline", points=(8,), workload="random:100:50:0.5")
    (run_dir / "sweep.json").unlink()  # a `loadtest` run: its one summary.json at the top
    point = run_dir / "c0008-r1"
    for f in point.iterdir():
        f.rename(run_dir / f.name)
    point.rmdir()
    (doc_path,) = export_llmd.export_run(export_llmd.load_run(run_dir), tmp_path / "out")
    doc = json.loads(doc_path.read_text())
    _check(doc)
    assert doc_path.name == "c0008.json"
    accelerator = doc["scenario"]["stack"][0]["standardized"]["accelerator"]
    assert accelerator["count"] == 8 and accelerator["model"].startswith("unknown")
    assert "simulated" not in doc["run"]["keywords"] and "simulated" not in doc["run"]["description"]
    load = doc["scenario"]["load"]["standardized"]
    assert load["input_seq_len"] == {"distribution": "uniform", "value": 75.0, "min": 50, "max": 100}
    share = make_run(tmp_path, "sh", gpu="a100", variant="baseline", points=(2,), workload="sharegpt:/gone.json:64")
    (doc_path,) = export_llmd.export_run(export_llmd.load_run(share), tmp_path / "share")
    doc = json.loads(doc_path.read_text())
    _check(doc)
    load = doc["scenario"]["load"]["standardized"]
    assert load["source"] == "sampled" and load["input_seq_len"] == {"distribution": "other", "value": 66.0}


def test_cli_exports_and_refuses_bad_input(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SPARSEMLA_RESULTS_DIR", str(tmp_path / "results"))
    make_run(tmp_path / "results" / "loadtest", "cli-a", gpu="l40s", variant="baseline")
    make_run(tmp_path / "results" / "loadtest", "cli-b", gpu="l40s", variant="mma_decode")
    runner = CliRunner()
    ok = runner.invoke(app, ["export", "--format", "llm-d", "cli-a"])
    assert ok.exit_code == 0, ok.output
    out = tmp_path / "results" / "export" / "llm-d" / "cli-a"
    assert sorted(p.name for p in out.glob("*.json")) == ["c0001-r1.json", "c0004-r1.json"]
    pair = runner.invoke(app, ["export", "--format", "llm-d", "cli-a", "cli-b", "--out", str(tmp_path / "ab")])
    assert pair.exit_code == 0, pair.output
    for path in (tmp_path / "ab").glob("*.json"):
        _check(json.loads(path.read_text()))
    (tmp_path / "empty").mkdir()
    for argv, message in (
        (["export", "--format", "llm-d", str(tmp_path / "empty")], "not a load-test run"),
        (["export", "--format", "llm-d", "no-such-run"], "not found"),
        (["export", "--format", "llm-d", "../etc"], "neither an existing run directory nor a run id"),
        (["export", "--format", "csv", "cli-a"], "use --format llm-d"),
        (["export", "--format", "llm-d", "cli-a", "cli-b", "cli-a"], "one run, or two"),
    ):
        result = runner.invoke(app, argv)
        assert result.exit_code == 2, (argv, result.output)
        assert message in " ".join(result.output.split()), (argv, result.output)


def test_compare_report_labels_the_calibration(tmp_path: Path) -> None:
    from sparsemla.loadtest import report

    a = report.load_run(make_run(tmp_path, "lab-off", gpu="l40s", variant="baseline"))
    b = report.load_run(make_run(tmp_path, "lab-on", gpu="l40s", variant="mma_decode+triton_indexer"))
    files = report.write_report(a, b, report.compare_runs(a, b), tmp_path / "report")
    md, page = files["md"].read_text(), files["html"].read_text()
    assert "calibration: **simulated: NVIDIA L40S calibration, PROJECTED (not measured on this GPU)" in md
    assert md.count("PROJECTED") == 2 and page.count("PROJECTED") == 2  # one line per side
    real = report.load_run(make_run(tmp_path, "real", gpu=None, variant="baseline"))
    files = report.write_report(real, b, report.compare_runs(real, b), tmp_path / "mixed")
    assert files["md"].read_text().count("calibration: **simulated") == 1  # a real server has no calibration line
