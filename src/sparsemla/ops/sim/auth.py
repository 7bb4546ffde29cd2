"""``sparsemla sim --api-key``: sglang's ``--api-key`` behaviour (``srt/utils/auth.py``, one key, no admin key).

With a key set, every route needs ``Authorization: Bearer <key>`` except the probes and the scrape target: paths that
start with ``/health``, ``/ready`` or ``/metrics``, and ``OPTIONS`` requests. Anything else without the key (missing
header, another scheme, a wrong key) gets 401 ``{"error": "Unauthorized"}``. A pure ASGI middleware, so streaming
responses still see client disconnects. The key is compared in constant time, as bytes (a header that is not ASCII
is a wrong key, not a server error).
"""

from __future__ import annotations

import hmac

from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Receive, Scope, Send

OPEN_PREFIXES = ("/health", "/ready", "/metrics")


def bearer_matches(header: bytes | None, key: bytes) -> bool:
    """``header`` is ``Bearer <key>`` (the scheme case-insensitive)."""
    if not header:
        return False
    scheme, sep, token = header.partition(b" ")
    return bool(sep) and scheme.lower() == b"bearer" and hmac.compare_digest(token, key)


class ApiKeyMiddleware:
    """Answers 401 to requests without the API key (see the module docstring)."""

    def __init__(self, app: ASGIApp, api_key: str) -> None:
        if not api_key:
            raise ValueError("the API key must not be empty")
        self.app = app
        self.key = api_key.encode()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] == "OPTIONS" or scope["path"].startswith(OPEN_PREFIXES):
            await self.app(scope, receive, send)
            return
        header = next((v for k, v in scope["headers"] if k == b"authorization"), None)
        if not bearer_matches(header, self.key):
            await JSONResponse({"error": "Unauthorized"}, status_code=401)(scope, receive, send)
            return
        await self.app(scope, receive, send)
