"""A trial's run rows (`ds_trial_runs`): one per attempt of each run of its plan, opened when
the run starts and closed with its state and reason, so readers of the job's runs
(`nas_service.results.cache`) see the progress."""

from __future__ import annotations

import datetime as dt
from typing import Any

from sqlalchemy import select, update
from sqlalchemy.orm import Session, sessionmaker

from nas_service.store import RunState, TrialRun


class RunRows:
    """Opens, closes and drops run rows through `Session`."""

    def __init__(self, Session: sessionmaker[Session]):
        self.Session = Session

    def new(self, job_id: str, number: int, params: dict[str, Any], attempt: int) -> int:
        """Open a row for trial `number`'s next run; its id."""
        with self.Session.begin() as s:
            run = TrialRun(job_id=job_id, trial_number=number, params=params, attempt=attempt)
            s.add(run)
            s.flush()
            return run.id

    def drop(self, run_id: int) -> None:
        """Delete a row opened for a run that will never start."""
        with self.Session.begin() as s:
            run = s.get(TrialRun, run_id)
            if run is not None:
                s.delete(run)

    def close(self, run_id: int, state: RunState, reason: str) -> None:
        """The run's row closed with `state`, if it is still open (one UPDATE)."""
        with self.Session.begin() as s:
            s.execute(
                update(TrialRun)
                .where(TrialRun.id == run_id, TrialRun.state == RunState.RUNNING)
                .values(state=state, reason=reason, finished_at=dt.datetime.now(dt.UTC))
            )

    def touch(
        self, job_id: str, number: int, reason: str, state: RunState = RunState.PRUNED
    ) -> None:
        """A waiting trial (no run open) was told: its last run row says so, so a reader of
        the job's rows (`nas_service.results.cache`) sees the change."""
        with self.Session.begin() as s:
            run = s.scalars(
                select(TrialRun)
                .where(TrialRun.job_id == job_id, TrialRun.trial_number == number)
                .order_by(TrialRun.id.desc())
                .limit(1)
            ).first()
            if run is not None:
                run.state, run.reason = state, reason
                run.finished_at = dt.datetime.now(dt.UTC)
