"""How a trial starts in a free slot, as its job's scheduler says (`nas_service.search.scheduler`):
`ask` a new candidate of the study (`Start`), or `resume` a trial waiting at a rung (`Resume`),
its next rung trained from the checkpoints of the rung it reached. Either launches the
trial's first run and adds its flight, or tells the trial why not and returns None."""

from __future__ import annotations

from collections.abc import Callable

import optuna
from optuna.trial import TrialState

from nas_service.runner.active import ActiveJob
from nas_service.runner.failures import describe, is_database_outage
from nas_service.runner.flights import Flight, Flights
from nas_service.runner.outcomes import Outcomes
from nas_service.runner.runs import RunRows
from nas_service.search.pricing import price_candidate
from nas_service.search.rungs import Waiting, records
from nas_service.search.study import suggest, tune_settings
from nas_service.store import EventKind, RunState, TrialOutcome
from nas_service.store.optuna_study import set_user_attrs, trial_id_of
from nas_service.store.records import TrialAttr, TrialRecord


class Starts:
    """Starts the runner's trials: `trials` launches and tells them, `runs` opens their run
    rows, `flights` keeps them; `event` records a job event and `job_error` counts an error
    of the job (the runner's)."""

    def __init__(
        self,
        trials: Outcomes,
        runs: RunRows,
        flights: Flights,
        event: Callable[..., None],
        job_error: Callable[[str, BaseException], None],
    ):
        self.trials = trials
        self.runs = runs
        self.flights = flights
        self.event = event
        self.job_error = job_error

    def resume(self, job_id: str, active: ActiveJob, w: Waiting) -> Flight | None:
        """Train the next rung of a waiting trial: its record marked promoted, then its
        run row, then the run launched from the checkpoints of the rung it reached."""
        spec, study = active.spec, active.study
        trial = optuna.Trial(study, trial_id_of(w.trial))
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
            run_id = self.runs.new(job_id, number, params, attempt=1)
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
            self.trials.launch(flight)
        except Exception as exc:
            if is_database_outage(exc):
                raise
            reason = f"the runner could not promote this trial: {describe(exc)}"
            self.trials.tell(study, trial, TrialOutcome.FAILED, reason, TrialState.FAIL)
            self.trials.forget_checkpoints(job_id, number)
            self.event(job_id, EventKind.TRIAL_FAILED, f"trial {number}: {reason}")
            self.job_error(job_id, exc)
            return None
        self.flights.add(flight)
        return flight

    def ask(self, job_id: str, active: ActiveJob) -> Flight | None:
        """Ask the study for a trial, price it, and launch it (or tell why not). Its
        attributes and run row (with its number and parameters) are written with those of
        every trial asked in the same pass, at its end (`Outcomes.record_asked`): a runner that dies
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
                self.trials.tell(study, trial, outcome, priced.reason, TrialState.PRUNED)
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
            self.trials.launch(flight)
            # its attributes and run row written at the end of the pass (`Outcomes.record_asked`)
            self.flights.unrecorded.append((flight, attrs))
        except Exception as exc:
            if is_database_outage(exc):
                raise
            reason = f"the runner could not start this trial: {describe(exc)}"
            self.trials.tell(study, trial, TrialOutcome.FAILED, reason, TrialState.FAIL)
            # the failure shows in the job's runs too
            run_id = self.runs.new(job_id, trial.number, dict(trial.params), attempt=1)
            self.runs.close(run_id, RunState.FAILED, reason)
            self.event(job_id, EventKind.TRIAL_FAILED, f"trial {trial.number}: {reason}")
            self.job_error(job_id, exc)
            return None
        self.flights.add(flight)
        return flight
