"""`/start_profile` + `/stop_profile` of the simulator: gzip chrome traces named and shaped like sglang's.

File names follow sglang 0.5.23's ``ProfilerManager``: ``[<profile_prefix>-]<profile_id>-TP-0[-EXTEND|-DECODE]
.trace.json.gz`` under ``output_dir`` (default ``SGLANG_TORCH_PROFILER_DIR``). Each recorded forward step adds one
``{"ph": "X", "cat": "kernel", ...}`` event per kernel launch on GPU 0 / stream 7, back to back from the step's start;
a kernel's launches share its calibrated per-step time equally, so kernel shares computed from the trace equal the
calibration's shares. Prefill (extend) steps reuse the decode kernel mix at their batch size, scaled to the prefill
step time (the calibration has no prefill breakdown). A step annotation (``cat: "user_annotation"``) covers each step.

Unlike sglang, ``output_dir`` must be the profiler directory (``SGLANG_TORCH_PROFILER_DIR``) or below it (a relative
one is taken relative to it; symlinks are followed before the check), and ``profile_id`` / ``profile_prefix`` must be
plain file names: a request cannot make the server write elsewhere. A trace that cannot be written (disk full) leaves
no partial ``.tmp`` file; the failure is logged and ``/stop_profile`` answers it (500, sglang's error shape).
"""

from __future__ import annotations

import contextlib
import gzip
import json
import logging
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sparsemla.ops.sim.calibration import StateCalibration
from sparsemla.ops.sim.engine import StepRecord

log = logging.getLogger("sparsemla.sim")
MAX_RECORDED_STEPS = 200  # per stage; bounds trace size when a client never calls /stop_profile
GPU_PID, GPU_STREAM = 0, 7
MAX_KEPT_ERRORS = 20  # unreported write failures kept for /stop_profile
MAX_NAME_BYTES = 255  # a file name component on Linux file systems


class ProfileError(ValueError):
    """A profile request that cannot be honoured (already running, not running, bad directory or name)."""


def _plain_name(value: str, what: str) -> str:
    """``value`` if it can be one component of a file name (no separator, NUL, ``.`` or ``..``)."""
    if not value or "/" in value or "\x00" in value or value in (".", ".."):
        raise ProfileError(f"{what} must be a plain file name (no '/', NUL, '.' or '..'), got {value!r}")
    return value


@dataclass
class _Stage:
    name: str | None  # None (one trace) | "EXTEND" | "DECODE"
    events: list[dict[str, Any]] = field(default_factory=list)
    steps: int = 0
    done: bool = False


@dataclass
class ProfileSession:
    output_dir: Path
    profile_id: str
    prefix: str
    num_steps: int | None
    start_step: int | None
    stages: dict[str, _Stage]
    written: list[Path] = field(default_factory=list)

    def filename(self, stage: _Stage) -> str:
        stem = f"{self.prefix}-" if self.prefix else ""
        suffix = f"-{stage.name}" if stage.name else ""
        return f"{stem}{self.profile_id}-TP-0{suffix}.trace.json.gz"


class Profiler:
    """Records kernel events of simulated steps between start and stop; writes the traces."""

    def __init__(self, state: StateCalibration, metadata: dict[str, Any], default_dir: str) -> None:
        self.state = state
        self.metadata = metadata
        self.default_dir = default_dir
        self.session: ProfileSession | None = None
        self.write_errors: list[str] = []
        self._correlation = 0

    @property
    def active(self) -> bool:
        return self.session is not None

    def start(
        self,
        output_dir: str | None = None,
        num_steps: int | None = None,
        start_step: int | None = None,
        profile_by_stage: bool = False,
        profile_id: str | None = None,
        profile_prefix: str | None = None,
        profile_stages: list[str] | None = None,
    ) -> ProfileSession:
        if self.session is not None:
            raise ProfileError("Profiling is already in progress. Call /stop_profile first.")
        if num_steps is not None and num_steps < 1:
            raise ProfileError(f"num_steps must be >= 1, got {num_steps}")
        directory = self.resolve_output_dir(output_dir)
        pid = _plain_name(profile_id or str(time.time()), "profile_id")
        prefix = _plain_name(profile_prefix, "profile_prefix") if profile_prefix else ""
        longest = f"{prefix}-{pid}-TP-0-EXTEND.trace.json.gz.tmp"
        if len(longest.encode()) > MAX_NAME_BYTES:
            raise ProfileError(f"profile_prefix + profile_id are too long for a file name ({len(longest.encode())} "
                               f"> {MAX_NAME_BYTES} bytes)")  # fmt: skip
        try:
            directory.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise ProfileError(f"cannot create output_dir {str(directory)!r}: {exc.strerror or exc}") from None
        if not os.access(directory, os.W_OK):
            raise ProfileError(f"output_dir {str(directory)!r} is not writable")
        if profile_by_stage:
            wanted = [s.upper() for s in (profile_stages or ["EXTEND", "DECODE"])]
            bad = [s for s in wanted if s not in ("EXTEND", "DECODE")]
            if bad:
                raise ProfileError(f"unknown profile_stages {bad}; use EXTEND and/or DECODE")
            stages = {s: _Stage(s) for s in wanted}
        else:
            stages = {"ALL": _Stage(None)}
        self.session = ProfileSession(directory, pid, prefix, num_steps, start_step, stages)
        return self.session

    def resolve_output_dir(self, output_dir: str | None) -> Path:
        """``output_dir`` (absolute, or relative to the profiler directory) resolved, symlinks followed; it must be
        the profiler directory or below it."""
        root = Path(self.default_dir).absolute()
        if not output_dir:
            return root
        if "\x00" in output_dir:
            raise ProfileError("output_dir must not contain a NUL character")
        path = Path(output_dir)
        resolved = (path if path.is_absolute() else root / path).resolve()
        real_root = root.resolve()
        if resolved != real_root and real_root not in resolved.parents:
            raise ProfileError(f"output_dir {output_dir!r} is outside the profiler directory {str(root)!r} "
                               "(SGLANG_TORCH_PROFILER_DIR); use it or a subdirectory of it")  # fmt: skip
        return resolved

    def take_errors(self) -> list[str]:
        """Trace writes that failed since the last call (each already logged; its partial file removed)."""
        errors, self.write_errors = self.write_errors, []
        return errors

    def record(self, rec: StepRecord, total_steps: int) -> list[_Stage]:
        """Add one step's events; returns stages that just completed ``num_steps`` (the caller writes them)."""
        sess = self.session
        if sess is None or (sess.start_step is not None and total_steps < sess.start_step):
            return []
        key = "ALL" if "ALL" in sess.stages else ("DECODE" if rec.mode == "decode" else "EXTEND")
        stage = sess.stages.get(key)
        if stage is None or stage.done or stage.steps >= MAX_RECORDED_STEPS:
            return []
        stage.steps += 1
        stage.events.extend(self._step_events(rec, stage.steps))
        if sess.num_steps is not None and stage.steps >= sess.num_steps:
            stage.done = True
            return [stage]
        return []

    def _step_events(self, rec: StepRecord, index: int) -> list[dict[str, Any]]:
        wall_start_us = (time.time() - (time.monotonic() - rec.start)) * 1e6
        times = self.state.kernel_times_us(max(rec.batch, 1), rec.context if rec.mode == "decode" else 4096)
        scale = 1.0
        if rec.mode != "decode":
            total = sum(times.values()) or 1.0
            scale = rec.duration * 1e6 / total
        step_name = f"{rec.mode} step #{index} batch={rec.batch}"
        events = [{"ph": "X", "cat": "user_annotation", "name": step_name, "pid": os.getpid(), "tid": 1,
                   "ts": round(wall_start_us, 3), "dur": round(rec.duration * 1e6, 3)}]  # fmt: skip
        calls = {k.name: k.calls_per_step for k in self.state.kernels}
        ts = wall_start_us
        for i in range(max(calls.values())):  # interleave launches layer by layer
            for k in self.state.kernels:
                if i >= k.calls_per_step:
                    continue
                dur = times[k.name] * scale / k.calls_per_step
                self._correlation += 1
                events.append({"ph": "X", "cat": "kernel", "name": k.name, "pid": GPU_PID, "tid": GPU_STREAM,
                               "ts": round(ts, 3), "dur": round(dur, 3),
                               "args": {"device": 0, "stream": GPU_STREAM, "correlation": self._correlation,
                                        "category": k.category}})  # fmt: skip
                ts += dur
        return events

    def stop(self) -> ProfileSession:
        """End the session; the caller writes the remaining stages with :func:`write_stage`."""
        if self.session is None:
            raise ProfileError("Profiling is not in progress. Call /start_profile first.")
        sess, self.session = self.session, None
        return sess

    def trace_document(self, stage: _Stage) -> dict[str, Any]:
        meta = [
            {"ph": "M", "name": "process_name", "pid": GPU_PID, "args": {"name": "GPU 0"}},
            {"ph": "M", "name": "thread_name", "pid": GPU_PID, "tid": GPU_STREAM, "args": {"name": "stream 7"}},
        ]
        return {
            "schemaVersion": 1,
            "deviceProperties": [{"id": 0, "name": self.metadata.get("gpu", "simulated GPU")}],
            "displayTimeUnit": "ms",
            "traceName": "sparsemla sim",
            "sparsemla_sim": {**self.metadata, "stage": stage.name, "steps": stage.steps},
            "traceEvents": meta + stage.events,
        }


def write_stage(profiler: Profiler, sess: ProfileSession, stage: _Stage) -> Path | None:
    """Write one stage's trace (gzip JSON, through a ``.tmp`` file renamed into place) and record its path in the
    session. A write that fails (a full disk, a vanished directory, ...) removes its partial file, is logged and
    kept in ``profiler.write_errors`` for ``/stop_profile`` to report; it returns None and the stage is dropped."""
    path = sess.output_dir / sess.filename(stage)
    tmp = path.with_name(path.name + ".tmp")
    try:
        data = json.dumps(profiler.trace_document(stage), separators=(",", ":")).encode()
        with gzip.open(tmp, "wb", compresslevel=5) as out:
            out.write(data)
        os.replace(tmp, path)
    except Exception as exc:  # any failure: no partial file stays behind
        with contextlib.suppress(OSError):
            tmp.unlink(missing_ok=True)
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else repr(exc)
        message = f"could not write trace {str(path)!r}: {reason} (partial file removed)"
        log.error("sim: profiler: %s", message)
        profiler.write_errors.append(message)
        del profiler.write_errors[:-MAX_KEPT_ERRORS]
        return None
    finally:
        stage.events = []
    sess.written.append(path)
    return path
