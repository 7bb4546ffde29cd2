"""Simulator error answers: bad input is a 400 in sglang's error shape on every generation route (never a 5xx or
FastAPI's ``{"detail": ...}``); ``/start_profile`` writes only below the profiler directory; a trace write that fails
(disk full) leaves no partial file and is reported."""

from __future__ import annotations

import errno
import gzip
import io
import json
import math
import os
import random
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest

# Needs the ops extras: the GPU machine installs the runtime only, so this module skips there.
pytest.importorskip("fastapi")
from fastapi.testclient import TestClient  # noqa: E402

from sparsemla import flags  # noqa: E402
from sparsemla.ops.sim import profiler as profiler_mod  # noqa: E402
from sparsemla.ops.sim.calibration import PROVISIONAL_PATH, load_calibration  # noqa: E402
from sparsemla.ops.sim.engine import StepRecord  # noqa: E402
from sparsemla.ops.sim.profiler import Profiler, write_stage  # noqa: E402
from sparsemla.ops.sim.server import create_app  # noqa: E402
from sparsemla.ops.sim.testing import RunningSim, run_sim  # noqa: E402

MMA = {
    "SPARSEMLA_MMA_DECODE": "1",
    "SPARSEMLA_TRITON_INDEXER": None,
    "SPARSEMLA_SIM_CALIBRATION": str(PROVISIONAL_PATH),
}
pytestmark = pytest.mark.slow
ERROR_KEYS = {"object", "message", "type", "param", "code"}
rng = random.Random()


@pytest.fixture(scope="module")
def profile_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("profiles")


@pytest.fixture(scope="module")
def sim(profile_root: Path) -> Iterator[RunningSim]:
    with run_sim({**MMA, "SGLANG_TORCH_PROFILER_DIR": str(profile_root)}) as running:
        yield running


def _post(sim: RunningSim, path: str, body: bytes) -> httpx.Response:
    return httpx.post(sim.url + path, content=body, headers={"content-type": "application/json"}, timeout=30)


def _assert_sglang_error(r: httpx.Response, code: int = 400) -> dict:
    assert r.status_code == code, r.text
    assert r.headers["content-type"].startswith("application/json"), r.headers
    err = r.json()
    assert set(err) == ERROR_KEYS, err
    assert err["object"] == "error" and err["code"] == code and isinstance(err["message"], str) and err["message"]
    return err


# -- bad bodies on every generation route -----------------------------------------------------------------------------
# Each route gets the same sampling fields at its own place: top level (OpenAI) or `sampling_params` (/generate).
def _completion(fields: dict, stream: bool) -> dict:
    return {"prompt": "hello", "max_tokens": 2, "stream": stream, **fields}


def _chat(fields: dict, stream: bool) -> dict:
    return {"messages": [{"role": "user", "content": "hello"}], "max_tokens": 2, "stream": stream, **fields}


def _generate(fields: dict, stream: bool) -> dict:
    return {"text": "hello", "stream": stream, "sampling_params": {"max_new_tokens": 2, **fields}}


ROUTES: dict[str, tuple[str, Callable[[dict, bool], dict]]] = {
    "completions": ("/v1/completions", _completion),
    "chat": ("/v1/chat/completions", _chat),
    "generate": ("/generate", _generate),
}
# (id, sampling fields) that sglang's SamplingParams.verify() rejects; values drawn at random inside the bad range
BAD_SAMPLING = [
    ("temperature-negative", {"temperature": -rng.uniform(1e-3, 10)}),
    ("temperature-nan", {"temperature": math.nan}),
    ("temperature-inf", {"temperature": math.inf}),
    ("temperature-minus-inf", {"temperature": -math.inf}),
    ("top_p-above-1", {"top_p": rng.uniform(1.001, 10)}),
    ("top_p-zero", {"top_p": 0.0}),
    ("top_p-nan", {"top_p": math.nan}),
    ("top_k-zero", {"top_k": 0}),
    ("top_k-below-minus-1", {"top_k": -rng.randint(2, 1000)}),
    ("min_p-above-1", {"min_p": rng.uniform(1.001, 5)}),
    ("frequency_penalty-out", {"frequency_penalty": rng.choice([-1, 1]) * rng.uniform(2.001, 9)}),
    ("presence_penalty-out", {"presence_penalty": rng.choice([-1, 1]) * rng.uniform(2.001, 9)}),
    ("repetition_penalty-zero", {"repetition_penalty": 0.0}),
    ("repetition_penalty-above-2", {"repetition_penalty": rng.uniform(2.001, 9)}),
]


VALID = {"temperature": lambda: rng.choice([0.0, rng.uniform(0, 2)]), "top_p": lambda: rng.uniform(0.01, 1.0),
         "top_k": lambda: rng.choice([-1, 1, rng.randint(2, 100)]), "min_p": lambda: rng.uniform(0, 1),
         "frequency_penalty": lambda: rng.uniform(-2, 2), "presence_penalty": lambda: rng.uniform(-2, 2),
         "repetition_penalty": lambda: rng.uniform(0.01, 2)}  # fmt: skip


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
@pytest.mark.parametrize("route", list(ROUTES))
@pytest.mark.parametrize(("case", "fields"), BAD_SAMPLING, ids=[c for c, _ in BAD_SAMPLING])
def test_sampling_params_outside_sglangs_ranges_are_400(sim, route: str, stream: bool, case: str, fields: dict) -> None:
    path, build = ROUTES[route]
    r = _post(sim, path, json.dumps(build(dict(fields), stream)).encode())  # NaN/Infinity as JSON literals
    (name,) = fields
    assert _assert_sglang_error(r)["param"] == name
    good = _post(sim, path, json.dumps(build({name: VALID[name]()}, stream)).encode())  # the same field in range
    assert good.status_code == 200, good.text


SURROGATE = '"\\ud800"'  # JSON text: a lone high surrogate (valid JSON, not valid Unicode)
SURROGATE_BODIES = {
    "completions-prompt": ("/v1/completions", f'{{"prompt": {SURROGATE}, "max_tokens": 1}}'),
    "completions-prompt-list": ("/v1/completions", f'{{"prompt": [{SURROGATE}], "max_tokens": 1}}'),
    "completions-stream": ("/v1/completions", f'{{"prompt": {SURROGATE}, "max_tokens": 1, "stream": true}}'),
    "completions-model": ("/v1/completions", f'{{"prompt": "x", "model": {SURROGATE}, "max_tokens": 1}}'),
    "completions-stop": ("/v1/completions", f'{{"prompt": "x", "stop": [{SURROGATE}], "max_tokens": 1}}'),
    "completions-unknown-field": ("/v1/completions", f'{{"prompt": "x", "user": {SURROGATE}, "max_tokens": 1}}'),
    "completions-key": ("/v1/completions", '{"prompt": "x", "meta": {"\\udfff": 1}, "max_tokens": 1}'),
    "chat-content": ("/v1/chat/completions", f'{{"messages": [{{"role": "user", "content": {SURROGATE}}}]}}'),
    "chat-part": ("/v1/chat/completions",
                  f'{{"messages": [{{"role": "user", "content": [{{"type": "text", "text": {SURROGATE}}}]}}]}}'),
    "generate-text": ("/generate", f'{{"text": {SURROGATE}}}'),
    "generate-rid": ("/generate", f'{{"text": "x", "rid": {SURROGATE}, "sampling_params": {{"max_new_tokens": 1}}}}'),
    "generate-stop": ("/generate", f'{{"text": "x", "sampling_params": {{"stop": {SURROGATE}}}}}'),
    "start_profile-prefix": ("/start_profile", f'{{"profile_prefix": {SURROGATE}}}'),
}  # fmt: skip


@pytest.mark.parametrize("case", list(SURROGATE_BODIES))
def test_lone_surrogates_are_400(sim, case: str) -> None:
    path, body = SURROGATE_BODIES[case]
    _assert_sglang_error(_post(sim, path, body.encode()))


DEPTH = rng.randint(3000, 8000)  # past the JSON parser's recursion limit
UNPARSABLE = {
    "invalid-utf8": b'{"prompt": "\xff\xfe' + rng.randbytes(4).replace(b'"', b"x") + b'\x80"}',
    "deep-lists": b"[" * DEPTH + b"]" * DEPTH,
    "deep-objects": b'{"a":' * DEPTH + b"1" + b"}" * DEPTH,
    "deep-in-field": b'{"prompt": "x", "extra": ' + b"[" * DEPTH + b"]" * DEPTH + b"}",
}


@pytest.mark.parametrize("path", ["/v1/completions", "/v1/chat/completions", "/generate", "/start_profile"])
@pytest.mark.parametrize("case", list(UNPARSABLE))
def test_unparsable_bodies_get_sglangs_error_shape(sim, path: str, case: str) -> None:
    err = _assert_sglang_error(_post(sim, path, UNPARSABLE[case]))
    assert "detail" not in err


# -- /start_profile stays inside the profiler directory ---------------------------------------------------------------
def _outside_dir(root: Path, case: str) -> tuple[str, Path]:
    """(output_dir to send, a directory that must not get created)."""
    outside = root.parent / f"outside-{rng.randrange(10**9)}"
    if case == "symlink-out":
        link = root / f"link-{rng.randrange(10**9)}"
        link.symlink_to(outside, target_is_directory=True)
        return str(link), outside
    sent = {"absolute-elsewhere": str(outside), "sibling-prefix": f"{root}-{outside.name}",
            "dotdot-absolute": str(root / ".." / outside.name), "dotdot-relative": f"../{outside.name}",
            "nul": f"{outside}\x00x"}[case]  # fmt: skip
    return sent, Path(f"{root}-{outside.name}") if case == "sibling-prefix" else outside


@pytest.mark.parametrize(
    "case", ["absolute-elsewhere", "sibling-prefix", "dotdot-absolute", "dotdot-relative", "symlink-out", "nul"]
)
def test_output_dir_outside_the_profiler_dir_is_400(sim, profile_root: Path, case: str) -> None:
    output_dir, forbidden = _outside_dir(profile_root, case)
    r = httpx.post(f"{sim.url}/start_profile", json={"output_dir": output_dir, "num_steps": 1}, timeout=10)
    assert "output_dir" in _assert_sglang_error(r)["message"]
    assert not forbidden.exists()
    assert httpx.post(f"{sim.url}/stop_profile", timeout=10).status_code == 400  # nothing started


@pytest.mark.parametrize(
    ("field", "value"),
    [("profile_prefix", "../../x"), ("profile_prefix", "a/b"), ("profile_prefix", ".."), ("profile_prefix", "x\x00"),
     ("profile_id", "../escape"), ("profile_id", "."), ("profile_prefix", "p" * 300)],
    ids=["prefix-dotdot-path", "prefix-slash", "prefix-dotdot", "prefix-nul", "id-dotdot-path", "id-dot", "too-long"],
)  # fmt: skip
def test_profile_names_must_be_plain_names(sim, profile_root: Path, field: str, value: str) -> None:
    before = set(profile_root.parent.rglob("*"))
    r = httpx.post(f"{sim.url}/start_profile", json={field: value, "num_steps": 1}, timeout=10)
    assert field.split("_")[1] in _assert_sglang_error(r)["message"]
    assert httpx.post(f"{sim.url}/stop_profile", timeout=10).status_code == 400  # not started
    assert set(profile_root.parent.rglob("*")) - before == set()


@pytest.mark.parametrize("relative", [False, True], ids=["absolute-subdir", "relative-subdir"])
def test_subdirectories_of_the_profiler_dir_are_fine(sim, profile_root: Path, relative: bool) -> None:
    sub = f"run-{rng.randrange(10**9)}/deeper"
    pid = f"p{rng.randrange(10**9)}"
    body = {"output_dir": sub if relative else str(profile_root / sub), "profile_id": pid, "profile_prefix": "pre"}
    assert httpx.post(f"{sim.url}/start_profile", json=body, timeout=10).status_code == 200
    httpx.post(f"{sim.url}/v1/completions", json={"prompt": "trace me", "max_tokens": 3}, timeout=30)
    assert httpx.post(f"{sim.url}/stop_profile", timeout=30).status_code == 200
    assert (profile_root / sub / f"pre-{pid}-TP-0.trace.json.gz").exists()


# -- a trace write that fails -----------------------------------------------------------------------------------------
class _FullDisk(io.FileIO):
    """A file on a disk with ``room`` bytes left: a write past it stores what fits, then fails with ENOSPC."""

    def __init__(self, path: str, room: int, log: list[int]) -> None:
        super().__init__(path, "wb")
        self.room, self.log = room, log

    def write(self, data) -> int:  # type: ignore[override]
        data = bytes(data)
        if len(data) > self.room:
            super().write(data[: self.room])
            self.log.append(self.room)
            self.room = 0
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        self.room -= len(data)
        return super().write(data)


@pytest.fixture(params=[0, "random"], ids=["full-at-first-byte", "full-mid-file"])
def full_disk(request, monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """gzip.open (as the profiler calls it) writes to a disk that fills up; returns the bytes stored before ENOSPC."""
    room = rng.randint(1, 64) if request.param == "random" else 0
    stored: list[int] = []

    def fake_open(path, mode: str = "rb", compresslevel: int = 9):
        assert mode == "wb"
        raw = _FullDisk(os.fspath(path), room, stored)
        gz = gzip.GzipFile(filename=os.fspath(path), mode="wb", compresslevel=compresslevel, fileobj=raw)
        gz.myfileobj = raw  # closed with the GzipFile, as when gzip.open opens the file itself
        return gz

    monkeypatch.setattr(profiler_mod.gzip, "open", fake_open)
    return stored


def _step(i: int) -> StepRecord:
    return StepRecord("decode", rng.randint(1, 64), rng.uniform(100, 4000), 1, time.monotonic(), 0.01, 0.0, index=i)


def test_write_stage_removes_the_partial_file_on_enospc(full_disk: list[int], tmp_path: Path, caplog) -> None:
    state = load_calibration(PROVISIONAL_PATH).state("baseline")
    prof = Profiler(state, {"gpu": "test"}, str(tmp_path))
    sess = prof.start(profile_id="full")
    for i in range(rng.randint(2, 6)):
        prof.record(_step(i + 1), i + 1)
    prof.stop()
    with caplog.at_level("ERROR", logger="sparsemla.sim"):
        assert write_stage(prof, sess, sess.stages["ALL"]) is None
    assert full_disk  # the disk did fill up during the write (after storing full_disk[0] bytes of the .tmp)
    assert list(tmp_path.iterdir()) == []  # neither the partial .tmp nor a trace
    (error,) = prof.take_errors()
    assert "No space left on device" in error and "full-TP-0.trace.json.gz" in error
    assert "No space left on device" in caplog.text
    assert sess.written == [] and prof.take_errors() == []


@pytest.mark.parametrize("stop_by", ["num_steps", "stop_profile"])
def test_stop_profile_reports_a_failed_write(full_disk: list[int], tmp_path: Path, stop_by: str) -> None:
    with flags.SGLANG_TORCH_PROFILER_DIR.override(str(tmp_path)):
        app = create_app(load_calibration(PROVISIONAL_PATH))
    with TestClient(app) as client:
        body = {"profile_id": "disk-full", **({"num_steps": 2} if stop_by == "num_steps" else {})}
        assert client.post("/start_profile", json=body).status_code == 200
        r = client.post("/v1/completions", json={"prompt": "fill the disk", "max_tokens": 6, "ignore_eos": True})
        assert r.status_code == 200
        deadline = time.monotonic() + 10
        while stop_by == "num_steps" and not full_disk and time.monotonic() < deadline:
            time.sleep(0.05)  # the engine's steps stopped the profile; its write runs in the background
        r = client.post("/stop_profile")
        err = _assert_sglang_error(r, 500)
        assert err["type"] == "InternalServerError" and "No space left on device" in err["message"]
        assert full_disk, "the write never started"
        assert not list(tmp_path.rglob("*.tmp")) and not list(tmp_path.rglob("*.gz"))
        assert client.post("/stop_profile").status_code == 400  # reported once; the profiler is stopped
        assert client.post("/start_profile", json={"profile_id": "again"}).status_code == 200  # and usable
