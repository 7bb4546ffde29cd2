"""PromQL building blocks for the dashboards: variant joins, quantiles, ratios.

sglang's own series carry no ``variant`` label; the plugin (and the simulator) expose
``sparsemla_kernel_flags_info{instance, variant, <flag>=...} 1`` on the same ``/metrics`` endpoint. Every server-side
panel therefore multiplies by that info metric ``on (instance)`` to pick up ``variant`` — this works unchanged on a real
sglang with the plugin, on the simulator, and when several servers with different flags are scraped at once.
"""

from __future__ import annotations

from sparsemla import metric_names as m

INSTANCE = 'instance=~"$instance"'
RATE = "$__rate_interval"


def flags(variant_matcher: str = 'variant=~"$variant"', offset: str = "") -> str:
    """One series per instance with value 1 and its current ``variant``; ``max by`` collapses duplicates from
    multi-process export.

    Only the newest info series of an instance counts (``topk by (instance) (1, timestamp(...))``): after a flag flip
    the old series normally goes stale at the next scrape, but when Prometheus itself was down across the flip (no
    staleness marker) the old one lingers for the 5-minute lookback and a plain join would see two variants.
    ``offset`` (e.g. ``"1m"``) shifts the selectors: PromQL allows ``offset`` only on selectors, not aggregations."""
    shift = f" offset {offset}" if offset else ""
    info = f"{m.KERNEL_FLAGS_INFO}{{{INSTANCE}, {variant_matcher}}}{shift}"
    newest = f"topk by (instance) (1, timestamp({info}))"
    return f"max by (instance, variant) ({info} and on (instance, variant) {newest})"


def with_variant(vector: str, variant_matcher: str = 'variant=~"$variant"') -> str:
    """``vector`` (series with an ``instance`` label) with the server's ``variant`` label joined on."""
    return f"({vector}) * on (instance) group_left (variant) {flags(variant_matcher)}"


def sel(metric: str, extra: str = "") -> str:
    """A server-side selector filtered by ``$instance`` (plus ``extra`` matchers)."""
    return f"{metric}{{{INSTANCE}{', ' + extra if extra else ''}}}"


def rate(metric: str, extra: str = "") -> str:
    return f"rate({sel(metric, extra)}[{RATE}])"


def server_rate_by(
    metric: str, by: str = "variant", extra: str = "", variant_matcher: str = 'variant=~"$variant"'
) -> str:
    """Per-second rate of a server counter, summed by ``by`` after the variant join."""
    return f"sum by ({by}) ({with_variant(rate(metric, extra), variant_matcher)})"


def server_quantile(q: float, histogram: str, by: str = "variant", extra: str = "") -> str:
    """``histogram_quantile`` of a server histogram over ``$__rate_interval``, per ``by`` (always keeps ``le``)."""
    by_le = f"le, {by}" if by else "le"
    return f"histogram_quantile({q}, sum by ({by_le}) ({with_variant(rate(f'{histogram}_bucket', extra))}))"


def server_mean(histogram: str, by: str = "variant", extra: str = "") -> str:
    """Mean of a server histogram: summed ``_sum`` rate over summed ``_count`` rate (``> 0`` avoids 0/0 when idle)."""
    num = server_rate_by(f"{histogram}_sum", by, extra)
    den = server_rate_by(f"{histogram}_count", by, extra)
    return f"{num} / ({den} > 0)"


def server_gauge(agg: str, metric: str, by: str = "variant") -> str:
    """A server gauge aggregated with ``agg`` per ``by`` after the variant join."""
    return f"{agg} by ({by}) ({with_variant(sel(metric))})"


def slo_attainment(histogram: str, slo_var: str) -> str:
    """Share of requests at or under the SLO: the SLO must be a bucket boundary (the SLO variables only offer those)."""
    num = server_rate_by(f"{histogram}_bucket", "variant", f'le="${slo_var}"')
    den = server_rate_by(f"{histogram}_count", "variant")
    return f"{num} / ({den} > 0)"


LOADGEN = 'run_id=~"$run_id", variant=~"$variant"'


def loadgen_quantile(q: float, histogram: str, by: str = "variant") -> str:
    return f"histogram_quantile({q}, sum by (le, {by}) (rate({histogram}_bucket{{{LOADGEN}}}[{RATE}])))"


def loaded_mean(vector: str) -> str:
    """Mean of ``vector`` over the dashboard range, counting only the steps where it was > 0 (the server had load).

    Sequential A/B runs (one server restarted with the flag flipped) never overlap in time, so a ratio of two
    instantaneous rates would be empty; the ratio of the two loaded means compares the runs as wholes."""
    return f"avg_over_time(({vector} > 0)[$__range:$__interval])"
