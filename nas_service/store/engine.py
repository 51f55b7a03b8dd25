"""Engines and sessions. SQLite files run in WAL mode with foreign keys on; PostgreSQL goes
through psycopg (`postgresql+psycopg://`; a plain `postgresql://` URL is mapped to it).

Pools are bounded: `make_engine(url, pool_size=…, max_overflow=…, pool_timeout=…)` (the
service passes its `db_pool_*` settings); a request that cannot get a connection in time
raises SQLAlchemy's `TimeoutError` (the API answers 503) instead of waiting unbounded."""

from __future__ import annotations

from typing import Any

from sqlalchemy import Engine, create_engine, event
from sqlalchemy.orm import Session, sessionmaker

#: Seconds a SQLite connection waits for another writer's lock before "database is locked".
SQLITE_BUSY_TIMEOUT_S = 30


def normalise_url(url: str) -> str:
    if url.startswith("postgresql://"):
        return "postgresql+psycopg://" + url.removeprefix("postgresql://")
    if url.startswith("postgres://"):
        return "postgresql+psycopg://" + url.removeprefix("postgres://")
    return url


def pool_kwargs(
    url: str,
    pool_size: int | None = None,
    max_overflow: int | None = None,
    pool_timeout: float | None = None,
) -> dict[str, Any]:
    """The engine keyword arguments for a bounded pool (None: SQLAlchemy's default). An
    in-memory SQLite database has no queue pool, so it takes none of them."""
    url = normalise_url(url)
    if url.startswith("sqlite") and (":memory:" in url or url.rstrip("/") in ("sqlite:", "sqlite")):
        return {}
    out: dict[str, Any] = {}
    if pool_size is not None:
        out["pool_size"] = pool_size
    if max_overflow is not None:
        out["max_overflow"] = max_overflow
    if pool_timeout is not None:
        out["pool_timeout"] = pool_timeout
    return out


def make_engine(
    url: str,
    *,
    pool_size: int | None = None,
    max_overflow: int | None = None,
    pool_timeout: float | None = None,
    **kwargs: Any,
) -> Engine:
    url = normalise_url(url)
    kwargs = pool_kwargs(url, pool_size, max_overflow, pool_timeout) | kwargs
    if url.startswith("sqlite"):
        engine = create_engine(url, connect_args={"timeout": SQLITE_BUSY_TIMEOUT_S}, **kwargs)

        @event.listens_for(engine, "connect")
        def _pragmas(conn: Any, _record: Any) -> None:
            cur = conn.cursor()
            cur.execute("PRAGMA journal_mode=WAL")
            cur.execute("PRAGMA foreign_keys=ON")
            cur.execute(f"PRAGMA busy_timeout={SQLITE_BUSY_TIMEOUT_S * 1000}")
            cur.close()

        return engine
    return create_engine(url, pool_pre_ping=True, **kwargs)


def make_sessionmaker(engine: Engine) -> sessionmaker[Session]:
    from nas_service.store.session import track_writes

    sessions = sessionmaker(engine, expire_on_commit=False)
    track_writes(sessions)
    return sessions
