"""The API under concurrent load, over real HTTP: a uvicorn server process on loopback (no
runner; jobs stay pending), stopped by its PID.

- 50 concurrent submissions with `max_concurrent_jobs=8`: exactly 8 are stored (201), every
  other one is refused with 429, none is a 5xx, and the database holds exactly 8 jobs and 8
  studies (a refused submission leaves nothing behind), on SQLite and on PostgreSQL.
- A chunked request body (no Content-Length) over `max_request_bytes` is refused with 413 as
  soon as the limit is passed, without the server reading (or holding) the rest.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy import create_engine, text

from tests.support.api import SPEC

ROOT = Path(__file__).resolve().parents[2]
LAUNCHER = (
    "import sys, uvicorn\n"
    "from nas_service.api.app import create_app\n"
    "from nas_service.settings import get_settings\n"
    "uvicorn.run(create_app(get_settings(), run_clusters=()), host='127.0.0.1',\n"
    "            port=int(sys.argv[1]), log_level='warning')\n"
)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Server:
    def __init__(self, url: str, proc: subprocess.Popen[bytes], log: Path) -> None:
        self.url, self.proc, self.log = url, proc, log

    def peak_rss_bytes(self) -> int:
        """The server process's peak resident memory so far (VmHWM)."""
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
        raise AssertionError("no VmHWM")


@pytest.fixture
def serve(tmp_path: Path) -> Iterator[Any]:
    """`serve(database_url, **settings)` starts a server; every one started is stopped."""
    started: list[subprocess.Popen[bytes]] = []

    def start(database_url: str, **settings: object) -> Server:
        port = _free_port()
        env = {k: v for k, v in os.environ.items() if not k.startswith("DEPTHSCOPE_")}
        env |= {f"DEPTHSCOPE_{k.upper()}": str(v) for k, v in settings.items()}
        env |= {"DEPTHSCOPE_DATABASE_URL": database_url, "RAY_USAGE_STATS_ENABLED": "0"}
        log = tmp_path / f"server-{port}.log"
        with log.open("w") as out:
            proc = subprocess.Popen(
                [sys.executable, "-c", LAUNCHER, str(port)],
                env=env,
                cwd=ROOT,
                stdout=out,
                stderr=out,
                start_new_session=True,
            )
        started.append(proc)
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                pytest.fail(f"the server exited: {log.read_text()[-3000:]}")
            try:
                if httpx.get(f"{url}/v1/health", timeout=2).status_code == 200:
                    return Server(url, proc, log)
            except httpx.HTTPError:
                time.sleep(0.2)
        pytest.fail(f"the server did not come up: {log.read_text()[-3000:]}")

    try:
        yield start
    finally:
        for proc in started:  # only what this fixture started: its own process group
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
                try:
                    proc.wait(timeout=20)
                except subprocess.TimeoutExpired:
                    os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait(timeout=20)


def _stored(url: str) -> tuple[int, int, int]:
    engine = create_engine(url.replace("postgresql://", "postgresql+psycopg://"))
    try:
        with engine.connect() as conn:
            jobs = conn.scalar(text("SELECT count(*) FROM ds_jobs"))
            events = conn.scalar(text("SELECT count(*) FROM ds_job_events"))
            studies = conn.scalar(text("SELECT count(*) FROM studies"))
    finally:
        engine.dispose()
    return int(jobs or 0), int(events or 0), int(studies or 0)


@pytest.mark.slow
def test_50_concurrent_submissions_respect_the_job_limit(serve: Any, db_url: str) -> None:
    server = serve(db_url, max_concurrent_jobs=8)
    barrier = threading.Barrier(50)

    def submit(i: int) -> tuple[int, dict[str, Any] | None, str | None]:
        barrier.wait()
        try:
            r = httpx.post(f"{server.url}/v1/jobs", json=SPEC | {"name": f"c{i}"}, timeout=120)
        except httpx.TimeoutException:
            return 598, None, None
        except httpx.HTTPError:  # a dropped connection counts as a server error
            return 599, None, None
        body = r.json() if r.headers.get("content-type") == "application/json" else None
        return r.status_code, body, r.headers.get("retry-after")

    start = time.monotonic()
    with ThreadPoolExecutor(max_workers=50) as pool:
        answers = list(pool.map(submit, range(50)))
    elapsed = time.monotonic() - start
    codes = Counter(code for code, _, _ in answers)
    print(f"50 concurrent submissions on {db_url.split(':')[0]}: {dict(codes)} in {elapsed:.1f} s")
    assert not [c for c in codes if c >= 500], (codes, server.log.read_text()[-3000:])
    assert codes == Counter({201: 8, 429: 42})
    assert _stored(db_url) == (8, 8, 8)  # jobs, their events, and their studies
    for code, body, retry_after in answers:
        assert body is not None
        if code == 429:  # the one JSON error shape, naming the limit, with when to retry
            assert body["error"]["status"] == 429 and body["error"]["field"] == "jobs"
            assert retry_after is not None and int(retry_after) > 0
    listing = httpx.get(f"{server.url}/v1/jobs", params={"status": "pending"}, timeout=30).json()
    assert listing["total"] == 8


@pytest.mark.slow
def test_a_chunked_body_over_the_limit_is_refused_while_it_is_read(
    serve: Any, sqlite_url: str
) -> None:
    server = serve(sqlite_url, max_request_bytes=1 << 20)
    chunk = b"x" * (64 << 10)
    total = 50 << 20
    sent = 0

    def body() -> Iterator[bytes]:
        nonlocal sent
        while sent < total:
            sent += len(chunk)
            yield chunk

    before = server.peak_rss_bytes()
    start = time.monotonic()
    r = httpx.post(
        f"{server.url}/v1/jobs",
        content=body(),
        headers={"content-type": "application/json"},
        timeout=60,
    )
    elapsed = time.monotonic() - start
    grown = server.peak_rss_bytes() - before
    print(
        f"chunked 50 MB body: {r.status_code} after {elapsed:.2f} s, {sent >> 20} MiB sent, "
        f"server peak RSS +{grown >> 20} MiB"
    )
    assert "content-length" not in r.request.headers  # it really was chunked
    assert r.status_code == 413, r.text
    assert r.json()["error"]["field"] == "body"
    assert elapsed < 10
    assert grown < 16 << 20  # the server never held the body (50 MiB)
    # and the server still answers
    assert httpx.get(f"{server.url}/v1/health", timeout=10).status_code == 200


def test_the_pools_are_sized_by_the_settings(db_url: str) -> None:
    from fastapi.testclient import TestClient

    from nas_service.api.app import create_app
    from nas_service.settings import get_settings

    settings = get_settings(
        database_url=db_url, db_pool_size=3, db_max_overflow=2, db_pool_timeout_s=1.5
    )
    with TestClient(create_app(settings)) as c:
        engines = [
            c.app.state.sessions.kw["bind"],  # type: ignore[attr-defined]
            c.app.state.results.storage.engine,  # type: ignore[attr-defined]
        ]
        for engine in engines:
            pool = engine.pool
            assert (pool.size(), pool._max_overflow, pool._timeout) == (3, 2, 1.5)


def test_a_refusal_under_the_lock_stores_nothing(db_url: str, monkeypatch: Any) -> None:
    """The limit is decided under the lock: a submission that passed the early count but
    finds the limit reached there is refused (JobLimitError), and its study is deleted."""
    import nas_service.jobs as jobs
    from nas_service.settings import get_settings
    from nas_service.store import make_engine, make_sessionmaker, upgrade

    upgrade(db_url)
    settings = get_settings(database_url=db_url, max_concurrent_jobs=1)
    engine = make_engine(db_url)
    sessions = make_sessionmaker(engine)
    try:
        jobs.submit(sessions, settings, SPEC)
        seen: list[int] = []
        real = jobs._count_active

        def count(session: Any) -> int:  # the early count sees room; the one under the lock not
            seen.append(real(session))
            return 0 if len(seen) == 1 else seen[-1]

        monkeypatch.setattr(jobs, "_count_active", count)
        with pytest.raises(jobs.JobLimitError):
            jobs.submit(sessions, settings, SPEC | {"name": "late"})
        assert seen == [1, 1]  # both counts were taken; the second one refused
        assert _stored(db_url) == (1, 1, 1)
    finally:
        engine.dispose()
