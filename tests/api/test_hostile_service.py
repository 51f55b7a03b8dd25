"""What a hostile client (or an upgrade) does to a running service: many distinct pages of
a finished job's results (the service's memory must stay bounded), a stored spec this
version no longer validates (the job list, the job's read and its cancel must still
answer), listing many stored jobs (no spec re-validated, no layout enumerated)."""

from __future__ import annotations

import functools
import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import optuna
import pytest

from tests.support.api import SPEC, _synthetic, serve

#: The API alone, as an operator starts it.


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
    from tests.support.procs import terminate_session

    db = f"sqlite:///{tmp_path / 'hostile.db'}"
    env = {k: v for k, v in os.environ.items() if not k.startswith("DEPTHSCOPE_")}
    url, proc = serve(tmp_path, "--no-runner", "--database-url", db, env=env)
    try:
        yield url, db, proc
    finally:
        terminate_session(proc, grace=30)


def _finished_job(url: str, db: str, n: int) -> str:
    """A job submitted over HTTP whose study then holds `n` finished synthetic trials, marked
    completed (a finished job's results never change)."""
    import datetime as dt

    from sqlalchemy import update

    from nas_service.spec import parse_spec
    from nas_service.store import Job, JobStatus, make_engine, make_sessionmaker
    from nas_service.store.jobs import optuna_storage

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
    from nas_service.results.cache import JobResults, approx_bytes

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
    from nas_service.results.cache import ResultsCache, table_bytes
    from nas_service.spec import parse_spec
    from nas_service.store.jobs import optuna_storage

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


def _stored_row(db: str, spec: Any) -> str:
    """A job row as an older version (or a hand edit) could have left it: `spec` stored as
    is, never validated here, beside a real study."""
    import uuid

    from nas_service.search.study import create_study
    from nas_service.spec import parse_spec
    from nas_service.store import Job, make_engine, make_sessionmaker
    from nas_service.store.jobs import optuna_storage

    job_id = str(uuid.uuid4())
    study_name = f"depthscope-{job_id}"
    create_study(parse_spec(SPEC), optuna_storage(db), study_name)
    engine = make_engine(db)
    with make_sessionmaker(engine).begin() as s:
        s.add(Job(id=job_id, name="stale", spec=spec, study_name=study_name, n_trials=4))
    engine.dispose()
    return job_id


#: Rows this version no longer reads: a variant since removed, a field since removed, a
#: section of the wrong type, a non-finite budget (SQLite keeps one), no budget at all.
STALE = {
    "variant": SPEC | {"space": SPEC["space"] | {"variants": ["baseline", "retired_variant"]}},
    "field": SPEC | {"old_field": 3},
    "section": SPEC | {"training": "fast"},
    "nan": SPEC | {"budget": {"flops": [1e9, float("nan")]}},
    "no-budget": {k: v for k, v in SPEC.items() if k != "budget"},
}


def test_a_stale_stored_spec_is_shown_with_its_reason_and_can_be_cancelled(
    api_only: tuple[str, str, subprocess.Popen[bytes]],
) -> None:
    """Rows this version no longer validates, beside a healthy job: the job list (the
    dashboard's home), each job's read and its cancel answer, the stale ones with the spec
    as stored and the reason; the healthy one as before."""
    url, db, _ = api_only
    with httpx.Client(base_url=url, timeout=60) as c:
        healthy = c.post("/v1/jobs", json=SPEC | {"name": "healthy"}).json()["id"]
        stale = {kind: _stored_row(db, spec) for kind, spec in STALE.items()}
        listed = c.get("/v1/jobs")
        assert listed.status_code == 200, listed.text
        jobs = {j["id"]: j for j in listed.json()["items"]}
        assert jobs[healthy]["spec_error"] is None
        assert jobs[healthy]["spec"]["space"]["variants"] == ["baseline", "block_attnres"]
        where = {
            "variant": "space.variants",
            "field": "old_field",
            "section": "training",
            "nan": "budget.flops",
            "no-budget": "budget",
        }
        for kind, job_id in stale.items():
            shown = jobs[job_id]
            assert shown["spec_error"] and where[kind] in shown["spec_error"], (kind, shown)
            read = c.get(f"/v1/jobs/{job_id}")
            assert read.status_code == 200, (kind, read.text)
            assert read.json()["spec_error"] == shown["spec_error"]
            assert c.get(f"/v1/jobs/{job_id}/trials").status_code == 200
        assert jobs[stale["variant"]]["spec"]["space"]["variants"][1] == "retired_variant"
        assert jobs[stale["field"]]["spec"]["old_field"] == 3
        assert jobs[stale["nan"]]["spec"]["budget"]["flops"][0] == 1e9
        for kind, job_id in stale.items():
            cancelled = c.post(f"/v1/jobs/{job_id}/cancel")
            assert cancelled.status_code == 200, (kind, cancelled.text)
            assert cancelled.json()["status"] == "cancelled"
        assert c.get(f"/v1/jobs/{healthy}").json()["status"] == "pending"
        assert c.get("/v1/jobs?status=cancelled").json()["total"] == len(STALE)


def test_a_stale_stored_spec_fails_in_the_runner_with_the_reason(tmp_path: Path) -> None:
    """The runner fails a job whose stored spec this version no longer reads at once, with
    the same reason the API shows, and goes on with the others."""
    from nas_service.runner.loop import Runner
    from nas_service.spec import read_stored
    from nas_service.store import Job
    from tests.support.jobs import setup

    db = f"sqlite:///{tmp_path / 'runner.db'}"
    settings, Session = setup(db)
    row = STALE["variant"] | {"cluster": "local"}  # as every stored spec names its cluster
    job_id = _stored_row(db, row)
    reason = read_stored(row).reason
    assert reason and "space.variants" in reason
    Runner(settings, backend=_NoTraining()).run(timeout_s=60)
    with Session() as s:
        job = s.get(Job, job_id)
        assert job is not None and job.status == "failed"
        assert job.error == f"the stored spec is no longer valid: {reason}"


class _NoTraining:
    """A backend for a runner that must train nothing: it connects, and has one node."""

    def connect(self) -> bool:
        return True

    def shutdown(self) -> None:
        pass

    def largest_node(self) -> dict[str, float]:
        return {"CPU": 2.0}

    def __getattr__(self, name: str) -> Any:
        raise AssertionError(f"the runner asked the backend to {name}")


def test_listing_stored_jobs_validates_no_spec_and_enumerates_no_layout(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`GET /v1/jobs` over N stored `layout: auto` jobs: the specs were validated (and the
    layouts counted) at submission; listing them reads what is stored: no layout enumerated
    at all, and each spec read once per process, not once per listing."""
    from fastapi.testclient import TestClient

    from cost_model.layout import LayoutSpace
    from nas_service.api.app import create_app
    from nas_service.settings import get_settings
    from nas_service.spec import JobSpec

    auto = SPEC | {
        "cost": {"hardware": "h100", "layout": "auto", "devices": 64, "max_virtual": 4},
        "objectives": ["val_loss", "best_step_time_s"],
    }
    app = create_app(
        get_settings(database_url=f"sqlite:///{tmp_path / 'l.db'}", max_concurrent_jobs=100)
    )
    layouts = 0
    validations = 0
    real_layouts = LayoutSpace.layouts
    real_validate = JobSpec.model_validate.__func__  # type: ignore[attr-defined]

    def counted_layouts(self: LayoutSpace) -> Any:
        nonlocal layouts
        layouts += 1
        return real_layouts(self)

    def counted_validate(cls: type[JobSpec], *args: Any, **kwargs: Any) -> JobSpec:
        nonlocal validations
        validations += 1
        return real_validate(cls, *args, **kwargs)  # type: ignore[no-any-return]

    with TestClient(app) as c:
        n = 12
        for i in range(n):
            r = c.post("/v1/jobs", json=auto | {"name": f"auto-{i}"})
            assert r.status_code == 201, r.text
        monkeypatch.setattr(LayoutSpace, "layouts", counted_layouts)
        monkeypatch.setattr(JobSpec, "model_validate", classmethod(counted_validate))
        first = c.get("/v1/jobs?limit=200")
        assert first.status_code == 200 and first.json()["total"] == n
        assert layouts == 0, f"listing {n} stored jobs enumerated layouts {layouts} times"
        assert validations <= n
        for _ in range(3):
            assert c.get("/v1/jobs?limit=200").status_code == 200
        assert layouts == 0
        assert validations <= n, f"{validations} validations over 4 listings of {n} jobs"
        shown = first.json()["items"][0]["spec"]
        assert shown["cost"]["layout"] == "auto" and shown["cost"]["devices"] == 64
