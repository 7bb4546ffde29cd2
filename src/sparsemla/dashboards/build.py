"""The "sparsemla / Serving" Grafana dashboard as code (grafana-foundation-sdk==0.0.21), written to ``generated/``.

Panels are declared as small :class:`Panel` specs (title, description, unit, PromQL targets), then turned into
foundation-sdk builders; the committed JSON under ``dashboards/generated/`` is what Grafana provisions
(``ops/grafana/provisioning``), what ``sparsemla snapshot`` renders and what the tests execute against Prometheus.
``sparsemla dashboards`` regenerates it; ``sparsemla dashboards --check`` fails when it is stale.

Rows: KPIs · latency · throughput (+ B/A ratio) · engine step · kernel share · saturation · load generator · GPU.
Panels that need the ``gpu`` compose profile (DCGM) have ``profile="gpu"``; only they may be empty without a GPU.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from grafana_foundation_sdk.builders import bargauge, heatmap, piechart, prometheus, stat, table, timeseries
from grafana_foundation_sdk.builders import common as cb
from grafana_foundation_sdk.builders import dashboard as db
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models import common as cm
from grafana_foundation_sdk.models import dashboard as dm
from grafana_foundation_sdk.models import piechart as pm
from grafana_foundation_sdk.models import prometheus as prom_models

from sparsemla import metric_names as m
from sparsemla.dashboards import metrics as dcgm
from sparsemla.dashboards import queries as q

GENERATED_DIR = Path(__file__).resolve().parent / "generated"
DATASOURCE_UID = "prometheus"  # fixed in src/sparsemla/ops/grafana/provisioning/datasources/prometheus.yaml
DS = cm.DataSourceRef(type_val="prometheus", uid="${datasource}")
GRAFANA_DS = cm.DataSourceRef(type_val="grafana", uid="-- Grafana --")

# SLO variables offer only histogram bucket boundaries present in BOTH sglang's default buckets and the Locust client's
# (metric_names.TTFT_BUCKETS / ITL_BUCKETS), because attainment = bucket{le=SLO}/count is exact only on a boundary.
# Values are spelled as prometheus_client spells `le` (float repr: "2.0", "0.1").
TTFT_SLO_CHOICES = ("0.2", "0.4", "0.6", "0.8", "1.0", "2.0", "4.0", "6.0", "8.0", "10.0")
TPOT_SLO_CHOICES = ("0.01", "0.015", "0.02", "0.025", "0.03", "0.035", "0.04", "0.06", "0.08", "0.1", "0.2")
TTFT_SLO_DEFAULT = "2.0"  # seconds to first token for an interactive chat turn
TPOT_SLO_DEFAULT = "0.1"  # seconds per output token: 10 tok/s per user, faster than people read
RED, ORANGE, GREEN = "red", "orange", "green"


@dataclass(frozen=True)
class Target:
    """One PromQL query of a panel. ``fmt``: time_series | heatmap | table. ``instant`` for stat/bar/table panels."""

    expr: str
    legend: str = ""
    instant: bool = False
    fmt: str = "time_series"


@dataclass
class Panel:
    """A panel spec. ``kind``: timeseries | stat | heatmap | bargauge | piechart | table.

    ``thresholds``: (value, colour) steps above a base colour; ``profile``: the compose profile the panel needs
    (``"gpu"`` for DCGM panels, None when the simulator stack feeds it); ``repeat``: a variable to repeat over."""

    kind: str
    title: str
    description: str
    unit: str
    targets: list[Target]
    width: int = 12
    height: int = 8
    thresholds: list[tuple[float, str]] = field(default_factory=list)
    base_color: str = GREEN
    min: float | None = None
    max: float | None = None
    stack: bool = False
    repeat: str | None = None
    profile: str | None = None
    transformations: list[dm.DataTransformerConfig] = field(default_factory=list)


@dataclass
class Row:
    title: str
    panels: list[Panel]


def _latency_panel(title: str, histogram: str, what: str, slo_var: str | None) -> Panel:
    targets = [
        Target(q.server_quantile(qq, histogram), f"{{{{variant}}}} p{round(qq * 100)}") for qq in (0.5, 0.9, 0.99)
    ]
    targets.append(Target(q.server_mean(histogram), "{{variant}} mean"))
    slo = {"ttft_slo": TTFT_SLO_DEFAULT, "tpot_slo": TPOT_SLO_DEFAULT}.get(slo_var or "")
    desc = (
        f"{what} from sglang's `{histogram}` histogram: p50/p90/p99 and mean per variant over $__rate_interval. "
        "Quantiles interpolate inside buckets, so they are exact only at bucket boundaries."
    )
    if slo_var:
        desc += f" Dashed line: the ${slo_var} SLO default ({slo} s)."
    return Panel("timeseries", title, desc, "s", targets, thresholds=[(float(slo), RED)] if slo else [], min=0)


def _heatmap(title: str, histogram: str, what: str) -> Panel:
    increase = f"increase({q.sel(histogram + '_bucket')}[{q.RATE}])"
    expr = f"sum by (le) ({q.with_variant(increase)})"
    return Panel(
        "heatmap",
        title,
        f"Distribution of {what} (requests per bucket per interval, `{histogram}`), selected variants together.",
        "s",
        [Target(expr, "{{le}}", fmt="heatmap")],
        width=8,
    )


def kpi_row() -> Row:
    out_tps = f"sum({q.with_variant(q.rate('sglang:generation_tokens_total'))})"
    req_s = f"sum({q.with_variant(q.rate('sglang:e2e_request_latency_seconds_count'))})"
    loadgen_all = f"sum(rate({m.LOADGEN_REQUESTS_TOTAL}{{{q.LOADGEN}}}[{q.RATE}]))"
    loadgen_bad = f'sum(rate({m.LOADGEN_REQUESTS_TOTAL}{{{q.LOADGEN}, outcome!="ok"}}[{q.RATE}]))'

    def p95(histogram: str) -> str:
        return q.server_quantile(0.95, histogram, by="")

    def stat_(title: str, desc: str, unit: str, targets: list[Target], **kw: object) -> Panel:
        return Panel("stat", title, desc, unit, targets, width=3, height=4, **kw)

    ttft_slo_num = q.server_rate_by("sglang:time_to_first_token_seconds_bucket", "", 'le="$ttft_slo"')
    return Row(
        "KPIs",
        [
            stat_(
                "Output tok/s",
                "Generated tokens per second, all selected servers and variants "
                "(rate of `sglang:generation_tokens_total`).",
                "suffix: tok/s",
                [Target(out_tps)],
            ),
            stat_(
                "Requests/s",
                "Finished requests per second (rate of `sglang:e2e_request_latency_seconds_count`).",
                "reqps",
                [Target(req_s)],
            ),
            stat_(
                "TTFT p95",
                "95th percentile time to first token (server side, sglang histogram). "
                f"Red above the default TTFT SLO ({TTFT_SLO_DEFAULT} s).",
                "s",
                [Target(p95("sglang:time_to_first_token_seconds"))],
                thresholds=[(float(TTFT_SLO_DEFAULT), RED)],
            ),
            stat_(
                "ITL p95",
                "95th percentile inter-token latency (server side). "
                f"Red above the default TPOT SLO ({TPOT_SLO_DEFAULT} s).",
                "s",
                [Target(p95("sglang:inter_token_latency_seconds"))],
                thresholds=[(float(TPOT_SLO_DEFAULT), RED)],
            ),
            stat_(
                "E2E p95",
                "95th percentile end-to-end request latency (server side).",
                "s",
                [Target(p95("sglang:e2e_request_latency_seconds"))],
            ),
            stat_(
                "Goodput (TTFT SLO)",
                "Requests per second whose time to first token met $ttft_slo s "
                "(bucket le=$ttft_slo of `sglang:time_to_first_token_seconds`). Per-request TTFT-and-TPOT goodput "
                "is in the load-test summary (histograms cannot be joined per request).",
                "reqps",
                [Target(f"sum({ttft_slo_num})")],
            ),
            stat_(
                "Running / queued",
                "Requests in the running batch and waiting in the scheduler queue "
                "(`sglang:num_running_reqs`, `sglang:num_queue_reqs`). A growing queue means saturation.",
                "short",
                [
                    Target(f"sum({q.with_variant(q.sel('sglang:num_running_reqs'))})", "running"),
                    Target(f"sum({q.with_variant(q.sel('sglang:num_queue_reqs'))})", "queued"),
                ],
                base_color="blue",
            ),
            stat_(
                "Error ratio",
                "Share of load-generator requests that failed (HTTP errors, connection errors, "
                "timeouts, malformed SSE) over all requests; Locust client metrics, so it sees what users see. "
                "Orange above 1 %, red above 5 %.",
                "percentunit",
                [Target(f"({loadgen_bad} or vector(0)) / ({loadgen_all} > 0)")],
                thresholds=[(0.01, ORANGE), (0.05, RED)],
            ),
        ],
    )


def latency_row() -> Row:
    return Row(
        "Latency",
        [
            _latency_panel(
                "Time to first token", "sglang:time_to_first_token_seconds", "Time to first token", "ttft_slo"
            ),
            _latency_panel(
                "Inter-token latency", "sglang:inter_token_latency_seconds", "Gap between streamed tokens", "tpot_slo"
            ),
            _latency_panel(
                "Time per output token (per request)",
                "sglang:request_time_per_output_token_seconds",
                "Per-request TPOT (decode time / (output tokens - 1))",
                "tpot_slo",
            ),
            _latency_panel(
                "End-to-end request latency",
                "sglang:e2e_request_latency_seconds",
                "Request latency from arrival to last token",
                None,
            ),
            _heatmap("TTFT heatmap", "sglang:time_to_first_token_seconds", "time to first token"),
            _heatmap("ITL heatmap", "sglang:inter_token_latency_seconds", "inter-token latency"),
            _heatmap("E2E latency heatmap", "sglang:e2e_request_latency_seconds", "end-to-end latency"),
        ],
    )


def throughput_row() -> Row:
    gen, prompt = "sglang:generation_tokens_total", "sglang:prompt_tokens_total"
    out_a, out_b = ("sum(" + q.with_variant(q.rate(gen), 'variant="$variant_' + v + '"') + ")" for v in "ab")
    ratio = f"{q.loaded_mean(out_b)} / {q.loaded_mean(out_a)}"
    lg = f'{m.LOADGEN_OUTPUT_TOKENS_TOTAL}{{run_id=~"$run_id", variant="${{variant_%s}}"}}'
    lg_rate = f"sum by (concurrency) (rate({lg}[{q.RATE}]))"
    ratio_by_c = f"{q.loaded_mean(lg_rate % 'b')} / on (concurrency) {q.loaded_mean(lg_rate % 'a')}"
    per_user = f"{q.server_rate_by(gen)} / ({q.server_gauge('sum', 'sglang:num_running_reqs')} > 0)"
    return Row(
        "Throughput",
        [
            Panel(
                "timeseries",
                "Token throughput by variant",
                "Output (generated) and input (prompt) tokens per second per variant "
                "(rates of `sglang:generation_tokens_total` / `sglang:prompt_tokens_total`).",
                "suffix: tok/s",
                [
                    Target(q.server_rate_by(gen), "{{variant}} output"),
                    Target(q.server_rate_by(prompt), "{{variant}} input"),
                ],
                min=0,
            ),
            Panel(
                "timeseries",
                "Output tok/s per running request",
                "Decode speed one user sees: output tok/s divided by requests in the running batch, per variant.",
                "suffix: tok/s",
                [Target(per_user, "{{variant}}")],
                min=0,
            ),
            Panel(
                "stat",
                "B/A output tok/s",
                "Mean output tok/s of variant B ($variant_b) over variant A ($variant_a), each averaged over the "
                "dashboard range while it had load (> 0), so sequential A/B runs on one restarted server compare. "
                "Green above 1.03, red below 0.97.",
                "suffix:×",
                [Target(ratio, "B/A", instant=True)],
                width=6,
                thresholds=[(0.97, "yellow"), (1.03, GREEN)],
                base_color=RED,
            ),
            Panel(
                "bargauge",
                "B/A client tok/s by concurrency",
                "Locust client output tok/s of B ($variant_b) over A ($variant_a) per concurrency level, each the "
                "mean over the range while that level ran (`sparsemla_loadgen_output_tokens_total`).",
                "suffix:×",
                [Target(ratio_by_c, "C={{concurrency}}", instant=True)],
                width=18,
                min=0,
                max=2,
                thresholds=[(0.97, "yellow"), (1.03, GREEN)],
                base_color=RED,
            ),
        ],
    )


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


def loadgen_row() -> Row:
    lg_req = f"rate({m.LOADGEN_REQUESTS_TOTAL}{{{q.LOADGEN}}}[{q.RATE}])"
    return Row(
        "Load generator",
        [
            Panel(
                "timeseries",
                "Users",
                f"Locust users (= target concurrency) per run (`{m.LOADGEN_USERS}`).",
                "short",
                [Target(f"sum by (run_id) ({m.LOADGEN_USERS}{{{q.LOADGEN}}})", "{{run_id}}")],
                min=0,
                width=8,
            ),
            Panel(
                "timeseries",
                "Client requests/s by outcome",
                "Requests the load generator finished per second, by outcome (ok, http_error, connection, timeout, "
                "sse).",
                "reqps",
                [Target(f"sum by (outcome) ({lg_req})", "{{outcome}}")],
                stack=True,
                min=0,
                width=16,
            ),
            Panel(
                "timeseries",
                "TTFT p95: client vs server",
                "95th percentile time to first token measured by Locust (includes network and SSE parsing) and by "
                "sglang, per variant. A widening gap points at the client or the network, not the engine.",
                "s",
                [
                    Target(q.loadgen_quantile(0.95, m.LOADGEN_TTFT_SECONDS), "{{variant}} client"),
                    Target(q.server_quantile(0.95, "sglang:time_to_first_token_seconds"), "{{variant}} server"),
                ],
                thresholds=[(float(TTFT_SLO_DEFAULT), RED)],
                min=0,
            ),
            Panel(
                "timeseries",
                "ITL p95: client vs server",
                "95th percentile inter-token latency measured by Locust per streamed chunk and by sglang.",
                "s",
                [
                    Target(q.loadgen_quantile(0.95, m.LOADGEN_ITL_SECONDS), "{{variant}} client"),
                    Target(q.server_quantile(0.95, "sglang:inter_token_latency_seconds"), "{{variant}} server"),
                ],
                thresholds=[(float(TPOT_SLO_DEFAULT), RED)],
                min=0,
            ),
        ],
    )


def gpu_row() -> Row:
    energy = (
        f"sum(rate({dcgm.DCGM_TOTAL_ENERGY}[{q.RATE}])) / 1000 / "
        f"sum(rate({q.sel('sglang:generation_tokens_total')}[{q.RATE}]))"
    )
    note = "[profile gpu] Needs dcgm-exporter (compose profile `gpu`). "

    def per_gpu(title: str, agg: str, metric: str, what: str, unit: str, **kw: object) -> Panel:
        """A DCGM panel with one series per GPU: ``agg by (Hostname, gpu) (metric)``."""
        target = Target(f"{agg} by (Hostname, gpu) ({metric})", "{{Hostname}} GPU {{gpu}}")
        return Panel("timeseries", title, note + f"`{metric}`: {what}", unit, [target], min=0, profile="gpu", **kw)

    return Row(
        "GPU (DCGM, profile gpu)",
        [
            per_gpu(
                "GPU utilisation",
                "avg",
                dcgm.DCGM_GPU_UTIL,
                "share of time a kernel ran, per GPU. Coarse: a tiny kernel counts as busy.",
                "percent",
                max=100,
                width=8,
            ),
            per_gpu(
                "Tensor pipe active",
                "avg",
                dcgm.DCGM_TENSOR_ACTIVE,
                "share of cycles the tensor cores were busy, per GPU (what the MMA decode kernel should raise).",
                "percentunit",
                max=1,
                width=8,
            ),
            per_gpu(
                "Memory bandwidth (DRAM active)",
                "avg",
                dcgm.DCGM_DRAM_ACTIVE,
                "share of cycles the HBM interface was busy, per GPU; decode is bandwidth-bound, so this tracks tok/s.",
                "percentunit",
                max=1,
                width=8,
            ),
            per_gpu("Power", "sum", dcgm.DCGM_POWER_USAGE, "board power per GPU.", "watt"),
            Panel(
                "timeseries",
                "Energy per output token",
                note + f"Joules per generated token: rate of "
                f"`{dcgm.DCGM_TOTAL_ENERGY}` (mJ) over all GPUs / 1000 / output tok/s of the selected servers. "
                "Assumes the scraped GPUs are the ones serving.",
                "joule",
                [Target(energy, "J/token")],
                min=0,
                profile="gpu",
            ),
        ],
    )


ROWS = (kpi_row, latency_row, throughput_row, engine_step_row, kernel_share_row, saturation_row, loadgen_row, gpu_row)


# -- spec -> foundation-sdk builders ------------------------------------------------------------------------------


def _target(t: Target, ref: str) -> prometheus.Dataquery:
    out = prometheus.Dataquery().expr(t.expr).ref_id(ref).datasource(DS)
    if t.legend:
        out = out.legend_format(t.legend)
    out = out.instant() if t.instant else out.range()
    if t.fmt != "time_series":
        out = out.format(prom_models.PromQueryFormat(t.fmt))
    return out


def _thresholds(p: Panel) -> db.ThresholdsConfig:
    steps = [dm.Threshold(value=None, color=p.base_color)] + [dm.Threshold(value=v, color=c) for v, c in p.thresholds]
    return db.ThresholdsConfig().mode(dm.ThresholdsMode.ABSOLUTE).steps(steps)


def _legend() -> cb.VizLegendOptions:
    return (
        cb.VizLegendOptions()
        .show_legend(True)
        .display_mode(cm.LegendDisplayMode.TABLE)
        .placement(cm.LegendPlacement.BOTTOM)
        .calcs(["mean", "max", "lastNotNull"])
    )


def _reduce(calc: str = "lastNotNull") -> cb.ReduceDataOptions:
    return cb.ReduceDataOptions().calcs([calc]).values(False)


def _builder(p: Panel):  # noqa: ANN202 - one of several foundation-sdk panel builder types
    if p.kind == "timeseries":
        out = (
            timeseries.Panel()
            .legend(_legend())
            .tooltip(cb.VizTooltipOptions().mode(cm.TooltipDisplayMode.MULTI).sort(cm.SortOrder.DESCENDING))
            .line_width(1)
            .fill_opacity(30 if p.stack else 5)
            .show_points(cm.VisibilityMode.NEVER)
            .thresholds_style(
                cb.GraphThresholdsStyleConfig().mode(
                    cm.GraphThresholdsStyleMode.DASHED if p.thresholds else cm.GraphThresholdsStyleMode.OFF
                )
            )
        )
        if p.stack:
            out = out.stacking(cb.StackingConfig().mode(cm.StackingMode.NORMAL))
        return out
    if p.kind == "stat":
        return (
            stat.Panel()
            .reduce_options(_reduce())
            .graph_mode(cm.BigValueGraphMode.AREA)
            .color_mode(cm.BigValueColorMode.VALUE)
            .text_mode(cm.BigValueTextMode.VALUE_AND_NAME if len(p.targets) > 1 else cm.BigValueTextMode.AUTO)
        )
    if p.kind == "heatmap":
        return (
            heatmap.Panel()
            .calculate(False)
            .y_axis(heatmap.YAxisConfig().unit(p.unit))
            .color(heatmap.HeatmapColorOptions().mode(_heatmap_color_mode()).scheme("Oranges").steps(64))
        )
    if p.kind == "bargauge":
        return (
            bargauge.Panel()
            .reduce_options(_reduce())
            .orientation(cm.VizOrientation.HORIZONTAL)
            .display_mode(cm.BarGaugeDisplayMode.GRADIENT)
            .show_unfilled(True)
        )
    if p.kind == "piechart":
        return (
            piechart.Panel()
            .reduce_options(_reduce())
            .pie_type(pm.PieChartType.DONUT)
            .legend(
                piechart.PieChartLegendOptions()
                .show_legend(True)
                .display_mode(cm.LegendDisplayMode.TABLE)
                .placement(cm.LegendPlacement.RIGHT)
                .values([pm.PieChartLegendValues.PERCENT])
            )
        )
    if p.kind == "table":
        return table.Panel().sort_by([cb.TableSortByFieldState().display_name("B − A").desc(True)])
    raise ValueError(f"unknown panel kind {p.kind!r} in {p.title!r}")


def _heatmap_color_mode():  # noqa: ANN202
    from grafana_foundation_sdk.models import heatmap as hm

    return hm.HeatmapColorMode.SCHEME


def _panel(p: Panel, panel_id: int):  # noqa: ANN202
    out = (
        _builder(p)
        .id(panel_id)
        .title(p.title)
        .description(p.description)
        .datasource(DS)
        .unit(p.unit)
        .span(p.width)
        .height(p.height)
        .thresholds(_thresholds(p))
    )
    if p.min is not None:
        out = out.min(p.min)
    if p.max is not None:
        out = out.max(p.max)
    if p.repeat:
        out = out.repeat(p.repeat).repeat_direction("h").max_per_row(2)
    for transformation in p.transformations:
        out = out.with_transformation(transformation)
    refs = "ABCDEFGHIJ"
    for i, t in enumerate(p.targets):
        out = out.with_target(_target(t, refs[i]))
    return out


# -- variables and annotations ------------------------------------------------------------------------------------


def _variables() -> list:
    def query_var(name: str, label: str, query: str, desc: str, multi: bool, sort: dm.VariableSort) -> db.QueryVariable:
        out = (
            db.QueryVariable(name)
            .label(label)
            .description(desc)
            .datasource(DS)
            .query(query)
            .definition(query)
            .refresh(dm.VariableRefresh.ON_TIME_RANGE_CHANGED)
            .sort(sort)
            .multi(multi)
        )
        if multi:
            out = out.include_all(True).all_value(".*").current(dm.VariableOption(text="All", value="$__all"))
        return out

    def custom_var(name: str, label: str, choices: tuple[str, ...], default: str, desc: str) -> db.CustomVariable:
        return (
            db.CustomVariable(name)
            .label(label)
            .description(desc)
            .values(",".join(choices))
            .current(dm.VariableOption(selected=True, text=default, value=default))
            .options([dm.VariableOption(selected=c == default, text=c, value=c) for c in choices])
        )

    asc, desc = dm.VariableSort.ALPHABETICAL_ASC, dm.VariableSort.ALPHABETICAL_DESC
    return [
        db.DatasourceVariable("datasource")
        .label("Data source")
        .type("prometheus")
        .description("Prometheus data source; provisioning pins its uid to `prometheus`.")
        .current(dm.VariableOption(selected=True, text="Prometheus", value=DATASOURCE_UID)),
        query_var(
            "instance",
            "Server",
            "label_values(sglang:num_running_reqs, instance)",
            "sglang (or simulator) scrape targets.",
            True,
            asc,
        ),
        query_var(
            "variant",
            "Variant",
            "label_values(variant)",
            "Kernel flag sets (`variant` label of sparsemla_kernel_flags_info, the exporter and Locust).",
            True,
            asc,
        ),
        query_var("variant_a", "A", "label_values(variant)", "Baseline variant of A/B panels.", False, asc),
        query_var(
            "variant_b",
            "B",
            "label_values(variant)",
            "Candidate variant of A/B panels (sorted descending so it defaults to a different one than A).",
            False,
            desc,
        ),
        query_var("run_id", "Run", f"label_values({m.LOADGEN_REQUESTS_TOTAL}, run_id)", "Load-test runs.", True, desc),
        custom_var(
            "ttft_slo",
            "TTFT SLO (s)",
            TTFT_SLO_CHOICES,
            TTFT_SLO_DEFAULT,
            "Time-to-first-token SLO; only histogram bucket boundaries, so attainment is exact.",
        ),
        custom_var(
            "tpot_slo",
            "TPOT SLO (s)",
            TPOT_SLO_CHOICES,
            TPOT_SLO_DEFAULT,
            "Time-per-output-token SLO; only histogram bucket boundaries.",
        ),
    ]


# Grafana-API annotations posted by sparsemla.loadtest when GRAFANA_URL is set: every load-test run is a region tagged
# "sparsemla", "loadtest", "run:<id>", "variant:<v>" (report.post_grafana_annotations); every A/B flag flip is a region
# tagged "sparsemla", "ab", "variant=<v>", "flag=<FLAG>" (annotations.flag_flip_body, posted by `make ab` and the demo).
ANNOTATION_TAGS = {"Load-test runs": ["loadtest"], "Flag flips (A/B)": ["ab"]}


def _annotations() -> list[db.AnnotationQuery]:
    out = [
        db.AnnotationQuery()
        .name(name)
        .datasource(GRAFANA_DS)
        .enable(True)
        .icon_color(color)
        .target(db.AnnotationTarget().type("tags").tags(tags).match_any(True).limit(200))
        for (name, tags), color in zip(ANNOTATION_TAGS.items(), ("blue", "purple"), strict=True)
    ]
    # Prometheus-side markers need no Grafana API: a variant appearing on a server and a new kernel-share snapshot.
    out.append(
        db.AnnotationQuery()
        .name("Variant changes")
        .datasource(DS)
        .enable(True)
        .icon_color("yellow")
        .expr(f"{q.flags()} unless {q.flags(offset='1m')}")
        .step("1m")
        .title_format("variant {{variant}}")
        .text_format("{{instance}} now serves {{variant}}")
        .tag_keys("variant,instance")
    )
    out.append(
        db.AnnotationQuery()
        .name("Kernel-share snapshots")
        .datasource(DS)
        .enable(False)
        .icon_color("green")
        # The gauge holds the snapshot's unix time: it is in (t - 60 s, t] at exactly one 1 m step t per snapshot (the
        # first snapshot of a variant included, which changes() would miss), and useValueForTime puts the marker at
        # the snapshot's own time (Grafana wants milliseconds).
        .expr(f'max by (variant) ({m.KERNEL_SNAPSHOT_TIMESTAMP}{{variant=~"$variant"}} > time() - 60) * 1000')
        .use_value_for_time(True)
        .step("1m")
        .title_format("kernel-share snapshot ({{variant}})")
        .tag_keys("variant")
    )
    return out


def serving_spec() -> list[Row]:
    """The rows and panel specs of the serving dashboard (what the tests iterate over)."""
    return [make() for make in ROWS]


def serving_dashboard() -> dict:
    """The "sparsemla / Serving" dashboard as Grafana JSON (a dict)."""
    dash = (
        db.Dashboard("sparsemla / Serving")
        .uid("sparsemla-serving")
        .description("sglang + sparsemla kernels: throughput, latency, per-step time, kernel share and A/B by variant.")
        .tags(["sparsemla", "sglang", "llm-serving"])
        .readonly()
        .tooltip(dm.DashboardCursorSync.CROSSHAIR)
        .time("now-30m", "now")
        .refresh("10s")
        .timezone("browser")
        .variables(_variables())
        .annotations(_annotations())
    )
    panel_id = 1
    for row in serving_spec():
        dash = dash.with_row(db.Row(row.title).id(panel_id))
        panel_id += 1
        for p in row.panels:
            dash = dash.with_panel(_panel(p, panel_id))
            panel_id += 1
    return _layout(json.loads(JSONEncoder(sort_keys=True).encode(dash.build())))


def _layout(dashboard: dict) -> dict:
    """Place panels left to right, wrapping at Grafana's 24 columns; a row header starts a new line.

    (The sdk's own placement lets a wide panel overflow the grid after a short one.)"""
    x = y = line_h = 0
    for panel in dashboard["panels"]:
        pos = panel["gridPos"]
        if panel["type"] == "row" or x + pos["w"] > 24:
            x, y, line_h = 0, y + line_h, 0
        pos["x"], pos["y"] = x, y
        x += pos["w"]
        line_h = max(line_h, pos["h"])
        if panel["type"] == "row":
            x, y, line_h = 0, y + pos["h"], 0
    return dashboard


DASHBOARDS = {"sparsemla-serving.json": serving_dashboard}
# The panels an A/B report (`make compare`) embeds: render them with variant_a/variant_b pinned to the two runs'.
COMPARE_PANELS = (
    "Token throughput by variant",
    "B/A output tok/s",
    "B/A client tok/s by concurrency",
    "Inter-token latency",
    "Time to first token",
    "Decode step latency by batch bucket",
    "Kernel share A − B",
    "Top kernels by GPU time",
)


def render(builder) -> str:  # noqa: ANN001
    """The committed text of one dashboard: stable key order, 2-space indent, trailing newline."""
    return json.dumps(builder(), indent=2, sort_keys=True, ensure_ascii=False) + "\n"


def write_all(out_dir: Path = GENERATED_DIR) -> list[Path]:
    """Regenerate every dashboard JSON into ``out_dir``; returns the paths written."""
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for name, builder in DASHBOARDS.items():
        path = out_dir / name
        path.write_text(render(builder))
        written.append(path)
    return written


def stale(out_dir: Path = GENERATED_DIR) -> list[str]:
    """Names of committed dashboards that differ from what the code generates (or are missing, or unexpected)."""
    problems = [
        name
        for name, builder in DASHBOARDS.items()
        if not (out_dir / name).is_file() or (out_dir / name).read_text() != render(builder)
    ]
    extra = sorted(p.name for p in out_dir.glob("*.json") if p.name not in DASHBOARDS) if out_dir.is_dir() else []
    return problems + extra


def load(name: str = "sparsemla-serving.json", out_dir: Path = GENERATED_DIR) -> dict:
    """A committed dashboard JSON as a dict."""
    return json.loads((out_dir / name).read_text())


if __name__ == "__main__":
    for written in write_all():
        print(written)
