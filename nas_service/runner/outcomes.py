"""What the runner does with one trial (`Outcomes`, which `Runner` in `nas_service.runner.loop`
holds): launching its training on Ray, recording each run and attempt (`ds_trial_runs`,
`runner.runs`), and concluding it — pruned, diverged, completed, failed, retried after a lost
worker, cancelled — always through `tell` (outcome, reason, attributes, then the state or
the values told to the study).

A trial trains a *plan* of runs, one after the other (its concurrency slot stays one): for
each setting s of `search.tune_settings(spec, params)` (one setting without a `tune` grid),
the seeds k = 0 … seeds−1, each run's `TrainSpec` = the candidate's with the setting's four
training axes and `seed = k`, so seed k of every trial sees the same batches and the same
initialisation (seeds are paired across trials). After each finished run the trial's `train`
attribute holds the runs finished so far, and the run's row is closed ("run i of n") after
the next run's row is opened (same attempt), so a trial in flight always has one open row and
readers of the job's run rows (`nas_service.results.cache`) see the progress. A lost worker is
retried on the same run, `MAX_ATTEMPTS` per trial in all.

The trial's result per setting s: the final validation losses of its seeds, L_s,k (None where
not finite, diverged, or skipped), and mean(L_s) = (1/seeds)·Σ_k L_s,k, None if any is None.
The chosen setting is s* = argmin_s mean(L_s) (the first of equal means); the trial's
`val_loss` objective is mean(L_s*), `val_loss_seeds` the statistics of L_s*, `curve` the
curve of s*'s seed 0. A diverged run gives its setting up (its remaining seeds are skipped);
the trial is `diverged` when every setting was given up (with a single setting: its first
diverged seed, as before a `tune` grid existed).

Held-out confirmation (`confirm` in the spec): after the tuning runs, s* trains on the
confirmation seeds k = seeds … seeds+confirm−1 (the same numbers in every trial, so they pair
across variants), and those score the trial: `val_loss` is their mean, `val_loss_seeds` their
statistics, `curve` the first one's, `confirm` the record (`store.records.ConfirmRecord`). A
loss that chose s* never scores it. A confirmation run that diverges ends the trial
`diverged` (the chosen setting is not stable); its remaining seeds are skipped.

Multi-fidelity (`nas_service.search.scheduler`): a flight is one rung of its trial; each run
is the scheduler's `run_of` the candidate's, and a rung below the last ends in `_pause`
instead of a tell: the rung's record (loss and objective vector, as a finished
trial's would be) is kept in `rungs`, the trial waits (`waiting`) and its run row is closed
("rung r of K: waiting for promotion"); the runner promotes it, or tells it pruned. The last
rung concludes the trial as above. Checkpoints are deleted when a trial is told.

An artifact store that fails a write is the operator's fault, never the candidate's: the
flight is parked and its job paused (`runner.parking`).

Pruning reads seed 0's intermediate losses of a trial with a single setting (the median rule,
or `cannot_reach_front` for several objectives). A trial with a `tune` grid is never pruned:
an intermediate loss of one setting bounds neither the final loss of that setting's other
seeds nor that of the best setting, which is what the trial's value is."""

from __future__ import annotations

import dataclasses
import logging
import math
from collections.abc import Callable
from typing import Any

import optuna
from optuna.trial import FrozenTrial, TrialState
from sqlalchemy import insert
from sqlalchemy.orm import Session, sessionmaker

from nas_service.runner.backend import Backend
from nas_service.runner.failures import describe, is_database_outage
from nas_service.runner.flights import Flight, Flights, Run
from nas_service.runner.parking import Parking, store_fault
from nas_service.runner.runs import RunRows
from nas_service.search.rungs import checkpoint_key, trial_prefix
from nas_service.search.study import (
    bpb_per_loss,
    cannot_reach_front,
    curve_rows,
    objective_values,
    prune_reason,
    report_step,
    seed_statistics,
)
from nas_service.settings import Settings
from nas_service.store import EventKind, RunState, TrialOutcome, TrialRun
from nas_service.store.optuna_storage import OwnedTrials
from nas_service.store.optuna_study import set_user_attrs, storage_of, tell, trial_id_of
from nas_service.store.records import TrainRun, TrialAttr, TrialRecord
from workers.contract import EvalPoint, TrainResult
from workers.store import ArtifactStore

log = logging.getLogger(__name__)

MAX_ATTEMPTS = 3  # a candidate whose worker dies is tried this many times, then failed


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
        written = (attrs or {}) | {TrialAttr.OUTCOME: str(outcome)}
        if reason:
            written[TrialAttr.REASON] = reason
        set_user_attrs(study, trial, written)
        tell(study, trial if isinstance(trial, optuna.Trial) else trial.number, values, state)
    except optuna.exceptions.UpdateFinishedTrialError as exc:
        log.info("trial %d was concluded already: %s", trial.number, exc)
    except ValueError as exc:
        if not str(exc).startswith("Cannot tell a"):
            raise
        log.info("trial %d was concluded already: %s", trial.number, exc)


class Outcomes:
    """What the runner does with one trial: launch its runs, record them, conclude it. It owns
    nothing but the artifact store's handle: the runner's sessions, settings, backend,
    `flights` and run rows are shared; `event` records a job event, `fail_job` fails a job at
    once with a reason (the runner's)."""

    def __init__(
        self,
        settings: Settings,
        Session: sessionmaker[Session],
        backend: Backend,
        flights: Flights,
        runs: RunRows,
        event: Callable[..., None],
        fail_job: Callable[[str, str], None],
    ):
        self.settings = settings
        self.Session = Session
        self.backend = backend
        self.flights = flights
        self.runs = runs
        self.event = event
        self.fail_job = fail_job
        self.parking = Parking(self, settings, flights, event, fail_job)
        self._store: ArtifactStore | None = None

    def record_asked(self) -> None:
        """The trials asked in this pass of the loop recorded together: their attributes
        (architecture and costs) and suggested parameters in one transaction on the
        runner's storage (`OwnedTrials.set_many_user_attrs`), then their run rows in one
        INSERT. Called at the end of each pass and before anything reads a flight's run row
        (a poll, a cancel). A restarted runner asks as many trials in its first pass as the
        cluster has workers: a trial at a time, these were two transactions each while the
        workers waited. On an outage the batch waits for the next call; should the batch
        fail otherwise, its trials are recorded one at a time, and one that fails fails
        alone."""
        batch, self.flights.unrecorded = self.flights.unrecorded, []
        if not batch:
            return
        try:
            by_study: dict[int, tuple[optuna.Study, list[tuple[int, dict[str, Any]]]]] = {}
            for flight, attrs in batch:
                study = flight.study
                by_study.setdefault(id(study), (study, []))[1].append(
                    (trial_id_of(flight.trial), attrs)
                )
            for study, items in by_study.values():
                storage = storage_of(study)
                if isinstance(storage, OwnedTrials):
                    storage.set_many_user_attrs(items)
                else:
                    for flight, attrs in batch:
                        if flight.study is study:
                            set_user_attrs(study, flight.trial, attrs)
            with self.Session.begin() as s:
                ids = s.scalars(
                    insert(TrialRun).returning(TrialRun.id, sort_by_parameter_order=True),
                    [
                        {
                            "job_id": f.job_id,
                            "trial_number": f.trial.number,
                            "params": f.priced.params,
                            "attempt": f.attempt,
                        }
                        for f, _ in batch
                    ],
                ).all()
        except Exception as exc:
            if is_database_outage(exc):
                self.flights.unrecorded = batch + self.flights.unrecorded
                raise
            log.warning("recording %d asked trials together failed (%s)", len(batch), exc)
            for flight, attrs in batch:
                try:
                    set_user_attrs(flight.study, flight.trial, attrs)
                    flight.run_id = self.runs.new(
                        flight.job_id, flight.trial.number, flight.priced.params, flight.attempt
                    )
                except Exception as one:
                    if is_database_outage(one):
                        raise
                    self.stop_task(flight)
                    self.fail(flight, f"the runner could not record this trial: {describe(one)}")
            return
        for (flight, _), run_id in zip(batch, ids, strict=True):
            flight.run_id = run_id

    def launch(self, flight: Flight) -> None:
        """Start the flight's current run: the candidate's `TrainSpec` at the run's setting
        and seed."""
        assert flight.priced.train_spec is not None
        setting = flight.settings[flight.setting]
        base = flight.priced.train_spec.replace(**setting, seed=flight.seed)
        number, s, k = flight.trial.number, flight.setting, flight.seed

        def key(rung: int) -> str:
            return checkpoint_key(flight.job_id, number, s, k, rung)

        run = flight.scheduler.run_of(
            base,
            flight.rung,
            # a confirmation seed has no earlier rung to resume: it trains from the start
            flight.rung if flight.is_confirmation() else flight.first,
            key,
            self.settings.artifact_store,
            self.settings.max_checkpoint_bytes,
        )
        flight.points = []
        flight.gen = self.backend.launch(run)

    # -- outcomes ------------------------------------------------------------------------
    def tell(
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

    def finish_run(self, flight: Flight, state: RunState, reason: str) -> None:
        """The flight's trial was told: its run row closed, the flight dropped, its
        checkpoints (multi-fidelity) deleted."""
        self.runs.close(flight.run_id, state, reason)
        if flight.scheduler.pauses:
            self.forget_checkpoints(flight.job_id, flight.trial.number)
        if flight.next_run_id is not None:  # opened for a run that will never start
            self.runs.drop(flight.next_run_id)
            flight.next_run_id = None
        self.flights.drop(flight)

    def on_point(self, flight: Flight, point: EvalPoint) -> None:
        if not flight.points or flight.points[-1] is not point:  # not again after an outage
            flight.points.append(point)
        if flight.seed != 0 or flight.tuned or flight.spec.pruner == "none":
            return  # see the module's docstring
        if not flight.scheduler.prunes_points():
            return  # the rungs decide which candidates go on
        trial, spec = flight.trial, flight.spec
        reason = None
        train = flight.priced.train_spec
        assert train is not None
        budget_tokens = train.planned_steps() * train.tokens_per_step
        if not spec.multi_objective:
            trial.report(point.val_loss, report_step(spec, point.step, point.tokens, budget_tokens))
            if trial.should_prune():
                reason = prune_reason(flight.study.pruner, point.step, point.val_loss)
        else:
            finished = flight.study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
            curves = [t.user_attrs.get(TrialAttr.CURVE, []) for t in finished]
            reason = cannot_reach_front(
                finished,
                spec,
                flight.priced.metrics,
                point.val_loss,
                point.tokens / budget_tokens,
                curves,
                bpb_per_loss(point.val_bpb, point.val_loss),
            )
        if reason is None:
            return
        self.stop_task(flight)
        curve = curve_rows(flight.points)
        self.tell(
            flight.study,
            trial,
            TrialOutcome.PRUNED,
            reason,
            TrialState.PRUNED,
            attrs=TrialRecord(curve=curve).to_attrs(),
        )
        self.finish_run(flight, RunState.PRUNED, reason)

    def on_result(self, flight: Flight, result: TrainResult) -> None:
        """A run of the plan finished: go on with the next one, or conclude the trial. Safe to
        repeat after a database outage (the backlog hands the same result again)."""
        trial = flight.trial
        self.parking.store_fine(flight.job_id)  # a run came back
        if not flight.runs or flight.runs[-1].result is not result:
            flight.runs.append(Run(flight.setting, flight.seed, result))
        diverged = result.status == "diverged"
        if diverged:
            flight.given_up.add(flight.setting)
        train = flight.summaries()
        following = flight.next_index()
        if following is not None:
            self._next_run(flight, following, train)
            return
        table = flight.table()
        if flight.chosen() is None:  # every setting diverged (recorded, never retried)
            if flight.tuned:
                reason = f"every one of {len(table)} settings diverged; the last: {result.reason}"
            else:
                reason = result.reason or "no finite final loss"
            setting = None if flight.tuned else flight.settings[0]
            self._diverged(flight, reason, TrialRecord(setting=setting, settings=table))
            return
        best = flight.chosen()
        assert best is not None  # some setting has a mean
        confirm = flight.confirmation()
        if confirm is not None and confirm["mean"] is None:  # a confirmation run diverged
            pairs = zip(confirm["seeds"], confirm["losses"], strict=True)
            k = next(k for k, x in pairs if x is None)
            reason = (
                f"the setting chosen on the tuning seeds diverged on confirmation seed {k}: "
                f"{result.reason or 'no finite final loss'}"
            )
            record = TrialRecord(setting=flight.settings[best], settings=table, confirm=confirm)
            self._diverged(flight, reason, record)
            return
        # scored on the confirmation seeds where the job confirms, else on the tuning seeds
        scored = confirm["seeds"] if confirm is not None else list(range(flight.spec.seeds))
        losses = [x for x in (confirm or table[best])["losses"] if x is not None]
        stats = seed_statistics(losses)
        first = next(r for r in flight.runs if r.setting == best and r.seed == scored[0])
        ratio = bpb_per_loss(first.result.final_val_bpb, first.result.final_val_loss)
        values = objective_values(flight.spec, stats["mean"], flight.priced.metrics, ratio)
        seed_stats = stats | {"values": losses}
        record = TrialRecord(
            train=train,
            curve=curve_rows(first.result.curve),
            setting=flight.settings[best],
            settings=table,
            seeds=seed_stats if confirm is None else seed_stats | {"seeds": scored},
            confirm=confirm,
            bpb=None if ratio is None else stats["mean"] * ratio,
            nulls=frozenset({TrialAttr.BPB}),
        )
        attrs = record.to_attrs()
        if not all(math.isfinite(v) for v in values):  # val_bpb of a corpus of raw tokens
            reason = (
                "val_bpb is unknown: the corpus holds raw tokens, not text, so its loss "
                "has no bytes to be counted per"
            )
            self.tell(
                flight.study, trial, TrialOutcome.FAILED, reason, TrialState.FAIL, attrs=attrs
            )
            self.finish_run(flight, RunState.FAILED, reason)
            return
        assert flight.priced.train_spec is not None
        rung = flight.scheduler.rung_record(
            flight.rung,
            stats["mean"],
            values,
            first.result.steps,
            first.result.steps * flight.priced.train_spec.tokens_per_step,
            sorted(flight.given_up),
        )
        if rung is not None:  # a rung of several (`nas_service.search.scheduler`)
            attrs[TrialAttr.RUNGS] = [*flight.records, rung]
            if not flight.last_rung:
                self._pause(flight, attrs, stats["mean"])
                return
        self.tell(flight.study, trial, TrialOutcome.COMPLETED, "", values=values, attrs=attrs)
        self.finish_run(flight, RunState.COMPLETED, "")

    def _diverged(self, flight: Flight, reason: str, record: TrialRecord) -> None:
        """Conclude the flight's trial diverged (recorded, never retried): `record` with every
        run so far and the last run's curve."""
        last = flight.runs[-1].result
        attrs = dataclasses.replace(
            record, train=flight.summaries(), curve=curve_rows(last.curve)
        ).to_attrs()
        self.tell(
            flight.study, flight.trial, TrialOutcome.DIVERGED, reason, TrialState.FAIL, attrs=attrs
        )
        self.finish_run(flight, RunState.DIVERGED, reason)

    def _pause(self, flight: Flight, attrs: dict[str, Any], loss: float) -> None:
        """A rung below the last is done: the trial keeps its record and waits for promotion
        (`nas_service.search.rungs`). Its loss reported, then its attributes and the rung it
        waits at in one transaction (a reader that sees it waiting sees its record), then its run
        row closed; the previous rung's checkpoints are dropped (this rung's replace them)."""
        trial, rung = flight.trial, flight.rung
        if not flight.spec.multi_objective:  # the sampler reads a pruned trial's last value
            trial.report(loss, rung)
        set_user_attrs(flight.study, trial, attrs | {TrialAttr.WAITING: rung})  # one transaction
        waiting = f"rung {rung + 1} of {flight.scheduler.rungs}: waiting for promotion"
        self.runs.close(flight.run_id, RunState.COMPLETED, waiting)
        if flight.next_run_id is not None:
            self.runs.drop(flight.next_run_id)
            flight.next_run_id = None
        self.flights.drop(flight)
        if rung > flight.first:
            for s, k in flight.plan:
                self._delete_artifact(checkpoint_key(flight.job_id, trial.number, s, k, rung - 1))

    def _artifacts(self) -> ArtifactStore:
        store = self._store
        if store is None:
            store = self._store = ArtifactStore(self.settings.artifact_store)
        return store

    def _delete_artifact(self, key: str, prefix: bool = False) -> None:
        """Delete a checkpoint (or every one under a prefix); a store that fails is logged,
        never a fault of the trial (the checkpoints stay until the job's are deleted)."""
        try:
            store = self._artifacts()
            store.delete_prefix(key) if prefix else store.delete(key)
        except Exception as exc:
            log.warning("could not delete the checkpoints %s: %s", key, describe(exc))

    def forget_checkpoints(self, job_id: str, number: int | None = None) -> None:
        """Delete a told trial's checkpoints (or, without a number, the job's)."""
        self._delete_artifact(trial_prefix(job_id, number) if number is not None else job_id, True)

    def _next_run(self, flight: Flight, following: int, train: list[TrainRun]) -> None:
        """Record the finished run and start run `following` of the plan: the `train`
        attribute first, then the next run's row, then the finished run's row closed (so a
        reader that sees the rows change sees the attribute, and the trial always has an open
        row for recovery to close)."""
        run = flight.runs[-1]
        done = f"run {flight.index + 1} of {len(flight.plan)}"
        diverged = run.result.status == "diverged"
        flight.trial.set_user_attr(TrialAttr.TRAIN, train)
        if flight.next_run_id is None:
            flight.next_run_id = self.runs.new(
                flight.job_id, flight.trial.number, flight.priced.params, flight.attempt
            )
        state = RunState.DIVERGED if diverged else RunState.COMPLETED
        self.runs.close(flight.run_id, state, f"{done}: {run.result.reason}" if diverged else done)
        flight.run_id, flight.next_run_id = flight.next_run_id, None
        flight.index = following
        self.launch(flight)

    def fail(self, flight: Flight, reason: str) -> None:
        self.tell(flight.study, flight.trial, TrialOutcome.FAILED, reason, TrialState.FAIL)
        self.finish_run(flight, RunState.FAILED, reason)
        self.event(flight.job_id, EventKind.TRIAL_FAILED, f"trial {flight.trial.number}: {reason}")

    def lost_worker(self, flight: Flight, exc: BaseException) -> None:
        if store_fault(exc):
            self.parking.fault(flight, exc)
            return
        reason = describe(exc)
        if self.backend.retryable(exc) and flight.attempt < MAX_ATTEMPTS:
            self.runs.close(flight.run_id, RunState.LOST, reason)
            flight.attempt += 1
            flight.run_id = self.runs.new(
                flight.job_id, flight.trial.number, flight.priced.params, flight.attempt
            )
            self.event(
                flight.job_id,
                EventKind.TRIAL_RETRY,
                f"trial {flight.trial.number} attempt {flight.attempt}: {reason}",
            )
            self.launch(flight)
            return
        tries = f"after {flight.attempt} attempts: " if flight.attempt > 1 else ""
        self.fail(flight, tries + reason)

    def stop_task(self, flight: Flight) -> None:
        try:
            self.backend.cancel(flight.gen)
        except Exception as exc:  # already finished or its worker gone: nothing to stop
            log.debug("cancel of trial %d: %s", flight.trial.number, exc)

    def cancel(self, job_id: str, outcome: TrialOutcome, reason: str) -> None:
        """Every trial of the job in flight or parked told `outcome`."""
        self.record_asked()
        parked = self.flights.unpark(job_id)
        for flight in self.flights.of(job_id) + parked:
            self.stop_task(flight)
            self.tell(flight.study, flight.trial, outcome, reason, TrialState.FAIL)
            self.finish_run(flight, RunState.FAILED, reason)

    def abandon(self) -> None:
        """Stop every task without telling anything (the lease holder recovers them)."""
        for flight in self.flights:
            self.stop_task(flight)
        self.flights.clear()  # the asked ones written by nobody: the lease holder recovers them
