"""Which calibration a simulated run ran on, from its summaries (the server's ``/server_info`` is recorded in each).

A run against the simulator carries ``server.sparsemla.calibration`` (``kind``: measured / projected / derived, a
one-line ``label``); a real sglang has none. Reports and exports say "PROJECTED" from here.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any


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
