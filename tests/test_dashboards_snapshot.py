"""Panel renderer (`sparsemla snapshot`) and Grafana emulation without a Prometheus: variables, legends, units,
times, one PNG per kind."""

from __future__ import annotations

import math
import random
from pathlib import Path

import pytest

# Needs the ops/loadtest extras: the GPU machine installs the runtime only, so this module skips there.
pytest.importorskip("grafana_foundation_sdk")
from PIL import Image  # noqa: E402
from typer.testing import CliRunner  # noqa: E402

from sparsemla.dashboards import build, grafana_eval, render  # noqa: E402
from sparsemla.dashboards.cli import app  # noqa: E402
from sparsemla.dashboards.grafana_eval import Series, TargetResult  # noqa: E402
from sparsemla.dashboards.panels import iter_panels  # noqa: E402


class FakeAPI:
    """label_values from a fixed table; records what was asked."""

    def __init__(self, labels: dict[str, list[str]]) -> None:
        self.labels = labels
        self.asked: list[tuple[str, str | None]] = []

    def label_values(self, label: str, match: str | None, start: float, end: float) -> list[str]:
        self.asked.append((label, match))
        return list(self.labels.get(label, []))


@pytest.fixture(scope="module")
def serving() -> dict:
    return build.load("sparsemla-serving.json")


def test_variables_resolve_like_grafana(serving: dict) -> None:
    api = FakeAPI({"instance": ["b:1", "a:1"], "variant": ["mma_decode", "baseline"], "run_id": ["r1", "r2"]})
    res = grafana_eval.resolve_variables(serving, api, 0, 60)  # type: ignore[arg-type]
    assert res.text["instance"] == ".*" and res.selected["instance"] == ["a:1", "b:1"]  # All -> allValue, sorted asc
    assert res.text["variant_a"] == "baseline" and res.text["variant_b"] == "mma_decode"  # asc / desc defaults differ
    assert res.selected["run_id"] == ["r2", "r1"]
    assert res.text["ttft_slo"] == build.TTFT_SLO_DEFAULT and res.text["datasource"] == build.DATASOURCE_UID
    assert ("instance", "sglang:num_running_reqs") in api.asked
    pinned = grafana_eval.resolve_variables(
        serving,
        api,
        0,
        60,
        {"variant": ["baseline", "mma.decode"], "tpot_slo": "0.04"},  # type: ignore[arg-type]
    )
    # as Grafana writes a multi-value regex into the PromQL string (Prometheus reads `mma\.decode` out of it)
    assert pinned.text["variant"] == r"(baseline|mma\\.decode)" and pinned.text["tpot_slo"] == "0.04"


def test_repeat_panels_expand_per_selected_value(serving: dict) -> None:
    api = FakeAPI({"variant": ["baseline", "mma_decode"]})
    res = grafana_eval.resolve_variables(serving, api, 0, 60)  # type: ignore[arg-type]
    ref = next(r for r in iter_panels(serving) if r.panel.get("repeat") == "variant")
    expanded = grafana_eval.expand_repeats(ref, res)
    assert [(r.title, extra) for r, extra in expanded] == [
        (f"{ref.title} — baseline", {"variant": "baseline"}),
        (f"{ref.title} — mma_decode", {"variant": "mma_decode"}),
    ]


def test_legend_format() -> None:
    labels = {"__name__": "x", "variant": "baseline", "le": "0.1"}
    assert grafana_eval.legend("{{variant}} p{{ le }}", labels) == "baseline p0.1"
    assert grafana_eval.legend("", labels) == 'x{le="0.1", variant="baseline"}'
    assert grafana_eval.legend("{{missing}} B/A", labels) == "B/A"


def test_parse_time() -> None:
    now = 1_800_000_000.0
    assert grafana_eval.parse_time("now", now) == now
    assert grafana_eval.parse_time("now-15m", now) == now - 900
    assert grafana_eval.parse_time("now-2d", now) == now - 172800
    assert grafana_eval.parse_time("1700000000.5", now) == 1700000000.5
    assert grafana_eval.parse_time("2026-01-31T12:00:00", now) == 1769860800.0  # UTC when no zone
    assert grafana_eval.parse_time("2026-01-31T13:00:00+01:00", now) == 1769860800.0
    with pytest.raises(ValueError, match="now-<N>"):
        grafana_eval.parse_time("yesterday", now)
    assert grafana_eval.step_for(0, 600) == 5 and grafana_eval.step_for(0, 86400) == 288


@pytest.mark.parametrize(
    ("value", "unit", "text"),
    [
        (0.0123, "s", "12.3 ms"),
        (2.5, "s", "2.5 s"),
        (0.42, "percentunit", "42%"),
        (1530.0, "suffix: tok/s", "1.53k tok/s"),
        (3.0, "reqps", "3 req/s"),
        (float("nan"), "s", "–"),
        (1.07, "suffix:×", "1.07×"),
    ],
)
def test_format_value(value: float, unit: str, text: str) -> None:
    assert render.format_value(value, unit) == text


def _synthetic(ref, rng: random.Random, start: float, end: float) -> list[TargetResult]:  # noqa: ANN001
    """Random data shaped like what each panel's targets return (buckets for heatmaps, instants for bar/pie/table)."""
    out = []
    for t in ref.targets:
        series = []
        if t.get("format") == "heatmap":
            total = [0.0] * 20
            for le in ("0.1", "0.4", "1.0", "+Inf"):
                total = [c + rng.uniform(0, 5) for c in total]
                pts = [(start + i * (end - start) / 19, c) for i, c in enumerate(total)]
                series.append(Series(t["refId"], le, {"le": le}, pts))
        elif t.get("instant"):
            for k in range(rng.randint(2, 6)):
                labels = {"kernel": f"k{k}", "category": rng.choice(["gemm", "attention"]), "concurrency": str(k)}
                series.append(Series(t["refId"], f"k{k}", labels, [(end, rng.uniform(0, 1))]))
        else:
            for k in range(rng.randint(1, 3)):
                pts = [(start + i * (end - start) / 29, rng.uniform(0, 2)) for i in range(30)]
                series.append(Series(t["refId"], f"s{k}", {"variant": f"v{k}"}, pts))
        out.append(TargetResult(t["refId"], t["expr"], bool(t.get("instant")), series))
    return out


def test_every_committed_panel_renders_from_random_data(serving: dict, tmp_path: Path) -> None:
    rng = random.Random(1234)
    start, end = 1_800_000_000.0, 1_800_000_900.0
    kinds = set()
    for i, ref in enumerate(iter_panels(serving)):
        path = tmp_path / f"{i}.png"
        render.render_panel(ref, _synthetic(ref, rng, start, end), path, start, end)
        with Image.open(path) as img:
            assert img.format == "PNG"
            w, h = img.size
            assert w >= 400 * 0.9 and h >= 200
            gray = img.convert("L")
            assert sum(gray.histogram()[:240]) / (w * h) > 0.005, ref.title
        kinds.add(ref.kind)
    assert kinds == set(render.DRAW)


def test_no_data_panels_still_render(serving: dict, tmp_path: Path) -> None:
    for ref in iter_panels(serving):
        empty = [TargetResult(t["refId"], t["expr"], bool(t.get("instant")), []) for t in ref.targets]
        render.render_panel(ref, empty, tmp_path / "p.png", 0, 60)
        assert (tmp_path / "p.png").stat().st_size > 0
        assert not any(grafana_eval.has_data(r) for r in empty)


def test_has_data_ignores_nan() -> None:
    nan = TargetResult("A", "x", False, [Series("A", "x", {}, [(1.0, math.nan)])])
    one = TargetResult("A", "x", False, [Series("A", "x", {}, [(1.0, math.nan), (2.0, 0.0)])])
    assert not grafana_eval.has_data(nan) and grafana_eval.has_data(one)


def test_snapshot_cli_rejects_bad_input(tmp_path: Path) -> None:
    runner = CliRunner()
    bad_time = runner.invoke(app, ["snapshot", "--from", "yesterday", "--out", str(tmp_path)])
    assert bad_time.exit_code == 2 and "now-<N>" in bad_time.output
    reversed_range = runner.invoke(app, ["snapshot", "--from", "now", "--to", "now-1h", "--out", str(tmp_path)])
    assert reversed_range.exit_code == 2
    bad_var = runner.invoke(
        app, ["snapshot", "--var", "novalue", "--prometheus", "http://127.0.0.1:9", "--out", str(tmp_path)]
    )
    assert bad_var.exit_code == 2 and "NAME=VALUE" in bad_var.output
    down = runner.invoke(app, ["snapshot", "--prometheus", "http://127.0.0.1:9", "--out", str(tmp_path)])
    assert down.exit_code == 2 and "is Prometheus running" in down.output


def test_snapshot_rejects_unknown_titles_before_querying(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="no panel titled 'Nope'"):
        render.render_panels("http://127.0.0.1:9", 0, 60, tmp_path, titles=["Nope", *build.COMPARE_PANELS])
    with pytest.raises(ValueError, match="empty time range"):
        render.render_panels("http://127.0.0.1:9", 60, 60, tmp_path)
