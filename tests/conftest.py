"""Shared test configuration: GPU-marked tests are skipped when no CUDA device is present,
and every case that needs the PostgreSQL server carries the `postgres` marker."""

from __future__ import annotations

import pytest


def _cuda_available() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return bool(torch.cuda.is_available())


#: The fixtures that reach the PostgreSQL server (`tests/service/conftest.py`).
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
