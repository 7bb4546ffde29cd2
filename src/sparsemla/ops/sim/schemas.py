"""Request bodies of the simulator (the fields it honours; unknown OpenAI/sglang fields are accepted and ignored)
and the checks sglang makes on them beyond their types.

- Every string in a request body (fields, unknown fields, keys) must be valid Unicode: a lone surrogate such as
  ``"\\ud800"`` cannot be tokenized or echoed back as UTF-8, so it is a 400, not a 500.
- :func:`verify_sampling` applies the ranges of sglang's ``SamplingParams.verify()``: temperature finite and >= 0,
  top_p in (0, 1], min_p in [0, 1], top_k -1 or >= 1, frequency/presence penalty in [-2, 2], repetition penalty in
  (0, 2], min tokens in [0, max tokens]. NaN and infinities fail them (JSON ``NaN``/``Infinity`` parse as floats).
"""

from __future__ import annotations

import math
import re
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt, model_validator

from sparsemla.ops.sim.errors import ApiError

StopField = str | list[str] | None
_SURROGATE = re.compile("[\ud800-\udfff]")


def find_surrogate(value: Any) -> str | None:
    """The JSON path of the first string (value or key) in ``value`` that holds a lone surrogate, else None.
    Iterative, so any nesting depth the JSON parser accepted is fine."""
    stack: list[tuple[str, Any]] = [("", value)]
    while stack:
        path, item = stack.pop()
        if isinstance(item, str):
            if _SURROGATE.search(item):
                return path or "body"
        elif isinstance(item, dict):
            for key, sub in item.items():
                if isinstance(key, str) and _SURROGATE.search(key):
                    return f"{path}.<key>" if path else "<key>"
                stack.append((f"{path}.{key}" if path else str(key), sub))
        elif isinstance(item, list):
            stack.extend((f"{path}[{i}]", sub) for i, sub in enumerate(item))
    return None


class _Lenient(BaseModel):
    model_config = ConfigDict(extra="allow")


class _Body(_Lenient):
    """A whole request body: rejects lone surrogates anywhere in it."""

    @model_validator(mode="before")
    @classmethod
    def _valid_unicode(cls, data: Any) -> Any:
        where = find_surrogate(data)
        if where is not None:
            raise ValueError(f"{where} is not valid Unicode (it holds a lone UTF-16 surrogate)")
        return data


class ContentPart(_Lenient):
    type: str
    text: str | None = None


class ChatMessage(_Lenient):
    role: Literal["system", "user", "assistant", "tool", "developer"]
    content: str | list[ContentPart] | None = None


class StreamOptions(_Lenient):
    include_usage: StrictBool = False


class _Sampling(_Body):
    """The sampling fields sglang verifies (shared by the OpenAI bodies and /generate's ``sampling_params``)."""

    stop: StopField = None
    stop_token_ids: list[StrictInt] | None = None
    ignore_eos: StrictBool = False
    temperature: float | None = None
    top_p: float | None = None
    top_k: StrictInt | None = None
    min_p: float | None = None
    frequency_penalty: float | None = None
    presence_penalty: float | None = None
    repetition_penalty: float | None = None


class ChatCompletionRequest(_Sampling):
    model: str | None = None
    messages: list[ChatMessage] = Field(min_length=1)
    max_tokens: StrictInt | None = None
    max_completion_tokens: StrictInt | None = None
    min_tokens: StrictInt | None = None
    stream: StrictBool = False
    stream_options: StreamOptions | None = None
    n: StrictInt = 1
    seed: StrictInt | None = None


class CompletionRequest(_Sampling):
    model: str | None = None
    prompt: str | list[str] | list[StrictInt]
    max_tokens: StrictInt | None = None
    min_tokens: StrictInt | None = None
    stream: StrictBool = False
    stream_options: StreamOptions | None = None
    n: StrictInt = 1
    echo: StrictBool = False
    seed: StrictInt | None = None


class SamplingParams(_Sampling):
    max_new_tokens: StrictInt | None = None
    min_new_tokens: StrictInt | None = None


class GenerateRequest(_Body):
    text: str | None = None
    input_ids: list[StrictInt] | None = None
    sampling_params: SamplingParams | None = None
    stream: StrictBool = False
    rid: str | None = None


class ProfileRequest(_Body):
    """sglang's ``ProfileReq`` fields (``managers/io_struct.py``)."""

    output_dir: str | None = None
    start_step: StrictInt | None = None
    num_steps: StrictInt | None = None
    activities: list[str] | None = None
    profile_by_stage: StrictBool = False
    with_stack: StrictBool | None = None
    record_shapes: StrictBool | None = None
    profile_id: str | None = None
    merge_profiles: StrictBool = False
    profile_prefix: str | None = None
    profile_stages: list[str] | None = None
    detailed_annotations: StrictBool = False


def _check(ok: bool, param: str, message: str) -> None:
    if not ok:
        raise ApiError(message, err_type="BadRequest", param=param)


def verify_sampling(sp: _Sampling, max_tokens: int | None, min_tokens: int | None) -> None:
    """sglang's ``SamplingParams.verify()`` ranges for the fields that are set (unset ones take sglang's defaults,
    which pass). Raises :class:`ApiError` (400) naming the first bad field."""
    t = sp.temperature
    _check(t is None or (math.isfinite(t) and t >= 0.0), "temperature",
           f"temperature must be a non-negative finite number, got {t}.")  # fmt: skip
    _check(sp.top_p is None or 0.0 < sp.top_p <= 1.0, "top_p", f"top_p must be in (0, 1], got {sp.top_p}.")
    _check(sp.min_p is None or 0.0 <= sp.min_p <= 1.0, "min_p", f"min_p must be in [0, 1], got {sp.min_p}.")
    _check(sp.top_k is None or sp.top_k == -1 or sp.top_k >= 1, "top_k",
           f"top_k must be -1 (disable) or at least 1, got {sp.top_k}.")  # fmt: skip
    for name in ("frequency_penalty", "presence_penalty"):
        value = getattr(sp, name)
        _check(value is None or -2.0 <= value <= 2.0, name, f"{name} must be in [-2, 2], got {value}.")
    rp = sp.repetition_penalty
    _check(rp is None or 0.0 < rp <= 2.0, "repetition_penalty",
           f"repetition_penalty must be in (0, 2] (1.0 = no penalty), got {rp}.")  # fmt: skip
    if min_tokens is not None:
        upper = max_tokens if max_tokens is not None and max_tokens >= 0 else None
        _check(min_tokens >= 0 and (upper is None or min_tokens <= upper), "min_tokens",
               f"min_new_tokens must be in [0, max_new_tokens{f'({upper})' if upper is not None else ''}], "
               f"got {min_tokens}.")  # fmt: skip
