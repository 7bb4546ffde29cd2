"""The simulated scheduler: continuous batching on a step clock, step durations from the calibration.

It runs in its own process (:mod:`sparsemla.ops.sim.engine_proc` starts it), as sglang's scheduler does, so the
HTTP front-end — hundreds of SSE writers — never competes with the step clock for the GIL.

Each iteration of the clock is one forward step, as in sglang's scheduler: admit waiting requests while the running
batch has room (``max_running_requests``) and the KV pool has tokens (``max_total_tokens``); if any running request
still has prompt tokens to prefill, run one *extend* step over up to ``chunk_tokens`` of them (chunked prefill; a
request whose prompt completes gets its first token at the end of that step); otherwise run one *decode* step that
gives every running request one token. A step lasts ``calibration`` seconds of wall time.

Timing. Steps are scheduled on absolute deadlines: step k ends at the ideal instant ``t0 + d_0 + ... + d_k``, so a
late wake-up shortens the next sleep instead of accumulating (after falling behind by more than a whole step the clock
re-anchors on the wall clock; the lost time stays in the statistics). At each deadline the clock thread produces the
step's tokens, all stamped with the wall clock of that moment, and publishes the whole step as ONE message
(:class:`StepOutput`). To wake on time it (a) asks for ``SCHED_FIFO`` (else a lower nice value) where the OS allows
it, (b) lowers the GIL switch interval, and (c) reserves the GIL shortly before each deadline (it wakes ``lead``
early and sleeps the rest in a C call that keeps the GIL), so the process's command thread cannot delay it.

Step-time error (:attr:`Engine.step_error`, per forward mode, and :attr:`Engine.step_error_by_batch`), measured on
the engine's own clock: the *realised* duration of a step is the wall time between the instants the engine produced
the previous step's tokens and this step's tokens (for the first step after an idle period: from the step's start).
Per step, the error is ``|realised - calibrated| / calibrated``; the statistics keep its mean and maximum, the number
of steps over 5%, the rate error ``|sum(realised) - sum(calibrated)| / sum(calibrated)`` (tokens per request per
second against the calibration) and the mean lateness of the wake-ups behind their ideal deadlines. What a client sees
on top of this is the HTTP writer's delay, which may coalesce tokens into fewer chunks but never changes when the
engine produced them.

Tokens are deterministic pseudo-text (:mod:`sparsemla.ops.sim.tokens`): the same prompt gives the same output.
A request finishes on ``max_new_tokens`` ("length"), on a stop string ("stop", the text ends before it), or — unless
``ignore_eos`` — at its natural end of sequence ("stop", matched = the EOS id).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import sys
import threading
import time
import traceback
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from sparsemla.metric_names import batch_bucket
from sparsemla.ops.sim import tokens
from sparsemla.ops.sim.calibration import PrefillModel, StateCalibration

DEFAULT_SWITCH_INTERVAL_S = 0.0005  # GIL hand-over bound inside the engine process (CPython's default is 5 ms)
MAX_SLEEP_SLICE_S = 0.05  # long steps sleep in slices so that stop() is honoured quickly
RESERVE_MIN_S, RESERVE_MAX_S = 0.0002, 0.002  # bounds of the GIL reservation lead (see Engine._sleep_until)
RESERVE_MAX_FRACTION = 0.2  # ... and at most this share of the step
CLOCK_RT_PRIORITY = 10  # SCHED_FIFO priority of the clock thread where allowed (1..99; kernel threads use 50+)
CLOCK_NICE = -10  # the fallback where only nice values may be lowered


def raise_thread_priority() -> str:
    """Best effort, for the calling thread: SCHED_FIFO (needs CAP_SYS_NICE or RLIMIT_RTPRIO), else nice -10 (needs
    CAP_SYS_NICE), else unchanged. Returns what it got. Safe for the clock thread: it sleeps between steps and works
    ~1-3 ms per step, and the kernel's RT throttling bounds any runaway anyway."""
    try:
        os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(CLOCK_RT_PRIORITY))
        return f"SCHED_FIFO {CLOCK_RT_PRIORITY}"
    except (AttributeError, OSError):
        pass
    try:
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), CLOCK_NICE)
        return f"nice {CLOCK_NICE}"
    except (AttributeError, OSError):
        return "normal"


class _Timespec(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]


def gil_holding_sleep() -> Callable[[float], None] | None:
    """``sleep_until(monotonic_deadline)`` that keeps the GIL while it sleeps (Linux), or None where unavailable.

    ``clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME)`` called through ``ctypes.PyDLL``, which, unlike ``CDLL``, does
    not release the GIL around the call; ``time.monotonic()`` reads the same clock on Linux.
    """
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.PyDLL(ctypes.util.find_library("c") or "libc.so.6")
        fn = libc.clock_nanosleep
    except (OSError, AttributeError):
        return None
    fn.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.POINTER(_Timespec), ctypes.c_void_p]
    fn.restype = ctypes.c_int
    clock_monotonic, timer_abstime, eintr = 1, 1, 4

    def sleep_until(deadline: float) -> None:
        sec = int(deadline)
        ts = _Timespec(sec, int((deadline - sec) * 1e9))
        while fn(clock_monotonic, timer_abstime, ctypes.byref(ts), None) == eintr:
            pass

    return sleep_until


@dataclass(eq=False)  # identity semantics: requests are dict keys
class EngineRequest:
    """The engine's view of one request: what scheduling and token production need (no prompt ids)."""

    key: int  # the front-end's handle
    prompt_len: int
    max_new_tokens: int
    natural_length: int  # tokens.natural_length(prompt_ids)
    seed: int  # tokens.output_seed(prompt_ids)
    ignore_eos: bool = False
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    prefilled: int = 0
    n_out: int = 0
    text: str = ""
    last_token_time: float | None = None
    finished: bool = False


@dataclass(frozen=True)
class StepRecord:
    """One executed forward step (metrics, profiler, step-error statistics). Times: ``time.monotonic()`` seconds,
    which on Linux is one clock for all processes of the machine."""

    mode: str  # "decode" | "extend"
    batch: int
    context: float  # mean sequence length of the batch (decode) or tokens prefilled (extend)
    tokens: int
    start: float  # ideal start
    duration: float  # calibrated duration
    lateness: float  # wake-up minus ideal end (>= 0)
    end: float = 0.0  # when the engine produced the step's tokens
    realised: float = 0.0  # end minus the previous step's end (or minus ``start`` after idle)
    index: int = 0  # 1-based count of steps since the engine started
    running: int = 0  # running requests after the step
    waiting: int = 0  # waiting requests after the step
    used_tokens: int = 0  # KV tokens held by running requests after the step
    # decode: (seconds since the previous token, number of requests with that gap); requests whose previous token
    # came from the same step share a gap, so this is one or a few pairs however large the batch
    itl: tuple[tuple[float, int], ...] = ()


# One produced token: (request key, token id, keep, add, finish). The request's text becomes text[:keep] + add
# (keep = -1: all of it; a stop string can cut text produced earlier); finish is None or sglang's finish_reason dict.
TokenOut = tuple[int, int, int, str, dict | None]


@dataclass(frozen=True)
class StepOutput:
    """What the engine publishes after each step (one message), or after a change while idle (``record`` None)."""

    record: StepRecord | None
    tokens: list[TokenOut]
    admitted: list[tuple[int, float]]  # (key, admission time) since the previous message
    running: int
    waiting: int
    used_tokens: int
    step_error: dict[str, dict[str, float]]
    step_error_by_batch: dict[str, dict[str, dict[str, float]]]


@dataclass
class StepErrorStats:
    """Step-time error over the steps since the engine started (see the module docstring for the definition)."""

    steps: int = 0
    sum_rel: float = 0.0
    max_rel: float = 0.0
    over_5pct: int = 0
    sum_realised: float = 0.0
    sum_calibrated: float = 0.0
    sum_lateness: float = 0.0

    def add(self, realised: float, calibrated: float, lateness: float) -> None:
        rel = abs(realised - calibrated) / calibrated if calibrated > 0 else 0.0
        self.steps += 1
        self.sum_rel += rel
        self.max_rel = max(self.max_rel, rel)
        self.over_5pct += rel > 0.05
        self.sum_realised += realised
        self.sum_calibrated += calibrated
        self.sum_lateness += lateness

    def as_dict(self) -> dict[str, float]:
        n = self.steps or 1
        rate = abs(self.sum_realised - self.sum_calibrated) / self.sum_calibrated if self.sum_calibrated else 0.0
        return {"steps": self.steps, "mean_rel_error": self.sum_rel / n, "max_rel_error": self.max_rel,
                "steps_over_5pct": self.over_5pct, "rate_error": rate, "mean_lateness_s": self.sum_lateness / n,
                "realised_seconds": self.sum_realised, "calibrated_seconds": self.sum_calibrated}  # fmt: skip


@dataclass
class _Plan:
    mode: str
    batch: list[EngineRequest]
    prefill: list[tuple[EngineRequest, int]]  # extend: (request, prompt tokens taken this step)
    context: float
    tokens: int
    duration: float


@dataclass
class _Pending:
    """Changes since the last published message (guarded by the engine lock)."""

    admitted: list[tuple[int, float]] = field(default_factory=list)
    changed: bool = False  # a submit or abort changed the counts


class Engine:
    """Continuous-batching scheduler over a calibrated step-time model (see the module docstring).

    ``publish(output)`` is called from the clock thread after every step, and after a submit or abort that leaves
    the engine idle. ``submit``/``abort`` may be called from any thread.
    """

    def __init__(
        self,
        state: StateCalibration,
        prefill: PrefillModel,
        publish: Callable[[StepOutput], None],
        *,
        max_running_requests: int = 256,
        max_total_tokens: int = 1_048_576,
        switch_interval_s: float | None = DEFAULT_SWITCH_INTERVAL_S,
        reserve_gil: bool = True,
        raise_priority: bool = True,
    ) -> None:
        self.state = state
        self.prefill = prefill
        self.publish = publish
        self.max_running_requests = max_running_requests
        self.max_total_tokens = max_total_tokens
        self.switch_interval_s = switch_interval_s
        self.raise_priority = raise_priority
        self.clock_priority = "normal"  # what raise_thread_priority got for the clock thread
        self.waiting: deque[EngineRequest] = deque()
        self.running: dict[EngineRequest, None] = {}  # insertion-ordered set
        self.step_error = {"decode": StepErrorStats(), "extend": StepErrorStats()}
        # the same per batch-size bucket (sparsemla_decode_step_seconds' batch_bucket label), e.g. ["decode"]["257+"]
        self.step_error_by_batch: dict[str, dict[str, StepErrorStats]] = {"decode": {}, "extend": {}}
        self.total_steps = 0
        self._by_key: dict[int, EngineRequest] = {}
        self._lock = threading.Lock()
        self._arrived = threading.Event()
        self._stopping = threading.Event()
        self._priority_set = threading.Event()
        self._thread: threading.Thread | None = None
        self._reserved_tokens = 0  # prompt + max_new of running requests (KV admission)
        self._used_tokens = 0  # prefilled + generated tokens of running requests
        self._pending = _Pending()
        self._hold_sleep = gil_holding_sleep() if reserve_gil else None
        self._wake_latency: deque[float] = deque(maxlen=64)  # recent GIL re-acquisition delays after a sleep

    # -- control (any thread) ------------------------------------------------------------------------------------------
    def start(self) -> None:
        if self._thread is not None:
            return
        if self.switch_interval_s is not None:
            sys.setswitchinterval(self.switch_interval_s)
        self._stopping.clear()
        self._thread = threading.Thread(target=self._run, name="sim-step-clock", daemon=True)
        self._thread.start()

    def stop(self, timeout: float | None = None) -> None:
        if self._thread is None:
            return
        self._stopping.set()
        self._arrived.set()
        self._thread.join(timeout)
        self._thread = None

    def wait_priority(self, timeout: float = 5.0) -> str:
        """The clock thread's scheduling priority once it has set it (after :meth:`start`)."""
        self._priority_set.wait(timeout)
        return self.clock_priority

    def submit(self, req: EngineRequest) -> None:
        with self._lock:
            self._by_key[req.key] = req
            self.waiting.append(req)
            self._pending.changed = True
            self._arrived.set()

    def abort(self, key: int) -> None:
        """Drop a request wherever it is and free its slot (unknown or finished keys are ignored)."""
        with self._lock:
            req = self._by_key.pop(key, None)
            if req is None or req.finished:
                return
            if req in self.running:
                self._release(req)
            else:
                self.waiting.remove(req)
            req.finished = True
            self._pending.changed = True
            self._arrived.set()  # an idle clock publishes the new counts

    # -- the step clock (its own thread) -------------------------------------------------------------------------------
    def _run(self) -> None:
        if self.raise_priority:
            self.clock_priority = raise_thread_priority()
        self._priority_set.set()
        try:
            self._clock()
        except BaseException:
            traceback.print_exc()
            raise

    def _clock(self) -> None:
        next_start: float | None = None  # ideal start of the next step when it follows the previous one directly
        prev_end = 0.0
        while not self._stopping.is_set():
            idle_output = None
            with self._lock:
                self._admit(time.monotonic())
                plan = self._plan() if self.running else None
                if plan is None:
                    if self._pending.changed or self._pending.admitted:
                        idle_output = self._output(None, [])
                    self._arrived.clear()  # under the lock: a submit after this sets it again
            if plan is None:
                if idle_output is not None:
                    self.publish(idle_output)
                self._arrived.wait()
                next_start = None
                continue
            back_to_back = next_start is not None
            start = next_start if next_start is not None else time.monotonic()
            end = start + plan.duration
            if not self._sleep_until(end, plan.duration):
                return
            woke = time.monotonic()
            realised = woke - (prev_end if back_to_back else start)
            lateness = max(0.0, woke - end)
            self.step_error[plan.mode].add(realised, plan.duration, lateness)
            bucket = batch_bucket(len(plan.batch))
            self.step_error_by_batch[plan.mode].setdefault(bucket, StepErrorStats()).add(realised, plan.duration,
                                                                                         lateness)  # fmt: skip
            with self._lock:
                produced, itl = self._produce(plan, woke)
                self.total_steps += 1
                rec = StepRecord(plan.mode, len(plan.batch), plan.context, plan.tokens, start, plan.duration, lateness,
                                 woke, realised, self.total_steps, len(self.running), len(self.waiting),
                                 self._used_tokens, tuple(itl))  # fmt: skip
                output = self._output(rec, produced)
            prev_end = woke
            # Re-anchor when we fell behind by more than a step: the lost time is real (and counted above).
            next_start = end if lateness < plan.duration else woke
            self.publish(output)

    def _output(self, rec: StepRecord | None, produced: list[TokenOut]) -> StepOutput:
        pending, self._pending = self._pending, _Pending()
        by_batch = {mode: {b: s.as_dict() for b, s in d.items()} for mode, d in self.step_error_by_batch.items()}
        return StepOutput(rec, produced, pending.admitted, len(self.running), len(self.waiting), self._used_tokens,
                          {m: s.as_dict() for m, s in self.step_error.items()}, by_batch)  # fmt: skip

    def _sleep_until(self, deadline: float, duration: float) -> bool:
        """Sleep until ``deadline`` (monotonic seconds); False when stop() was called meanwhile.

        GIL reservation: the thread wakes ``lead`` seconds early (lead ~ the 90th percentile of how late it recently
        got the interpreter back after a sleep, bounded by ``RESERVE_*``), then sleeps the rest *holding* the GIL, so
        at the deadline it runs at once instead of queueing behind the process's command thread.
        """
        lead = self._reserve_lead(duration) if self._hold_sleep is not None else 0.0
        target = deadline - lead
        slept = False
        while True:
            remaining = target - time.monotonic()
            if remaining <= 0:
                break
            if self._stopping.is_set():
                return False
            time.sleep(min(remaining, MAX_SLEEP_SLICE_S))
            slept = True
        if self._hold_sleep is not None:
            now = time.monotonic()
            if slept:
                self._wake_latency.append(now - target)
            if now < deadline:
                self._hold_sleep(deadline)
        return True

    def _reserve_lead(self, duration: float) -> float:
        recent = sorted(self._wake_latency)
        p90 = recent[int(0.9 * (len(recent) - 1))] if recent else RESERVE_MAX_S / 2
        return max(RESERVE_MIN_S, min(p90 + 0.0001, RESERVE_MAX_S, RESERVE_MAX_FRACTION * duration))

    def _admit(self, now: float) -> None:
        while self.waiting and len(self.running) < self.max_running_requests:
            req = self.waiting[0]
            need = req.prompt_len + req.max_new_tokens
            if self.running and self._reserved_tokens + need > self.max_total_tokens:
                break
            self.waiting.popleft()
            self._reserved_tokens += need
            self.running[req] = None
            self._pending.admitted.append((req.key, now))

    def _plan(self) -> _Plan:
        to_prefill = [r for r in self.running if r.prefilled < r.prompt_len]
        if to_prefill:
            budget, prefill = self.prefill.chunk_tokens, []
            for req in to_prefill:
                if budget <= 0:
                    break
                take = min(budget, req.prompt_len - req.prefilled)
                prefill.append((req, take))
                budget -= take
            n_tokens = sum(t for _, t in prefill)
            batch = [r for r, _ in prefill]
            return _Plan("extend", batch, prefill, float(n_tokens), n_tokens, self.prefill.step_seconds(n_tokens))
        batch = list(self.running)
        context = sum(r.prompt_len + r.n_out for r in batch) / len(batch)
        return _Plan("decode", batch, [], context, len(batch), self.state.step_seconds(len(batch), context))

    def _produce(self, plan: _Plan, now: float) -> tuple[list[TokenOut], list[tuple[float, int]]]:
        """Apply one finished step: the tokens it produced and its inter-token gaps."""
        produced: list[TokenOut] = []
        gaps: dict[float, int] = {}  # previous token time -> requests
        if plan.mode == "extend":
            for req, take in plan.prefill:
                if req.finished:  # aborted meanwhile
                    continue
                req.prefilled += take
                self._used_tokens += take
                if req.prefilled >= req.prompt_len:
                    produced.append(self._emit_token(req, now))
        else:
            for req in plan.batch:
                if req.finished:
                    continue
                prev = req.last_token_time
                if prev is not None:
                    gaps[prev] = gaps.get(prev, 0) + 1
                produced.append(self._emit_token(req, now))
        return produced, [(now - prev, n) for prev, n in gaps.items()]

    def _emit_token(self, req: EngineRequest, now: float) -> TokenOut:
        index = req.n_out
        eos = not req.ignore_eos and index + 1 >= req.natural_length
        token_id = tokens.EOS_ID if eos else tokens.output_token_at(req.seed, index)
        req.n_out += 1
        self._used_tokens += 1
        req.last_token_time = now
        keep, add, finish = -1, "", None
        if eos:
            finish = {"type": "stop", "matched": tokens.EOS_ID}
        elif token_id in req.stop_token_ids:
            finish = {"type": "stop", "matched": token_id}
        else:
            add = tokens.piece(token_id)
            old = len(req.text)
            text = req.text + add
            for stop in req.stop:
                pos = text.find(stop, max(0, old - len(stop) + 1))
                if pos >= 0:
                    text, finish = text[:pos], {"type": "stop", "matched": stop}
                    keep, add = (old, text[old:]) if pos >= old else (pos, "")
                    break
            req.text = text
        if finish is None and req.n_out >= req.max_new_tokens:
            finish = {"type": "length", "length": req.max_new_tokens}
        if finish is not None:
            self._release(req)
            self._by_key.pop(req.key, None)
            req.finished = True
        return (req.key, token_id, keep, add, finish)

    def _release(self, req: EngineRequest) -> None:
        del self.running[req]
        self._reserved_tokens -= req.prompt_len + req.max_new_tokens
        self._used_tokens -= req.prefilled + req.n_out
