"""The service's own tables. Optuna keeps its studies in the same database through its own
storage; these tables never collide with Optuna's (their own names, their own Alembic
version table: `depthscope_alembic_version`)."""

from __future__ import annotations

import datetime as dt
from typing import Any, ClassVar

from sqlalchemy import JSON, DateTime, Float, ForeignKey, Index, Integer, String, Text, func
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column, relationship

JOB_STATES = ("pending", "running", "completed", "failed", "cancelled")
RUN_STATES = ("running", "completed", "pruned", "infeasible", "diverged", "failed", "lost")


class Base(DeclarativeBase):
    type_annotation_map: ClassVar[dict[Any, Any]] = {dict[str, Any]: JSON}


def _now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


class Job(Base):
    """A search job: the validated spec, its Optuna study, and where it stands."""

    __tablename__ = "ds_jobs"

    id: Mapped[str] = mapped_column(String(36), primary_key=True)
    name: Mapped[str] = mapped_column(String(200))
    status: Mapped[str] = mapped_column(String(16), default="pending", index=True)
    spec: Mapped[dict[str, Any]] = mapped_column(JSON)
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
    kind: Mapped[str] = mapped_column(String(32))
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
    state: Mapped[str] = mapped_column(String(16), default="running", index=True)
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
