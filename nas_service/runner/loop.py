"""The job loop: keeps up to `max_concurrent` trials of every active job in flight on Ray,
streams each candidate's validation losses back while it trains, prunes the hopeless,
retries candidates whose worker died, and resumes after a crash. A trial trains every
setting of its `tune` grid (one without) at every seed, one run after the other in its slot,
and records each run as it finishes (`nas_service.runner.outcomes`).

What a free slot does next is its job's scheduler's answer (`nas_service.search.scheduler`):
start a new candidate, or resume a trial waiting at a rung (with a `fidelity` section: ASHA,
Hyperband brackets, the best waiting trial of the highest rung first); trials that can never
be promoted are told pruned as soon as that is certain, and those still waiting when nothing
else is left at the end.

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
import logging
import os
import signal
import sys
import time
from typing import Any

import optuna
from optuna.trial import TrialState

from nas_service.runner.active import (
    COUNTED,
    JOB_LIST_REFRESH_S,
    ActiveJob,
    ActiveJobs,
    JobBroken,
    counted,
)
from nas_service.runner.backend import Backend, RayBackend
from nas_service.runner.cluster import RayUnavailable, connect_ray, ray_init_pending
from nas_service.runner.failures import describe, is_database_outage
from nas_service.runner.flights import Flight, Flights
from nas_service.runner.outcomes import MAX_ATTEMPTS, Outcomes, conclude
from nas_service.runner.recovery import Stops, jobs_to_recover, record_event, recover_job
from nas_service.runner.runs import RunRows
from nas_service.runner.starts import Starts
from nas_service.search.scheduler import Resume
from nas_service.settings import LOCAL_CLUSTER, Settings, get_settings
from nas_service.spec import JobSpec
from nas_service.store import (
    EventKind,
    Job,
    JobStatus,
    RunState,
    TrialOutcome,
    make_engine,
    make_sessionmaker,
    upgrade,
)
from nas_service.store.jobs import optuna_storage
from nas_service.store.lease import CRASHED, STOPPED, Lease, LeaseLost, Life
from nas_service.store.optuna_compat import check_optuna
from nas_service.store.optuna_storage import OwnedTrials
from nas_service.store.records import TrialAttr
from workers.contract import EvalPoint, TrainResult

__all__ = [
    "COUNTED",
    "JOB_LIST_REFRESH_S",
    "MAX_ATTEMPTS",
    "ActiveJob",
    "JobBroken",
    "Runner",
    "connect_ray",
    "main",
]

log = logging.getLogger(__name__)


class Runner:
    """Drives every active job on one Ray cluster (`cluster`, a name from the settings).
    With `watch_parent`, it stops when the process that started it dies (`depthscope serve`
    starts its runners so). `backend` runs the training (default: `RayBackend` on the
    cluster; `nas_service.runner.simulated.SimulatedBackend` replays a landscape).

    Its collaborators: `jobs` (the active jobs and their rows, `runner.active`), `flights`
    (the trials in flight, `runner.flights`), `runs` (their run rows, `runner.runs`) and
    `outcomes` (what is done with one trial, `runner.outcomes`); each job's scheduler
    answers what a free slot does next (`nas_service.search.scheduler`)."""

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
        self.errors: collections.Counter[str] = collections.Counter()
        self.backlog: list[tuple[Flight, Any]] = []  # results the database has not taken yet
        self.parent = os.getppid() if watch_parent else None
        self.life = Life(self.Session, cluster, self.lease.holder, service_pid=self.parent)
        self._event = record_event(self.Session)
        self.jobs = ActiveJobs(settings, self.Session, self.storage, cluster)
        self.flights = Flights()
        self.runs = RunRows(self.Session)
        self.outcomes = Outcomes(
            settings,
            self.Session,
            self.backend,
            self.flights,
            self.runs,
            self._event,
            self._fail_job,
        )
        self.starts = Starts(self.outcomes, self.runs, self.flights, self._event, self._job_error)

    def active(self, job: Job) -> ActiveJob:
        """The job as this runner drives it (`ActiveJobs.load`)."""
        return self.jobs.load(job)

    # -- recovery ------------------------------------------------------------------------
    def recover(self) -> int:
        """Conclude what a stopped runner left running (see `nas_service.runner.recovery`)."""
        left = []
        for job in jobs_to_recover(self.Session, self.cluster):
            try:
                study = self.active(job).study
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
                    busy = self.step()
                    if not busy and not self.flights and until_idle:
                        return
                    if self.flights:
                        self.poll(poll_s)
                    else:
                        time.sleep(poll_s)
                    outage = 0
                except LeaseLost:
                    log.error("cluster %s: lease taken by another runner; stopping", self.cluster)
                    self.abandon()
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

    def step(self) -> bool:
        """One pass of the loop: start trials where there is room; finish and cancel jobs.
        True while jobs remain."""
        jobs, cancelled_ids = self.jobs.listed()
        waiting = {j for j, a in self.jobs.loaded.items() if a.scheduler.pauses}
        cancelled = cancelled_ids & (self.flights.jobs() | waiting)
        for job_id in cancelled:
            self._cancel(job_id, TrialOutcome.CANCELLED, "job cancelled")
        for job in jobs:
            try:
                self._step_job(job)
            except Exception as exc:
                if is_database_outage(exc) or isinstance(exc, LeaseLost):
                    raise
                self._job_error(job.id, exc, fatal=isinstance(exc, JobBroken))
        self.outcomes.record_asked()
        return bool(jobs)

    def _step_job(self, job: Job) -> None:
        active = self.active(job)
        spec, study, scheduler = active.spec, active.study, active.scheduler
        if job.status == JobStatus.PENDING:
            self._check_resources(spec)
            self.jobs.started(job.id, f"on cluster {self.cluster}{scheduler.start_note()}")
        if self.outcomes.parking.relaunch(job.id):
            return  # paused: the artifact store failed one of its runs (`runner.parking`)
        done = counted(study)
        mine = self.flights.of(job.id)
        scheduler.observe(study, {f.trial.number for f in mine})
        while len(mine) < spec.max_concurrent:
            if self.errors[job.id] >= self.settings.max_job_errors:
                return
            slot = scheduler.next_slot(done, len(mine))
            if slot is None:
                break
            if isinstance(slot, Resume):
                flight = self.starts.resume(job.id, active, slot.waiting)
            else:
                flight = self.starts.ask(job.id, active)
            if flight is None:
                done += 1
            else:
                mine.append(flight)
        done += self._stop_waiting(job.id, active, idle=not mine)
        answered = scheduler.answered
        if (done >= spec.n_trials or answered) and not mine and not scheduler.waiting:
            self.jobs.completed(job.id, done, answered if done < spec.n_trials else None)
            if scheduler.pauses:
                self.outcomes.forget_checkpoints(job.id)

    def ask(self, job_id: str, active: ActiveJob) -> Flight | None:
        """Start a new candidate of the job (`Starts.ask`)."""
        return self.starts.ask(job_id, active)

    def _cancel(self, job_id: str, outcome: TrialOutcome, reason: str) -> None:
        """Every trial of the job in flight or parked, and every one waiting at a rung, told
        `outcome`; a job whose trials wait between rungs loses its checkpoints."""
        self.outcomes.cancel(job_id, outcome, reason)
        active = self.jobs.get(job_id)
        if active is None or not active.scheduler.pauses:
            return
        active.scheduler.observe(active.study, set())
        for w in list(active.scheduler.waiting):
            conclude(active.study, w.trial, outcome, reason, TrialState.FAIL)
            self.runs.touch(job_id, w.trial.number, reason, RunState.FAILED)
        self.outcomes.forget_checkpoints(job_id)
        self.jobs.forget(job_id)

    def _stop_waiting(self, job_id: str, active: ActiveJob, idle: bool) -> int:
        """Tell pruned the waiting trials the scheduler gives up (`Scheduler.settle`;
        `idle`: the job has nothing in flight). Returns how many were told."""
        stop = active.scheduler.settle(idle)
        for w, reason in stop:
            conclude(active.study, w.trial, TrialOutcome.PRUNED, reason, TrialState.PRUNED)
            self.runs.touch(job_id, w.trial.number, reason)
            self.outcomes.forget_checkpoints(job_id, w.trial.number)
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
        self._cancel(job_id, TrialOutcome.FAILED, "job failed")
        self.jobs.failed(job_id, reason)

    def poll(self, timeout_s: float) -> None:
        """Wait up to `timeout_s` for what the trials in flight send back, and act on it."""
        self.outcomes.record_asked()
        ready = self.backend.wait([f.gen for f in self.flights], timeout_s)
        ready_ids = {id(g) for g in ready}
        for flight in [f for f in self.flights if id(f.gen) in ready_ids]:
            self._conclude(flight, self.backend.next_item(flight.gen))

    def _conclude(self, flight: Flight, item: Any) -> None:
        """Act on what came back for `flight`; a database outage keeps it for later."""
        try:
            if isinstance(item, EvalPoint):
                self.outcomes.on_point(flight, item)
            elif isinstance(item, TrainResult):
                self.outcomes.on_result(flight, item)
            else:
                self.outcomes.lost_worker(flight, item)
        except Exception as exc:
            if is_database_outage(exc):
                self.backlog.append((flight, item))
                raise
            reason = f"the runner could not record this trial: {describe(exc)}"
            log.warning("job %s trial %d: %s", flight.job_id, flight.trial.number, reason)
            self.outcomes.stop_task(flight)
            self.outcomes.fail(flight, reason)
            self._job_error(flight.job_id, exc)

    def _drain_backlog(self) -> None:
        while self.backlog:
            flight, item = self.backlog.pop(0)
            if flight in self.flights:
                self._conclude(flight, item)

    def abandon(self) -> None:
        """Stop every trial in flight without telling anything, as a runner that lost its
        lease (the lease holder recovers them)."""
        self.outcomes.abandon()


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
