"""One JSON shape for every error: {"error": {"status", "field", "message", "errors"}}.

Every refusal is rendered here: domain errors (`ApiError`, `SpecError`, …), validation
errors (the field without the `body.`/`query.` prefix; a body that is not JSON is the field
`body`), a database that cannot be reached (503 with `Retry-After`), and, as a last resort,
any unexpected exception (500, still this shape: never plain text, never a traceback)."""

from __future__ import annotations

import logging
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel
from sqlalchemy import exc as sa_exc
from starlette.exceptions import HTTPException as StarletteHTTPException

from cost_model import CostInputError
from nas_service.jobs import JobLimitError, JobStateError
from nas_service.results.queries import NothingYet
from nas_service.runner.failures import is_database_outage
from nas_service.spec import SpecError
from nas_service.store.jobs import JobNotFound

log = logging.getLogger(__name__)

#: Seconds a client is asked to wait after a 503 (database unreachable) or a 429.
RETRY_AFTER_S = 5
#: Location parts that are not fields: where the value was, and the tags of `IntAxis`'s
#: discriminated union (`space.n_layers.range` is reported as `space.n_layers`, as
#: `parse_spec` reports it).
_NOT_FIELDS = ("range", "choices")


class ApiError(Exception):
    """A domain error with its status code; one handler renders it."""

    def __init__(self, status: int, message: str, field: str | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.field = status, message, field


class FieldError(BaseModel):
    field: str | None
    message: str


class ErrorDetail(BaseModel):
    status: int
    field: str | None
    message: str
    errors: list[FieldError]


class ErrorBody(BaseModel):
    """Every error response: the status, the first offending field, a message, and every
    (field, message) found."""

    error: ErrorDetail


_DESCRIPTIONS = {
    400: "Bad request",
    401: "A valid bearer token is required",
    404: "No such job",
    409: "Conflicts with the job's state",
    413: "Request body too large",
    422: "Invalid input (the field is named)",
    429: "Too many active jobs",
    500: "Internal error",
    503: "The database is unreachable (retry after Retry-After seconds)",
}


def responses(*codes: int) -> dict[int | str, dict[str, Any]]:
    """OpenAPI `responses` for these error codes, each with the one `ErrorBody` schema."""
    return {code: {"model": ErrorBody, "description": _DESCRIPTIONS[code]} for code in codes}


def error_body(
    status: int, message: str, field: str | None = None, errors: list[dict[str, str]] | None = None
) -> dict[str, Any]:
    return {
        "error": {
            "status": status,
            "field": field,
            "message": message,
            "errors": errors or ([{"field": field, "message": message}] if field else []),
        }
    }


def error_response(
    status: int, message: str, field: str | None = None, headers: dict[str, str] | None = None
) -> JSONResponse:
    return JSONResponse(error_body(status, message, field), status_code=status, headers=headers)


def _field(loc: Any) -> str:
    parts = list(loc or ())
    if parts and parts[0] in ("body", "query", "path", "header", "cookie"):
        parts = parts[1:]
    return ".".join(str(p) for p in parts if p not in _NOT_FIELDS)


def _validation_errors(exc: RequestValidationError) -> list[dict[str, str]]:
    out = []
    for err in exc.errors():
        if err.get("type") == "json_invalid":  # the location is a character offset
            reason = (err.get("ctx") or {}).get("error") or err.get("msg")
            out.append({"field": "body", "message": f"not valid JSON: {reason}"})
            continue
        message = str(err.get("msg")).removeprefix("Value error, ")
        out.append({"field": _field(err.get("loc")) or "request", "message": message})
    return out


def allowed_methods(app: FastAPI, path: str) -> list[str]:
    """The methods of every route of `app` whose path matches (Starlette's 405 names only
    the first route's)."""
    methods: set[str] = set()
    for route in getattr(app.state, "routes", ()):
        if route.path_regex.match(path):
            methods |= set(route.methods or ())
    return sorted(methods)


def install(app: FastAPI) -> None:
    @app.exception_handler(ApiError)
    async def _api(_: Request, exc: ApiError) -> JSONResponse:
        return error_response(exc.status, exc.message, exc.field)

    @app.exception_handler(SpecError)
    async def _spec(_: Request, exc: SpecError) -> JSONResponse:
        errors = [{"field": f, "message": m} for f, m in exc.errors]
        message = "; ".join(f"{f}: {m}" for f, m in exc.errors)
        return JSONResponse(error_body(422, message, exc.field, errors), status_code=422)

    @app.exception_handler(CostInputError)
    async def _cost(_: Request, exc: CostInputError) -> JSONResponse:
        return error_response(422, str(exc), exc.field)

    @app.exception_handler(JobNotFound)
    async def _missing(_: Request, exc: JobNotFound) -> JSONResponse:
        return error_response(404, f"no job {exc.args[0]!r}", "job_id")

    @app.exception_handler(JobStateError)
    async def _state(_: Request, exc: JobStateError) -> JSONResponse:
        return error_response(409, str(exc), "status")

    @app.exception_handler(NothingYet)
    async def _nothing_yet(_: Request, exc: NothingYet) -> JSONResponse:
        return error_response(409, exc.message, exc.field)

    @app.exception_handler(JobLimitError)
    async def _limit(_: Request, exc: JobLimitError) -> JSONResponse:
        return error_response(429, str(exc), "jobs", {"Retry-After": str(RETRY_AFTER_S)})

    @app.exception_handler(RequestValidationError)
    async def _validation(_: Request, exc: RequestValidationError) -> JSONResponse:
        errors = _validation_errors(exc)
        first = errors[0] if errors else {"field": "request", "message": "invalid request"}
        message = "; ".join(f"{e['field']}: {e['message']}" for e in errors)
        return JSONResponse(error_body(422, message, first["field"], errors), status_code=422)

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        field = getattr(exc, "field", None)
        headers = dict(exc.headers or {})
        if exc.status_code == 405:  # every method of the path, not only the first route's
            headers["Allow"] = ", ".join(allowed_methods(request.app, request.url.path))
        return JSONResponse(
            error_body(exc.status_code, str(exc.detail), field),
            status_code=exc.status_code,
            headers=headers or None,
        )

    @app.exception_handler(sa_exc.SQLAlchemyError)
    async def _database(request: Request, exc: sa_exc.SQLAlchemyError) -> JSONResponse:
        if is_database_outage(exc):
            log.warning("database unreachable on %s %s: %s", request.method, request.url.path, exc)
            return error_response(
                503,
                f"the database is unreachable ({type(exc).__name__}); retry later",
                "database",
                {"Retry-After": str(RETRY_AFTER_S)},
            )
        return _internal(request, exc)

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, exc: Exception) -> JSONResponse:
        return _internal(request, exc)


def _internal(request: Request, exc: BaseException) -> JSONResponse:
    """The last resort: a bug. Logged with its traceback; the client sees only the shape."""
    log.error("unexpected error on %s %s", request.method, request.url.path, exc_info=exc)
    return error_response(500, f"internal error ({type(exc).__name__})")
