"""The jobs table read by the service's parts: a job by id, its stored spec (`stored_spec`:
the one way any part reads it), the active jobs, a page of jobs, and Optuna's storage in the
same database. Writing jobs (submit, cancel) is `nas_service.jobs`."""

from __future__ import annotations

import collections
import logging
import re
import threading
from typing import Any

import optuna
from sqlalchemy import func, select
from sqlalchemy.orm import Session

from nas_service.settings import Settings
from nas_service.spec import StoredSpec, read_stored
from nas_service.store.engine import SQLITE_BUSY_TIMEOUT_S, normalise_url, pool_kwargs
from nas_service.store.tables import ACTIVE_STATES, Job, JobStatus

#: A job id as the service makes them: `str(uuid.uuid4())`.
JOB_ID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")


log = logging.getLogger(__name__)


class JobNotFound(LookupError):
    pass


#: Stored specs read back, per job id, at most (`stored_spec`).
STORED_SPECS = 4096
_stored: collections.OrderedDict[str, StoredSpec] = collections.OrderedDict()
_stored_lock = threading.Lock()


def stored_spec(job: Job) -> StoredSpec:
    """The job's spec as stored, read back (`spec.read_stored`: never the layout search of
    `layout: auto`, counted at submission) once per process: a job's spec never changes
    after its submission. A row this version no longer reads carries the reason (`reason`,
    `spec` None). Every part of the service reads a job's spec through this: the API, the
    results and the runner alike."""
    with _stored_lock:
        hit = _stored.get(job.id)
        if hit is not None:
            _stored.move_to_end(job.id)
            return hit
    read = read_stored(job.spec)
    if read.spec is None:
        log.warning("job %s: its stored spec is no longer valid: %s", job.id, read.reason)
    with _stored_lock:
        _stored[job.id] = read
        while len(_stored) > STORED_SPECS:
            _stored.popitem(last=False)
    return read


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


def active_jobs(session: Session, cluster: str | None = None) -> list[Job]:
    """The pending and running jobs, oldest first; with `cluster`, that cluster's only."""
    query = select(Job).where(Job.status.in_(ACTIVE_STATES))
    if cluster is not None:
        query = query.where(Job.cluster == cluster)
    return list(session.scalars(query.order_by(Job.created_at)))


def list_jobs(
    session: Session, status: JobStatus | None = None, limit: int = 50, offset: int = 0
) -> tuple[list[Job], int]:
    """A page of jobs, newest first, optionally of one status, and how many there are."""
    query = select(Job)
    if status is not None:
        query = query.where(Job.status == status)
    total = session.scalar(select(func.count()).select_from(query.subquery())) or 0
    page = session.scalars(query.order_by(Job.created_at.desc()).limit(limit).offset(offset))
    return list(page), total
