"""Grafana annotations that line the dashboards up with A/B flag flips and load-test runs (posted only when
``GRAFANA_URL`` is set).

`make ab` (and the demo) restart the target with a kernel flag flipped; each flip becomes one region annotation
from the moment the restart began to the moment the target served with the new value, tagged ``sparsemla``, ``ab``,
``variant=<the variant the target now reports>`` and ``flag=<FLAG>``. The serving dashboard's "Flag flips (A/B)"
annotation query (``sparsemla.dashboards.build.ANNOTATION_TAGS``) selects the ``ab`` tag. Load-test runs themselves are
annotated by :func:`post_run_annotations` (tag ``loadtest``; `sparsemla compare` and `sparsemla ab`).

This module only builds the bodies; they are posted through the project's one Grafana client,
:class:`sparsemla.dashboards.grafana_api.Grafana` (re-exported here).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from sparsemla import flags
from sparsemla.dashboards.grafana_api import Grafana

if TYPE_CHECKING:
    from sparsemla.loadtest.report import Run

__all__ = ["FLIP_TAG", "RUN_TAG", "Grafana", "flag_flip_body", "post_run_annotations", "run_body"]

FLIP_TAG = "ab"  # must match build.ANNOTATION_TAGS["Flag flips (A/B)"]
RUN_TAG = "loadtest"


def flag_flip_body(flag: str, value: str, variant: str, began: float, ready: float, target: str) -> dict[str, Any]:
    """The annotation of one flip: region [began, ready] (unix seconds; Grafana wants ms), tags and text."""
    state = "on" if flags.is_true(value) else "off"
    return {
        "time": int(began * 1000),
        "timeEnd": int(max(ready, began) * 1000),
        "tags": ["sparsemla", FLIP_TAG, f"variant={variant}", f"flag={flag}"],
        "text": f"{flag}={value} ({state}): {target} restarted, now serving variant {variant}",
    }


def run_body(run: Run) -> dict[str, Any]:
    """The annotation of one load-test run: region over the run's span, its variant and flags in tags and text."""
    start, end = run.span()
    run_flags = run.flags()[0]
    return {
        "time": int(start * 1000),
        "timeEnd": int(end * 1000),
        "tags": ["sparsemla", RUN_TAG, f"run:{run.name}", f"variant:{run.variant()}"],
        "text": f"load test {run.name}: variant {run.variant()}, flags {json.dumps(run_flags, sort_keys=True)}",
    }


def post_run_annotations(runs: Sequence[Run], grafana: Grafana) -> int:
    """Post one region annotation per run (:func:`run_body`); returns how many were posted. Raises httpx.HTTPError."""
    return len(grafana.post_many([run_body(run) for run in runs]))
