"""Exporter reliability: malformed replies from the target, a dying schedule, a trace the server failed to write (full
disk), oversized traces, and the bearer token of a server started with --api-key."""

from __future__ import annotations

import gzip
import json
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from sparsemla import procs
from sparsemla.ops.exporter import ExporterConfig, KernelShareExporter, _http
from sparsemla.ops.stack import _sparsemla_argv

OK = b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\nConnection: close\r\n\r\nok\n"
METRICS = b'sparsemla_kernel_flags_info{variant="raw"} 1.0\n'
METRICS_OK = b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%s" % (len(METRICS), METRICS)
NOT_RUNNING = (
    b"HTTP/1.1 400 Bad Request\r\nContent-Length: 30\r\nConnection: close\r\n\r\nProfiling is not in progress.\n"
)
CLOSE = None  # close the connection without a reply (http.client: RemoteDisconnected)
GARBAGE = b"HELLO FROM NOT-HTTP\r\n\r\n"  # http.client: BadStatusLine
CUT = b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\nConnection: close\r\n\r\nshort"  # http.client: IncompleteRead


class RawTarget:
    """A TCP server speaking just enough HTTP: per path a scripted raw reply (or CLOSE); records requests' headers.

    ``on_start`` runs with the JSON body of each /start_profile (e.g. to leave a partial trace behind)."""

    def __init__(self, replies: dict[str, bytes | None]) -> None:
        self.replies = {"/metrics": METRICS_OK, "/start_profile": OK, "/stop_profile": NOT_RUNNING, **replies}
        self.requests: list[tuple[str, dict[str, str]]] = []
        self.on_start: Any = None
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(32)
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        self._stop = False
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while not self._stop:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            with conn:
                self._answer(conn)

    def _answer(self, conn: socket.socket) -> None:
        conn.settimeout(5)
        data = b""
        while b"\r\n\r\n" not in data:
            chunk = conn.recv(65536)
            if not chunk:
                return
            data += chunk
        head, body = data.split(b"\r\n\r\n", 1)
        lines = head.decode().split("\r\n")
        path = lines[0].split()[1]
        headers = {k.strip().lower(): v.strip() for k, v in (line.split(":", 1) for line in lines[1:] if ":" in line)}
        length = int(headers.get("content-length", 0))
        while len(body) < length:
            body += conn.recv(65536)
        self.requests.append((path, headers))
        if path == "/start_profile" and self.on_start is not None:
            self.on_start(json.loads(body))
        reply = self.replies.get(path, OK)
        if reply is not None:
            conn.sendall(reply)

    def close(self) -> None:
        self._stop = True
        self.sock.close()


@pytest.fixture
def raw() -> Iterator[RawTarget]:
    target = RawTarget({})
    yield target
    target.close()


def _exporter(target: RawTarget, tmp_path: Path, **kw: Any) -> KernelShareExporter:
    kw.setdefault("timeout_s", 0.6)
    cfg = ExporterConfig(
        target=target.url, trace_dir=tmp_path / "t", snapshot_dir=tmp_path / "s", settle_s=0.1, poll_s=0.05,
        http_timeout_s=3, **kw,
    )  # fmt: skip
    return KernelShareExporter(cfg)


def _count(exp: KernelShareExporter, outcome: str) -> float:
    for family in text_string_to_metric_families(exp.metrics_text().decode()):
        for s in family.samples:
            if s.name == "sparsemla_kernel_snapshots_total" and s.labels == {"outcome": outcome}:
                return s.value
    raise AssertionError("no sparsemla_kernel_snapshots_total sample")


# -- item 6: malformed replies ---------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("path", "reply", "outcome"),
    [
        ("/start_profile", GARBAGE, "error"),
        ("/start_profile", CUT, "error"),
        ("/start_profile", CLOSE, "error"),
        ("/stop_profile", GARBAGE, "timeout"),  # no trace in time; the broken stop reply is only logged
        ("/stop_profile", CUT, "timeout"),
        ("/metrics", GARBAGE, "timeout"),  # variant unknown, then the (idle) profile times out
        ("/metrics", CUT, "timeout"),
    ],
    ids=["start-garbage", "start-cut-body", "start-closed", "stop-garbage", "stop-cut-body", "metrics-garbage",
         "metrics-cut-body"],
)  # fmt: skip
def test_malformed_reply_is_a_counted_outcome(
    raw: RawTarget, tmp_path: Path, path: str, reply: bytes | None, outcome: str
) -> None:
    raw.replies[path] = reply
    exp = _exporter(raw, tmp_path)
    snap = exp.take_snapshot()
    assert snap.outcome == outcome, snap.error
    assert _count(exp, outcome) == 1
    if path == "/metrics":
        assert snap.variant == "unknown"
    if path == "/start_profile":
        assert path in (snap.error or "")


def test_post_snapshot_answers_json_when_the_target_answers_garbage(raw: RawTarget, tmp_path: Path) -> None:
    raw.replies["/start_profile"] = GARBAGE
    raw.replies["/stop_profile"] = GARBAGE
    exp = _exporter(raw, tmp_path)
    exp.config.port = procs.free_port()
    server = exp.serve()
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        status, body = _http("POST", f"http://127.0.0.1:{exp.config.port}/snapshot", timeout=30)
        assert status == 502
        assert json.loads(body)["outcome"] == "error"
        assert _count(exp, "error") == 1
    finally:
        server.shutdown()
        server.server_close()


class _Dies(BaseException):
    """Escapes every `except Exception`: stands for whatever could still end the schedule thread."""


@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")  # _Dies, on purpose
def test_schedule_survives_failures_and_health_reports_a_dead_one(raw: RawTarget, tmp_path: Path) -> None:
    raw.replies["/start_profile"] = GARBAGE
    raw.replies["/metrics"] = GARBAGE
    exp = _exporter(raw, tmp_path, interval_s=0.05)
    stop = threading.Event()
    thread = exp.start_schedule(stop)
    try:
        deadline = time.monotonic() + 20
        while _count(exp, "error") < 3 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert _count(exp, "error") >= 3 and thread is not None and thread.is_alive()
        assert exp.health() == (200, {"status": "ok", "target": raw.url, "schedule": "running"})

        def boom() -> None:
            raise RuntimeError("a bug in take_snapshot")

        exp.take_snapshot = boom  # type: ignore[method-assign]
        time.sleep(0.3)
        assert thread.is_alive(), "an exception in one iteration must not end the schedule"

        def die() -> None:
            raise _Dies

        exp.take_snapshot = die  # type: ignore[method-assign]
        thread.join(timeout=5)
        status, body = exp.health()
        assert status == 503 and body["schedule"] == "dead"
    finally:
        stop.set()


def test_health_route_serves_the_schedule_state(raw: RawTarget, tmp_path: Path) -> None:
    exp = _exporter(raw, tmp_path, interval_s=3600)
    exp.config.port = procs.free_port()
    stop = threading.Event()
    exp.start_schedule(stop)
    server = exp.serve()
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        status, body = _http("GET", f"http://127.0.0.1:{exp.config.port}/health")
        assert status == 200 and json.loads(body)["schedule"] == "running"
        stop.set()
        exp._schedule_thread.join(timeout=5)
        status, body = _http("GET", f"http://127.0.0.1:{exp.config.port}/health")
        assert status == 503 and "schedule" in json.loads(body)["error"]
    finally:
        stop.set()
        server.shutdown()
        server.server_close()


# -- item 7: a trace the server failed to write ----------------------------------------------------------------------
def _leave_partial(data: dict[str, Any]) -> None:
    """What a writer that hit ENOSPC leaves: the start of a gzip stream under the temporary name, never renamed."""
    path = Path(data["output_dir"]) / f"{data['profile_id']}-TP-0.trace.json.gz.tmp"
    path.write_bytes(gzip.compress(b'{"traceEvents": [' * 100)[:40])


def test_partial_temp_trace_is_an_error_naming_the_trace_dir(raw: RawTarget, tmp_path: Path) -> None:
    raw.on_start = _leave_partial
    exp = _exporter(raw, tmp_path)
    (tmp_path / "t").mkdir()
    other = tmp_path / "t" / "sparsemla-1-TP-0.trace.json.gz.tmp"  # another profile's: not ours to delete
    other.write_bytes(b"x")
    snap = exp.take_snapshot()
    assert snap.outcome == "error", snap.error
    assert str(tmp_path / "t") in snap.error and "disk" in snap.error and "busy" not in snap.error
    assert f"{snap.profile_id}-TP-0.trace.json.gz.tmp" in snap.error
    assert _count(exp, "error") == 1 and _count(exp, "timeout") == 0
    assert not list((tmp_path / "t").glob(f"{snap.profile_id}*")), "the partial temp file is deleted"
    assert other.exists()


def test_enospc_in_the_stop_reply_is_an_error(raw: RawTarget, tmp_path: Path) -> None:
    msg = b"Failed: OSError: [Errno 28] No space left on device\n"
    raw.replies["/stop_profile"] = b"HTTP/1.1 500 Internal Server Error\r\nContent-Length: %d\r\n\r\n%s" % (
        len(msg),
        msg,
    )
    snap = _exporter(raw, tmp_path).take_snapshot()
    assert snap.outcome == "error" and "No space left" in snap.error and str(tmp_path / "t") in snap.error


def test_idle_server_is_still_a_timeout(raw: RawTarget, tmp_path: Path) -> None:
    snap = _exporter(raw, tmp_path).take_snapshot()
    assert snap.outcome == "timeout" and "busy" in snap.error


# -- item 13: oversized traces and --api-key -------------------------------------------------------------------------
def test_trace_over_the_decompressed_limit_is_an_error(raw: RawTarget, tmp_path: Path) -> None:
    event = {"ph": "X", "cat": "kernel", "name": "nvjet_gemm", "ts": 0, "dur": 1.0}
    bomb = gzip.compress(json.dumps({"traceEvents": [event]}).encode() + b" " * (4 << 20))  # valid JSON, 4 MiB

    def write(data: dict[str, Any]) -> None:
        (Path(data["output_dir"]) / f"{data['profile_id']}-TP-0.trace.json.gz").write_bytes(bomb)

    raw.on_start = write
    snap = _exporter(raw, tmp_path, timeout_s=2, max_trace_bytes=1 << 20).take_snapshot()
    assert snap.outcome == "error" and "MiB decompressed" in snap.error
    assert _exporter(raw, tmp_path, timeout_s=5).take_snapshot().outcome == "ok"  # the default limit reads it


def test_config_rejects_a_zero_trace_limit(raw: RawTarget) -> None:
    with pytest.raises(ValueError, match="max_trace_bytes"):
        ExporterConfig(target=raw.url, max_trace_bytes=0)


def test_api_key_is_sent_on_every_request(raw: RawTarget, tmp_path: Path) -> None:
    _exporter(raw, tmp_path, api_key="s3cret").take_snapshot()
    paths = {path for path, _ in raw.requests}
    assert {"/metrics", "/start_profile", "/stop_profile"} <= paths
    assert all(headers.get("authorization") == "Bearer s3cret" for _, headers in raw.requests)
    raw.requests.clear()
    _exporter(raw, tmp_path).take_snapshot()
    assert not any("authorization" in headers for _, headers in raw.requests)


def test_cli_profile_and_exporter_send_the_api_key(raw: RawTarget, tmp_path: Path) -> None:
    nobody = f"http://127.0.0.1:{procs.free_port()}"  # no exporter there: `profile` profiles directly
    argv = [*_sparsemla_argv("profile"), "--target", raw.url, "--exporter", nobody, "--api-key", "tok1"]
    argv += ["--timeout", "0.5", "--trace-dir", str(tmp_path / "t")]
    out = subprocess.run(argv, capture_output=True, text=True, timeout=120)
    assert out.returncode != 0  # the idle target writes no trace
    assert any(p == "/start_profile" and h.get("authorization") == "Bearer tok1" for p, h in raw.requests), out.stderr

    raw.requests.clear()
    run_dir = tmp_path / "run"
    argv = [*_sparsemla_argv("exporter"), "--target", raw.url, "--port", str(procs.free_port()), "--api-key", "tok2"]
    argv += ["--interval", "0.2", "--timeout", "0.3", "--trace-dir", str(tmp_path / "t2")]
    argv += ["--snapshot-dir", str(tmp_path / "s2")]
    procs.start("exporter", argv, run_dir=run_dir)
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not any(p == "/start_profile" for p, _ in raw.requests):
            time.sleep(0.1)
    finally:
        procs.stop("exporter", run_dir=run_dir)
    starts = [h for p, h in raw.requests if p == "/start_profile"]
    assert starts and all(h.get("authorization") == "Bearer tok2" for h in starts), procs.log_tail(
        run_dir / "exporter.log"
    )
