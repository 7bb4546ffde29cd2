"""The one client of Grafana's HTTP API in the project (``POST /api/annotations``, Bearer token when configured).

It lives in ``sparsemla.dashboards`` (Grafana as code) so that both the dashboards and the load-test tools can use it
(``sparsemla.loadtest`` may import ``sparsemla.dashboards``, never the other way round). What the annotations say is
the caller's business: the A/B flip and load-test run bodies are built in :mod:`sparsemla.loadtest.annotations`.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from sparsemla import flags

DEFAULT_TIMEOUT_S = 10.0


@dataclass(frozen=True)
class Grafana:
    """Where annotations go: Grafana's base URL (no trailing slash) and an optional API token."""

    url: str
    token: str | None = None

    @classmethod
    def from_flags(cls) -> Grafana | None:
        """``GRAFANA_URL`` / ``GRAFANA_API_TOKEN``, or None when no Grafana is configured."""
        url = flags.GRAFANA_URL.get()
        return cls(url.rstrip("/"), flags.GRAFANA_API_TOKEN.get() or None) if url else None

    @property
    def headers(self) -> dict[str, str]:
        """The request headers: the Bearer token when there is one."""
        return {"Authorization": f"Bearer {self.token}"} if self.token else {}

    def post(self, body: dict[str, Any], timeout_s: float = DEFAULT_TIMEOUT_S) -> int | None:
        """POST one annotation; returns the id Grafana gave it. Raises httpx.HTTPError on failure."""
        ids = self.post_many([body], timeout_s=timeout_s)
        return ids[0]

    def post_many(self, bodies: Iterable[dict[str, Any]], timeout_s: float = DEFAULT_TIMEOUT_S) -> list[int | None]:
        """POST annotations over one connection, in order; returns their ids (None where Grafana named none).

        Raises httpx.HTTPError at the first failure (the ones before it stay posted)."""
        import httpx

        ids: list[int | None] = []
        with httpx.Client(timeout=timeout_s, headers=self.headers) as client:
            for body in bodies:
                resp = client.post(f"{self.url.rstrip('/')}/api/annotations", json=body)
                resp.raise_for_status()
                ids.append(_annotation_id(resp))
        return ids


def _annotation_id(resp: Any) -> int | None:
    try:
        answer = resp.json()
    except ValueError:
        return None
    return answer.get("id") if isinstance(answer, dict) else None
