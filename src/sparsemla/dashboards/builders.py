"""Panel specs (:mod:`sparsemla.dashboards.spec`) to grafana-foundation-sdk panel builders: one builder per panel
kind, with the shared options (data source, unit, thresholds, legend, repeat, transformations, targets)."""

from __future__ import annotations

from grafana_foundation_sdk.builders import bargauge, heatmap, piechart, prometheus, stat, table, timeseries
from grafana_foundation_sdk.builders import common as cb
from grafana_foundation_sdk.builders import dashboard as db
from grafana_foundation_sdk.models import common as cm
from grafana_foundation_sdk.models import dashboard as dm
from grafana_foundation_sdk.models import piechart as pm
from grafana_foundation_sdk.models import prometheus as prom_models

from sparsemla.dashboards.spec import DS, Panel, Target


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


def panel(p: Panel, panel_id: int):  # noqa: ANN202
    """The foundation-sdk builder of panel spec ``p`` with Grafana id ``panel_id``."""
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
