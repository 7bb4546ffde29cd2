"""The simulated sglang HTTP server (FastAPI): sglang 0.5.23 / OpenAI routes, field names and error shapes.

Routes: ``/v1/chat/completions``, ``/v1/completions`` (stream and not, SSE ``data: {...}`` + ``data: [DONE]``, usage),
``/generate`` (sglang native; streamed chunks carry the cumulative ``text``), ``/v1/models``, ``/health``,
``/health_generate``, ``/get_model_info`` (+ ``/model_info``), ``/server_info`` (+ ``/get_server_info``),
``/metrics``, ``/start_profile``, ``/stop_profile``, ``/flush_cache``.

Bad input (malformed or undecodable JSON, missing or mistyped fields, strings that are not valid Unicode, sampling
parameters outside sglang's ``SamplingParams.verify()`` ranges, ``max_tokens`` < 0 or beyond the context, a prompt
over the context length, a profile ``output_dir`` outside the profiler directory) gets 400 with sglang's
``ErrorResponse`` JSON: ``{"object": "error", "message", "type", "param", "code"}`` (``errors.py``, ``schemas.py``).
With ``api_key`` set, routes other than ``/health*`` and ``/metrics`` need ``Authorization: Bearer <key>`` (401
otherwise, ``auth.py``). A client that disconnects is aborted in the engine at once (``num_aborted_requests_total``
counts it) and frees its slot, streaming or not. SIGTERM (uvicorn's graceful shutdown) stops accepting connections and
lets the in-flight requests of connected clients finish.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import json
import logging
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

from fastapi import Body, FastAPI, Request
from fastapi.responses import PlainTextResponse, Response, StreamingResponse
from starlette.types import Receive

from sparsemla import SGLANG_VERSION, flags
from sparsemla import __version__ as sparsemla_version
from sparsemla import variant as kernel_variant
from sparsemla.ops.sim import tokens
from sparsemla.ops.sim.auth import ApiKeyMiddleware
from sparsemla.ops.sim.calibration import Calibration
from sparsemla.ops.sim.engine import StepRecord
from sparsemla.ops.sim.engine_proc import EngineClient, EngineConfig, SimRequest
from sparsemla.ops.sim.errors import ApiError, install_error_handlers
from sparsemla.ops.sim.metrics import SimMetrics
from sparsemla.ops.sim.profiler import ProfileError, Profiler, write_stage
from sparsemla.ops.sim.schemas import (
    ChatCompletionRequest,
    CompletionRequest,
    GenerateRequest,
    ProfileRequest,
    SamplingParams,
    StopField,
    verify_sampling,
)

log = logging.getLogger("sparsemla.sim")


@dataclass(frozen=True)
class SimConfig:
    """Server options (the `sparsemla sim` flags)."""

    model_name: str = "deepseek-ai/DeepSeek-V4-Flash"
    max_running_requests: int = 256
    max_total_tokens: int = 1_048_576
    context_length: int | None = None  # None: the calibration's context_length
    default_max_tokens: int = 128
    api_key: str | None = None  # sglang's --api-key: Bearer token required on all but /health*, /ready*, /metrics


# -- the application ---------------------------------------------------------------------------------------------------


def _stops(stop: StopField) -> tuple[str, ...]:
    if stop is None:
        return ()
    values = (stop,) if isinstance(stop, str) else tuple(stop)
    if any(s == "" for s in values):
        raise ApiError("stop strings must not be empty", param="stop")
    return values


def _finish_reason(req: SimRequest) -> str | None:
    reason = req.finish_reason or {}
    return {"stop": "stop", "length": "length", "abort": "abort"}.get(reason.get("type", ""))


def _matched(req: SimRequest) -> Any:
    reason = req.finish_reason or {}
    return reason.get("matched") if reason.get("type") == "stop" else None


def _usage(req: SimRequest) -> dict[str, Any]:
    n = len(req.output_ids)
    return {"prompt_tokens": req.prompt_len, "completion_tokens": n, "total_tokens": req.prompt_len + n,
            "prompt_tokens_details": None}  # fmt: skip


def _sse(obj: Any) -> bytes:
    return b"data: " + json.dumps(obj, separators=(",", ":")).encode() + b"\n\n"


_HOLE = "\x00text\x00"


class ChunkTemplate:
    """A streamed chunk pre-encoded once per request around its one varying string (the new text): per chunk only
    that string is JSON-encoded. ``render(x)`` equals ``_sse(obj)`` with the hole replaced by ``x``."""

    def __init__(self, obj: Any) -> None:
        head, tail = _sse(obj).split(json.dumps(_HOLE).encode())
        self.head, self.tail = head, tail

    def render(self, text: str) -> bytes:
        return b"".join((self.head, json.dumps(text).encode(), self.tail))


async def _openai_chunks(
    stream: AsyncIterator[tuple[str, int, bool]],
    req: SimRequest,
    base: dict[str, Any],
    include_usage: bool,
    payload: Callable[[str, bool], dict[str, Any]],
) -> AsyncIterator[bytes]:
    """The SSE body of a streamed OpenAI completion: one chunk per ``stream`` item, then usage (if asked), [DONE].

    ``base``: the chunk's id/object/created/model; ``payload(new_text, first)``: the choice's content fields
    (``delta`` for chat, ``text`` for completions). Chunks between the first and the last come from a template
    encoded once (the hot path); the first and the last (finish_reason, matched_stop) are built in full."""
    middle = ChunkTemplate({**base, "choices": [{"index": 0, **payload(_HOLE, False), "logprobs": None,
                                                 "finish_reason": None}], "usage": None})  # fmt: skip
    first = True
    async for delta, _n, done in stream:
        if not first and not done:
            yield middle.render(delta)
            continue
        choice = {"index": 0, **payload(delta, first), "logprobs": None,
                  "finish_reason": _finish_reason(req) if done else None}  # fmt: skip
        first = False
        if done:
            choice["matched_stop"] = _matched(req)
        yield _sse({**base, "choices": [choice], "usage": None})
    if include_usage:
        yield _sse({**base, "choices": [], "usage": _usage(req)})
    yield b"data: [DONE]\n\n"


def create_app(calibration: Calibration, config: SimConfig | None = None) -> FastAPI:
    """Build the app for the current flags (``variant.current()`` picks the calibration state)."""
    config = config or SimConfig()
    variant = kernel_variant.current()
    state = calibration.state(variant)
    flag_labels = kernel_variant.flag_labels()
    context_length = config.context_length or calibration.model.context_length
    metrics = SimMetrics(config.model_name)
    metrics.set_constants(config.max_total_tokens, context_length)
    profile_meta = {"variant": variant, "gpu": calibration.provenance.gpu, "calibration": str(calibration.path),
                    "provisional": calibration.provenance.provisional, "calibration_kind": calibration.kind,
                    "calibration_label": calibration.label()}  # fmt: skip
    profiler = Profiler(state, profile_meta, flags.SGLANG_TORCH_PROFILER_DIR.get())
    pending_writes: set[asyncio.Task] = set()

    def on_step(rec: StepRecord) -> None:
        metrics.on_step(rec, config.max_total_tokens)
        if profiler.active:
            sess = profiler.session
            for stage in profiler.record(rec, rec.index):
                task = asyncio.get_running_loop().create_task(asyncio.to_thread(write_stage, profiler, sess, stage))
                pending_writes.add(task)
                task.add_done_callback(pending_writes.discard)
            if sess is not None and all(s.done for s in sess.stages.values()):
                profiler.stop()

    engine = EngineClient(
        EngineConfig(state, calibration.prefill, config.max_running_requests, config.max_total_tokens),
        on_step=on_step,
        on_first_token=metrics.on_first_token,
        on_finish=metrics.on_finish,
    )

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        gc.collect()
        gc.freeze()  # the long-lived startup objects leave the collector's scans: shorter GIL pauses under load
        await engine.start()
        try:
            yield
        finally:
            await engine.stop()
            for task in list(pending_writes):
                with contextlib.suppress(Exception):
                    await task

    app = FastAPI(title="sparsemla simulated sglang server", version=SGLANG_VERSION, lifespan=lifespan)
    app.state.engine, app.state.metrics, app.state.profiler = engine, metrics, profiler
    app.state.calibration, app.state.variant, app.state.config = calibration, variant, config

    install_error_handlers(app)
    if config.api_key:
        app.add_middleware(ApiKeyMiddleware, api_key=config.api_key)

    # -- helpers -------------------------------------------------------------------------------------------------------
    def make_request(prompt_ids: list[int], max_tokens: int | None, stop: StopField, stop_ids: list[int] | None,
                     ignore_eos: bool, stream: bool, param: str) -> SimRequest:  # fmt: skip
        if not engine.alive:
            raise ApiError("the simulator's engine process is not running", 503, "ServiceUnavailable")
        if not prompt_ids:
            raise ApiError("the prompt is empty", param=param)
        if len(prompt_ids) >= context_length:
            raise ApiError(
                f"The input ({len(prompt_ids)} tokens) is longer than the model's context length "
                f"({context_length} tokens).", param=param,
            )  # fmt: skip
        if max_tokens is None:
            max_tokens = min(config.default_max_tokens, context_length - len(prompt_ids))
        if max_tokens < 0:
            raise ApiError(f"max_tokens must be at least 0, got {max_tokens}.", param="max_tokens")
        if len(prompt_ids) + max_tokens > context_length:
            raise ApiError(
                f"Requested token count exceeds the model's maximum context length of {context_length} tokens. "
                f"You requested a total of {len(prompt_ids) + max_tokens} tokens: {len(prompt_ids)} tokens from "
                f"the input messages and {max_tokens} tokens for the completion.", param="max_tokens",
            )  # fmt: skip
        if len(prompt_ids) + max_tokens > config.max_total_tokens:
            raise ApiError(f"the request needs more KV tokens than the pool has ({config.max_total_tokens})")
        if stop_ids and any(t < 0 or t >= tokens.VOCAB_SIZE for t in stop_ids):
            raise ApiError(f"stop_token_ids must be in [0, {tokens.VOCAB_SIZE})", param="stop_token_ids")
        req = SimRequest(engine.new_rid(), prompt_ids, max_tokens, ignore_eos, _stops(stop), tuple(stop_ids or ()),
                         stream)  # fmt: skip
        if max_tokens == 0:
            req.finish_reason, req.finished_time = {"type": "length", "length": 0}, time.monotonic()
        return req

    async def run_to_end(req: SimRequest, request: Request) -> None:
        """Wait for a non-streaming request; abort it as soon as the client goes away (a watcher task waits for the
        ASGI ``http.disconnect`` message, so the abort does not wait for a pause in the token flow)."""
        if req.finished:  # max_tokens=0: nothing to generate
            return
        engine.submit(req)
        watcher = asyncio.get_running_loop().create_task(_abort_on_disconnect(request.receive, engine, req))
        try:
            await _wait_finished(req)
        finally:
            watcher.cancel()

    async def token_stream(req: SimRequest) -> AsyncIterator[tuple[str, int, bool]]:
        """Yield (new text, output ids so far, finished) as the engine produces tokens. One wake-up sends everything
        produced since the last one, so when the writer lags, several steps' tokens coalesce into one chunk (their
        production times, which the metrics use, stay the engine's)."""
        if req.finished:  # max_tokens=0: nothing to generate
            yield "", 0, True
            return
        engine.submit(req)
        sent = 0
        try:
            while True:
                await req.wakeup.wait()
                req.wakeup.clear()
                text, done = req.text, req.finished
                if len(text) > sent or done:
                    yield text[sent:], len(req.output_ids), done
                    sent = len(text)
                if done:
                    return
        finally:
            if not req.finished:  # client went away mid-stream: free the slot
                engine.abort(req)

    def chat_prompt(body: ChatCompletionRequest) -> list[int]:
        msgs = []
        for i, m in enumerate(body.messages):
            if isinstance(m.content, list):
                texts = []
                for part in m.content:
                    if part.type != "text" or part.text is None:
                        raise ApiError(f"messages[{i}].content: only text parts are supported", param="messages")
                    texts.append(part.text)
                content = "".join(texts)
            else:
                content = m.content or ""
            msgs.append((m.role, content))
        return tokens.encode_chat(msgs)

    def check_n(n: int) -> None:
        if n != 1:
            raise ApiError("the simulator supports n=1 only", param="n")

    # -- OpenAI routes -------------------------------------------------------------------------------------------------
    @app.post("/v1/chat/completions")
    async def chat_completions(body: ChatCompletionRequest, request: Request):
        check_n(body.n)
        max_tokens = body.max_completion_tokens if body.max_completion_tokens is not None else body.max_tokens
        verify_sampling(body, max_tokens, body.min_tokens)
        req = make_request(chat_prompt(body), max_tokens, body.stop, body.stop_token_ids, body.ignore_eos,
                           body.stream, "messages")  # fmt: skip
        created, rid, model = int(time.time()), f"chatcmpl-{req.rid}", body.model or config.model_name
        if body.stream:
            include_usage = bool(body.stream_options and body.stream_options.include_usage)
            base = {"id": rid, "object": "chat.completion.chunk", "created": created, "model": model}

            def delta(text: str, first: bool) -> dict[str, Any]:
                return {"delta": {"role": "assistant", "content": text} if first else {"content": text}}

            chunks = _openai_chunks(token_stream(req), req, base, include_usage, delta)
            return StreamingResponse(chunks, media_type="text/event-stream")
        await run_to_end(req, request)
        return {
            "id": rid, "object": "chat.completion", "created": created, "model": model,
            "choices": [{"index": 0, "message": {"role": "assistant", "content": req.text, "reasoning_content": None,
                                                 "tool_calls": None},
                         "logprobs": None, "finish_reason": _finish_reason(req), "matched_stop": _matched(req)}],
            "usage": _usage(req),
        }  # fmt: skip

    @app.post("/v1/completions")
    async def completions(body: CompletionRequest, request: Request):
        check_n(body.n)
        verify_sampling(body, body.max_tokens, body.min_tokens)
        prompt = body.prompt
        if isinstance(prompt, list) and prompt and isinstance(prompt[0], str):
            if len(prompt) != 1:
                raise ApiError("the simulator supports one prompt per request", param="prompt")
            prompt = prompt[0]
        if isinstance(prompt, str):
            prompt_ids = tokens.encode(prompt)
        else:
            if any(t < 0 or t >= tokens.VOCAB_SIZE for t in prompt):
                raise ApiError(f"token ids must be in [0, {tokens.VOCAB_SIZE})", param="prompt")
            prompt_ids = list(prompt)
        req = make_request(prompt_ids, body.max_tokens, body.stop, body.stop_token_ids, body.ignore_eos, body.stream,
                           "prompt")  # fmt: skip
        created, rid, model = int(time.time()), f"cmpl-{req.rid}", body.model or config.model_name
        prefix = prompt if body.echo and isinstance(prompt, str) else ""
        if body.stream:
            include_usage = bool(body.stream_options and body.stream_options.include_usage)
            base = {"id": rid, "object": "text_completion", "created": created, "model": model}

            def text(new: str, first: bool) -> dict[str, Any]:
                return {"text": (prefix if first else "") + new}  # echo: the prompt leads the first chunk

            chunks = _openai_chunks(token_stream(req), req, base, include_usage, text)
            return StreamingResponse(chunks, media_type="text/event-stream")
        await run_to_end(req, request)
        return {
            "id": rid, "object": "text_completion", "created": created, "model": model,
            "choices": [{"index": 0, "text": prefix + req.text, "logprobs": None,
                         "finish_reason": _finish_reason(req), "matched_stop": _matched(req)}],
            "usage": _usage(req),
        }  # fmt: skip

    # -- sglang native -------------------------------------------------------------------------------------------------
    def meta_info(req: SimRequest) -> dict[str, Any]:
        end = req.finished_time or time.monotonic()
        return {"id": req.rid, "finish_reason": req.finish_reason, "prompt_tokens": req.prompt_len,
                "completion_tokens": len(req.output_ids), "cached_tokens": 0, "weight_version": "default",
                "e2e_latency": end - req.arrival}  # fmt: skip

    @app.post("/generate")
    async def generate(body: GenerateRequest, request: Request):
        if (body.text is None) == (body.input_ids is None):
            raise ApiError("Either text or input_ids should be provided (exactly one).", param="text")
        if body.input_ids is not None:
            if any(t < 0 or t >= tokens.VOCAB_SIZE for t in body.input_ids):
                raise ApiError(f"input_ids must be in [0, {tokens.VOCAB_SIZE})", param="input_ids")
            prompt_ids = list(body.input_ids)
        else:
            prompt_ids = tokens.encode(body.text or "")
        sp = body.sampling_params or SamplingParams()
        verify_sampling(sp, sp.max_new_tokens, sp.min_new_tokens)
        req = make_request(prompt_ids, sp.max_new_tokens, sp.stop, sp.stop_token_ids, sp.ignore_eos, body.stream,
                           "text")  # fmt: skip
        if body.rid:
            req.rid = body.rid
        if body.stream:

            async def gen() -> AsyncIterator[bytes]:
                async for _delta, _n, _done in token_stream(req):
                    yield _sse({"text": req.text, "output_ids": list(req.output_ids), "meta_info": meta_info(req)})
                yield b"data: [DONE]\n\n"

            return StreamingResponse(gen(), media_type="text/event-stream")
        await run_to_end(req, request)
        return {"text": req.text, "output_ids": req.output_ids, "meta_info": meta_info(req)}

    # -- info, health, metrics -----------------------------------------------------------------------------------------
    def sparsemla_info() -> dict[str, Any]:
        return {"variant": variant, "flags": flag_labels, "version": sparsemla_version,
                "calibration": calibration.summary(), "step_time_error": engine.step_error,
                "step_time_error_by_batch": engine.step_error_by_batch,
                "engine": {**engine.info, "alive": engine.alive, "steps": engine.total_steps}}  # fmt: skip

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [{"id": config.model_name, "object": "model", "created": int(time.time()),
                                            "owned_by": "sglang", "root": config.model_name,
                                            "max_model_len": context_length}]}  # fmt: skip

    @app.get("/health")
    async def health():
        return Response(status_code=200 if engine.alive else 503)

    @app.get("/health_generate")
    async def health_generate(request: Request):
        req = SimRequest(f"HEALTH_CHECK_{engine.new_rid()}", tokens.encode("health check"), 1, True)
        engine.submit(req)
        try:
            await asyncio.wait_for(_wait_finished(req), timeout=20.0)
        except asyncio.TimeoutError:
            engine.abort(req, "health check timed out")
            return Response(status_code=503)
        return Response(status_code=200)

    @app.get("/get_model_info")
    @app.get("/model_info")
    async def model_info():
        return {"model_path": config.model_name, "tokenizer_path": config.model_name, "is_generation": True,
                "preferred_sampling_params": None, "weight_version": "default", "has_image_understanding": False,
                "has_audio_understanding": False, "model_type": "deepseek_v4", "architectures":
                ["DeepseekV4ForCausalLM"], "sparsemla": sparsemla_info()}  # fmt: skip

    @app.get("/server_info")
    @app.get("/get_server_info")
    async def server_info():
        return {
            "model_path": config.model_name, "served_model_name": config.model_name, "context_length": context_length,
            "max_running_requests": config.max_running_requests, "max_total_num_tokens": config.max_total_tokens,
            "chunked_prefill_size": calibration.prefill.chunk_tokens, "tp_size": 1, "dp_size": 1,
            "enable_metrics": True, "version": f"{SGLANG_VERSION} (sparsemla simulator)",
            "internal_states": [{"num_running_reqs": engine.num_running, "num_queue_reqs": engine.num_waiting,
                                 "token_usage": engine.used_tokens / config.max_total_tokens}],
            "sparsemla": sparsemla_info(),
        }  # fmt: skip

    @app.get("/metrics")
    async def prometheus_metrics():
        return Response(metrics.exposition(), media_type="text/plain; version=0.0.4; charset=utf-8")

    @app.api_route("/flush_cache", methods=["GET", "POST"])
    async def flush_cache():
        if engine.busy:
            return PlainTextResponse("Cache not flushed: there are running or waiting requests.\n", status_code=400)
        return PlainTextResponse("Cache flushed.\nPlease check backend logs for more details. (When there are "
                                 "running or waiting requests, the operation will not be performed.)\n")  # fmt: skip

    # -- profiling -----------------------------------------------------------------------------------------------------
    @app.api_route("/start_profile", methods=["GET", "POST"])
    async def start_profile(obj: ProfileRequest | None = Body(default=None)):
        obj = obj or ProfileRequest()
        try:
            profiler.start(obj.output_dir, obj.num_steps, obj.start_step, obj.profile_by_stage, obj.profile_id,
                           obj.profile_prefix, obj.profile_stages)  # fmt: skip
        except ProfileError as exc:
            raise ApiError(str(exc)) from None
        return PlainTextResponse("Start profiling.\n")

    async def finish_writes() -> None:
        for task in list(pending_writes):
            await task
        pending_writes.clear()

    def write_failures() -> ApiError | None:
        errors = profiler.take_errors()
        return ApiError("Stop profiling: " + "; ".join(errors), 500, "InternalServerError") if errors else None

    @app.api_route("/stop_profile", methods=["GET", "POST"])
    async def stop_profile():
        try:
            sess = profiler.stop()
        except ProfileError as exc:
            await finish_writes()  # a session that stopped by itself (num_steps) may have failed to write
            raise write_failures() or ApiError(str(exc)) from None
        await finish_writes()
        for stage in sess.stages.values():
            if not stage.done:
                await asyncio.to_thread(write_stage, profiler, sess, stage)
        failed = write_failures()
        if failed is not None:
            raise failed
        return PlainTextResponse("Stop profiling. This will take some time.\n")

    return app


async def _abort_on_disconnect(receive: Receive, engine: EngineClient, req: SimRequest) -> None:
    """Abort ``req`` in the engine when the client disconnects (its body has been read: the next ASGI message is
    ``http.disconnect``, when the connection closes)."""
    try:
        while (await receive())["type"] != "http.disconnect":
            pass
    except Exception as exc:  # the server's receive channel failed: leave the request to finish or time out
        log.warning("sim: disconnect watcher of %s stopped: %r", req.rid, exc)
        return
    engine.abort(req)


async def _wait_finished(req: SimRequest) -> None:
    while not req.finished:
        await req.wakeup.wait()
        req.wakeup.clear()
