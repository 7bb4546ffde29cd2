"""Rows of the serving dashboard that show what users get: KPIs, latency (quantiles and heatmaps), throughput and the
B/A throughput ratio."""

from __future__ import annotations

from sparsemla import metric_names as m
from sparsemla.dashboards import queries as q
from sparsemla.dashboards.spec import (
    GREEN,
    ORANGE,
    RED,
    TPOT_SLO_DEFAULT,
    TTFT_SLO_DEFAULT,
    Panel,
    Row,
    Target,
)


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
    # the batch averaged over the rate's own window: an instant sample can read 0 between requests while the rate
    # still counts that window's tokens (a short run then shows no point at all)
    running = q.with_variant(f"avg_over_time({q.sel('sglang:num_running_reqs')}[{q.RATE}])")
    per_user = f"{q.server_rate_by(gen)} / (sum by (variant) ({running}) > 0)"
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
                "Decode speed one user sees: output tok/s divided by the requests in the running batch (averaged "
                "over the same rate window), per variant.",
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
