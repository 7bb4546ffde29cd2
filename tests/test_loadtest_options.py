"""The shared load-test options (one dataclass, declared once) reach the runner's config from every command; one
default workload; the demo is the stack around a campaign (no simulator here: the stack and the campaign are
stand-ins)."""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path
from typing import Any

import pytest
import typer
from typer.testing import CliRunner

from sparsemla.loadtest import ab, campaign, cli, runner, sweep
from sparsemla.loadtest.ab import ABError, ABResult
from sparsemla.loadtest.kernel_shares import KernelComparison, ProfileSnapshot
from sparsemla.loadtest.options import DEFAULT_TARGET, LoadOptions, with_load_options
from sparsemla.loadtest.report import Run, compare_runs
from sparsemla.loadtest.runner import LoadTestConfig
from sparsemla.loadtest.workload import DEFAULT_WORKLOAD, DEMO_WORKLOAD, WorkloadError
from sparsemla.ops import demo, stack

ROOT = Path(__file__).resolve().parents[1]
SHARED_ARGS = [
    "--duration", "2m", "--target", "http://h:1", "--workload", "random:8:4", "--run-id", "myrun", "--api",
    "completions", "--warmup", "5s", "--seed", "3", "--processes", "2", "--api-key", "X", "--max-tokens", "7",
    "--no-ignore-eos", "--ttft-slo", "1.5", "--tpot-slo", "0.05", "--metrics-port", "0", "--request-timeout", "33",
]  # fmt: skip


class _Stop(Exception):
    """Raised by the stand-ins once they have seen the config (nothing is run)."""


def _expected(concurrency: int) -> LoadTestConfig:
    return LoadTestConfig(
        target="http://h:1", concurrency=concurrency, duration_s=120.0, workload="random:8:4", api="completions",
        warmup_s=5.0, seed=3, ignore_eos=False, max_tokens=7, api_key="X", request_timeout_s=33.0, processes=2,
        metrics_port=0, ttft_slo_s=1.5, tpot_slo_s=0.05,
    )  # fmt: skip


@pytest.fixture
def captured(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> dict[str, Any]:
    """run_point / run_sweep / run_ab replaced by stand-ins that record their arguments and stop the command."""
    monkeypatch.setenv("SPARSEMLA_RESULTS_DIR", str(tmp_path))
    seen: dict[str, Any] = {}

    def fake_point(cfg: LoadTestConfig, out: Path, run_id: str, **_kw: Any) -> dict[str, Any]:
        seen.update(cmd="loadtest", cfg=cfg, run_id=run_id)
        raise _Stop

    def fake_sweep(cfg: LoadTestConfig, points: list[int], repeat: int, run_dir: Path, **_kw: Any) -> list[Any]:
        seen.update(cmd="sweep", cfg=cfg, points=points, repeat=repeat, run_id=run_dir.name)
        raise _Stop

    def fake_ab(flag: str, points: list[int], repeat: int, cfg: LoadTestConfig, **kw: Any) -> ABResult:
        seen.update(cmd="ab", cfg=cfg, flag=flag, points=points, repeat=repeat, **kw)
        raise _Stop

    monkeypatch.setattr(runner, "run_point", fake_point)
    monkeypatch.setattr(sweep, "run_sweep", fake_sweep)
    monkeypatch.setattr(ab, "run_ab", fake_ab)
    return seen


@pytest.mark.parametrize(
    ("argv", "concurrency"),
    [(["loadtest", "-c", "5"], 5), (["sweep", "-c", "4 8"], 4), (["ab", "-c", "2 6", "--no-restore"], 2)],
    ids=["loadtest", "sweep", "ab"],
)
def test_every_shared_option_reaches_the_config(captured: dict[str, Any], argv: list[str], concurrency: int) -> None:
    result = CliRunner().invoke(cli.app, [*argv, *SHARED_ARGS])
    assert isinstance(result.exception, _Stop), result.output
    assert captured["cmd"] == argv[0]
    assert captured["cfg"] == _expected(concurrency)
    assert captured["run_id"] == "myrun"
    if argv[0] == "ab":  # ab's own options still arrive next to the shared ones
        assert captured["restore"] is False and captured["restart"] == "sim" and captured["points"] == [2, 6]


@pytest.mark.parametrize("command", ["loadtest", "sweep", "ab"])
def test_defaults_are_the_runners_defaults(captured: dict[str, Any], command: str) -> None:
    result = CliRunner().invoke(cli.app, [command, "-c", "3"])
    assert isinstance(result.exception, _Stop), result.output
    assert captured["cfg"] == LoadTestConfig(target=DEFAULT_TARGET, concurrency=3, duration_s=60.0)
    assert captured["cfg"].workload == DEFAULT_WORKLOAD


def test_every_command_declares_every_shared_option() -> None:
    group: Any = typer.main.get_command(cli.app)
    shared = {f.name for f in dataclasses.fields(LoadOptions)}
    for name in ("loadtest", "sweep", "ab"):
        params = {p.name for p in group.commands[name].params}
        assert shared <= params, (name, shared - params)
    assert "api_key" not in {p.name for p in group.commands["compare"].params}  # compare is not a load-test run


def test_bad_shared_values_are_one_line_errors(captured: dict[str, Any]) -> None:
    result = CliRunner().invoke(cli.app, ["ab", "--workload", "random:8"])
    assert result.exit_code == 2 and "expected random:IN:OUT" in result.output and "cmd" not in captured
    result = CliRunner().invoke(cli.app, ["ab", "--flag", "SPARSEMLA_RESULTS_DIR"])
    assert result.exit_code == 2 and "not a boolean kernel flag" in result.output and "cmd" not in captured


def test_load_options_config_and_warmup() -> None:
    assert LoadOptions().config(1).warmup_s is None  # the runner's automatic warmup
    assert LoadOptions(warmup="0").config(1).warmup_s == 0.0
    assert LoadOptions(warmup="0s").config(1).effective_warmup_s == 0.0
    assert LoadOptions(warmup="1m").config(1).warmup_s == 60.0
    with pytest.raises(WorkloadError):
        LoadOptions(workload="nope:1").config(1)
    with pytest.raises(ValueError, match="duration"):
        LoadOptions(duration="soon").config(1)
    with pytest.raises(ValueError, match="target"):
        LoadOptions(target="h:1").config(1)


def test_with_load_options_refuses_commands_it_cannot_fill() -> None:
    def no_opts(concurrency: int = 1) -> None: ...

    def clashing(target: str = "x", opts: LoadOptions = LoadOptions()) -> None: ...

    with pytest.raises(TypeError, match="no 'opts'"):
        with_load_options(no_opts)
    with pytest.raises(TypeError, match="target"):
        with_load_options(clashing)


# -- one default workload ----------------------------------------------------------------------------------------


def test_one_default_workload() -> None:
    assert LoadOptions().workload == DEFAULT_WORKLOAD == LoadTestConfig("http://x", 1, 1.0).workload
    compose = (ROOT / "compose.yaml").read_text()
    literals = re.findall(r"\$\{LOCUST_WORKLOAD:-([^}]*)\}", compose)
    assert len(literals) >= 2 and set(literals) == {DEFAULT_WORKLOAD}  # compose cannot import the constant
    makefile = (ROOT / "Makefile").read_text()
    (value,) = re.findall(r"^WORKLOAD \?=([^#\n]*)", makefile, flags=re.MULTILINE)
    assert value.strip() == "" and "random:" not in makefile  # the Makefile leaves the default to the CLI
    assert "default=DEFAULT_WORKLOAD" in (ROOT / "src/sparsemla/loadtest/locustfile.py").read_text()


def test_the_demo_workload_is_the_named_constant() -> None:
    group: Any = typer.main.get_command(demo.app)  # one command: typer makes the app that command
    command = group.commands["demo"] if hasattr(group, "commands") else group
    (workload,) = [p for p in command.params if p.name == "workload"]
    assert workload.default == DEMO_WORKLOAD != DEFAULT_WORKLOAD
    assert "random:" not in (ROOT / "src/sparsemla/ops/demo.py").read_text()


# -- the demo is stack up + a campaign (+ the calibration check) --------------------------------------------------


def _run(name: str, path: Path, variant: str, flag: str, tok_s: dict[int, float]) -> Run:
    points = {
        c: [{"concurrency": c, "run_id": name, "variant": variant, "server_flags": {"sparsemla_mma_decode": flag},
             "output_tok_per_s": v, "ttft_s": {"p50": 0.1, "p99": 0.2}, "itl_s": {"p50": 0.02, "p99": 0.03},
             "goodput": {"share": 1.0}, "ci95": {}, "test_start": 1000.0, "window": {"start": 1002.0, "end": 1012.0},
             "failures": {"total": 0}}]
        for c, v in tok_s.items()
    }  # fmt: skip
    return Run(name, path, points)


TOK_S = {"baseline": {1: 100.0, 8: 400.0}, "mma_decode": {1: 220.0, 8: 720.0},
         "mma_decode+triton_indexer": {1: 440.0, 8: 2160.0}}  # fmt: skip


@pytest.fixture
def demo_stand_ins(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> dict[str, Any]:
    """The stack and run_campaign replaced: records what the demo passes; every step's B/A tok/s is 2.2 and 1.8,
    then 2.0 and 3.0, against a calibrated 2.0 everywhere."""
    monkeypatch.setenv("SPARSEMLA_RESULTS_DIR", str(tmp_path / "results"))
    monkeypatch.delenv("GRAFANA_URL", raising=False)
    seen: dict[str, Any] = {"down": []}

    def fake_up(**kw: Any) -> stack.StackUrls:
        seen["up"] = kw
        return stack.StackUrls(server="http://127.0.0.1:1234", prometheus=None, exporter="http://127.0.0.1:9401")

    def fake_down(run_dir: Path) -> list[str]:
        seen["down"].append(run_dir)
        return ["server"]

    def fake_campaign(variants: list[str], points: list[int], repeat: int, cfg: LoadTestConfig, **kw: Any) -> Any:
        seen["campaign"] = dict(variants=variants, points=points, repeat=repeat, cfg=cfg, **kw)
        if seen.get("fail"):
            raise ABError("the simulator did not come back")
        out = kw["out_dir"]
        done = {
            v: campaign.VariantResult(v, _run(v, out / "runs" / v, v, "on" if v != "baseline" else "off", TOK_S[v]),
                                      ProfileSnapshot(v, 8, error="a stand-in takes no snapshot"))
            for v in variants
        }  # fmt: skip
        steps = []
        for step in campaign.plan_steps(variants):
            (out / "steps" / step.slug).mkdir(parents=True)
            a, b = done[step.a], done[step.b]
            files = {"html": out / "steps" / step.slug / "report.html"}
            kernels = KernelComparison(a.snapshot, b.snapshot)
            result = campaign.StepResult(step, compare_runs(a.run, b.run), files, kernels)
            kw["on_step"](result)
            steps.append(result)
        return campaign.CampaignResult(out, points, done, steps)

    monkeypatch.setattr(stack, "up", fake_up)
    monkeypatch.setattr(stack, "down", fake_down)
    monkeypatch.setattr(campaign, "run_campaign", fake_campaign)
    monkeypatch.setattr(demo, "calibrated_ratios", lambda a, b, points: {c: 2.0 for c in points})
    return seen


def test_demo_is_stack_up_plus_a_campaign(demo_stand_ins: dict[str, Any], tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    argv = ["--point-seconds", "4", "--concurrency", "1 8", "--no-prometheus", "--port", "0", "--run-dir", str(run_dir)]
    result = CliRunner().invoke(demo.app, argv)
    assert result.exit_code == 0, result.output
    out = tmp_path / "results" / "demo"
    seen = demo_stand_ins["campaign"]
    assert seen["variants"] == ["baseline", "mma_decode", "mma_decode+triton_indexer"]
    assert seen["points"] == [1, 8] and seen["repeat"] == 1
    assert seen["cfg"] == LoadTestConfig(
        target="http://127.0.0.1:1234", concurrency=1, duration_s=4.0, workload=DEMO_WORKLOAD, warmup_s=1.0,
        request_timeout_s=120.0, metrics_port=demo_stand_ins["up"]["locust_metrics_port"],
    )  # fmt: skip
    assert seen["restart"] == "sim" and seen["fresh_start"] is True and seen["stack_run_dir"] == run_dir
    assert seen["out_dir"] == out and seen["exporter"] == "http://127.0.0.1:9401"
    up = demo_stand_ins["up"]
    assert up["sim_env"] == {"SPARSEMLA_MMA_DECODE": "0", "SPARSEMLA_TRITON_INDEXER": "0"} and up["exporter"] is True
    assert demo_stand_ins["down"] == [run_dir]
    info = json.loads((out / "demo.json").read_text())
    assert info["variants"] == seen["variants"] and info["workload"] == DEMO_WORKLOAD
    deviations = [[(r["concurrency"], round(r["deviation"], 3)) for r in s["ratios"]] for s in info["steps"]]
    assert deviations == [[(1, 0.1), (8, -0.1)], [(1, 0.0), (8, 0.5)]]
    assert [s["flag"] for s in info["steps"]] == ["SPARSEMLA_MMA_DECODE", "SPARSEMLA_TRITON_INDEXER"]
    report = (out / "report.md").read_text()
    assert "## Step 1: SPARSEMLA_MMA_DECODE" in report and "## Step 2: SPARSEMLA_TRITON_INDEXER" in report
    assert "no kernel-share snapshot of baseline: a stand-in takes no snapshot" in report
    assert "Output tok/s" in result.output and "calibrated decode-step speed-up ×2.00" in result.output


def test_demo_stops_the_stack_when_the_campaign_fails(demo_stand_ins: dict[str, Any], tmp_path: Path) -> None:
    demo_stand_ins["fail"] = True
    result = CliRunner().invoke(demo.app, ["--no-prometheus", "--port", "0", "--run-dir", str(tmp_path / "run")])
    assert result.exit_code == 2 and "did not come back" in result.output
    assert demo_stand_ins["down"] == [tmp_path / "run"]


def test_the_demo_refuses_a_campaign_that_is_not_one_flag_per_step(demo_stand_ins: dict[str, Any]) -> None:
    result = CliRunner().invoke(demo.app, ["--variants", "baseline mma_decode+triton_indexer", "--no-prometheus"])
    assert result.exit_code == 2 and "exactly one kernel switch" in " ".join(result.output.split())
    assert "up" not in demo_stand_ins  # refused before anything started
