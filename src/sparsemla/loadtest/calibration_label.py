"""Which calibration a simulated run ran on, from its summaries (the server's ``/server_info`` is recorded in each).

A run against the simulator carries ``server.sparsemla.calibration`` (``kind``: measured / projected / derived, a
one-line ``label``, ``baseline``: what flags off is there, ``references``: sglang's fast path, measured in the
decode-step benchmark and never served, with the flags-on speed-up over it or why there is none); a real sglang has
none. Reports and exports say "PROJECTED" and "vs sglang's fallback / fast path" (:func:`comparison_lines`) from here.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from sparsemla.variant import ALL_ON  # "flags on": the state the references' speed-ups are over


def server_calibration(summary: Mapping[str, Any]) -> dict[str, Any] | None:
    """The simulator's calibration summary recorded in one point summary, or None (a real server, an older run)."""
    server = summary.get("server")
    sparsemla = server.get("sparsemla") if isinstance(server, Mapping) else None
    calibration = sparsemla.get("calibration") if isinstance(sparsemla, Mapping) else None
    return dict(calibration) if isinstance(calibration, Mapping) else None


def calibration_label(summaries: Iterable[Mapping[str, Any]]) -> str | None:
    """``simulated: <label>`` for each calibration a run's points ran on (joined by "; "), None if none is simulated.

    Older simulator runs without a ``label`` get one from the provenance (``provisional`` = PROVISIONAL)."""
    labels: list[str] = []
    for summary in summaries:
        cal = server_calibration(summary)
        if cal is None:
            continue
        label = cal.get("label")
        if not isinstance(label, str) or not label:
            prov = cal.get("provenance") or {}
            label = f"{prov.get('gpu', 'unknown GPU')} calibration" + (
                ", PROVISIONAL" if prov.get("provisional") else ""
            )
        if label not in labels:
            labels.append(label)
    return "; ".join(f"simulated: {label}" for label in labels) or None


# Issue #16 item 4: flags on >= 1.1x sglang's fast path per decode step at B = 64 (benchmarks/step_report.py checks the
# same goal in docs/performance.md; a test keeps the two equal).
FAST_PATH_GOALS = {64: 1.1}


def _calibrations(summaries: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The distinct simulator calibrations the summaries recorded (by label), in order of first appearance."""
    found: dict[str, dict[str, Any]] = {}
    for summary in summaries:
        cal = server_calibration(summary)
        if cal is not None:
            found.setdefault(str(cal.get("label") or cal.get("path") or len(found)), cal)
    return list(found.values())


def _gpu_name(cal: Mapping[str, Any]) -> str:
    gpu = cal.get("gpu")
    if isinstance(gpu, Mapping) and gpu.get("name"):
        return str(gpu["name"])
    prov = cal.get("provenance")
    return str(prov.get("gpu") or "this GPU") if isinstance(prov, Mapping) else "this GPU"


def _points(value: Any) -> dict[int, dict[int, float]]:
    """``{"4096": {"64": 1.01}}`` (JSON keys) -> ``{4096: {64: 1.01}}``; malformed entries are left out."""
    out: dict[int, dict[int, float]] = {}
    if isinstance(value, Mapping):
        for c, row in value.items():
            if str(c).isdigit() and isinstance(row, Mapping):
                cells = {int(b): float(v) for b, v in row.items() if str(b).isdigit() and isinstance(v, (int, float))}
                if cells:
                    out[int(c)] = cells
    return out


def _ctx(tokens: int) -> str:
    return f"{tokens // 1024}k context" if tokens >= 1024 else f"context {tokens}"


def _flags_on(cal: Mapping[str, Any]) -> str:
    """The state the calibration's speed-ups are over (its ``flags_on``; older summaries: all flags on)."""
    return str(cal.get("flags_on") or ALL_ON)


def _measured_text(name: str, ref: Mapping[str, Any], gpu: str, flags_on: str = ALL_ON) -> str:
    speedup = _points(ref.get("flags_on_speedup"))
    what = f"`{name}`: {ref.get('description') or 'a reference state'}"
    head = (
        f"vs sglang's fast path on the {gpu} ({what}; measured in the decode-step benchmark, not served by the "
        "simulator)"
    )
    if not speedup:
        return f"{head}: flags on (`{flags_on}`) were not measured beside it, so there is no speed-up over it."
    batches = sorted({b for row in speedup.values() for b in row})
    goals = {b: want for b, want in FAST_PATH_GOALS.items() if b in batches} or {batches[-1]: None}
    parts = []
    for b, want in goals.items():
        cells = [(c, row[b]) for c, row in sorted(speedup.items()) if b in row]
        text = _speedups(speedup, b)
        if want is not None:
            verdicts = {c: "met" if x >= want else "missed" for c, x in cells}
            verdict = next(iter(verdicts.values())) if len(set(verdicts.values())) == 1 else ", ".join(
                f"{v} at {_ctx(c)}" for c, v in verdicts.items()
            )  # fmt: skip
            text += f"; goal >= {want}x at B={b}: {verdict}"
        parts.append(text)
    missing = [f"B={b}" for b in FAST_PATH_GOALS if b not in batches]
    if missing:
        parts.append(f"goal point {', '.join(missing)} not measured")
    values = [x for row in speedup.values() for x in row.values()]
    span = f"{min(values):.2f}-{_x(max(values))} over its {len(values)} measured points (B={batches[0]}-{batches[-1]})"
    return f"{head}: flags on (`{flags_on}`) are {'; '.join(parts)}; {span}."


def fast_path_text(cal: Mapping[str, Any]) -> str:
    """One sentence on flags on vs sglang's fast path from a calibration summary (``/server_info``): the speed-up over
    each measured reference state at the goal batch, or in words why the calibration has none."""
    gpu = _gpu_name(cal)
    refs = cal.get("references")
    if not isinstance(refs, Mapping):
        return (
            f"vs sglang's fast path: not reported (the simulator's {gpu} calibration summary has no reference states: "
            "it predates them), so the speed-ups here are over sglang's fallback only."
        )
    if not refs:
        return (
            f"vs sglang's fast path: the {gpu} calibration records none (it holds the flag states only), so the "
            "speed-ups here are over sglang's fallback only."
        )
    texts = []
    for name, ref in refs.items():
        if not isinstance(ref, Mapping):
            continue
        if ref.get("measured") is True:
            texts.append(_measured_text(str(name), ref, gpu, _flags_on(cal)))
        else:
            why = ref.get("reason") or "no reason recorded"
            texts.append(
                f"vs sglang's fast path on the {gpu}: not measured (reference state `{name}`): {why}; the speed-ups "
                "here are over sglang's fallback only."
            )
    return " ".join(texts) or f"vs sglang's fast path: the {gpu} calibration's reference states are unreadable."


def _speedups(speedup: Mapping[int, Mapping[int, float]], batch: int) -> str:
    """``54.6x as fast per step at B=64, 4k context (41.2x at 64k context)`` from context -> batch -> ratio."""
    cells = [(c, row[batch]) for c, row in sorted(speedup.items()) if batch in row]
    text = f"{_x(cells[0][1])} as fast per step at B={batch}, {_ctx(cells[0][0])}"
    return text + (f" ({', '.join(f'{_x(x)} at {_ctx(c)}' for c, x in cells[1:])})" if cells[1:] else "")


def _x(ratio: float) -> str:
    return f"{ratio:.1f}x" if ratio >= 10 else f"{ratio:.2f}x"


def fallback_text(cal: Mapping[str, Any]) -> str:
    """Flags on vs sglang's fallback (the ``baseline`` state: what flags off is on the calibration's GPU) per decode
    step at the goal batch of :data:`FAST_PATH_GOALS`, as the calibration has it, in one sentence."""
    baseline = cal.get("baseline")
    label = baseline.get("label") if isinstance(baseline, Mapping) else None
    what = label or "sglang's fallback kernels (the calibration does not say which)"
    head = f"vs sglang's fallback on the {_gpu_name(cal)} (flags off, `baseline`: {what})"
    speedup = _points(cal.get("flags_on_speedup_over_baseline"))
    batches = sorted({b for row in speedup.values() for b in row})
    if not batches:
        return f"{head}: the calibration summary gives no flags-on speed-up over it."
    batch = next((b for b in FAST_PATH_GOALS if b in batches), batches[-1])
    how = str(cal.get("kind") or "this")
    return f"{head}: flags on (`{_flags_on(cal)}`) are {_speedups(speedup, batch)} in the {how} calibration."


def comparison_lines(summaries: Iterable[Mapping[str, Any]]) -> list[str]:
    """Per simulator calibration the run's points ran on: flags on vs sglang's fallback (:func:`fallback_text`) and
    vs sglang's fast path (:func:`fast_path_text`), both per decode step from the calibration; [] for a real server."""
    return [line for cal in _calibrations(summaries) for line in (fallback_text(cal), fast_path_text(cal))]
