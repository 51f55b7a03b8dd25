"""The job loop: keeps up to `max_concurrent` trials of every active job in flight on Ray,
streams each candidate's validation losses back while it trains, prunes the hopeless,
retries candidates whose worker died, and resumes after a crash. A trial trains every
setting of its `tune` grid (one without) at every seed, one run after the other in its slot,
and records each run as it finishes (`nas_service.runner.outcomes`).

With a `fidelity` section (ASHA, Hyperband brackets) a slot that frees promotes the best
waiting trial of the highest rung first, and asks a new trial only when none can go on;
trials that can never be promoted are told pruned as soon as that is certain, and those
still waiting when nothing else is left at the end (`nas_service.search.rungs`).

Only this process touches the database; workers are stateless. A trial is done only when
told to the study. A runner drives a cluster only while it holds the cluster's lease
(`nas_service.store.lease`), so two runners never drive one cluster. On start it concludes what a
stopped runner left running (`nas_service.runner.recovery`), so a job finishes with exactly
`n_trials` counted trials, none duplicated, none lost.

Faults stay where they happen: an exception while preparing, pricing, launching or
concluding one trial fails that trial with the reason and an event; a job whose trials keep
raising (`max_job_errors`) is failed; a job that cannot run at all (its stored spec, its
corpus, more CPUs per trial than any node has) is failed at once with the reason. None of
these stops the runner or another job. A database outage pauses the loop, which resumes
where it was when the database answers again; an artifact store that fails a write pauses
the job, which is retried with back-off and failed after `store_retries` faults in a row,
never its candidates (`nas_service.runner.outcomes`).

The runner records its life (`nas_service.store.lease.Life`): when it took the lease, when its
Ray was ready (health reads it; `ray.init` has a deadline, `nas_service.runner.cluster`), and how
it ended (a graceful stop, a crash), which recovery reads to blame a candidate only for a
runner death it could have caused.

Run it with `depthscope runner` (or `python -m nas_service.runner.loop`).
"""

from __future__ import annotations

import argparse
import collections
import datetime as dt
import logging
import os
import signal
import sys
import time
from dataclasses import dataclass, field
from typing import Any

import optuna
from optuna.trial import TrialState
from sqlalchemy import select

from nas_service.runner.backend import Backend, RayBackend
from nas_service.runner.cluster import RayUnavailable, connect_ray, ray_init_pending
from nas_service.runner.failures import describe, is_database_outage
from nas_service.runner.outcomes import MAX_ATTEMPTS, Flight, TrialOutcomes, conclude
from nas_service.runner.recovery import Stops, jobs_to_recover, record_event, recover_job
from nas_service.search.rungs import Waiting, records
from nas_service.search.scheduler import Resume, Scheduler, scheduler_for
from nas_service.search.study import (
    Layouts,
    load_study,
    price_candidate,
    prime_layouts,
    suggest,
    tune_settings,
)
from nas_service.settings import LOCAL_CLUSTER, Settings, get_settings
from nas_service.spec import CorpusLocation, JobSpec, SpecError, locate_corpus
from nas_service.store import (
    EventKind,
    Job,
    JobEvent,
    JobStatus,
    RunState,
    TrialOutcome,
    make_engine,
    make_sessionmaker,
    upgrade,
)
from nas_service.store.jobs import active_jobs, optuna_storage, stored_spec
from nas_service.store.lease import CRASHED, STOPPED, Lease, LeaseLost, Life
from nas_service.store.optuna_compat import check_optuna
from nas_service.store.optuna_storage import OwnedTrials, set_user_attrs
from nas_service.store.records import TrialAttr, TrialRecord
from workers.contract import EvalPoint, TrainResult

__all__ = ["MAX_ATTEMPTS", "Runner", "connect_ray", "main"]

log = logging.getLogger(__name__)

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


class Runner(TrialOutcomes):
    """Drives every active job on one Ray cluster (`cluster`, a name from the settings).
    With `watch_parent`, it stops when the process that started it dies (`depthscope serve`
    starts its runners so). `backend` runs the training (default: `RayBackend` on the
    cluster; `nas_service.runner.simulated.SimulatedBackend` replays a landscape)."""

    def __init__(
        self,
        settings: Settings,
        cluster: str = LOCAL_CLUSTER,
        watch_parent: bool = False,
        backend: Backend | None = None,
    ):
        if cluster not in settings.clusters:
            raise ValueError(f"cluster: unknown {cluster!r}")
        self.settings = settings
        self.cluster = cluster
        self.backend: Backend = backend or RayBackend(
            settings.clusters[cluster], settings.ray_connect_timeout_s
        )
        self.engine = make_engine(settings.database_url)
        self.Session = make_sessionmaker(self.engine)
        # it owns its jobs' unfinished trials (the lease): re-read only those it wrote
        self.storage: optuna.storages.BaseStorage = OwnedTrials(
            optuna_storage(settings.database_url), uncounted=TrialAttr.LOST
        )
        self.lease = Lease(self.Session, cluster, settings.runner_lease_s)
        self.flights: list[Flight] = []
        self.jobs: dict[str, ActiveJob] = {}
        self.errors: collections.Counter[str] = collections.Counter()
        self.store_faults: collections.Counter[str] = collections.Counter()
        self.parked: list[tuple[float, Flight]] = []  # paused after a store fault
        self.backlog: list[tuple[Flight, Any]] = []  # results the database has not taken yet
        self._unrecorded = []
        self.parent = os.getppid() if watch_parent else None
        self.life = Life(self.Session, cluster, self.lease.holder, service_pid=self.parent)
        self._listed: tuple[list[Job], set[str]] | None = None  # active jobs, cancelled ids
        self._listed_at = 0.0
        self._event = record_event(self.Session)

    # -- bookkeeping ---------------------------------------------------------------------
    def _job(self, job: Job) -> ActiveJob:
        if job.id not in self.jobs:
            stored = stored_spec(job)  # as the API reads it, with the same reason
            if stored.spec is None:
                raise JobBroken(f"the stored spec is no longer valid: {stored.reason}")
            spec = stored.spec
            try:
                corpus = locate_corpus(spec.training.corpus, self.settings)
            except SpecError as exc:
                raise JobBroken(str(exc)) from None
            self.jobs[job.id] = ActiveJob(
                spec,
                load_study(spec, self.storage, job.study_name),
                corpus,
                prime_layouts(spec, self.settings.max_candidates_enumerated),
            )
        return self.jobs[job.id]

    @staticmethod
    def counted(study: optuna.Study) -> int:
        """The study's finished trials that count towards `n_trials` (lost ones don't): the
        runner's storage keeps the count (`OwnedTrials.finished_count`); any other counts."""
        storage = study._storage
        if isinstance(storage, OwnedTrials) and storage.uncounted == TrialAttr.LOST:
            return storage.finished_count(study._study_id, COUNTED)
        return sum(
            1
            for t in study.get_trials(deepcopy=False, states=COUNTED)
            if not t.user_attrs.get(TrialAttr.LOST)
        )

    # -- recovery ------------------------------------------------------------------------
    def recover(self) -> int:
        """Conclude what a stopped runner left running (see `nas_service.runner.recovery`)."""
        left = []
        for job in jobs_to_recover(self.Session, self.cluster):
            try:
                study = self._job(job).study
            except JobBroken:
                study = optuna.load_study(study_name=job.study_name, storage=self.storage)
            left.append((job, study))
        stops = Stops.read(self.Session, self.cluster, self.life.id, left)
        requeued = 0
        for job, study in left:
            requeued += recover_job(
                job,
                study,
                self.Session,
                self.settings.max_trial_recoveries,
                self._event,
                stops,
            )
        return requeued

    # -- the loop ------------------------------------------------------------------------
    def run(
        self, until_idle: bool = True, timeout_s: float | None = None, poll_s: float = 0.5
    ) -> None:
        """Work until every active job of this cluster is finished (`until_idle`) or forever."""
        start = time.monotonic()

        def check_time() -> None:
            if timeout_s is not None and time.monotonic() - start > timeout_s:
                raise TimeoutError(f"runner still busy after {timeout_s}s")

        self._until_database(self.life.begin, check_time)
        ended, why = STOPPED, None
        try:
            self._acquire(check_time, poll_s)
            self._until_database(lambda: self.life.mark(acquired_at=time.time()), check_time)
            self.backend.connect()
            self._until_database(lambda: self.life.mark(ray_ready_at=time.time()), check_time)
            self._until_database(self.recover, check_time)
            outage = 0
            while True:
                check_time()
                if self._orphaned():
                    log.warning("the service that started this runner is gone; stopping")
                    return
                try:
                    if self.lease.renew_due():
                        self.lease.renew()
                    self._drain_backlog()
                    busy = self._schedule()
                    if not busy and not self.flights and until_idle:
                        return
                    if self.flights:
                        self._poll(poll_s)
                    else:
                        time.sleep(poll_s)
                    outage = 0
                except LeaseLost:
                    log.error("cluster %s: lease taken by another runner; stopping", self.cluster)
                    self._abandon_flights()
                    raise
                except Exception as exc:
                    if not is_database_outage(exc):
                        raise
                    outage += 1
                    log.warning("database unavailable (%s); retrying", describe(exc))
                    time.sleep(min(10.0, poll_s * 2**outage))
        except (KeyboardInterrupt, SystemExit, LeaseLost, TimeoutError):  # a graceful stop
            raise
        except BaseException as exc:  # its own crash, which a candidate may have caused
            ended, why = CRASHED, describe(exc)
            raise
        finally:
            try:
                self.lease.release()
            except Exception as exc:  # the lease expires by itself
                log.warning("could not release the lease: %s", describe(exc))
            self.backend.shutdown()
            try:
                self.life.end(ended, why)
            except Exception as exc:  # unrecorded: recovery tells from the processes
                log.warning("could not record how this runner ended: %s", describe(exc))

    def _acquire(self, check_time: Any, poll_s: float) -> None:
        """Wait until this runner holds the cluster's lease."""
        waited = False
        while True:
            check_time()
            try:
                if self.lease.try_acquire():
                    if waited:
                        log.info("cluster %s: lease acquired", self.cluster)
                    return
                if not waited:
                    log.info(
                        "cluster %s is driven by %s; waiting for its lease",
                        self.cluster,
                        self.lease.current_holder(),
                    )
                waited = True
            except Exception as exc:
                if not is_database_outage(exc):
                    raise
                log.warning("database unavailable (%s); retrying", describe(exc))
            if self._orphaned():
                raise SystemExit("the service that started this runner is gone")
            time.sleep(max(poll_s, min(5.0, self.lease.duration_s / 3)))

    def _until_database(self, step: Any, check_time: Any) -> Any:
        delay = 0.5
        while True:
            check_time()
            try:
                return step()
            except Exception as exc:
                if not is_database_outage(exc):
                    raise
                log.warning("database unavailable (%s); retrying", describe(exc))
                time.sleep(delay)
                delay = min(10.0, delay * 2)

    def _orphaned(self) -> bool:
        return self.parent is not None and os.getppid() != self.parent

    def _job_list(self) -> tuple[list[Job], set[str]]:
        """This cluster's active jobs and every cancelled job's id, read at most every
        `JOB_LIST_REFRESH_S` (and after the runner changed a job's status: `_relist`)."""
        now = time.monotonic()
        if self._listed is None or now - self._listed_at >= JOB_LIST_REFRESH_S:
            with self.Session() as s:
                jobs = active_jobs(s, self.cluster)
                cancelled = set(s.scalars(select(Job.id).where(Job.status == JobStatus.CANCELLED)))
            self._listed, self._listed_at = (jobs, cancelled), now
        return self._listed

    def _relist(self) -> None:
        self._listed = None

    def _schedule(self) -> bool:
        """Start trials where there is room; finish and cancel jobs. True while jobs remain."""
        jobs, cancelled_ids = self._job_list()
        waiting = {j for j, a in self.jobs.items() if a.scheduler.pauses}
        flying = {f.job_id for f in self.flights} | {f.job_id for _, f in self.parked}
        cancelled = cancelled_ids & (flying | waiting)
        for job_id in cancelled:
            self._cancel_flights(job_id, TrialOutcome.CANCELLED, "job cancelled")
        for job in jobs:
            try:
                self._schedule_job(job)
            except Exception as exc:
                if is_database_outage(exc) or isinstance(exc, LeaseLost):
                    raise
                self._job_error(job.id, exc, fatal=isinstance(exc, JobBroken))
        self._record_asked()
        return bool(jobs)

    def _schedule_job(self, job: Job) -> None:
        active = self._job(job)
        spec, study = active.spec, active.study
        if job.status == JobStatus.PENDING:
            self._check_resources(spec)
            with self.Session.begin() as s:
                row = s.get(Job, job.id)
                assert row is not None
                row.status, row.started_at = JobStatus.RUNNING, dt.datetime.now(dt.UTC)
                started = f"on cluster {self.cluster}{active.scheduler.start_note()}"
                row.events.append(JobEvent(kind=EventKind.STARTED, message=started))
            self._relist()
        if self._relaunch_parked(job.id):
            return  # paused: the artifact store failed one of its runs (`_store_fault`)
        done = self.counted(study)
        mine = [f for f in self.flights if f.job_id == job.id]
        scheduler = active.scheduler
        scheduler.observe(study, {f.trial.number for f in mine})
        while len(mine) < spec.max_concurrent:
            if self.errors[job.id] >= self.settings.max_job_errors:
                return
            slot = scheduler.next_slot(done, len(mine))
            if slot is None:
                break
            if isinstance(slot, Resume):
                flight = self._promote(job.id, active, slot.waiting)
            else:
                flight = self._ask(job.id, active)
            if flight is None:
                done += 1
            else:
                mine.append(flight)
        done += self._stop_waiting(job.id, active, idle=not mine)
        if done >= spec.n_trials and not mine and not scheduler.waiting:
            with self.Session.begin() as s:
                row = s.get(Job, job.id)
                assert row is not None
                row.status, row.finished_at = JobStatus.COMPLETED, dt.datetime.now(dt.UTC)
                row.events.append(JobEvent(kind=EventKind.COMPLETED, message=f"{done} trials"))
            self._relist()
            self.jobs.pop(job.id, None)
            if scheduler.pauses:
                self.forget_checkpoints(job.id)

    # -- multi-fidelity (nas_service.search.scheduler) -------------------------------------

    def _promote(self, job_id: str, active: ActiveJob, w: Waiting) -> Flight | None:
        """Train the next rung of a waiting trial: its record marked promoted, then its
        run row, then the run launched from the checkpoints of the rung it reached."""
        spec, study = active.spec, active.study
        trial = optuna.Trial(study, w.trial._trial_id)
        number = w.trial.number
        try:
            recs = records(w.trial)
            recs[-1] = recs[-1] | {"promoted": True}
            promoted = TrialRecord(rungs=recs, nulls=frozenset({TrialAttr.WAITING}))
            set_user_attrs(study, trial, promoted.to_attrs())
            params = dict(w.trial.params)
            priced = price_candidate(spec, params, corpus=active.corpus, layouts=active.layouts)
            if priced.train_spec is None:
                raise RuntimeError(f"the candidate is no longer trainable: {priced.reason}")
            settings = tune_settings(spec, params)
            earlier = list(w.trial.user_attrs.get(TrialAttr.TRAIN, []))
            run_id = self._new_run(job_id, number, params, attempt=1)
            flight = Flight(
                job_id,
                spec,
                active.scheduler,
                study,
                trial,
                priced,
                run_id,
                settings=settings,
                rung=w.rung + 1,
                first=w.first,
                earlier=earlier,
                records=recs,
                given_up=set(recs[-1].get("given_up", [])),
            )
            following = flight.next_index() if flight.setting in flight.given_up else 0
            if following is None:
                raise RuntimeError("every setting was given up at the rung before")
            flight.index = following
            self._launch(flight)
        except Exception as exc:
            if is_database_outage(exc):
                raise
            reason = f"the runner could not promote this trial: {describe(exc)}"
            self._tell(study, trial, TrialOutcome.FAILED, reason, TrialState.FAIL)
            self.forget_checkpoints(job_id, number)
            self._event(job_id, EventKind.TRIAL_FAILED, f"trial {number}: {reason}")
            self._job_error(job_id, exc)
            return None
        self.flights.append(flight)
        return flight

    def _cancel_flights(self, job_id: str, outcome: TrialOutcome, reason: str) -> None:
        """Every trial of the job in flight, and (multi-fidelity) every one waiting, told
        `outcome`; the job's checkpoints deleted."""
        super()._cancel_flights(job_id, outcome, reason)
        active = self.jobs.get(job_id)
        if active is None or not active.scheduler.pauses:
            return
        active.scheduler.observe(active.study, set())
        for w in list(active.scheduler.waiting):
            conclude(active.study, w.trial, outcome, reason, TrialState.FAIL)
            self._touch_run(job_id, w.trial.number, reason, RunState.FAILED)
        self.forget_checkpoints(job_id)
        self.jobs.pop(job_id, None)

    def _stop_waiting(self, job_id: str, active: ActiveJob, idle: bool) -> int:
        """Tell pruned the waiting trials the scheduler gives up (`Scheduler.settle`;
        `idle`: the job has nothing in flight). Returns how many were told."""
        stop = active.scheduler.settle(idle)
        for w, reason in stop:
            conclude(active.study, w.trial, TrialOutcome.PRUNED, reason, TrialState.PRUNED)
            self._touch_run(job_id, w.trial.number, reason)
            self.forget_checkpoints(job_id, w.trial.number)
        return len(stop)

    def _check_resources(self, spec: JobSpec) -> None:
        cpus = spec.training.threads or 1
        node = self.backend.largest_node()
        if cpus > node["CPU"]:
            raise JobBroken(
                f"training.threads: each trial needs {cpus} CPUs, but the largest node of "
                f"cluster {self.cluster} has {node['CPU']:g}: no trial could ever start"
            )

    def _fail_job(self, job_id: str, reason: str) -> None:
        self._job_error(job_id, JobBroken(reason), fatal=True)

    def _job_error(self, job_id: str, exc: BaseException, fatal: bool = False) -> None:
        """An error of one job: recorded; the job fails at once if `fatal`, else after
        `max_job_errors`."""
        reason = describe(exc) if not isinstance(exc, JobBroken) else str(exc)
        self.errors[job_id] += 1
        log.warning("job %s: %s", job_id, reason, exc_info=not fatal)
        if not fatal and self.errors[job_id] < self.settings.max_job_errors:
            self._event(job_id, EventKind.RUNNER_ERROR, reason)
            return
        if not fatal:
            reason = f"{self.errors[job_id]} errors while running its trials; the last: {reason}"
        self._cancel_flights(job_id, TrialOutcome.FAILED, "job failed")
        with self.Session.begin() as s:
            row = s.get(Job, job_id)
            if row is not None and row.status.active:
                row.status, row.error = JobStatus.FAILED, reason
                row.finished_at = dt.datetime.now(dt.UTC)
                row.events.append(JobEvent(kind=EventKind.FAILED, message=reason))
        self._relist()
        self.jobs.pop(job_id, None)

    def _ask(self, job_id: str, active: ActiveJob) -> Flight | None:
        """Ask the study for a trial, price it, and launch it (or tell why not). Its
        attributes and run row (with its number and parameters) are written with those of
        every trial asked in the same pass, at its end (`_record_asked`): a runner that dies
        before leaves a trial RUNNING, which the next runner's recovery re-enqueues as any
        other (`nas_service.runner.recovery`); a candidate never trained (infeasible, over a
        constraint) has no run row."""
        spec, study = active.spec, active.study
        trial = study.ask()
        try:
            params = suggest(trial, spec)
            priced = price_candidate(spec, params, corpus=active.corpus, layouts=active.layouts)
            attrs = TrialRecord(arch=priced.arch_dict, costs=priced.metrics).to_attrs()
            if priced.outcome != "train":  # infeasible or over a constraint: never trained
                set_user_attrs(study, trial, attrs)
                outcome = TrialOutcome(priced.outcome)
                self._tell(study, trial, outcome, priced.reason, TrialState.PRUNED)
                return None
            settings = tune_settings(spec, params)
            first = active.scheduler.first_rung(trial.number)  # its Hyperband bracket's
            flight = Flight(
                job_id,
                spec,
                active.scheduler,
                study,
                trial,
                priced,
                -1,
                settings,
                rung=first,
                first=first,
            )
            self._launch(flight)
            # its attributes and run row written at the end of the pass (`_record_asked`)
            self._unrecorded.append((flight, attrs))
        except Exception as exc:
            if is_database_outage(exc):
                raise
            reason = f"the runner could not start this trial: {describe(exc)}"
            self._tell(study, trial, TrialOutcome.FAILED, reason, TrialState.FAIL)
            # the failure shows in the job's runs too
            run_id = self._new_run(job_id, trial.number, dict(trial.params), attempt=1)
            self._close_run(run_id, RunState.FAILED, reason)
            self._event(job_id, EventKind.TRIAL_FAILED, f"trial {trial.number}: {reason}")
            self._job_error(job_id, exc)
            return None
        self.flights.append(flight)
        return flight

    def _poll(self, timeout_s: float) -> None:
        self._record_asked()
        ready = self.backend.wait([f.gen for f in self.flights], timeout_s)
        ready_ids = {id(g) for g in ready}
        for flight in [f for f in self.flights if id(f.gen) in ready_ids]:
            self._conclude(flight, self.backend.next_item(flight.gen))

    def _conclude(self, flight: Flight, item: Any) -> None:
        """Act on what came back for `flight`; a database outage keeps it for later."""
        try:
            if isinstance(item, EvalPoint):
                self._on_point(flight, item)
            elif isinstance(item, TrainResult):
                self._on_result(flight, item)
            else:
                self._lost_worker(flight, item)
        except Exception as exc:
            if is_database_outage(exc):
                self.backlog.append((flight, item))
                raise
            reason = f"the runner could not record this trial: {describe(exc)}"
            log.warning("job %s trial %d: %s", flight.job_id, flight.trial.number, reason)
            self._stop_task(flight)
            self._fail(flight, reason)
            self._job_error(flight.job_id, exc)

    def _drain_backlog(self) -> None:
        while self.backlog:
            flight, item = self.backlog.pop(0)
            if flight in self.flights:
                self._conclude(flight, item)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="depthscope runner", description=__doc__.splitlines()[0])
    parser.add_argument("--cluster", default=LOCAL_CLUSTER, help="a cluster name from the settings")
    parser.add_argument("--database-url", help="default: DEPTHSCOPE_DATABASE_URL")
    parser.add_argument("--forever", action="store_true", help="keep polling for new jobs")
    parser.add_argument("--timeout", type=float, help="give up after this many seconds")
    parser.add_argument(
        "--watch-parent", action="store_true", help="stop when the starting process dies"
    )
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    # SIGTERM ends the loop through its `finally` (the lease is given back, Ray shut down)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    if args.watch_parent:
        _die_with_parent()
    overrides: dict[str, Any] = {}
    if args.database_url:
        overrides["database_url"] = args.database_url
    settings = get_settings(**overrides)
    check_optuna(settings.database_url)  # refuses an untested Optuna or schema
    upgrade(settings.database_url)
    runner = Runner(settings, args.cluster, watch_parent=args.watch_parent)
    code = 0
    try:
        runner.run(until_idle=not args.forever, timeout_s=args.timeout)
    except RayUnavailable as exc:
        log.error("cluster %s: %s; exiting", args.cluster, exc)
        code = 3
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    finally:
        if ray_init_pending():
            # a `ray.init` still stuck in its thread: exit without Ray's exit hooks, which
            # would wait for it (the lease is given back and the life recorded already)
            logging.shutdown()
            os._exit(code or 3)
    return code


def _die_with_parent() -> None:
    """Linux: ask for SIGTERM when the parent dies (the loop also checks `getppid`)."""
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        pr_set_pdeathsig = 1
        libc.prctl(pr_set_pdeathsig, signal.SIGTERM, 0, 0, 0)
    except (OSError, AttributeError):  # not Linux: the getppid check alone
        pass


if __name__ == "__main__":
    sys.exit(main())
