"""Simulator reliability: abandoned non-streaming requests are aborted (and SIGTERM does not wait for them);
``--api-key`` guards the routes as sglang does."""

from __future__ import annotations

import json
import random
import signal
import socket
import time

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from sparsemla.ops.sim.calibration import PROVISIONAL_PATH
from sparsemla.ops.sim.testing import RunningSim, run_sim

pytestmark = pytest.mark.slow
MMA = {
    "SPARSEMLA_MMA_DECODE": "1",
    "SPARSEMLA_TRITON_INDEXER": None,
    "SPARSEMLA_SIM_CALIBRATION": str(PROVISIONAL_PATH),
}
LONG = 20_000  # tokens: minutes of decoding at the calibrated step times, so only an abort ends these requests


def _long_body(path: str, rng: random.Random) -> dict:
    prompt = f"abandoned {rng.random()}"
    if path == "/generate":
        return {"text": prompt, "sampling_params": {"max_new_tokens": LONG, "ignore_eos": True}}
    if path == "/v1/chat/completions":
        return {"messages": [{"role": "user", "content": prompt}], "max_tokens": LONG, "ignore_eos": True}
    return {"prompt": prompt, "max_tokens": LONG, "ignore_eos": True}


def _send_and_abandon(sim: RunningSim, path: str, body: dict) -> socket.socket:
    """Send a non-streaming request over a raw socket; the caller closes it without reading the answer."""
    payload = json.dumps(body).encode()
    sock = socket.create_connection(("127.0.0.1", sim.port), timeout=10)
    head = (f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1:{sim.port}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(payload)}\r\n\r\n").encode()  # fmt: skip
    sock.sendall(head + payload)
    return sock


def _state(sim: RunningSim) -> tuple[int, float]:
    """(running + waiting requests, sglang:num_aborted_requests_total)."""
    info = httpx.get(f"{sim.url}/server_info", timeout=10).json()["internal_states"][0]
    text = httpx.get(f"{sim.url}/metrics", timeout=10).text
    (fam,) = [f for f in text_string_to_metric_families(text) if f.name == "sglang:num_aborted_requests"]
    aborted = sum(s.value for s in fam.samples if s.name.endswith("_total"))
    return info["num_running_reqs"] + info["num_queue_reqs"], aborted


def _wait_running(sim: RunningSim, want: int, timeout: float) -> float:
    """Seconds until `want` requests run (or wait), or fail."""
    t0 = time.monotonic()
    while (n := _state(sim)[0]) != want:
        assert time.monotonic() - t0 < timeout, f"{n} requests in the engine, expected {want}"
        time.sleep(0.05)
    return time.monotonic() - t0


@pytest.fixture(scope="module")
def sim():
    with run_sim(MMA) as running:
        yield running


@pytest.mark.parametrize("path", ["/v1/completions", "/v1/chat/completions", "/generate"])
def test_disconnected_non_streaming_requests_are_aborted(sim: RunningSim, path: str) -> None:
    rng = random.Random()
    n = rng.randint(5, 11)
    running0, aborted0 = _state(sim)
    assert running0 == 0
    socks = [_send_and_abandon(sim, path, _long_body(path, rng)) for _ in range(n)]
    _wait_running(sim, n, timeout=10)
    time.sleep(rng.uniform(0.0, 0.5))  # tokens are flowing: the requests are mid-generation
    for s in socks:
        s.close()
    assert _wait_running(sim, 0, timeout=3) <= 2.0  # all aborted within ~a second of the disconnect
    assert _state(sim)[1] - aborted0 == n


def test_sigterm_does_not_wait_for_abandoned_requests() -> None:
    rng = random.Random()
    with run_sim(MMA) as one:
        socks = [_send_and_abandon(one, "/v1/completions", _long_body("/v1/completions", rng)) for _ in range(4)]
        _wait_running(one, 4, timeout=10)
        for s in socks:
            s.close()
        time.sleep(0.2)
        t0 = time.monotonic()
        one.proc.send_signal(signal.SIGTERM)
        code = one.proc.wait(30)
        took = time.monotonic() - t0
    assert code in (0, -signal.SIGTERM)
    assert took < 10, f"SIGTERM took {took:.1f} s"


KEY = f"sk-{random.randbytes(8).hex()}"


@pytest.fixture(scope="module")
def keyed_sim():
    with run_sim(MMA, ("--api-key", KEY)) as running:
        yield running


COMPLETION = {"prompt": "auth", "max_tokens": 2}


@pytest.mark.parametrize(
    ("method", "path", "body"),
    [
        ("POST", "/v1/completions", COMPLETION),
        ("POST", "/v1/chat/completions", {"messages": [{"role": "user", "content": "auth"}], "max_tokens": 2}),
        ("POST", "/generate", {"text": "auth", "sampling_params": {"max_new_tokens": 2}}),
        ("GET", "/v1/models", None),
        ("GET", "/server_info", None),
        ("GET", "/get_model_info", None),
        ("POST", "/start_profile", {"num_steps": 1}),
        ("POST", "/stop_profile", None),
        ("POST", "/flush_cache", None),
    ],
    ids=lambda v: v if isinstance(v, str) else "",
)
@pytest.mark.parametrize("auth", [None, "Bearer wrong", f"Basic {KEY}", f"Bearer {KEY}x", "Bearer caf\u00e9"], ids=str)
def test_api_key_required_with_sglangs_401(keyed_sim: RunningSim, method: str, path: str, body, auth) -> None:
    headers = {"Authorization": auth.encode("latin-1")} if auth else {}
    r = httpx.request(method, keyed_sim.url + path, json=body, headers=headers, timeout=30)
    assert r.status_code == 401, r.text
    assert r.json() == {"error": "Unauthorized"}


@pytest.mark.parametrize("path", ["/health", "/health_generate", "/metrics"])
def test_probes_and_metrics_need_no_key(keyed_sim: RunningSim, path: str) -> None:
    assert httpx.get(keyed_sim.url + path, timeout=30).status_code == 200


def test_the_right_key_is_accepted(keyed_sim: RunningSim) -> None:
    headers = {"Authorization": f"Bearer {KEY}"}
    r = httpx.post(f"{keyed_sim.url}/v1/completions", json=COMPLETION, headers=headers, timeout=30)
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 2
    assert httpx.get(f"{keyed_sim.url}/v1/models", headers=headers, timeout=10).status_code == 200
