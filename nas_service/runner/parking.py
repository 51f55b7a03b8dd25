"""Artifact store faults. A store that fails a write (full, read-only, gone) is the operator's
fault, never the candidate's: the trial is not told; its flight is parked (its run row stays
open), its job pauses (nothing new is asked for it) and the run is launched again after
`store_retry_s`, then twice that, and so on (at most `STORE_RETRY_MAX_S`); once the store
has failed `store_retries` times in a row the job fails with the reason and its trials in
flight or parked are concluded as lost (never counted). Reasons name the store only as
`<store>`: its path or URL may hold credentials (`spec.checks._scrub`)."""

from __future__ import annotations

import collections
import logging
import time
from collections.abc import Callable
from typing import Any, Protocol

import optuna
from optuna.trial import TrialState

from nas_service.runner.failures import _task_cause, describe
from nas_service.runner.flights import Flight, Flights
from nas_service.settings import Settings
from nas_service.spec.checks import _scrub
from nas_service.store import EventKind, RunState, TrialOutcome
from nas_service.store.records import TrialRecord
from workers.store import StoreError

log = logging.getLogger(__name__)

STORE_RETRY_MAX_S = 60.0  # the longest pause after an artifact store fault


class Trials(Protocol):
    """What parking needs of the runner's trial outcomes (`runner.outcomes.Outcomes`)."""

    def record_asked(self) -> None: ...

    def stop_task(self, flight: Flight) -> None: ...

    def tell(
        self,
        study: optuna.Study,
        trial: optuna.Trial,
        outcome: TrialOutcome,
        reason: str,
        state: TrialState | None = None,
        values: list[float] | None = None,
        attrs: dict[str, Any] | None = None,
    ) -> None: ...

    def finish_run(self, flight: Flight, state: RunState, reason: str) -> None: ...

    def launch(self, flight: Flight) -> None: ...


def store_fault(exc: BaseException) -> bool:
    """Whether a run ended because the artifact store failed a write (`StoreError` of the
    field `artifact_store`, raised in the worker): the operator's fault, not the candidate's."""
    cause = _task_cause(exc) or exc
    return isinstance(cause, StoreError) and cause.field == "artifact_store"


class Parking:
    """The parked flights' pauses and each job's store faults in a row."""

    def __init__(
        self,
        trials: Trials,
        settings: Settings,
        flights: Flights,
        event: Callable[..., None],
        fail_job: Callable[[str, str], None],
    ):
        self.trials = trials
        self.settings = settings
        self.flights = flights
        self.event = event
        self.fail_job = fail_job
        self.faults: collections.Counter[str] = collections.Counter()

    def store_fine(self, job_id: str) -> None:
        """A run of the job came back: its faults in a row start again from zero."""
        self.faults.pop(job_id, None)

    def fault(self, flight: Flight, exc: BaseException) -> None:
        """The artifact store failed the flight's run (see the module's docstring): the
        flight waits (its run row stays open) and its job is paused, or, after
        `store_retries` faults in a row, the job fails and its trials are concluded as lost."""
        job_id = flight.job_id
        self.faults[job_id] += 1
        n, bound = self.faults[job_id], self.settings.store_retries
        reason = f"the artifact store failed: {_scrub(describe(exc), self.settings.artifact_store)}"
        self.flights.drop(flight)
        if n >= bound:
            self.flights.parked.append((0.0, flight))  # concluded with the job's others below
            self._conclude_lost(job_id, reason)
            self.faults.pop(job_id, None)
            self.fail_job(job_id, f"{reason} ({n} times in a row)")
            return
        delay = min(STORE_RETRY_MAX_S, self.settings.store_retry_s * 2 ** (n - 1))
        self.flights.parked.append((time.monotonic() + delay, flight))
        log.warning("job %s: %s; paused, retrying in %.1f s", job_id, reason, delay)
        self.event(
            job_id,
            EventKind.RUNNER_ERROR,
            f"{reason} (fault {n} of {bound}); the job is paused, trial "
            f"{flight.trial.number} is tried again in {delay:g} s and not counted",
        )

    def _conclude_lost(self, job_id: str, reason: str) -> None:
        """Every trial of the job in flight or parked concluded as lost (not counted)."""
        self.trials.record_asked()
        mine = self.flights.of(job_id)
        mine += self.flights.unpark(job_id)
        for flight in mine:
            self.trials.stop_task(flight)
            self.trials.tell(
                flight.study,
                flight.trial,
                TrialOutcome.LOST,
                reason,
                TrialState.FAIL,
                attrs=TrialRecord(lost=True).to_attrs(),
            )
            self.trials.finish_run(flight, RunState.FAILED, reason)

    def relaunch(self, job_id: str) -> bool:
        """Launch again the job's parked flights whose pause is over; True while the job
        still has one waiting (it stays paused)."""
        now, waiting = time.monotonic(), False
        for at, flight in [p for p in self.flights.parked if p[1].job_id == job_id]:
            if at > now:
                waiting = True
                continue
            self.flights.parked.remove((at, flight))
            self.trials.launch(flight)
            self.flights.add(flight)
        return waiting
