"""A tiny sglang-like SSE server with known, injected latencies: the load-test tests' measuring stick.

Every streamed request gets its first output chunk ``ttft`` seconds after the request arrived and chunk ``i`` at
``arrival + ttft + i * itl`` (an absolute schedule, so server-side timer jitter does not accumulate). What the server
actually did is kept too: ``GET /fixture/timings`` lists, per request (keyed by the client's ``X-Request-Id``), the
client's send time (``X-Request-Start``) and the wall-clock time at which each output chunk was handed to the socket,
so tests can compare what the client measured with what the server did (under load the server's event loop is late
by milliseconds, which is not a client measurement error). Failures are
injected deterministically by request number: ``--fail-every N`` answers HTTP 500, ``--malformed-every N`` sends a
non-JSON data line, ``--drop-every N`` breaks the connection mid-stream, ``--hang-every N`` never answers.

Run: ``python tests/test_loadtest_sse_server.py --port 8123 --ttft 0.05 --itl 0.02``. The tests at the bottom check the
server itself (the schedule it promises is the one it keeps when idle).
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import time
from dataclasses import dataclass

import pytest

# Needs the ops/loadtest extras: the GPU machine installs the runtime only, so this module skips there.
pytest.importorskip("fastapi")
from fastapi import FastAPI, Request  # noqa: E402
from fastapi.responses import JSONResponse, PlainTextResponse, StreamingResponse  # noqa: E402


@dataclass
class FixtureConfig:
    ttft: float = 0.05
    itl: float = 0.02
    fail_every: int = 0
    malformed_every: int = 0
    drop_every: int = 0
    hang_every: int = 0
    flags: str = "sparsemla_mma_decode=off,sparsemla_triton_indexer=off"
    variant: str = "baseline"


def _hit(n: int, every: int) -> bool:
    return every > 0 and n % every == 0


def make_app(cfg: FixtureConfig) -> FastAPI:
    app = FastAPI()
    counter = itertools.count(1)

    def flag_labels() -> dict[str, str]:
        return dict(kv.split("=", 1) for kv in cfg.flags.split(",") if kv)

    @app.get("/health")
    async def health() -> PlainTextResponse:
        return PlainTextResponse("ok")

    @app.get("/server_info")
    async def server_info() -> dict:
        return {"model_path": "fixture/sse", "version": "fixture", "ttft": cfg.ttft, "itl": cfg.itl}

    @app.get("/v1/models")
    async def models() -> dict:
        return {"object": "list", "data": [{"id": "fixture-model", "object": "model"}]}

    @app.get("/metrics")
    async def metrics() -> PlainTextResponse:
        labels = {**flag_labels(), "variant": cfg.variant, "version": "0.1.0"}
        text = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
        body = (
            "# HELP sparsemla_kernel_flags_info Kernel flags.\n# TYPE sparsemla_kernel_flags_info gauge\n"
            f"sparsemla_kernel_flags_info{{{text}}} 1.0\n"
        )
        return PlainTextResponse(body)

    timings: dict[str, dict] = {}

    @app.get("/fixture/timings")
    async def get_timings() -> dict:
        return {"requests": timings}

    async def stream(request: Request, api: str) -> StreamingResponse | JSONResponse:
        # Schedule from the client's send time when it says so (X-Request-Start, unix microseconds), so that the
        # server's own request handling under load does not blur the injected TTFT this fixture promises.
        arrival = time.perf_counter()
        start_header = request.headers.get("x-request-start", "")
        client_sent = int(start_header[2:]) / 1e6 if start_header.startswith("t=") else None
        if client_sent is not None:
            arrival -= max(0.0, time.time() - client_sent)
        n = next(counter)
        sent: list[float] = []  # wall time each output chunk was handed to the transport
        timings[request.headers.get("x-request-id") or f"n{n}"] = {"client_sent": client_sent, "sent": sent}
        body = await request.json()
        if _hit(n, cfg.fail_every):
            return JSONResponse({"error": {"message": "injected failure", "code": 500}}, status_code=500)
        if api == "generate":
            max_tokens = int(body.get("sampling_params", {}).get("max_new_tokens", 16))
        else:
            max_tokens = int(body.get("max_tokens", 16))
        include_usage = bool((body.get("stream_options") or {}).get("include_usage"))

        def chunk(i: int) -> dict:
            if api == "chat":
                return {"object": "chat.completion.chunk", "choices": [{"index": 0, "delta": {"content": f"t{i} "}}]}
            if api == "completions":
                return {"object": "text_completion", "choices": [{"index": 0, "text": f"t{i} "}]}
            text = "".join(f"t{j} " for j in range(i + 1))
            return {"text": text, "meta_info": {"completion_tokens": i + 1, "prompt_tokens": 7}}

        async def events():
            if _hit(n, cfg.hang_every):
                await asyncio.sleep(3600)
            if api == "chat":
                yield "data: " + json.dumps({"choices": [{"index": 0, "delta": {"role": "assistant"}}]}) + "\n\n"
            for i in range(max_tokens):
                delay = arrival + cfg.ttft + i * cfg.itl - time.perf_counter()
                if delay > 0:
                    await asyncio.sleep(delay)
                if i == max_tokens // 2 and _hit(n, cfg.malformed_every):
                    yield "data: {not json\n\n"
                if i == max_tokens // 2 and _hit(n, cfg.drop_every):
                    raise RuntimeError("injected connection drop")
                yield "data: " + json.dumps(chunk(i)) + "\n\n"
                # Starlette awaits send() (transport.write) before asking for the next chunk: this is when it went out.
                sent.append(time.time())
            if include_usage:
                usage = {"prompt_tokens": 7, "completion_tokens": max_tokens, "total_tokens": 7 + max_tokens}
                yield "data: " + json.dumps({"choices": [], "usage": usage}) + "\n\n"
            yield "data: [DONE]\n\n"

        return StreamingResponse(events(), media_type="text/event-stream")

    @app.post("/v1/chat/completions")
    async def chat(request: Request):
        return await stream(request, "chat")

    @app.post("/v1/completions")
    async def completions(request: Request):
        return await stream(request, "completions")

    @app.post("/generate")
    async def generate(request: Request):
        return await stream(request, "generate")

    return app


def main() -> None:
    import uvicorn

    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    for name in ("ttft", "itl"):
        parser.add_argument(f"--{name}", type=float, default=getattr(FixtureConfig, name))
    for name in ("fail-every", "malformed-every", "drop-every", "hang-every"):
        parser.add_argument(f"--{name}", type=int, default=0)
    parser.add_argument("--flags", default=FixtureConfig.flags)
    parser.add_argument("--variant", default=FixtureConfig.variant)
    args = parser.parse_args()
    cfg = FixtureConfig(
        args.ttft,
        args.itl,
        args.fail_every,
        args.malformed_every,
        args.drop_every,
        args.hang_every,
        args.flags,
        args.variant,
    )
    uvicorn.run(make_app(cfg), host="127.0.0.1", port=args.port, log_level="warning", access_log=False)


if __name__ == "__main__":
    main()


# -- tests of the fixture itself ------------------------------------------------------------------------------------
def test_fixture_keeps_its_schedule_when_idle() -> None:
    """One request at a time: chunk i arrives at ttft + i*itl, so it can serve as a measuring stick."""
    from fastapi.testclient import TestClient

    cfg = FixtureConfig(ttft=0.03, itl=0.01)
    with TestClient(make_app(cfg)) as client:
        t0 = time.perf_counter()
        times = []
        with client.stream("POST", "/v1/completions", json={"max_tokens": 6, "prompt": "x"}) as resp:
            for line in resp.iter_lines():
                if line.startswith("data: {"):
                    times.append(time.perf_counter() - t0)
    assert len(times) == 6
    # Chunk i at start + ttft + i*itl, where start is the client's own start-up (a few ms): the offset is the median
    # of t_i - i*itl; most chunks within 3 ms of it, none more than 15 ms off (a loaded CI machine delays a wake-up
    # now and then; a fixture that drifted or batched its chunks would miss the median bound by far).
    offsets = sorted(t - i * cfg.itl for i, t in enumerate(times))
    offset = offsets[len(offsets) // 2]
    assert cfg.ttft - 0.001 <= offset < cfg.ttft + 0.03, times
    errors = sorted(abs(t - i * cfg.itl - offset) for i, t in enumerate(times))
    assert errors[len(errors) // 2] < 0.003 and errors[-1] < 0.015, (times, errors)
