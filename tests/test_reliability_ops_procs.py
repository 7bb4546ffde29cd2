"""`down` and PID files: a stale PID file never gets an unrelated process signalled; a killed leader's children (which
keep the port) are still stopped; Prometheus runs without its unauthenticated lifecycle API."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from sparsemla import procs
from sparsemla.ops import stack
from sparsemla.ops.exporter import _http


@pytest.fixture
def stranger() -> Iterator[subprocess.Popen]:
    """An unrelated process that is its own session and group leader (as any daemon is): `killpg(pid)` reaches it."""
    proc = subprocess.Popen(["sleep", "300"], start_new_session=True)
    yield proc
    proc.kill()
    proc.wait()


def _start_time(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19])


def _boot_id() -> str:
    return Path("/proc/sys/kernel/random/boot_id").read_text().strip()


@pytest.mark.parametrize("form", ["legacy-plain-pid", "record-of-a-reused-pid"])
def test_stale_pid_file_of_an_unrelated_process_is_not_signalled(
    stranger: subprocess.Popen, tmp_path: Path, form: str
) -> None:
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    if form == "legacy-plain-pid":
        text = f"{stranger.pid}\n"
    else:  # the recorded server exited and its PID was handed to `sleep`: same number, another start time
        record = {"pid": stranger.pid, "start_time": _start_time(stranger.pid) - 100, "boot_id": _boot_id(),
                  "argv": ["sparsemla", "sim"]}  # fmt: skip
        text = json.dumps(record)
    (run_dir / "server.pid").write_text(text)
    assert procs.running(run_dir) == {}
    assert procs.stop("server", run_dir=run_dir, timeout=1) is False
    time.sleep(0.3)
    assert stranger.poll() is None, "an unrelated process was signalled"
    (run_dir / "server.pid").write_text(text)
    report = stack.down_report(run_dir)
    time.sleep(0.3)
    assert stranger.poll() is None, "an unrelated process was signalled"
    assert report.stopped == [] and report.failed == {} and "server" in report.stale
    assert not (run_dir / "server.pid").exists()
    assert stack.down_report(run_dir).lines() == ["nothing was running"]


SERVE = (
    "import http.server, sys; "
    "http.server.HTTPServer(('127.0.0.1', int(sys.argv[1])), http.server.BaseHTTPRequestHandler).serve_forever()"
)


def test_killed_leader_whose_child_keeps_the_port_is_stopped(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    port = procs.free_port()
    # a leader like `sh -c 'python3 -m sglang.launch_server ...'` that did not exec: the server is its child
    proc = procs.start("server", ["/bin/sh", "-c", f'{sys.executable} -c "{SERVE}" {port} & wait'], run_dir=run_dir)
    deadline = time.monotonic() + 30
    while not procs.port_in_use(port) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert procs.port_in_use(port)
    os.kill(proc.pid, signal.SIGKILL)
    os.waitpid(proc.pid, 0)
    assert procs.port_in_use(port), "the child keeps the port after its leader died"
    assert procs.running(run_dir) == {"server": proc.pid}  # the group still runs
    report = stack.down_report(run_dir)
    assert report.stopped == ["server"] and report.failed == {}
    deadline = time.monotonic() + 5
    while procs.port_in_use(port) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not procs.port_in_use(port)
    assert procs.running(run_dir) == {}


def test_pid_file_records_the_process_identity(tmp_path: Path) -> None:
    proc = procs.start("sleeper", ["sleep", "300"], run_dir=tmp_path)
    try:
        record = json.loads((tmp_path / "sleeper.pid").read_text())
        assert record == {"pid": proc.pid, "start_time": _start_time(proc.pid), "boot_id": _boot_id(),
                          "argv": ["sleep", "300"]}  # fmt: skip
        assert os.getpgid(proc.pid) == proc.pid and os.getsid(proc.pid) == proc.pid  # own session and group
    finally:
        assert procs.stop("sleeper", run_dir=tmp_path)
    assert not procs.is_alive(proc.pid)


def test_cli_down_reports_a_stale_pid_file(stranger: subprocess.Popen, tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "exporter.pid").write_text(f"{stranger.pid}\n")
    out = subprocess.run(
        [*stack._sparsemla_argv("down"), "--run-dir", str(run_dir)], capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    assert "stale PID file of exporter" in out.stdout and "nothing signalled" in out.stdout
    assert stranger.poll() is None


def test_prometheus_argv_has_no_lifecycle_api(tmp_path: Path) -> None:
    argv = stack.prometheus_argv("prometheus", tmp_path / "p.yml", tmp_path / "data", 9090)
    assert not any("lifecycle" in a for a in argv)
    assert "--web.listen-address=127.0.0.1:9090" in argv


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("prometheus") is None, reason="apt-get install prometheus")
def test_prometheus_cannot_be_stopped_over_http(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    ports = {"port": procs.free_port(), "prometheus_port": procs.free_port(), "exporter_port": procs.free_port()}
    urls = stack.up(run_dir=run_dir, prometheus=True, exporter=False, **ports)
    try:
        status, _ = _http("POST", f"{urls.prometheus}/-/quit")
        assert status != 200
        time.sleep(1)
        assert _http("GET", f"{urls.prometheus}/-/ready")[0] == 200
    finally:
        stack.down(run_dir)
