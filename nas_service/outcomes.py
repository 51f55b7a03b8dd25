"""The trial half of the runner: launching a trial's training on Ray, recording each attempt
(`ds_trial_runs`), and concluding a trial — pruned, diverged, completed, failed, retried after
a lost worker, cancelled — always through `_tell` (outcome, reason, attributes, then the
state or the values told to the study). `Runner` (`nas_service.runner`) builds on it."""

from __future__ import annotations

import datetime as dt
import logging
from dataclasses import dataclass, field
from typing import Any

import optuna
from optuna.trial import FrozenTrial, TrialState
from sqlalchemy.orm import Session, sessionmaker

from nas_service.cluster import retryable
from nas_service.db import EventKind, RunState, TrialOutcome, TrialRun
from nas_service.failures import describe
from nas_service.search import (
    ATTR_CURVE,
    ATTR_OUTCOME,
    ATTR_REASON,
    ATTR_TRAIN,
    Priced,
    cannot_reach_front,
    curve_rows,
    objective_values,
    seed_statistics,
    train_summary,
)
from nas_service.settings import Settings
from nas_service.spec import JobSpec
from workers.contract import EvalPoint, TrainResult

log = logging.getLogger(__name__)

MAX_ATTEMPTS = 3  # a candidate whose worker dies is tried this many times, then failed


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


def conclude(
    study: optuna.Study,
    trial: optuna.Trial | FrozenTrial,
    outcome: TrialOutcome,
    reason: str,
    state: TrialState | None = None,
    values: list[float] | None = None,
    attrs: dict[str, Any] | None = None,
) -> None:
    """The one way a trial is concluded, by the runner and by recovery alike: its other
    attributes, its outcome and reason, then the state (or the objective values) told to the
    study. A trial concluded already (a retry after an outage, a recovery) is left as it is."""
    try:
        for key, value in ((attrs or {}) | {ATTR_OUTCOME: str(outcome)}).items():
            _set_attr(study, trial, key, value)
        if reason:
            _set_attr(study, trial, ATTR_REASON, reason)
        study.tell(trial if isinstance(trial, optuna.Trial) else trial.number, values, state=state)
    except optuna.exceptions.UpdateFinishedTrialError as exc:
        log.info("trial %d was concluded already: %s", trial.number, exc)
    except ValueError as exc:
        if not str(exc).startswith("Cannot tell a"):
            raise
        log.info("trial %d was concluded already: %s", trial.number, exc)


def _set_attr(study: optuna.Study, trial: optuna.Trial | FrozenTrial, key: str, value: Any) -> None:
    if isinstance(trial, optuna.Trial):
        trial.set_user_attr(key, value)
    else:  # a trial of a stopped runner, read back from the storage
        study._storage.set_trial_user_attr(trial._trial_id, key, value)


class TrialOutcomes:
    """What the runner does with one trial, given its sessions, settings and flights."""

    Session: sessionmaker[Session]
    settings: Settings
    cluster: str
    flights: list[Flight]
    _event: Any

    def _new_run(self, job_id: str, number: int, params: dict[str, Any], attempt: int) -> int:
        with self.Session.begin() as s:
            run = TrialRun(job_id=job_id, trial_number=number, params=params, attempt=attempt)
            s.add(run)
            s.flush()
            return run.id

    def _update_run(self, run_id: int, number: int, params: dict[str, Any] | None = None) -> None:
        with self.Session.begin() as s:
            run = s.get(TrialRun, run_id)
            if run is not None:
                run.trial_number = number
                if params is not None:
                    run.params = params

    def _drop_run(self, run_id: int) -> None:
        with self.Session.begin() as s:
            run = s.get(TrialRun, run_id)
            if run is not None:
                s.delete(run)

    def _launch(self, flight: Flight) -> None:
        import ray

        from workers.task import train_streaming

        assert flight.priced.train_spec is not None
        spec = flight.priced.train_spec.replace(seed=flight.seed)
        resources = ray.cluster_resources()  # type: ignore[no-untyped-call]
        gpus = 1 if resources.get("GPU", 0) >= 1 else 0
        cpus = spec.threads or 1
        flight.points = []
        flight.gen = train_streaming.options(num_cpus=cpus, num_gpus=gpus).remote(spec)

    # -- outcomes ------------------------------------------------------------------------
    def _tell(
        self,
        study: optuna.Study,
        trial: optuna.Trial,
        outcome: TrialOutcome,
        reason: str,
        state: TrialState | None = None,
        values: list[float] | None = None,
        attrs: dict[str, Any] | None = None,
    ) -> None:
        """Conclude a trial of a flight (see `conclude`)."""
        conclude(study, trial, outcome, reason, state, values, attrs)

    def _close_run(self, run_id: int, state: RunState, reason: str) -> None:
        with self.Session.begin() as s:
            run = s.get(TrialRun, run_id)
            if run is not None and run.state == RunState.RUNNING:
                run.state, run.reason = state, reason
                run.finished_at = dt.datetime.now(dt.UTC)

    def _finish_run(self, flight: Flight, state: RunState, reason: str) -> None:
        self._close_run(flight.run_id, state, reason)
        if flight in self.flights:
            self.flights.remove(flight)

    def _on_point(self, flight: Flight, point: EvalPoint) -> None:
        if not flight.points or flight.points[-1] is not point:  # not again after an outage
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
            train = flight.priced.train_spec
            assert train is not None
            budget_tokens = train.planned_steps() * train.tokens_per_step
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
        self._stop_task(flight)
        curve = curve_rows(flight.points)
        self._tell(
            flight.study,
            trial,
            TrialOutcome.PRUNED,
            reason,
            TrialState.PRUNED,
            attrs={ATTR_CURVE: curve},
        )
        self._finish_run(flight, RunState.PRUNED, reason)

    def _on_result(self, flight: Flight, result: TrainResult) -> None:
        trial = flight.trial
        if not flight.results or flight.results[-1] is not result:
            flight.results.append(result)
        train = [train_summary(r) for r in flight.results]
        if result.status == "diverged":  # recorded, never retried
            attrs: dict[str, Any] = {ATTR_TRAIN: train, ATTR_CURVE: curve_rows(result.curve)}
            self._tell(
                flight.study,
                trial,
                TrialOutcome.DIVERGED,
                result.reason,
                TrialState.FAIL,
                attrs=attrs,
            )
            self._finish_run(flight, RunState.DIVERGED, result.reason)
            return
        if flight.seed + 1 < flight.spec.seeds:
            flight.seed += 1
            self._launch(flight)
            return
        losses = [r.final_val_loss for r in flight.results]
        stats = seed_statistics(losses)
        values = objective_values(flight.spec, stats["mean"], flight.priced.metrics)
        attrs = {
            ATTR_TRAIN: train,
            ATTR_CURVE: curve_rows(flight.results[0].curve),
            "val_loss_seeds": stats | {"values": losses},
        }
        self._tell(flight.study, trial, TrialOutcome.COMPLETED, "", values=values, attrs=attrs)
        self._finish_run(flight, RunState.COMPLETED, "")

    def _fail(self, flight: Flight, reason: str) -> None:
        self._tell(flight.study, flight.trial, TrialOutcome.FAILED, reason, TrialState.FAIL)
        self._finish_run(flight, RunState.FAILED, reason)
        self._event(flight.job_id, EventKind.TRIAL_FAILED, f"trial {flight.trial.number}: {reason}")

    def _lost_worker(self, flight: Flight, exc: BaseException) -> None:
        reason = describe(exc)
        if retryable(exc) and flight.attempt < MAX_ATTEMPTS:
            self._close_run(flight.run_id, RunState.LOST, reason)
            flight.attempt += 1
            flight.run_id = self._new_run(
                flight.job_id, flight.trial.number, flight.priced.params, flight.attempt
            )
            self._event(
                flight.job_id,
                EventKind.TRIAL_RETRY,
                f"trial {flight.trial.number} attempt {flight.attempt}: {reason}",
            )
            self._launch(flight)
            return
        tries = f"after {flight.attempt} attempts: " if flight.attempt > 1 else ""
        self._fail(flight, tries + reason)

    def _stop_task(self, flight: Flight) -> None:
        import ray

        try:
            ray.cancel(flight.gen, force=True)
        except Exception as exc:  # already finished or its worker gone: nothing to stop
            log.debug("cancel of trial %d: %s", flight.trial.number, exc)

    def _cancel_flights(self, job_id: str, outcome: TrialOutcome, reason: str) -> None:
        for flight in [f for f in self.flights if f.job_id == job_id]:
            self._stop_task(flight)
            self._tell(flight.study, flight.trial, outcome, reason, TrialState.FAIL)
            self._finish_run(flight, RunState.FAILED, reason)

    def _abandon_flights(self) -> None:
        """Stop every task without telling anything (the lease holder recovers them)."""
        for flight in self.flights:
            self._stop_task(flight)
        self.flights.clear()
