"""The service's tables under Alembic, on SQLite and PostgreSQL, beside Optuna's storage."""

from __future__ import annotations

import datetime as dt
import subprocess
import sys
import uuid

import pytest
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy import JSON, column, insert, inspect, select, table

from nas_service.store import (
    VERSION_TABLE,
    Base,
    Job,
    JobEvent,
    TrialRun,
    current,
    downgrade,
    head,
    make_engine,
    make_sessionmaker,
    upgrade,
)
from nas_service.store.jobs import active_jobs

OURS = {
    "ds_jobs",
    "ds_job_events",
    "ds_trial_runs",
    "ds_runner_leases",
    "ds_runner_lives",
    VERSION_TABLE,
}


def tables(url: str) -> set[str]:
    engine = make_engine(url)
    try:
        return set(inspect(engine).get_table_names())
    finally:
        engine.dispose()


def test_upgrade_creates_our_tables_with_our_version_table(db_url: str) -> None:
    assert current(db_url) is None
    upgrade(db_url)
    assert current(db_url) == head() == "0004"
    assert tables(db_url) == OURS  # no plain alembic_version: Optuna's name stays free


def test_migrations_match_the_models(db_url: str) -> None:
    upgrade(db_url)
    engine = make_engine(db_url)
    with engine.connect() as conn:
        ctx = MigrationContext.configure(
            conn,
            opts={
                "version_table": VERSION_TABLE,
                "include_object": lambda obj, name, type_, *_: (
                    type_ != "table" or name.startswith("ds_")
                ),
            },
        )
        diff = compare_metadata(ctx, Base.metadata)
    engine.dispose()
    assert diff == []


def test_downgrade_and_upgrade_again(db_url: str) -> None:
    upgrade(db_url)
    downgrade(db_url, "base")
    assert current(db_url) is None
    assert tables(db_url) == {VERSION_TABLE}
    upgrade(db_url)
    assert tables(db_url) == OURS


def test_optuna_storage_lives_beside_our_tables(db_url: str) -> None:
    optuna = pytest.importorskip("optuna")
    upgrade(db_url)
    storage = optuna.storages.RDBStorage(db_url.replace("+psycopg", "+psycopg"))
    study = optuna.create_study(study_name="s", storage=storage)
    study.optimize(lambda t: t.suggest_float("x", 0, 1) ** 2, n_trials=3)
    assert current(db_url) == head()
    assert {"alembic_version", "studies", "trials"} <= tables(db_url)
    downgrade(db_url, "base")  # ours go, Optuna's stay
    assert "ds_jobs" not in tables(db_url)
    again = optuna.load_study(study_name="s", storage=optuna.storages.RDBStorage(db_url))
    assert len(again.trials) == 3
    upgrade(db_url)
    assert current(db_url) == head()


def test_rows_and_cascade(db_url: str) -> None:
    upgrade(db_url)
    engine = make_engine(db_url)
    Session = make_sessionmaker(engine)
    job_id = str(uuid.uuid4())
    with Session.begin() as s:
        s.add(Job(id=job_id, name="j", spec={"n_trials": 2}, study_name=f"ds-{job_id}", n_trials=2))
    with Session() as s:  # a row that names no cluster is the local cluster's
        assert s.get(Job, job_id).cluster == "local"  # type: ignore[union-attr]
    with Session.begin() as s:
        job = s.get(Job, job_id)
        assert job is not None and job.status == "pending" and job.spec == {"n_trials": 2}
        job.events.append(JobEvent(kind="submitted", message="ok", data={"a": 1}))
        job.runs.append(TrialRun(trial_number=0, params={"n_layers": 2}))
    with Session.begin() as s:
        run = s.scalars(select(TrialRun)).one()
        assert (run.state, run.attempt, run.params) == ("running", 1, {"n_layers": 2})
        s.delete(s.get(Job, job_id))
    with Session.begin() as s:
        assert s.scalars(select(JobEvent)).all() == []
        assert s.scalars(select(TrialRun)).all() == []
    engine.dispose()


def test_cli_db_upgrade_and_current(sqlite_url: str) -> None:
    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "nas_service.cli", "db", *args, "--url", sqlite_url],
            capture_output=True,
            text=True,
            timeout=120,
        )

    assert cli("current").stdout.strip() == "none"
    assert cli("upgrade").returncode == 0
    assert cli("current").stdout.strip() == "0004 (head)"
    assert cli("downgrade", "base").returncode == 0
    assert cli("current").stdout.strip() == "none"


#: Stored specs as a job row at 0003 holds them, and the cluster 0004 fills in for each: the
#: spec's, or the local cluster where it names none (no key, not text, empty).
BACKFILL = {
    "lab": ({"name": "a", "cluster": "lab", "n_trials": 2}, "lab"),
    "local": ({"name": "b", "cluster": "local"}, "local"),
    "none": ({"name": "c"}, "local"),
    "number": ({"name": "d", "cluster": 5}, "local"),
    "empty": ({"name": "e", "cluster": ""}, "local"),
    "not-a-mapping": (["a", "list"], "local"),
}


def test_0004_adds_the_cluster_column_backfilled_from_each_stored_spec(db_url: str) -> None:
    """A database at 0003 holding jobs (and their events) upgrades to a `cluster` column
    filled from each job's stored spec, its events kept; downgrading removes the column."""
    upgrade(db_url, "0003")
    engine = make_engine(db_url)
    jobs = table("ds_jobs", column("id"), column("name"), column("status"), column("spec", JSON))
    jobs.append_column(column("study_name"))
    jobs.append_column(column("n_trials"))
    jobs.append_column(column("created_at"))
    events = table("ds_job_events", column("job_id"), column("at"), column("kind"))
    events.append_column(column("message"))
    now = dt.datetime.now(dt.UTC)
    with engine.begin() as conn:
        for key, (spec, _) in BACKFILL.items():
            row = {"id": key, "name": key, "status": "pending", "spec": spec}
            row |= {"study_name": f"ds-{key}", "n_trials": 2, "created_at": now}
            conn.execute(insert(jobs).values(**row))
            conn.execute(insert(events).values(job_id=key, at=now, kind="submitted", message=key))
    engine.dispose()
    upgrade(db_url)
    assert current(db_url) == "0004"
    engine = make_engine(db_url)
    Session = make_sessionmaker(engine)
    with Session() as s:
        got = {j.id: j.cluster for j in s.scalars(select(Job))}
        assert got == {key: cluster for key, (_, cluster) in BACKFILL.items()}
        assert s.get(Job, "lab").spec == BACKFILL["lab"][0]  # type: ignore[union-attr]
        assert len(s.scalars(select(JobEvent)).all()) == len(BACKFILL)
        assert [j.id for j in active_jobs(s, "lab")] == ["lab"]
    engine.dispose()
    downgrade(db_url, "0003")
    engine = make_engine(db_url)
    try:
        assert "cluster" not in {c["name"] for c in inspect(engine).get_columns("ds_jobs")}
    finally:
        engine.dispose()
    upgrade(db_url)
    assert current(db_url) == head()
