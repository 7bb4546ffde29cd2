"""The simulator's engine in-process (no HTTP): token stream contents, abort, step-error arithmetic, batched ITL."""

from __future__ import annotations

import queue
import random

import pytest
from prometheus_client import CollectorRegistry, Histogram

from sparsemla.ops.sim import tokens
from sparsemla.ops.sim.calibration import PROVISIONAL_PATH, load_calibration
from sparsemla.ops.sim.engine import Engine, EngineRequest, StepErrorStats, StepOutput
from sparsemla.ops.sim.metrics import ITL_BUCKETS, observe_many


def _engine(outputs: queue.Queue, **kw) -> Engine:
    cal = load_calibration(PROVISIONAL_PATH)  # mma_decode+triton_indexer: 5 ms steps at B=1
    kw.setdefault("max_running_requests", 8)
    return Engine(cal.state("mma_decode+triton_indexer"), cal.prefill, outputs.put, raise_priority=False, **kw)


def _request(key: int, prompt: str, max_new: int, **kw) -> EngineRequest:
    ids = tokens.encode(prompt)
    return EngineRequest(key, len(ids), max_new, tokens.natural_length(ids), tokens.output_seed(ids), **kw)


def _drain(outputs: queue.Queue, keys: set[int], timeout: float = 20.0) -> dict:
    """Rebuild each request's (text, token ids, finish) from the step messages, as the front end does; under the key
    "last", the last message read."""
    texts = {k: "" for k in keys}
    ids: dict[int, list[int]] = {k: [] for k in keys}
    done: dict[int, dict] = {}
    while set(done) != keys:
        out: StepOutput = outputs.get(timeout=timeout)
        for key, token_id, keep, add, finish in out.tokens:
            texts[key] = texts[key] + add if keep < 0 else texts[key][:keep] + add
            ids[key].append(token_id)
            if finish is not None:
                done[key] = finish
    return {**{k: (texts[k], ids[k], done[k]) for k in keys}, "last": out}


def test_tokens_text_and_stops_match_the_pseudo_tokenizer() -> None:
    outputs: queue.Queue = queue.Queue()
    engine = _engine(outputs)
    prompt = f"engine test {random.randint(0, 10**9)}"
    ids = tokens.encode(prompt)
    n = random.randint(8, 20)
    full_ids = [tokens.output_token(ids, i) for i in range(n)]
    full_text = "".join(tokens.piece(t) for t in full_ids)
    words = full_text.split()
    stop = f"{words[3][1:]} {words[4]}"  # straddles two tokens and starts inside token 3: the cut reaches back
    engine.start()
    try:
        engine.submit(_request(1, prompt, n, ignore_eos=True))
        engine.submit(_request(2, prompt, n, ignore_eos=True, stop=(stop,)))
        engine.submit(_request(3, prompt, n, ignore_eos=True, stop_token_ids=(full_ids[2],)))
        got = _drain(outputs, {1, 2, 3})
        got.pop("last")
    finally:
        engine.stop(timeout=5)
    assert got[1] == (full_text, full_ids, {"type": "length", "length": n})
    text2, ids2, finish2 = got[2]
    assert finish2 == {"type": "stop", "matched": stop}
    assert text2 == full_text[: full_text.index(stop)] and ids2 == full_ids[: len(ids2)]
    stop_at = full_ids.index(full_ids[2]) + 1
    assert got[3][1] == full_ids[:stop_at] and got[3][2] == {"type": "stop", "matched": full_ids[2]}


def test_abort_frees_the_slot_and_the_engine_reports_idle() -> None:
    outputs: queue.Queue = queue.Queue()
    engine = _engine(outputs, max_running_requests=1)
    engine.start()
    try:
        engine.submit(_request(1, "long running", 10_000, ignore_eos=True))
        engine.submit(_request(2, "queued behind", 3, ignore_eos=True))
        first = outputs.get(timeout=10)
        assert first.running == 1 and first.waiting == 1
        engine.abort(1)
        done = _drain(outputs, {2})  # the waiting request gets the slot and finishes
        assert done[2][2] == {"type": "length", "length": 3}
        last = done["last"]
        assert (last.running, last.waiting, last.used_tokens) == (0, 0, 0)
    finally:
        engine.stop(timeout=5)
    decode = engine.step_error["decode"]
    assert decode.steps >= 3 and decode.sum_calibrated > 0


def test_step_error_stats_follow_the_definition() -> None:
    d = 0.017
    lateness = [random.uniform(0, 0.002) for _ in range(50)]
    stats = StepErrorStats()
    prev = 0.0
    for late in lateness:  # anchored deadlines: realised = d + this wake-up's lateness - the previous one's
        stats.add(d + late - prev, d, late)
        prev = late
    expected = [abs(b - a) / d for a, b in zip([0.0, *lateness], lateness, strict=False)]
    got = stats.as_dict()
    assert got["steps"] == 50
    assert got["mean_rel_error"] == pytest.approx(sum(expected) / 50)
    assert got["max_rel_error"] == pytest.approx(max(expected))
    assert got["steps_over_5pct"] == sum(e > 0.05 for e in expected)
    assert got["rate_error"] == pytest.approx(lateness[-1] / (50 * d))  # the sum telescopes to the last lateness


def test_observe_many_equals_repeated_observe() -> None:
    registry = CollectorRegistry()
    a = Histogram("a_seconds", "a", buckets=ITL_BUCKETS, registry=registry)
    b = Histogram("b_seconds", "b", buckets=ITL_BUCKETS, registry=registry)
    for _ in range(200):
        value, count = random.choice([random.uniform(0, 0.5), random.choice(ITL_BUCKETS), 9.0]), random.randint(1, 40)
        for _ in range(count):
            a.observe(value)
        observe_many(b, value, count)
    samples = {fam.name: [(s.name[1:], s.labels, s.value) for s in fam.samples] for fam in registry.collect()}
    assert _same(samples["a_seconds"], samples["b_seconds"])


def _same(x: list, y: list) -> bool:
    return len(x) == len(y) and all(
        p[0] == q[0] and p[1] == q[1] and p[2] == pytest.approx(q[2], rel=1e-9) for p, q in zip(x, y, strict=True)
    )
