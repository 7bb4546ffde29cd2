"""How long a Locust user waits after failures in a row, so a dead or failing server is not flooded.

A load test against a server that refuses connections or answers 500 at once would otherwise fire thousands of
failed requests a second (measured: 2 users, 10,469 failures in 4 s), which says nothing and hammers whatever is
left of the target. Kept out of the locustfile so it can be imported without Locust's gevent monkey-patching.
"""

from __future__ import annotations

BACKOFF_AFTER = 2  # consecutive failures before a user waits before its next request
BACKOFF_BASE_S = 0.05
BACKOFF_MAX_S = 2.0


def backoff_s(consecutive_failures: int) -> float:
    """Seconds a user waits before its next request after ``consecutive_failures`` failures in a row: none for the
    first ``BACKOFF_AFTER - 1`` (an isolated failure costs nothing), then ``BACKOFF_BASE_S`` doubling per further
    failure, at most ``BACKOFF_MAX_S``; a success resets the count."""
    if consecutive_failures < BACKOFF_AFTER:
        return 0.0
    return min(BACKOFF_MAX_S, BACKOFF_BASE_S * 2 ** min(consecutive_failures - BACKOFF_AFTER, 16))
