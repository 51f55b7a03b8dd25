"""The job loop: keeps up to `max_concurrent` trials of every active job in flight on Ray,
streams each candidate's validation losses back while it trains, prunes the hopeless,
retries candidates whose worker died, and resumes after a crash.

Only this process touches the database; workers are stateless. A trial is done only when
told to the study. On start, trials a crashed runner left RUNNING are failed, marked lost
(they do not count) and re-enqueued with the same parameters, so a job finishes with exactly
`n_trials` counted trials, none duplicated, none lost.

Run it with `depthscope runner` (or `python -m nas_service.runner`).
"""

from __future__ import annotations

import argparse
import datetime as dt
import logging
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import optuna
from optuna.trial import TrialState
from sqlalchemy import select

from nas_service.db import Job, JobEvent, TrialRun, make_engine, make_sessionmaker, upgrade
from nas_service.jobs import active_jobs, optuna_storage
from nas_service.search import (
    ATTR_ARCH,
    ATTR_COSTS,
    ATTR_CURVE,
    ATTR_LOST,
    ATTR_OUTCOME,
    ATTR_REASON,
    ATTR_TRAIN,
    Priced,
    cannot_reach_front,
    curve_rows,
    load_study,
    objective_values,
    price_candidate,
    seed_statistics,
    suggest,
    train_summary,
)
from nas_service.settings import ClusterSettings, Settings, get_settings
from nas_service.spec import JobSpec
from workers.train import EvalPoint, TrainResult

log = logging.getLogger(__name__)

MAX_ATTEMPTS = 3  # a candidate whose worker dies is tried this many times, then failed
COUNTED = (TrialState.COMPLETE, TrialState.PRUNED, TrialState.FAIL)


def connect_ray(cluster: ClusterSettings) -> None:
    """Start a local Ray (address None) or join the configured cluster, with its auth.

    Ray reads its authentication settings (RAY_AUTH_MODE, RAY_AUTH_TOKEN) when it is
    imported, so they are exported before the import; if Ray was imported already, its
    cached token state is reset."""
    already = "ray" in sys.modules
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    if cluster.auth_mode is not None:
        os.environ["RAY_AUTH_MODE"] = cluster.auth_mode
    if cluster.auth_token is not None:
        os.environ["RAY_AUTH_TOKEN"] = cluster.auth_token.get_secret_value()
        os.environ.pop("RAY_AUTH_TOKEN_PATH", None)
    import ray

    if ray.is_initialized():
        return
    if already and (cluster.auth_mode is not None or cluster.auth_token is not None):
        try:
            from ray._raylet import AuthenticationTokenLoader, Config

            Config.initialize("")
            AuthenticationTokenLoader.instance().reset_cache()
        except (ImportError, AttributeError):  # another Ray version: the import-time state
            log.warning("could not refresh Ray's authentication state after import")
    kwargs: dict[str, Any] = {"include_dashboard": False, "log_to_driver": False}
    if cluster.address is None:
        ray.init(num_cpus=cluster.num_cpus, **kwargs)
        return
    runtime_env = None
    if cluster.ship_code:
        import cost_model
        import workers

        runtime_env = {
            "py_modules": [
                str(Path(cost_model.__file__).parent),
                str(Path(workers.__file__).parent),
            ]
        }
    ray.init(address=cluster.address, runtime_env=runtime_env, **kwargs)


def _retryable(exc: BaseException) -> bool:
    """Lost workers and nodes are retried; an exception raised by the training code is not."""
    import ray.exceptions as rex

    lost = (
        rex.WorkerCrashedError,
        rex.NodeDiedError,
        rex.ObjectLostError,
        rex.OwnerDiedError,
        rex.RaySystemError,
    )
    return isinstance(exc, lost) and not isinstance(exc, rex.RayTaskError)


@dataclass
class Flight:
    """One trial in flight: its candidate, the seed being trained and what came back."""

    job_id: str
    spec: JobSpec
    study: optuna.Study
    trial: optuna.Trial
    priced: Priced
    run_id: int
    seed: int = 0
    attempt: int = 1
    gen: Any = None
    points: list[EvalPoint] = field(default_factory=list)
    results: list[TrainResult] = field(default_factory=list)


class Runner:
    """Drives every active job on one Ray cluster (`cluster`, a name from the settings)."""

    def __init__(self, settings: Settings, cluster: str = "local") -> None:
        if cluster not in settings.clusters:
            raise ValueError(f"cluster: unknown {cluster!r}")
        self.settings = settings
        self.cluster = cluster
        self.engine = make_engine(settings.database_url)
        self.Session = make_sessionmaker(self.engine)
        self.storage = optuna_storage(settings.database_url)
        self.flights: list[Flight] = []
        self.studies: dict[str, tuple[JobSpec, optuna.Study]] = {}

    # -- bookkeeping ---------------------------------------------------------------------
    def _event(
        self, job_id: str, kind: str, message: str, data: dict[str, Any] | None = None
    ) -> None:
        with self.Session.begin() as s:
            s.add(JobEvent(job_id=job_id, kind=kind, message=message, data=data))

    def _study(self, job: Job) -> tuple[JobSpec, optuna.Study]:
        if job.id not in self.studies:
            spec = JobSpec.model_validate(job.spec)
            self.studies[job.id] = (spec, load_study(spec, self.storage, job.study_name))
        return self.studies[job.id]

    @staticmethod
    def counted(study: optuna.Study) -> int:
        return sum(
            1
            for t in study.get_trials(deepcopy=False, states=COUNTED)
            if not t.user_attrs.get(ATTR_LOST)
        )

    # -- recovery ------------------------------------------------------------------------
    def recover(self) -> int:
        """Fail, mark lost and re-enqueue the trials a crashed runner left running."""
        requeued = 0
        with self.Session() as s:
            jobs = [
                j
                for j in active_jobs(s)
                if j.status == "running" and j.spec.get("cluster") == self.cluster
            ]
        for job in jobs:
            _, study = self._study(job)
            left = study.get_trials(deepcopy=False, states=(TrialState.RUNNING,))
            retried = {t.user_attrs.get("ds_retry_of") for t in study.get_trials(deepcopy=False)}
            for t in left:
                # enqueue before failing, and only once: a crash in between must neither
                # lose the trial nor enqueue it twice
                if t.number not in retried:
                    study.enqueue_trial(dict(t.params), user_attrs={"ds_retry_of": t.number})
                self.storage.set_trial_user_attr(t._trial_id, ATTR_LOST, True)
                self.storage.set_trial_user_attr(t._trial_id, ATTR_OUTCOME, "lost")
                study.tell(t.number, state=TrialState.FAIL)
            requeued += len(left)
            with self.Session.begin() as s:
                for run in s.scalars(
                    select(TrialRun).where(TrialRun.job_id == job.id, TrialRun.state == "running")
                ):
                    run.state, run.reason = "lost", "the runner stopped while it ran"
                    run.finished_at = dt.datetime.now(dt.UTC)
            if left:
                self._event(job.id, "recovered", f"re-enqueued {len(left)} trials left running")
        return requeued

    # -- the loop ------------------------------------------------------------------------
    def run(
        self, until_idle: bool = True, timeout_s: float | None = None, poll_s: float = 0.5
    ) -> None:
        """Work until every active job of this cluster is finished (`until_idle`) or forever."""
        connect_ray(self.settings.clusters[self.cluster])
        self.recover()
        start = time.monotonic()
        while True:
            busy = self._schedule()
            if not busy and not self.flights and until_idle:
                return
            if timeout_s is not None and time.monotonic() - start > timeout_s:
                raise TimeoutError(f"runner still busy after {timeout_s}s")
            if self.flights:
                self._poll(poll_s)
            else:
                time.sleep(poll_s)

    def _schedule(self) -> bool:
        """Start trials where there is room; finish and cancel jobs. True while jobs remain."""
        with self.Session() as s:
            jobs = [j for j in active_jobs(s) if j.spec.get("cluster") == self.cluster]
            cancelled = set(s.scalars(select(Job.id).where(Job.status == "cancelled"))) & {
                f.job_id for f in self.flights
            }
        for job_id in cancelled:
            self._cancel_flights(job_id)
        for job in jobs:
            spec, study = self._study(job)
            if job.status == "pending":
                with self.Session.begin() as s:
                    row = s.get(Job, job.id)
                    assert row is not None
                    row.status, row.started_at = "running", dt.datetime.now(dt.UTC)
                    row.events.append(
                        JobEvent(kind="started", message=f"on cluster {self.cluster}")
                    )
            done = self.counted(study)
            mine = [f for f in self.flights if f.job_id == job.id]
            while done + len(mine) < spec.n_trials and len(mine) < spec.max_concurrent:
                flight = self._ask(job.id, spec, study)
                if flight is None:
                    done += 1
                else:
                    mine.append(flight)
            if done >= spec.n_trials and not mine:
                with self.Session.begin() as s:
                    row = s.get(Job, job.id)
                    assert row is not None
                    row.status, row.finished_at = "completed", dt.datetime.now(dt.UTC)
                    row.events.append(JobEvent(kind="completed", message=f"{done} trials"))
                self.studies.pop(job.id, None)
        return bool(jobs)

    def _ask(self, job_id: str, spec: JobSpec, study: optuna.Study) -> Flight | None:
        trial = study.ask()
        params = suggest(trial, spec)
        priced = price_candidate(spec, params)
        if priced.arch_dict is not None:
            trial.set_user_attr(ATTR_ARCH, priced.arch_dict)
        trial.set_user_attr(ATTR_COSTS, priced.metrics)
        if priced.outcome != "train":
            trial.set_user_attr(ATTR_OUTCOME, priced.outcome)
            trial.set_user_attr(ATTR_REASON, priced.reason)
            study.tell(trial, state=TrialState.PRUNED)
            return None
        with self.Session.begin() as s:
            run = TrialRun(job_id=job_id, trial_number=trial.number, params=params)
            s.add(run)
            s.flush()
            run_id = run.id
        flight = Flight(job_id, spec, study, trial, priced, run_id)
        self._launch(flight)
        self.flights.append(flight)
        return flight

    def _launch(self, flight: Flight) -> None:
        import ray

        from workers.task import train_streaming

        assert flight.priced.train_spec is not None
        spec = flight.priced.train_spec.replace(seed=flight.seed)
        gpus = 1 if ray.cluster_resources().get("GPU", 0) >= 1 else 0
        cpus = spec.threads or 1
        flight.points = []
        flight.gen = train_streaming.options(num_cpus=cpus, num_gpus=gpus).remote(spec)

    def _poll(self, timeout_s: float) -> None:
        import ray

        gens = [f.gen for f in self.flights]
        ready, _ = ray.wait(gens, num_returns=1, timeout=timeout_s)
        ready_ids = {id(g) for g in ready}
        for flight in [f for f in self.flights if id(f.gen) in ready_ids]:
            try:
                item = ray.get(next(flight.gen))
            except StopIteration:
                self._fail(flight, "the training task ended without a result")
                continue
            except Exception as exc:
                self._lost_worker(flight, exc)
                continue
            if isinstance(item, EvalPoint):
                self._on_point(flight, item)
            else:
                self._on_result(flight, item)

    # -- outcomes ------------------------------------------------------------------------
    def _finish_run(self, flight: Flight, state: str, reason: str) -> None:
        with self.Session.begin() as s:
            run = s.get(TrialRun, flight.run_id)
            if run is not None:
                run.state, run.reason, run.attempt = state, reason, flight.attempt
                run.finished_at = dt.datetime.now(dt.UTC)
        if flight in self.flights:
            self.flights.remove(flight)

    def _on_point(self, flight: Flight, point: EvalPoint) -> None:
        flight.points.append(point)
        if flight.seed != 0 or flight.spec.pruner == "none":
            return
        trial, spec = flight.trial, flight.spec
        reason = None
        if not spec.multi_objective:
            trial.report(point.val_loss, point.step)
            if trial.should_prune():
                reason = f"median pruner at step {point.step} (val_loss {point.val_loss:.4f})"
        else:
            budget_tokens = (
                flight.priced.train_spec.planned_steps() * flight.priced.train_spec.tokens_per_step
            )  # type: ignore[union-attr]
            finished = flight.study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
            curves = [t.user_attrs.get(ATTR_CURVE, []) for t in finished]
            reason = cannot_reach_front(
                finished,
                spec,
                flight.priced.metrics,
                point.val_loss,
                point.tokens / budget_tokens,
                curves,
            )
        if reason is None:
            return
        import ray

        ray.cancel(flight.gen, force=True)
        trial.set_user_attr(ATTR_OUTCOME, "pruned")
        trial.set_user_attr(ATTR_REASON, reason)
        trial.set_user_attr(ATTR_CURVE, curve_rows(flight.points))
        flight.study.tell(trial, state=TrialState.PRUNED)
        self._finish_run(flight, "pruned", reason)

    def _on_result(self, flight: Flight, result: TrainResult) -> None:
        trial = flight.trial
        flight.results.append(result)
        if result.status == "diverged":  # recorded, never retried
            trial.set_user_attr(ATTR_OUTCOME, "diverged")
            trial.set_user_attr(ATTR_REASON, result.reason)
            trial.set_user_attr(ATTR_TRAIN, [train_summary(r) for r in flight.results])
            trial.set_user_attr(ATTR_CURVE, curve_rows(result.curve))
            flight.study.tell(trial, state=TrialState.FAIL)
            self._finish_run(flight, "diverged", result.reason)
            return
        if flight.seed + 1 < flight.spec.seeds:
            flight.seed += 1
            self._launch(flight)
            return
        losses = [r.final_val_loss for r in flight.results]
        stats = seed_statistics(losses)
        trial.set_user_attr(ATTR_OUTCOME, "completed")
        trial.set_user_attr(ATTR_TRAIN, [train_summary(r) for r in flight.results])
        trial.set_user_attr(ATTR_CURVE, curve_rows(flight.results[0].curve))
        trial.set_user_attr("val_loss_seeds", stats | {"values": losses})
        values = objective_values(flight.spec, stats["mean"], flight.priced.metrics)
        flight.study.tell(trial, values)
        self._finish_run(flight, "completed", "")

    def _fail(self, flight: Flight, reason: str) -> None:
        flight.trial.set_user_attr(ATTR_OUTCOME, "failed")
        flight.trial.set_user_attr(ATTR_REASON, reason)
        flight.study.tell(flight.trial, state=TrialState.FAIL)
        self._finish_run(flight, "failed", reason)
        self._event(flight.job_id, "trial_failed", f"trial {flight.trial.number}: {reason}")

    def _lost_worker(self, flight: Flight, exc: BaseException) -> None:
        reason = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
        if _retryable(exc) and flight.attempt < MAX_ATTEMPTS:
            flight.attempt += 1
            self._event(
                flight.job_id,
                "trial_retry",
                f"trial {flight.trial.number} attempt {flight.attempt}: {reason}",
            )
            self._launch(flight)
            return
        self._fail(flight, f"after {flight.attempt} attempts: {reason}")

    def _cancel_flights(self, job_id: str) -> None:
        import ray

        for flight in [f for f in self.flights if f.job_id == job_id]:
            ray.cancel(flight.gen, force=True)
            flight.trial.set_user_attr(ATTR_OUTCOME, "cancelled")
            flight.study.tell(flight.trial, state=TrialState.FAIL)
            self._finish_run(flight, "failed", "job cancelled")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="depthscope runner", description=__doc__.splitlines()[0])
    parser.add_argument("--cluster", default="local", help="a cluster name from the settings")
    parser.add_argument("--database-url", help="default: DEPTHSCOPE_DATABASE_URL")
    parser.add_argument("--forever", action="store_true", help="keep polling for new jobs")
    parser.add_argument("--timeout", type=float, help="give up after this many seconds")
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    overrides: dict[str, Any] = {}
    if args.database_url:
        overrides["database_url"] = args.database_url
    settings = get_settings(**overrides)
    upgrade(settings.database_url)
    Runner(settings, args.cluster).run(until_idle=not args.forever, timeout_s=args.timeout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
