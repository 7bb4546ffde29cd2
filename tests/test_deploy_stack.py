"""`make up` / `make down` without Docker: simulator + Prometheus + exporter as processes, no process left behind."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
import urllib.parse
from pathlib import Path

import pytest

from sparsemla import procs
from sparsemla.console import UsageError
from sparsemla.ops import stack
from sparsemla.ops.exporter import _http


def _ports() -> dict[str, int]:
    return {"port": procs.free_port(), "prometheus_port": procs.free_port(), "exporter_port": procs.free_port()}


def _assert_all_gone(pids: dict[str, int], ports: dict[str, int]) -> None:
    for name, pid in pids.items():
        assert not procs.is_alive(pid), f"{name} (pid {pid}) still running"
    for port in ports.values():
        assert not procs.port_in_use(port), f"port {port} still in use"


def _prometheus_query(url: str, query: str) -> list[dict]:
    status, body = _http("GET", f"{url}/api/v1/query?query={urllib.parse.quote(query)}")
    assert status == 200, body
    return json.loads(body)["data"]["result"]


@pytest.mark.slow
def test_up_restart_down(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    ports = _ports()
    with_prometheus = shutil.which("prometheus") is not None
    urls = stack.up(run_dir=run_dir, prometheus=with_prometheus, **ports)
    pids = procs.running(run_dir)
    try:
        assert urls.server == f"http://127.0.0.1:{ports['port']}"
        assert urls.exporter == f"http://127.0.0.1:{ports['exporter_port']}"
        assert set(pids) == {"server", "exporter"} | ({"prometheus"} if with_prometheus else set())
        assert _http("GET", f"{urls.exporter}/health")[0] == 200
        assert 'variant="baseline"' in _http("GET", f"{urls.server}/metrics")[1].decode()
        state = stack.read_state(run_dir)
        assert state["server"] == "sim" and state["urls"]["server"] == urls.server

        with pytest.raises(UsageError, match="already running"):
            stack.up(run_dir=run_dir, **_ports())

        # A/B flip: the server restarts with the flag on; the exporter and Prometheus keep running.
        old_server = pids["server"]
        assert stack.restart_server({"SPARSEMLA_MMA_DECODE": "1"}, run_dir=run_dir) == urls.server
        assert not procs.is_alive(old_server)
        assert 'variant="mma_decode"' in _http("GET", f"{urls.server}/metrics")[1].decode()
        pids = procs.running(run_dir)

        if with_prometheus:
            assert urls.prometheus == f"http://127.0.0.1:{ports['prometheus_port']}"
            deadline = time.monotonic() + 60
            up: dict[str, str] = {}
            while time.monotonic() < deadline and not {"sglang", "kernel-share"} <= set(up):
                time.sleep(1)
                up = {r["metric"]["job"]: r["value"][1] for r in _prometheus_query(urls.prometheus, "up == 1")}
            assert {"sglang", "kernel-share"} <= set(up), up
            rules = json.loads(_http("GET", f"{urls.prometheus}/api/v1/rules")[1])["data"]["groups"]
            assert {"sparsemla-serving", "sparsemla-step", "sparsemla-kernel-share"} <= {g["name"] for g in rules}
    finally:
        stopped = stack.down(run_dir)
    assert set(stopped) == set(pids)
    _assert_all_gone(pids, ports)
    assert stack.read_state(run_dir) is None
    assert stack.down(run_dir) == []


@pytest.mark.slow
def test_local_sglang_command_and_missing_server(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    ports = _ports()
    # No command and nothing listening: a clear error, and nothing is left running.
    monkeypatch.delenv("SPARSEMLA_SGLANG_COMMAND", raising=False)
    with pytest.raises(UsageError, match="nothing listens"):
        stack.up(server="sglang", run_dir=tmp_path / "a", prometheus=False, **ports)
    assert procs.running(tmp_path / "a") == {}

    # A user-provided command (here the simulator stands in for `python -m sglang.launch_server ...`).
    command = f"exec {sys.executable} -m sparsemla.cli sim --port {ports['port']}"
    monkeypatch.setenv("SPARSEMLA_SGLANG_COMMAND", command)
    run_dir = tmp_path / "b"
    urls = stack.up(server="sglang", run_dir=run_dir, prometheus=False, exporter=False, **ports)
    pids = procs.running(run_dir)
    try:
        assert urls.prometheus is None and urls.exporter is None and set(pids) == {"server"}
        assert _http("GET", f"{urls.server}/health")[0] == 200
    finally:
        assert stack.down(run_dir) == ["server"]
    _assert_all_gone(pids, ports)


@pytest.mark.slow
def test_failed_start_cleans_up(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    ports = _ports()
    monkeypatch.setenv("SPARSEMLA_SGLANG_COMMAND", "echo 'sglang: model not found' >&2; exit 3")
    run_dir = tmp_path / "run"
    with pytest.raises(UsageError, match="did not come up") as info:
        stack.up(server="sglang", run_dir=run_dir, prometheus=False, **ports)
    assert "model not found" in str(info.value)  # the log tail is in the message
    assert procs.running(run_dir) == {}


@pytest.mark.slow
def test_cli_up_prints_urls_and_down_leaves_nothing(tmp_path: Path) -> None:
    ports = _ports()
    run_dir = tmp_path / "run"
    argv = [*stack._sparsemla_argv("up"), "--run-dir", str(run_dir), "--no-prometheus"]
    argv += ["--port", str(ports["port"]), "--exporter-port", str(ports["exporter_port"])]
    out = subprocess.run(argv, capture_output=True, text=True, timeout=180)
    pids = procs.running(run_dir)
    try:
        assert out.returncode == 0, out.stdout + out.stderr
        assert f"http://127.0.0.1:{ports['port']}" in out.stdout
        assert f"http://127.0.0.1:{ports['exporter_port']}" in out.stdout
        assert set(pids) == {"server", "exporter"}
    finally:
        down = subprocess.run(
            [*stack._sparsemla_argv("down"), "--run-dir", str(run_dir)], capture_output=True, text=True, timeout=120
        )
    assert down.returncode == 0 and "stopped" in down.stdout
    _assert_all_gone(pids, {k: v for k, v in ports.items() if k != "prometheus_port"})


def test_bad_server_kind(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="server must be"):
        stack.up(server="vllm", run_dir=tmp_path)
