"""The simulator's error answers, in sglang's ``ErrorResponse`` shape: ``{"object": "error", "message", "type",
"param", "code"}``.

Bad input never reaches a 5xx: schema errors, malformed JSON (``RequestValidationError``) and bodies the JSON parser
cannot read at all (invalid UTF-8, nesting deeper than the parser's recursion limit: FastAPI's ``HTTPException(400)``)
are all answered 400 in that shape. 404 and 405 keep Starlette's ``{"detail": ...}``, as sglang's do. An unexpected
exception is answered 500 in the same shape (``InternalServerError``), as sglang's OpenAI routes do.
"""

from __future__ import annotations

import logging

from fastapi import FastAPI, Request
from fastapi.exception_handlers import http_exception_handler
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException

from sparsemla.ops.sim.engine_proc import EngineError

log = logging.getLogger("sparsemla.sim")
MAX_MESSAGE_CHARS = 500


class ApiError(Exception):
    """Raised inside handlers for a 4xx (or a 5xx that is not the client's fault) with sglang's error body."""

    def __init__(self, message: str, code: int = 400, err_type: str = "BadRequestError", param: str | None = None):
        super().__init__(message)
        self.message, self.code, self.err_type, self.param = message, code, err_type, param


def error_response(message: str, code: int = 400, err_type: str = "BadRequestError", param: str | None = None):
    """sglang's ``ErrorResponse`` as a JSON response with status ``code``."""
    if len(message) > MAX_MESSAGE_CHARS:
        message = message[:MAX_MESSAGE_CHARS] + "..."
    return JSONResponse(
        {"object": "error", "message": message, "type": err_type, "param": param, "code": code}, status_code=code
    )


def validation_message(exc: RequestValidationError) -> str:
    """A short ``loc: msg; ...`` summary of the first few validation errors (the input values are left out)."""
    parts = []
    for err in exc.errors()[:5]:
        loc = ".".join(str(x) for x in err.get("loc", ()) if x != "body")
        if err.get("type") == "json_invalid":
            loc = f"body (character {loc})"
        parts.append(f"{loc or 'body'}: {err.get('msg', 'invalid')}")
    return "; ".join(parts) or "invalid request"


def install_error_handlers(app: FastAPI) -> None:
    """Answer every error in sglang's shape (see the module docstring)."""

    @app.exception_handler(RequestValidationError)
    async def _validation(_: Request, exc: RequestValidationError) -> JSONResponse:
        return error_response(validation_message(exc), err_type="Bad Request")

    @app.exception_handler(HTTPException)
    async def _http(request: Request, exc: HTTPException) -> Response:
        if exc.status_code in (404, 405):  # routing errors: Starlette's shape, as in sglang
            return await http_exception_handler(request, exc)
        return error_response(str(exc.detail), exc.status_code, str(exc.status_code))

    @app.exception_handler(EngineError)
    async def _engine_error(_: Request, exc: EngineError) -> JSONResponse:
        return error_response(str(exc), 503, "ServiceUnavailable")

    @app.exception_handler(ApiError)
    async def _api_error(_: Request, exc: ApiError) -> JSONResponse:
        return error_response(exc.message, exc.code, exc.err_type, exc.param)

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, exc: Exception) -> JSONResponse:
        log.error("sim: %s %s failed: %r", request.method, request.url.path, exc)
        return error_response(f"Internal server error: {type(exc).__name__}", 500, "InternalServerError")
