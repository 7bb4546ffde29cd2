"""Rows of the serving dashboard read from exporters beside the server: the Locust load generator's client metrics
(client vs server latency) and NVIDIA's DCGM exporter (compose profile ``gpu``)."""

from __future__ import annotations

from sparsemla import metric_names as m
from sparsemla.dashboards import metrics as dcgm
from sparsemla.dashboards import queries as q
from sparsemla.dashboards.spec import RED, TPOT_SLO_DEFAULT, TTFT_SLO_DEFAULT, Panel, Row, Target


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
