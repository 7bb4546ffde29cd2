"""Unit tests of the load-test pieces that need no server: workloads, SSE parsing, statistics, summaries, verdicts."""

from __future__ import annotations

import json
import math
import random

import numpy as np
import pytest
from scipy import stats as sps

from sparsemla.loadtest import stats
from sparsemla.loadtest.records import RequestRecord, read_records
from sparsemla.loadtest.report import (
    METRICS,
    NO_DIFFERENCE,
    ReportError,
    Run,
    check_flag_flipped,
    compare_runs,
    estimate,
    verdict,
)
from sparsemla.loadtest.runner import parse_duration
from sparsemla.loadtest.sse import HttpFailure, SSEFailure, TokenStream, build_request
from sparsemla.loadtest.summary import summarize, write_json_atomic
from sparsemla.loadtest.sweep import parse_concurrency_list
from sparsemla.loadtest.workload import RequestSpec, WorkloadError, parse_workload, user_rng


# -- workloads ---------------------------------------------------------------------------------------------------
def test_random_workload_is_seeded_and_within_range() -> None:
    wl = parse_workload("random:100:40:0.5")

    def draw(seed: int) -> list[RequestSpec]:
        rngs = [user_rng(seed, 0, u) for u in range(3)]
        return [wl.sample(rng) for rng in rngs for _ in range(20)]

    a, b = draw(7), draw(7)
    assert a == b and a != draw(8)
    assert all(50 <= s.prompt_tokens <= 100 and 20 <= s.max_tokens <= 40 for s in a)
    assert all(len(s.prompt.split()) == s.prompt_tokens for s in a)
    assert len({s.max_tokens for s in a}) > 3
    fixed = parse_workload("random:12:5")
    assert {(s.prompt_tokens, s.max_tokens) for s in (fixed.sample(random.Random(i)) for i in range(10))} == {(12, 5)}


@pytest.mark.parametrize(
    "spec", ["", "random", "random:1", "random:a:2", "random:5:0", "random:5:5:2", "nope:1", "shared-prefix:1:2:3"]
)
def test_bad_workload_specs_are_refused(spec: str) -> None:
    with pytest.raises(WorkloadError):
        parse_workload(spec)


def test_sharegpt_and_shared_prefix(tmp_path) -> None:
    conv = [
        {"conversations": [{"from": "human", "value": "hello there"}, {"from": "gpt", "value": "a b c d e"}]},
        {"conversations": [{"from": "gpt", "value": "skipped"}]},
        {"conversations": [{"from": "human", "value": "why"}, {"from": "gpt", "value": "x " * 50}]},
    ]
    path = tmp_path / "sg.json"
    path.write_text(json.dumps(conv))
    wl = parse_workload(f"sharegpt:{path}:10")
    samples = [wl.sample(random.Random(i)) for i in range(20)]
    assert {s.prompt for s in samples} == {"hello there", "why"}
    assert {s.max_tokens for s in samples} == {5, 10}
    (tmp_path / "empty.json").write_text("[]")
    with pytest.raises(WorkloadError):
        parse_workload(str(tmp_path / "empty.json"))
    sp = parse_workload("shared-prefix:3:20:5:7")
    prompts = [sp.sample(random.Random(i)).prompt for i in range(30)]
    prefixes = {p.split("\n")[0] for p in prompts}
    assert len(prefixes) == 3 and all(len(p.split()) == 20 for p in prefixes)


# -- SSE parsing ----------------------------------------------------------------------------------------------------
def _feed(stream: TokenStream, events: list[str]) -> None:
    for i, ev in enumerate(events):
        stream.feed(f"data: {ev}\n".encode(), stream.start + 0.1 * (i + 1))


def test_chat_stream_timing_and_usage() -> None:
    s = TokenStream("chat", 100.0)
    _feed(
        s,
        [
            json.dumps({"choices": [{"delta": {"role": "assistant"}}]}),
            json.dumps({"choices": [{"delta": {"content": "a"}}]}),
            json.dumps({"choices": [{"delta": {"content": "b"}}]}),
            json.dumps({"choices": [{"delta": {"content": "c"}, "finish_reason": "length"}]}),
            json.dumps({"choices": [], "usage": {"prompt_tokens": 9, "completion_tokens": 3}}),
            "[DONE]",
        ],
    )
    assert s.done and s.finish_reason == "length"
    assert s.ttft == pytest.approx(0.2)
    assert s.itls() == pytest.approx([0.1, 0.1])
    assert s.output_tokens == 3 and s.usage_prompt_tokens == 9


def test_generate_stream_counts_cumulative_tokens() -> None:
    s = TokenStream("generate", 0.0)
    _feed(
        s,
        [
            json.dumps({"text": "a", "meta_info": {"completion_tokens": 1}}),
            json.dumps({"text": "a b c", "meta_info": {"completion_tokens": 3}}),
            json.dumps({"text": "a b c d", "meta_info": {"completion_tokens": 4, "finish_reason": {"type": "length"}}}),
            "[DONE]",
        ],
    )
    assert s.chunk_tokens == [1, 2, 1] and s.output_tokens == 4 and s.finish_reason == "length"


def test_completions_without_usage_counts_chunks() -> None:
    s = TokenStream("completions", 0.0)
    _feed(s, [json.dumps({"choices": [{"text": t}]}) for t in ("x", "", "y")] + ["[DONE]"])
    assert s.output_tokens == 2 and len(s.itls()) == 1


@pytest.mark.parametrize(
    "line, error",
    [
        ("data: {not json", SSEFailure),
        ("data: [1, 2]", SSEFailure),
        ("garbage line", SSEFailure),
        ("weird: field", SSEFailure),
        ('data: {"error": {"message": "overloaded"}}', HttpFailure),
        ('data: {"choices": [{"text": 5}]}', SSEFailure),
    ],
)
def test_malformed_sse_is_classified(line: str, error: type) -> None:
    s = TokenStream("completions", 0.0)
    with pytest.raises(error) as info:
        s.feed(line, 1.0)
    assert str(info.value).startswith(f"[{error.kind}]")


def test_comments_and_event_fields_are_ignored_and_data_after_done_is_not() -> None:
    s = TokenStream("completions", 0.0)
    for line in (": keep-alive", "event: message", "id: 3", "", "data: [DONE]"):
        s.feed(line, 1.0)
    assert s.done
    with pytest.raises(SSEFailure):
        s.feed('data: {"choices": []}', 1.0)


def test_build_request_bodies() -> None:
    spec = RequestSpec("hi there", 2, 7)
    path, body = build_request("chat", spec, model="m", ignore_eos=True)
    assert path == "/v1/chat/completions" and body["max_tokens"] == 7 and body["stream_options"]["include_usage"]
    path, body = build_request("generate", spec, model="m", ignore_eos=False)
    assert path == "/generate" and body["sampling_params"] == {"max_new_tokens": 7, "temperature": 0.0,
                                                               "ignore_eos": False}  # fmt: skip
    with pytest.raises(ValueError):
        build_request("embed", spec, model="m", ignore_eos=True)


# -- statistics -----------------------------------------------------------------------------------------------------
def test_t_interval_matches_scipy() -> None:
    rng = np.random.default_rng(3)
    values = list(rng.normal(100, 5, size=6))
    est = stats.t_interval(values)
    lo, hi = sps.t.interval(0.95, len(values) - 1, loc=np.mean(values), scale=sps.sem(values))
    assert est.lo == pytest.approx(lo) and est.hi == pytest.approx(hi) and est.n == 6
    single = stats.t_interval([4.0])
    assert single.value == 4.0 and not single.has_interval


def test_wilson_interval_known_value() -> None:
    est = stats.wilson_interval(8, 10)
    assert est.value == 0.8
    assert est.lo == pytest.approx(0.4902, abs=1e-3) and est.hi == pytest.approx(0.9433, abs=1e-3)


def test_bootstrap_interval_covers_the_true_median() -> None:
    rng = np.random.default_rng(5)
    values = rng.exponential(1.0, size=2000)
    est = stats.bootstrap_interval(values, stats.percentile_stat(50), seed=1)
    assert est.lo < math.log(2) < est.hi
    assert est.hi - est.lo < 0.15


def test_overlap_and_verdicts() -> None:
    E = stats.Estimate
    a = E(100, 95, 105, 3, "t")
    assert stats.overlaps(a, E(104, 101, 107, 3, "t"))
    assert not stats.overlaps(a, E(120, 110, 130, 3, "t"))
    assert stats.overlaps(a, E(200, math.nan, math.nan, 1, "t"))  # no interval: nothing can be claimed
    tok, ttft = METRICS[0], METRICS[1]
    assert verdict(tok, a, E(104, 101, 107, 3, "t")) == (NO_DIFFERENCE, False)
    text, sig = verdict(tok, a, E(120, 110, 130, 3, "t"))
    assert sig and text.startswith("B better") and "+20.0" in text
    text, sig = verdict(ttft, a, E(120, 110, 130, 3, "t"))
    assert sig and text.startswith("B worse")
    r = stats.ratio(a, E(120, 110, 130, 3, "t"))
    assert r.value == pytest.approx(1.2) and r.lo < 1.2 < r.hi


def _summary(c: int, tok: float, flags: dict[str, str], repeat: int = 1, ci: tuple[float, float] | None = None) -> dict:
    ci95 = {"output_tok_per_s": {"lo": ci[0], "hi": ci[1], "method": "batch-means"}} if ci else {}
    return {
        "concurrency": c,
        "repeat": repeat,
        "output_tok_per_s": tok,
        "ttft_s": {"p50": 0.1, "p99": 0.2},
        "itl_s": {"p50": 0.02, "p99": 0.03},
        "goodput": {"share": 1.0},
        "ci95": ci95,
        "server_flags": flags,
        "variant": "x",
        "window": {"start": 0.0, "end": 1.0},
    }


def test_compare_uses_repeats_then_within_run_ci_and_refuses_unflipped_runs(tmp_path) -> None:
    off = {"sparsemla_mma_decode": "off"}
    on = {"sparsemla_mma_decode": "on"}
    a = Run("a", tmp_path, {8: [_summary(8, v, off, i) for i, v in enumerate((100, 102, 98), 1)]})
    b = Run("b", tmp_path, {8: [_summary(8, v, on, i) for i, v in enumerate((150, 149, 152), 1)]})
    rows = compare_runs(a, b)
    tok = next(r for r in rows if r.metric.key == "output_tok_per_s")
    assert tok.a.method == "t" and tok.a.n == 3 and tok.significant and tok.ratio.value == pytest.approx(1.5, rel=0.01)
    same = Run("c", tmp_path, {8: [_summary(8, v, on, i) for i, v in enumerate((101, 97, 103), 1)]})
    tok = next(r for r in compare_runs(a, same) if r.metric.key == "output_tok_per_s")
    assert tok.verdict == NO_DIFFERENCE
    single = [_summary(8, 100, off, ci=(90, 110))]
    assert estimate(single, METRICS[0]).method == "batch-means"
    check_flag_flipped(a, b, "SPARSEMLA_MMA_DECODE")
    with pytest.raises(ReportError, match="nothing to compare"):
        check_flag_flipped(b, same, "SPARSEMLA_MMA_DECODE")
    with pytest.raises(ReportError, match="no sparsemla_kernel_flags_info"):
        check_flag_flipped(a, Run("d", tmp_path, {8: [_summary(8, 1, {})]}), "SPARSEMLA_MMA_DECODE")
    with pytest.raises(ReportError, match="share no concurrency"):
        compare_runs(a, Run("e", tmp_path, {16: [_summary(16, 1, on)]}))


# -- summaries ----------------------------------------------------------------------------------------------------
def test_summary_windows_failures_and_throughput(tmp_path) -> None:
    rng = random.Random(11)
    records = []
    # steady 10 ms ITL streams, 20 tokens each, sent every 0.25 s from t=0 to t=10 (warmup = first 2 s)
    for k in range(40):
        start = 1000.0 + k * 0.25
        offsets = [0.05 + 0.01 * i for i in range(20)]
        records.append(RequestRecord(start, offsets, None, 20, 30, offsets[-1] + 0.001, request_id=f"1a-{k % 4}-{k}"))
    records.append(RequestRecord(1005.0, [], None, 0, 30, 0.5, "http_error", "[http_error] HTTP 500"))
    records.append(RequestRecord(1006.0, [0.1], None, 1, 30, 0.3, "sse", "[sse] data is not JSON"))
    records.append(RequestRecord(1001.0, [], None, 0, 30, 0.2, "timeout", "warmup failure, not counted"))
    cut_offsets = [0.05 + 0.01 * i for i in range(5)]
    records.append(RequestRecord(1009.9, cut_offsets, None, 5, 30, 0.1, None, None, cut=True))
    rng.shuffle(records)
    path = tmp_path / "requests.jsonl"
    path.write_text("".join(json.dumps(r.to_json()) + "\n" for r in records) + '{"s": 1, "t": [')  # torn last line
    back = read_records(path)
    assert len(back) == len(records)
    assert {r.request_id for r in back} == {r.request_id for r in records}  # joins server logs (X-Request-Id)
    s = summarize(back, measure_start=1002.0, stop=1010.0, concurrency=4, ttft_slo_s=0.06, tpot_slo_s=0.02)
    assert s["failures"] == {"connection": 0, "http_error": 1, "timeout": 0, "sse": 1, "total": 2}
    assert s["failures_marked"]  # 2 of ~33 > 1 %
    assert s["ttft_s"]["p50"] == pytest.approx(0.05) and s["itl_s"]["p50"] == pytest.approx(0.01)
    assert s["tpot_s"]["mean"] == pytest.approx((0.241 - 0.05) / 19)
    # tokens arriving in [1002, 1010): 20 per request sent at 1002..1009.75 (32 requests) + cut 5; the failed (sse)
    # request's token is no output
    assert s["output_tokens"] == pytest.approx(32 * 20 + 5)
    assert s["output_tok_per_s"] == pytest.approx(s["output_tokens"] / 8.0)
    assert s["goodput"]["share"] == 1.0 and s["cut_requests"] == 1
    for key in ("ttft_s", "itl_s", "tpot_s", "e2e_s"):
        assert set(s[key]) >= {"p50", "p90", "p95", "p99", "mean"}
    write_json_atomic(tmp_path / "summary.json", s)
    assert json.loads((tmp_path / "summary.json").read_text())["requests"] == s["requests"]


def test_duration_and_concurrency_parsing() -> None:
    assert parse_duration("60s") == 60 and parse_duration("1m30s") == 90 and parse_duration("2") == 2
    for bad in ("", "-1", "abc", "0s"):
        with pytest.raises(ValueError):
            parse_duration(bad)
    assert parse_concurrency_list("1 16, 64") == [1, 16, 64]
    for bad in ("", "1 x", "0"):
        with pytest.raises(ValueError):
            parse_concurrency_list(bad)


def test_batch_means_interval_is_centred_on_the_overall_rate():
    """Whole-second slices of a fractional window average slightly off the run's rate; the reported rate must lie
    inside its own interval (the demo's throughput plot draws it as error bars)."""
    from sparsemla.loadtest import stats

    est = stats.batch_means_interval([100.0, 101.0, 99.5, 100.5], value=97.0)
    assert est.value == 97.0 and est.lo < 97.0 < est.hi
    assert est.hi - est.lo == pytest.approx(
        stats.batch_means_interval([100.0, 101.0, 99.5, 100.5]).hi
        - stats.batch_means_interval([100.0, 101.0, 99.5, 100.5]).lo
    )
