"""What the load test learns about its target before it starts: is it up, what is it, which kernel flags it runs.

``server`` comes from sglang's ``/server_info`` (falling back to ``/get_model_info``); ``server_flags`` are the labels
of ``sparsemla_kernel_flags_info`` on the target's ``/metrics`` (the sglang plugin and the simulator export it; a stock
sglang has none, then the dict is empty and A/B comparisons refuse to run).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import httpx

from sparsemla.variant import UNKNOWN, info_from_metrics


class TargetError(RuntimeError):
    """The target does not answer like an LLM server (message says which URL and why)."""


@dataclass
class TargetInfo:
    """The target's self-description at the time of the run."""

    url: str
    server: dict[str, Any] = field(default_factory=dict)
    server_flags: dict[str, str] = field(default_factory=dict)
    model: str = "default"

    @property
    def variant(self) -> str:
        return self.server_flags.get("variant", UNKNOWN)


def _get_json(client: httpx.Client, url: str) -> dict[str, Any] | None:
    try:
        resp = client.get(url)
    except httpx.HTTPError:
        return None
    if resp.status_code != 200:
        return None
    try:
        data = resp.json()
    except ValueError:
        return None
    return data if isinstance(data, dict) else None


def probe(url: str, *, api_key: str = "", timeout: float = 10.0) -> TargetInfo:
    """Ask the target who it is. Raises TargetError when it cannot be reached at all."""
    base = url.rstrip("/")
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    info = TargetInfo(url=base)
    with httpx.Client(timeout=timeout, headers=headers) as client:
        try:
            client.get(f"{base}/health")
        except httpx.HTTPError as exc:
            raise TargetError(f"{base} does not answer ({type(exc).__name__}: {exc})") from None
        server = _get_json(client, f"{base}/server_info") or _get_json(client, f"{base}/get_model_info") or {}
        info.server = server
        try:
            resp = client.get(f"{base}/metrics")
            if resp.status_code == 200:
                info.server_flags = info_from_metrics(resp.text)
        except httpx.HTTPError:
            pass
        models = _get_json(client, f"{base}/v1/models") or {}
        data = models.get("data")
        if isinstance(data, list) and data and isinstance(data[0], dict) and data[0].get("id"):
            info.model = str(data[0]["id"])
        elif isinstance(server.get("served_model_name"), str):
            info.model = server["served_model_name"]
        elif isinstance(server.get("model_path"), str):
            info.model = server["model_path"]
    return info
