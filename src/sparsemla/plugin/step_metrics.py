"""Per-step latency of sglang's model forward: the ``sparsemla_decode_step_seconds`` histogram.

Hook target (sglang 0.5.23): :data:`STEP_HOOK_TARGET` = ``ModelRunner.forward``, the one call per scheduler step
that runs the model for a ``ForwardBatch`` (decode CUDA-graph replay, eager decode, extend, mixed, target-verify).
It sits under the scheduler's ``run_batch`` -> ``TpModelWorker.forward_batch_generation`` and above the attention
backend, so the time it covers is exactly the GPU work of one forward, without sampling or scheduling. The plugin
registers :func:`time_forward_step` as an AROUND hook there when ``SPARSEMLA_STEP_METRICS=1``.

Timing is GPU time between two CUDA events recorded on the current stream before and after the call. Reading an
event's time before the GPU reaches it would block the host, so nothing is read in the step that records it: the
pair is queued and the queue's completed head is drained (``Event.query()``, non-blocking) at the next steps. The
histogram therefore lags by a step or two, and no step ever waits for the GPU because of us.

Only the first tensor-parallel rank of the target model records (every rank runs the same step; eight identical
observations per step would multiply the counts), idle batches are skipped, and so are draft-model forwards of
speculative decoding. Labels: ``forward_mode`` (the ForwardMode name, lower case: ``decode``, ``extend``, ``mixed``,
``target_verify``, ...) and ``batch_bucket`` (:func:`sparsemla.metric_names.batch_bucket` of the batch size).

Multiprocess: sglang serves ``/metrics`` with prometheus_client's MultiProcessCollector over
``PROMETHEUS_MULTIPROC_DIR``. prometheus_client picks file-backed values when it is first imported with that variable
set, so the histogram (and the import) is created lazily at the first step, inside the scheduler process, long after
sglang has set the directory.
"""

from __future__ import annotations

import logging
import threading
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from sparsemla import flags
from sparsemla.metric_names import DECODE_STEP_BUCKETS, DECODE_STEP_LABELS, DECODE_STEP_SECONDS, batch_bucket

log = logging.getLogger(__name__)

STEP_HOOK_TARGET = "sglang.srt.model_executor.model_runner.ModelRunner.forward"

# Pending (not yet completed) steps kept at most; beyond that the oldest is dropped and counted (the GPU is more
# than this many steps behind the host only if something is badly wrong, and memory must stay bounded).
MAX_PENDING = 512


class PendingTiming(Protocol):
    """Start/end marks of one step; ``ready()`` must never block, ``seconds()`` is called only once ready."""

    def ready(self) -> bool: ...

    def seconds(self) -> float: ...


class StepTimer(Protocol):
    """Makes marks around a step: ``start()`` before the call, ``stop(mark)`` after it."""

    def start(self) -> Any: ...

    def stop(self, mark: Any) -> PendingTiming: ...


@dataclass
class _CudaPending:
    start: Any
    end: Any
    pool: list[Any]

    def ready(self) -> bool:
        return bool(self.end.query())

    def seconds(self) -> float:
        return self.start.elapsed_time(self.end) / 1000.0  # elapsed_time is in ms

    def release(self) -> None:
        self.pool.append(self.start)
        self.pool.append(self.end)


class CudaEventTimer:
    """CUDA events with timing on the current stream; ``query()`` polls completion without synchronising.

    Events are pooled: a read pair goes back to the pool, so steady state creates (and destroys) no CUDA event."""

    def __init__(self) -> None:
        import torch

        self._event = torch.cuda.Event
        self._pool: list[Any] = []

    def _take(self) -> Any:
        event = self._pool.pop() if self._pool else self._event(enable_timing=True)
        event.record()
        return event

    def start(self) -> Any:
        return self._take()

    def stop(self, mark: Any) -> PendingTiming:
        return _CudaPending(mark, self._take(), self._pool)


def _forward_mode_label(forward_batch: Any) -> str | None:
    """``decode``/``extend``/... from ``forward_batch.forward_mode``; None when the step must not be recorded."""
    mode = getattr(forward_batch, "forward_mode", None)
    if mode is None:
        return None
    name = str(getattr(mode, "name", mode)).lower()
    return None if name in ("idle", "prebuilt") else name


def _sglang_is_first_tp_rank(runner: Any) -> bool:
    """True on tensor-parallel rank 0 of the target model (sglang's runtime context), and outside sglang."""
    if getattr(runner, "is_draft_worker", False):
        return False
    try:
        from sglang.srt.runtime_context import get_parallel
    except ImportError:
        return True
    return getattr(get_parallel(), "tp_rank", 0) == 0


def make_histogram() -> Any:
    """The step histogram. Imported here, not at module import: see the module docstring (multiprocess mode).

    With ``PROMETHEUS_MULTIPROC_DIR`` set the values go to that directory's files and the histogram is not registered
    in this process's default registry (sglang's MultiProcessCollector reads the files); without it, it is registered
    in the default registry so a single-process server can expose it."""
    from prometheus_client import REGISTRY, Histogram

    registry = None if flags.PROMETHEUS_MULTIPROC_DIR.get() else REGISTRY
    return Histogram(
        DECODE_STEP_SECONDS,
        "GPU time of one model forward step (CUDA events), by forward mode and batch-size bucket.",
        labelnames=DECODE_STEP_LABELS,
        buckets=DECODE_STEP_BUCKETS,
        registry=registry,
    )


class StepRecorder:
    """Times forward steps and feeds the histogram lazily; one instance per process.

    ``timer`` makes the marks (CUDA events in production, a fake in CPU tests); ``histogram`` is anything with
    ``labels(forward_mode=..., batch_bucket=...).observe(seconds)``; ``should_record(runner)`` filters ranks."""

    def __init__(
        self,
        timer: StepTimer,
        histogram: Any,
        should_record: Callable[[Any], bool] = _sglang_is_first_tp_rank,
        max_pending: int = MAX_PENDING,
    ) -> None:
        self.timer = timer
        self.histogram = histogram
        self.should_record = should_record
        self.max_pending = max_pending
        self.pending: deque[tuple[PendingTiming, str, str]] = deque()
        self.observed = 0
        self.dropped = 0
        self._children: dict[tuple[str, str], Any] = {}  # labelled histogram children, looked up once

    def around(self, original: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """Run ``original(model_runner, forward_batch, ...)`` between two marks; observe completed earlier steps."""
        runner = args[0] if args else None
        forward_batch = args[1] if len(args) > 1 else kwargs.get("forward_batch")
        mode = _forward_mode_label(forward_batch)
        if mode is None or not self.should_record(runner):
            return original(*args, **kwargs)
        bucket = batch_bucket(int(getattr(forward_batch, "batch_size", 0) or 0))
        mark = self.timer.start()
        result = original(*args, **kwargs)
        # Not in a finally: a step that raised is not a step, and its end mark would time the error path.
        self.pending.append((self.timer.stop(mark), mode, bucket))
        self.drain()
        return result

    def drain(self) -> int:
        """Observe every completed step at the head of the queue (in order; stops at the first unfinished one)."""
        done = 0
        while self.pending and self.pending[0][0].ready():
            timing, mode, bucket = self.pending.popleft()
            child = self._children.get((mode, bucket))
            if child is None:
                child = self._children[(mode, bucket)] = self.histogram.labels(forward_mode=mode, batch_bucket=bucket)
            child.observe(timing.seconds())
            release = getattr(timing, "release", None)
            if release is not None:
                release()
            done += 1
        while len(self.pending) > self.max_pending:
            self.pending.popleft()
            self.dropped += 1
        self.observed += done
        return done


_recorder: StepRecorder | None = None
_recorder_lock = threading.Lock()
_disabled = False


def _get_recorder() -> StepRecorder | None:
    global _recorder, _disabled
    if _recorder is not None or _disabled:
        return _recorder
    with _recorder_lock:
        if _recorder is None and not _disabled:
            try:
                _recorder = StepRecorder(CudaEventTimer(), make_histogram())
            except Exception:  # never break serving because a metric cannot be set up
                log.exception("sparsemla: per-step metrics disabled (could not set up the recorder)")
                _disabled = True
    return _recorder


def time_forward_step(original: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """AROUND hook for :data:`STEP_HOOK_TARGET`: ``(original, model_runner, forward_batch, ...)``.

    Does nothing but call ``original`` unless ``SPARSEMLA_STEP_METRICS=1``."""
    if not flags.SPARSEMLA_STEP_METRICS.get():
        return original(*args, **kwargs)
    recorder = _get_recorder()
    if recorder is None:
        return original(*args, **kwargs)
    return recorder.around(original, *args, **kwargs)
