"""Request bodies and server-sent-event parsing for the three streaming APIs the LLM user speaks.

Pure functions and one small state machine (:class:`TokenStream`), free of Locust and gevent so they are unit-tested
directly. Times are ``time.perf_counter()`` seconds supplied by the caller.

APIs:
- ``chat``: OpenAI ``POST /v1/chat/completions`` (``choices[0].delta.content``; usage in the last chunk when
  ``stream_options.include_usage`` is set).
- ``completions``: OpenAI ``POST /v1/completions`` (``choices[0].text``).
- ``generate``: sglang native ``POST /generate`` (each event carries the *cumulative* ``text`` and
  ``meta_info.completion_tokens``).
All three end with ``data: [DONE]``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from sparsemla.loadtest.workload import RequestSpec

APIS = ("chat", "completions", "generate")
PATHS = {"chat": "/v1/chat/completions", "completions": "/v1/completions", "generate": "/generate"}

# Failure kinds; identical to the `outcome` label values of sparsemla_loadgen_requests_total.
OUTCOME_OK = "ok"
FAILURE_KINDS = ("connection", "http_error", "timeout", "sse")


class StreamFailure(Exception):
    """A request that failed; ``kind`` is one of FAILURE_KINDS and the message says what happened."""

    kind = "connection"

    def __str__(self) -> str:
        return f"[{self.kind}] {super().__str__()}"

    def __repr__(self) -> str:  # Locust's failure table shows repr(): keep the kind prefix readable there
        return str(self)


class ConnectionFailure(StreamFailure):
    kind = "connection"


class HttpFailure(StreamFailure):
    kind = "http_error"


class TimeoutFailure(StreamFailure):
    kind = "timeout"


class SSEFailure(StreamFailure):
    kind = "sse"


def build_request(
    api: str, spec: RequestSpec, *, model: str, ignore_eos: bool, temperature: float = 0.0
) -> tuple[str, dict[str, Any]]:
    """The (path, JSON body) of one streaming request for ``api``."""
    openai: dict[str, Any] = {  # the OpenAI-compatible fields both chat and completions take
        "model": model,
        "max_tokens": spec.max_tokens,
        "temperature": temperature,
        "stream": True,
        "stream_options": {"include_usage": True},
        "ignore_eos": ignore_eos,
    }
    if api == "chat":
        body = {**openai, "messages": [{"role": "user", "content": spec.prompt}]}
    elif api == "completions":
        body = {**openai, "prompt": spec.prompt}
    elif api == "generate":
        body = {
            "text": spec.prompt,
            "sampling_params": {
                "max_new_tokens": spec.max_tokens,
                "temperature": temperature,
                "ignore_eos": ignore_eos,
            },
            "stream": True,
        }
    else:
        raise ValueError(f"unknown api {api!r}; expected one of {', '.join(APIS)}")
    return PATHS[api], body


@dataclass
class TokenStream:
    """Token timing of one streamed response, fed line by line.

    ``chunk_times[i]`` is when the i-th chunk carrying output arrived and ``chunk_tokens[i]`` how many tokens it carried
    (1 unless the server says more). ``usage_completion_tokens`` is the server's own count when it sent one."""

    api: str
    start: float
    chunk_times: list[float] = field(default_factory=list)
    chunk_tokens: list[int] = field(default_factory=list)
    usage_completion_tokens: int | None = None
    usage_prompt_tokens: int | None = None
    finish_reason: str | None = None
    done: bool = False
    _generate_tokens: int = 0
    _generate_text_len: int = 0

    def feed(self, raw: bytes | str, now: float) -> None:
        """Consume one line of the SSE body (with or without its newline). Raises SSEFailure / HttpFailure."""
        line = raw.decode("utf-8", errors="replace") if isinstance(raw, bytes) else raw
        line = line.rstrip("\r\n")
        if not line or line.startswith(":"):
            return  # event separator or comment (keep-alive)
        field_name, sep, value = line.partition(":")
        if not sep:
            raise SSEFailure(f"line without a field name: {line[:80]!r}")
        if field_name in ("event", "id", "retry"):
            return
        if field_name != "data":
            raise SSEFailure(f"unknown SSE field {field_name!r} in {line[:80]!r}")
        value = value[1:] if value.startswith(" ") else value
        if self.done:
            raise SSEFailure(f"data after [DONE]: {value[:80]!r}")
        if value.strip() == "[DONE]":
            self.done = True
            return
        try:
            event = json.loads(value)
        except json.JSONDecodeError:
            raise SSEFailure(f"data is not JSON: {value[:80]!r}") from None
        if not isinstance(event, dict):
            raise SSEFailure(f"data is not a JSON object: {value[:80]!r}")
        if "error" in event and event["error"]:
            err = event["error"]
            message = err.get("message", err) if isinstance(err, dict) else err
            raise HttpFailure(f"server error in stream: {str(message)[:200]}")
        tokens = self._generate_event(event) if self.api == "generate" else self._openai_event(event)
        if tokens > 0:
            self.chunk_times.append(now)
            self.chunk_tokens.append(tokens)

    def _openai_event(self, event: dict[str, Any]) -> int:
        usage = event.get("usage")
        if isinstance(usage, dict):
            if isinstance(usage.get("completion_tokens"), int):
                self.usage_completion_tokens = usage["completion_tokens"]
            if isinstance(usage.get("prompt_tokens"), int):
                self.usage_prompt_tokens = usage["prompt_tokens"]
        choices = event.get("choices")
        if choices is None:
            if usage is None:
                raise SSEFailure("event has neither choices nor usage")
            return 0
        if not isinstance(choices, list):
            raise SSEFailure("choices is not a list")
        if not choices:
            return 0
        choice = choices[0]
        if not isinstance(choice, dict):
            raise SSEFailure("choice is not an object")
        if choice.get("finish_reason"):
            self.finish_reason = str(choice["finish_reason"])
        if self.api == "chat":
            delta = choice.get("delta")
            if not isinstance(delta, dict):
                raise SSEFailure("chat chunk without a delta object")
            text = (delta.get("content") or "") + (delta.get("reasoning_content") or "")
        else:
            text = choice.get("text")
            if text is not None and not isinstance(text, str):
                raise SSEFailure("completion chunk text is not a string")
            text = text or ""
        return 1 if text else 0

    def _generate_event(self, event: dict[str, Any]) -> int:
        text = event.get("text")
        if not isinstance(text, str):
            raise SSEFailure("generate event without a text string")
        meta = event.get("meta_info") or {}
        if not isinstance(meta, dict):
            raise SSEFailure("meta_info is not an object")
        finish = meta.get("finish_reason")
        if isinstance(finish, dict) and finish.get("type"):
            self.finish_reason = str(finish["type"])
        if isinstance(meta.get("prompt_tokens"), int):
            self.usage_prompt_tokens = meta["prompt_tokens"]
        completion = meta.get("completion_tokens")
        grew = len(text) > self._generate_text_len
        self._generate_text_len = max(self._generate_text_len, len(text))
        if isinstance(completion, int):
            self.usage_completion_tokens = completion
            new = completion - self._generate_tokens
            self._generate_tokens = max(self._generate_tokens, completion)
            return max(new, 0)
        return 1 if grew else 0

    # -- results ------------------------------------------------------------------------------------------------------
    @property
    def output_tokens(self) -> int:
        """Tokens generated: the server's usage count when present, else the chunks' tokens."""
        if self.usage_completion_tokens is not None:
            return self.usage_completion_tokens
        return sum(self.chunk_tokens)

    @property
    def ttft(self) -> float | None:
        """Seconds from sending the request to the first output chunk (None before any output)."""
        return self.chunk_times[0] - self.start if self.chunk_times else None

    def itls(self) -> list[float]:
        """Every gap (seconds) between consecutive output chunks."""
        t = self.chunk_times
        return [t[i] - t[i - 1] for i in range(1, len(t))]
