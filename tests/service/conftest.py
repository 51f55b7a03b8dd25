"""Databases for the service tests: a fresh SQLite file, a fresh PostgreSQL database on the
server at 127.0.0.1:5432 (created per test, dropped afterwards), and a private PostgreSQL
server the fault tests may stop and restart (`private_pg`)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.service.pg_private import PostgresUnavailable, PrivatePostgres, private_postgres

PG_ADMIN = "postgresql+psycopg://postgres@127.0.0.1:5432/postgres"


@pytest.fixture
def sqlite_url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'depthscope.db'}"


@pytest.fixture
def postgres_url() -> Iterator[str]:
    from sqlalchemy import create_engine, text

    name = f"ds_test_{uuid.uuid4().hex[:12]}"
    admin = create_engine(PG_ADMIN, isolation_level="AUTOCOMMIT")
    try:
        with admin.connect() as conn:
            conn.execute(text(f'CREATE DATABASE "{name}"'))
    except Exception as exc:  # the server must be up: this machine kind runs it
        pytest.fail(f"PostgreSQL at 127.0.0.1:5432 is not reachable: {exc}")
    try:
        yield f"postgresql+psycopg://postgres@127.0.0.1:5432/{name}"
    finally:
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


@pytest.fixture(params=["sqlite", "postgres"])
def db_url(request: pytest.FixtureRequest) -> str:
    """The storage suite runs over both backends."""
    if request.param == "postgres":
        request.applymarker(pytest.mark.postgres)
        return str(request.getfixturevalue("postgres_url"))
    return str(request.getfixturevalue("sqlite_url"))


@pytest.fixture(scope="module")
def private_pg() -> Iterator[PrivatePostgres]:
    """A PostgreSQL server of this module's own (initdb in a fresh folder, 127.0.0.1 on a
    free port, trust authentication) with a fresh database at `.url`; `.stop()` (immediate
    shutdown) and `.start()` (same folder, same port) for fault tests. Removed afterwards."""
    try:
        pg = private_postgres()
    except PostgresUnavailable as exc:
        pytest.fail(f"cannot run a private PostgreSQL server: {exc}")
    try:
        yield pg
    finally:
        pg.close()


@pytest.fixture(scope="module")
def ray_local() -> Iterator[None]:
    """A local Ray of 2 CPUs in this test process, for the module's runner tests (its
    processes are our descendants: `procs` finds them)."""
    import os

    import ray

    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()
