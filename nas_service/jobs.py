"""Jobs: submission (validate, then create the study and the job row), reading, cancelling.

Only the service touches the database. A spec is checked completely before anything is
written, so a refused spec stores nothing.
"""

from __future__ import annotations

import datetime as dt
import uuid
from typing import Any

import optuna
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from nas_service.db import Job, JobEvent
from nas_service.db.engine import normalise_url
from nas_service.search import create_study
from nas_service.settings import Settings
from nas_service.spec import JobSpec, check_job, parse_spec

optuna.logging.set_verbosity(optuna.logging.WARNING)


class JobNotFound(LookupError):
    pass


class JobStateError(RuntimeError):
    pass


def optuna_storage(url: str) -> optuna.storages.RDBStorage:
    """Optuna's RDB storage in the service's database."""
    kwargs: dict[str, Any] = {}
    if url.startswith("sqlite"):
        kwargs["connect_args"] = {"timeout": 30}
    else:
        kwargs["pool_pre_ping"] = True
    return optuna.storages.RDBStorage(normalise_url(url), engine_kwargs=kwargs)


def submit_job(
    session_factory: sessionmaker[Session],
    settings: Settings,
    data: dict[str, Any] | JobSpec,
    storage: optuna.storages.BaseStorage | None = None,
) -> Job:
    """Validate `data`, then create its Optuna study and its job row (status pending).
    Raises `SpecError` (nothing stored) for a bad spec."""
    spec = data if isinstance(data, JobSpec) else parse_spec(data)
    candidates = check_job(spec, settings)
    job_id = str(uuid.uuid4())
    study_name = f"depthscope-{job_id}"
    storage = storage or optuna_storage(settings.database_url)
    create_study(spec, storage, study_name)
    try:
        with session_factory.begin() as session:
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
    except Exception:
        optuna.delete_study(study_name=study_name, storage=storage)
        raise
    return job


def get_job(session: Session, job_id: str) -> Job:
    job = session.get(Job, job_id)
    if job is None:
        raise JobNotFound(job_id)
    return job


def active_jobs(session: Session) -> list[Job]:
    return list(
        session.scalars(
            select(Job).where(Job.status.in_(("pending", "running"))).order_by(Job.created_at)
        )
    )


def cancel_job(session_factory: sessionmaker[Session], job_id: str) -> Job:
    """Mark a job cancelled; its runner stops the job's Ray tasks when it next looks."""
    with session_factory.begin() as session:
        job = get_job(session, job_id)
        if job.status not in ("pending", "running"):
            raise JobStateError(
                f"job {job_id} is {job.status}; only pending or running jobs cancel"
            )
        job.status = "cancelled"
        job.finished_at = dt.datetime.now(dt.UTC)
        job.events.append(JobEvent(kind="cancelled", message="cancelled by request"))
        return job
