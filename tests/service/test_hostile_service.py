"""What a hostile client (or an upgrade) does to a running service: many distinct pages of
a finished job's results (the service's memory must stay bounded), a stored spec this
version no longer validates (the job list, the job's read and its cancel must still
answer), listing many stored jobs (no spec re-validated, no layout enumerated)."""

from __future__ import annotations

import functools
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import optuna
import pytest

from tests.service.apikit import ROOT, SPEC, _free_port, _synthetic

#: The API alone, as an operator starts it.
SERVE = [sys.executable, "-m", "nas_service.cli", "serve", "--no-runner"]


def _rss_bytes(pid: int) -> int:
    """The process's resident set, from /proc."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError(f"no VmRSS for {pid}")


@pytest.fixture
def api_only(tmp_path: Path) -> Iterator[tuple[str, str, subprocess.Popen[bytes]]]:
    """`depthscope serve --no-runner` (the API alone, its default settings) on a free port of
    loopback over a fresh SQLite file: its URL, the database URL and the process."""
    from tests.service.procs import terminate_session

    port = _free_port()
    db = f"sqlite:///{tmp_path / 'hostile.db'}"
    log = (tmp_path / "server.log").open("w")
    env = {k: v for k, v in os.environ.items() if not k.startswith("DEPTHSCOPE_")}
    proc = subprocess.Popen(
        [*SERVE, "--port", str(port), "--database-url", db],
        env=env,
        cwd=ROOT,
        stdout=log,
        stderr=log,
        start_new_session=True,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            try:
                if httpx.get(f"{url}/v1/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.3)
        else:
            pytest.fail("the server did not come up: " + (tmp_path / "server.log").read_text())
        yield url, db, proc
    finally:
        terminate_session(proc, grace=30)


def _finished_job(url: str, db: str, n: int) -> str:
    """A job submitted over HTTP whose study then holds `n` finished synthetic trials, marked
    completed (a finished job's results never change)."""
    import datetime as dt

    from sqlalchemy import update

    from nas_service.db import Job, JobStatus, make_engine, make_sessionmaker
    from nas_service.jobs import optuna_storage
    from nas_service.spec import parse_spec

    answer = httpx.post(f"{url}/v1/jobs", json=SPEC, timeout=30)
    assert answer.status_code == 201, answer.text
    job = answer.json()
    support: Any = _synthetic()
    study = optuna.load_study(study_name=job["study_name"], storage=optuna_storage(db))
    support.store_trials(study, support.synthetic_trials(parse_spec(SPEC), n))
    engine = make_engine(db)
    with make_sessionmaker(engine).begin() as s:
        s.execute(
            update(Job)
            .where(Job.id == job["id"])
            .values(status=JobStatus.COMPLETED, finished_at=dt.datetime.now(dt.UTC))
        )
    engine.dispose()
    return str(job["id"])


def test_many_distinct_result_pages_keep_the_service_memory_bounded(
    api_only: tuple[str, str, subprocess.Popen[bytes]],
) -> None:
    """A client asking a finished 2,000-trial job for page after distinct page (1,000 trials
    each, with curves; and the dashboard's sorted table likewise) is answered every time,
    and the service's resident memory stays within a bound however many it asks: an answer
    to a page is not kept (its order is, once per state), and what is kept is bounded in
    bytes."""
    url, db, proc = api_only
    job = _finished_job(url, db, 2000)
    pages = [f"/v1/jobs/{job}/trials?limit=1000&curve=true&offset={k}" for k in range(80)]
    pages += [f"/v1/jobs/{job}/table?limit=1000&sort=val_loss&offset={k}" for k in range(80)]
    with httpx.Client(base_url=url, timeout=60) as c:
        for path in pages[:2] + pages[80:82]:  # the table loaded, one page of each built
            assert c.get(path).status_code == 200
        before = _rss_bytes(proc.pid)
        began = time.monotonic()
        for i, path in enumerate(pages):
            r = c.get(path)
            assert r.status_code == 200, (path, r.text[:300])
            if i in (0, 80):
                assert len(r.json()["items"]) == 1000
        spent = time.monotonic() - began
        after = _rss_bytes(proc.pid)
        # still answering, and correctly: the last page of the table sorted by loss
        last = c.get(f"/v1/jobs/{job}/table?limit=1000&sort=val_loss&offset=1999").json()
        ordered = c.get(f"/v1/jobs/{job}/table?limit=1000&sort=val_loss&offset=999").json()
    losses = [t["metrics"]["val_loss"] for t in ordered["items"]]
    assert losses == sorted(losses) and len(last["items"]) == 1
    assert last["items"][0]["metrics"]["val_loss"] >= losses[-1]
    grown = (after - before) / 2**20
    print(f"RSS {before / 2**20:.0f} MiB -> {after / 2**20:.0f} MiB; {len(pages)} in {spent:.1f} s")
    assert grown < 150, f"the service grew by {grown:.0f} MiB over {len(pages)} distinct pages"


def test_the_memo_is_bounded_in_bytes_least_recently_used_first() -> None:
    """Answers are kept while they fit in the memo's byte limit: many distinct large answers
    leave it within the limit, the most recent kept and the oldest gone; an answer larger
    than the whole limit is answered and not kept; one asked again stays."""
    from nas_service.results import JobResults, approx_bytes

    results = JobResults("s", ["val_loss"], memo_limit=1 << 20)
    calls: list[int] = []

    def big(k: int) -> list[float]:
        calls.append(k)
        return [float(k)] * 20_000  # ~160 kB of references, ~24 B for the one float

    for k in range(100):
        assert results.memoised(("page", k), functools.partial(big, k))[0] == k
        results.memoised(("page", 0), lambda: big(0))  # the first one, kept in use
    assert results.memo_bytes <= 1 << 20
    assert results.memo_bytes == sum(approx_bytes(v, 1 << 30) for v in results.memo.values())
    assert ("page", 99) in results.memo and ("page", 0) in results.memo
    assert ("page", 1) not in results.memo
    assert calls.count(0) == 1 and len(calls) == 100
    huge = results.memoised("huge", lambda: list(range(300_000)))
    assert len(huge) == 300_000 and "huge" not in results.memo
    assert results.memo_bytes <= 1 << 20


def test_the_cache_drops_the_tables_read_least_recently(tmp_path: Path) -> None:
    """Past `max_bytes`, the tables read least recently are dropped (never the one being
    read), and a dropped one is loaded again, whole, when it is read next."""
    from nas_service.jobs import optuna_storage
    from nas_service.results import ResultsCache, table_bytes
    from nas_service.spec import parse_spec

    storage = optuna_storage(f"sqlite:///{tmp_path / 'r.db'}")
    support: Any = _synthetic()
    spec = parse_spec(SPEC | {"objectives": ["val_loss"]})
    for name in ("a", "b", "c"):
        study = optuna.create_study(study_name=name, storage=storage)
        support.store_trials(study, support.synthetic_trials(spec, 200))
    one = table_bytes(ResultsCache(storage).get("a", ["val_loss"]).rows)
    assert one > 200 * 1000  # a row holds its arch, costs, training summary and curve
    cache = ResultsCache(storage, max_bytes=int(one * 2.5))
    a = cache.get("a", ["val_loss"])
    cache.get("b", ["val_loss"])
    assert cache.get("a", ["val_loss"]) is a  # kept, and now read most recently
    cache.get("c", ["val_loss"])  # three tables do not fit: b, read least recently, goes
    assert cache.held_bytes() <= cache.max_bytes
    assert cache.get("a", ["val_loss"]) is a
    b = cache.get("b", ["val_loss"])
    assert len(b.rows) == 200 and [r.number for r in b.rows] == list(range(200))
    assert cache.held_bytes() <= cache.max_bytes
    tiny = ResultsCache(storage, max_bytes=1)  # not even one fits: the one read is kept
    assert len(tiny.get("c", ["val_loss"]).rows) == 200
    assert tiny.get("c", ["val_loss"]) is tiny.get("c", ["val_loss"])
