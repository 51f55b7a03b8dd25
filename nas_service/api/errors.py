"""One JSON shape for every error: {"error": {"status", "field", "message", "errors"}}."""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from cost_model import CostInputError
from nas_service.jobs import JobNotFound, JobStateError
from nas_service.spec import SpecError


class ApiError(Exception):
    """A domain error with its status code; one handler renders it."""

    def __init__(self, status: int, message: str, field: str | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.field = status, message, field


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


def install(app: FastAPI) -> None:
    @app.exception_handler(ApiError)
    async def _api(_: Request, exc: ApiError) -> JSONResponse:
        return JSONResponse(error_body(exc.status, exc.message, exc.field), status_code=exc.status)

    @app.exception_handler(SpecError)
    async def _spec(_: Request, exc: SpecError) -> JSONResponse:
        errors = [{"field": f, "message": m} for f, m in exc.errors]
        message = "; ".join(f"{f}: {m}" for f, m in exc.errors)
        return JSONResponse(error_body(422, message, exc.field, errors), status_code=422)

    @app.exception_handler(CostInputError)
    async def _cost(_: Request, exc: CostInputError) -> JSONResponse:
        return JSONResponse(error_body(422, str(exc), exc.field), status_code=422)

    @app.exception_handler(JobNotFound)
    async def _missing(_: Request, exc: JobNotFound) -> JSONResponse:
        return JSONResponse(error_body(404, f"no job {exc.args[0]!r}", "job_id"), status_code=404)

    @app.exception_handler(JobStateError)
    async def _state(_: Request, exc: JobStateError) -> JSONResponse:
        return JSONResponse(error_body(409, str(exc), "status"), status_code=409)

    @app.exception_handler(RequestValidationError)
    async def _validation(_: Request, exc: RequestValidationError) -> JSONResponse:
        errors = []
        for err in exc.errors():
            loc = [str(p) for p in err.get("loc", ()) if p not in ("body", "query", "path")]
            errors.append({"field": ".".join(loc) or "request", "message": str(err.get("msg"))})
        first = errors[0] if errors else {"field": "request", "message": "invalid request"}
        message = "; ".join(f"{e['field']}: {e['message']}" for e in errors)
        return JSONResponse(error_body(422, message, first["field"], errors), status_code=422)

    @app.exception_handler(StarletteHTTPException)
    async def _http(_: Request, exc: StarletteHTTPException) -> JSONResponse:
        return JSONResponse(
            error_body(exc.status_code, str(exc.detail)),
            status_code=exc.status_code,
            headers=exc.headers,
        )
