"""End to end without Docker or Grafana: the plain-process stack (simulator + Debian's Prometheus + kernel-share
exporter), a short Locust run, one kernel-share snapshot, then every panel's PromQL — variables substituted as Grafana
would — must return data from Prometheus over the run window, and `sparsemla snapshot` must render non-empty PNGs.

The only panels allowed to stay empty are the DCGM ones (profile `gpu`): no dcgm-exporter runs without an NVIDIA GPU
and its agent, and `make up` deliberately has no DCGM job. They are listed explicitly below so that a new panel that
silently returns nothing cannot hide among them.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

# Needs the ops/loadtest extras: the GPU machine installs the runtime only, so this module skips there.
pytest.importorskip("grafana_foundation_sdk")
from sparsemla import flags, procs  # noqa: E402
from sparsemla import variant as kernel_variant  # noqa: E402
from sparsemla.dashboards import build, grafana_eval  # noqa: E402
from sparsemla.dashboards.panels import iter_panels  # noqa: E402
from sparsemla.ops import stack  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

# Every panel that reads a DCGM_FI_* series (the "GPU (DCGM, profile gpu)" row); "Energy per output token" also reads
# sglang tokens, but its numerator is DCGM energy, so it is empty without a GPU too.
GPU_ONLY_PANELS = {
    "GPU utilisation",
    "Tensor pipe active",
    "Memory bandwidth (DRAM active)",
    "Power",
    "Energy per output token",
}
RUN_ID = "dash-e2e"


def _cli(*args: str) -> list[str]:
    script = Path(sys.executable).parent / "sparsemla"
    return [str(script), *args] if script.exists() else [sys.executable, "-m", "sparsemla.cli", *args]


@pytest.fixture(scope="module")
def run_window(tmp_path_factory: pytest.TempPathFactory):  # noqa: ANN201
    """Bring the stack up, drive it, and yield (prometheus url, start, end, tmp dir); the stack is down afterwards."""
    tmp = tmp_path_factory.mktemp("dash-e2e")
    run_dir = tmp / "run"
    ports = {"server": procs.free_port(), "prometheus": procs.free_port(), "exporter": procs.free_port()}
    locust_port = procs.free_port()
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("SPARSEMLA_RESULTS_DIR", str(tmp / "results"))  # inherited by every process the stack starts
        # Locust's client metrics on a free port (other tests may run Locust on 9646 at the same time).
        urls = stack.up(
            server="sim", prometheus=True, exporter=True, run_dir=run_dir, port=ports["server"],
            prometheus_port=ports["prometheus"], exporter_port=ports["exporter"], locust_metrics_port=locust_port,
        )  # fmt: skip
        try:
            assert urls.prometheus and urls.exporter
            start = time.time()
            env = flags.child_env()
            # 16 output tokens: requests finish within the run at the calibrated baseline step (~185 ms at batch 4)
            load = subprocess.Popen(
                _cli("loadtest", "--concurrency", "4", "--duration", "12s", "--target", urls.server,
                     "--run-id", RUN_ID, "--metrics-port", str(locust_port), "--workload", "random:256:16"),
                env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
            )  # fmt: skip
            try:
                time.sleep(7)  # the profiler counts forward steps: snapshot while the server is generating
                profile = subprocess.run(
                    _cli("profile", "--target", urls.server, "--exporter", urls.exporter, "--num-steps", "5",
                         "--timeout", "60"),
                    env=env, capture_output=True, text=True, timeout=150,
                )  # fmt: skip
                assert profile.returncode == 0, profile.stdout + profile.stderr
                out, _ = load.communicate(timeout=120)
                assert load.returncode == 0, out
            finally:
                if load.poll() is None:
                    load.kill()
                    load.wait()
            time.sleep(grafana_eval.SCRAPE_INTERVAL_S + 2)  # one more scrape after the last request
            yield urls.prometheus, start, time.time(), tmp
        finally:
            stack.down(run_dir)
    assert procs.running(run_dir) == {}


def test_every_panel_returns_data_except_the_gpu_profile(run_window) -> None:  # noqa: ANN001
    prom_url, start, end, _ = run_window
    dashboard = build.load()
    api = grafana_eval.PrometheusAPI(prom_url)
    try:
        resolved = grafana_eval.resolve_variables(dashboard, api, start, end)
        assert RUN_ID in resolved.selected["run_id"]
        assert kernel_variant.current() in resolved.selected["variant"]  # the simulator runs with default flags
        empty_targets, empty_panels, checked = [], set(), 0
        for ref in iter_panels(dashboard):
            for panel_ref, extra in grafana_eval.expand_repeats(ref, resolved):
                results = grafana_eval.panel_series(panel_ref, api, {**resolved.text, **extra}, start, end)
                checked += 1
                missing = [r.expr for r in results if not grafana_eval.has_data(r)]
                if missing:
                    empty_panels.add(ref.title)
                    empty_targets += [(ref.title, expr) for expr in missing]
                if ref.profile == "gpu":
                    assert missing, f"{ref.title} has data without a GPU?"
        # Prometheus-side annotations run too: the snapshot and the variant appearing both happened in the window
        # (evaluated at every scrape rather than at the annotation's 1 m step, which steps over a window this short).
        for annotation in dashboard["annotations"]["list"]:
            if annotation.get("expr"):
                expr = grafana_eval.promql.expand(annotation["expr"], resolved.text)
                assert api.query_range(expr, start - 30, end, grafana_eval.SCRAPE_INTERVAL_S), annotation["name"]
    finally:
        api.close()
    assert checked >= 40
    assert empty_panels == GPU_ONLY_PANELS, [t for t in empty_targets if t[0] not in GPU_ONLY_PANELS]


def test_snapshot_renders_every_panel_to_png(run_window) -> None:  # noqa: ANN001
    prom_url, start, end, tmp = run_window
    out = tmp / "png"
    result = subprocess.run(
        _cli("snapshot", "--from", f"{start:.0f}", "--to", f"{end:.0f}", "--prometheus", prom_url, "--out", str(out)),
        capture_output=True, text=True, timeout=180, env=flags.child_env(),
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    index = json.loads((out / "index.json").read_text())
    files = sorted(out.glob("*.png"))
    assert len(files) == len(index["panels"]) >= 40
    from PIL import Image

    for panel in index["panels"]:
        path = out / panel["file"]
        with Image.open(path) as img:
            assert img.format == "PNG" and img.size[0] >= 300 and img.size[1] >= 200
            gray = img.convert("L")
            inked = sum(gray.histogram()[:240]) / (gray.size[0] * gray.size[1])
        # A title alone inks < 0.5 % of a panel; a drawn value, line, bar or table inks more.
        assert inked > (0.005 if any(panel["data"]) else 0.0), f"{path.name}: only {inked:.2%} drawn"
    no_data = {p["title"] for p in index["panels"] if not any(p["data"])}
    assert no_data == GPU_ONLY_PANELS


def test_compare_report_embeds_the_compare_panels(run_window) -> None:  # noqa: ANN001
    """`sparsemla compare A B --prometheus URL` (what `make compare`, `make ab` and the demo write): the report embeds
    exactly COMPARE_PANELS over the runs' time, variants and run ids pinned, every PNG non-empty and with data.
    A and B are the one Locust run here (one variant), so the B/A panels read 1."""
    prom_url, start, end, tmp = run_window
    run = tmp / "results" / "loadtest" / RUN_ID
    out = tmp / "compare"
    result = subprocess.run(
        _cli("compare", str(run), str(run), "--prometheus", prom_url, "--out", str(out)),
        capture_output=True, text=True, timeout=180, env=flags.child_env(),
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    panels = json.loads((out / "compare.json").read_text())["panels"]
    assert panels["error"] is None and len(panels["windows"]) == 1
    window = panels["windows"][0]
    assert start - 30 < window["start"] < window["end"] <= end + 30  # the run's own time (summary.json)
    variant = kernel_variant.current()
    assert panels["variables"] == {"variant_a": variant, "variant_b": variant, "variant": [variant],
                                   "run_id": [RUN_ID]}  # fmt: skip
    assert {p["title"].split(" — ")[0] for p in window["panels"]} == set(build.COMPARE_PANELS)
    assert all(p["has_data"] for p in window["panels"]), [p["title"] for p in window["panels"] if not p["has_data"]]
    html, md = (out / "report.html").read_text(), (out / "report.md").read_text()
    from PIL import Image

    for panel in window["panels"]:
        assert f'src="{panel["file"]}"' in html and f"]({panel['file']})" in md
        with Image.open(out / panel["file"]) as img:
            assert img.format == "PNG" and img.size[0] >= 300
            gray = img.convert("L")
            assert sum(gray.histogram()[:240]) / (gray.size[0] * gray.size[1]) > 0.005, panel["file"]
    assert "dashboard panels: " in result.stdout
