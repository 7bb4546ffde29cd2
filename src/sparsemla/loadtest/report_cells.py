"""Words for the cells of an A/B table that hold no number: why a point measured nothing for a metric.

A point's summary (:mod:`sparsemla.loadtest.summary`) leaves a latency percentile or the goodput empty when its
measured window held no request that could count: TTFT needs a request *sent* inside the window, goodput one sent and
*finished* inside it, ITL two tokens of one request inside it. At a slow point every user can still be busy with the
request it sent during the warmup (a 12 s window against 24 tokens at a 2.2 s decode step). The report never shows a
bare dash for that: :func:`no_value_reason` turns the point's own numbers (window, requests sent and finished in it,
ITL, the workload's output length) into one short sentence, and :func:`ratio_text` / :func:`not_compared` say why a
ratio or a verdict is absent. Nothing here knows about the simulator: the same words explain a slow real server.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

# Which requests each metric of the A/B table is computed from (summary.py's rules, in words).
_NEEDS = {
    "ttft_p50": "sent",
    "ttft_p99": "sent",
    "goodput": "finished",
    "itl_p50": "gap",
    "itl_p99": "gap",
}


def fmt_seconds(value: float) -> str:
    """``0.584`` -> ``584 ms``, ``2.23`` -> ``2.23 s``, ``53.4`` -> ``53 s`` (three significant digits at most)."""
    if value < 1.0:
        return f"{value * 1000:.3g} ms"
    return f"{value:.3g} s" if value < 100 else f"{value:.0f} s"


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and math.isfinite(value) else None


def request_tokens(summary: dict[str, Any]) -> int | None:
    """Output tokens one request asks for: ``--max-tokens`` when set, else the workload's output length (random and
    shared-prefix workloads; a ShareGPT file has no single length); None when unknown."""
    config = summary.get("config") or {}
    if isinstance(config.get("max_tokens"), int) and config["max_tokens"] > 0:
        return int(config["max_tokens"])
    spec = str(summary.get("workload") or "")
    if not spec.startswith(("random:", "shared-prefix:")):
        return None
    from sparsemla.loadtest.workload import WorkloadError, parse_workload

    try:
        workload = parse_workload(spec)
    except WorkloadError:
        return None
    return getattr(workload, "output_len", None)


def request_seconds(summary: dict[str, Any]) -> str:
    """`` (one takes ~53 s: 24 tokens × 2.23 s ITL)``: how long a request takes at this point, or "" when unknown."""
    tokens = request_tokens(summary)
    itl = _number((summary.get("itl_s") or {}).get("p50"))
    if not tokens or itl is None:
        return ""
    return f" (one takes ~{fmt_seconds(tokens * itl)}: {tokens} tokens × {fmt_seconds(itl)} ITL)"


def no_value_reason(metric_key: str, summaries: Sequence[dict[str, Any]]) -> str:
    """Why none of ``summaries`` (one concurrency point, every repeat) has a value for ``metric_key``: one sentence
    starting with "none:" for the table cell."""
    if not summaries:
        return "none: the point was not measured"
    first = summaries[0]
    window = _number(first.get("duration_s"))
    span = f"the {window:.0f} s window" if window is not None else "the measured window"
    repeats = f" (in none of {len(summaries)} repeats)" if len(summaries) > 1 else ""
    sent = int(first.get("requests_started_in_window") or 0)
    needs = _NEEDS.get(metric_key)
    if needs == "gap":
        if not _number(first.get("output_tokens")):
            return f"none: no token arrived in {span}{repeats}"
        return f"none: no request got two tokens within {span}{repeats}"
    if needs in ("sent", "finished") and sent == 0:
        return f"none: no request sent in {span}, all users still in their first{request_seconds(first)}{repeats}"
    if needs == "sent":
        return f"none: no first token arrived in {span} for the {sent} requests sent in it{repeats}"
    if needs == "finished":
        return f"none: none of the {sent} requests sent in {span} finished in it{request_seconds(first)}{repeats}"
    return f"none: the summaries hold no {metric_key}{repeats}"


def side_names(a_missing: bool, b_missing: bool) -> str:
    """``A``, ``B`` or ``A and B``: the sides without a value."""
    return "A and B" if a_missing and b_missing else ("A" if a_missing else "B")


def not_compared(a_value: float, b_value: float) -> str:
    """The verdict cell when a side has no value."""
    which = side_names(not math.isfinite(a_value), not math.isfinite(b_value))
    return f"not compared: {which} {'have' if which == 'A and B' else 'has'} no value"


def ratio_text(a_value: float, b_value: float) -> str | None:
    """The B/A cell when no ratio interval can be formed (a side without a value, or a side at 0); None when it
    can."""
    if not (math.isfinite(a_value) and math.isfinite(b_value)):
        return f"not computed: {side_names(not math.isfinite(a_value), not math.isfinite(b_value))} without value"
    if a_value == 0:
        return "undefined: A is 0" if b_value else "undefined: A and B are 0"
    if b_value == 0:
        return "0 (B is 0)"  # stats.ratio forms no interval for a zero
    return None
