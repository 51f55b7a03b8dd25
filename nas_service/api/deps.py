"""Typed dependencies: settings, database sessions, the results cache, authentication."""

from __future__ import annotations

import hmac
from collections.abc import AsyncIterator
from typing import Annotated

import anyio
from anyio.to_thread import run_sync
from fastapi import Depends, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from sqlalchemy.orm import Session, sessionmaker

from nas_service.api.errors import ApiError
from nas_service.results.cache import ResultsCache
from nas_service.settings import Settings
from nas_service.store import roll_back, wrote

#: The OpenAPI security scheme; the check itself is `check_token` (our JSON 401).
bearer = HTTPBearer(
    auto_error=False,
    description="The service's API token (`DEPTHSCOPE_API_TOKEN`), when one is configured.",
)


def get_app_settings(request: Request) -> Settings:
    settings: Settings = request.app.state.settings
    return settings


def get_session_factory(request: Request) -> sessionmaker[Session]:
    factory: sessionmaker[Session] = request.app.state.sessions
    return factory


async def get_session(request: Request) -> AsyncIterator[Session]:
    """One session per request, one transaction: committed when the route returns (before
    the response is sent, so a failed commit is the response), rolled back when it raises.
    The service functions it is handed to never commit.

    A synchronous route's `ApiRoute` commits in the route's own thread as soon as it
    returns, so a transaction holding the submission lock ends without waiting for the
    event loop or a free thread; this commits whatever is left. A rollback, which may undo
    work outside the database (`db.on_rollback`), runs in a thread of
    `app.state.session_threads`, never queued behind the routes."""
    threads: anyio.CapacityLimiter = request.app.state.session_threads
    session: Session = request.app.state.sessions()
    try:
        try:
            yield session
            if wrote(session):  # else its close ends the read
                session.commit()
        except BaseException:
            with anyio.CancelScope(shield=True):
                await run_sync(roll_back, session, limiter=threads)
            raise
    finally:
        session.close()


def get_results(request: Request) -> ResultsCache:
    cache: ResultsCache = request.app.state.results
    return cache


def check_token(request: Request) -> None:
    """When an API token is configured, it must come as the bearer token (compared as bytes,
    in constant time: a header is Latin-1 on the wire, the token UTF-8)."""
    token = request.app.state.settings.api_token
    if token is None:
        return
    header = request.headers.get("authorization", "")
    scheme, _, given = header.partition(" ")
    expected = token.get_secret_value().encode("utf-8")
    try:
        offered = given.strip().encode("latin-1")
    except UnicodeEncodeError:  # not from a header; never equal
        offered = b""
    if scheme.lower() != "bearer" or not hmac.compare_digest(offered, expected):
        raise ApiError(401, "a valid bearer token is required", "authorization")


def require_token(
    request: Request,
    _credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(bearer)],
) -> None:
    """Every endpoint but health needs the token (checked first by `ApiRoute`, before the
    body is read; here again, and this dependency puts the scheme in the OpenAPI document)."""
    check_token(request)


SettingsDep = Annotated[Settings, Depends(get_app_settings)]
#: `scope="function"`: the dependency ends (commits) when the route returns, before the
#: response is sent.
SessionDep = Annotated[Session, Depends(get_session, scope="function")]
SessionFactoryDep = Annotated[sessionmaker[Session], Depends(get_session_factory)]
ResultsDep = Annotated[ResultsCache, Depends(get_results)]
