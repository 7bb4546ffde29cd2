"""The simulated scheduler: continuous batching in one asyncio task, step durations from the calibration.

Each loop iteration is one forward step, as in sglang's scheduler: admit waiting requests while the running batch has
room (``max_running_requests``) and the KV pool has tokens (``max_total_tokens``); if any running request still has
prompt tokens to prefill, run one *extend* step over up to ``chunk_tokens`` of them (chunked prefill; a request whose
prompt completes gets its first token at the end of that step); otherwise run one *decode* step that gives every
running request one token. A step lasts ``calibration`` seconds of wall time: steps are scheduled on absolute
deadlines, so a late wake-up shortens the next sleep instead of accumulating, and the lateness of every wake-up is
recorded as the step-time error (:attr:`Engine.step_error`, per forward mode).

Tokens are deterministic pseudo-text (:mod:`sparsemla.deploy.sim.tokens`): the same prompt gives the same output.
A request finishes on ``max_new_tokens`` ("length"), on a stop string ("stop", the text ends before it), or — unless
``ignore_eos`` — at its natural end of sequence ("stop", matched = the EOS id).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from sparsemla.deploy.sim import tokens
from sparsemla.deploy.sim.calibration import PrefillModel, StateCalibration


@dataclass
class SimRequest:
    """One generation request inside the engine (times are ``time.monotonic()`` seconds)."""

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
    prev_token_time: float | None = None
    finished_time: float | None = None
    prefilled: int = 0
    output_ids: list[int] = field(default_factory=list)
    text: str = ""
    finish_reason: dict | None = None
    natural_length: int = 0
    wakeup: asyncio.Event = field(default_factory=asyncio.Event)

    @property
    def prompt_len(self) -> int:
        return len(self.prompt_ids)

    @property
    def seq_len(self) -> int:
        return self.prompt_len + len(self.output_ids)

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None


@dataclass(frozen=True)
class StepRecord:
    """One executed forward step (for the profiler, metrics and the step-error statistics)."""

    mode: str  # "decode" | "extend"
    batch: int
    context: float  # mean sequence length of the batch (decode) or tokens prefilled (extend)
    tokens: int
    start: float  # monotonic seconds, ideal start
    duration: float  # calibrated duration in seconds
    lateness: float  # wall-clock wake-up minus ideal end, seconds (>= 0)


@dataclass
class StepErrorStats:
    """Relative step-time error |wake-up - ideal end| / duration over the steps since the last reset."""

    steps: int = 0
    sum_rel: float = 0.0
    max_rel: float = 0.0
    over_5pct: int = 0

    def add(self, rel: float) -> None:
        self.steps += 1
        self.sum_rel += rel
        self.max_rel = max(self.max_rel, rel)
        self.over_5pct += rel > 0.05

    def as_dict(self) -> dict[str, float]:
        mean = self.sum_rel / self.steps if self.steps else 0.0
        return {"steps": self.steps, "mean_rel_error": mean, "max_rel_error": self.max_rel,
                "steps_over_5pct": self.over_5pct}  # fmt: skip


class Engine:
    """Continuous-batching scheduler over a calibrated step-time model (see the module docstring)."""

    def __init__(
        self,
        state: StateCalibration,
        prefill: PrefillModel,
        *,
        max_running_requests: int = 256,
        max_total_tokens: int = 1_048_576,
        context_length: int = 65536,
        on_step: Callable[[StepRecord, list[SimRequest]], None] | None = None,
        on_finish: Callable[[SimRequest], None] | None = None,
    ) -> None:
        self.state = state
        self.prefill = prefill
        self.max_running_requests = max_running_requests
        self.max_total_tokens = max_total_tokens
        self.context_length = context_length
        self.on_step = on_step
        self.on_finish = on_finish
        self.waiting: deque[SimRequest] = deque()
        self.running: list[SimRequest] = []
        self.step_error = {"decode": StepErrorStats(), "extend": StepErrorStats()}
        self.total_steps = 0
        self._arrived = asyncio.Event()
        self._task: asyncio.Task | None = None
        self._ids = itertools.count()
        self._reserved_tokens = 0  # prompt + max_new of running requests (KV admission)

    # -- public API ----------------------------------------------------------------------------------------------------
    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._loop(), name="sim-engine")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    def new_rid(self) -> str:
        return f"sim-{next(self._ids):x}-{time.time_ns() & 0xFFFFFF:06x}"

    def submit(self, req: SimRequest) -> SimRequest:
        """Queue a request (the caller has validated lengths against ``context_length``)."""
        req.natural_length = tokens.natural_length(req.prompt_ids)
        self.waiting.append(req)
        self._arrived.set()
        return req

    def abort(self, req: SimRequest, message: str = "client disconnected") -> None:
        """Drop a request wherever it is and free its slot (idempotent)."""
        if req.finished:
            return
        if req in self.running:
            self.running.remove(req)
            self._reserved_tokens -= req.prompt_len + req.max_new_tokens
        else:
            with contextlib.suppress(ValueError):
                self.waiting.remove(req)
        self._finish(req, {"type": "abort", "message": message, "status_code": 499, "err_type": None}, time.monotonic())

    @property
    def used_tokens(self) -> int:
        return sum(r.prefilled + len(r.output_ids) for r in self.running)

    # -- the loop ------------------------------------------------------------------------------------------------------
    def _admit(self, now: float) -> None:
        while self.waiting and len(self.running) < self.max_running_requests:
            req = self.waiting[0]
            need = req.prompt_len + req.max_new_tokens
            if self.running and self._reserved_tokens + need > self.max_total_tokens:
                break
            self.waiting.popleft()
            req.admitted = now
            self._reserved_tokens += need
            self.running.append(req)

    async def _loop(self) -> None:
        loop = asyncio.get_running_loop()
        next_start = loop.time()
        while True:
            self._admit(time.monotonic())
            if not self.running:
                self._arrived.clear()
                await self._arrived.wait()
                next_start = loop.time()
                continue
            start = next_start  # back to back with the previous step's ideal end (idle time resets it below)
            to_prefill = [r for r in self.running if r.prefilled < r.prompt_len]
            if to_prefill:
                budget, plan = self.prefill.chunk_tokens, []
                for req in to_prefill:
                    if budget <= 0:
                        break
                    take = min(budget, req.prompt_len - req.prefilled)
                    plan.append((req, take))
                    budget -= take
                n_tokens = sum(t for _, t in plan)
                duration = self.prefill.step_seconds(n_tokens)
                batch = [r for r, _ in plan]
                mode, context = "extend", float(n_tokens)
            else:
                batch = list(self.running)
                context = sum(r.seq_len for r in batch) / len(batch)
                duration = self.state.step_seconds(len(batch), context)
                mode, n_tokens, plan = "decode", len(batch), []
            end = start + duration
            delay = end - loop.time()
            if delay > 0:
                await asyncio.sleep(delay)
            woke = loop.time()
            lateness = max(0.0, woke - end)
            self.step_error[mode].add(lateness / duration if duration > 0 else 0.0)
            self.total_steps += 1
            # Re-anchor when we fell behind by more than a step: the lost time is real (and counted above).
            next_start = end if lateness < duration else woke
            t_mono = time.monotonic()
            if mode == "extend":
                for req, take in plan:
                    if req.finished:
                        continue
                    req.prefilled += take
                    if req.prefilled >= req.prompt_len:
                        self._emit_token(req, t_mono)
            else:
                for req in batch:
                    if not req.finished:
                        self._emit_token(req, t_mono)
            if self.on_step is not None:
                rec = StepRecord(mode, len(batch), context, n_tokens, start, duration, lateness)
                self.on_step(rec, batch)

    def _emit_token(self, req: SimRequest, now: float) -> None:
        index = len(req.output_ids)
        token_id = tokens.output_token(req.prompt_ids, index)
        eos = not req.ignore_eos and index + 1 >= req.natural_length
        if eos:
            token_id = tokens.EOS_ID
        req.output_ids.append(token_id)
        if req.first_token_time is None:
            req.first_token_time = now
        req.prev_token_time, req.last_token_time = req.last_token_time, now
        finish = None
        if eos:
            finish = {"type": "stop", "matched": tokens.EOS_ID}
        elif token_id in req.stop_token_ids:
            finish = {"type": "stop", "matched": token_id}
        else:
            piece = tokens.piece(token_id)
            text = req.text + piece
            for stop in req.stop:
                pos = text.find(stop, max(0, len(req.text) - len(stop) + 1))
                if pos >= 0:
                    text, finish = text[:pos], {"type": "stop", "matched": stop}
                    break
            req.text = text
        if finish is None and len(req.output_ids) >= req.max_new_tokens:
            finish = {"type": "length", "length": req.max_new_tokens}
        if finish is not None:
            self.running.remove(req)
            self._reserved_tokens -= req.prompt_len + req.max_new_tokens
            self._finish(req, finish, now)
        else:
            req.wakeup.set()

    def _finish(self, req: SimRequest, reason: dict, now: float) -> None:
        req.finish_reason = reason
        req.finished_time = now
        req.wakeup.set()
        if self.on_finish is not None:
            self.on_finish(req)
