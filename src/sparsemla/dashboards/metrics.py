"""Every metric a dashboard panel may query, by who exports it: sglang 0.5.23, our plugin, the kernel-share exporter,
the Locust client, NVIDIA's DCGM exporter, and Prometheus itself.

The staleness test fails when a panel reads a series that is in none of these lists, so a typo or a metric sglang
renamed is caught before anyone opens Grafana.
"""

from __future__ import annotations

from sparsemla import metric_names as m
from sparsemla import sglang_metrics

# -- NVIDIA dcgm-exporter (etc/default-counters.csv of NVIDIA/dcgm-exporter; gauges, labels gpu, UUID, Hostname, ...) --
# Only the fields the dashboards read. The PROF_* fields are DCGM profiling counters (on by default in the exporter's
# default counter set; they pause while a CUPTI profiler such as the torch profiler runs, see the exporter docs).
DCGM_GPU_UTIL = "DCGM_FI_DEV_GPU_UTIL"  # percent 0..100, coarse "a kernel was running" utilisation
DCGM_TENSOR_ACTIVE = "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE"  # ratio 0..1 of cycles the tensor pipes were busy
DCGM_DRAM_ACTIVE = "DCGM_FI_PROF_DRAM_ACTIVE"  # ratio 0..1 of cycles the memory interface was busy (bandwidth proxy)
DCGM_SM_ACTIVE = "DCGM_FI_PROF_SM_ACTIVE"  # ratio 0..1 of cycles an SM had a warp resident
DCGM_POWER_USAGE = "DCGM_FI_DEV_POWER_USAGE"  # watts
DCGM_TOTAL_ENERGY = "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION"  # millijoules since boot (counter-like gauge)
DCGM_FB_USED = "DCGM_FI_DEV_FB_USED"  # MiB of frame buffer in use
DCGM_METRICS = frozenset(
    {DCGM_GPU_UTIL, DCGM_TENSOR_ACTIVE, DCGM_DRAM_ACTIVE, DCGM_SM_ACTIVE, DCGM_POWER_USAGE, DCGM_TOTAL_ENERGY,
     DCGM_FB_USED}
)  # fmt: skip


def _histogram(name: str) -> set[str]:
    return {f"{name}_bucket", f"{name}_sum", f"{name}_count"}


# Series our own code exposes (src/sparsemla/metric_names.py is the one place that names them).
PLUGIN_SERIES = frozenset({m.KERNEL_FLAGS_INFO, *_histogram(m.DECODE_STEP_SECONDS)})
EXPORTER_SERIES = frozenset(
    {m.KERNEL_TIME_SHARE, m.KERNEL_CATEGORY_SHARE, m.KERNEL_SNAPSHOT_TIMESTAMP, m.KERNEL_SNAPSHOTS_TOTAL}
)
LOADGEN_SERIES = frozenset(
    {
        *_histogram(m.LOADGEN_TTFT_SECONDS),
        *_histogram(m.LOADGEN_ITL_SECONDS),
        *_histogram(m.LOADGEN_TPOT_SECONDS),
        *_histogram(m.LOADGEN_E2E_SECONDS),
        m.LOADGEN_OUTPUT_TOKENS_TOTAL,
        m.LOADGEN_REQUESTS_TOTAL,
        m.LOADGEN_USERS,
    }
)
PROMETHEUS_SERIES = frozenset({"up", "scrape_duration_seconds"})  # synthesised by Prometheus for every target

SOURCES: dict[str, frozenset[str]] = {
    f"sglang {sglang_metrics.SGLANG_VERSION}": sglang_metrics.SERIES,
    "sparsemla plugin": PLUGIN_SERIES,
    "kernel-share exporter": EXPORTER_SERIES,
    "Locust client": LOADGEN_SERIES,
    "dcgm-exporter": DCGM_METRICS,
    "Prometheus": PROMETHEUS_SERIES,
}
KNOWN_SERIES: frozenset[str] = frozenset().union(*SOURCES.values())


def source_of(series: str) -> str | None:
    """Which exporter exposes ``series`` (first match in :data:`SOURCES`), or None when nobody does."""
    return next((name for name, known in SOURCES.items() if series in known), None)
