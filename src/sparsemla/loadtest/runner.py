"""Run one fixed-concurrency load-test point: headless Locust in a subprocess, then ``summary.json``.

Why a subprocess: Locust monkey-patches the interpreter for gevent, which must not happen inside the CLI (rich
progress, matplotlib, the demo's process manager) or inside pytest; a separate process also makes ``--processes N``
work unchanged. The subprocess writes per-request records and a timeline into the point directory; this module polls
them for the progress display and summarises them at the end.

Point directory layout: ``summary.json`` (atomic), ``requests.jsonl``, ``timeline.json``, ``locust_stats.csv``,
``locust_stats_history.csv``, ``locust_failures.csv``, ``locust_exceptions.csv``, ``locust.html``, ``locust.log``.
"""

from __future__ import annotations

import math
import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from sparsemla import flags, ports
from sparsemla.loadtest.options import MAX_CONCURRENCY
from sparsemla.loadtest.records import read_records
from sparsemla.loadtest.summary import git_sha, summarize, write_json_atomic
from sparsemla.loadtest.target import TargetInfo, probe
from sparsemla.loadtest.workload import DEFAULT_WORKLOAD, parse_workload
from sparsemla.procs import log_tail, stop_child

LOCUSTFILE = Path(__file__).with_name("locustfile.py")
DEFAULT_TTFT_SLO_S = 2.0
DEFAULT_TPOT_SLO_S = 0.1

MAX_DURATION_S = 7 * 86_400.0
MAX_REQUEST_TIMEOUT_S = 86_400.0
MAX_SLO_S = 3_600.0
RUN_ID_PATTERN = re.compile(r"[A-Za-z0-9._-]+")
RUN_ID_MAX_LEN = 120
# What one point writes into its directory (and all that :func:`reset_point_dir` ever deletes there).
POINT_FILES = (
    "summary.json", "requests.jsonl", "timeline.json", "timeline.json.tmp", "locust_stats.csv",
    "locust_stats_history.csv", "locust_failures.csv", "locust_exceptions.csv", "locust.html", "locust.log",
    "locust.stdout",
)  # fmt: skip
POINT_DIRS = ("prom",)

ProgressCallback = Callable[[str, float, float, int], None]  # (phase, elapsed s, total s, requests recorded)


class LoadTestError(RuntimeError):
    """The load test could not run or produced nothing usable (the message says why and where the log is)."""


def parse_duration(text: str | float | int) -> float:
    """Seconds from ``60``, ``60s``, ``2m``, ``1m30s``, ``1h``; raise ValueError otherwise."""
    if isinstance(text, (int, float)):
        value = float(text)
    else:
        raw = text.strip().lower()
        if re.fullmatch(r"\d+(\.\d+)?", raw):
            value = float(raw)
        else:
            match = re.fullmatch(r"(?:(\d+)h)?(?:(\d+)m)?(?:(\d+(?:\.\d+)?)s)?", raw)
            if not raw or not match:
                raise ValueError(f"cannot read duration {text!r}; use e.g. 60s, 2m, 1m30s")
            h, m, s = match.groups()
            value = int(h or 0) * 3600 + int(m or 0) * 60 + float(s or 0)
    if value <= 0:
        raise ValueError(f"duration must be positive, got {text!r}")
    return value


def auto_warmup(duration_s: float) -> float:
    """Default warmup: 15 % of the measured duration, between 1 and 10 s."""
    return min(10.0, max(1.0, 0.15 * duration_s))


@dataclass
class LoadTestConfig:
    """Everything that defines one load-test point (recorded in its summary)."""

    target: str
    concurrency: int
    duration_s: float
    workload: str = DEFAULT_WORKLOAD
    api: str = "chat"
    warmup_s: float | None = None
    seed: int = 0
    ignore_eos: bool = True
    max_tokens: int = 0
    api_key: str = ""
    request_timeout_s: float = 600.0
    processes: int = 1
    metrics_port: int = ports.PORT_LOCUST_METRICS
    ttft_slo_s: float = DEFAULT_TTFT_SLO_S
    tpot_slo_s: float = DEFAULT_TPOT_SLO_S
    model: str | None = None

    def validate(self) -> None:
        if self.concurrency < 1:
            raise ValueError(f"concurrency must be >= 1, got {self.concurrency}")
        if self.api not in ("chat", "completions", "generate"):
            raise ValueError(f"api must be chat, completions or generate, got {self.api!r}")
        if not re.match(r"^https?://", self.target):
            raise ValueError(f"target must be an http(s):// URL, got {self.target!r}")
        if not (math.isfinite(self.duration_s) and 0 < self.duration_s <= MAX_DURATION_S):
            raise ValueError(f"duration must be > 0 and <= {MAX_DURATION_S:g} s, got {self.duration_s}")
        if self.concurrency > MAX_CONCURRENCY:
            raise ValueError(f"concurrency must be <= {MAX_CONCURRENCY}, got {self.concurrency}")
        if self.processes < 1:
            raise ValueError("processes must be >= 1")
        for name, value, high in (
            ("request timeout", self.request_timeout_s, MAX_REQUEST_TIMEOUT_S),
            ("TTFT SLO", self.ttft_slo_s, MAX_SLO_S),
            ("TPOT SLO", self.tpot_slo_s, MAX_SLO_S),
        ):
            if not (math.isfinite(value) and 0 < value <= high):
                raise ValueError(f"{name} must be > 0 and <= {high:g} s, got {value}")
        if self.warmup_s is not None and not (math.isfinite(self.warmup_s) and self.warmup_s >= 0):
            raise ValueError(f"warmup must be >= 0 s, got {self.warmup_s}")
        if self.max_tokens < 0:
            raise ValueError(f"max_tokens must be >= 0, got {self.max_tokens}")
        if not 0 <= self.metrics_port <= 65535:
            raise ValueError(f"metrics port must be 0 (off) or a TCP port <= 65535, got {self.metrics_port}")
        parse_workload(self.workload, self.seed)  # raises WorkloadError with the reason

    @property
    def effective_warmup_s(self) -> float:
        return auto_warmup(self.duration_s) if self.warmup_s is None else self.warmup_s

    def comparable(self) -> dict[str, Any]:
        """The fields two runs must share to be compared point by point."""
        return {k: getattr(self, k) for k in ("workload", "api", "seed", "ignore_eos", "max_tokens")}


def results_root() -> Path:
    """``$SPARSEMLA_RESULTS_DIR/loadtest`` (default ``results/loadtest``)."""
    return Path(flags.SPARSEMLA_RESULTS_DIR.get()) / "loadtest"


def new_run_id(prefix: str = "run") -> str:
    return f"{prefix}-{time.strftime('%Y%m%d-%H%M%S')}"


def validate_run_id(run_id: str) -> str:
    """``run_id`` itself when it is a name (one path component of letters, digits, ``.``, ``_``, ``-``; not ``.`` or
    ``..``); raise ValueError otherwise. A run id names a directory under the results root, never a path."""
    if (
        not RUN_ID_PATTERN.fullmatch(run_id)
        or run_id in (".", "..")
        or run_id.startswith("-")
        or len(run_id) > RUN_ID_MAX_LEN
    ):
        raise ValueError(
            f"run id {run_id!r} is not a plain name: use letters, digits, '.', '_' and '-' only (at most "
            f"{RUN_ID_MAX_LEN} characters, not starting with '-', not '.' or '..'), e.g. --run-id my-run-1"
        )
    return run_id


def reset_point_dir(out_dir: Path) -> None:
    """Delete what an earlier (half-finished) attempt of this point left in ``out_dir``: the point's own files
    (:data:`POINT_FILES`, :data:`POINT_DIRS`) and nothing else, so a directory that holds other runs or other
    files never loses them. Symlinks are unlinked, never followed."""
    for name in POINT_FILES:
        path = out_dir / name
        if path.is_symlink() or path.is_file():
            path.unlink()
    for name in POINT_DIRS:
        path = out_dir / name
        if path.is_symlink():
            path.unlink()
        elif path.is_dir():
            shutil.rmtree(path)


def _locust_argv(cfg: LoadTestConfig, out_dir: Path, run_id: str, info: TargetInfo) -> list[str]:
    # The locustfile quits `duration` after the warmup; -t is only a safety net should that greenlet never run.
    run_time = math.ceil(cfg.effective_warmup_s + cfg.duration_s) + 30
    argv = [
        sys.executable, "-m", "locust",
        "-f", str(LOCUSTFILE),
        "--headless", "--only-summary",
        "-u", str(cfg.concurrency),
        "-r", str(max(cfg.concurrency, 1)),
        "-t", f"{run_time}s",
        "--stop-timeout", "0",
        "--host", cfg.target.rstrip("/"),
        "--csv", str(out_dir / "locust"),
        "--csv-full-history",
        "--html", str(out_dir / "locust.html"),
        "--loglevel", "WARNING",
        "--logfile", str(out_dir / "locust.log"),
        "--llm-api", cfg.api,
        "--llm-workload", cfg.workload,
        "--llm-seed", str(cfg.seed),
        "--llm-model", cfg.model or info.model,
        "--llm-ignore-eos", "true" if cfg.ignore_eos else "false",
        "--llm-max-tokens", str(cfg.max_tokens),
        "--llm-request-timeout", str(cfg.request_timeout_s),
        "--llm-warmup", str(cfg.effective_warmup_s),
        "--llm-duration", str(cfg.duration_s),
        "--llm-records", str(out_dir / "requests.jsonl"),
        "--llm-timeline", str(out_dir / "timeline.json"),
        "--llm-run-id", run_id,
        "--llm-concurrency", str(cfg.concurrency),
        "--llm-variant", info.variant,
        "--llm-metrics-port", str(cfg.metrics_port),
        "--llm-parent-pid", str(os.getpid()),
    ]  # fmt: skip
    # The API key goes through the environment (locust_env), never argv: a command line is visible to every user (ps).
    if cfg.processes > 1:
        argv += ["--processes", str(cfg.processes)]
    return argv


def locust_env(cfg: LoadTestConfig, prom_dir: Path) -> dict[str, str]:
    """The Locust process's environment: this one's, plus its metrics directory and (only there) the API key."""
    overrides: dict[str, str | None] = {
        flags.PROMETHEUS_MULTIPROC_DIR.name: str(prom_dir),
        flags.SPARSEMLA_LOADTEST_API_KEY.name: cfg.api_key or None,
    }
    return flags.child_env(overrides)


def _read_json(path: Path) -> dict[str, Any]:
    import json

    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


class _LineCounter:
    """Counts lines appended to a growing file without re-reading it."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.offset = 0
        self.lines = 0

    def poll(self) -> int:
        try:
            with self.path.open("rb") as fh:
                fh.seek(self.offset)
                chunk = fh.read()
        except OSError:
            return self.lines
        self.offset += len(chunk)
        self.lines += chunk.count(b"\n")
        return self.lines


def run_point(
    cfg: LoadTestConfig,
    out_dir: Path,
    run_id: str,
    *,
    on_progress: ProgressCallback | None = None,
    extra_meta: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Run one point into ``out_dir`` and return its summary (also written to ``out_dir/summary.json``).

    Raises TargetError when the target is down, LoadTestError when Locust fails or records nothing."""
    cfg.validate()
    info = probe(cfg.target, api_key=cfg.api_key)
    if out_dir.is_symlink():
        raise LoadTestError(f"{out_dir} is a symlink; a point directory must be a real directory")
    reset_point_dir(out_dir)  # a half-finished point is rerun from scratch (only its own files are removed)
    out_dir.mkdir(parents=True, exist_ok=True)
    prom_dir = out_dir / "prom"
    prom_dir.mkdir()
    argv = _locust_argv(cfg, out_dir, run_id, info)
    env = locust_env(cfg, prom_dir)
    total = cfg.effective_warmup_s + cfg.duration_s
    counter = _LineCounter(out_dir / "requests.jsonl")
    started = time.monotonic()
    with open(out_dir / "locust.stdout", "wb") as stdout:
        proc = subprocess.Popen(argv, stdout=stdout, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env)
        try:
            deadline = started + total + 90
            while proc.poll() is None:
                if time.monotonic() > deadline:
                    proc.kill()
                    raise LoadTestError(f"locust did not finish in time; see {out_dir / 'locust.stdout'}")
                if on_progress is not None:
                    timeline = _read_json(out_dir / "timeline.json")
                    phase = "measuring" if "measure_start" in timeline else "warmup"
                    phase = "stopping" if "stop" in timeline else phase
                    on_progress(phase, time.monotonic() - started, total, counter.poll())
                time.sleep(0.5)
        except BaseException:
            stop_child(proc, timeout=10)
            raise
    # Locust exits 1 when any request failed; failures are counted in the summary, so only other codes are errors.
    if proc.returncode not in (0, 1):
        raise LoadTestError(
            f"locust exited with {proc.returncode}; see {out_dir / 'locust.stdout'}:\n"
            + log_tail(out_dir / "locust.stdout")
        )
    timeline = _read_json(out_dir / "timeline.json")
    if "measure_start" not in timeline or "stop" not in timeline:
        raise LoadTestError(f"locust ended before the measured window; see {out_dir / 'locust.stdout'}")
    records = read_records(out_dir / "requests.jsonl")
    if not records:
        raise LoadTestError(f"no request was recorded; see {out_dir / 'locust.stdout'} and {out_dir / 'locust.log'}")
    config = asdict(cfg)
    config.pop("api_key")
    meta = {
        "run_id": run_id,
        "target": cfg.target,
        "api": cfg.api,
        "workload": cfg.workload,
        "seed": cfg.seed,
        "warmup_s": cfg.effective_warmup_s,
        "requested_duration_s": cfg.duration_s,
        "config": config,
        "model": cfg.model or info.model,
        "variant": info.variant,
        "server": info.server,
        "server_flags": info.server_flags,
        "git_sha": git_sha(),
        "locust": {
            "stats_csv": "locust_stats.csv",
            "history_csv": "locust_stats_history.csv",
            "failures_csv": "locust_failures.csv",
            "html": "locust.html",
            "exit_code": proc.returncode,
            "processes": cfg.processes,
        },
        **(extra_meta or {}),
    }
    summary = summarize(
        records,
        measure_start=float(timeline["measure_start"]),
        stop=float(timeline["stop"]),
        concurrency=cfg.concurrency,
        ttft_slo_s=cfg.ttft_slo_s,
        tpot_slo_s=cfg.tpot_slo_s,
        meta=meta,
    )
    summary["test_start"] = timeline.get("test_start")
    write_json_atomic(out_dir / "summary.json", summary)
    shutil.rmtree(prom_dir, ignore_errors=True)
    return summary
