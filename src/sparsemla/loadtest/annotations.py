"""Grafana annotations that line the dashboards up with A/B flag flips (posted only when ``GRAFANA_URL`` is set).

`make ab` (and the demo) restart the target with a kernel flag flipped; each flip becomes one region annotation
from the moment the restart began to the moment the target served with the new value, tagged ``sparsemla``, ``ab``,
``variant=<the variant the target now reports>`` and ``flag=<FLAG>``. The serving dashboard's "Flag flips (A/B)"
annotation query (``sparsemla.dashboards.build.ANNOTATION_TAGS``) selects the ``ab`` tag. Load-test runs themselves are
annotated by :func:`sparsemla.loadtest.report.post_grafana_annotations` (tag ``loadtest``).

Only Grafana's HTTP API is used (``POST /api/annotations``, Bearer token when ``GRAFANA_API_TOKEN`` is set).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sparsemla import flags

FLIP_TAG = "ab"  # must match build.ANNOTATION_TAGS["Flag flips (A/B)"]


@dataclass(frozen=True)
class Grafana:
    """Where annotations go: Grafana's base URL and an optional API token."""

    url: str
    token: str | None = None

    @classmethod
    def from_flags(cls) -> Grafana | None:
        """``GRAFANA_URL`` / ``GRAFANA_API_TOKEN``, or None when no Grafana is configured."""
        url = flags.GRAFANA_URL.get()
        return cls(url.rstrip("/"), flags.GRAFANA_API_TOKEN.get() or None) if url else None

    def post(self, body: dict[str, Any], timeout_s: float = 10.0) -> int | None:
        """POST one annotation; returns the id Grafana gave it. Raises httpx.HTTPError on failure."""
        import httpx

        headers = {"Authorization": f"Bearer {self.token}"} if self.token else {}
        resp = httpx.post(f"{self.url}/api/annotations", json=body, headers=headers, timeout=timeout_s)
        resp.raise_for_status()
        try:
            answer = resp.json()
        except ValueError:
            return None
        return answer.get("id") if isinstance(answer, dict) else None


def flag_flip_body(flag: str, value: str, variant: str, began: float, ready: float, target: str) -> dict[str, Any]:
    """The annotation of one flip: region [began, ready] (unix seconds; Grafana wants ms), tags and text."""
    state = "on" if value.strip().lower() in ("1", "true", "on", "yes") else "off"
    return {
        "time": int(began * 1000),
        "timeEnd": int(max(ready, began) * 1000),
        "tags": ["sparsemla", FLIP_TAG, f"variant={variant}", f"flag={flag}"],
        "text": f"{flag}={value} ({state}): {target} restarted, now serving variant {variant}",
    }
