"""Load-test reliability end to end, through the real CLI and a real Locust: a server that streams then errors, one
that answers 500, one that dies mid-point (no throughput from failures, exit 1 above --max-error-rate, back-off
instead of a flood, the API key only in Locust's environment), and SIGTERM / SIGKILL of `sweep` against the simulator
(no Locust left behind; finished points kept)."""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from sparsemla import flags, procs
from sparsemla.loadtest.records import read_records
from sparsemla.ops.sim.testing import run_sim

pytestmark = pytest.mark.slow
CLI = [sys.executable, "-c", "from sparsemla.cli import main; main()"]
CHUNK = b'data: {"choices": [{"index": 0, "text": "t "}]}\n\n'


class FakeServer:
    """A tiny HTTP/1.0 LLM server (one connection per request, so once it is closed every request is refused)."""

    def __init__(self, mode: str) -> None:
        self.mode = mode  # ok | stream-error | 500
        self.auth: list[str] = []
        self.posts = 0
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *_args: object) -> None:
                pass

            def do_GET(self) -> None:
                if self.path == "/health":
                    self._send(200, b"ok", "text/plain")
                elif self.path == "/v1/models":
                    self._send(200, json.dumps({"data": [{"id": "fake"}]}).encode(), "application/json")
                else:
                    self._send(404, b"{}", "application/json")

            def do_POST(self) -> None:
                with contextlib.suppress(OSError):  # the client hung up (the test ended mid-stream)
                    self._post()

            def _post(self) -> None:
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                server.posts += 1
                server.auth.append(self.headers.get("Authorization") or "")
                if server.mode == "500":
                    self._send(500, b'{"error": {"message": "injected 500"}}', "application/json")
                    return
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.end_headers()
                for _ in range(4):
                    self.wfile.write(CHUNK)
                    self.wfile.flush()
                    time.sleep(0.01)
                if server.mode == "stream-error":
                    self.wfile.write(b'data: {"error": {"message": "injected error after streaming"}}\n\n')
                else:
                    self.wfile.write(b"data: [DONE]\n\n")

            def _send(self, code: int, body: bytes, kind: str) -> None:
                self.send_response(code)
                self.send_header("Content-Type", kind)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def die(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@contextlib.contextmanager
def fake_server(mode: str) -> Iterator[FakeServer]:
    server = FakeServer(mode)
    try:
        yield server
    finally:
        with contextlib.suppress(OSError):
            server.die()


def _env(results: Path) -> dict[str, str]:
    return flags.child_env({"SPARSEMLA_RESULTS_DIR": str(results), flags.SPARSEMLA_LOADTEST_API_KEY.name: None})


def _cmdlines() -> Iterator[tuple[int, bytes]]:
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError):
                yield int(entry.name), (entry / "cmdline").read_bytes()


def locust_pids(run_dir: Path) -> list[int]:
    """Live Locust processes (master and forked workers) writing into ``run_dir``."""
    found = []
    for pid, cmdline in _cmdlines():
        if b"locust" in cmdline and str(run_dir).encode() in cmdline and procs.is_alive(pid):
            found.append(pid)
    return found


def _wait(what: str, check: Callable[[], object], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.1)


def _loadtest(url: str, results: Path, *extra: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    argv = [*CLI, "loadtest", "--target", url, "--api", "completions", "--workload", "random:8:4", "--warmup", "0",
            "--metrics-port", "0", "--run-id", "r", *extra]  # fmt: skip
    return subprocess.run(argv, env=_env(results), capture_output=True, text=True, timeout=timeout)


def test_a_server_that_streams_then_errors_gives_no_throughput_and_exit_1(tmp_path: Path) -> None:
    with fake_server("stream-error") as server:
        done = _loadtest(server.url, tmp_path, "-c", "2", "--duration", "3s")
    assert done.returncode == 1, done.stdout + done.stderr
    assert "max-error-rate" in done.stderr
    summary = json.loads((tmp_path / "loadtest" / "r" / "summary.json").read_text())
    assert summary["failure_rate"] == 1.0 and summary["requests"] == 0
    assert summary["output_tokens"] == 0 and summary["output_tok_per_s"] == 0
    records = read_records(tmp_path / "loadtest" / "r" / "requests.jsonl")
    assert records and all(r.error == "http_error" and r.output_tokens == 4 for r in records if not r.cut)
    stats_csv = (tmp_path / "loadtest" / "r" / "locust_stats.csv").read_text().splitlines()
    header = stats_csv[0].split(",")
    e2e = next(line.split(",") for line in stats_csv if line.startswith("E2E,"))
    assert float(e2e[header.index("Average Content Size")]) == 0  # Locust's own stats count no failed tokens


def test_a_server_answering_500_is_not_flooded(tmp_path: Path) -> None:
    with fake_server("500") as server:
        done = _loadtest(server.url, tmp_path, "-c", "2", "--duration", "4s")
        posts = server.posts
    assert done.returncode == 1, done.stdout + done.stderr
    # without back-off, 2 users fire thousands of instant failures in 4 s
    assert 4 <= posts < 100, posts
    # an explicit --max-error-rate 1 accepts the run
    with fake_server("500") as server:
        assert _loadtest(server.url, tmp_path, "-c", "1", "--duration", "1s", "--max-error-rate", "1").returncode == 0


def test_a_server_dying_mid_point_is_backed_off_and_gets_the_key_from_the_environment(tmp_path: Path) -> None:
    key = "sk-" + secrets.token_hex(16)
    run_dir = tmp_path / "loadtest" / "r"
    with fake_server("ok") as server:
        argv = [*CLI, "loadtest", "--target", server.url, "--api", "completions", "--workload", "random:8:4",
                "--warmup", "0", "--metrics-port", "0", "--run-id", "r", "-c", "2", "--duration", "5s",
                "--api-key", key]  # fmt: skip
        proc = subprocess.Popen(argv, env=_env(tmp_path), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        try:
            _wait("Locust", lambda: locust_pids(run_dir), 60)
            _wait("requests", lambda: server.posts >= 5, 30)
            on_argv = [pid for pid, argv in _cmdlines() if pid in locust_pids(run_dir) and key.encode() in argv]
            assert not on_argv, "the key is on Locust's command line"
            server.die()
            died_at = server.posts
            output, _ = proc.communicate(timeout=120)
        finally:
            if proc.poll() is None:
                proc.kill()
    assert server.auth[:died_at] == [f"Bearer {key}"] * died_at
    records = read_records(run_dir / "requests.jsonl")
    refused = [r for r in records if r.error == "connection"]
    assert refused, output
    assert len(refused) < 60, f"{len(refused)} failed requests after the server died: no back-off"
    assert proc.returncode == 1, output


# -- signals --------------------------------------------------------------------------------------------------------
def _sweep(url: str, results: Path, run_id: str, *extra: str) -> subprocess.Popen[bytes]:
    argv = [*CLI, "sweep", "--target", url, "--api", "completions", "--workload", "random:16:8", "--warmup", "0",
            "--metrics-port", "0", "--run-id", run_id, *extra]  # fmt: skip
    results.mkdir(parents=True, exist_ok=True)
    log = open(results / f"{run_id}.log", "wb")  # noqa: SIM115 (closed with the process)
    return subprocess.Popen(argv, env=_env(results), stdout=log, stderr=subprocess.STDOUT)


def _no_locust_left(run_dir: Path, timeout: float) -> list[int]:
    deadline = time.monotonic() + timeout
    while (left := locust_pids(run_dir)) and time.monotonic() < deadline:
        time.sleep(0.1)
    for pid in left:  # clean up after a failure (these are this test's own processes)
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    return left


def test_sigterm_of_a_sweep_stops_locust_and_keeps_finished_points(tmp_path: Path) -> None:
    run_dir = tmp_path / "loadtest" / "term"
    with run_sim() as sim:
        proc = _sweep(sim.url, tmp_path, "term", "-c", "1 2", "--duration", "2s")
        try:
            _wait("the first point", lambda: (run_dir / "c0001-r1" / "summary.json").exists(), 90)
            _wait("Locust of the second point", lambda: (run_dir / "c0002-r1" / "timeline.json").exists(), 60)
            assert locust_pids(run_dir)
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=30)
        finally:
            if proc.poll() is None:
                proc.kill()
        left = _no_locust_left(run_dir, 15)
    log = (tmp_path / "term.log").read_text(errors="replace")
    assert not left, f"Locust {left} kept running after SIGTERM of the sweep"
    assert proc.returncode == 143, log
    assert "SIGTERM" in log and "Traceback" not in log
    assert json.loads((run_dir / "c0001-r1" / "summary.json").read_text())["concurrency"] == 1
    assert not (run_dir / "c0002-r1" / "summary.json").exists()


def test_sigkill_of_a_sweep_takes_locust_and_its_workers_down(tmp_path: Path) -> None:
    run_dir = tmp_path / "loadtest" / "kill"
    with run_sim() as sim:
        proc = _sweep(sim.url, tmp_path, "kill", "-c", "2", "--duration", "60s", "--processes", "2")
        try:
            _wait("Locust and its 2 workers", lambda: len(locust_pids(run_dir)) >= 3, 90)
            proc.kill()
            proc.wait(timeout=10)
        finally:
            if proc.poll() is None:
                proc.kill()
        left = _no_locust_left(run_dir, 15)
    assert not left, f"Locust {left} kept running after SIGKILL of the sweep"
