"""The service's own tables. Optuna keeps its studies in the same database through its own
storage; these tables never collide with Optuna's (their own names, their own Alembic
version table: `depthscope_alembic_version`)."""

from __future__ import annotations

import datetime as dt
import enum
from typing import Any, ClassVar, Generic, TypeVar

from sqlalchemy import (
    JSON,
    DateTime,
    Dialect,
    Float,
    ForeignKey,
    Index,
    Integer,
    String,
    Text,
    TypeDecorator,
    func,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column, relationship

from nas_service.settings import LOCAL_CLUSTER, MAX_CLUSTER_NAME


class JobStatus(enum.StrEnum):
    """Where a job stands (`ds_jobs.status`)."""

    PENDING = "pending"
    RUNNING = "running"
    COMPLETED = "completed"
    FAILED = "failed"
    CANCELLED = "cancelled"

    @property
    def active(self) -> bool:
        """Pending or running: it counts against `max_concurrent_jobs` and may be cancelled."""
        return self in ACTIVE_STATES


#: The states of a job that is not finished.
ACTIVE_STATES = (JobStatus.PENDING, JobStatus.RUNNING)


class TrialOutcome(enum.StrEnum):
    """Why a trial ended, as the runner tells it (the trial's `outcome` attribute)."""

    RUNNING = "running"  # not concluded yet (shown for a trial Optuna has RUNNING)
    COMPLETED = "completed"  # trained, its values told
    PRUNED = "pruned"  # stopped early by the pruner
    INFEASIBLE = "infeasible"  # the cost model refused it; never trained
    OVER_CONSTRAINT = "over_constraint"  # a cost above a constraint; never trained
    DIVERGED = "diverged"  # its loss stopped being finite; recorded, never retried
    FAILED = "failed"  # an error (or its job failed while it ran)
    CANCELLED = "cancelled"  # its job was cancelled while it ran
    LOST = "lost"  # the runner stopped while it ran; re-enqueued, not counted


class RunState(enum.StrEnum):
    """Where one attempt at training a trial stands (`ds_trial_runs.state`). A lost worker
    closes the attempt as lost and opens the next one (the retry)."""

    RUNNING = "running"
    COMPLETED = "completed"
    PRUNED = "pruned"
    INFEASIBLE = "infeasible"
    DIVERGED = "diverged"
    FAILED = "failed"
    LOST = "lost"


class TrialStatus(enum.StrEnum):
    """An Optuna trial's state as the API shows it (`TrialState` in lower case, FAIL as
    failed): what `GET /v1/jobs/{id}/trials?state=` filters on."""

    COMPLETE = "complete"
    PRUNED = "pruned"
    FAILED = "failed"
    RUNNING = "running"
    WAITING = "waiting"

    @property
    def finished(self) -> bool:
        return self in (TrialStatus.COMPLETE, TrialStatus.PRUNED, TrialStatus.FAILED)


class EventKind(enum.StrEnum):
    """What happened to a job (`ds_job_events.kind`)."""

    SUBMITTED = "submitted"
    STARTED = "started"
    COMPLETED = "completed"
    FAILED = "failed"
    CANCELLED = "cancelled"
    TRIAL_FAILED = "trial_failed"
    TRIAL_RETRY = "trial_retry"
    TRIAL_POISONED = "trial_poisoned"
    RECOVERED = "recovered"  # trials a stopped runner left were re-enqueued
    CONCLUDED = "concluded"  # trials left running were concluded as their job's status
    RUNNER_ERROR = "runner_error"


JOB_STATES = tuple(JobStatus)
RUN_STATES = tuple(RunState)

E = TypeVar("E", bound=enum.StrEnum)


class StrEnumColumn(TypeDecorator[E], Generic[E]):
    """A `StrEnum` stored as its string (a plain `VARCHAR`, as the migrations made it), read
    back as the enum."""

    impl = String
    cache_ok = True

    def __init__(self, kind: type[E], length: int = 16) -> None:
        super().__init__(length)
        self.kind = kind

    def process_bind_param(self, value: E | str | None, dialect: Dialect) -> str | None:
        return None if value is None else self.kind(value).value

    def process_result_value(self, value: str | None, dialect: Dialect) -> E | None:
        return None if value is None else self.kind(value)


class Base(DeclarativeBase):
    type_annotation_map: ClassVar[dict[Any, Any]] = {dict[str, Any]: JSON}


def _now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


class Job(Base):
    """A search job: the validated spec (and its cluster), its Optuna study, and where it
    stands."""

    __tablename__ = "ds_jobs"

    id: Mapped[str] = mapped_column(String(36), primary_key=True)
    name: Mapped[str] = mapped_column(String(200))
    status: Mapped[JobStatus] = mapped_column(
        StrEnumColumn(JobStatus), default=JobStatus.PENDING, index=True
    )
    spec: Mapped[dict[str, Any]] = mapped_column(JSON)
    # the spec's cluster, written at submission: the runner of that cluster picks the job up
    # (`store.jobs.active_jobs`); a row that names none is the local cluster's
    cluster: Mapped[str] = mapped_column(
        String(MAX_CLUSTER_NAME), index=True, server_default=LOCAL_CLUSTER
    )
    study_name: Mapped[str] = mapped_column(String(64), unique=True)
    n_trials: Mapped[int] = mapped_column(Integer)
    error: Mapped[str | None] = mapped_column(Text, default=None)
    created_at: Mapped[dt.datetime] = mapped_column(DateTime(timezone=True), default=_now)
    updated_at: Mapped[dt.datetime] = mapped_column(
        DateTime(timezone=True), default=_now, onupdate=_now, server_default=func.now()
    )
    started_at: Mapped[dt.datetime | None] = mapped_column(DateTime(timezone=True), default=None)
    finished_at: Mapped[dt.datetime | None] = mapped_column(DateTime(timezone=True), default=None)

    events: Mapped[list[JobEvent]] = relationship(
        back_populates="job", cascade="all, delete-orphan", order_by="JobEvent.id"
    )
    runs: Mapped[list[TrialRun]] = relationship(
        back_populates="job", cascade="all, delete-orphan", order_by="TrialRun.id"
    )


class JobEvent(Base):
    """An append-only log of what happened to a job (submitted, started, trial failed, …)."""

    __tablename__ = "ds_job_events"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    job_id: Mapped[str] = mapped_column(ForeignKey("ds_jobs.id", ondelete="CASCADE"), index=True)
    at: Mapped[dt.datetime] = mapped_column(DateTime(timezone=True), default=_now)
    kind: Mapped[EventKind] = mapped_column(StrEnumColumn(EventKind, 32))
    message: Mapped[str] = mapped_column(Text, default="")
    data: Mapped[dict[str, Any] | None] = mapped_column(JSON, default=None)

    job: Mapped[Job] = relationship(back_populates="events")


class TrialRun(Base):
    """One attempt at training one Optuna trial (a lease): the runner's bookkeeping for
    retries and for recovery after a crash. A trial is done only when told to the study."""

    __tablename__ = "ds_trial_runs"
    __table_args__ = (Index("ix_ds_trial_runs_job_trial", "job_id", "trial_number"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    job_id: Mapped[str] = mapped_column(ForeignKey("ds_jobs.id", ondelete="CASCADE"))
    trial_number: Mapped[int] = mapped_column(Integer)
    attempt: Mapped[int] = mapped_column(Integer, default=1)
    state: Mapped[RunState] = mapped_column(
        StrEnumColumn(RunState), default=RunState.RUNNING, index=True
    )
    params: Mapped[dict[str, Any]] = mapped_column(JSON)
    worker: Mapped[str | None] = mapped_column(String(128), default=None)
    reason: Mapped[str | None] = mapped_column(Text, default=None)
    started_at: Mapped[dt.datetime] = mapped_column(DateTime(timezone=True), default=_now)
    finished_at: Mapped[dt.datetime | None] = mapped_column(DateTime(timezone=True), default=None)

    job: Mapped[Job] = relationship(back_populates="runs")


class RunnerLease(Base):
    """Who drives a cluster's jobs. A runner works only while it holds its cluster's lease;
    it renews the lease (`expires_at`) as it goes, and another runner takes it over only
    once it has expired. `expires_at` is wall-clock seconds since the epoch, so runners on
    different machines need synchronised clocks (NTP) within a fraction of the lease."""

    __tablename__ = "ds_runner_leases"

    cluster: Mapped[str] = mapped_column(String(64), primary_key=True)
    holder: Mapped[str] = mapped_column(String(200))
    acquired_at: Mapped[float] = mapped_column(Float)
    expires_at: Mapped[float] = mapped_column(Float)


class RunnerLife(Base):
    """One runner process's life on a cluster, from its start to how it ended: what recovery
    reads to tell a runner-only crash (which a candidate may have caused) from a graceful
    stop or the death of its whole service or host (which no candidate caused), and what
    health reads to say whether a runner's Ray is ready (`nas_service.store.lease`). Times are
    wall-clock seconds since the epoch; `pid_start` and `service_start` are the processes'
    start times in clock ticks since boot (`/proc/<pid>/stat`), which with `boot_id` name a
    process unambiguously on its host."""

    __tablename__ = "ds_runner_lives"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    cluster: Mapped[str] = mapped_column(String(64), index=True)
    holder: Mapped[str] = mapped_column(String(200), index=True)
    host: Mapped[str] = mapped_column(String(255))
    boot_id: Mapped[str | None] = mapped_column(String(64), default=None)
    pid: Mapped[int] = mapped_column(Integer)
    pid_start: Mapped[int | None] = mapped_column(Integer, default=None)
    service_pid: Mapped[int | None] = mapped_column(Integer, default=None)
    service_start: Mapped[int | None] = mapped_column(Integer, default=None)
    started_at: Mapped[float] = mapped_column(Float)
    acquired_at: Mapped[float | None] = mapped_column(Float, default=None)
    ray_ready_at: Mapped[float | None] = mapped_column(Float, default=None)
    ended_at: Mapped[float | None] = mapped_column(Float, default=None)
    # how it ended: "stopped" (a graceful stop: SIGTERM, its work done, its lease lost) or
    # "crashed" (an exception out of its loop); None: it never said (killed, or still alive)
    end: Mapped[str | None] = mapped_column(String(16), default=None)
    reason: Mapped[str | None] = mapped_column(Text, default=None)
