"""Prometheus configuration and rules: promtool check config / check rules / test rules, plus coverage checks."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from sparsemla import metric_names
from sparsemla.ops.stack import PROMETHEUS_DIR, render_local_config

PROMTOOL = shutil.which("promtool")
needs_promtool = pytest.mark.skipif(PROMTOOL is None, reason="promtool not installed (apt-get install prometheus)")
RULE_FILES = sorted(PROMETHEUS_DIR.glob("*.rules.yml"))
TEST_FILES = sorted((PROMETHEUS_DIR / "tests").glob("*_test.yml"))


def _promtool(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([PROMTOOL, *args], capture_output=True, text=True, timeout=120, cwd=PROMETHEUS_DIR)


def _alerts() -> list[dict]:
    return [r for f in RULE_FILES for g in yaml.safe_load(f.read_text())["groups"] for r in g["rules"] if "alert" in r]


@needs_promtool
def test_compose_config_is_valid() -> None:
    result = _promtool("check", "config", "prometheus.yml")
    assert result.returncode == 0, result.stdout + result.stderr


@needs_promtool
def test_rules_are_valid() -> None:
    result = _promtool("check", "rules", *map(str, RULE_FILES))
    assert result.returncode == 0, result.stdout + result.stderr


@needs_promtool
@pytest.mark.parametrize("test_file", TEST_FILES, ids=[f.stem for f in TEST_FILES])
def test_rule_unit_tests_pass(test_file: Path) -> None:
    result = _promtool("test", "rules", str(test_file))
    assert result.returncode == 0, result.stdout + result.stderr


@needs_promtool
def test_rule_unit_tests_can_fail(tmp_path: Path) -> None:
    """A wrong expectation must make promtool fail (so the passing run above means something)."""
    text = (PROMETHEUS_DIR / "tests" / "alerts_test.yml").read_text()
    broken = text.replace("severity: critical", "severity: warning", 1).replace(
        "../alerts.rules.yml", str(PROMETHEUS_DIR / "alerts.rules.yml")
    )
    path = tmp_path / "broken_test.yml"
    path.write_text(broken)
    assert _promtool("test", "rules", str(path)).returncode != 0


@needs_promtool
def test_rendered_local_config_is_valid(tmp_path: Path) -> None:
    config = render_local_config(server_port=31000, exporter_port=31001, prometheus_port=31002)
    jobs = {j["job_name"]: j for j in config["scrape_configs"]}
    assert "dcgm" not in jobs
    assert jobs["sglang"]["static_configs"] == [{"targets": ["127.0.0.1:31000"]}]
    assert jobs["kernel-share"]["static_configs"] == [{"targets": ["127.0.0.1:31001"]}]
    path = tmp_path / "prometheus.yml"
    path.write_text(yaml.safe_dump(config))
    result = subprocess.run([PROMTOOL, "check", "config", str(path)], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
    assert jobs["locust"]["static_configs"] == [{"targets": ["127.0.0.1:9646"]}]  # `make up` default
    no_exporter = render_local_config(server_port=1, exporter_port=None, prometheus_port=2, locust_metrics_port=3)
    assert "kernel-share" not in {j["job_name"] for j in no_exporter["scrape_configs"]}
    locust = next(j for j in no_exporter["scrape_configs"] if j["job_name"] == "locust")
    assert locust["static_configs"] == [{"targets": ["127.0.0.1:3"]}]


def test_every_alert_has_for_severity_summary_and_a_firing_unit_test() -> None:
    tested: set[str] = set()
    for f in TEST_FILES:
        for test in yaml.safe_load(f.read_text())["tests"]:
            for case in test.get("alert_rule_test", []):
                if case.get("exp_alerts"):
                    tested.add(case["alertname"])
    alerts = _alerts()
    assert len(alerts) >= 6
    for rule in alerts:
        name = rule["alert"]
        assert re.fullmatch(r"\d+[smh]", str(rule.get("for", ""))), f"{name}: needs a `for:` duration"
        assert rule["labels"]["severity"] in ("critical", "warning", "info"), name
        assert rule["annotations"]["summary"], name
        assert name in tested, f"{name}: no promtool test where it fires"


def test_rules_use_only_declared_sparsemla_metrics() -> None:
    declared = {v for k, v in vars(metric_names).items() if k.isupper() and isinstance(v, str)}
    for f in RULE_FILES:
        for name in set(re.findall(r"(?<![:\w])sparsemla_[a-z_]+", f.read_text())):
            base = re.sub(r"_(bucket|sum|count)$", "", name)
            assert name in declared or base in declared, f"{f.name}: {name} is not in src/sparsemla/metric_names.py"


def test_compose_scrape_interval_matches_grafana_datasource() -> None:
    interval = yaml.safe_load((PROMETHEUS_DIR / "prometheus.yml").read_text())["global"]["scrape_interval"]
    datasources = sorted((PROMETHEUS_DIR.parent / "grafana" / "provisioning" / "datasources").glob("*.yaml"))
    if not datasources:
        pytest.skip("no Grafana datasource provisioning yet")
    ds = yaml.safe_load(datasources[0].read_text())["datasources"][0]
    assert ds["uid"] == "prometheus"
    assert ds["jsonData"]["timeInterval"] == interval
