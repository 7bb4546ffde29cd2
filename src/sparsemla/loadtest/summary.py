"""Turn one run's per-request records into ``summary.json`` (the numbers sweeps, reports and A/B decisions use).

The measured window is ``[measure_start, stop]`` from the Locust timeline (warmup excluded):
- TTFT uses requests sent inside the window that got a first token (also those cut at the stop); ITL uses every gap
  that closed inside the window (any non-failed request: slow servers finish few requests in a short window);
- TPOT, E2E and goodput use successful requests that *started* inside the window and finished before the stop;
- ``output_tokens`` / ``output_tok_per_s`` count every token of a non-failed request that *arrived* inside the window,
  including tokens of requests started during warmup or still streaming at the stop (so throughput is the
  steady-state rate, not biased by cut-off requests); tokens of a failed request count nowhere (a server that
  streams and then errors delivered nothing usable); its CI comes from batch means over equal time slices;
- ``requests`` / ``req_per_s`` count successful requests that *finished* inside the window;
- ``failures`` count failed requests that finished inside the window, by kind. More than 1 % marks the run.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from sparsemla import artifacts
from sparsemla.loadtest import stats
from sparsemla.loadtest.records import RequestRecord
from sparsemla.loadtest.sse import FAILURE_KINDS

SCHEMA_VERSION = 1
FAILURE_MARK = 0.01  # a run with more than 1 % failed requests is marked in the summary and the report


def write_json_atomic(path: Path, data: Any) -> None:
    """Write JSON so that readers never see a half-written file (numpy scalars become plain numbers)."""
    artifacts.write_json_atomic(path, data, indent=2, default=_json_default)


def _json_default(value: Any) -> Any:
    if isinstance(value, (np.floating, np.integer)):
        return value.item()
    if isinstance(value, Path):
        return str(value)
    raise TypeError(f"not JSON serialisable: {type(value).__name__}")


def _clean(value: float | None) -> float | None:
    return None if value is None or not math.isfinite(value) else float(value)


def git_sha() -> str | None:
    """The checkout's commit (None outside a git checkout)."""
    return artifacts.git_sha(short=12)


def token_slices(records: Sequence[RequestRecord], start: float, end: float, n_slices: int) -> list[float]:
    """Output tok/s in each of ``n_slices`` equal slices of ``[start, end]`` (failed requests' tokens excluded)."""
    if end <= start or n_slices < 1:
        return []
    width = (end - start) / n_slices
    counts = np.zeros(n_slices)
    for rec in records:
        if rec.error is not None:
            continue
        for t, tokens in rec.token_arrivals():
            if start <= t < end:
                counts[min(int((t - start) / width), n_slices - 1)] += tokens
    return list(counts / width)


def summarize(
    records: Sequence[RequestRecord],
    *,
    measure_start: float,
    stop: float,
    concurrency: int,
    ttft_slo_s: float,
    tpot_slo_s: float,
    meta: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The summary dict of one run (see the module docstring for what counts where)."""
    window = max(stop - measure_start, 1e-9)
    started = [r for r in records if measure_start <= r.start < stop]
    ok = [r for r in started if r.ok and r.start + r.e2e <= stop + 1e-6]
    finished_ok = [r for r in records if r.ok and measure_start <= r.start + r.e2e <= stop + 1e-6]
    failed = [r for r in records if r.error and measure_start <= r.start + r.e2e <= stop + 1e-6]
    failures: dict[str, int] = dict.fromkeys(FAILURE_KINDS, 0)
    for rec in failed:
        failures[rec.error or "connection"] = failures.get(rec.error or "connection", 0) + 1
    n_fail = sum(failures.values())
    failure_rate = n_fail / (n_fail + len(finished_ok)) if (n_fail + len(finished_ok)) else 0.0

    # TTFT: every request sent inside the window whose first token arrived before the stop (cut ones included);
    # ITL: every gap whose closing chunk arrived inside the window, whichever request it belongs to (steady state).
    ttfts = [r.ttft for r in started if r.error is None and r.ttft is not None and r.start + r.ttft <= stop]
    itls = [
        t - prev
        for r in records
        if r.error is None
        for prev, t in zip(r.offsets, r.offsets[1:], strict=False)
        if measure_start <= r.start + t <= stop
    ]
    tpots = [r.tpot for r in ok if r.tpot is not None]
    e2es = [r.e2e for r in ok]
    delivered = [r for r in records if r.error is None]  # a failed request's tokens are not output (see module doc)
    output_tokens = sum(tokens for r in delivered for t, tokens in r.token_arrivals() if measure_start <= t < stop)
    per_second = token_slices(records, measure_start, stop, max(1, int(window)))
    batches = token_slices(records, measure_start, stop, max(2, min(10, int(window // 2))))
    meets = sum(
        1 for r in ok if r.ttft is not None and r.ttft <= ttft_slo_s and (r.tpot is None or r.tpot <= tpot_slo_s)
    )
    tok_per_s = output_tokens / window

    def boot(values: list[float], q: float, seed: int) -> dict[str, Any]:
        return stats.bootstrap_interval(values, stats.percentile_stat(q), seed=seed).to_json()

    ci95 = {
        "output_tok_per_s": stats.batch_means_interval(batches, value=tok_per_s).to_json(),
        "ttft_p50": boot(ttfts, 50, 1),
        "ttft_p99": boot(ttfts, 99, 2),
        "itl_p50": boot(itls, 50, 3),
        "itl_p99": boot(itls, 99, 4),
        "goodput": stats.wilson_interval(meets, len(ok)).to_json(),
    }
    summary: dict[str, Any] = {
        "schema_version": SCHEMA_VERSION,
        **(meta or {}),
        "concurrency": concurrency,
        "duration_s": window,
        "window": {"start": measure_start, "end": stop},
        "requests": len(finished_ok),
        "requests_started_in_window": len(started),
        "failures": {**failures, "total": n_fail},
        "failure_rate": failure_rate,
        "failures_marked": failure_rate > FAILURE_MARK,
        "failure_examples": sorted({r.message or r.error or "" for r in failed})[:5],
        "cut_requests": sum(1 for r in records if r.cut),
        "output_tokens": output_tokens,
        "output_tok_per_s": tok_per_s,
        "peak_output_tok_per_s": max(per_second) if per_second else 0.0,
        "output_tok_per_s_per_user": tok_per_s / concurrency if concurrency else None,
        "input_tok_per_s": sum(r.prompt_tokens for r in started) / window,
        "req_per_s": len(finished_ok) / window,
        "ttft_s": distribution_json(ttfts),
        "itl_s": distribution_json(itls),
        "tpot_s": distribution_json(tpots),
        "e2e_s": distribution_json(e2es),
        "goodput": {
            "ttft_slo_s": ttft_slo_s,
            "tpot_slo_s": tpot_slo_s,
            "share": meets / len(ok) if ok else None,
            "requests_meeting_slo": meets,
            "req_per_s": meets / window,
        },
        "ci95": ci95,
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }
    return summary


def distribution_json(values: Sequence[float]) -> dict[str, float | None]:
    return {k: _clean(v) for k, v in stats.distribution(values).items()}
