"""`sparsemla profile` (`make profile`): waits for decode steps with progress, and an idle server is a clear exit 3
within the timeout, directly and through a running exporter; a busy server gives a snapshot (exit 0)."""

from __future__ import annotations

import json
import subprocess
import threading
import time
from pathlib import Path

import httpx
import pytest

from sparsemla import procs
from sparsemla.ops.cli import PROFILE_IDLE
from sparsemla.ops.exporter import Activity, ExporterConfig, KernelShareExporter, _http, parse_activity
from sparsemla.ops.sim.testing import run_sim
from sparsemla.ops.stack import _sparsemla_argv

ROOT = Path(__file__).resolve().parents[1]
TIMEOUT = 2.0
SLACK = 30.0  # CLI start-up, /stop_profile and clean-up on a loaded CI machine

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def trace_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("profile-traces")


@pytest.fixture(scope="module")
def sim(trace_root: Path):
    with run_sim({"SGLANG_TORCH_PROFILER_DIR": str(trace_root)}) as running:
        yield running


def _profile(sim_url: str, exporter: str, trace_dir: Path, *extra: str) -> tuple[subprocess.CompletedProcess, float]:
    argv = _sparsemla_argv("profile", "--target", sim_url, "--exporter", exporter, "--trace-dir", str(trace_dir))
    started = time.monotonic()
    out = subprocess.run([*argv, *extra], capture_output=True, text=True, timeout=TIMEOUT + 120)
    return out, time.monotonic() - started


def test_make_profile_runs_this_command() -> None:
    out = subprocess.run(["make", "-n", "-o", ".venv/.sparsemla-setup", "profile", "TARGET=http://h:1"], cwd=ROOT,
                         capture_output=True, text=True, timeout=60)  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert "sparsemla profile --target http://h:1" in out.stdout


def test_errors_stay_one_line_when_stderr_is_no_terminal(capsys: pytest.CaptureFixture[str]) -> None:
    """An error and its hint are one line each on a captured stderr (rich would wrap them at 80 columns there, and a
    wrap that falls inside a phrase breaks every grep for it: the idle test below once failed that way, by the length
    of its temporary directory's name)."""
    import typer

    from sparsemla.console import USAGE_ERROR, fail

    message, hint = " ".join(["the server was idle"] * 12), " ".join(["profile while load runs"] * 8)
    with pytest.raises(typer.Exit) as exc:
        fail(message, hint)
    assert exc.value.exit_code == USAGE_ERROR
    assert capsys.readouterr().err.splitlines() == [f"error: {message}", f"hint: {hint}"]


def test_idle_server_exits_3_within_the_timeout_and_says_so(sim, trace_root: Path) -> None:
    nobody = f"http://127.0.0.1:{procs.free_port()}"  # no exporter there: `profile` profiles directly
    out, took = _profile(sim.url, nobody, trace_root / "direct", "--timeout", str(TIMEOUT))
    assert out.returncode == PROFILE_IDLE == 3, out.stdout + out.stderr
    assert took < TIMEOUT + SLACK
    assert out.stdout.lstrip().startswith("waiting for 10 decode steps"), out.stdout  # said at once, before waiting
    assert "the server was idle" in out.stderr and "no forward step in 2s" in out.stderr
    assert "make loadtest" in out.stderr  # what to do about it
    assert not list((trace_root / "direct").glob("*.trace.json.gz"))


def test_idle_server_through_the_exporter_honours_the_cli_timeout(sim, trace_root: Path, tmp_path: Path) -> None:
    port = procs.free_port()
    argv = _sparsemla_argv("exporter", "--target", sim.url, "--port", str(port), "--timeout", "600")
    argv += ["--trace-dir", str(trace_root / "exp"), "--snapshot-dir", str(tmp_path / "snaps")]
    proc = procs.start("exporter", argv, run_dir=tmp_path)
    try:
        procs.wait_http(f"http://127.0.0.1:{port}/health", timeout=60, pid=proc.pid)
        out, took = _profile(sim.url, f"http://127.0.0.1:{port}", trace_root / "exp", "--timeout", str(TIMEOUT))
    finally:
        procs.stop("exporter", run_dir=tmp_path)
    assert out.returncode == PROFILE_IDLE, out.stdout + out.stderr
    assert took < TIMEOUT + SLACK  # the exporter's own --timeout is 600 s: it took the CLI's
    assert f"exporter http://127.0.0.1:{port}" in out.stderr and "the server was idle" in out.stderr


def test_busy_server_gives_a_snapshot(sim, trace_root: Path) -> None:
    stop = threading.Event()

    def load() -> None:
        while not stop.is_set():
            httpx.post(f"{sim.url}/v1/completions", json={"prompt": "keep busy", "max_tokens": 64}, timeout=60)

    threads = [threading.Thread(target=load, daemon=True) for _ in range(4)]
    for t in threads:
        t.start()
    try:
        nobody = f"http://127.0.0.1:{procs.free_port()}"
        out, _ = _profile(sim.url, nobody, trace_root / "busy", "--timeout", "60", "--num-steps", "3", "--json")
    finally:
        stop.set()
        for t in threads:
            t.join(timeout=60)
    assert out.returncode == 0, out.stdout + out.stderr
    snap = json.loads(out.stdout[out.stdout.index("{") :])
    assert snap["outcome"] == "ok" and snap["idle"] is False and snap["summary"]["kernels"]


def test_snapshot_timeout_comes_from_the_post_body(sim, trace_root: Path, tmp_path: Path) -> None:
    cfg = ExporterConfig(target=sim.url, trace_dir=trace_root / "body", snapshot_dir=tmp_path, timeout_s=600,
                         port=procs.free_port())  # fmt: skip
    exp = KernelShareExporter(cfg)
    server = exp.serve()
    threading.Thread(target=server.serve_forever, daemon=True).start()
    base = f"http://127.0.0.1:{cfg.port}"
    try:
        for bad in ({"timeout_s": -1}, {"timeout_s": "soon"}, {"timeout_s": True}):
            status, body = _http("POST", f"{base}/snapshot", bad)
            assert status == 400 and "timeout_s" in json.loads(body)["error"]
        started = time.monotonic()
        status, body = _http("POST", f"{base}/snapshot", {"timeout_s": 1.0}, timeout=120)
        assert status == 504 and time.monotonic() - started < 1.0 + SLACK
        assert json.loads(body)["idle"] is True
    finally:
        server.shutdown()
        server.server_close()


def test_activity_parsing() -> None:
    declared = "# TYPE sglang:forward_execution_seconds_total counter\n"  # no step yet: no labelled sample
    assert parse_activity(declared) == Activity(0.0, 0.0, 0.0)
    busy = declared + (
        'sglang:forward_execution_seconds_total{category="decode"} 1.5\n'
        'sglang:forward_execution_seconds_total{category="extend"} 0.5\n'
        "sglang:num_running_reqs 3\n"
    )
    now = parse_activity(busy)
    assert now == Activity(2.0, 3.0, 0.0) and now.ran_since(Activity(2.0, 0.0, 0.0))
    assert not Activity(2.0, 0.0, 0.0).ran_since(Activity(2.0, 0.0, 0.0))
    assert parse_activity('sparsemla_kernel_flags_info{variant="x"} 1.0\n') is None  # stock server: unknown, not idle
    assert parse_activity("not { metrics") is None
