"""The suite's markers select what they say: `-m "not postgres"` leaves out every case that
needs the PostgreSQL server (a `db_url` case on PostgreSQL, a test taking `postgres_url` or
the private server), and keeps the SQLite cases beside them."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _collected(*args: str) -> list[str]:
    out = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode in (0, 5), out.stdout + out.stderr
    return [line for line in out.stdout.splitlines() if "::" in line]


@pytest.mark.slow
def test_not_postgres_deselects_every_postgres_case() -> None:
    files = ["tests/store/test_db.py", "tests/jobs/test_submission.py"]
    everything = _collected(*files)
    kept = _collected("-m", "not postgres", *files)
    only = _collected("-m", "postgres", *files)
    assert any("[postgres" in t for t in everything)
    assert [t for t in kept if "postgres" in t] == []
    assert any("[sqlite" in t for t in kept)
    assert sorted(kept + only) == sorted(everything)
    assert all("postgres" in t for t in only)
