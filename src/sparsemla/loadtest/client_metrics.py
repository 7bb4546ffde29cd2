"""Client-side Prometheus metrics of the Locust LLM user (names, labels and buckets from sparsemla.metric_names).

Multi-process correctness (``--processes N`` and master/worker): when ``PROMETHEUS_MULTIPROC_DIR`` is set in the
Locust process's environment — `sparsemla loadtest` always sets it to a fresh ``<run dir>/prom`` directory — every
process (workers included) writes its samples to that directory and the one process that serves (the master, or the
local runner) exposes the sum over all of them through ``MultiProcessCollector`` on one port (9646 by default). When
the locustfile runs under plain ``locust`` without that variable, each process keeps its own registry: the master or
local runner serves on the port and every worker on ``port + 1 + worker_index``; sum them in PromQL
(``sum without(instance)(...)``). Histograms use sglang's bucket boundaries so client and server line up.
"""

from __future__ import annotations

import logging
from pathlib import Path

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server
from prometheus_client import multiprocess as prom_multiprocess

from sparsemla import flags
from sparsemla import metric_names as mn

log = logging.getLogger(__name__)

_LABELS = list(mn.LOADGEN_LABELS)

TTFT = Histogram(mn.LOADGEN_TTFT_SECONDS, "Client-side time to first token (s).", _LABELS, buckets=mn.TTFT_BUCKETS)
ITL = Histogram(mn.LOADGEN_ITL_SECONDS, "Client-side gap between output chunks (s).", _LABELS, buckets=mn.ITL_BUCKETS)
TPOT = Histogram(
    mn.LOADGEN_TPOT_SECONDS, "Client-side time per output token after the first (s).", _LABELS, buckets=mn.ITL_BUCKETS
)
E2E = Histogram(
    mn.LOADGEN_E2E_SECONDS, "Client-side request latency to stream end (s).", _LABELS, buckets=mn.E2E_BUCKETS
)
OUTPUT_TOKENS = Counter(mn.LOADGEN_OUTPUT_TOKENS_TOTAL.removesuffix("_total"), "Output tokens received.", _LABELS)
REQUESTS = Counter(
    mn.LOADGEN_REQUESTS_TOTAL.removesuffix("_total"), "Finished requests by outcome.", [*_LABELS, "outcome"]
)
USERS = Gauge(mn.LOADGEN_USERS, "Running Locust users.", _LABELS, multiprocess_mode="livesum")


def multiprocess_dir() -> Path | None:
    """The shared sample directory of this Locust run, or None when each process keeps its own registry."""
    value = flags.PROMETHEUS_MULTIPROC_DIR.get()
    return Path(value) if value else None


def serve(port: int, addr: str = "0.0.0.0") -> bool:
    """Expose the metrics on ``port`` (aggregated over processes in multiprocess mode). False if the port is taken."""
    if multiprocess_dir() is not None:
        registry = CollectorRegistry(support_collectors_without_names=True)
        prom_multiprocess.MultiProcessCollector(registry)
    else:
        from prometheus_client import REGISTRY as registry
    try:
        start_http_server(port, addr=addr, registry=registry)
    except OSError as exc:
        log.warning("client metrics not served: port %d unavailable (%s)", port, exc)
        return False
    return True


def mark_process_dead(pid: int) -> None:
    """Drop a finished process's live gauges (multiprocess mode only)."""
    if multiprocess_dir() is not None:
        prom_multiprocess.mark_process_dead(pid)
