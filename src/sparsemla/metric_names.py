"""Names, label sets and buckets of the metrics sparsemla itself exports (one place, shared by the plugin, the
simulator, the exporter, the Locust user, Prometheus rules and dashboards). sglang's own metrics keep sglang's names
verbatim (`sglang:...`); ours are `sparsemla_*` with base units in the name.
"""

from __future__ import annotations

# -- sglang plugin (and the simulator, which mimics it) ---------------------------------------------------------------
# Gauge, value 1; one label per kernel flag (lower-case flag name) plus `version` and `variant`.
KERNEL_FLAGS_INFO = "sparsemla_kernel_flags_info"
# Histogram of one decode forward step (GPU time between CUDA events), labels: forward_mode, batch_bucket.
DECODE_STEP_SECONDS = "sparsemla_decode_step_seconds"
DECODE_STEP_LABELS = ("forward_mode", "batch_bucket")
# 1 ms .. 2 s: a DeepSeek decode step is ~10-200 ms; dense around 10-100 ms for SLO boundaries.
DECODE_STEP_BUCKETS = (
    0.001,
    0.0025,
    0.005,
    0.0075,
    0.01,
    0.015,
    0.02,
    0.025,
    0.03,
    0.04,
    0.05,
    0.06,
    0.075,
    0.1,
    0.125,
    0.15,
    0.2,
    0.25,
    0.3,
    0.4,
    0.5,
    0.75,
    1.0,
    2.0,
)
# Batch-size buckets for the `batch_bucket` label (upper bounds; the label is e.g. "1", "2-4", "5-8", ..., "257+").
BATCH_BUCKET_BOUNDS = (1, 4, 8, 16, 32, 64, 128, 256)


def batch_bucket(batch_size: int) -> str:
    """The `batch_bucket` label of a batch size: "1", "2-4", "5-8", "9-16", ..., "129-256", "257+"."""
    lower = 1
    for upper in BATCH_BUCKET_BOUNDS:
        if batch_size <= upper:
            return str(upper) if lower == upper else f"{lower}-{upper}"
        lower = upper + 1
    return f"{lower}+"


# -- kernel-share exporter ---------------------------------------------------------------------------------------------
KERNEL_TIME_SHARE = "sparsemla_kernel_time_share"  # gauge 0..1, labels: kernel, category, variant
KERNEL_CATEGORY_SHARE = "sparsemla_kernel_category_share"  # gauge 0..1, labels: category, variant
KERNEL_SNAPSHOT_TIMESTAMP = "sparsemla_kernel_snapshot_timestamp_seconds"  # gauge, labels: variant
KERNEL_SNAPSHOTS_TOTAL = "sparsemla_kernel_snapshots_total"  # counter, labels: outcome (ok|error|timeout)
KERNEL_SNAPSHOT_INTERVAL = "sparsemla_kernel_snapshot_interval_seconds"  # gauge, no labels; 0 = on demand only
KERNEL_CATEGORIES = ("attention", "indexer", "gemm", "elementwise", "copy", "communication", "other")

# -- Locust client ----------------------------------------------------------------------------------------------------
LOADGEN_LABELS = ("run_id", "concurrency", "variant")
LOADGEN_TTFT_SECONDS = "sparsemla_loadgen_ttft_seconds"
LOADGEN_ITL_SECONDS = "sparsemla_loadgen_itl_seconds"
LOADGEN_TPOT_SECONDS = "sparsemla_loadgen_tpot_seconds"
LOADGEN_E2E_SECONDS = "sparsemla_loadgen_e2e_seconds"
LOADGEN_OUTPUT_TOKENS_TOTAL = "sparsemla_loadgen_output_tokens_total"
LOADGEN_REQUESTS_TOTAL = "sparsemla_loadgen_requests_total"  # + label outcome (ok|http_error|connection|timeout|sse)
LOADGEN_USERS = "sparsemla_loadgen_users"
# Same boundaries as sglang's defaults so client and server histograms line up.
TTFT_BUCKETS = (0.1, 0.2, 0.4, 0.6, 0.8, 1.0, 2.0, 4.0, 6.0, 8.0, 10.0, 20.0, 40.0, 60.0, 80.0, 100.0, 200.0, 400.0)
ITL_BUCKETS = (
    0.002,
    0.004,
    0.006,
    0.008,
    0.010,
    0.015,
    0.020,
    0.025,
    0.030,
    0.035,
    0.040,
    0.050,
    0.060,
    0.080,
    0.100,
    0.150,
    0.200,
    0.300,
    0.400,
    0.500,
    0.750,
    1.0,
    2.0,
    4.0,
    6.0,
    8.0,
)
E2E_BUCKETS = (
    0.1,
    0.2,
    0.4,
    0.6,
    0.8,
    1.0,
    2.0,
    4.0,
    6.0,
    8.0,
    10.0,
    20.0,
    40.0,
    60.0,
    80.0,
    100.0,
    200.0,
    400.0,
    800.0,
    1200.0,
    1800.0,
    2400.0,
)
