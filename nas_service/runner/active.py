"""The jobs a runner drives (`ActiveJobs`): each active job it loaded (its stored spec, its
study, its corpus, its primed layouts and its scheduler), the cluster's job list (read at
most every `JOB_LIST_REFRESH_S`), and the job rows' changes of status the runner makes
(started, completed, failed), each with its event."""

from __future__ import annotations

import datetime as dt
import time
from dataclasses import dataclass, field

import optuna
from optuna.trial import TrialState
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from nas_service.search.pricing import Layouts, prime_layouts
from nas_service.search.scheduler import Scheduler, scheduler_for
from nas_service.search.study import load_study
from nas_service.settings import Settings
from nas_service.spec import CorpusLocation, JobSpec, SpecError, locate_corpus
from nas_service.store import EventKind, Job, JobEvent, JobStatus
from nas_service.store.jobs import active_jobs, stored_spec
from nas_service.store.optuna_storage import OwnedTrials
from nas_service.store.optuna_study import storage_of, study_id_of
from nas_service.store.records import TrialAttr

COUNTED = (TrialState.COMPLETE, TrialState.PRUNED, TrialState.FAIL)
#: How often the loop re-reads the cluster's active and cancelled jobs, in seconds: a job
#: submitted or cancelled is seen within it; the runner's own changes of a job's status at
#: once. (Read on every pass, the two queries were a fifth of the statements per trial at
#: 1,000 workers, where a pass follows every result.)
JOB_LIST_REFRESH_S = 1.0


class JobBroken(RuntimeError):
    """A job that cannot run at all; it is failed with this reason."""


@dataclass
class ActiveJob:
    spec: JobSpec
    study: optuna.Study
    corpus: CorpusLocation | None
    layouts: Layouts = field(default_factory=dict)  # `cost.layout: auto`: primed once
    scheduler: Scheduler = field(init=False)  # what its free slots do next

    def __post_init__(self) -> None:
        self.scheduler = scheduler_for(self.spec)


def counted(study: optuna.Study) -> int:
    """The study's finished trials that count towards `n_trials` (lost ones don't): the
    runner's storage keeps the count (`OwnedTrials.finished_count`); any other counts."""
    storage = storage_of(study)
    if isinstance(storage, OwnedTrials) and storage.uncounted == TrialAttr.LOST:
        return storage.finished_count(study_id_of(study), COUNTED)
    return sum(
        1
        for t in study.get_trials(deepcopy=False, states=COUNTED)
        if not t.user_attrs.get(TrialAttr.LOST)
    )


class ActiveJobs:
    """The jobs of cluster `cluster` the runner drives (see the module's docstring)."""

    def __init__(
        self,
        settings: Settings,
        Session: sessionmaker[Session],
        storage: optuna.storages.BaseStorage,
        cluster: str,
    ):
        self.settings = settings
        self.Session = Session
        self.storage = storage
        self.cluster = cluster
        self.loaded: dict[str, ActiveJob] = {}
        self._listed: tuple[list[Job], set[str]] | None = None  # active jobs, cancelled ids
        self._listed_at = 0.0

    def load(self, job: Job) -> ActiveJob:
        """The job as the runner drives it, loaded once; `JobBroken` for a job that cannot
        run at all (its stored spec, its corpus)."""
        if job.id not in self.loaded:
            stored = stored_spec(job)  # as the API reads it, with the same reason
            if stored.spec is None:
                raise JobBroken(f"the stored spec is no longer valid: {stored.reason}")
            spec = stored.spec
            try:
                corpus = locate_corpus(spec.training.corpus, self.settings)
            except SpecError as exc:
                raise JobBroken(str(exc)) from None
            self.loaded[job.id] = ActiveJob(
                spec,
                load_study(spec, self.storage, job.study_name),
                corpus,
                prime_layouts(spec, self.settings.max_candidates_enumerated),
            )
        return self.loaded[job.id]

    def get(self, job_id: str) -> ActiveJob | None:
        return self.loaded.get(job_id)

    def forget(self, job_id: str) -> None:
        self.loaded.pop(job_id, None)

    def listed(self) -> tuple[list[Job], set[str]]:
        """This cluster's active jobs and every cancelled job's id, read at most every
        `JOB_LIST_REFRESH_S` (and after the runner changed a job's status: `relist`)."""
        now = time.monotonic()
        if self._listed is None or now - self._listed_at >= JOB_LIST_REFRESH_S:
            with self.Session() as s:
                jobs = active_jobs(s, self.cluster)
                cancelled = set(s.scalars(select(Job.id).where(Job.status == JobStatus.CANCELLED)))
            self._listed, self._listed_at = (jobs, cancelled), now
        return self._listed

    def relist(self) -> None:
        self._listed = None

    def started(self, job_id: str, message: str) -> None:
        """A pending job runs now."""
        self._moved(job_id, JobStatus.RUNNING, EventKind.STARTED, message)

    def completed(self, job_id: str, done: int, answered: str | None = None) -> None:
        """Every trial of the job is counted, or (`answered`: why) its question is answered
        before `n_trials`; the job is forgotten."""
        message = f"{done} trials" + (f"; stopped early: {answered}" if answered else "")
        self._moved(job_id, JobStatus.COMPLETED, EventKind.COMPLETED, message)
        self.forget(job_id)

    def _moved(self, job_id: str, status: JobStatus, kind: EventKind, message: str) -> None:
        """The job's new status, stamped (started or finished), with its event."""
        with self.Session.begin() as s:
            row = s.get(Job, job_id)
            assert row is not None
            row.status = status
            now = dt.datetime.now(dt.UTC)
            if status == JobStatus.RUNNING:
                row.started_at = now
            else:
                row.finished_at = now
            row.events.append(JobEvent(kind=kind, message=message))
        self.relist()

    def failed(self, job_id: str, reason: str) -> None:
        """The job failed with `reason` (if it is still active); it is forgotten."""
        with self.Session.begin() as s:
            row = s.get(Job, job_id)
            if row is not None and row.status.active:
                row.status, row.error = JobStatus.FAILED, reason
                row.finished_at = dt.datetime.now(dt.UTC)
                row.events.append(JobEvent(kind=EventKind.FAILED, message=reason))
        self.relist()
        self.forget(job_id)
