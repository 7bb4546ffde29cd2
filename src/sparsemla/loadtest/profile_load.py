"""A kernel-share snapshot under load: the exporter profiles the server's next forward steps, and an idle server
takes none.

`sparsemla profile` asks the kernel-share exporter (``POST /snapshot``) to record a number of forward steps; a
campaign takes one snapshot per variant, right after that variant's sweep, so something must keep the server busy
meanwhile. :func:`snapshot_under_load` runs a load-test point at one concurrency into a directory of its own (no
sweep and no report reads it, so it never counts as a measurement) and asks for the snapshot once Locust's warmup is
over and every user has a request in flight. The load stops as soon as the exporter has answered (the runner stops
Locust when its progress callback raises), so a snapshot costs the profiled steps and Locust's start-up, not a fixed
duration.
"""

from __future__ import annotations

import shutil
import threading
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from sparsemla.loadtest.kernel_shares import ProfileSnapshot
from sparsemla.loadtest.runner import LoadTestConfig, run_point
from sparsemla.loadtest.summary import write_json_atomic

PROFILE_WARMUP_S = 1.0  # Locust starts C users per second: after 1 s every user has sent its first request
MAX_LOAD_S = 300.0  # the load's duration when the snapshot never answers (it stops at the answer, normally seconds)
EXPORTER_TIMEOUT_S = 120.0  # the exporter's --timeout default (the stack starts it with the default)
SNAPSHOT_FILE = "snapshot.json"


class SnapshotError(RuntimeError):
    """The exporter could not be asked for a snapshot (unreachable, busy, or an answer that is not a snapshot)."""


class _SnapshotAnswered(Exception):
    """Raised from the load's progress callback once the exporter has answered: the runner then stops Locust."""


def post_snapshot(exporter: str, timeout_s: float = EXPORTER_TIMEOUT_S + 60.0) -> dict[str, Any]:
    """``POST <exporter>/snapshot``: the exporter's snapshot JSON, whatever its outcome (``ok``, ``error``,
    ``timeout``: the reply says why). SnapshotError when the exporter is busy, unreachable or answers no snapshot."""
    import httpx

    try:
        resp = httpx.post(f"{exporter.rstrip('/')}/snapshot", timeout=timeout_s)
    except httpx.HTTPError as exc:
        raise SnapshotError(f"the exporter at {exporter} did not answer POST /snapshot ({exc})") from None
    if resp.status_code == 409:
        raise SnapshotError(f"the exporter at {exporter} is already taking a snapshot")
    try:
        body = resp.json()
    except ValueError:
        body = None
    if not isinstance(body, dict) or "outcome" not in body:
        raise SnapshotError(f"the exporter answered HTTP {resp.status_code} without a snapshot: {resp.text[:200]}")
    return body


def profile_concurrency(points: Sequence[int]) -> int:
    """The load a campaign profiles under: the middle sweep point (1 16 64 -> 16), a steady batch that every variant
    serves within seconds (the campaign this project comes from profiled its C=32 point)."""
    ordered = sorted(points)
    return ordered[len(ordered) // 2]


def snapshot_under_load(
    exporter: str,
    base: LoadTestConfig,
    concurrency: int,
    out_dir: Path,
    *,
    variant: str,
    run_id: str,
    say: Callable[[str], None] | None = None,
) -> ProfileSnapshot:
    """Load the target at ``concurrency`` and take one kernel-share snapshot through ``exporter`` meanwhile; the
    snapshot is also written to ``out_dir/snapshot.json``. Failures of the snapshot are in the result (its ``error``);
    a target that cannot be loaded raises like any load-test point."""
    say = say or (lambda _msg: None)
    answer: dict[str, Any] = {}
    answered = threading.Event()

    def take() -> None:
        try:
            answer["snapshot"] = post_snapshot(exporter)
        except SnapshotError as exc:
            answer["error"] = str(exc)
        finally:
            answered.set()

    asker = threading.Thread(target=take, daemon=True, name=f"snapshot-{run_id}")

    def on_progress(phase: str, _elapsed: float, _total: float, _requests: int) -> None:
        if phase == "measuring" and asker.ident is None:
            say(f"{variant}: kernel-share snapshot through {exporter} under C={concurrency} ...")
            asker.start()
        if answered.is_set():
            raise _SnapshotAnswered

    cfg = replace(base, concurrency=concurrency, duration_s=MAX_LOAD_S, warmup_s=PROFILE_WARMUP_S)
    try:
        run_point(cfg, out_dir / "load", run_id, on_progress=on_progress, extra_meta={"profile_load_of": variant})
    except _SnapshotAnswered:
        shutil.rmtree(out_dir / "load" / "prom", ignore_errors=True)  # what a finished point removes itself
    if asker.ident is None:
        answer["error"] = "the load never got past its warmup, so no snapshot was asked for"
    elif not answered.wait(timeout=EXPORTER_TIMEOUT_S + 60.0):
        answer["error"] = f"the exporter did not answer within {EXPORTER_TIMEOUT_S + 60.0:.0f} s"
    snapshot = answer.get("snapshot")
    result = ProfileSnapshot(variant, concurrency, snapshot, answer.get("error"), out_dir / SNAPSHOT_FILE)
    write_json_atomic(result.path, result.to_json())
    if not result.ok:
        say(result.why_none())
    return result
