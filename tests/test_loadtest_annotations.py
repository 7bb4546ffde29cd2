"""A/B flag-flip annotations against a stand-in Grafana (a tiny local HTTP server on a free port), and the report's
dashboard-panel section when Prometheus cannot be reached (no Prometheus needed here; the end-to-end version with a
real one is in tests/test_dashboards_e2e.py)."""

from __future__ import annotations

import json
import shlex
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlparse

import pytest

# Needs the ops/loadtest extras: the GPU machine installs the runtime only, so this module skips there.
pytest.importorskip("grafana_foundation_sdk")
from sparsemla.dashboards import build, grafana_api  # noqa: E402
from sparsemla.loadtest.ab import flip_flag  # noqa: E402
from sparsemla.loadtest.annotations import FLIP_TAG, Grafana, flag_flip_body, post_run_annotations  # noqa: E402
from sparsemla.loadtest.report import Run, compare_runs, write_report  # noqa: E402
from sparsemla.loadtest.report_panels import pinned_variables, windows_for  # noqa: E402
from sparsemla.procs import free_port  # noqa: E402

FLAG = "SPARSEMLA_MMA_DECODE"


class _StandIn:
    """Plays Grafana (POST /api/annotations) and an sglang-like target whose flag a restart command flips."""

    def __init__(self) -> None:
        self.annotations: list[dict[str, Any]] = []
        self.auth: list[str | None] = []
        self.flag_value = "off"
        self.grafana_status = 200


@contextmanager
def stand_in() -> Iterator[tuple[str, _StandIn]]:
    state = _StandIn()

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *_args: Any) -> None:
            pass

        def _send(self, status: int, body: str, ctype: str = "application/json") -> None:
            data = body.encode()
            self.send_response(status)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self) -> None:  # noqa: N802 (http.server's naming)
            url = urlparse(self.path)
            if url.path == "/health":
                self._send(200, "ok", "text/plain")
            elif url.path == "/metrics":
                variant = "mma_decode" if state.flag_value == "on" else "baseline"
                self._send(
                    200,
                    "# TYPE sparsemla_kernel_flags_info gauge\n"
                    f'sparsemla_kernel_flags_info{{sparsemla_mma_decode="{state.flag_value}",variant="{variant}"}} 1\n',
                    "text/plain",
                )
            elif url.path == "/restart":  # what the user's restart command calls, with the flag's new value
                state.flag_value = "on" if parse_qs(url.query)["value"][0] == "1" else "off"
                self._send(200, "{}")
            else:
                self._send(404, '{"message": "not found"}')

        def do_POST(self) -> None:  # noqa: N802
            length = int(self.headers.get("Content-Length", "0"))
            body = json.loads(self.rfile.read(length))
            if self.path != "/api/annotations":
                self._send(404, '{"message": "not found"}')
                return
            if state.grafana_status != 200:
                self._send(state.grafana_status, '{"message": "unauthorized"}')
                return
            state.annotations.append(body)
            state.auth.append(self.headers.get("Authorization"))
            self._send(200, json.dumps({"message": "Annotation added", "id": len(state.annotations)}))

    server = ThreadingHTTPServer(("127.0.0.1", free_port()), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", state
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


def _restart_command(base: str) -> str:
    """A user restart command: tells the stand-in target the flag value it finds in its environment."""
    code = "import sys, urllib.request; urllib.request.urlopen(sys.argv[1] + sys.argv[2]).read()"
    return f'{shlex.quote(sys.executable)} -c {shlex.quote(code)} {base}/restart?value= "${FLAG}"'


def test_flip_payload_matches_the_dashboard_annotation_query() -> None:
    body = flag_flip_body(FLAG, "1", "mma_decode", 1_700_000_000.25, 1_700_000_004.5, "http://t")
    assert body["time"] == 1_700_000_000_250 and body["timeEnd"] == 1_700_000_004_500
    assert body["tags"] == ["sparsemla", "ab", "variant=mma_decode", f"flag={FLAG}"]
    assert f"{FLAG}=1" in body["text"] and "mma_decode" in body["text"]
    # Grafana shows a tag annotation when the annotation carries the query's tags (matchAny: one is enough).
    query = next(a for a in build.load()["annotations"]["list"] if a["name"] == "Flag flips (A/B)")
    assert query["target"]["type"] == "tags" and FLIP_TAG in query["target"]["tags"]
    assert set(query["target"]["tags"]) & set(body["tags"])


def test_each_flip_posts_an_ab_annotation_with_the_new_variant() -> None:
    with stand_in() as (base, state):
        grafana = Grafana(base, token="t0ken")
        said: list[str] = []
        for value, variant in (("0", "baseline"), ("1", "mma_decode"), ("0", "baseline")):
            before = time.time()
            info = flip_flag(_restart_command(base), FLAG, value, target=base, grafana=grafana, say=said.append,
                             timeout_s=20)  # fmt: skip
            assert info.variant == variant
            posted = state.annotations[-1]
            assert posted["tags"] == ["sparsemla", "ab", f"variant={variant}", f"flag={FLAG}"]
            assert before * 1000 - 1 <= posted["time"] <= posted["timeEnd"] <= time.time() * 1000 + 1
        assert len(state.annotations) == 3 and state.auth == ["Bearer t0ken"] * 3 and said == []

        # Grafana refusing (or down) is reported and never stops the flip.
        state.grafana_status = 401
        info = flip_flag(_restart_command(base), FLAG, "1", target=base, grafana=grafana, say=said.append, timeout_s=20)
        assert info.variant == "mma_decode" and len(state.annotations) == 3
        assert len(said) == 1 and "could not post" in said[0] and "401" in said[0]


def test_grafana_from_flags(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("GRAFANA_URL", raising=False)
    assert Grafana.from_flags() is None
    monkeypatch.setenv("GRAFANA_URL", "http://grafana:3000/")
    monkeypatch.setenv("GRAFANA_API_TOKEN", "abc")
    assert Grafana.from_flags() == Grafana("http://grafana:3000", "abc")


def _run(name: str, path: Path, start: float, variant: str, flag: str) -> Run:
    summary = {
        "concurrency": 4, "run_id": name, "variant": variant, "server_flags": {"sparsemla_mma_decode": flag},
        "output_tok_per_s": 100.0, "ttft_s": {"p50": 0.1, "p99": 0.2}, "itl_s": {"p50": 0.02, "p99": 0.03},
        "goodput": {"share": 1.0}, "ci95": {}, "test_start": start, "window": {"start": start + 2, "end": start + 12},
    }  # fmt: skip
    return Run(name, path, {4: [summary]})


def test_run_annotations_go_through_the_one_client(tmp_path: Path) -> None:
    a = _run("ab-off", tmp_path, 1000.0, "baseline", "off")
    b = _run("ab-on", tmp_path, 1020.0, "mma_decode", "on")
    with stand_in() as (base, state):
        assert post_run_annotations([a, b], Grafana(base + "/", token="tok")) == 2
        assert state.auth == ["Bearer tok"] * 2
        first, second = state.annotations
        assert first["tags"] == ["sparsemla", "loadtest", "run:ab-off", "variant:baseline"]
        assert (first["time"], first["timeEnd"]) == (1_000_000, 1_012_000) and "ab-on" in second["text"]
        state.grafana_status = 401
        with pytest.raises(Exception, match="401"):
            post_run_annotations([a], Grafana(base))


def test_only_the_grafana_client_talks_to_grafanas_api() -> None:
    src = Path(grafana_api.__file__).resolve().parents[1]
    callers = sorted(str(f.relative_to(src)) for f in src.rglob("*.py") if "/api/annotations" in f.read_text())
    assert callers == ["dashboards/grafana_api.py"], callers
    assert Grafana is grafana_api.Grafana


def test_panel_windows_and_pinned_variables(tmp_path: Path) -> None:
    a = _run("ab-off", tmp_path, 1000.0, "baseline", "off")
    b = _run("ab-on", tmp_path, 1020.0, "mma_decode", "on")
    assert windows_for(a, b) == [("A and B", 985.0, 1047.0)]
    far = _run("later", tmp_path, 1000.0 + 86400, "mma_decode", "on")
    assert windows_for(a, far) == [("A", 985.0, 1027.0), ("B", 86400 + 985.0, 86400 + 1027.0)]
    assert pinned_variables(a, b) == {
        "variant_a": "baseline", "variant_b": "mma_decode", "variant": ["baseline", "mma_decode"],
        "run_id": ["ab-off", "ab-on"],
    }  # fmt: skip


def test_report_says_when_prometheus_is_unreachable(tmp_path: Path) -> None:
    a = _run("ab-off", tmp_path, time.time() - 60, "baseline", "off")
    b = _run("ab-on", tmp_path, time.time() - 40, "mma_decode", "on")
    dead = f"http://127.0.0.1:{free_port()}"
    files = write_report(a, b, compare_runs(a, b), tmp_path / "report", prometheus=dead)
    for key in ("md", "html"):
        text = files[key].read_text()
        assert "Dashboard panels" in text and f"Prometheus at {dead} is not reachable" in text
    info = json.loads((tmp_path / "report" / "compare.json").read_text())["panels"]
    assert info["windows"] == [] and "not reachable" in info["error"]
    assert files["throughput_vs_concurrency"].stat().st_size > 500  # the rest of the report is there
    assert not (tmp_path / "report" / "panels").exists()
