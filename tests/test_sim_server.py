"""The simulated sglang server end to end (subprocess on a free port): API shapes, errors, metrics, traces, batching."""

from __future__ import annotations

import asyncio
import gzip
import json
import random
import signal
import threading
import time
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from sparsemla import metric_names as mn
from sparsemla import variant
from sparsemla.ops.sim import tokens
from sparsemla.ops.sim.calibration import PROVISIONAL_PATH, load_calibration
from sparsemla.ops.sim.testing import run_sim, stream_completions
from sparsemla.sglang_metrics import METRICS

pytestmark = pytest.mark.slow
MMA = {
    "SPARSEMLA_MMA_DECODE": "1",
    "SPARSEMLA_TRITON_INDEXER": None,
    "SPARSEMLA_SIM_CALIBRATION": str(PROVISIONAL_PATH),
}


@pytest.fixture(scope="module")
def profile_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("profiles")


@pytest.fixture(scope="module")
def sim(profile_root: Path):
    with run_sim({**MMA, "SGLANG_TORCH_PROFILER_DIR": str(profile_root)}) as running:
        yield running


def _sse_events(body: str) -> list:
    events = [line[len("data: ") :] for line in body.split("\n") if line.startswith("data: ")]
    assert events and events[-1] == "[DONE]"
    return [json.loads(e) for e in events[:-1]]


def test_metrics_use_sglang_names_types_and_labels(sim) -> None:
    httpx.post(f"{sim.url}/v1/completions", json={"prompt": "metrics please", "max_tokens": 3}, timeout=30)
    text = httpx.get(f"{sim.url}/metrics", timeout=10).text
    families = {f.name: f for f in text_string_to_metric_families(text)}
    sglang = {n: f for n, f in families.items() if n.startswith("sglang:")}
    needed = ["sglang:gen_throughput", "sglang:num_running_reqs", "sglang:num_queue_reqs", "sglang:token_usage",
              "sglang:cache_hit_rate", "sglang:time_to_first_token_seconds", "sglang:inter_token_latency_seconds",
              "sglang:e2e_request_latency_seconds", "sglang:prompt_tokens", "sglang:generation_tokens"]  # fmt: skip
    assert set(needed) <= set(sglang)
    by_family = {m.family(): m for m in METRICS.values()}
    for name, fam in sglang.items():
        spec = by_family[name]
        assert fam.type == spec.type, name
        for sample in fam.samples:
            labels = set(sample.labels) - {"le"}
            assert labels == set(spec.labelnames()), (name, labels)
    info = families[mn.KERNEL_FLAGS_INFO]
    (sample,) = info.samples
    assert sample.value == 1
    assert set(sample.labels) == {*variant.flag_labels(), "version", "variant"}
    assert sample.labels["variant"] == "mma_decode" and sample.labels["sparsemla_mma_decode"] == "on"
    step = families[mn.DECODE_STEP_SECONDS]
    assert step.type == "histogram"
    buckets = [s for s in step.samples if s.name.endswith("_bucket")]
    assert {s.labels["forward_mode"] for s in buckets} >= {"decode", "extend"}
    assert {float(s.labels["le"]) for s in buckets} == {*mn.DECODE_STEP_BUCKETS, float("inf")}


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/v1/chat/completions", b'{"messages": [{"role": "user", "content": "hi"}'),  # malformed JSON
        ("/v1/chat/completions", b"{}"),  # missing messages
        ("/v1/chat/completions", b'{"messages": "hi"}'),  # wrong type
        ("/v1/chat/completions", b'{"messages": [{"role": "user", "content": "hi"}], "max_tokens": -1}'),
        ("/v1/chat/completions", b'{"messages": [{"role": "user", "content": "hi"}], "max_tokens": 10000000}'),
        ("/v1/chat/completions", b'{"messages": [{"role": "user", "content": "hi"}], "max_tokens": "5"}'),
        ("/v1/completions", b'{"prompt": "' + b"word " * 70000 + b'"}'),  # prompt over the context length
        ("/v1/completions", b'{"prompt": [1, 2, -5]}'),
        ("/v1/completions", b'{"prompt": "x", "stop": ""}'),
        ("/generate", b'{"sampling_params": {"max_new_tokens": 3}}'),  # neither text nor input_ids
        ("/generate", b'{"text": "x", "sampling_params": {"max_new_tokens": -2}}'),
        ("/start_profile", b'{"num_steps": 0}'),
    ],
)
def test_bad_input_is_400_with_openai_error(sim, path: str, body: bytes) -> None:
    r = httpx.post(sim.url + path, content=body, headers={"content-type": "application/json"}, timeout=30)
    assert r.status_code == 400, r.text
    err = r.json()
    assert err["object"] == "error" and err["code"] == 400 and err["message"]


def test_chat_stream_counts_and_usage(sim) -> None:
    n = random.randint(5, 20)
    body = {"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hello, world!"}],
            "max_tokens": n, "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True}}  # fmt: skip
    events = _sse_events(httpx.post(f"{sim.url}/v1/chat/completions", json=body, timeout=30).text)
    assert events[0]["choices"][0]["delta"]["role"] == "assistant"
    text = "".join(e["choices"][0]["delta"].get("content", "") for e in events if e["choices"])
    assert events[-2]["choices"][0]["finish_reason"] == "length"
    usage = events[-1]["usage"]
    expected_prompt = 2 + len(tokens.encode("Be brief.")) + len(tokens.encode("Hello, world!")) + 1
    assert usage == {"prompt_tokens": expected_prompt, "completion_tokens": n, "total_tokens": expected_prompt + n,
                     "prompt_tokens_details": None}  # fmt: skip
    assert len(text.split()) == n
    # deterministic: the same request gives the same text
    again = httpx.post(f"{sim.url}/v1/chat/completions", json={**body, "stream": False}, timeout=30).json()
    assert again["choices"][0]["message"]["content"] == text


def test_stop_string_and_natural_eos(sim) -> None:
    prompt = f"stop test {random.randint(0, 10**9)}"
    full = httpx.post(f"{sim.url}/v1/completions", json={"prompt": prompt, "max_tokens": 12, "ignore_eos": True},
                      timeout=30).json()  # fmt: skip
    words = full["choices"][0]["text"].split()
    stop = words[5]
    cut = httpx.post(f"{sim.url}/v1/completions", json={"prompt": prompt, "max_tokens": 12, "ignore_eos": True,
                                                         "stop": [stop]}, timeout=30).json()  # fmt: skip
    choice = cut["choices"][0]
    assert choice["finish_reason"] == "stop" and choice["matched_stop"] == stop
    assert stop not in choice["text"].split() and full["choices"][0]["text"].startswith(choice["text"])
    natural = tokens.natural_length(tokens.encode(prompt))
    out = httpx.post(f"{sim.url}/generate", json={"text": prompt, "sampling_params": {"max_new_tokens": 2000}},
                     timeout=60).json()  # fmt: skip
    assert out["meta_info"]["completion_tokens"] == natural
    assert out["meta_info"]["finish_reason"] == {"type": "stop", "matched": tokens.EOS_ID}


def test_generate_native_stream(sim) -> None:
    body = {"input_ids": [11, 12, 13], "sampling_params": {"max_new_tokens": 4, "ignore_eos": True}, "stream": True}
    events = _sse_events(httpx.post(f"{sim.url}/generate", json=body, timeout=30).text)
    assert [len(e["output_ids"]) for e in events][-1] == 4
    assert events[-1]["meta_info"]["finish_reason"] == {"type": "length", "length": 4}
    assert all(events[i + 1]["text"].startswith(events[i]["text"]) for i in range(len(events) - 1))  # cumulative


def test_info_routes_expose_calibration_and_flags(sim) -> None:
    info = httpx.get(f"{sim.url}/server_info", timeout=10).json()
    assert info["sparsemla"]["variant"] == "mma_decode"
    assert info["sparsemla"]["calibration"]["provenance"]["provisional"] is True
    model = httpx.get(f"{sim.url}/get_model_info", timeout=10).json()
    assert model["sparsemla"]["flags"]["sparsemla_mma_decode"] == "on"
    assert httpx.get(f"{sim.url}/v1/models", timeout=10).json()["data"][0]["id"] == "deepseek-ai/DeepSeek-V4-Flash"
    assert httpx.get(f"{sim.url}/health_generate", timeout=30).status_code == 200


def _running(sim) -> int:
    return httpx.get(f"{sim.url}/server_info", timeout=10).json()["internal_states"][0]["num_running_reqs"]


def test_client_disconnect_frees_the_slot(sim) -> None:
    body = {"prompt": "long one", "max_tokens": 5000, "ignore_eos": True, "stream": True}
    with httpx.stream("POST", f"{sim.url}/v1/completions", json=body, timeout=30) as r:
        for line in r.iter_lines():
            if line.startswith("data: "):
                assert _running(sim) == 1  # still streaming
                break
    deadline = time.monotonic() + 10
    while _running(sim) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _running(sim) == 0


def test_profile_writes_sglang_named_trace_with_calibrated_shares(sim, profile_root: Path) -> None:
    pid = f"t{random.randint(0, 10**9)}"
    tmp_path = profile_root / pid  # output_dir must be the profiler directory or below it
    r = httpx.post(f"{sim.url}/start_profile", json={"output_dir": str(tmp_path), "num_steps": 4, "profile_id": pid,
                                                      "profile_by_stage": True}, timeout=10)  # fmt: skip
    assert r.status_code == 200 and r.text == "Start profiling.\n"
    httpx.post(f"{sim.url}/v1/completions", json={"prompt": "profile me", "max_tokens": 8, "ignore_eos": True},
               timeout=30)  # fmt: skip
    decode = tmp_path / f"{pid}-TP-0-DECODE.trace.json.gz"
    deadline = time.monotonic() + 10
    while not decode.exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    httpx.post(f"{sim.url}/stop_profile", timeout=30)  # writes EXTEND (1 step) if still open
    doc = json.loads(gzip.decompress(decode.read_bytes()))
    kernels = [e for e in doc["traceEvents"] if e.get("cat") == "kernel"]
    assert kernels and all(e["ph"] == "X" and e["dur"] >= 0 and {"ts", "pid", "tid", "name"} <= set(e) for e in kernels)
    assert doc["sparsemla_sim"]["steps"] == 4
    totals: dict[str, float] = {}
    for e in kernels:
        totals[e["name"]] = totals.get(e["name"], 0.0) + e["dur"]
    state = load_calibration(PROVISIONAL_PATH).state("mma_decode")
    expected = state.kernel_shares(1, 8)
    grand = sum(totals.values())
    for name, (_, share) in expected.items():
        assert totals[name] / grand == pytest.approx(share, abs=0.01), name
    assert (tmp_path / f"{pid}-TP-0-EXTEND.trace.json.gz").exists()


async def _stream_tokens(client: httpx.AsyncClient, url: str, n: int, arrivals: list[float]) -> int:
    body = {"prompt": f"batch {random.random()}", "max_tokens": n, "ignore_eos": True, "stream": True}
    got = 0
    async with client.stream("POST", f"{url}/v1/completions", json=body) as r:
        async for line in r.aiter_lines():
            if line.startswith("data: {"):
                k = len(json.loads(line[6:])["choices"][0]["text"].split())
                got += k
                arrivals.extend([time.monotonic()] * k)
    return got


def _decode_rate(url: str, concurrency: int, n: int) -> tuple[float, float]:
    """Measured aggregate decode tok/s in the steady middle of a run (client side), and the calibrated one."""

    async def main() -> list[float]:
        arrivals: list[float] = []
        limits = httpx.Limits(max_connections=concurrency + 8)
        async with httpx.AsyncClient(timeout=120, limits=limits) as client:
            got = await asyncio.gather(*(_stream_tokens(client, url, n, arrivals) for _ in range(concurrency)))
        assert got == [n] * concurrency
        return sorted(arrivals)

    arrivals = asyncio.run(main())
    state = load_calibration(PROVISIONAL_PATH).state("mma_decode")
    ctx = 4 + n / 2  # prompt "batch <float>" = 4 tokens, mean output half way
    expected = concurrency / state.step_seconds(concurrency, ctx)
    lo, hi = arrivals[len(arrivals) // 5], arrivals[len(arrivals) * 4 // 5]
    return (len(arrivals) * 3 // 5) / (hi - lo), expected


@pytest.mark.parametrize(("concurrency", "n"), [(1, 60), (16, 30), (64, 24)])
def test_throughput_follows_the_calibration(sim, concurrency: int, n: int) -> None:
    measured, expected = _decode_rate(sim.url, concurrency, n)
    assert measured == pytest.approx(expected, rel=0.05)


FAST = {**MMA, "SPARSEMLA_TRITON_INDEXER": "1"}  # mma_decode+triton_indexer: ~17 ms steps at B=512


def _histogram(text: str, family: str, **labels: str) -> tuple[float, float]:
    """(sum, count) of a histogram in a /metrics exposition, over all its series that carry ``labels``."""
    (fam,) = [f for f in text_string_to_metric_families(text) if f.name == family]
    totals = {"_sum": 0.0, "_count": 0.0}
    for sample in fam.samples:
        suffix = sample.name[len(family) :]
        if suffix in totals and all(sample.labels.get(k) == v for k, v in labels.items()):
            totals[suffix] += sample.value
    return totals["_sum"], totals["_count"]


@pytest.mark.timeout(120)
@pytest.mark.parametrize(
    ("env", "variant", "n_tokens"),
    # 1 s steps: 12 tokens (not 6), so that one step the loaded 2-core CI machine wakes late (0.4 s once, 2026-12-02)
    # weighs 1/14 of the mean, not 1/10
    [(MMA, "mma_decode", 12), (FAST, "mma_decode+triton_indexer", 120)],
    ids=["1s-steps", "17ms-steps"],
)
def test_512_streams_with_small_step_error(env: dict, variant: str, n_tokens: int) -> None:
    """512 concurrent streams on this machine (the client shares its cores): every stream gets exactly its tokens,
    and the engine's realised decode steps at full batch keep within 5% of the calibrated durations (mean absolute
    relative error, deadlines anchored; definition in ops/sim/engine.py). The metrics carry the engine's times:
    the step histogram's sum is the realised decode time, and the inter-token-latency mean is the step duration."""
    bodies = [{"prompt": f"stream {i} {random.random()}", "max_tokens": n_tokens, "ignore_eos": True}
              for i in range(512)]  # fmt: skip
    with run_sim(env, ("--max-running-requests", "512")) as big:
        results = asyncio.run(stream_completions(big.url, bodies))
        info = httpx.get(f"{big.url}/server_info", timeout=10).json()["sparsemla"]
        text = httpx.get(f"{big.url}/metrics", timeout=10).text
    assert info["variant"] == variant
    bad = [r for r in results if r.status != 200 or not r.done or len(r.text.split()) != n_tokens]
    assert not bad, f"{len(bad)} of 512 streams incomplete"
    full = info["step_time_error_by_batch"]["decode"]["257+"]
    decode = info["step_time_error"]["decode"]
    # nearly every decode step ran at full batch (the 512 clients share this machine's cores with the engine: on a
    # 2-core CI machine a few streams now and then join a step late)
    assert full["steps"] >= n_tokens - max(2, n_tokens // 10), full
    assert decode["rate_error"] <= 0.05, decode  # tokens per request per second follow the calibration
    step_sum, step_count = _histogram(text, mn.DECODE_STEP_SECONDS, forward_mode="decode")
    assert step_count == decode["steps"] and step_sum == pytest.approx(decode["realised_seconds"], rel=1e-6)
    itl_sum, itl_count = _histogram(text, "sglang:inter_token_latency_seconds")
    assert itl_count == 512 * (n_tokens - 1)
    # A request's token gaps are decode steps plus the prefill steps the engine interleaves while the other 511
    # requests arrive (more of them when the client is slow to connect), so the mean gap is at least the calibrated
    # full-batch step and at most a quarter above it; a writer-side clock would show neither bound reliably.
    step = full["calibrated_seconds"] / full["steps"]
    assert 0.95 * step <= itl_sum / itl_count <= 1.25 * step, (itl_sum / itl_count, step)
    if info["engine"]["clock_priority"] == "normal":
        reason = "the OS refused the clock thread SCHED_FIFO and nice -10: per-step timing depends on the other load"
        pytest.skip(f"per-step error {full['mean_rel_error']:.1%}; {reason}")
    assert full["mean_rel_error"] <= 0.05, full
    assert decode["mean_rel_error"] <= 0.05, decode


def test_sigterm_drains_in_flight_requests() -> None:
    with run_sim(MMA) as one:
        result: dict = {}

        def client() -> None:
            body = {"prompt": "drain", "max_tokens": 40, "ignore_eos": True, "stream": True}
            result["body"] = httpx.post(f"{one.url}/v1/completions", json=body, timeout=60).text

        t = threading.Thread(target=client)
        t.start()
        time.sleep(0.3)
        one.proc.send_signal(signal.SIGTERM)
        t.join(60)
        assert one.proc.wait(30) in (0, -signal.SIGTERM)  # uvicorn re-raises the signal after draining
    events = _sse_events(result["body"])
    assert sum(len(e["choices"][0]["text"].split()) for e in events if e["choices"]) == 40
