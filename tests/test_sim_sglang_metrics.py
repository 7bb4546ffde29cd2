"""sparsemla.sglang_metrics: the metric list equals what sglang 0.5.23's metrics_collector.py declares."""

from __future__ import annotations

import pytest

from sparsemla import sglang_metrics as sm


def test_table_matches_the_wheel_source() -> None:
    """Re-extract every metric from the installed (or unpacked) sglang wheel and compare with the committed data."""
    path = sm.find_source_file()
    if path is None:
        pytest.skip("sglang 0.5.23 source not present (no installed sglang, no /tmp/sgl)")
    extracted = sm.extract_metrics(path.read_text())
    assert {m.name: m for m in extracted} == sm.METRICS
    assert len(extracted) == len(sm.METRICS), "a metric name is declared twice"


def test_dashboard_metrics_have_sglang_types_and_labels() -> None:
    sched = ("model_name", "engine_type", "tp_rank", "pp_rank", "moe_ep_rank")
    expected = {
        "sglang:gen_throughput": ("gauge", sched),
        "sglang:num_running_reqs": ("gauge", sched),
        "sglang:num_queue_reqs": ("gauge", sched),
        "sglang:token_usage": ("gauge", sched),
        "sglang:cache_hit_rate": ("gauge", sched),
        "sglang:time_to_first_token_seconds": ("histogram", ("model_name", "engine_type", "is_streaming")),
        "sglang:inter_token_latency_seconds": ("histogram", ("model_name", "engine_type")),
        "sglang:e2e_request_latency_seconds": ("histogram", ("model_name", "engine_type", "is_streaming")),
        "sglang:prompt_tokens_total": ("counter", ("model_name", "engine_type", "is_streaming")),
        "sglang:generation_tokens_total": ("counter", ("model_name", "engine_type", "is_streaming")),
        "sglang:cuda_graph_passes_total": ("counter", (*sched, "mode")),
    }
    for name, (mtype, labels) in expected.items():
        assert sm.METRICS[name].type == mtype, name
        assert sm.METRICS[name].labelnames() == labels, name


def test_sample_names() -> None:
    assert sm.is_known_series("sglang:e2e_request_latency_seconds_bucket")
    assert sm.is_known_series("sglang:generation_tokens_total")
    assert sm.is_known_series("sglang:gen_throughput")
    assert not sm.is_known_series("sglang:gen_throughput_total")
    assert not sm.is_known_series("sglang:time_per_output_token_seconds_bucket")  # removed before 0.5.23
    assert sm.METRICS["sglang:prompt_tokens_total"].family() == "sglang:prompt_tokens"


def test_extractor_decodes_every_labelnames_form() -> None:
    src = """
class FooCollector:
    def __init__(self, labels):
        self.a = Gauge(name="sglang:a", documentation="", labelnames=labels.keys())
        self.b = Counter(name="sglang:b_total", documentation="", labelnames=list(labels.keys()) + ["mode"])
        self.c = Histogram(name="sglang:c", documentation="", labelnames=[*labels.keys(), "x", "y"])
        self.d = Histogram(name="sglang:d", documentation="", labelnames={"layer"})
        self.e = Summary(name="sglang:e", documentation="")
        self.f = Other(name="sglang:f")
"""
    got = {m.name: (m.type, m.uses_base_labels, m.extra_labels) for m in sm.extract_metrics(src)}
    assert got == {
        "sglang:a": ("gauge", True, ()),
        "sglang:b_total": ("counter", True, ("mode",)),
        "sglang:c": ("histogram", True, ("x", "y")),
        "sglang:d": ("histogram", False, ("layer",)),
        "sglang:e": ("summary", False, ()),
    }
