"""What a runner does first: conclude what a stopped runner left running.

- A trial of a running job left RUNNING is failed, marked lost (it does not count) and
  re-enqueued with the same parameters, once: on the runner's storage all of a job's in one
  transaction (a killed runner on a cluster of 1,000 workers leaves 1,000, which one at a
  time cost 16 statements each while every worker waited); elsewhere enqueued before failed,
  so a crash in between neither loses it nor enqueues it twice. A trial asked in the pass
  of the loop the runner died in has no parameters recorded yet (the runner writes them,
  with its attributes and run row, at the pass's end): its retry is sampled afresh.
- A trial of a job cancelled (or failed) while no runner was alive is concluded as cancelled
  (or failed); nothing is re-enqueued for it. Such a job is found by its open run rows or by
  its study's trials left RUNNING (one asked in the pass the runner died in has no row).
- A poisoned trial is not retried forever: a left trial is *suspect* when the runner's
  death is one the candidate could have caused, it trained alone, and no other trial
  finished after it started. After `max_trial_recoveries` suspect stops in a row its
  candidate is failed with the reason, counted, and not re-enqueued.

  Which deaths count (`Stops`, from the runners' lives, `nas_service.store.lease`): each left
  trial belongs to the runner life that held the lease when it started. A life that ended
  gracefully (SIGTERM: a deploy, an operator's stop; its work done; its lease lost) wrote
  "stopped": no candidate caused that. One that wrote nothing was killed; on this host its
  host's boot id, its own process and the process of the service that started it tell how:
  the host restarted, or the service died with it (a whole-service SIGKILL, an OOM kill of
  the service, a host crash) — no candidate caused that either; the runner alone died while
  its service lived (or it had none) — a candidate may have (its result, its memory). A
  life that raised out of its loop ("crashed") may have been the candidate's too, and so may
  one on another host, where nothing can be checked. A stop the candidate could not have
  caused neither counts nor clears its suspect stops. And a candidate is blamed only when it
  trained alone: with several trials in flight when the runner died, none is singled out
  (a candidate that stops the runner only while others train beside it is retried with
  them; the progress of the others clears it).

  A trial trains several runs (settings × seeds), a row each; the rows of the runs it
  finished before the runner stopped stay closed as they were ("run i of n"): they are not
  a trial finishing, so they neither clear a suspect nor count, and only the trial's open
  row (its current run) is closed here.
- A multi-fidelity trial left running after it finished a rung is not re-enqueued: it
  waits again at the last rung it finished (its runs of the lost rung dropped), so the
  promotion rule promotes it again and it resumes from that rung's checkpoints; a trial
  left waiting stays as it was. The suspect count applies to it as to any trial.
"""

from __future__ import annotations

import collections
import datetime as dt
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import optuna
from optuna.trial import FrozenTrial, TrialState
from sqlalchemy import func, or_, select
from sqlalchemy.orm import Session, aliased, sessionmaker

from nas_service.runner.outcomes import conclude
from nas_service.search.rungs import records
from nas_service.store import (
    EventKind,
    Job,
    JobEvent,
    JobStatus,
    RunnerLife,
    RunState,
    TrialOutcome,
    TrialRun,
)
from nas_service.store.lease import CANDIDATE_MAY_HAVE_CAUSED, ended_how
from nas_service.store.optuna_storage import OwnedTrials
from nas_service.store.optuna_study import (
    after_trial,
    set_user_attrs,
    storage_of,
    study_id_of,
    trial_id_of,
)
from nas_service.store.records import TrialAttr, TrialRecord
from nas_service.store.trial_tables import studies_with_trials_in

log = logging.getLogger(__name__)

_FINISHED = (TrialState.COMPLETE, TrialState.PRUNED, TrialState.FAIL)
#: The run state of a trial told before its runner stopped (any other outcome: failed).
_RUN_STATE: dict[str, RunState] = {
    TrialOutcome.COMPLETED: RunState.COMPLETED,
    TrialOutcome.PRUNED: RunState.PRUNED,
    TrialOutcome.DIVERGED: RunState.DIVERGED,
}

LOST_REASON = "the runner stopped while it ran"


def jobs_to_recover(sessions: sessionmaker[Session], cluster: str) -> list[Job]:
    """This cluster's running jobs, and its finished jobs that still have a run open or a
    trial left RUNNING (a runner records a trial's run row at the end of the pass that asked
    it: one killed in between leaves a running trial with no row)."""
    with sessions() as s:
        open_runs = select(TrialRun.job_id).where(TrialRun.state == RunState.RUNNING)
        left_running = studies_with_trials_in((TrialState.RUNNING,))
        jobs = s.scalars(
            select(Job).where(
                Job.cluster == cluster,
                or_(
                    Job.status == JobStatus.RUNNING,
                    Job.id.in_(open_runs),
                    Job.study_name.in_(left_running),
                ),
            )
        ).all()
        return list(jobs)


def last_progress(s: Session) -> dt.datetime | None:
    """When a trial (any job's) last finished: the latest `finished_at` of a run row, not
    lost, that is its trial's last row. A trial trains several runs, each with its row, and
    only the last one ends it; the rows of runs closed on the way ("run i of n") are followed
    by the next run's row, so those of a trial still in flight, or lost with the runner, are
    not progress: a candidate that stops the runner in its n-th run stays suspect. One query
    for a whole recovery (`progress_since` compares each left trial's start with it)."""
    later = aliased(TrialRun)
    superseded = (
        select(later.id)
        .where(
            later.job_id == TrialRun.job_id,
            later.trial_number == TrialRun.trial_number,
            later.id > TrialRun.id,
        )
        .exists()
    )
    last = s.scalar(
        select(func.max(TrialRun.finished_at)).where(
            TrialRun.state != RunState.LOST, TrialRun.finished_at.is_not(None), ~superseded
        )
    )
    return _stored(last) if last is not None else None


def _stored(when: dt.datetime) -> dt.datetime:
    """A time the service stored (UTC; SQLite gives it back without its zone)."""
    return when.replace(tzinfo=dt.UTC) if when.tzinfo is None else when


def progress_since(last: dt.datetime | None, started: dt.datetime | None) -> bool:
    """Whether a trial finished after `started` (aware, or naive local time as Optuna
    records a trial's start), given `last_progress`."""
    if started is None:
        return True  # unknown: do not count it against the candidate
    return last is not None and last > started.astimezone(dt.UTC)


@dataclass
class Stops:
    """How the runners that left trials running stopped (see the module's docstring): this
    cluster's runner lives before the current one, and how many left trials were training
    in each."""

    lives: list[RunnerLife] = field(default_factory=list)  # by the time each took the lease
    training: collections.Counter[int] = field(default_factory=collections.Counter)
    how: dict[int, str] = field(default_factory=dict)

    @classmethod
    def read(
        cls,
        sessions: sessionmaker[Session],
        cluster: str,
        current: int | None,
        left: Sequence[tuple[Job, optuna.Study]],
    ) -> Stops:
        """The lives of `cluster`'s runners but the `current` one, and the training trials
        of the running jobs of `left` (a multi-fidelity trial waiting for promotion is not
        training)."""
        with sessions() as s:
            query = select(RunnerLife).where(
                RunnerLife.cluster == cluster, RunnerLife.acquired_at.is_not(None)
            )
            if current is not None:
                query = query.where(RunnerLife.id != current)
            lives = list(s.scalars(query.order_by(RunnerLife.acquired_at)))
            for life in lives:
                s.expunge(life)
        stops = cls(lives)
        for job, study in left:
            if job.status != JobStatus.RUNNING:
                continue
            for t in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
                started = training_start(t, sessions, job.id)
                owner = stops.life_of(started)  # None too for one waiting at a rung
                if owner is not None:
                    stops.training[owner.id] += 1
        return stops

    def life_of(self, started: dt.datetime | None) -> RunnerLife | None:
        """The life that held the lease when a trial started (the last to take it before)."""
        if started is None:
            return None
        at = started.timestamp()
        found: RunnerLife | None = None
        for life in self.lives:
            if life.acquired_at is not None and life.acquired_at <= at:
                found = life
        return found

    def blamed(self, started: dt.datetime | None) -> bool:
        """Whether a trial left training since `started` may count a suspect stop: its
        runner's death is one a candidate could have caused, and it trained alone. A trial
        with no recorded life (left by a runner of an older version) counts, as before."""
        life = self.life_of(started)
        if life is None:
            return True
        if life.id not in self.how:
            self.how[life.id] = ended_how(life)
            log.info("the runner %s before this one: %s", life.holder, self.how[life.id])
        return self.how[life.id] in CANDIDATE_MAY_HAVE_CAUSED and self.training[life.id] <= 1


def training_start(
    t: FrozenTrial, sessions: sessionmaker[Session], job_id: str
) -> dt.datetime | None:
    """When a left trial started training: its open run row's start for a multi-fidelity
    trial with rungs done (None when it is waiting), else the trial's own start."""
    if not records(t):
        return t.datetime_start.astimezone(dt.UTC) if t.datetime_start is not None else None
    return _open_run_start(sessions, job_id, t.number)


def _open_run_start(
    sessions: sessionmaker[Session], job_id: str, number: int
) -> dt.datetime | None:
    """The start of trial `number`'s open (RUNNING) run row, if it has one."""
    with sessions() as s:
        started = s.scalar(
            select(func.max(TrialRun.started_at)).where(
                TrialRun.job_id == job_id,
                TrialRun.trial_number == number,
                TrialRun.state == RunState.RUNNING,
            )
        )
    return _stored(started) if started is not None else None


def recover_job(
    job: Job,
    study: optuna.Study,
    sessions: sessionmaker[Session],
    max_suspect: int,
    event: Callable[[str, EventKind, str, dict[str, Any] | None], None],
    stops: Stops | None = None,
) -> int:
    """Conclude `job`'s trials left RUNNING; returns how many were re-enqueued. `stops`
    (None: every stop may count, the rule before runner lives were recorded) says which
    stops may count against a candidate."""
    left = study.get_trials(deepcopy=False, states=(TrialState.RUNNING,))
    requeued, poisoned = 0, []
    if job.status == JobStatus.RUNNING:
        retried = {t.user_attrs.get(TrialAttr.RETRY_OF) for t in study.get_trials(deepcopy=False)}
        with sessions() as s:
            last = last_progress(s) if left else None
        for t in [t for t in left if records(t)]:  # multi-fidelity: back to its last rung
            if _resume(study, t, sessions, job.id, max_suspect, last, stops):
                poisoned.append(t.number)
        left = [t for t in left if not records(t)]
        lost: list[tuple[FrozenTrial, int]] = []
        for t in left:
            suspect = _suspect_after(t, t.datetime_start, last, stops)
            if suspect >= max_suspect:
                reason = (
                    f"poisoned: the runner stopped {suspect} times in a row while this "
                    "candidate ran, with no other trial finishing in between"
                )
                conclude(study, t, TrialOutcome.FAILED, reason, TrialState.FAIL)
                poisoned.append(t.number)
                continue
            lost.append((t, suspect))
        _requeue(study, lost, retried)
        requeued = len(lost)
        run_state, run_reason = RunState.LOST, LOST_REASON
    else:
        cancelled = job.status == JobStatus.CANCELLED
        outcome = TrialOutcome.CANCELLED if cancelled else TrialOutcome.FAILED
        for t in left:
            reason = f"job {job.status} while no runner was alive"
            conclude(study, t, outcome, reason, TrialState.FAIL)
        run_state, run_reason = RunState.FAILED, f"job {job.status}"
    left_numbers = {t.number for t in left}
    concluded = {
        t.number: t for t in study.get_trials(deepcopy=False, states=_FINISHED)
    }  # told before the runner stopped, its run row not closed yet
    with sessions.begin() as s:
        for run in s.scalars(
            select(TrialRun).where(TrialRun.job_id == job.id, TrialRun.state == RunState.RUNNING)
        ):
            run.finished_at = dt.datetime.now(dt.UTC)
            if run.trial_number in poisoned:
                run.state, run.reason = RunState.FAILED, "poisoned"
            elif run.trial_number in concluded and run.trial_number not in left_numbers:
                t = concluded[run.trial_number]
                told = str(t.user_attrs.get(TrialAttr.OUTCOME))
                run.state = _RUN_STATE.get(told, RunState.FAILED)
                run.reason = str(t.user_attrs.get(TrialAttr.REASON, ""))
            else:
                run.state, run.reason = run_state, run_reason
    if requeued:
        event(job.id, EventKind.RECOVERED, f"re-enqueued {requeued} trials left running", None)
    if poisoned:
        event(
            job.id,
            EventKind.TRIAL_POISONED,
            f"trials {', '.join(map(str, poisoned))} failed: the runner stopped while each ran",
            {"trials": poisoned},
        )
    if left and job.status != JobStatus.RUNNING:
        event(
            job.id,
            EventKind.CONCLUDED,
            f"{len(left)} trials left running concluded as {job.status}",
            None,
        )
    return requeued


def _requeue(study: optuna.Study, lost: list[tuple[FrozenTrial, int]], retried: set[Any]) -> None:
    """Each lost trial (with its suspect count) re-enqueued with its parameters, unless a
    retry of it exists already, then concluded as lost: enqueued before failed, so a crash
    in between neither loses it nor enqueues it twice. On the runner's storage all of them
    in one transaction (`OwnedTrials.requeue_lost`: the same rows, a few statements in all),
    the sampler told of each failure first, as `tell` tells it; elsewhere (or should a
    trial have been concluded meanwhile) a trial at a time — on the runner's storage
    without telling the sampler again (`_fail_lost`)."""
    attrs = TrialRecord(lost=True, outcome=str(TrialOutcome.LOST), reason=LOST_REASON).to_attrs()
    retries = [
        (dict(t.params), TrialRecord(retry_of=t.number, suspect=suspect).to_attrs())
        for t, suspect in lost
        if t.number not in retried
    ]
    storage = storage_of(study)
    told = lost and isinstance(storage, OwnedTrials)
    failure: Exception | None = None
    if told:
        assert isinstance(storage, OwnedTrials)
        for t, _ in lost:
            try:
                after_trial(study, t, TrialState.FAIL)
            except Exception as exc:  # as in `tell`: the state is written all the same
                failure = failure or exc
        try:
            storage.requeue_lost(
                study_id_of(study), [(trial_id_of(t), attrs) for t, _ in lost], retries
            )
        except optuna.exceptions.UpdateFinishedTrialError as exc:
            log.info("a trial left running was concluded meanwhile (%s): one at a time", exc)
        else:
            if failure is not None:
                raise failure
            return
    for t, suspect in lost:
        if t.number not in retried:
            study.enqueue_trial(
                dict(t.params),
                user_attrs=TrialRecord(retry_of=t.number, suspect=suspect).to_attrs(),
            )
        if told:  # the sampler was told already
            _fail_lost(study, t, attrs)
        else:
            conclude(
                study,
                t,
                TrialOutcome.LOST,
                LOST_REASON,
                TrialState.FAIL,
                attrs=TrialRecord(lost=True).to_attrs(),
            )
    if failure is not None:
        raise failure


def _fail_lost(study: optuna.Study, t: FrozenTrial, attrs: dict[str, Any]) -> None:
    """A lost trial concluded as `conclude` concludes it (its attributes, then FAIL), without
    the sampler's hook, which `_requeue` called already; one concluded meanwhile is left as
    it is."""
    try:
        set_user_attrs(study, t, attrs)
        storage_of(study).set_trial_state_values(trial_id_of(t), TrialState.FAIL)
    except optuna.exceptions.UpdateFinishedTrialError as exc:
        log.info("trial %d was concluded already: %s", t.number, exc)


def _resume(
    study: optuna.Study,
    t: FrozenTrial,
    sessions: sessionmaker[Session],
    job_id: str,
    max_suspect: int,
    progressed: dt.datetime | None,
    stops: Stops | None = None,
) -> bool:
    """A multi-fidelity trial left running with rungs done (`nas_service.search.rungs`): one that
    was training a rung when the runner stopped waits again at the last rung it finished (its
    runs of the lost rung dropped from `train`), so the promotion rule promotes it again and
    it resumes from that rung's checkpoints; one waiting already stays as it is. A trial the
    runner stopped in `max_suspect` times in a row, with no other trial finishing in between
    (`progressed`: `last_progress`), is failed as poisoned (True)."""
    recs = records(t)
    last = recs[-1]
    waiting = t.user_attrs.get(TrialAttr.WAITING) == last.get("rung") and not last.get("promoted")
    started = _open_run_start(sessions, job_id, t.number)
    if waiting and started is None:
        return False
    suspect = _suspect_after(t, started, progressed, stops)
    if suspect >= max_suspect:
        reason = (
            f"poisoned: the runner stopped {suspect} times in a row while this "
            "candidate ran, with no other trial finishing in between"
        )
        conclude(study, t, TrialOutcome.FAILED, reason, TrialState.FAIL)
        return True
    rung = int(last.get("rung", 0))
    train = t.user_attrs.get(TrialAttr.TRAIN, [])
    kept = [r for r in train if isinstance(r, dict) and int(r.get("rung", 0)) <= rung]
    storage, tid = storage_of(study), trial_id_of(t)
    storage.set_trial_user_attr(tid, TrialAttr.SUSPECT, suspect)
    storage.set_trial_user_attr(tid, TrialAttr.TRAIN, kept)
    storage.set_trial_user_attr(tid, TrialAttr.RUNGS, [*recs[:-1], last | {"promoted": False}])
    storage.set_trial_user_attr(tid, TrialAttr.WAITING, rung)
    return False


def _suspect_after(
    t: FrozenTrial, started: dt.datetime | None, last: dt.datetime | None, stops: Stops | None
) -> int:
    """The trial's suspect stops in a row after this stop: none once another trial finished
    after it started; one more if this stop may count against it; else as many as before."""
    if progress_since(last, started):
        return 0
    if stops is None or stops.blamed(started.astimezone(dt.UTC) if started else None):
        return _suspect(t) + 1
    return _suspect(t)


def _suspect(t: FrozenTrial) -> int:
    value = t.user_attrs.get(TrialAttr.SUSPECT, 0)
    return value if isinstance(value, int) else 0


def record_event(sessions: sessionmaker[Session]) -> Callable[..., None]:
    """`event(job_id, kind, message, data=None)`: one event, in a transaction of its own."""

    def event(
        job_id: str, kind: EventKind, message: str, data: dict[str, Any] | None = None
    ) -> None:
        with sessions.begin() as s:
            s.add(JobEvent(job_id=job_id, kind=kind, message=message, data=data))

    return event
