"""Rows of the serving dashboard that show the engine: per-step time (the plugin's step metrics), kernel share (the
kernel-share exporter's snapshots, B - A per kernel) and saturation (KV usage, queue, cache hits)."""

from __future__ import annotations

from grafana_foundation_sdk.models import dashboard as dm

from sparsemla import metric_names as m
from sparsemla.dashboards import queries as q
from sparsemla.dashboards.spec import ORANGE, RED, Panel, Row, Target


def engine_step_row() -> Row:
    step = m.DECODE_STEP_SECONDS
    decode = 'forward_mode="decode"'
    steps_s = q.server_rate_by(f"{step}_count", "batch_bucket, variant", decode)
    targets = [
        Target(
            q.server_quantile(qq, step, "batch_bucket, variant", decode), f"{{{{variant}}}} {{{{batch_bucket}}}} p{p}"
        )
        for qq, p in ((0.5, 50), (0.99, 99))
    ]
    tokens_per_step = (
        f"{q.server_rate_by('sglang:generation_tokens_total')} / "
        f"({q.server_rate_by(f'{step}_count', 'variant', decode)} > 0)"
    )
    return Row(
        "Engine step",
        [
            Panel(
                "timeseries",
                "Decode step latency by batch bucket",
                f"GPU time of one decode forward step (`{step}`, CUDA events, plugin with SPARSEMLA_STEP_METRICS=1), "
                "p50 and p99 per batch-size bucket and variant. The per-step view sglang itself does not export.",
                "s",
                targets,
                min=0,
                width=8,
            ),
            Panel(
                "timeseries",
                "Decode steps/s by batch bucket",
                "Decode forward steps per second, stacked by batch-size bucket: where the engine spends its steps.",
                "suffix: steps/s",
                [Target(steps_s, "{{variant}} {{batch_bucket}}")],
                stack=True,
                min=0,
                width=8,
            ),
            Panel(
                "timeseries",
                "Running batch size",
                "Requests in the running batch (`sglang:num_running_reqs`) and output tokens per decode step "
                "(output tok/s / decode steps/s), per variant.",
                "short",
                [
                    Target(q.server_gauge("sum", "sglang:num_running_reqs"), "{{variant}} running"),
                    Target(tokens_per_step, "{{variant}} tokens/step"),
                ],
                min=0,
                width=8,
            ),
            Panel(
                "timeseries",
                "GPU busy by forward mode",
                "Seconds of forward execution per second, by forward category (`sglang:forward_execution_seconds_total`"
                "; on a real sglang only with SGLANG_ENABLE_METRICS_DEVICE_TIMER=1). 1 = one GPU stream always busy.",
                "percentunit",
                [
                    Target(
                        q.server_rate_by("sglang:forward_execution_seconds_total", "category, variant"),
                        "{{variant}} {{category}}",
                    )
                ],
                stack=True,
                min=0,
            ),
            Panel(
                "timeseries",
                "CUDA-graph forward passes",
                "Forward passes per second by CUDA-graph mode (`sglang:cuda_graph_passes_total`): decode should run "
                "from graphs; eager decode passes cost launch overhead.",
                "suffix: passes/s",
                [Target(q.server_rate_by("sglang:cuda_graph_passes_total", "mode, variant"), "{{variant}} {{mode}}")],
                stack=True,
                min=0,
            ),
        ],
    )


def kernel_share_row() -> Row:
    share = m.KERNEL_TIME_SHARE
    one = 'variant="$variant_%s"'
    a = f"sum by (kernel, category) ({share}{{{one % 'a'}}})"
    b = f"sum by (kernel, category) ({share}{{{one % 'b'}}})"
    # `or 0 * other` keeps kernels that only one variant runs (e.g. the Triton kernel replacing FlashMLA's).
    delta = f"({b} or 0 * {a}) - ({a} or 0 * {b})"
    organize = dm.DataTransformerConfig(
        id_val="organize",
        options={
            "excludeByName": {"Time": True},
            "renameByName": {"Value #A": "A share", "Value #B": "B share", "Value #C": "B − A"},
        },
    )
    return Row(
        "Kernel share",
        [
            Panel(
                "bargauge",
                "Top kernels by GPU time",
                f"Share of decode GPU time per kernel in the latest kernel-share snapshot (`{share}`), top 10, one "
                "panel per variant. `make profile` takes a snapshot.",
                "percentunit",
                [Target(f'topk(10, {share}{{variant=~"$variant"}})', "{{kernel}}", instant=True)],
                width=8,
                height=10,
                min=0,
                max=1,
                repeat="variant",
            ),
            Panel(
                "piechart",
                "GPU time by category",
                f"Kernel categories' share of GPU time (`{m.KERNEL_CATEGORY_SHARE}`: attention, indexer, gemm, "
                "elementwise, copy, communication, other), one panel per variant.",
                "percentunit",
                [
                    Target(
                        f'sum by (category) ({m.KERNEL_CATEGORY_SHARE}{{variant=~"$variant"}})',
                        "{{category}}",
                        instant=True,
                    )
                ],
                width=8,
                height=10,
                repeat="variant",
            ),
            Panel(
                "stat",
                "Snapshot age",
                f"Seconds since each variant's last kernel-share snapshot (`{m.KERNEL_SNAPSHOT_TIMESTAMP}`). "
                "Orange after 1 h, red after 1 day: shares then describe an older build or flag set.",
                "s",
                [
                    Target(
                        f'time() - max by (variant) ({m.KERNEL_SNAPSHOT_TIMESTAMP}{{variant=~"$variant"}})',
                        "{{variant}}",
                        instant=True,
                    ),
                ],
                width=4,
                height=10,
                thresholds=[(3600, ORANGE), (86400, RED)],
            ),
            Panel(
                "stat",
                "Snapshots in range",
                f"Kernel-share snapshots taken in the dashboard range by outcome (`{m.KERNEL_SNAPSHOTS_TOTAL}`); "
                "errors and timeouts mean a missing or corrupt profiler trace.",
                "short",
                [
                    Target(
                        f"sum by (outcome) (increase({m.KERNEL_SNAPSHOTS_TOTAL}[$__range]))",
                        "{{outcome}}",
                        instant=True,
                    )
                ],
                width=4,
                height=10,
                base_color="blue",
            ),
            Panel(
                "table",
                "Kernel share A − B",
                "Per-kernel share of GPU time in variant A ($variant_a) and B ($variant_b) and the difference "
                "B − A (positive: B spends a larger share there). Kernels only one variant runs show 0 for the other.",
                "percentunit",
                [
                    Target(a, instant=True, fmt="table"),
                    Target(b, instant=True, fmt="table"),
                    Target(delta, instant=True, fmt="table"),
                ],
                width=24,
                height=10,
                transformations=[dm.DataTransformerConfig(id_val="merge", options={}), organize],
            ),
        ],
    )


def saturation_row() -> Row:
    return Row(
        "Saturation",
        [
            Panel(
                "timeseries",
                "Token (KV) usage",
                "Share of the KV-cache token pool in use (`sglang:token_usage`), max over servers per variant. "
                "Near 1 the scheduler retracts or queues requests.",
                "percentunit",
                [Target(q.server_gauge("max", "sglang:token_usage"), "{{variant}}")],
                thresholds=[(0.9, ORANGE), (0.95, RED)],
                min=0,
                max=1,
                width=6,
            ),
            Panel(
                "timeseries",
                "Scheduler queue",
                "Requests running and waiting (`sglang:num_running_reqs`, `sglang:num_queue_reqs`) per variant.",
                "short",
                [
                    Target(q.server_gauge("sum", "sglang:num_running_reqs"), "{{variant}} running"),
                    Target(q.server_gauge("sum", "sglang:num_queue_reqs"), "{{variant}} queued"),
                ],
                min=0,
                width=6,
            ),
            Panel(
                "timeseries",
                "Queue time",
                "Time requests waited in the scheduler queue before their first forward pass "
                "(`sglang:queue_time_seconds`), p50/p99 and mean per variant.",
                "s",
                [
                    Target(q.server_quantile(0.5, "sglang:queue_time_seconds"), "{{variant}} p50"),
                    Target(q.server_quantile(0.99, "sglang:queue_time_seconds"), "{{variant}} p99"),
                    Target(q.server_mean("sglang:queue_time_seconds"), "{{variant}} mean"),
                ],
                min=0,
                width=6,
            ),
            Panel(
                "timeseries",
                "Prefix cache hit rate",
                "Share of prompt tokens served from the radix (prefix) cache (`sglang:cache_hit_rate`).",
                "percentunit",
                [Target(q.server_gauge("avg", "sglang:cache_hit_rate"), "{{variant}}")],
                min=0,
                max=1,
                width=6,
            ),
        ],
    )
