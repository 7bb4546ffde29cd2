"""Locust LLM user: streams chat / completions / native generate requests and measures TTFT, every ITL gap, TPOT, E2E.

Run it through `sparsemla loadtest` (which adds warmup exclusion, the summary and progress), or directly::

    locust -f src/sparsemla/loadtest/locustfile.py --host http://127.0.0.1:30000 \
        --llm-workload random:512:256 -u 64 -r 64

Why not Locust's own response time: with a streamed body it stops at the response headers (and it is rounded above
100 ms), so every latency here is timed in the SSE loop, from ``time.perf_counter()`` at send to each line's kernel
receive time (:mod:`sparsemla.loadtest.stamped_reader`), and reported through Locust's request event under custom
request types ``TTFT``, ``ITL``, ``TPOT`` and ``E2E`` (``response_length`` of ``E2E`` is the
output token count; a failed request is one failed ``E2E`` whose message starts with its kind: ``[connection]``,
``[http_error]``, ``[timeout]`` or ``[sse]``; its ``response_length`` is 0: tokens of a failed request are not
output anyone can use, so they count nowhere as throughput). After two failures in a row a user backs off before its
next request (:mod:`sparsemla.loadtest.backoff`: 50 ms doubling up to 2 s, reset by a success), so a dead or failing
server is not flooded with instant failures. The API key comes from ``SPARSEMLA_LOADTEST_API_KEY`` (the runner sets
it in Locust's environment, never on its command line). With ``--llm-parent-pid`` the process, and every worker of
``--processes``, dies with its parent (:func:`sparsemla.procs.die_with_parent`): a killed `sparsemla sweep` leaves
no Locust behind. The exact per-request values also go to ``--llm-records`` (JSONL, see
:mod:`sparsemla.loadtest.records`), written by the local runner or by the master from its workers' reports, and to
the client Prometheus metrics (:mod:`sparsemla.loadtest.client_metrics`).
"""

from __future__ import annotations

import itertools
import json
import logging
import os
import socket
import time
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import Any

import gevent
from geventhttpclient.response import HTTPParseError
from locust import FastHttpUser, constant, events, task
from locust.runners import MasterRunner, WorkerRunner

from sparsemla import flags
from sparsemla.loadtest import client_metrics as cm
from sparsemla.loadtest.backoff import backoff_s
from sparsemla.loadtest.records import RequestRecord
from sparsemla.loadtest.sse import (
    ConnectionFailure,
    HttpFailure,
    SSEFailure,
    StreamFailure,
    TimeoutFailure,
    TokenStream,
    build_request,
)
from sparsemla.loadtest.stamped_reader import StampedLines
from sparsemla.loadtest.workload import DEFAULT_WORKLOAD, parse_workload, user_rng
from sparsemla.procs import can_die_with_parent, die_with_parent

log = logging.getLogger("sparsemla.loadtest")
_USER_IDS = itertools.count()
_IMPORT_PID = os.getpid()  # Locust imports this file before `--processes` forks: in a forked worker, the master's PID
_FORKED_BY = [0]  # PID of the process that called fork(); the child reads its copy


def _arm_forked_worker() -> None:
    # A worker of `--processes` blocks in Locust's connect_to_master (5 s per try, up to 60 tries) before the init
    # event fires, so arming there would leave a worker whose master died early running for minutes: arm at the
    # fork instead. Only children forked by the importing process itself (a grandchild's parent is someone else).
    if _FORKED_BY[0] == _IMPORT_PID:
        die_with_parent(_IMPORT_PID)


def _note_fork() -> None:
    _FORKED_BY[0] = os.getpid()


if hasattr(os, "register_at_fork") and can_die_with_parent():  # Linux only: prctl(PR_SET_PDEATHSIG)
    os.register_at_fork(before=_note_fork, after_in_child=_arm_forked_worker)


@events.init_command_line_parser.add_listener
def _add_arguments(parser: Any) -> None:
    group = parser.add_argument_group("sparsemla LLM user")
    group.add_argument("--llm-api", choices=["chat", "completions", "generate"], default="chat", help="API to stream.")
    group.add_argument("--llm-workload", default=DEFAULT_WORKLOAD, help="random:IN:OUT[:R] | sharegpt:PATH[:OUT] | ...")
    group.add_argument("--llm-seed", type=int, default=0, help="Workload seed (same seed, same requests).")
    group.add_argument("--llm-model", default="default", help="`model` field of OpenAI requests.")
    group.add_argument("--llm-ignore-eos", choices=["true", "false"], default="true", help="Generate max_tokens.")
    group.add_argument("--llm-max-tokens", type=int, default=0, help="Override max_tokens (0: workload's).")
    group.add_argument("--llm-temperature", type=float, default=0.0)
    group.add_argument("--llm-request-timeout", type=float, default=600.0, help="Seconds before a request times out.")
    group.add_argument("--llm-warmup", type=float, default=0.0, help="Seconds after start excluded from Locust stats.")
    group.add_argument("--llm-duration", type=float, default=0.0, help="Measured seconds after warmup, then quit.")
    group.add_argument("--llm-records", default="", help="JSONL file of per-request measurements (master/local).")
    group.add_argument("--llm-timeline", default="", help="JSON file with test start / measure start / stop times.")
    group.add_argument("--llm-run-id", default="adhoc", help="`run_id` label of the client metrics.")
    group.add_argument("--llm-concurrency", default="", help="`concurrency` label (default: the user count).")
    group.add_argument("--llm-variant", default="unknown", help="`variant` label (the server's kernel variant).")
    group.add_argument("--llm-metrics-port", type=int, default=9646, help="Client metrics port (0: off).")
    group.add_argument("--llm-parent-pid", type=int, default=0, help="Die with this parent process (0: do not).")


class _Sink:
    """Where finished records go: a file (local runner, master) or the next report to the master (worker)."""

    def __init__(self) -> None:
        self.file: Any = None
        self.buffer: list[dict[str, Any]] = []
        self.forward = False
        self.count = 0

    def open(self, path: str) -> None:
        if path:
            Path(path).parent.mkdir(parents=True, exist_ok=True)
            self.file = open(path, "a", buffering=1)  # noqa: SIM115 (line-buffered; closed at quit)

    def write(self, record: dict[str, Any]) -> None:
        self.count += 1
        if self.forward:
            self.buffer.append(record)
        elif self.file is not None:
            self.file.write(json.dumps(record, separators=(",", ":")) + "\n")

    def write_many(self, records: list[dict[str, Any]]) -> None:
        for record in records:
            self.write(record)

    def flush(self) -> None:
        if self.file is not None:
            self.file.flush()

    def close(self) -> None:
        if self.file is not None:
            self.file.close()
            self.file = None


_SINK = _Sink()
_TIMELINE: dict[str, Any] = {}


class _Bookkeeping:
    """Runs the per-request bookkeeping (Locust events, client metrics, the record line) when the gevent loop is idle.

    Why: all users share one thread, so whatever a greenlet does between two reads delays the moment every other
    greenlet can timestamp a chunk that has already arrived. Finishing a request costs ~0.3 ms (a dozen Locust events,
    a dozen histogram observations in multiprocess mode, one JSON line); at C=64 users in lockstep that pushed the
    last chunks' timestamps back by tens of milliseconds (measured against the fixture server's own send times).
    Deferred to idle time, it no longer sits between a chunk's arrival and its timestamp. A backlog of more than
    ``max_backlog`` requests (a client that never idles) is worked off without waiting, and :meth:`drain` runs
    whatever is left before records are reported or the file is closed."""

    def __init__(self, max_backlog: int = 512) -> None:
        self.queue: deque[tuple[Callable[..., None], tuple[Any, ...]]] = deque()
        self.max_backlog = max_backlog
        self.worker: gevent.Greenlet | None = None

    def submit(self, fn: Callable[..., None], *args: Any) -> None:
        self.queue.append((fn, args))
        if self.worker is None or self.worker.dead:
            self.worker = gevent.spawn(self._run)

    def _run(self) -> None:
        while self.queue:
            if len(self.queue) <= self.max_backlog:
                gevent.idle()
            if self.queue:
                fn, args = self.queue.popleft()
                fn(*args)

    def drain(self) -> None:
        while self.queue:
            fn, args = self.queue.popleft()
            fn(*args)


_BOOKKEEPING = _Bookkeeping()


def _write_timeline(options: Any) -> None:
    path = getattr(options, "llm_timeline", "")
    if not path:
        return
    tmp = Path(f"{path}.tmp")
    tmp.write_text(json.dumps(_TIMELINE, indent=1))
    tmp.replace(path)


@events.init.add_listener
def _on_init(environment: Any, **_: Any) -> None:
    options = environment.parsed_options
    if options is None:
        return
    runner = environment.runner
    if os.getpid() == _IMPORT_PID and options.llm_parent_pid:  # workers of `--processes` were armed at the fork
        die_with_parent(options.llm_parent_pid)
    if isinstance(runner, WorkerRunner):
        _SINK.forward = True
        if cm.multiprocess_dir() is None and options.llm_metrics_port:
            # one registry per process: each worker serves its own port once it knows its index
            @events.test_start.add_listener
            def _serve_worker(**_kw: Any) -> None:
                if not _TIMELINE.get("worker_serving"):
                    _TIMELINE["worker_serving"] = cm.serve(options.llm_metrics_port + 1 + runner.worker_index)

        @events.report_to_master.add_listener
        def _report(client_id: str, data: dict[str, Any]) -> None:
            _BOOKKEEPING.drain()
            if _SINK.buffer:
                data["llm_records"], _SINK.buffer = _SINK.buffer, []

        return
    _SINK.open(options.llm_records)
    if options.llm_metrics_port:
        cm.serve(options.llm_metrics_port)
    if isinstance(runner, MasterRunner):

        @events.worker_report.add_listener
        def _collect(client_id: str, data: dict[str, Any]) -> None:
            _SINK.write_many(data.get("llm_records") or [])


@events.test_start.add_listener
def _on_test_start(environment: Any, **_: Any) -> None:
    if isinstance(environment.runner, WorkerRunner):
        return
    options = environment.parsed_options
    _TIMELINE.update({"test_start": time.time(), "pid": os.getpid()})
    _write_timeline(options)
    warmup = getattr(options, "llm_warmup", 0.0) if options else 0.0

    def _end_warmup() -> None:
        if warmup > 0:
            gevent.sleep(warmup)
        environment.runner.stats.reset_all()  # Locust's CSV/HTML then cover the measured window only
        _TIMELINE["measure_start"] = time.time()
        _write_timeline(options)
        duration = getattr(options, "llm_duration", 0.0) if options else 0.0
        if duration > 0:  # end exactly `duration` after warmup (Locust's -t counts from before the spawn)
            gevent.sleep(duration)
            environment.runner.quit()

    gevent.spawn(_end_warmup)


@events.test_stopping.add_listener
def _on_test_stopping(environment: Any, **_: Any) -> None:
    if isinstance(environment.runner, WorkerRunner) or "stop" in _TIMELINE:
        return
    _TIMELINE["stop"] = time.time()
    _write_timeline(environment.parsed_options)


@events.quitting.add_listener
def _on_quitting(environment: Any, **_: Any) -> None:
    if isinstance(environment.runner, WorkerRunner):
        return
    _TIMELINE.setdefault("stop", time.time())
    _TIMELINE["quit"] = time.time()
    _BOOKKEEPING.drain()
    _TIMELINE["records"] = _SINK.count
    _SINK.flush()
    _SINK.close()
    _write_timeline(environment.parsed_options)


def _unwrap(exc: BaseException) -> BaseException:
    seen = {id(exc)}
    while (inner := getattr(exc, "original", None)) is not None and id(inner) not in seen:
        seen.add(id(inner))
        exc = inner
    return exc


def classify(exc: BaseException, timeout: gevent.Timeout | None = None) -> StreamFailure:
    """Map whatever the HTTP client raised to a StreamFailure of the right kind."""
    exc = _unwrap(exc)
    if isinstance(exc, StreamFailure):
        return exc
    if exc is timeout or isinstance(exc, (gevent.Timeout, socket.timeout, TimeoutError)):
        return TimeoutFailure(f"no complete answer within the timeout ({type(exc).__name__})")
    code = getattr(exc, "code", None)
    if isinstance(code, int) and code >= 300:
        return HttpFailure(f"HTTP {code}")
    if isinstance(exc, (HTTPParseError, OSError, ConnectionError)) or "ConnectionError" in type(exc).__name__:
        return ConnectionFailure(f"{type(exc).__name__}: {exc}")
    return ConnectionFailure(f"unexpected {type(exc).__name__}: {exc}")


class LLMUser(FastHttpUser):
    """One simulated client that sends one streaming request at a time, back to back (fixed concurrency = users)."""

    wait_time = constant(0)
    network_timeout = 600.0
    connection_timeout = 30.0

    def __init__(self, environment: Any) -> None:
        options = environment.parsed_options
        type(self).network_timeout = float(options.llm_request_timeout)
        super().__init__(environment)
        self.options = options
        self.workload = parse_workload(options.llm_workload, options.llm_seed)
        worker_index = getattr(environment.runner, "worker_index", 0) or 0
        self.user_index = next(_USER_IDS)
        self.rng = user_rng(options.llm_seed, worker_index, self.user_index)
        self.sent = 0
        self.failures_in_a_row = 0
        concurrency = options.llm_concurrency or str(environment.runner.target_user_count or "")
        self.labels = (options.llm_run_id, concurrency, options.llm_variant)
        self.headers = {
            "Content-Type": "application/json",
            "Accept": "text/event-stream",
            "Accept-Encoding": "identity",
        }
        api_key = flags.SPARSEMLA_LOADTEST_API_KEY.get()
        if api_key:
            self.headers["Authorization"] = f"Bearer {api_key}"
        self.url = f"{self.host.rstrip('/')}"

    def on_start(self) -> None:
        cm.USERS.labels(*self.labels).inc()

    def on_stop(self) -> None:
        cm.USERS.labels(*self.labels).dec()

    @task
    def stream_one(self) -> None:
        pause = backoff_s(self.failures_in_a_row)
        if pause > 0:
            gevent.sleep(pause)
        options = self.options
        spec = self.workload.sample(self.rng)
        if options.llm_max_tokens > 0:
            spec = type(spec)(spec.prompt, spec.prompt_tokens, options.llm_max_tokens)
        path, body = build_request(
            options.llm_api,
            spec,
            model=options.llm_model,
            ignore_eos=options.llm_ignore_eos == "true",
            temperature=options.llm_temperature,
        )
        payload = json.dumps(body).encode()
        self.sent += 1
        request_id = f"{os.getpid():x}-{self.user_index}-{self.sent}"
        headers = {**self.headers, "X-Request-Id": request_id}  # lets server logs be joined with requests.jsonl
        wall = time.time()
        t0 = time.perf_counter()
        # The de-facto queue-time header (`t=<unix microseconds>`): lets a server or proxy see client-side queueing.
        headers["X-Request-Start"] = f"t={int(wall * 1e6)}"
        stream = TokenStream(options.llm_api, t0)
        failure: StreamFailure | None = None
        cut = False
        timeout = gevent.Timeout(options.llm_request_timeout)
        timeout.start()
        end = t0
        try:
            resp = self.client.client.urlopen(self.url + path, method="POST", payload=payload, headers=headers)
            lines = StampedLines(resp._response, wall, t0)  # kernel receive times: immune to our own scheduling
            while True:
                line, now = lines.readline()
                if not line:
                    break
                stream.feed(line, now)
                if stream.done and end == t0:
                    end = now
            if not stream.done:
                raise SSEFailure(f"stream ended before [DONE] after {len(stream.chunk_times)} output chunks")
        except gevent.GreenletExit:
            cut = True
            raise
        except BaseException as exc:  # noqa: BLE001 (every failure is classified and counted)
            failure = classify(exc, timeout)
        finally:
            self.failures_in_a_row = self.failures_in_a_row + 1 if failure is not None else 0
            timeout.cancel()
            if end == t0:
                end = time.perf_counter()
            _BOOKKEEPING.submit(self._finish, request_id, spec.prompt_tokens, wall, t0, end, stream, failure, cut)

    def _fire(self, request_type: str, seconds: float, length: int = 0, exception: Exception | None = None) -> None:
        """One Locust request event named after the API (response_time in ms, as Locust's stats expect)."""
        self.environment.events.request.fire(
            request_type=request_type,
            name=self.options.llm_api,
            response_time=seconds * 1000,
            response_length=length,
            exception=exception,
            context={},
        )

    def _finish(
        self,
        request_id: str,
        prompt_tokens: int,
        wall: float,
        t0: float,
        end: float,
        stream: TokenStream,
        failure: StreamFailure | None,
        cut: bool,
    ) -> None:
        record = RequestRecord(
            request_id=request_id,
            start=wall,
            offsets=[t - t0 for t in stream.chunk_times],
            chunk_tokens=list(stream.chunk_tokens),
            output_tokens=stream.output_tokens,
            prompt_tokens=stream.usage_prompt_tokens or prompt_tokens,
            e2e=end - t0,
            error=failure.kind if failure else None,
            message=str(failure) if failure else None,
            cut=cut,
        )
        _SINK.write(record.to_json())
        if cut:
            return  # the test ended mid-stream: neither a success nor a failure
        if failure is not None:  # its tokens are no output: response_length 0, no output-token count
            self._fire("E2E", record.e2e, 0, failure)
            cm.REQUESTS.labels(*self.labels, failure.kind).inc()
            return
        ttft = record.ttft
        if ttft is not None:
            self._fire("TTFT", ttft)
            cm.TTFT.labels(*self.labels).observe(ttft)
        itl_hist = cm.ITL.labels(*self.labels)
        for gap in record.itls():
            self._fire("ITL", gap)
            itl_hist.observe(gap)
        tpot = record.tpot
        if tpot is not None:
            self._fire("TPOT", tpot)
            cm.TPOT.labels(*self.labels).observe(tpot)
        self._fire("E2E", record.e2e, record.output_tokens)
        cm.E2E.labels(*self.labels).observe(record.e2e)
        cm.OUTPUT_TOKENS.labels(*self.labels).inc(record.output_tokens)
        cm.REQUESTS.labels(*self.labels, "ok").inc()
