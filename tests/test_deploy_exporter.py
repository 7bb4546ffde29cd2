"""Kernel-share exporter: against the simulator's real /start_profile traces, and a fake server for every failure."""

from __future__ import annotations

import gzip
import json
import random
import threading
import time
import urllib.request
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from sparsemla import flags, procs
from sparsemla.metric_names import KERNEL_CATEGORIES
from sparsemla.ops.exporter import (
    ExporterConfig,
    KernelShareExporter,
    SnapshotBusy,
    _http,
)
from sparsemla.ops.stack import _sparsemla_argv


def _samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def _get(samples: dict, name: str, **labels: str) -> float | None:
    return samples.get((name, tuple(sorted(labels.items()))))


# -- the simulator ---------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def sim_profiler_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The simulator's SGLANG_TORCH_PROFILER_DIR: /start_profile accepts output_dir only inside it (as a guard)."""
    return tmp_path_factory.mktemp("sim-profiles")


@pytest.fixture(scope="module")
def sim(tmp_path_factory: pytest.TempPathFactory, sim_profiler_dir: Path) -> Iterator[str]:
    """`sparsemla sim` on a free port with SPARSEMLA_MMA_DECODE=1 (variant mma_decode)."""
    run_dir = tmp_path_factory.mktemp("sim-run")
    port = procs.free_port()
    env = flags.child_env({"SPARSEMLA_MMA_DECODE": "1", "SGLANG_TORCH_PROFILER_DIR": str(sim_profiler_dir)})
    proc = procs.start("sim", _sparsemla_argv("sim", "--port", str(port)), env=env, run_dir=run_dir)
    try:
        procs.wait_http(f"http://127.0.0.1:{port}/health", timeout=90, pid=proc.pid)
        yield f"http://127.0.0.1:{port}"
    finally:
        procs.stop("sim", run_dir=run_dir)


def _load(url: str, stop: threading.Event, rng: random.Random) -> None:
    """Keep a few generate requests running until ``stop`` (the profiler counts forward steps, so it needs load)."""
    while not stop.is_set():
        body = {"text": "hello " * rng.randint(1, 20), "sampling_params": {"max_new_tokens": 64, "ignore_eos": True}}
        try:
            _http("POST", f"{url}/generate", body, timeout=60)
        except OSError:
            time.sleep(0.1)


@pytest.fixture
def load(sim: str) -> Iterator[None]:
    stop = threading.Event()
    threads = [threading.Thread(target=_load, args=(sim, stop, random.Random(i)), daemon=True) for i in range(4)]
    for t in threads:
        t.start()
    yield
    stop.set()
    for t in threads:
        t.join(timeout=60)


def test_snapshot_from_the_simulator(sim: str, load: None, sim_profiler_dir: Path, tmp_path: Path) -> None:
    cfg = ExporterConfig(
        target=sim,
        trace_dir=sim_profiler_dir / tmp_path.name,
        snapshot_dir=tmp_path / "snaps",
        num_steps=5,
        timeout_s=60,
        top_n=3,
    )
    exp = KernelShareExporter(cfg)
    snap = exp.take_snapshot()
    assert snap.outcome == "ok", snap.error
    assert snap.variant == "mma_decode"
    assert snap.files and all(Path(f).name.startswith(snap.profile_id) for f in snap.files)
    assert sum(snap.summary["categories"].values()) == pytest.approx(1.0, abs=0.01)
    assert snap.summary["total_gpu_us"] > 0

    samples = _samples(exp.metrics_text().decode())
    shares = {
        dict(labels)["kernel"] + "/" + dict(labels)["category"]: v
        for (name, labels), v in samples.items()
        if name == "sparsemla_kernel_time_share"
    }
    assert all(dict(labels)["variant"] == "mma_decode" for (n, labels) in samples if n == "sparsemla_kernel_time_share")
    assert sum(shares.values()) == pytest.approx(1.0, abs=0.01)
    assert len([k for k in shares if not k.startswith("other/")]) == 3
    for category in KERNEL_CATEGORIES:  # per-kernel rows add up to the category share (other rows per category)
        cat = _get(samples, "sparsemla_kernel_category_share", category=category, variant="mma_decode")
        assert cat == pytest.approx(sum(v for k, v in shares.items() if k.endswith("/" + category)), abs=1e-9)
    assert _get(samples, "sparsemla_kernel_snapshots_total", outcome="ok") == 1
    assert _get(samples, "sparsemla_kernel_snapshot_timestamp_seconds", variant="mma_decode") == pytest.approx(
        snap.started_at
    )
    saved = json.loads((tmp_path / "snaps" / f"{snap.profile_id}.json").read_text())
    assert saved["outcome"] == "ok" and saved["summary"]["kernels"][0]["share"] > 0


def test_idle_server_times_out_and_the_profiler_is_stopped(sim: str, sim_profiler_dir: Path, tmp_path: Path) -> None:
    traces_dir = sim_profiler_dir / tmp_path.name
    cfg = ExporterConfig(target=sim, trace_dir=traces_dir, snapshot_dir=tmp_path / "s", num_steps=5, timeout_s=1.5)
    exp = KernelShareExporter(cfg)
    snap = exp.take_snapshot()
    assert snap.outcome == "timeout" and "no trace" in (snap.error or "")
    assert _get(_samples(exp.metrics_text().decode()), "sparsemla_kernel_snapshots_total", outcome="timeout") == 1
    # Not left running: a new profile can start (the simulator, like sglang, refuses one while another runs) ...
    status, body = _http("POST", f"{sim}/start_profile", {"output_dir": str(traces_dir / "x"), "num_steps": 1})
    assert status == 200, body
    _http("POST", f"{sim}/stop_profile")
    # ... and the partial trace /stop_profile wrote for the abandoned profile was removed.
    assert not list(traces_dir.glob(f"{snap.profile_id}*"))


# -- a fake server for the failure modes -----------------------------------------------------------------------------
class FakeServer:
    """sglang's profiling routes with scripted behaviour: what /start_profile answers and which file it writes."""

    def __init__(self, metrics: str = 'sparsemla_kernel_flags_info{variant="fake"} 1.0\n') -> None:
        self.metrics = metrics
        self.start_status = 200
        self.write: bytes | None = None  # trace content written on /start_profile (None: nothing, as an idle server)
        self.delay = 0.0
        self.starts: list[dict[str, Any]] = []
        self.stops = 0
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802
                body = fake.metrics.encode()
                self.send_response(200)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_POST(self) -> None:  # noqa: N802
                length = int(self.headers.get("Content-Length") or 0)
                data = json.loads(self.rfile.read(length) or b"{}")
                status = 200
                if self.path == "/start_profile":
                    fake.starts.append(data)
                    status = fake.start_status
                    if status == 200 and fake.write is not None:
                        threading.Thread(target=fake._write_later, args=(data,), daemon=True).start()
                elif self.path == "/stop_profile":
                    fake.stops += 1
                self.send_response(status)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def _write_later(self, data: dict[str, Any]) -> None:
        time.sleep(self.delay)
        path = Path(data["output_dir"]) / f"{data['profile_id']}-TP-0.trace.json.gz"
        path.write_bytes(self.write or b"")

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def fake() -> Iterator[FakeServer]:
    server = FakeServer()
    yield server
    server.close()


def _trace(kernels: dict[str, float]) -> bytes:
    events = [{"ph": "X", "cat": "kernel", "name": n, "ts": 0, "dur": d} for n, d in kernels.items()]
    return gzip.compress(json.dumps({"traceEvents": events}).encode())


def _exporter(fake: FakeServer, tmp_path: Path, **kw: Any) -> KernelShareExporter:
    cfg = ExporterConfig(
        target=fake.url, trace_dir=tmp_path / "t", snapshot_dir=tmp_path / "s", settle_s=0.2, poll_s=0.05, **kw
    )
    return KernelShareExporter(cfg)


def test_request_carries_sglang_profile_fields(fake: FakeServer, tmp_path: Path) -> None:
    fake.write = _trace({"nvjet_gemm": 3.0, "flash_mla_decode": 1.0})
    snap = _exporter(fake, tmp_path, num_steps=7).take_snapshot()
    assert snap.outcome == "ok" and snap.variant == "fake"
    req = fake.starts[0]
    assert req["num_steps"] == 7 and req["profile_id"] == snap.profile_id
    assert req["output_dir"] == str((tmp_path / "t").absolute()) and req["activities"] == ["GPU"]
    assert fake.stops == 0  # sglang stops by itself after num_steps; stopping it again would be an error there
    assert snap.summary["categories"]["gemm"] == pytest.approx(0.75)


@pytest.mark.parametrize(
    "content", [b"not gzip at all", gzip.compress(b'{"traceEvents": [')[:-4], _trace({})], ids=["garbage", "cut", "cpu"]
)
def test_corrupt_trace_is_counted_and_the_exporter_keeps_serving(
    fake: FakeServer, tmp_path: Path, content: bytes
) -> None:
    exp = _exporter(fake, tmp_path, timeout_s=1.5)
    fake.write = _trace({"nvjet_gemm": 1.0})
    assert exp.take_snapshot().outcome == "ok"
    fake.write = content
    snap = exp.take_snapshot()
    assert snap.outcome == "error" and snap.error
    assert fake.stops == 1  # a failed snapshot always ends with /stop_profile
    samples = _samples(exp.metrics_text().decode())
    assert _get(samples, "sparsemla_kernel_snapshots_total", outcome="error") == 1
    assert _get(samples, "sparsemla_kernel_snapshots_total", outcome="ok") == 1
    # the last good snapshot's gauges stay
    assert _get(samples, "sparsemla_kernel_category_share", category="gemm", variant="fake") == 1.0
    fake.write = _trace({"flash_mla": 1.0})
    assert exp.take_snapshot().outcome == "ok"


def test_refused_start_is_an_error_without_stop(fake: FakeServer, tmp_path: Path) -> None:
    fake.start_status = 500  # e.g. "Profiling is already in progress": someone else's profile, not ours to stop
    snap = _exporter(fake, tmp_path).take_snapshot()
    assert snap.outcome == "error" and "HTTP 500" in snap.error
    assert fake.stops == 0


def test_unreachable_server_is_an_error(tmp_path: Path) -> None:
    port = procs.free_port()
    cfg = ExporterConfig(target=f"http://127.0.0.1:{port}", trace_dir=tmp_path / "t", snapshot_dir=tmp_path / "s")
    snap = KernelShareExporter(cfg).take_snapshot()
    assert snap.outcome == "error" and snap.variant == "unknown"


def test_missing_trace_times_out_and_stops(fake: FakeServer, tmp_path: Path) -> None:
    fake.write = None
    t0 = time.monotonic()
    snap = _exporter(fake, tmp_path, timeout_s=1.0).take_snapshot()
    assert snap.outcome == "timeout" and fake.stops == 1
    assert time.monotonic() - t0 < 10


def test_slow_writer_is_waited_for(fake: FakeServer, tmp_path: Path) -> None:
    fake.write, fake.delay = _trace({"topk_kernel": 1.0}), 0.8
    snap = _exporter(fake, tmp_path, timeout_s=10).take_snapshot()
    assert snap.outcome == "ok" and snap.summary["categories"]["indexer"] == 1.0


def test_variant_change_keeps_both_variants_and_drops_stale_kernels(fake: FakeServer, tmp_path: Path) -> None:
    exp = _exporter(fake, tmp_path)
    fake.write = _trace({"kernel_a_gemm": 1.0, "kernel_b_gemm": 1.0})
    exp.take_snapshot()
    fake.write = _trace({"kernel_c_gemm": 1.0})
    exp.take_snapshot()
    fake.metrics = 'sparsemla_kernel_flags_info{variant="other_variant"} 1.0\n'
    fake.write = _trace({"kernel_d_mla": 1.0})
    exp.take_snapshot()
    samples = _samples(exp.metrics_text().decode())
    kernels = {(dict(lb)["kernel"], dict(lb)["variant"]) for (n, lb) in samples if n == "sparsemla_kernel_time_share"}
    assert kernels == {("kernel_c_gemm", "fake"), ("kernel_d_mla", "other_variant")}


def test_keep_last_n_snapshots_and_their_traces(fake: FakeServer, tmp_path: Path) -> None:
    exp = _exporter(fake, tmp_path, keep=2)
    fake.write = _trace({"nvjet": 1.0})
    snaps = [exp.take_snapshot() for _ in range(4)]
    kept = sorted(p.stem for p in (tmp_path / "s").glob("*.json"))
    assert kept == sorted(s.profile_id for s in snaps[-2:])
    assert sorted(p.name for p in (tmp_path / "t").iterdir()) == sorted(
        Path(f).name for s in snaps[-2:] for f in s.files
    )
    # a restarted exporter reloads them and republishes the newest one's gauges
    again = _exporter(fake, tmp_path, keep=2)
    assert [s.profile_id for s in again.history] == [s.profile_id for s in snaps[-2:]]
    samples = _samples(again.metrics_text().decode())
    assert _get(samples, "sparsemla_kernel_category_share", category="gemm", variant="fake") == 1.0


def test_http_routes_and_busy(fake: FakeServer, tmp_path: Path) -> None:
    exp = _exporter(fake, tmp_path, timeout_s=5)
    exp.config.port = procs.free_port()
    server = exp.serve()
    threading.Thread(target=server.serve_forever, daemon=True).start()
    base = f"http://127.0.0.1:{exp.config.port}"
    try:
        assert _http("GET", f"{base}/snapshots/latest")[0] == 404
        fake.write, fake.delay = _trace({"nvjet": 2.0, "ncclAllReduce": 2.0}), 0.5
        results: list[tuple[int, bytes]] = []
        first = threading.Thread(target=lambda: results.append(_http("POST", f"{base}/snapshot", timeout=30)))
        first.start()
        time.sleep(0.2)
        busy_status, busy_body = _http("POST", f"{base}/snapshot")
        first.join()
        assert busy_status == 409 and "already" in json.loads(busy_body)["error"]
        status, body = results[0]
        assert status == 200 and json.loads(body)["summary"]["categories"]["communication"] == 0.5
        assert json.loads(_http("GET", f"{base}/snapshots")[1])[0]["outcome"] == "ok"
        with urllib.request.urlopen(f"{base}/metrics") as resp:
            assert b"sparsemla_kernel_category_share" in resp.read()
        fake.write = None
        exp.config.timeout_s = 0.5
        status, body = _http("POST", f"{base}/snapshot")
        assert status == 504 and json.loads(body)["outcome"] == "timeout"
        assert _http("GET", f"{base}/nope")[0] == 404
        assert _http("GET", f"{base}/snapshot")[0] == 405
    finally:
        server.shutdown()
        server.server_close()


def test_take_snapshot_refuses_concurrent_calls(fake: FakeServer, tmp_path: Path) -> None:
    exp = _exporter(fake, tmp_path)
    exp._lock.acquire()
    try:
        with pytest.raises(SnapshotBusy):
            exp.take_snapshot()
    finally:
        exp._lock.release()


def test_config_rejects_bad_values(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="http"):
        ExporterConfig(target="localhost:30000")
    with pytest.raises(ValueError, match="num_steps"):
        ExporterConfig(target="http://x", num_steps=0)
