"""Every Prometheus metric sglang 0.5.23 declares, with its type and label names, as plain Python data.

Source: ``sglang/srt/observability/metrics_collector.py`` of the sglang 0.5.23 wheel. :data:`METRICS` was produced by
:func:`extract_metrics` on that file (``tests/test_sim_sglang_metrics.py`` re-extracts it from the installed wheel and
fails if the two disagree), so dashboards, Prometheus rules and the simulator can check names without importing sglang.

How sglang labels its series: every collector is built with a ``labels`` dict and declares
``labelnames=labels.keys()`` plus a few metric-specific names. :data:`BASE_LABELS` gives that dict's keys per collector
as sglang fills them by default (``SchedulerMetricsCollector.init_new`` and ``tokenizer_metric_labels``). Optional keys
are appended by sglang only when a feature is on: ``priority`` (``--enable-priority-scheduling``), ``dp_rank`` (data
parallel), the keys of ``--extra-metric-labels`` and ``--tokenizer-metrics-allowed-custom-labels``.

Exposed sample names follow prometheus_client: a counter ``x_total`` (or ``x``) is exposed as ``x_total`` (plus
``x_created``), a histogram ``x`` as ``x_bucket``/``x_sum``/``x_count``, a summary as ``x_sum``/``x_count``, a gauge
histogram as ``x_bucket``/``x_gsum``/``x_gcount`` (see :func:`sample_names`).
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

from sparsemla import SGLANG_VERSION as SGLANG_VERSION  # re-exported: the release this table describes

SOURCE_FILE = "srt/observability/metrics_collector.py"  # relative to the `sglang` package directory

METRIC_TYPES = ("gauge", "counter", "histogram", "summary", "gaugehistogram")
_CTOR_TYPES = {"Gauge": "gauge", "Counter": "counter", "Histogram": "histogram", "Summary": "summary",
               "GaugeHistogram": "gaugehistogram"}  # fmt: skip

# Default keys of the ``labels`` dict each collector is built with (see the module docstring for optional keys).
BASE_LABELS: dict[str, tuple[str, ...]] = {
    "SchedulerMetricsCollector": ("model_name", "engine_type", "tp_rank", "pp_rank", "moe_ep_rank"),
    "TokenizerMetricsCollector": ("model_name", "engine_type"),
    "RadixCacheMetricsCollector": ("cache_type", "tp_rank", "pp_rank", "dp_rank"),
    "StorageMetricsCollector": ("cache_type", "tp_rank", "pp_rank", "dp_rank"),
    "EncoderMetricsCollector": ("model_name", "engine_type"),
    "ExpertDispatchCollector": (),  # declares its label names explicitly
}
# Values sglang puts in `engine_type` (DisaggregationMode.to_engine_type; "dynamic" with PD role switching).
ENGINE_TYPES = ("unified", "prefill", "decode", "dynamic")


@dataclass(frozen=True)
class SglangMetric:
    """One metric declaration: the name as declared, its type, the collector class and its own label names.

    ``extra_labels`` are the metric-specific names; ``uses_base_labels`` says whether the collector's ``labels``
    dict keys come first (:data:`BASE_LABELS`). :meth:`labelnames` is the full default label set, in order."""

    name: str
    type: str
    collector: str
    extra_labels: tuple[str, ...] = ()
    uses_base_labels: bool = True

    def labelnames(self) -> tuple[str, ...]:
        base = BASE_LABELS.get(self.collector, ()) if self.uses_base_labels else ()
        return (*base, *self.extra_labels)

    def family(self) -> str:
        """The family name prometheus_client exposes in ``# TYPE`` lines (counters lose ``_total``)."""
        if self.type == "counter" and self.name.endswith("_total"):
            return self.name[: -len("_total")]
        return self.name


def sample_names(metric: SglangMetric) -> tuple[str, ...]:
    """The sample (series) names a metric shows in the text exposition, as PromQL refers to them."""
    family = metric.family()
    if metric.type == "counter":
        return (f"{family}_total", f"{family}_created")
    if metric.type == "histogram":
        return (f"{family}_bucket", f"{family}_sum", f"{family}_count", f"{family}_created")
    if metric.type == "summary":
        return (f"{family}_sum", f"{family}_count", f"{family}_created")
    if metric.type == "gaugehistogram":
        return (f"{family}_bucket", f"{family}_gsum", f"{family}_gcount")
    return (family,)


# -- extraction (used to produce METRICS, and by the test that checks it against the wheel) --------------------------


def _labels_expr(node: ast.expr | None) -> tuple[bool, tuple[str, ...]]:
    """Decode a ``labelnames=`` expression: (uses the collector's labels dict, extra names in order)."""
    if node is None:
        return False, ()
    if isinstance(node, ast.Call):
        func = node.func
        if isinstance(func, ast.Attribute) and func.attr == "keys":  # labels.keys()
            return True, ()
        if isinstance(func, ast.Name) and func.id == "list" and len(node.args) == 1:  # list(labels.keys())
            return _labels_expr(node.args[0])
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        left_base, left = _labels_expr(node.left)
        right_base, right = _labels_expr(node.right)
        return left_base or right_base, (*left, *right)
    if isinstance(node, (ast.List, ast.Tuple, ast.Set)):
        base, names = False, []
        for elt in node.elts:
            if isinstance(elt, ast.Starred):
                sub_base, sub = _labels_expr(elt.value)
                base, names = base or sub_base, [*names, *sub]
            elif isinstance(elt, ast.Constant) and isinstance(elt.value, str):
                names.append(elt.value)
            else:
                raise ValueError(f"unsupported label element at line {elt.lineno}: {ast.unparse(elt)}")
        return base, tuple(sorted(names) if isinstance(node, ast.Set) else names)
    raise ValueError(f"unsupported labelnames expression at line {node.lineno}: {ast.unparse(node)}")


def extract_metrics(source: str) -> tuple[SglangMetric, ...]:
    """Every ``Gauge/Counter/Histogram/Summary/GaugeHistogram(name="sglang:...", labelnames=...)`` call in the
    collector classes of ``metrics_collector.py`` source text, in declaration order."""
    found: list[SglangMetric] = []
    for cls in ast.parse(source).body:
        if not isinstance(cls, ast.ClassDef):
            continue
        for node in ast.walk(cls):
            if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in _CTOR_TYPES):
                continue
            kwargs = {kw.arg: kw.value for kw in node.keywords if kw.arg}
            name = kwargs.get("name")
            if not (isinstance(name, ast.Constant) and isinstance(name.value, str)):
                continue
            uses_base, extra = _labels_expr(kwargs.get("labelnames"))
            found.append(SglangMetric(name.value, _CTOR_TYPES[node.func.id], cls.name, extra, uses_base))
    return tuple(found)


def find_source_file() -> Path | None:
    """``metrics_collector.py`` of an installed sglang (found without importing it), or of the unpacked wheel under
    ``/tmp/sgl/src``; None when neither is present."""
    import importlib.util

    candidates = []
    try:
        spec = importlib.util.find_spec("sglang")
    except (ImportError, ValueError):
        spec = None
    if spec is not None and spec.submodule_search_locations:
        candidates += [Path(p) / SOURCE_FILE for p in spec.submodule_search_locations]
    candidates.append(Path("/tmp/sgl/src/sglang") / SOURCE_FILE)
    return next((p for p in candidates if p.is_file()), None)


def _render_table(metrics: tuple[SglangMetric, ...]) -> str:
    """The Python source of :data:`_TABLE` (this file's data was written by ``python -m sparsemla.sglang_metrics``)."""
    short = {cls: f"_{key}" for key, cls in _COLLECTORS.items()}
    lines = ["_TABLE: tuple[tuple[str, str, str, tuple[str, ...], bool], ...] = ("]
    for m in metrics:
        row = f"    ({m.name!r}, {m.type!r}, {short[m.collector]}, {m.extra_labels!r}, {m.uses_base_labels!r}),"
        lines.append(row if len(row) <= 120 else f"{row}  # noqa: E501")
    lines.append(")")
    return "\n".join(lines)


# Short aliases keep the table rows within the line length.
_COLLECTORS = {
    "S": "SchedulerMetricsCollector",
    "T": "TokenizerMetricsCollector",
    "R": "RadixCacheMetricsCollector",
    "C": "StorageMetricsCollector",
    "E": "EncoderMetricsCollector",
    "X": "ExpertDispatchCollector",
}
_S, _T, _R, _C, _E, _X = _COLLECTORS.values()

# -- the data: (name, type, collector, extra label names, uses the collector's base labels) ---------------------------
# fmt: off
_TABLE: tuple[tuple[str, str, str, tuple[str, ...], bool], ...] = (
    ('sglang:num_running_reqs', 'gauge', _S, (), True),
    ('sglang:num_queue_reqs', 'gauge', _S, (), True),
    ('sglang:num_grammar_queue_reqs', 'gauge', _S, (), True),
    ('sglang:gen_throughput', 'gauge', _S, (), True),
    ('sglang:cache_hit_rate', 'gauge', _S, (), True),
    ('sglang:decode_sum_seq_lens', 'gauge', _S, (), True),
    ('sglang:token_usage', 'gauge', _S, (), True),
    ('sglang:full_token_usage', 'gauge', _S, (), True),
    ('sglang:swa_token_usage', 'gauge', _S, (), True),
    ('sglang:mamba_usage', 'gauge', _S, (), True),
    ('sglang:num_used_tokens', 'gauge', _S, (), True),
    ('sglang:kv_available_tokens', 'gauge', _S, (), True),
    ('sglang:kv_evictable_tokens', 'gauge', _S, (), True),
    ('sglang:kv_used_tokens', 'gauge', _S, (), True),
    ('sglang:swa_available_tokens', 'gauge', _S, (), True),
    ('sglang:swa_evictable_tokens', 'gauge', _S, (), True),
    ('sglang:swa_used_tokens', 'gauge', _S, (), True),
    ('sglang:mamba_available_tokens', 'gauge', _S, (), True),
    ('sglang:mamba_evictable_tokens', 'gauge', _S, (), True),
    ('sglang:mamba_used_tokens', 'gauge', _S, (), True),
    ('sglang:weight_load_duration_seconds', 'gauge', _S, ('source',), True),
    ('sglang:spec_accept_length', 'gauge', _S, (), True),
    ('sglang:spec_accept_rate', 'gauge', _S, (), True),
    ('sglang:spec_cap_length', 'gauge', _S, (), True),
    ('sglang:spec_block_accept_length', 'gauge', _S, (), True),
    ('sglang:spec_num_steps', 'gauge', _S, (), True),
    ('sglang:spec_num_draft_tokens', 'gauge', _S, (), True),
    ('sglang:num_retracted_reqs', 'gauge', _S, (), True),
    ('sglang:num_retracted_requests_total', 'counter', _S, (), True),
    ('sglang:num_retracted_input_tokens_total', 'counter', _S, (), True),
    ('sglang:num_retracted_output_tokens_total', 'counter', _S, (), True),
    ('sglang:num_paused_reqs', 'gauge', _S, (), True),
    ('sglang:num_prefill_bootstrap_queue_reqs', 'gauge', _S, (), True),
    ('sglang:num_prefill_inflight_queue_reqs', 'gauge', _S, (), True),
    ('sglang:num_decode_prealloc_queue_reqs', 'gauge', _S, (), True),
    ('sglang:num_decode_transfer_queue_reqs', 'gauge', _S, (), True),
    ('sglang:num_decode_host_receive_queue_reqs', 'gauge', _S, (), True),
    ('sglang:num_decode_host_receive_reqs_total', 'counter', _S, (), True),
    ('sglang:num_decode_deferred_kv_release_reqs', 'gauge', _S, (), True),
    ('sglang:decode_deferred_kv_release_seconds', 'histogram', _S, (), True),
    ('sglang:decode_deferred_kv_release_total', 'counter', _S, ('outcome',), True),
    ('sglang:kv_transfer_speed_gb_s', 'histogram', _S, (), True),
    ('sglang:kv_transfer_latency_ms', 'histogram', _S, (), True),
    ('sglang:pending_prealloc_token_usage', 'gauge', _S, (), True),
    ('sglang:prealloc_full_token_usage', 'gauge', _S, (), True),
    ('sglang:prealloc_swa_token_usage', 'gauge', _S, (), True),
    ('sglang:num_bootstrap_failed_reqs_total', 'counter', _S, (), True),
    ('sglang:num_transfer_failed_reqs_total', 'counter', _S, (), True),
    ('sglang:num_prefill_retries_total', 'counter', _S, (), True),
    ('sglang:kv_transfer_bootstrap_ms', 'histogram', _S, (), True),
    ('sglang:kv_transfer_alloc_ms', 'histogram', _S, (), True),
    ('sglang:kv_transfer_total_mb', 'histogram', _S, (), True),
    ('sglang:utilization', 'gauge', _S, (), True),
    ('sglang:fwd_occupancy', 'gauge', _S, (), True),
    ('sglang:new_token_ratio', 'gauge', _S, (), True),
    ('sglang:is_cuda_graph', 'gauge', _S, (), True),
    ('sglang:cuda_graph_passes_total', 'counter', _S, ('mode',), True),
    ('sglang:num_unique_running_routing_keys', 'gauge', _S, (), True),
    ('sglang:routing_key_running_req_count', 'gaugehistogram', _S, (), True),
    ('sglang:routing_key_all_req_count', 'gaugehistogram', _S, (), True),
    ('sglang:queue_time_seconds', 'histogram', _S, (), True),
    ('sglang:per_stage_req_latency_seconds', 'histogram', _S, ('stage',), True),
    ('sglang:grammar_compilation_time_seconds', 'histogram', _S, (), True),
    ('sglang:num_grammar_cache_hit_total', 'counter', _S, (), True),
    ('sglang:num_grammar_aborted_total', 'counter', _S, (), True),
    ('sglang:num_grammar_timeout_total', 'counter', _S, (), True),
    ('sglang:num_grammar_total', 'counter', _S, (), True),
    ('sglang:grammar_schema_count', 'histogram', _S, (), True),
    ('sglang:grammar_ebnf_size', 'histogram', _S, (), True),
    ('sglang:grammar_tree_traversal_time_avg', 'histogram', _S, (), True),
    ('sglang:grammar_tree_traversal_time_max', 'histogram', _S, (), True),
    ('sglang:realtime_tokens_total', 'counter', _S, ('mode',), True),
    ('sglang:prefill_effective_tokens_total', 'counter', _S, ('mode',), True),
    ('sglang:forward_execution_seconds_total', 'counter', _S, ('category',), True),
    ('sglang:scheduler_idle_seconds_total', 'counter', _S, (), True),
    ('sglang:scheduler_process_cpu_seconds_total', 'counter', _S, (), True),
    ('sglang:scheduler_stage_seconds_total', 'counter', _S, ('category', 'forward_overlap'), True),
    ('sglang:estimated_flops_per_gpu_total', 'counter', _S, (), True),
    ('sglang:estimated_read_bytes_per_gpu_total', 'counter', _S, (), True),
    ('sglang:estimated_write_bytes_per_gpu_total', 'counter', _S, (), True),
    ('sglang:dp_cooperation_realtime_tokens_total', 'counter', _S, ('mode', 'num_prefill_ranks'), True),
    ('sglang:dp_cooperation_forward_execution_seconds_total', 'counter', _S, ('category', 'num_prefill_ranks'), True),
    ('sglang:dp_attention_tokens_total', 'counter', _S, ('kind',), True),
    ('sglang:dp_attention_steps_total', 'counter', _S, ('rank_state',), True),
    ('sglang:dp_attention_pairs_total', 'counter', _S, ('kind',), True),
    ('sglang:dp_attention_token_imbalance_ratio', 'histogram', _S, (), True),
    ('sglang:dp_attention_sync_wait_seconds', 'histogram', _S, (), True),
    ('sglang:prefill_delayer_wait_forward_passes', 'histogram', _S, (), True),
    ('sglang:prefill_delayer_wait_seconds', 'histogram', _S, (), True),
    ('sglang:prefill_delayer_outcomes_total', 'counter', _S, ('input_estimation', 'output_allow', 'output_reason', 'actual_execution'), True),  # noqa: E501
    ('sglang:max_total_num_tokens', 'gauge', _S, (), True),
    ('sglang:max_total_num_tokens_swa', 'gauge', _S, (), True),
    ('sglang:weight_memory_usage_gb', 'gauge', _S, (), True),
    ('sglang:kv_cache_memory_usage_gb', 'gauge', _S, (), True),
    ('sglang:graph_memory_usage_gb', 'gauge', _S, ('phase',), True),
    ('sglang:max_running_requests_under_SLO', 'gauge', _S, (), True),
    ('sglang:page_size', 'gauge', _S, (), True),
    ('sglang:num_pages', 'gauge', _S, (), True),
    ('sglang:context_len', 'gauge', _S, (), True),
    ('sglang:startup_available_gpu_memory_gb', 'gauge', _S, (), True),
    ('sglang:lora_pool_slots_used', 'gauge', _S, (), True),
    ('sglang:lora_pool_slots_total', 'gauge', _S, (), True),
    ('sglang:lora_pool_utilization', 'gauge', _S, (), True),
    ('sglang:hicache_host_used_tokens', 'gauge', _S, (), True),
    ('sglang:hicache_host_total_tokens', 'gauge', _S, (), True),
    ('sglang:hicache_host_mamba_used_states', 'gauge', _S, (), True),
    ('sglang:hicache_host_mamba_total_states', 'gauge', _S, (), True),
    ('sglang:num_streaming_sessions', 'gauge', _S, (), True),
    ('sglang:streaming_session_held_tokens', 'gauge', _S, (), True),
    ('sglang:eplb_balancedness', 'summary', _S, ('forward_mode',), True),
    ('sglang:startup_time_seconds', 'gauge', _T, ('phase',), True),
    ('sglang:startup_cuda_graph_time_seconds', 'gauge', _T, ('phase',), True),
    ('sglang:prompt_tokens_total', 'counter', _T, ('is_streaming',), True),
    ('sglang:generation_tokens_total', 'counter', _T, ('is_streaming',), True),
    ('sglang:spec_verify_calls_total', 'counter', _T, (), True),
    ('sglang:prompt_tokens_histogram', 'histogram', _T, (), True),
    ('sglang:uncached_prompt_tokens_histogram', 'histogram', _T, (), True),
    ('sglang:generation_tokens_histogram', 'histogram', _T, (), True),
    ('sglang:cached_tokens_total', 'counter', _T, ('cache_source',), True),
    ('sglang:num_requests_total', 'counter', _T, ('is_streaming',), True),
    ('sglang:get_loads_duration_seconds', 'histogram', _T, (), True),
    ('sglang:num_so_requests_total', 'counter', _T, (), True),
    ('sglang:num_aborted_requests_total', 'counter', _T, (), True),
    ('sglang:time_to_first_token_seconds', 'histogram', _T, ('is_streaming',), True),
    ('sglang:inter_token_latency_seconds', 'histogram', _T, (), True),
    ('sglang:request_time_per_output_token_seconds', 'histogram', _T, ('is_streaming',), True),
    ('sglang:e2e_request_latency_seconds', 'histogram', _T, ('is_streaming',), True),
    ('sglang:prefetched_tokens_total', 'counter', _C, (), True),
    ('sglang:backuped_tokens_total', 'counter', _C, (), True),
    ('sglang:storage_prefetch_hit_tokens_total', 'counter', _C, (), True),
    ('sglang:storage_prefetch_unfulfilled_tokens_total', 'counter', _C, ('reason',), True),
    ('sglang:storage_prefetch_deferred_tokens_total', 'counter', _C, ('reason',), True),
    ('sglang:hicache_backup_dropped_tokens_total', 'counter', _C, (), True),
    ('sglang:hicache_prefetch_aux_alloc_failed_tokens_total', 'counter', _C, (), True),
    ('sglang:prefetch_pgs', 'histogram', _C, (), True),
    ('sglang:backup_pgs', 'histogram', _C, (), True),
    ('sglang:prefetch_bandwidth', 'histogram', _C, (), True),
    ('sglang:backup_bandwidth', 'histogram', _C, (), True),
    ('sglang:eplb_gpu_physical_count', 'histogram', _X, ('layer',), False),
    ('sglang:eviction_duration_seconds', 'histogram', _R, (), True),
    ('sglang:evicted_tokens_total', 'counter', _R, (), True),
    ('sglang:load_back_duration_seconds', 'histogram', _R, (), True),
    ('sglang:load_back_tokens_total', 'counter', _R, ('pool',), True),
    ('sglang:hicache_backup_duration_seconds', 'histogram', _R, (), True),
    ('sglang:hicache_backup_bytes_total', 'counter', _R, (), True),
    ('sglang:load_back_bytes_total', 'counter', _R, (), True),
    ('sglang:hicache_backup_tokens_total', 'counter', _R, ('pool',), True),
    ('sglang:hicache_dropped_tokens_total', 'counter', _R, ('reason', 'pool'), True),
    ('sglang:encoder_cache_evictions_total', 'counter', _E, ('modality',), True),
    ('sglang:encoder_cache_size_mb', 'gauge', _E, (), True),
    ('sglang:encoder_cache_entries', 'gauge', _E, (), True),
    ('sglang:encoder_cache_hit_tokens_total', 'counter', _E, ('modality',), True),
    ('sglang:encoder_cache_total_tokens_total', 'counter', _E, ('modality',), True),
    ('sglang:encoder_cache_hit_files_total', 'counter', _E, ('modality',), True),
    ('sglang:encoder_cache_total_files_total', 'counter', _E, ('modality',), True),
    ('sglang:encoder_requests_total', 'counter', _E, ('modality', 'status'), True),
    ('sglang:encoder_requests_received_total', 'counter', _E, ('modality',), True),
    ('sglang:encoder_mm_items_per_batch', 'histogram', _E, ('modality',), True),
    ('sglang:encoder_mm_items_per_request', 'histogram', _E, ('modality',), True),
    ('sglang:encoder_request_e2e_latency_seconds', 'histogram', _E, ('modality',), True),
    ('sglang:encoder_queue_wait_seconds', 'histogram', _E, ('modality',), True),
    ('sglang:encoder_preprocess_seconds', 'histogram', _E, ('modality',), True),
    ('sglang:encoder_model_forward_seconds', 'histogram', _E, ('modality',), True),
    ('sglang:encoder_transfer_seconds', 'histogram', _E, ('backend',), True),
)
# fmt: on

METRICS: dict[str, SglangMetric] = {row[0]: SglangMetric(*row) for row in _TABLE}


def is_known_series(series: str) -> bool:
    """True when ``series`` (e.g. ``sglang:e2e_request_latency_seconds_bucket``) is a sample name sglang exposes."""
    return series in SERIES


SERIES: frozenset[str] = frozenset(s for m in METRICS.values() for s in sample_names(m))


if __name__ == "__main__":
    path = find_source_file()
    if path is None:
        raise SystemExit("sglang's metrics_collector.py not found (install sglang==0.5.23 or unpack it to /tmp/sgl)")
    print(_render_table(extract_metrics(path.read_text())))
