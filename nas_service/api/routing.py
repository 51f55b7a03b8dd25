"""How every request is read before its route sees it.

- `BodyLimit`: a pure ASGI middleware that counts the bytes of the request body as they are
  received and answers 413 as soon as they pass `max_request_bytes`, with or without a
  Content-Length (a chunked body is not read past the limit); a declared Content-Length over
  the limit is refused before anything is read.
- `RequestTimer`: a pure ASGI middleware that times every request, from its arrival to the
  last byte of its answer, into the app's Prometheus histogram
  `depthscope_http_request_duration_seconds{route, method, status}` (the route template,
  never the raw path, so label values stay few).
- `ApiRoute`: every API route. A route that needs the bearer token checks it before the body
  is read or parsed (a wrong token is a 401, whatever the body), and request bodies are
  parsed as strict JSON: no `NaN`/`Infinity` literals (Python's parser takes them), no float
  that overflows, no integer beyond 64 bits, no string with a NUL character or an unpaired
  surrogate (the databases cannot store them); each is a 422 naming the field (`body` when
  the JSON itself is malformed).
"""

from __future__ import annotations

import functools
import inspect
import json
import math
import time
from collections.abc import Callable, Coroutine
from typing import Any

from fastapi import Depends, Request, Response
from fastapi.routing import APIRoute
from sqlalchemy.orm import Session
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from nas_service.api.deps import check_token, require_token
from nas_service.api.errors import error_body
from nas_service.store import wrote

#: The dependencies of every router but health's: the bearer token (see `ApiRoute`).
SECURED = [Depends(require_token)]

#: Integers a request may hold: the signed 64-bit range (what the databases store, and what
#: JSON numbers carry between implementations, RFC 8259 §6).
INT_MIN, INT_MAX = -(1 << 63), (1 << 63) - 1
#: Digits of an integer worth converting at all (longer ones are out of range, unread).
_MAX_INT_DIGITS = 40


class BodyRefused(StarletteHTTPException):
    """A refused request body, raised while it is read (FastAPI passes HTTP exceptions on);
    rendered by the `HTTPException` handler with its `field`."""

    def __init__(self, status: int, message: str, field: str) -> None:
        super().__init__(status, message)
        self.field = field


class BodyTooLarge(BodyRefused):
    def __init__(self, limit: int) -> None:
        super().__init__(413, f"request body over {limit} bytes", "body")


#: Bucket bounds of the request-latency histogram, in seconds.
LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


class RequestTimer:
    def __init__(self, app: ASGIApp, histogram: Any) -> None:
        self.app, self.histogram = app, histogram

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        start = time.perf_counter()
        status = 500

        async def timed_send(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = int(message["status"])
            await send(message)

        try:
            await self.app(scope, receive, timed_send)
        finally:
            route = scope.get("route")
            template = getattr(route, "path", None) or "unmatched"
            self.histogram.labels(template, scope.get("method", ""), str(status)).observe(
                time.perf_counter() - start
            )


class BodyLimit:
    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app, self.max_bytes = app, max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        for name, value in scope.get("headers", ()):
            if name == b"content-length" and value.isdigit() and int(value) > self.max_bytes:
                await self._refuse(send)
                return
        received = 0
        started = False

        async def counted_receive() -> Message:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.max_bytes:
                    raise BodyTooLarge(self.max_bytes)
            return message

        async def tracked_send(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            await self.app(scope, counted_receive, tracked_send)
        except BodyTooLarge:
            if started:
                raise
            await self._refuse(send)

    async def _refuse(self, send: Send) -> None:
        body = json.dumps(
            error_body(413, f"request body over {self.max_bytes} bytes", "body")
        ).encode()
        await send(
            {
                "type": "http.response.start",
                "status": 413,
                "headers": [
                    (b"content-type", b"application/json"),
                    (b"content-length", str(len(body)).encode()),
                    (b"connection", b"close"),
                ],
            }
        )
        await send({"type": "http.response.body", "body": body})


class _OutOfRange(float):
    """An integer literal too long to convert: out of range, reported with its field."""


def _int(text: str) -> int | float:
    if len(text.lstrip("-")) > _MAX_INT_DIGITS:
        return _OutOfRange("inf")
    return int(text)


def strict_json(body: bytes) -> Any:
    """The body as JSON (RFC 8259): not UTF-8, or not JSON, is a `JSONDecodeError` (the
    field `body`); then `check_values` refuses what no field may hold, naming the field."""
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise json.JSONDecodeError("not UTF-8", "", exc.start) from None
    try:
        return json.loads(text, parse_int=_int)  # NaN/Infinity literals: refused below
    except json.JSONDecodeError:
        raise
    except (ValueError, RecursionError) as exc:
        raise json.JSONDecodeError(str(exc), text, 0) from None


def _bad_text(value: str) -> str | None:
    if "\x00" in value:
        return "must not contain a NUL character"
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return "must not contain an unpaired surrogate"
    return None


def _bad_number(value: Any) -> str | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, _OutOfRange) or (
        isinstance(value, int) and not INT_MIN <= value <= INT_MAX
    ):
        return "integer out of range (64-bit signed)"
    if isinstance(value, float) and not math.isfinite(value):
        return "must be a finite number (NaN, Infinity and overflowing numbers are not JSON)"
    return None


def _where(loc: tuple[Any, ...]) -> str:
    return ".".join(str(p) for p in loc) or "body"


def check_values(value: Any) -> None:
    """Refuse, naming where it is, a number no field can hold (NaN, ±Infinity, a float that
    overflows, an integer beyond 64 bits) and a string or key no database can store (a NUL
    character, an unpaired surrogate)."""
    stack: list[tuple[Any, tuple[Any, ...]]] = [(value, ())]
    while stack:
        node, where = stack.pop()
        if isinstance(node, str):
            reason = _bad_text(node)
            if reason:
                raise BodyRefused(422, f"text {reason}", _where(where))
        elif isinstance(node, dict):
            for key, item in node.items():
                reason = _bad_text(key)
                if reason:
                    raise BodyRefused(422, f"a key {reason}", _where(where))
                stack.append((item, (*where, key)))
        elif isinstance(node, list):
            stack.extend((item, (*where, i)) for i, item in enumerate(node))
        else:
            reason = _bad_number(node)
            if reason:
                raise BodyRefused(422, reason, _where(where))


#: Where the parsed body is kept in the request's scope (for a strict re-validation).
BODY_KEY = "depthscope.body"
_EXACT = float(1 << 53)


def integral_numbers(value: Any) -> Any:
    """JSON has one number type: `4.0` is the integer 4 (as JSON Schema has it), so a strict
    integer field takes it, and a float field takes the int back as a float."""
    if isinstance(value, float) and value.is_integer() and abs(value) <= _EXACT:
        return int(value)
    if isinstance(value, dict):
        return {k: integral_numbers(v) for k, v in value.items()}
    if isinstance(value, list):
        return [integral_numbers(v) for v in value]
    return value


class StrictJSONRequest(Request):
    async def json(self) -> Any:
        if not hasattr(self, "_json"):
            data = strict_json(await self.body())
            check_values(data)
            self._json = integral_numbers(data)
            self.scope[BODY_KEY] = self._json
        return self._json


def ending_transactions(endpoint: Callable[..., Any]) -> Callable[..., Any]:
    """A synchronous endpoint that ends the request's session (`deps.SessionDep`) in its
    own thread as soon as it returns: committed if it wrote, then closed. The transaction,
    with any lock it holds (the submission lock), ends at once, not when the event loop
    next reaches the dependency's end (which rolls back on error); and no round trip to
    the database (a close's rollback) runs in the event loop."""
    if inspect.iscoroutinefunction(endpoint):
        return endpoint

    @functools.wraps(endpoint)
    def run(*args: Any, **kwargs: Any) -> Any:
        result = endpoint(*args, **kwargs)
        for value in kwargs.values():
            if isinstance(value, Session):
                if wrote(value):
                    value.commit()
                value.close()  # its connection back to the pool from here, not the event loop
        return result

    return run


class ApiRoute(APIRoute):
    """Give secured routers `dependencies=SECURED`: their routes then check the token first
    (a router's dependencies given at `include_router` are not seen by its routes). A
    synchronous route ends its request's transaction in its own thread
    (`ending_transactions`)."""

    def __init__(self, path: str, endpoint: Callable[..., Any], **kwargs: Any) -> None:
        super().__init__(path, ending_transactions(endpoint), **kwargs)

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()
        secured = any(d.dependency is require_token for d in self.dependencies)

        async def route(request: Request) -> Response:
            if secured:
                check_token(request)
            return await handler(StrictJSONRequest(request.scope, request.receive))

        return route
