"""The panel spec the dashboards are declared in (:class:`Target`, :class:`Panel`, :class:`Row`) and the constants
the rows share: data sources, SLO variables' choices and defaults, threshold colours.

:mod:`sparsemla.dashboards.builders` turns a spec into foundation-sdk builders; the ``rows_*`` modules declare the rows.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from grafana_foundation_sdk.models import common as cm
from grafana_foundation_sdk.models import dashboard as dm

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
