"""A load-test run as llm-d Benchmark Report v0.2.1 documents (``sparsemla export --format llm-d RUN [RUN_B]``).

One report per measured point (a sweep's ``c<C>-r<k>`` or a single ``loadtest``), as llm-d-benchmark writes one per
stage. The schema (llm-d/llm-d-benchmark, ``br_v0_2_1_json_schema.json``; a copy with its source in
``tests/fixtures/llm-d/``) fixes the fields; what each carries here:

* ``run``: ``uid`` a UUID5 of (run, point, window start); ``eid`` groups the points of one run, or of both runs of an
  A/B pair; ``time`` the measured window (warmup excluded); ``description`` model, run, point, variant and, for the
  simulator, its calibration (``simulated: ... PROJECTED ...``); ``keywords`` ``sparsemla``, the variant, ``A``/``B``
  for a pair, ``simulated`` and ``calibration:<measured|projected|derived>``.
* ``scenario.stack``: one ``inference_engine``, sglang with the version the server reported; the accelerator is the
  calibration's GPU marked simulated (count 0) for the simulator, else ``unknown`` (sglang does not report it) with
  count tp x dp. ``native.envars`` are the kernel flags the server exported (``sparsemla_kernel_flags_info``),
  ``native.args`` the server's limits from ``/server_info``, ``native.config`` its ``sparsemla`` block.
* ``scenario.load``: closed-loop Locust at the point's concurrency; sequence lengths from the workload spec
  (``random:IN:OUT[:R]`` fixed or uniform, ``shared-prefix`` fixed, ShareGPT ``other`` with the measured mean).
* ``results.request_performance.aggregate``: request counts (finished + failed in the window, failures, cut), input /
  output lengths of the successful requests (from ``requests.jsonl`` when present), TTFT / TPOT / ITL / E2E from
  ``summary.json`` (p50, p90, p95, p99, mean, max), token and request rates (output max = the peak 1 s rate).

Not carried (no field for them): the 95 % intervals, goodput, the A/B verdicts (``sparsemla compare`` has those).
"""

from __future__ import annotations

import hashlib
import json
import math
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import numpy as np

from sparsemla.artifacts import write_json_atomic
from sparsemla.loadtest.calibration_label import calibration_label, server_calibration
from sparsemla.loadtest.records import read_records
from sparsemla.loadtest.report import ReportError, resolve_run, run_label
from sparsemla.loadtest.workload import RandomWorkload, SharedPrefixWorkload, WorkloadError, parse_workload

FORMATS = ("llm-d",)
VERSION = "0.2.1"
_NAMESPACE = uuid.UUID("6f1e3c2a-4d5b-5e6f-8a9b-0c1d2e3f4a5b")  # fixed: the same run always gets the same ids


class ExportError(ValueError):
    """The input is not a run that can be exported; the message says what to pass instead."""


@dataclass(frozen=True)
class Point:
    """One measured point of a run: its name (the directory below the run, or the run's own), its summary."""

    name: str
    path: Path
    summary: dict[str, Any]


@dataclass(frozen=True)
class RunInput:
    """A run to export: its label (run id), directory and points (sorted by concurrency, then name)."""

    label: str
    path: Path
    points: tuple[Point, ...]


def load_run(name: str | Path) -> RunInput:
    """The run named by ``name`` (a run directory or a run id under the results root): a single `loadtest` point
    (``summary.json`` in it) or a sweep (``sweep.json``, points in ``c<C>-r<k>/``); ExportError otherwise."""
    try:
        path = resolve_run(name)
    except ReportError as exc:
        raise ExportError(f"{exc}; pass a run directory (results/loadtest/<run_id>) or its run id") from None
    if (path / "summary.json").is_file():
        files = [path / "summary.json"]
    elif (path / "sweep.json").is_file():
        files = sorted(path.glob("*/summary.json"))
    else:
        raise ExportError(
            f"{path} is not a load-test run: it holds neither summary.json nor sweep.json; pass "
            "results/loadtest/<run_id> (written by `sparsemla loadtest`, `sweep` or `ab`) or its run id"
        )
    points = []
    for file in files:
        try:
            summary = json.loads(file.read_text())
        except (OSError, ValueError) as exc:
            raise ExportError(f"{file} is not readable JSON ({exc}); rerun that point or delete it") from None
        if not isinstance(summary, dict) or "concurrency" not in summary or "window" not in summary:
            raise ExportError(f"{file} is not a load-test point summary (no concurrency / window)")
        point = file.parent.name if file.parent != path else f"c{int(summary['concurrency']):04d}"
        points.append(Point(point, file.parent, summary))
    if not points:
        raise ExportError(f"sweep {path} has no finished point yet (no */summary.json); resume or rerun it")
    points.sort(key=lambda p: (int(p.summary["concurrency"]), p.name))
    return RunInput(run_label(name, path), path, tuple(points))


# -- pieces of a report ---------------------------------------------------------------------------------------------


def _iso(ts: float) -> str:
    return datetime.fromtimestamp(ts, tz=timezone.utc).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def _finite(value: Any) -> float | None:
    return (
        float(value)
        if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
        else None
    )


def statistics(dist: Mapping[str, Any] | None, units: str) -> dict[str, Any] | None:
    """A ``Statistics`` object from a summary distribution ({p50, p90, p95, p99, mean, max}); None without a mean."""
    mean = _finite((dist or {}).get("mean"))
    if mean is None:
        return None
    out: dict[str, Any] = {"units": units, "mean": mean}
    for key in ("p50", "p90", "p95", "p99", "max"):
        value = _finite(dist.get(key))
        if value is not None:
            out[key] = value
    return out


def _value_statistics(values: Sequence[float], units: str) -> dict[str, Any] | None:
    if not values:
        return None
    arr = np.asarray(values, dtype=float)
    q = dict(zip(("p50", "p90", "p95", "p99"), np.percentile(arr, [50, 90, 95, 99]), strict=True))
    return {"units": units, "mean": float(arr.mean()), "stddev": float(arr.std()), "min": float(arr.min()),
            **{k: float(v) for k, v in q.items()}, "max": float(arr.max())}  # fmt: skip


def _lengths(point: Point) -> tuple[dict[str, Any] | None, dict[str, Any] | None]:  # (input, output)
    """Input and output length statistics of the successful requests that finished in the measured window."""
    window = point.summary["window"]
    start, stop = float(window["start"]), float(window["end"])
    ok = [r for r in read_records(point.path / "requests.jsonl") if r.ok and start <= r.start + r.e2e <= stop + 1e-6]
    return (_value_statistics([r.prompt_tokens for r in ok], "count"),
            _value_statistics([r.output_tokens for r in ok], "count"))  # fmt: skip


def _rate(value: Any, units: str, peak: Any = None) -> dict[str, Any] | None:
    mean = _finite(value)
    if mean is None:
        return None
    out: dict[str, Any] = {"units": units, "mean": mean}
    if _finite(peak) is not None:
        out["max"] = float(peak)
    return out


def _drop_none(obj: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in obj.items() if v is not None}


Lengths = tuple[dict[str, Any] | None, dict[str, Any] | None]


def _results(point: Point, lengths: Lengths) -> dict[str, Any]:
    s = point.summary
    failures = int((s.get("failures") or {}).get("total", 0))
    input_length, output_length = lengths
    requests = _drop_none({"total": int(s.get("requests", 0)) + failures, "failures": failures,
                           "incomplete": int(s.get("cut_requests", 0)), "input_length": input_length,
                           "output_length": output_length})  # fmt: skip
    latency = _drop_none({
        "time_to_first_token": statistics(s.get("ttft_s"), "s"),
        "time_per_output_token": statistics(s.get("tpot_s"), "s/token"),
        "inter_token_latency": statistics(s.get("itl_s"), "s/token"),
        "request_latency": statistics(s.get("e2e_s"), "s"),
    })  # fmt: skip
    out_rate, in_rate = _finite(s.get("output_tok_per_s")), _finite(s.get("input_tok_per_s"))
    throughput = _drop_none({
        "input_token_rate": _rate(in_rate, "tokens/s"),
        "output_token_rate": _rate(out_rate, "tokens/s", s.get("peak_output_tok_per_s")),
        "total_token_rate": _rate((in_rate or 0.0) + (out_rate or 0.0), "tokens/s") if in_rate or out_rate else None,
        "request_rate": _rate(s.get("req_per_s"), "queries/s"),
    })  # fmt: skip
    aggregate = _drop_none({"requests": requests, "latency": latency or None, "throughput": throughput or None})
    return {"request_performance": {"aggregate": aggregate}}


def _cfg_id(obj: Any) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True, default=str).encode()).hexdigest()[:32]


def _engine(summary: Mapping[str, Any], model: str) -> dict[str, Any]:
    server = summary.get("server") if isinstance(summary.get("server"), Mapping) else {}
    flags = summary.get("server_flags") if isinstance(summary.get("server_flags"), Mapping) else {}
    cal = server_calibration(summary)
    tp, dp = int(server.get("tp_size") or 1), int(server.get("dp_size") or 1)
    if cal is not None:
        gpu = (cal.get("gpu") or {}).get("name") or (cal.get("provenance") or {}).get("gpu", "unknown GPU")
        accelerator = {"model": f"{gpu} (simulated, {cal.get('kind', 'unknown')} calibration)", "count": 0}
    else:
        accelerator = {"model": "unknown (the server does not report it)", "count": tp * dp}
    accelerator["parallelism"] = {"tp": tp, "dp": dp}
    args = {f"--{k.replace('_', '-')}": server[k] for k in ("context_length", "max_running_requests",
            "max_total_num_tokens", "chunked_prefill_size", "tp_size", "dp_size") if k in server}  # fmt: skip
    envars = {k.upper(): v for k, v in flags.items() if k.startswith("sparsemla_")}
    native = {"args": args, "envars": envars, "config": {"server_flags": dict(flags),
              "sparsemla": server.get("sparsemla")}}  # fmt: skip
    version = str(server.get("version") or "unknown")
    which = {k: (cal or {}).get(k) for k in ("kind", "gpu", "path")}  # the configuration, not the run's statistics
    cfg_id = _cfg_id({"args": args, "envars": envars, "version": version, "calibration": which})
    description = f"sglang {version}" + (f"; {calibration_label([summary])}" if cal is not None else "")
    return {
        "metadata": {"schema_version": "0.0.1", "label": "sglang", "cfg_id": cfg_id, "description": description},
        "standardized": {"kind": "inference_engine", "tool": "sglang", "tool_version": version, "role": "replica",
                         "replicas": 1, "model": {"name": model}, "accelerator": accelerator},
        "native": native,
    }  # fmt: skip


def _seq_lengths(spec: str, lengths: Lengths) -> tuple[dict[str, Any], dict[str, Any] | None, str]:
    """(input_seq_len, output_seq_len, load source) of a workload spec; ShareGPT falls back to measured means."""
    workload = None
    if spec.startswith(("random:", "shared-prefix:")):
        try:
            workload = parse_workload(spec)
        except WorkloadError:
            workload = None
    if isinstance(workload, RandomWorkload):
        r = workload.range_ratio

        def length(full: int) -> dict[str, Any]:
            if r >= 1.0:
                return {"distribution": "fixed", "value": full}
            low = max(1, round(full * r))
            return {"distribution": "uniform", "value": (low + full) / 2, "min": low, "max": full}

        return length(workload.input_len), length(workload.output_len), "random"
    if isinstance(workload, SharedPrefixWorkload):
        value = workload.prefix_len + workload.question_len
        return (
            {"distribution": "fixed", "value": value},
            {"distribution": "fixed", "value": workload.output_len},
            ("random"),
        )
    input_length, output_length = lengths
    source = "sampled" if spec.startswith("sharegpt:") or spec.endswith(".json") else "unknown"
    mean_in = input_length["mean"] if input_length else 0
    output = {"distribution": "other", "value": output_length["mean"]} if output_length else None
    return {"distribution": "other", "value": mean_in}, output, source


def _load(point: Point, lengths: Lengths) -> dict[str, Any]:
    s = point.summary
    config = s.get("config") if isinstance(s.get("config"), Mapping) else {}
    spec = str(s.get("workload") or config.get("workload") or "unknown")
    concurrency = int(s["concurrency"])
    input_seq, output_seq, source = _seq_lengths(spec, lengths)
    standardized = _drop_none({
        "tool": "sparsemla loadtest (Locust)", "tool_version": str(s.get("git_sha") or "unknown"),
        "parallelism": max(1, int(config.get("processes") or 1)), "source": source, "stage": 0,
        "input_seq_len": input_seq, "output_seq_len": output_seq, "concurrency": concurrency,
    })  # fmt: skip
    native_config = {k: s.get(k) for k in ("api", "workload", "seed", "warmup_s", "requested_duration_s", "window",
                                           "sweep_point", "repeat", "locust", "target") if k in s}  # fmt: skip
    description = (
        f"closed loop: {concurrency} Locust users, workload {spec}, api {s.get('api', 'chat')}, "
        f"{float(s.get('warmup_s') or 0):g} s warmup, {float(s.get('duration_s') or 0):.1f} s measured"
    )
    native = {"args": dict(config), "config": native_config}
    return {"metadata": {"schema_version": "0.0.1", "cfg_id": _cfg_id(native), "description": description},
            "standardized": standardized, "native": native}  # fmt: skip


def point_report(run: RunInput, point: Point, *, eid: str, side: str | None = None, pair: str | None = None) -> dict:
    """The v0.2.1 report of one point (``side`` A/B and ``pair`` "A vs B" for an A/B pair)."""
    s = point.summary
    model = str(s.get("model") or "unknown")
    variant = str(s.get("variant") or "unknown")
    window = s["window"]
    start, end = float(window["start"]), float(window["end"])
    cal = server_calibration(s)
    label = calibration_label([s])
    lengths = _lengths(point)
    description = f"{model} [{run.label} {point.name}] variant {variant}"
    description += f"; A/B side {side} of {pair}" if side else ""
    description += f"; {label}" if label else ""
    keywords = ["sparsemla", f"variant:{variant}", *([side] if side else [])]
    keywords += ["simulated", f"calibration:{cal.get('kind', 'unknown')}"] if cal is not None else []
    return {
        "version": VERSION,
        "run": {
            "uid": uuid.uuid5(_NAMESPACE, f"{run.label}/{point.name}/{start!r}").hex,
            "eid": eid,
            "time": {"start": _iso(start), "end": _iso(end), "duration": f"PT{round(end - start, 3)}S"},
            "description": description,
            "keywords": keywords,
        },
        "scenario": {"stack": [_engine(s, model)], "load": _load(point, lengths)},
        "results": _results(point, lengths),
    }


def _write(out_dir: Path, reports: Sequence[tuple[str, dict]]) -> list[Path]:
    return [write_json_atomic(out_dir / f"{name}.json", doc, indent=1) for name, doc in reports]


def export_run(run: RunInput, out_dir: Path) -> list[Path]:
    """One ``<point>.json`` per point of ``run`` in ``out_dir``; returns the paths."""
    eid = uuid.uuid5(_NAMESPACE, f"run:{run.label}").hex
    return _write(out_dir, [(p.name, point_report(run, p, eid=eid)) for p in run.points])


def export_pair(a: RunInput, b: RunInput, out_dir: Path) -> list[Path]:
    """``A-<point>.json`` and ``B-<point>.json`` for an A/B pair, every report sharing one ``eid``."""
    pair = f"{a.label} vs {b.label}"
    eid = uuid.uuid5(_NAMESPACE, f"ab:{a.label}:{b.label}").hex
    reports = [(f"{side}-{p.name}", point_report(run, p, eid=eid, side=side, pair=pair))
               for side, run in (("A", a), ("B", b)) for p in run.points]  # fmt: skip
    return _write(out_dir, reports)
