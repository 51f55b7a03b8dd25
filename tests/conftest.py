"""Shared test configuration: GPU-marked tests are skipped when no CUDA device is present,
every case that needs the PostgreSQL server carries the `postgres` marker, and the service
tests' databases and processes: a fresh SQLite file, a fresh PostgreSQL database on the server
at 127.0.0.1:5432 (created per test, dropped afterwards), a private PostgreSQL server the fault
tests may stop and restart (`private_pg`), a local Ray, the app in process and `depthscope
serve` on loopback."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from tests.support.postgres import PostgresUnavailable, PrivatePostgres, private_postgres

if TYPE_CHECKING:
    from fastapi.testclient import TestClient


def _cuda_available() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return bool(torch.cuda.is_available())


#: The fixtures that reach the PostgreSQL server (below).
POSTGRES_FIXTURES = frozenset({"postgres_url", "private_pg"})


def _needs_postgres(item: pytest.Item) -> bool:
    names = set(getattr(item, "fixturenames", ()))
    callspec = getattr(item, "callspec", None)
    on_postgres = callspec is not None and callspec.params.get("db_url") == "postgres"
    return bool(names & POSTGRES_FIXTURES) or on_postgres


@pytest.hookimpl(tryfirst=True)  # before `-m` deselects: the marker must be there by then
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if _needs_postgres(item):
            item.add_marker(pytest.mark.postgres)
    gpu_items = [item for item in items if "gpu" in item.keywords]
    if not gpu_items or _cuda_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device")
    for item in gpu_items:
        item.add_marker(skip)


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
    """The storage suite runs over both backends (the PostgreSQL cases carry the `postgres`
    marker: `tests/conftest.py`)."""
    if request.param == "postgres":
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


@pytest.fixture
def client(tmp_path: Path) -> Iterator[TestClient]:
    """The app in process on a fresh SQLite file (no runner, no Ray)."""
    from fastapi.testclient import TestClient

    from nas_service.api.app import create_app
    from nas_service.settings import get_settings

    app = create_app(get_settings(database_url=f"sqlite:///{tmp_path / 'api.db'}", max_trials=50))
    with TestClient(app) as c:
        yield c


@pytest.fixture
def server(tmp_path: Path) -> Iterator[str]:
    """`depthscope serve` (the API, its runner and a local Ray) on a free port of loopback,
    over a fresh SQLite file; its whole session stopped afterwards."""
    from tests.support.api import serve
    from tests.support.procs import terminate_session

    url, proc = serve(tmp_path, "--database-url", f"sqlite:///{tmp_path / 'e2e.db'}")
    try:
        yield url
    finally:
        terminate_session(proc, grace=60)  # the server, its runner and their Ray, nothing else
