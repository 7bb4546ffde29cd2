"""The engine process and its front-end handle: the simulator's scheduler runs apart from the HTTP server.

Why a process: the step clock must wake within a fraction of a millisecond of each deadline, while the HTTP server
writes hundreds of SSE chunks per step. In one process they share the GIL, and a writer thread that the OS preempts
while holding it delays the clock by milliseconds. As in sglang (tokenizer manager / scheduler processes), the front
end and the scheduler talk over a socket pair:

- front end -> engine: ``("submit", EngineRequest)``, ``("abort", key)``, ``("stop",)``;
- engine -> front end: ``("ready", info)`` once, then ``("step", StepOutput)`` after every step (one message per
  step, however many requests it served) and after a submit/abort that leaves the engine idle.

:class:`EngineClient` (front end, event-loop thread) owns the :class:`SimRequest` objects: it applies each step's
tokens to them, wakes their writers and feeds the metrics with the engine's times (``StepRecord.end`` is
``time.monotonic()`` in the engine process, the same clock on Linux). The engine process ignores SIGINT/SIGTERM — the
front end drains and then stops it — and exits when the socket closes, so it never outlives the server.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from multiprocessing.connection import Connection

from sparsemla import flags
from sparsemla.ops.sim import tokens
from sparsemla.ops.sim.calibration import PrefillModel, StateCalibration
from sparsemla.ops.sim.engine import Engine, EngineRequest, StepOutput, StepRecord

SOCKET_BUFFER_BYTES = 8 << 20  # room for a few hundred step messages while the front end is busy
START_TIMEOUT_S = 60.0


@dataclass(frozen=True)
class EngineConfig:
    """Everything the engine process needs (pickled as its first message)."""

    state: StateCalibration
    prefill: PrefillModel
    max_running_requests: int
    max_total_tokens: int


@dataclass(eq=False)
class SimRequest:
    """One generation request in the front end (times are ``time.monotonic()`` seconds; token times are the
    engine's). Only the event-loop thread touches it."""

    rid: str
    prompt_ids: list[int]
    max_new_tokens: int
    ignore_eos: bool = False
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    stream: bool = False
    arrival: float = field(default_factory=time.monotonic)
    admitted: float | None = None
    first_token_time: float | None = None
    last_token_time: float | None = None
    finished_time: float | None = None
    output_ids: list[int] = field(default_factory=list)
    text: str = ""
    finish_reason: dict | None = None
    key: int = -1
    wakeup: asyncio.Event = field(default_factory=asyncio.Event)

    @property
    def prompt_len(self) -> int:
        return len(self.prompt_ids)

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None


class EngineError(RuntimeError):
    """The engine process did not start or died."""


class EngineClient:
    """Front-end handle of the engine process. ``on_step(record)``, ``on_first_token(request)`` and
    ``on_finish(request)`` run on the event loop that called :meth:`start`."""

    def __init__(
        self,
        config: EngineConfig,
        *,
        on_step: Callable[[StepRecord], None] | None = None,
        on_first_token: Callable[[SimRequest], None] | None = None,
        on_finish: Callable[[SimRequest], None] | None = None,
    ) -> None:
        self.config = config
        self.on_step, self.on_first_token, self.on_finish = on_step, on_first_token, on_finish
        self.num_running = 0
        self.num_waiting = 0
        self.used_tokens = 0
        self.total_steps = 0
        self.step_error: dict[str, dict[str, float]] = {}
        self.step_error_by_batch: dict[str, dict[str, dict[str, float]]] = {}
        self.info: dict = {}  # from the engine's "ready" message (pid, clock priority, ...)
        self.alive = False
        self._requests: dict[int, SimRequest] = {}
        self._next_key = 0
        self._ids = 0
        self._proc: subprocess.Popen | None = None
        self._conn: Connection | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    # -- lifecycle -----------------------------------------------------------------------------------------------------
    async def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        ours, theirs = socket.socketpair()
        for sock in (ours, theirs):
            for opt in (socket.SO_SNDBUF, socket.SO_RCVBUF):
                with contextlib.suppress(OSError):
                    sock.setsockopt(socket.SOL_SOCKET, opt, SOCKET_BUFFER_BYTES)
        argv = [sys.executable, "-m", "sparsemla.ops.sim.engine_proc", str(theirs.fileno())]
        self._proc = subprocess.Popen(argv, pass_fds=[theirs.fileno()], env=flags.child_env({}))
        theirs.close()
        self._conn = Connection(ours.detach())
        self._conn.send(self.config)
        conn = self._conn

        def wait_ready() -> tuple:
            if not conn.poll(START_TIMEOUT_S):
                raise EngineError(f"the engine process did not start within {START_TIMEOUT_S:.0f} s")
            return conn.recv()

        try:
            kind, info = await asyncio.to_thread(wait_ready)
        except (EOFError, OSError) as exc:
            raise EngineError(f"the engine process exited during start-up ({exc!r})") from None
        if kind != "ready":
            raise EngineError(f"unexpected first message from the engine process: {kind!r}")
        self.info, self.alive = info, True
        self._loop.add_reader(self._conn.fileno(), self._on_readable)

    async def stop(self) -> None:
        if self._conn is None:
            return
        if self._loop is not None and self.alive:
            self._loop.remove_reader(self._conn.fileno())
        with contextlib.suppress(OSError):
            self._conn.send(("stop",))
        proc, self.alive = self._proc, False
        if proc is not None:
            try:
                await asyncio.to_thread(proc.wait, 10)
            except subprocess.TimeoutExpired:
                proc.kill()
                await asyncio.to_thread(proc.wait)
        self._conn.close()
        self._conn = None
        self._fail_all("the server is shutting down")

    # -- requests (event-loop thread) ----------------------------------------------------------------------------------
    def new_rid(self) -> str:
        self._ids += 1
        return f"sim-{self._ids:x}-{time.time_ns() & 0xFFFFFF:06x}"

    @property
    def busy(self) -> bool:
        """Requests are waiting or running."""
        return bool(self._requests)

    def submit(self, req: SimRequest) -> SimRequest:
        """Queue a request (the caller has validated lengths against the context length)."""
        if not self.alive or self._conn is None:
            raise EngineError("the engine process is not running")
        self._next_key += 1
        req.key = self._next_key
        self._requests[req.key] = req
        ids = req.prompt_ids
        ereq = EngineRequest(req.key, len(ids), req.max_new_tokens, tokens.natural_length(ids), tokens.output_seed(ids),
                             req.ignore_eos, req.stop, req.stop_token_ids)  # fmt: skip
        self._conn.send(("submit", ereq))
        return req

    def abort(self, req: SimRequest, message: str = "client disconnected") -> None:
        """Drop a request wherever it is and free its slot (idempotent)."""
        if req.finished:
            return
        self._finish(req, {"type": "abort", "message": message, "status_code": 499, "err_type": None},
                     time.monotonic())  # fmt: skip
        if self.alive and self._conn is not None:
            with contextlib.suppress(OSError):
                self._conn.send(("abort", req.key))

    # -- engine messages -----------------------------------------------------------------------------------------------
    def _on_readable(self) -> None:
        conn = self._conn
        try:
            while conn is not None and conn.poll():
                kind, payload = conn.recv()
                if kind == "step":
                    self._apply(payload)
        except (EOFError, OSError):
            self._engine_died()

    def _apply(self, out: StepOutput) -> None:
        self.num_running, self.num_waiting, self.used_tokens = out.running, out.waiting, out.used_tokens
        self.step_error, self.step_error_by_batch = out.step_error, out.step_error_by_batch
        reqs = self._requests
        for key, t in out.admitted:
            req = reqs.get(key)
            if req is not None:
                req.admitted = t
        rec = out.record
        if rec is not None:
            self.total_steps = rec.index
            end = rec.end
            for key, token_id, keep, add, finish in out.tokens:
                req = reqs.get(key)
                if req is None:  # aborted here before the engine heard of it
                    continue
                req.output_ids.append(token_id)
                req.text = req.text + add if keep < 0 else req.text[:keep] + add
                req.last_token_time = end
                if req.first_token_time is None:
                    req.first_token_time = end
                    if self.on_first_token is not None:
                        self.on_first_token(req)
                if finish is not None:
                    self._finish(req, finish, end)
                else:
                    req.wakeup.set()
            if self.on_step is not None:
                self.on_step(rec)

    def _finish(self, req: SimRequest, reason: dict, now: float) -> None:
        req.finish_reason = reason
        req.finished_time = now
        self._requests.pop(req.key, None)
        req.wakeup.set()
        if self.on_finish is not None:
            self.on_finish(req)

    def _engine_died(self) -> None:
        if self._loop is not None and self._conn is not None and self.alive:
            self._loop.remove_reader(self._conn.fileno())
        if self.alive:
            print("sim: the engine process exited unexpectedly; failing its requests", file=sys.stderr)
        self.alive = False
        self._fail_all("the simulator's engine process exited")

    def _fail_all(self, message: str) -> None:
        now = time.monotonic()
        for req in list(self._requests.values()):
            self._finish(req, {"type": "abort", "message": message, "status_code": 500,
                               "err_type": "InternalServerError"}, now)  # fmt: skip


def _serve(conn: Connection) -> None:
    """The engine process: build the engine from the first message, then apply commands until stop or EOF."""
    config: EngineConfig = conn.recv()
    send_lock = threading.Lock()

    def publish(out: StepOutput) -> None:
        with send_lock:
            conn.send(("step", out))

    engine = Engine(config.state, config.prefill, publish, max_running_requests=config.max_running_requests,
                    max_total_tokens=config.max_total_tokens)  # fmt: skip
    engine.start()
    with send_lock:
        conn.send(("ready", {"pid": os.getpid(), "clock_priority": engine.wait_priority()}))
    try:
        while True:
            msg = conn.recv()
            if msg[0] == "submit":
                engine.submit(msg[1])
            elif msg[0] == "abort":
                engine.abort(msg[1])
            elif msg[0] == "stop":
                break
    except (EOFError, OSError):  # the front end is gone
        pass
    finally:
        engine.stop(timeout=5)


def main(argv: list[str] | None = None) -> None:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1 or not args[0].isdigit():
        raise SystemExit("usage: python -m sparsemla.ops.sim.engine_proc <socket fd> (started by the simulator)")
    for sig in (signal.SIGINT, signal.SIGTERM):  # the front end drains first, then stops us
        signal.signal(sig, signal.SIG_IGN)
    _serve(Connection(int(args[0])))


if __name__ == "__main__":
    main()
