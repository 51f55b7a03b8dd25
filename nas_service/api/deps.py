"""Typed dependencies: settings, database sessions, the results cache, authentication."""

from __future__ import annotations

import hmac
from collections.abc import Iterator
from typing import Annotated

from fastapi import Depends, Request
from sqlalchemy.orm import Session, sessionmaker

from nas_service.api.errors import ApiError
from nas_service.results import ResultsCache
from nas_service.settings import Settings


def get_app_settings(request: Request) -> Settings:
    settings: Settings = request.app.state.settings
    return settings


def get_session_factory(request: Request) -> sessionmaker[Session]:
    factory: sessionmaker[Session] = request.app.state.sessions
    return factory


def get_session(request: Request) -> Iterator[Session]:
    with request.app.state.sessions() as session:
        yield session


def get_results(request: Request) -> ResultsCache:
    cache: ResultsCache = request.app.state.results
    return cache


def require_token(request: Request) -> None:
    """When an API token is configured, every endpoint but health needs it as a bearer token."""
    token = request.app.state.settings.api_token
    if token is None:
        return
    header = request.headers.get("authorization", "")
    scheme, _, given = header.partition(" ")
    if scheme.lower() != "bearer" or not hmac.compare_digest(given, token.get_secret_value()):
        raise ApiError(401, "a valid bearer token is required", "authorization")


SettingsDep = Annotated[Settings, Depends(get_app_settings)]
SessionDep = Annotated[Session, Depends(get_session)]
SessionFactoryDep = Annotated[sessionmaker[Session], Depends(get_session_factory)]
ResultsDep = Annotated[ResultsCache, Depends(get_results)]
