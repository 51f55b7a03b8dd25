"""Jobs: submission (validate, then create the study and the job row), reading, listing,
cancelling.

Only the service touches the database. A spec is checked completely before anything is
written, so a refused spec stores nothing. These functions take the caller's `Session` and
never commit: the caller's transaction boundary does (`db.unit_of_work`, the API's session
dependency); `submit` and `cancel` are such boundaries for callers without one.

Submission and the limit on active jobs are one transaction: under a lock (PostgreSQL: a
transaction-scoped advisory lock; SQLite: `BEGIN IMMEDIATE`, the database's write lock) the
active jobs are counted, and the job row and its event are inserted only below the limit.
Concurrent submissions therefore never pass `max_concurrent_jobs`; a refused one
(`JobLimitError`) or a failed one deletes the Optuna study it created, so nothing is stored:
the lock is held until the caller commits, and a transaction that does not commit deletes
the study (`db.on_rollback`).
"""

from __future__ import annotations

import datetime as dt
import logging
import uuid
from typing import Any

import optuna
from sqlalchemy import Connection, func, select, text
from sqlalchemy.orm import Session, sessionmaker

from nas_service.search.study import create_study
from nas_service.settings import Settings
from nas_service.spec import (
    CALIBRATED,
    JobSpec,
    SpecError,
    StepCalibration,
    check_job,
    parse_spec,
)
from nas_service.store import (
    ACTIVE_STATES,
    EventKind,
    Job,
    JobEvent,
    JobStatus,
    on_rollback,
    unit_of_work,
)
from nas_service.store.jobs import get_job, optuna_storage

optuna.logging.set_verbosity(optuna.logging.WARNING)
log = logging.getLogger(__name__)

#: The advisory lock key that serialises submissions on PostgreSQL ("dsubmit" in ASCII).
SUBMIT_LOCK_KEY = int.from_bytes(b"dsubmit", "big")


class JobStateError(RuntimeError):
    pass


class JobLimitError(RuntimeError):
    """`max_concurrent_jobs` jobs are active (pending or running); nothing was stored."""

    def __init__(self, active: int, limit: int) -> None:
        super().__init__(f"{active} jobs are active; the limit is {limit}")
        self.active, self.limit = active, limit


def _count_active(session: Session) -> int:
    return int(
        session.scalar(select(func.count()).select_from(Job).where(Job.status.in_(ACTIVE_STATES)))
        or 0
    )


def _lock_for_submission(conn: Connection) -> None:
    """Take the database's submission lock for the rest of this transaction."""
    if conn.dialect.name == "postgresql":
        conn.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": SUBMIT_LOCK_KEY})
    elif conn.dialect.name == "sqlite" and not getattr(
        conn.connection.dbapi_connection, "in_transaction", False
    ):
        # pysqlite begins a transaction only before DML (the SQLAlchemy transaction is a no-op
        # at the driver level until then), so this starts the real one, holding the write lock.
        # One begun already by the caller's DML holds that lock already.
        conn.exec_driver_sql("BEGIN IMMEDIATE")


def submit_job(
    session: Session,
    settings: Settings,
    data: dict[str, Any] | JobSpec,
    storage: optuna.storages.BaseStorage | None = None,
) -> Job:
    """Validate `data`, then create its Optuna study and its job row (status pending) in
    `session`'s transaction, which holds the submission lock from the limit check on until
    the caller commits. Raises `SpecError` for a bad spec and `JobLimitError` at
    `max_concurrent_jobs` active jobs; in either case, or when the transaction is rolled
    back instead of committed, nothing is stored: the study is deleted after the rollback,
    so the session must come from a `db.unit_of_work` (the API's session dependency is
    one; `submit` is one)."""
    spec = data if isinstance(data, JobSpec) else parse_spec(data)
    candidates = check_job(spec, settings)
    storage = storage or optuna_storage(settings.database_url, settings)
    spec = with_calibration(session, storage, spec)
    limit = settings.max_concurrent_jobs
    owned = not session.in_transaction()
    active = _count_active(session)  # a cheap early refusal (decided again under the lock)
    if owned:  # end this read (nothing else is in it): no connection held while the study is made
        session.rollback()
    if active >= limit:
        raise JobLimitError(active, limit)
    job_id = str(uuid.uuid4())
    study_name = f"depthscope-{job_id}"
    try:
        create_study(spec, storage, study_name)
    except BaseException:
        _forget_study(study_name, storage)
        raise
    # from here on the study goes when the transaction does not commit: after its rollback,
    # which gives the lock back (deleting it under the lock would wait for ourselves)
    on_rollback(session, lambda: _forget_study(study_name, storage))
    _lock_for_submission(session.connection())
    active = _count_active(session)
    if active >= limit:
        raise JobLimitError(active, limit)
    job = Job(
        id=job_id,
        name=spec.name,
        spec=spec.model_dump(mode="json"),
        cluster=spec.cluster,
        study_name=study_name,
        n_trials=spec.n_trials,
    )
    job.events.append(
        JobEvent(
            kind=EventKind.SUBMITTED,
            message=f"{len(candidates)} valid candidates, {spec.n_trials} trials",
        )
    )
    session.add(job)
    session.flush()
    return job


def with_calibration(
    session: Session, storage: optuna.storages.BaseStorage, spec: JobSpec
) -> JobSpec:
    """A spec that names `calibrated_step_time_s` (an objective or a constraint) without a
    `cost.calibration` takes its cluster's fit for its hardware now, stored with the job (so
    every trial of the job is priced by the same factors); refused, naming where the metric
    is named, while the cluster has fewer than `MIN_TRIALS` measured trials there."""
    named = [("objectives", m) for m in spec.objectives if m == CALIBRATED]
    named += [
        (f"constraints.{i}.metric", c.metric)
        for i, c in enumerate(spec.constraints)
        if c.metric == CALIBRATED
    ]
    if not named or spec.cost.calibration is not None:
        return spec
    from cost_model.calibration import MIN_TRIALS
    from nas_service.results.calibration import cluster_fit

    fit = cluster_fit(session, storage, spec.cluster, spec.cost.hardware)
    if fit.model is None:
        reason = (
            f"cluster {spec.cluster!r} has {fit.trials} measured trials on {spec.cost.hardware}; "
            f"{CALIBRATED} needs {MIN_TRIALS} (or give cost.calibration)"
        )
        raise SpecError([(named[0][0], reason)])
    calibration = StepCalibration(
        compute_factor=fit.model.compute_factor,
        memory_factor=fit.model.memory_factor,
        overhead_s=fit.model.overhead_s,
        device_kind=", ".join(fit.device_kinds),
        trials=fit.trials,
    )
    return spec.model_copy(
        update={"cost": spec.cost.model_copy(update={"calibration": calibration})}
    )


def submit(
    sessions: sessionmaker[Session],
    settings: Settings,
    data: dict[str, Any] | JobSpec,
    storage: optuna.storages.BaseStorage | None = None,
) -> Job:
    """`submit_job` as one committed transaction (for callers without a boundary of their
    own: the runner's tests, the benchmarks)."""
    with unit_of_work(sessions) as session:
        return submit_job(session, settings, data, storage)


def _forget_study(study_name: str, storage: optuna.storages.BaseStorage) -> None:
    """Delete a refused or failed submission's study (if it was made); a failure to is
    logged, and the submission's own error is the one raised."""
    try:
        optuna.delete_study(study_name=study_name, storage=storage)
    except KeyError:  # never created
        pass
    except Exception:
        log.exception("could not delete the study %s of a refused submission", study_name)


def cancel_job(session: Session, job_id: str) -> Job:
    """Mark a job cancelled (in the caller's transaction); its runner stops the job's Ray
    tasks when it next looks."""
    job = get_job(session, job_id)
    if not job.status.active:
        raise JobStateError(f"job {job_id} is {job.status}; only pending or running jobs cancel")
    job.status = JobStatus.CANCELLED
    job.finished_at = dt.datetime.now(dt.UTC)
    job.events.append(JobEvent(kind=EventKind.CANCELLED, message="cancelled by request"))
    session.flush()
    return job


def cancel(sessions: sessionmaker[Session], job_id: str) -> Job:
    """`cancel_job` as one committed transaction."""
    with unit_of_work(sessions) as session:
        return cancel_job(session, job_id)
