"""The serving dashboard's template variables (data source, servers, variants, A/B, runs, SLOs) and annotations
(load-test runs and flag flips from the Grafana API; variant changes and kernel-share snapshots from Prometheus)."""

from __future__ import annotations

from grafana_foundation_sdk.builders import dashboard as db
from grafana_foundation_sdk.models import dashboard as dm

from sparsemla import metric_names as m
from sparsemla.dashboards import queries as q
from sparsemla.dashboards.spec import (
    DATASOURCE_UID,
    DS,
    GRAFANA_DS,
    TPOT_SLO_CHOICES,
    TPOT_SLO_DEFAULT,
    TTFT_SLO_CHOICES,
    TTFT_SLO_DEFAULT,
)


def variables() -> list:
    """The dashboard's template variables, in the order Grafana shows them."""

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


# Grafana-API annotations posted by sparsemla.loadtest when GRAFANA_URL is set: every load-test run is a region
# tagged "sparsemla", "loadtest", "run:<id>", "variant:<v>" (loadtest.annotations.run_body); every A/B flag flip is a
# region tagged "sparsemla", "ab", "variant=<v>", "flag=<FLAG>" (annotations.flag_flip_body, posted by `make ab` and
# the demo).
ANNOTATION_TAGS = {"Load-test runs": ["loadtest"], "Flag flips (A/B)": ["ab"]}


def annotations() -> list[db.AnnotationQuery]:
    """The dashboard's annotation queries."""
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
