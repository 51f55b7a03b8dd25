"""Jobs: submission (validate, then create the study and the job row), reading, cancelling.

Only the service touches the database. A spec is checked completely before anything is
written, so a refused spec stores nothing.

Submission and the limit on active jobs are one transaction: under a lock (PostgreSQL: a
transaction-scoped advisory lock; SQLite: `BEGIN IMMEDIATE`, the database's write lock) the
active jobs are counted, and the job row and its event are inserted only below the limit.
Concurrent submissions therefore never pass `max_concurrent_jobs`; a refused one
(`JobLimitError`) or a failed one deletes the Optuna study it created, so nothing is stored.
"""

from __future__ import annotations

import datetime as dt
import logging
import re
import uuid
from typing import Any

import optuna
from sqlalchemy import Connection, func, select, text
from sqlalchemy.orm import Session, sessionmaker

from nas_service.db import Job, JobEvent
from nas_service.db.engine import SQLITE_BUSY_TIMEOUT_S, normalise_url, pool_kwargs
from nas_service.search import create_study
from nas_service.settings import Settings
from nas_service.spec import JobSpec, check_job, parse_spec

optuna.logging.set_verbosity(optuna.logging.WARNING)
log = logging.getLogger(__name__)

ACTIVE_STATES = ("pending", "running")
#: The advisory lock key that serialises submissions on PostgreSQL ("dsubmit" in ASCII).
SUBMIT_LOCK_KEY = int.from_bytes(b"dsubmit", "big")
#: A job id as the service makes them: `str(uuid.uuid4())`.
JOB_ID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")


class JobNotFound(LookupError):
    pass


class JobStateError(RuntimeError):
    pass


class JobLimitError(RuntimeError):
    """`max_concurrent_jobs` jobs are active (pending or running); nothing was stored."""

    def __init__(self, active: int, limit: int) -> None:
        super().__init__(f"{active} jobs are active; the limit is {limit}")
        self.active, self.limit = active, limit


def optuna_storage(url: str, settings: Settings | None = None) -> optuna.storages.RDBStorage:
    """Optuna's RDB storage in the service's database (its pool bounded by `settings`)."""
    kwargs: dict[str, Any] = {}
    if url.startswith("sqlite"):
        kwargs["connect_args"] = {"timeout": SQLITE_BUSY_TIMEOUT_S}
    else:
        kwargs["pool_pre_ping"] = True
    if settings is not None:
        kwargs |= pool_kwargs(
            url, settings.db_pool_size, settings.db_max_overflow, settings.db_pool_timeout_s
        )
    return optuna.storages.RDBStorage(normalise_url(url), engine_kwargs=kwargs)


def _count_active(session: Session) -> int:
    return int(
        session.scalar(select(func.count()).select_from(Job).where(Job.status.in_(ACTIVE_STATES)))
        or 0
    )


def _lock_for_submission(conn: Connection) -> None:
    """Take the database's submission lock for the rest of this transaction."""
    if conn.dialect.name == "postgresql":
        conn.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": SUBMIT_LOCK_KEY})
    elif conn.dialect.name == "sqlite":
        # pysqlite begins a transaction only before DML (the SQLAlchemy transaction is a no-op
        # at the driver level until then), so this starts the real one, holding the write lock.
        conn.exec_driver_sql("BEGIN IMMEDIATE")


def submit_job(
    session_factory: sessionmaker[Session],
    settings: Settings,
    data: dict[str, Any] | JobSpec,
    storage: optuna.storages.BaseStorage | None = None,
) -> Job:
    """Validate `data`, then create its Optuna study and its job row (status pending).
    Raises `SpecError` for a bad spec and `JobLimitError` at `max_concurrent_jobs` active
    jobs; in either case nothing is stored."""
    spec = data if isinstance(data, JobSpec) else parse_spec(data)
    candidates = check_job(spec, settings)
    limit = settings.max_concurrent_jobs
    with session_factory() as session:  # a cheap early refusal (decided again under the lock)
        active = _count_active(session)
    if active >= limit:
        raise JobLimitError(active, limit)
    job_id = str(uuid.uuid4())
    study_name = f"depthscope-{job_id}"
    storage = storage or optuna_storage(settings.database_url, settings)
    try:
        create_study(spec, storage, study_name)
        with session_factory() as session:
            _lock_for_submission(session.connection())
            active = _count_active(session)
            if active >= limit:
                raise JobLimitError(active, limit)
            job = Job(
                id=job_id,
                name=spec.name,
                spec=spec.model_dump(mode="json"),
                study_name=study_name,
                n_trials=spec.n_trials,
            )
            job.events.append(
                JobEvent(
                    kind="submitted",
                    message=f"{len(candidates)} valid candidates, {spec.n_trials} trials",
                )
            )
            session.add(job)
            session.commit()
    except BaseException:
        _forget_study(study_name, storage)
        raise
    return job


def _forget_study(study_name: str, storage: optuna.storages.BaseStorage) -> None:
    """Delete a refused or failed submission's study (if it was made); a failure to is
    logged, and the submission's own error is the one raised."""
    try:
        optuna.delete_study(study_name=study_name, storage=storage)
    except KeyError:  # never created
        pass
    except Exception:
        log.exception("could not delete the study %s of a refused submission", study_name)


def valid_job_id(job_id: str) -> bool:
    return JOB_ID.fullmatch(job_id) is not None


def get_job(session: Session, job_id: str) -> Job:
    """The job, or `JobNotFound`; an id that is not one the service makes (not a UUID, a NUL
    byte, …) is not looked up at all."""
    if not valid_job_id(job_id):
        raise JobNotFound(job_id)
    job = session.get(Job, job_id)
    if job is None:
        raise JobNotFound(job_id)
    return job


def active_jobs(session: Session) -> list[Job]:
    return list(
        session.scalars(select(Job).where(Job.status.in_(ACTIVE_STATES)).order_by(Job.created_at))
    )


def cancel_job(session_factory: sessionmaker[Session], job_id: str) -> Job:
    """Mark a job cancelled; its runner stops the job's Ray tasks when it next looks."""
    with session_factory.begin() as session:
        job = get_job(session, job_id)
        if job.status not in ACTIVE_STATES:
            raise JobStateError(
                f"job {job_id} is {job.status}; only pending or running jobs cancel"
            )
        job.status = "cancelled"
        job.finished_at = dt.datetime.now(dt.UTC)
        job.events.append(JobEvent(kind="cancelled", message="cancelled by request"))
        return job
