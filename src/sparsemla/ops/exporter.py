"""Kernel-share exporter: profile the server for a few steps, parse the traces, export each kernel's share of GPU time.

One snapshot (on ``POST /snapshot``, ``sparsemla profile``, or every ``interval_s`` seconds when that is > 0):

1. read the server's ``variant`` from its ``sparsemla_kernel_flags_info`` series on ``/metrics``;
2. ``POST /start_profile`` with sglang's ``ProfileReq`` fields: ``num_steps`` (sglang stops the profiler by itself after
   that many forward steps), ``output_dir`` (the trace directory, which must be the same path for the server and for
   us: a shared volume in compose), GPU activity only, a unique ``profile_id``;
3. wait until the ``<profile_id>*.trace.json.gz`` files (one per rank) exist, stop growing and parse;
4. parse them with :mod:`sparsemla.traces` and publish the gauges (names in :mod:`sparsemla.metric_names`).

The profiler counts forward steps, so an idle server writes no trace: the snapshot reads the server's activity
(:func:`read_activity`: ``sglang:forward_execution_seconds_total`` and the running / queued requests on ``/metrics``)
when it starts and when it times out, and a timeout with no forward step in between says that the server was idle
(``Snapshot.idle``; ``sparsemla profile`` exits 3 then). ``POST /snapshot`` takes an optional JSON body
``{"timeout_s": T}`` (at most the exporter's own ``--timeout``).

Failures never escape: a missing trace (``timeout``: the server then gets ``POST /stop_profile`` so the profiler is
never left running), a refused ``/start_profile``, any failure talking to the server (a dropped connection, a
malformed reply, a socket timeout), a trace the server failed to write (a partial ``*.tmp``: a full disk), or a
corrupt or oversized trace (``error``) is logged and counted in ``sparsemla_kernel_snapshots_total{outcome}``, and the
previous gauges stay. The scheduled snapshots survive every failure; ``GET /health`` answers 503 if the schedule
thread is gone anyway. The last ``keep`` snapshots are kept as
JSON files (and in ``GET /snapshots``); the trace files of older ones are deleted.
"""

from __future__ import annotations

import http.client
import json
import logging
import shutil
import threading
import time
import urllib.error
import urllib.request
from collections import deque
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from sparsemla import flags, traces
from sparsemla.metric_names import (
    KERNEL_CATEGORIES,
    KERNEL_CATEGORY_SHARE,
    KERNEL_SNAPSHOT_INTERVAL,
    KERNEL_SNAPSHOT_TIMESTAMP,
    KERNEL_SNAPSHOTS_TOTAL,
    KERNEL_TIME_SHARE,
)
from sparsemla.ports import PORT_EXPORTER
from sparsemla.variant import UNKNOWN as UNKNOWN_VARIANT
from sparsemla.variant import from_metrics as variant_from_metrics

log = logging.getLogger(__name__)

OUTCOMES = ("ok", "error", "timeout")


@dataclass
class ExporterConfig:
    """Where to profile, how long, and what to keep.

    ``trace_dir`` None means ``SGLANG_TORCH_PROFILER_DIR`` (the server's default when it gets no ``output_dir``);
    ``snapshot_dir`` None means ``<SPARSEMLA_RESULTS_DIR>/profiles``. Times are seconds."""

    target: str
    port: int = PORT_EXPORTER
    host: str = "127.0.0.1"
    interval_s: float = 0.0
    num_steps: int = 10
    trace_dir: Path | None = None
    snapshot_dir: Path | None = None
    timeout_s: float = 120.0
    settle_s: float = 1.0
    poll_s: float = 0.2
    keep: int = 20
    top_n: int = 15
    http_timeout_s: float = 30.0
    api_key: str = ""  # sent as `Authorization: Bearer ...` (sglang's --api-key) on every request to the target
    max_trace_bytes: int = traces.MAX_TRACE_BYTES

    def __post_init__(self) -> None:
        if not self.target.startswith(("http://", "https://")):
            raise ValueError(f"target must be an http(s) URL, got {self.target!r}")
        self.target = self.target.rstrip("/")
        if self.num_steps < 1:
            raise ValueError(f"num_steps must be >= 1, got {self.num_steps}")
        if self.keep < 1:
            raise ValueError(f"keep must be >= 1, got {self.keep}")
        if self.interval_s < 0 or self.timeout_s <= 0:
            raise ValueError("interval must be >= 0 and timeout > 0")
        if self.max_trace_bytes < 1:
            raise ValueError(f"max_trace_bytes must be >= 1, got {self.max_trace_bytes}")
        self.trace_dir = Path(self.trace_dir or flags.SGLANG_TORCH_PROFILER_DIR.get()).expanduser().absolute()
        self.snapshot_dir = Path(self.snapshot_dir or Path(flags.SPARSEMLA_RESULTS_DIR.get()) / "profiles").absolute()


@dataclass
class Snapshot:
    """One profiling attempt. ``summary`` (traces.TraceSummary.to_dict) is set only when ``outcome == "ok"``."""

    profile_id: str
    variant: str
    started_at: float
    outcome: str = "error"
    duration_s: float = 0.0
    error: str | None = None
    files: list[str] = field(default_factory=list)
    summary: dict[str, Any] | None = None
    idle: bool = False  # timed out and the server ran no forward step meanwhile (see read_activity)


@dataclass(frozen=True)
class Activity:
    """What the server's ``/metrics`` says it is doing: forward seconds so far (all ranks and categories), requests
    running and queued now."""

    forward_s: float
    running: float
    queued: float

    def ran_since(self, earlier: Activity) -> bool:
        """Whether a forward step ran between ``earlier`` and this reading (or requests are in flight now)."""
        return self.forward_s > earlier.forward_s or self.running > 0 or self.queued > 0


FORWARD_SECONDS = "sglang:forward_execution_seconds_total"
NUM_RUNNING, NUM_QUEUED = "sglang:num_running_reqs", "sglang:num_queue_reqs"


def parse_activity(metrics_text: str) -> Activity | None:
    """The :class:`Activity` in a ``/metrics`` text, or None when it has none of those sglang series (a server
    without ``--enable-metrics``, or text that does not parse). A declared counter without samples (sglang creates
    the labelled series at the first step) counts as zero."""
    from prometheus_client.parser import text_string_to_metric_families

    sums = {FORWARD_SECONDS: 0.0, NUM_RUNNING: 0.0, NUM_QUEUED: 0.0}
    families = {FORWARD_SECONDS.removesuffix("_total"), FORWARD_SECONDS, NUM_RUNNING, NUM_QUEUED}
    seen = False
    try:
        for family in text_string_to_metric_families(metrics_text):
            seen = seen or family.name in families
            for sample in family.samples:
                if sample.name in sums:
                    sums[sample.name] += float(sample.value)
    except (ValueError, TypeError, IndexError):
        return None
    return Activity(sums[FORWARD_SECONDS], sums[NUM_RUNNING], sums[NUM_QUEUED]) if seen else None


def read_activity(target: str, api_key: str = "", timeout: float = 10.0) -> Activity | None:
    """The target's :class:`Activity` now, or None when ``/metrics`` is unreachable or does not say."""
    try:
        status, body = _http("GET", f"{target.rstrip('/')}/metrics", timeout=timeout, api_key=api_key)
    except OSError:
        return None
    return parse_activity(body.decode(errors="replace")) if status == 200 else None


def idle_message(timeout_s: float) -> str:
    return (
        f"the server was idle: it ran no forward step in {timeout_s:g}s ({FORWARD_SECONDS} unchanged, no running or "
        "queued request). The profiler records forward steps, so an idle server writes no trace: profile while load "
        "runs (e.g. `make loadtest` in another shell)"
    )


class SnapshotBusy(RuntimeError):
    """A snapshot is already being taken (one at a time: the server has one profiler)."""


class TargetError(OSError):
    """Talking to the server failed: no connection, a dropped one, a malformed reply or a timeout (never TimeoutError,
    which means "no trace in time" in a snapshot)."""


# Markers of a failed write in a server's reply or log line (errno 28, as Python and torch print it).
_DISK_FULL_MARKERS = ("no space left", "errno 28", "enospc", "disk quota")
LOW_DISK_BYTES = 16 * 1024 * 1024  # a trace directory with less free space than this is reported as full


def _http(
    method: str, url: str, body: dict[str, Any] | None = None, timeout: float = 30.0, api_key: str = ""
) -> tuple[int, bytes]:
    """(status, body) of one request; HTTP errors are returned as their status. Every other failure (refused or dropped
    connection, a reply that is not HTTP, a cut body, a timeout) raises TargetError, an OSError."""
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, method=method)
    if data is not None:
        req.add_header("Content-Type", "application/json")
    if api_key:
        req.add_header("Authorization", f"Bearer {api_key}")
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        try:
            return exc.code, exc.read()
        except (OSError, http.client.HTTPException) as read_exc:
            raise TargetError(f"{method} {url}: HTTP {exc.code}, body unreadable ({read_exc!r})") from None
    except (OSError, http.client.HTTPException, ValueError) as exc:
        raise TargetError(f"{method} {url}: {type(exc).__name__}: {exc}") from None


class KernelShareExporter:
    """Takes snapshots and holds the gauges (its own registry; served on ``GET /metrics`` by :meth:`serve`)."""

    def __init__(self, config: ExporterConfig, clock: Callable[[], float] = time.time) -> None:
        from prometheus_client import CollectorRegistry, Counter, Gauge

        self.config = config
        self.clock = clock
        self.registry = CollectorRegistry()
        self.time_share = Gauge(
            KERNEL_TIME_SHARE,
            "Share of summed GPU kernel time of one kernel group in the last snapshot (top-N, rest as kernel=other).",
            ["kernel", "category", "variant"],
            registry=self.registry,
        )
        self.category_share = Gauge(
            KERNEL_CATEGORY_SHARE,
            "Share of summed GPU kernel time per kernel category in the last snapshot.",
            ["category", "variant"],
            registry=self.registry,
        )
        self.timestamp = Gauge(
            KERNEL_SNAPSHOT_TIMESTAMP,
            "Unix time of the last successful snapshot per variant.",
            ["variant"],
            registry=self.registry,
        )
        self.snapshots = Counter(
            KERNEL_SNAPSHOTS_TOTAL.removesuffix("_total"),
            "Snapshots attempted, by outcome (ok, error: refused or corrupt, timeout: no trace in time).",
            ["outcome"],
            registry=self.registry,
        )
        self.interval = Gauge(
            KERNEL_SNAPSHOT_INTERVAL,
            "Seconds between scheduled snapshots (0: on demand only).",
            registry=self.registry,
        )
        self.interval.set(config.interval_s)
        for outcome in OUTCOMES:  # so that rate() and increase() see a zero before the first failure
            self.snapshots.labels(outcome=outcome)
        self._series: dict[str, set[tuple[str, str]]] = {}
        self._lock = threading.Lock()
        self._schedule_thread: threading.Thread | None = None
        self.history: deque[Snapshot] = deque(maxlen=config.keep)
        self._load_history()

    # -- one snapshot -------------------------------------------------------------------------------------------------
    def take_snapshot(self, timeout_s: float | None = None) -> Snapshot:
        """Profile, parse, publish. Raises SnapshotBusy if one is running; every other failure is in the result.

        ``timeout_s`` (at most the configured ``timeout_s``) shortens this one snapshot's wait for the traces."""
        if not self._lock.acquire(blocking=False):
            raise SnapshotBusy("a snapshot is already in progress")
        try:
            wait = self.config.timeout_s if timeout_s is None else min(timeout_s, self.config.timeout_s)
            return self._take_snapshot_locked(wait)
        finally:
            self._lock.release()

    def _take_snapshot_locked(self, timeout_s: float) -> Snapshot:
        cfg = self.config
        started = self.clock()
        snap = Snapshot(profile_id=f"sparsemla-{time.time_ns()}", variant=self.read_variant(), started_at=started)
        t0 = time.monotonic()
        started_profiler = False
        before = read_activity(cfg.target, cfg.api_key, cfg.http_timeout_s)
        try:
            started_profiler = self._start_profile(snap.profile_id)
            files = self._wait_for_traces(snap.profile_id, t0 + timeout_s, timeout_s)
            snap.files = [str(f) for f in files]
            summary = traces.summarize(files, cfg.max_trace_bytes)
            snap.summary = summary.to_dict(cfg.top_n)
            snap.outcome = "ok"
            self._publish(snap.variant, summary, started)
        except TimeoutError as exc:
            snap.outcome, snap.error = "timeout", str(exc)
            after = read_activity(cfg.target, cfg.api_key, cfg.http_timeout_s) if before is not None else None
            if before is not None and after is not None and not after.ran_since(before):
                snap.idle = True
                snap.error = f"no trace of {snap.profile_id} in {cfg.trace_dir}: {idle_message(timeout_s)}"
        except (traces.TraceError, OSError, RuntimeError) as exc:
            snap.outcome, snap.error = "error", str(exc)
        except Exception as exc:  # a bug must not take the route or the schedule down: counted like any failure
            log.exception("snapshot %s: unexpected failure", snap.profile_id)
            snap.outcome, snap.error = "error", f"unexpected {type(exc).__name__}: {exc}"
        if snap.outcome != "ok":
            snap.files, snap.summary = [], None
            try:
                self._clean_up_failed(snap, started_profiler)
            except Exception as exc:  # noqa: BLE001 (logged; the snapshot's own failure is what is reported)
                log.exception("cleaning up snapshot %s failed: %s", snap.profile_id, exc)
        snap.duration_s = time.monotonic() - t0
        self.snapshots.labels(outcome=snap.outcome).inc()
        if snap.outcome == "ok":
            log.info(
                "snapshot %s (%s): %d trace files, %.1f s",
                snap.profile_id,
                snap.variant,
                len(snap.files),
                snap.duration_s,
            )
        else:
            log.warning("snapshot %s failed (%s): %s", snap.profile_id, snap.outcome, snap.error)
        self._save(snap)
        return snap

    def _clean_up_failed(self, snap: Snapshot, started_profiler: bool) -> None:
        """After a failed snapshot: stop the profiler (when we started it), turn a "timeout" whose trace the server
        could not write (a partial ``*.tmp``, a full disk, ENOSPC in /stop_profile's reply) into an ``error`` naming
        the trace directory, and delete what the profile left (traces and partial temp files of its id only)."""
        if not started_profiler:
            return
        reply = self._stop_profile()
        if snap.outcome == "timeout":
            write_error = self._write_failure(snap.profile_id, reply)
            if write_error is not None:
                snap.outcome, snap.error = "error", write_error
        self._discard(snap.profile_id)

    def _write_failure(self, profile_id: str, stop_reply: str) -> str | None:
        """Why the server could not write ``profile_id``'s trace, or None when nothing says it tried and failed."""
        trace_dir = self.config.trace_dir
        try:
            free = shutil.disk_usage(trace_dir).free
        except OSError:
            free = None
        partial = traces.find_partial_traces(trace_dir, profile_id)
        disk_full = any(m in stop_reply.lower() for m in _DISK_FULL_MARKERS)
        low = free is not None and free < LOW_DISK_BYTES
        if not (partial or disk_full or low):
            return None
        what = [f"the server failed to write the trace of {profile_id} to {trace_dir}"]
        if partial:
            sizes = ", ".join(f"{p.name} ({_size(p)} bytes)" for p in partial)
            what.append(f"it left partial temp files {sizes}")
        if free is not None:
            what.append(f"{free / 2**20:.1f} MiB free on that disk")
        if stop_reply:
            what.append(f"/stop_profile: {stop_reply[:200]}")
        return "; ".join(what) + " (is the disk of the trace directory full? free space or point --trace-dir elsewhere)"

    def read_variant(self) -> str:
        """The server's variant label, or ``unknown`` when /metrics is unreachable, malformed or has no flag series."""
        try:
            status, body = self._target("GET", "/metrics")
        except OSError as exc:
            log.warning("could not read %s/metrics: %s", self.config.target, exc)
            return UNKNOWN_VARIANT
        return variant_from_metrics(body.decode(errors="replace")) if status == 200 else UNKNOWN_VARIANT

    def _target(self, method: str, path: str, body: dict[str, Any] | None = None) -> tuple[int, bytes]:
        cfg = self.config
        return _http(method, f"{cfg.target}{path}", body, timeout=cfg.http_timeout_s, api_key=cfg.api_key)

    def _start_profile(self, profile_id: str) -> bool:
        """POST /start_profile; True when started. RuntimeError when refused (not ours to stop); OSError on a network
        error, after sending /stop_profile (the profiler may have started before the connection broke)."""
        cfg = self.config
        cfg.trace_dir.mkdir(parents=True, exist_ok=True)
        body = {
            "output_dir": str(cfg.trace_dir),
            "num_steps": cfg.num_steps,
            "activities": ["GPU"],
            "with_stack": False,
            "record_shapes": False,
            "profile_id": profile_id,
        }
        try:
            status, text = self._target("POST", "/start_profile", body)
        except OSError as exc:
            self._stop_profile()  # it may have started before the connection broke
            raise OSError(f"/start_profile failed: {exc}") from None
        if status != 200:
            raise RuntimeError(f"/start_profile answered HTTP {status}: {text.decode(errors='replace')[:300]}")
        return True

    def _stop_profile(self) -> str:
        """POST /stop_profile; returns "" on HTTP 200, else what went wrong (the reply or the network error)."""
        try:
            status, text = self._target("POST", "/stop_profile")
        except OSError as exc:
            log.warning("/stop_profile failed: %s", exc)
            return str(exc)
        reply = text.decode(errors="replace").strip()
        log.info("/stop_profile -> HTTP %s %s", status, reply[:200])
        return "" if status == 200 else f"HTTP {status} {reply}"

    def _discard(self, profile_id: str) -> None:
        """Delete the (partial) traces a failed profile left: /stop_profile writes what it had recorded, and a writer
        that failed (a full disk) leaves its ``*.tmp``. Only files of ``profile_id`` are touched."""
        directory = self.config.trace_dir
        for path in [*traces.find_traces(directory, profile_id), *traces.find_partial_traces(directory, profile_id)]:
            try:
                path.unlink(missing_ok=True)
            except OSError as exc:
                log.warning("could not delete %s: %s", path, exc)

    def _wait_for_traces(self, profile_id: str, deadline: float, timeout_s: float) -> list[Path]:
        """The profile's trace files once they exist, have stopped growing for ``settle_s`` and parse.

        TimeoutError when none appeared before ``deadline``; TraceError when they exist but never parse."""
        cfg = self.config
        last_sig: dict[Path, int] | None = None
        stable_since = 0.0
        last_error: traces.TraceError | None = None
        while True:
            now = time.monotonic()
            files = traces.find_traces(cfg.trace_dir, profile_id)
            sig = {}
            for f in files:
                try:
                    sig[f] = f.stat().st_size
                except FileNotFoundError:
                    pass
            if sig and sig == last_sig:
                if now - stable_since >= cfg.settle_s:
                    try:
                        traces.summarize(list(sig), cfg.max_trace_bytes)  # parse check; the caller parses again
                        return sorted(sig)
                    except traces.TraceError as exc:
                        last_error = exc  # maybe still being written; retried until the deadline
            else:
                last_sig, stable_since = sig, now
            if now >= deadline:
                if last_error is not None:
                    write_error = self._write_failure(profile_id, "")
                    raise traces.TraceError(f"{last_error}; {write_error}" if write_error else str(last_error))
                if sig:
                    raise traces.TraceError(f"trace files of {profile_id} still changing at the deadline: {list(sig)}")
                raise TimeoutError(
                    f"no trace of {profile_id} in {cfg.trace_dir} after {timeout_s:g}s (is the server busy? "
                    "the profiler counts forward steps, so an idle server writes nothing)"
                )
            time.sleep(cfg.poll_s)

    # -- gauges and history -------------------------------------------------------------------------------------------
    def _publish(self, variant: str, summary: traces.TraceSummary, taken_at: float) -> None:
        new = set()
        for k in summary.top(self.config.top_n, other_by_category=True):
            self.time_share.labels(kernel=k.name, category=k.category, variant=variant).set(k.share)
            new.add((k.name, k.category))
        for name, category in self._series.get(variant, set()) - new:
            self.time_share.remove(name, category, variant)
        self._series[variant] = new
        for category, share in summary.category_shares.items():
            self.category_share.labels(category=category, variant=variant).set(share)
        self.timestamp.labels(variant=variant).set(taken_at)

    def _save(self, snap: Snapshot) -> None:
        if len(self.history) == self.history.maxlen:
            self._forget(self.history[0])
        self.history.append(snap)
        path = self.config.snapshot_dir / f"{snap.profile_id}.json"
        try:
            self.config.snapshot_dir.mkdir(parents=True, exist_ok=True)
            tmp = path.with_suffix(".tmp")
            tmp.write_text(json.dumps(asdict(snap), indent=1))
            tmp.replace(path)
        except OSError as exc:
            log.warning("could not write %s: %s", path, exc)

    def _forget(self, snap: Snapshot) -> None:
        """Delete the JSON and the trace files of a snapshot that falls out of the last ``keep``."""
        for name in [*snap.files, str(self.config.snapshot_dir / f"{snap.profile_id}.json")]:
            Path(name).unlink(missing_ok=True)

    def _load_history(self) -> None:
        """Reload the kept snapshots (oldest first) after a restart; unreadable files are skipped with a warning."""
        directory = self.config.snapshot_dir
        loaded = []
        for path in sorted(directory.glob("sparsemla-*.json")) if directory.is_dir() else []:
            try:
                loaded.append(Snapshot(**json.loads(path.read_text())))
            except (OSError, ValueError, TypeError) as exc:
                log.warning("skipping unreadable snapshot %s: %s", path, exc)
        loaded.sort(key=lambda s: s.started_at)
        for snap in loaded[: max(0, len(loaded) - self.config.keep)]:
            self._forget(snap)
        self.history.extend(loaded[-self.config.keep :])
        for snap in self.history:  # republish the newest successful snapshot of each variant
            if snap.outcome == "ok" and snap.summary:
                self.timestamp.labels(variant=snap.variant).set(snap.started_at)
                for category, share in snap.summary.get("categories", {}).items():
                    if category in KERNEL_CATEGORIES:
                        self.category_share.labels(category=category, variant=snap.variant).set(share)

    # -- serving ------------------------------------------------------------------------------------------------------
    def metrics_text(self) -> bytes:
        from prometheus_client import generate_latest

        return generate_latest(self.registry)

    def serve(self) -> ThreadingHTTPServer:
        """An HTTP server (not yet serving: call ``serve_forever``) on config.host:port with the routes below."""
        server = ThreadingHTTPServer((self.config.host, self.config.port), _make_handler(self))
        server.daemon_threads = True
        return server

    def run_schedule(self, stop: threading.Event) -> None:
        """Take a snapshot every ``interval_s`` seconds until ``stop`` is set (returns at once when interval is 0).

        No failure ends the loop: each iteration's exception is logged and the next one comes on time."""
        if self.config.interval_s <= 0:
            return
        while not stop.wait(self.config.interval_s):
            try:
                self.take_snapshot()
            except SnapshotBusy:
                log.info("scheduled snapshot skipped: one is already running")
            except Exception:
                log.exception("scheduled snapshot failed; the schedule goes on")

    def start_schedule(self, stop: threading.Event) -> threading.Thread | None:
        """Run :meth:`run_schedule` in a daemon thread (None when interval is 0); ``GET /health`` watches it."""
        if self.config.interval_s <= 0:
            return None
        self._schedule_thread = threading.Thread(target=self.run_schedule, args=(stop,), daemon=True, name="schedule")
        self._schedule_thread.start()
        return self._schedule_thread

    def health(self) -> tuple[int, dict[str, Any]]:
        """(HTTP status, body) of ``GET /health``: 503 when scheduled snapshots are configured but their thread died."""
        thread = self._schedule_thread
        if thread is None:
            schedule = "off" if self.config.interval_s <= 0 else "not started"
        else:
            schedule = "running" if thread.is_alive() else "dead"
        body = {"status": "ok" if schedule != "dead" else "error", "target": self.config.target, "schedule": schedule}
        if schedule == "dead":
            body["error"] = "the schedule thread has died: no scheduled snapshot is taken (see the log); restart"
        return (200 if schedule != "dead" else 503), body


def _make_handler(exporter: KernelShareExporter) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        """GET /metrics, /health, /snapshots, /snapshots/latest; POST /snapshot (409 busy, 504 timeout, 502 error)."""

        def _send(self, status: int, body: bytes, ctype: str = "application/json") -> None:
            self.send_response(status)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def _json(self, status: int, obj: Any) -> None:
            self._send(status, json.dumps(obj).encode())

        def do_GET(self) -> None:  # noqa: N802 (http.server's naming)
            path = self.path.split("?", 1)[0].rstrip("/")
            if path == "/metrics":
                self._send(200, exporter.metrics_text(), "text/plain; version=0.0.4; charset=utf-8")
            elif path == "/health":
                self._json(*exporter.health())
            elif path == "/snapshots":
                self._json(200, [asdict(s) for s in exporter.history])
            elif path == "/snapshots/latest":
                if exporter.history:
                    self._json(200, asdict(exporter.history[-1]))
                else:
                    self._json(404, {"error": "no snapshot yet; POST /snapshot takes one"})
            elif path == "/snapshot":
                self._json(405, {"error": "use POST /snapshot to take a snapshot"})
            else:
                self._json(404, {"error": f"unknown path {path}", "paths": ["/metrics", "/snapshots", "/snapshot"]})

        def do_POST(self) -> None:  # noqa: N802
            path = self.path.split("?", 1)[0].rstrip("/")
            if path != "/snapshot":
                self._json(404, {"error": f"unknown path {path}; POST /snapshot takes a snapshot"})
                return
            try:
                timeout_s = self._timeout_from_body()
            except ValueError as exc:
                self._json(400, {"error": str(exc)})
                return
            try:
                snap = exporter.take_snapshot(timeout_s)
            except SnapshotBusy as exc:
                self._json(409, {"error": str(exc)})
                return
            except Exception as exc:  # take_snapshot reports failures in the result; this is a bug, still a reply
                log.exception("POST /snapshot failed")
                self._json(500, {"outcome": "error", "error": f"{type(exc).__name__}: {exc}"})
                return
            status = {"ok": 200, "timeout": 504}.get(snap.outcome, 502)
            self._json(status, asdict(snap))

        def _timeout_from_body(self) -> float | None:
            """``timeout_s`` of an optional JSON body ``{"timeout_s": T}`` (T > 0 seconds); ValueError otherwise."""
            length = int(self.headers.get("Content-Length") or 0)
            if length <= 0:
                return None
            if length > 4096:
                raise ValueError('the body of POST /snapshot is at most {"timeout_s": T}')
            try:
                body = json.loads(self.rfile.read(length) or b"{}")
            except json.JSONDecodeError:
                raise ValueError('the body of POST /snapshot must be JSON: {"timeout_s": T}') from None
            value = body.get("timeout_s") if isinstance(body, dict) else None
            if value is None:
                return None
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < float("inf"):
                raise ValueError(f"timeout_s must be a positive number of seconds, got {value!r}")
            return float(value)

        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 (signature of the base class)
            log.debug("%s " + format, self.address_string(), *args)

    return Handler


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return -1
