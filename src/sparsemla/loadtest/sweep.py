"""Concurrency sweeps with repeats: ``results/loadtest/<run_id>/c<C>-r<k>/summary.json`` per point, resumable.

``sweep.json`` in the run directory records the sweep's configuration; rerunning with the same ``run_id`` skips every
point whose ``summary.json`` exists and refuses to continue when the configuration changed (numbers from two different
setups must never be mixed in one run).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

from sparsemla.loadtest.runner import MAX_CONCURRENCY, LoadTestConfig, ProgressCallback, run_point
from sparsemla.loadtest.summary import write_json_atomic

PointCallback = Callable[[str, int, int], ProgressCallback | None]  # (point name, index, total) -> progress callback


class SweepError(RuntimeError):
    """The sweep cannot continue as asked (message says why)."""


def parse_concurrency_list(text: str) -> list[int]:
    """``"1 16 32 64"`` or ``"1,16,32"`` -> [1, 16, 32, 64]; raise ValueError on anything else."""
    parts = [p for p in text.replace(",", " ").split() if p]
    if not parts:
        raise ValueError("no concurrency given; e.g. --concurrency '1 16 64'")
    values = []
    for part in parts:
        if not part.isdigit() or int(part) < 1:
            raise ValueError(f"concurrency {part!r} is not a positive integer")
        if int(part) > MAX_CONCURRENCY:
            raise ValueError(f"concurrency {part} is above the maximum of {MAX_CONCURRENCY}")
        values.append(int(part))
    return values


def point_name(concurrency: int, repeat: int) -> str:
    return f"c{concurrency:04d}-r{repeat}"


def _manifest(base: LoadTestConfig, concurrencies: Sequence[int], repeat: int, extra: dict[str, Any]) -> dict[str, Any]:
    config = asdict(base)
    config.pop("api_key", None)
    config.pop("concurrency", None)
    config.pop("metrics_port", None)
    return {"concurrency": list(concurrencies), "repeat": repeat, "config": config, **extra}


def read_resume_file(path: Path) -> dict[str, Any]:
    """A JSON object the sweep wrote earlier (``sweep.json``, a point's ``summary.json``); SweepError naming the file
    and the way out when it is unreadable or truncated (a run killed while writing, a disk that filled up)."""
    try:
        data = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        problem = f"is not readable JSON ({exc})"
    else:
        if isinstance(data, dict):
            return data
        problem = f"holds a JSON {type(data).__name__}, not an object"
    run_dir = path.parent if path.name == "sweep.json" else path.parent.parent
    what = (
        f"delete {path} to rerun that point" if path.name == "summary.json" else f"delete the run directory {run_dir}"
    )
    raise SweepError(f"cannot resume run {run_dir.name}: {path} {problem}; {what}, or pick a new --run-id")


def run_sweep(
    base: LoadTestConfig,
    concurrencies: Sequence[int],
    repeat: int,
    run_dir: Path,
    *,
    on_point: PointCallback | None = None,
    extra_meta: dict[str, Any] | None = None,
) -> list[dict[str, Any]]:
    """Run every (C, repeat) point not finished yet; return all the sweep's summaries (finished ones included)."""
    if repeat < 1:
        raise SweepError("repeat must be >= 1")
    run_id = run_dir.name
    manifest_path = run_dir / "sweep.json"
    manifest = _manifest(base, concurrencies, repeat, extra_meta or {})
    if manifest_path.exists():
        old = read_resume_file(manifest_path)
        if not isinstance(old.get("config"), dict):
            raise SweepError(
                f"cannot resume run {run_id}: {manifest_path} has no configuration; delete the run directory "
                f"{run_dir}, or pick a new --run-id"
            )
        if old.get("config") != manifest["config"]:
            changed = sorted(k for k in manifest["config"] if old.get("config", {}).get(k) != manifest["config"][k])
            raise SweepError(
                f"run {run_id} exists with a different configuration ({', '.join(changed)} changed); "
                "use a new --run-id, or the same options to resume"
            )
        manifest["concurrency"] = sorted(set(old.get("concurrency", [])) | set(concurrencies))
        manifest["repeat"] = max(int(old.get("repeat", 1)), repeat)
    write_json_atomic(manifest_path, manifest)
    points = [(c, r) for r in range(1, repeat + 1) for c in concurrencies]
    summaries = []
    for index, (c, r) in enumerate(points):
        name = point_name(c, r)
        out = run_dir / name
        done = out / "summary.json"
        if done.exists():
            summaries.append(read_resume_file(done))
            if on_point is not None:
                on_point(f"{name} (done, skipped)", index, len(points))
            continue
        callback = on_point(name, index, len(points)) if on_point is not None else None
        meta = {"sweep_point": name, "repeat": r, **(extra_meta or {})}
        summaries.append(run_point(replace(base, concurrency=c), out, run_id, on_progress=callback, extra_meta=meta))
    return summaries
