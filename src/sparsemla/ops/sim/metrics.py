"""The simulator's `/metrics`: sglang 0.5.23's names, types and label sets (``sparsemla.sglang_metrics``), plus ours.

Scheduler-side series carry ``model_name, engine_type, tp_rank, pp_rank, moe_ep_rank`` and tokenizer-side series
``model_name, engine_type`` (+ ``is_streaming`` where sglang has it), exactly as sglang fills them for a unified
(non-disaggregated) engine on TP rank 0. Histogram buckets are sglang's defaults. Ours:
``sparsemla_kernel_flags_info`` (1, labelled with the kernel flags, version and variant, like the sglang plugin) and
``sparsemla_decode_step_seconds`` (forward_mode, batch_bucket).
"""

from __future__ import annotations

import bisect
import time
from collections import deque

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, disable_created_metrics, generate_latest

from sparsemla import metric_names as mn
from sparsemla import variant
from sparsemla.ops.sim.engine import StepRecord
from sparsemla.ops.sim.engine_proc import SimRequest
from sparsemla.sglang_metrics import BASE_LABELS, METRICS

# sglang 0.5.23 default buckets (TokenizerMetricsCollector.__init__ and SchedulerMetricsCollector).
TTFT_BUCKETS = (0.1, 0.2, 0.4, 0.6, 0.8, 1, 2, 4, 6, 8, 10, 20, 40, 60, 80, 100, 200, 400)
E2E_BUCKETS = (0.1, 0.2, 0.4, 0.6, 0.8, 1, 2, 4, 6, 8, 10, 20, 40, 60, 80, 100, 200, 400, 600, 1200, 1800, 2400)
ITL_BUCKETS = (0.002, 0.004, 0.006, 0.008, 0.010, 0.015, 0.020, 0.025, 0.030, 0.035, 0.040, 0.060, 0.080, 0.100,
               0.200, 0.400, 0.600, 0.800, 1.000, 2.000, 4.000, 6.000, 8.000)  # fmt: skip
GEN_THROUGHPUT_WINDOW_S = 5.0  # sglang logs gen throughput per decode-log interval; we use a sliding window


class SimMetrics:
    """Owns a private registry; the engine calls :meth:`on_step` and :meth:`on_finish`."""

    def __init__(self, model_name: str) -> None:
        disable_created_metrics()  # sglang serves through the multiprocess collector, which has no `_created` series
        self.registry = CollectorRegistry(auto_describe=True)
        self.sched_labels = {"model_name": model_name, "engine_type": "unified", "tp_rank": "0", "pp_rank": "0",
                             "moe_ep_rank": "0"}  # fmt: skip
        self.tok_labels = {"model_name": model_name, "engine_type": "unified"}
        assert tuple(self.sched_labels) == BASE_LABELS["SchedulerMetricsCollector"]
        assert tuple(self.tok_labels) == BASE_LABELS["TokenizerMetricsCollector"]
        r = self.registry

        def metric(cls, name: str, doc: str, **kw):
            spec = METRICS[name]  # KeyError here means a name sglang does not have
            return cls(spec.family(), doc, labelnames=spec.labelnames(), registry=r, **kw)

        self.num_running = metric(Gauge, "sglang:num_running_reqs", "The number of running requests.")
        self.num_queue = metric(Gauge, "sglang:num_queue_reqs", "The number of requests in the waiting queue.")
        self.gen_throughput = metric(Gauge, "sglang:gen_throughput", "The generation throughput (token/s).")
        self.cache_hit_rate = metric(Gauge, "sglang:cache_hit_rate", "The prefix cache hit rate.")
        self.token_usage = metric(Gauge, "sglang:token_usage", "The token usage.")
        self.num_used_tokens = metric(Gauge, "sglang:num_used_tokens", "The number of used tokens.")
        self.decode_sum_seq_lens = metric(Gauge, "sglang:decode_sum_seq_lens", "Sum of sequence lengths (decode).")
        self.max_total = metric(Gauge, "sglang:max_total_num_tokens", "Maximum total number of tokens in the KV pool.")
        self.context_len = metric(Gauge, "sglang:context_len", "The context length.")
        self.is_cuda_graph = metric(Gauge, "sglang:is_cuda_graph", "Whether the last batch used a CUDA graph.")
        self.utilization = metric(Gauge, "sglang:utilization", "Fraction of wall time spent in forward steps.")
        self.queue_time = metric(Histogram, "sglang:queue_time_seconds", "Queueing time.", buckets=E2E_BUCKETS)
        self.realtime_tokens = metric(Counter, "sglang:realtime_tokens_total", "Tokens processed, by mode.")
        self.cuda_graph_passes = metric(Counter, "sglang:cuda_graph_passes_total", "Forward passes, by mode.")
        self.forward_seconds = metric(
            Counter, "sglang:forward_execution_seconds_total", "Forward execution seconds, by category."
        )
        self.prompt_tokens = metric(Counter, "sglang:prompt_tokens_total", "Number of prefill tokens processed.")
        self.generation_tokens = metric(Counter, "sglang:generation_tokens_total", "Number of generation tokens.")
        self.num_requests = metric(Counter, "sglang:num_requests_total", "Number of requests processed.")
        self.num_aborted = metric(Counter, "sglang:num_aborted_requests_total", "Number of aborted requests.")
        self.cached_tokens = metric(Counter, "sglang:cached_tokens_total", "Number of cached prompt tokens.")
        self.ttft = metric(
            Histogram, "sglang:time_to_first_token_seconds", "Time to first token.", buckets=TTFT_BUCKETS
        )
        self.itl = metric(Histogram, "sglang:inter_token_latency_seconds", "Inter-token latency.", buckets=ITL_BUCKETS)
        self.tpot = metric(
            Histogram, "sglang:request_time_per_output_token_seconds", "Per-request TPOT.", buckets=ITL_BUCKETS
        )
        self.e2e = metric(Histogram, "sglang:e2e_request_latency_seconds", "End-to-end latency.", buckets=E2E_BUCKETS)

        variant.publish(registry=r)  # sparsemla_kernel_flags_info for this process's flags, as the plugin does
        self.step_seconds = Histogram(
            mn.DECODE_STEP_SECONDS, "Realised duration of one simulated forward step (the engine's step clock).",
            labelnames=mn.DECODE_STEP_LABELS, buckets=mn.DECODE_STEP_BUCKETS, registry=r,
        )  # fmt: skip

        s, t = self.sched_labels, self.tok_labels
        for name in ("num_running", "num_queue", "gen_throughput", "cache_hit_rate", "token_usage", "num_used_tokens",
                     "decode_sum_seq_lens", "is_cuda_graph", "utilization"):  # fmt: skip
            getattr(self, name).labels(**s).set(0)
        self.num_aborted.labels(**t)
        self._decoded: deque[tuple[float, int]] = deque()
        self._busy: deque[tuple[float, float]] = deque()

    def set_constants(self, max_total_tokens: int, context_length: int) -> None:
        self.max_total.labels(**self.sched_labels).set(max_total_tokens)
        self.context_len.labels(**self.sched_labels).set(context_length)

    def on_step(self, rec: StepRecord, max_total_tokens: int) -> None:
        """One engine step: gauges as of its end, its realised duration, and the tokens it produced.

        Every time here is the engine's (``rec.end``, ``rec.realised``, ``rec.itl``), never the HTTP writer's, so a
        lagging writer cannot distort the step-time, throughput and inter-token-latency series.
        """
        s = self.sched_labels
        self.num_running.labels(**s).set(rec.running)
        self.num_queue.labels(**s).set(rec.waiting)
        self.num_used_tokens.labels(**s).set(rec.used_tokens)
        self.token_usage.labels(**s).set(rec.used_tokens / max_total_tokens if max_total_tokens else 0.0)
        self.forward_seconds.labels(**s, category=rec.mode).inc(rec.duration)
        self._busy.append((rec.end, rec.duration))
        if rec.mode == "decode":
            self.realtime_tokens.labels(**s, mode="decode").inc(rec.tokens)
            self.cuda_graph_passes.labels(**s, mode="decode_cuda_graph").inc()
            self.is_cuda_graph.labels(**s).set(1)
            self.decode_sum_seq_lens.labels(**s).set(rec.context * rec.batch)
            self._decoded.append((rec.end, rec.tokens))
        else:
            self.realtime_tokens.labels(**s, mode="prefill_compute").inc(rec.tokens)
            self.cuda_graph_passes.labels(**s, mode="prefill_none").inc()
            self.is_cuda_graph.labels(**s).set(0)
        step = rec.realised if rec.realised > 0 else rec.duration
        self.step_seconds.labels(forward_mode=rec.mode, batch_bucket=mn.batch_bucket(rec.batch)).observe(step)
        if rec.itl:
            hist = self.itl.labels(**self.tok_labels)
            for interval, count in rec.itl:
                observe_many(hist, interval, count)
        self.refresh(rec.end)

    def refresh(self, now: float | None = None) -> None:
        """Update the windowed gauges (gen_throughput, utilization); also called on every scrape."""
        now = time.monotonic() if now is None else now
        horizon = now - GEN_THROUGHPUT_WINDOW_S
        while self._decoded and self._decoded[0][0] < horizon:
            self._decoded.popleft()
        while self._busy and self._busy[0][0] < horizon:
            self._busy.popleft()
        s = self.sched_labels
        self.gen_throughput.labels(**s).set(sum(n for _, n in self._decoded) / GEN_THROUGHPUT_WINDOW_S)
        self.utilization.labels(**s).set(min(1.0, sum(d for _, d in self._busy) / GEN_THROUGHPUT_WINDOW_S))

    def on_first_token(self, req: SimRequest) -> None:
        """TTFT and queue time of a request whose first token just came (engine times)."""
        self.on_queue(req)
        if req.first_token_time is not None:
            self.ttft.labels(**self.tok_labels, is_streaming=_stream(req)).observe(req.first_token_time - req.arrival)

    def on_queue(self, req: SimRequest) -> None:
        if req.admitted is not None:
            self.queue_time.labels(**self.sched_labels).observe(req.admitted - req.arrival)

    def on_finish(self, req: SimRequest) -> None:
        t, st = self.tok_labels, _stream(req)
        if req.finish_reason and req.finish_reason.get("type") == "abort":
            self.num_aborted.labels(**t).inc()
            return
        n_out = len(req.output_ids)
        self.prompt_tokens.labels(**t, is_streaming=st).inc(req.prompt_len)
        self.generation_tokens.labels(**t, is_streaming=st).inc(n_out)
        self.num_requests.labels(**t, is_streaming=st).inc()
        self.cached_tokens.labels(**t, cache_source="device").inc(0)
        self.e2e.labels(**t, is_streaming=st).observe(req.finished_time - req.arrival)
        if n_out > 1 and req.first_token_time is not None:
            tpot = (req.finished_time - req.first_token_time) / (n_out - 1)
            self.tpot.labels(**t, is_streaming=st).observe(tpot)

    def exposition(self) -> bytes:
        self.refresh()
        return generate_latest(self.registry)


def observe_many(hist, amount: float, count: int) -> None:
    """``hist.observe(amount)`` ``count`` times, in O(1) where prometheus_client's histogram child has the layout
    of 0.20 .. 0.26 (``_upper_bounds``, ``_buckets``, ``_sum``; tests/test_sim_engine.py checks the equivalence),
    else by looping."""
    bounds, buckets, total = (getattr(hist, a, None) for a in ("_upper_bounds", "_buckets", "_sum"))
    if count <= 0:
        return
    if bounds is None or buckets is None or total is None or len(bounds) != len(buckets) or amount != amount:
        for _ in range(count):
            hist.observe(amount)
        return
    total.inc(amount * count)
    buckets[bisect.bisect_left(bounds, amount)].inc(count)


def _stream(req: SimRequest) -> str:
    return "true" if req.stream else "false"
