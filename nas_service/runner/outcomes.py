"""The trial half of the runner: launching a trial's training on Ray, recording each run
and attempt (`ds_trial_runs`), and concluding a trial — pruned, diverged, completed, failed,
retried after a lost worker, cancelled — always through `_tell` (outcome, reason, attributes,
then the state or the values told to the study). `Runner` (`nas_service.runner.loop`) builds on it.

A trial trains a *plan* of runs, one after the other (its concurrency slot stays one): for
each setting s of `search.tune_settings(spec, params)` (one setting without a `tune` grid),
the seeds k = 0 … seeds−1, each run's `TrainSpec` = the candidate's with the setting's four
training axes and `seed = k`, so seed k of every trial sees the same batches and the same
initialisation (seeds are paired across trials). After each finished run the trial's `train`
attribute holds the runs finished so far, and the run's row is closed ("run i of n") after
the next run's row is opened (same attempt), so a trial in flight always has one open row and
readers of the job's run rows (`nas_service.results.answers`) see the progress. A lost worker is
retried on the same run, `MAX_ATTEMPTS` per trial in all.

The trial's result per setting s: the final validation losses of its seeds, L_s,k (None where
not finite, diverged, or skipped), and mean(L_s) = (1/seeds)·Σ_k L_s,k, None if any is None.
The chosen setting is s* = argmin_s mean(L_s) (the first of equal means); the trial's
`val_loss` objective is mean(L_s*), `val_loss_seeds` the statistics of L_s*, `curve` the
curve of s*'s seed 0. A diverged run gives its setting up (its remaining seeds are skipped);
the trial is `diverged` when every setting was given up (with a single setting: its first
diverged seed, as before a `tune` grid existed).

Multi-fidelity (`JobSpec.fidelity`, `nas_service.search.rungs`): a flight is one rung of its trial;
each run is `rungs.rung_spec` of the candidate's, and a rung below the last ends in
`_pause` instead of a tell: the rung's record (loss and objective vector, as a finished
trial's would be) is kept in `rungs`, the trial waits (`waiting`) and its run row is closed
("rung r of K: waiting for promotion"); the runner promotes it, or tells it pruned. The last
rung concludes the trial as above. Checkpoints are deleted when a trial is told.

An artifact store that fails a write (full, read-only, gone) is the operator's fault, never
the candidate's (`_store_fault`): the trial is not told; its job pauses (nothing new is
asked for it) and the run is launched again after `store_retry_s`, then twice that, and so
on (at most 60 s); once the store has failed `store_retries` times in a row the job fails
with the reason and its trials in flight are concluded as lost (never counted). Reasons name
the store only as `<store>`: its path or URL may hold credentials (`spec.checks._scrub`).

Pruning reads seed 0's intermediate losses of a trial with a single setting (the median rule,
or `cannot_reach_front` for several objectives). A trial with a `tune` grid is never pruned:
an intermediate loss of one setting bounds neither the final loss of that setting's other
seeds nor that of the best setting, which is what the trial's value is."""

from __future__ import annotations

import collections
import datetime as dt
import logging
import math
import statistics
import time
from dataclasses import dataclass, field
from typing import Any

import optuna
from optuna.trial import FrozenTrial, TrialState
from sqlalchemy import insert, select, update
from sqlalchemy.orm import Session, sessionmaker

from nas_service.runner.backend import Backend
from nas_service.runner.failures import _task_cause, describe, is_database_outage
from nas_service.search.rungs import checkpoint_key, trial_prefix
from nas_service.search.scheduler import Scheduler
from nas_service.search.study import (
    Priced,
    bpb_per_loss,
    cannot_reach_front,
    curve_rows,
    objective_values,
    prune_reason,
    report_step,
    seed_statistics,
    train_summary,
)
from nas_service.settings import Settings
from nas_service.spec import JobSpec
from nas_service.spec.checks import _scrub
from nas_service.store import EventKind, RunState, TrialOutcome, TrialRun
from nas_service.store.optuna_storage import OwnedTrials, set_user_attrs, tell
from nas_service.store.records import (
    RungRecord,
    SettingRecord,
    TrainRun,
    TrialAttr,
    TrialRecord,
)
from workers.contract import EvalPoint, TrainResult
from workers.store import ArtifactStore, StoreError

log = logging.getLogger(__name__)

MAX_ATTEMPTS = 3  # a candidate whose worker dies is tried this many times, then failed
STORE_RETRY_MAX_S = 60.0  # the longest pause after an artifact store fault


@dataclass
class Run:
    """A finished training run of a trial: its setting (an index into the flight's
    settings), its seed and what came back."""

    setting: int
    seed: int
    result: TrainResult


@dataclass
class Flight:
    """One trial in flight: its candidate, its plan of runs (every setting × every seed,
    setting-major), the run being trained (`index` into `plan`) and what came back."""

    job_id: str
    spec: JobSpec
    scheduler: Scheduler
    study: optuna.Study
    trial: optuna.Trial
    priced: Priced
    run_id: int
    settings: list[dict[str, float]] = field(default_factory=lambda: [{}])
    index: int = 0
    attempt: int = 1
    gen: Any = None
    points: list[EvalPoint] = field(default_factory=list)
    runs: list[Run] = field(default_factory=list)
    given_up: set[int] = field(default_factory=set)  # settings a diverged run ended
    next_run_id: int | None = None  # the next run's row, opened before this one's is closed
    rung: int = 0  # the rung trained (multi-fidelity; 0 without: the one and last rung)
    first: int = 0  # the trial's first rung (its Hyperband bracket)
    earlier: list[TrainRun] = field(default_factory=list)  # `train` of earlier rungs
    records: list[RungRecord] = field(default_factory=list)  # `rungs` of earlier rungs

    @property
    def plan(self) -> list[tuple[int, int]]:
        """(setting, seed) of every run, in the order they are trained."""
        return [(s, k) for s in range(len(self.settings)) for k in range(self.spec.seeds)]

    @property
    def setting(self) -> int:
        return self.plan[self.index][0]

    @property
    def seed(self) -> int:
        return self.plan[self.index][1]

    @property
    def tuned(self) -> bool:
        """Whether the trial trains at several settings (a `tune` grid)."""
        return len(self.settings) > 1

    def next_index(self) -> int | None:
        """The next run of the plan whose setting has not been given up, if any."""
        plan = self.plan
        return next(
            (i for i in range(self.index + 1, len(plan)) if plan[i][0] not in self.given_up),
            None,
        )

    @property
    def last_rung(self) -> bool:
        return self.rung == self.scheduler.rungs - 1

    def summaries(self) -> list[TrainRun]:
        """The `train` attribute: every finished run's summary (earlier rungs' first), its
        seed, setting, rung and evaluation curve."""
        return self.earlier + [
            train_summary(r.result)
            | {
                "seed": r.seed,
                "setting": self.settings[r.setting],
                "rung": self.rung,
                "curve": curve_rows(r.result.curve),
            }
            for r in self.runs
        ]

    def table(self) -> list[SettingRecord]:
        """The `settings` attribute: per setting, its seeds' final losses and their mean."""
        losses: dict[tuple[int, int], float | None] = {}
        for r in self.runs:
            loss = r.result.final_val_loss
            ok = r.result.status != "diverged" and math.isfinite(loss)
            losses[r.setting, r.seed] = loss if ok else None
        rows: list[SettingRecord] = []
        for s, setting in enumerate(self.settings):
            seeds = [losses.get((s, k)) for k in range(self.spec.seeds)]
            finite = [x for x in seeds if x is not None]
            mean = statistics.fmean(finite) if len(finite) == len(seeds) else None
            rows.append({"setting": setting, "losses": seeds, "mean": mean})
        return rows


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


class TrialOutcomes:
    """What the runner does with one trial, given its sessions, settings and flights."""

    Session: sessionmaker[Session]
    backend: Backend
    settings: Settings
    cluster: str
    flights: list[Flight]
    _event: Any

    #: Trials asked in this pass of the loop whose attributes and run row are not written
    #: yet (`_record_asked`), with their attributes.
    _unrecorded: list[tuple[Flight, dict[str, Any]]]
    #: Flights whose run the artifact store failed, with the monotonic time of their next
    #: launch (their job is paused meanwhile), and each job's store faults in a row.
    parked: list[tuple[float, Flight]]
    store_faults: collections.Counter[str]

    def _fail_job(self, job_id: str, reason: str) -> None:
        """Fail the job at once with `reason` (the runner's `_job_error`)."""
        raise NotImplementedError

    def _record_asked(self) -> None:
        """The trials asked in this pass of the loop recorded together: their attributes
        (architecture and costs) and suggested parameters in one transaction on the
        runner's storage (`OwnedTrials.set_many_user_attrs`), then their run rows in one
        INSERT. Called at the end of each pass and before anything reads a flight's run row
        (a poll, a cancel). A restarted runner asks as many trials in its first pass as the
        cluster has workers: a trial at a time, these were two transactions each while the
        workers waited. On an outage the batch waits for the next call; should the batch
        fail otherwise, its trials are recorded one at a time, and one that fails fails
        alone."""
        batch, self._unrecorded = self._unrecorded, []
        if not batch:
            return
        try:
            by_study: dict[int, tuple[optuna.Study, list[tuple[int, dict[str, Any]]]]] = {}
            for flight, attrs in batch:
                study = flight.study
                by_study.setdefault(id(study), (study, []))[1].append(
                    (flight.trial._trial_id, attrs)
                )
            for study, items in by_study.values():
                storage = study._storage
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
                self._unrecorded = batch + self._unrecorded
                raise
            log.warning("recording %d asked trials together failed (%s)", len(batch), exc)
            for flight, attrs in batch:
                try:
                    set_user_attrs(flight.study, flight.trial, attrs)
                    flight.run_id = self._new_run(
                        flight.job_id, flight.trial.number, flight.priced.params, flight.attempt
                    )
                except Exception as one:
                    if is_database_outage(one):
                        raise
                    self._stop_task(flight)
                    self._fail(flight, f"the runner could not record this trial: {describe(one)}")
            return
        for (flight, _), run_id in zip(batch, ids, strict=True):
            flight.run_id = run_id

    def _new_run(self, job_id: str, number: int, params: dict[str, Any], attempt: int) -> int:
        with self.Session.begin() as s:
            run = TrialRun(job_id=job_id, trial_number=number, params=params, attempt=attempt)
            s.add(run)
            s.flush()
            return run.id

    def _drop_run(self, run_id: int) -> None:
        with self.Session.begin() as s:
            run = s.get(TrialRun, run_id)
            if run is not None:
                s.delete(run)

    def _launch(self, flight: Flight) -> None:
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
            flight.first,
            key,
            self.settings.artifact_store,
            self.settings.max_checkpoint_bytes,
        )
        flight.points = []
        flight.gen = self.backend.launch(run)

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
        """The run's row closed with `state`, if it is still open (one UPDATE)."""
        with self.Session.begin() as s:
            s.execute(
                update(TrialRun)
                .where(TrialRun.id == run_id, TrialRun.state == RunState.RUNNING)
                .values(state=state, reason=reason, finished_at=dt.datetime.now(dt.UTC))
            )

    def _touch_run(
        self, job_id: str, number: int, reason: str, state: RunState = RunState.PRUNED
    ) -> None:
        """A waiting trial (no run open) was told: its last run row says so, so a reader of
        the job's rows (`nas_service.results.answers`) sees the change."""
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

    def _finish_run(self, flight: Flight, state: RunState, reason: str) -> None:
        """The flight's trial was told: its run row closed, the flight dropped, its
        checkpoints (multi-fidelity) deleted."""
        self._close_run(flight.run_id, state, reason)
        if flight.scheduler.pauses:
            self.forget_checkpoints(flight.job_id, flight.trial.number)
        if flight.next_run_id is not None:  # opened for a run that will never start
            self._drop_run(flight.next_run_id)
            flight.next_run_id = None
        if flight in self.flights:
            self.flights.remove(flight)

    def _on_point(self, flight: Flight, point: EvalPoint) -> None:
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
        self._stop_task(flight)
        curve = curve_rows(flight.points)
        self._tell(
            flight.study,
            trial,
            TrialOutcome.PRUNED,
            reason,
            TrialState.PRUNED,
            attrs=TrialRecord(curve=curve).to_attrs(),
        )
        self._finish_run(flight, RunState.PRUNED, reason)

    def _on_result(self, flight: Flight, result: TrainResult) -> None:
        """A run of the plan finished: go on with the next one, or conclude the trial. Safe to
        repeat after a database outage (the backlog hands the same result again)."""
        trial = flight.trial
        self.store_faults.pop(flight.job_id, None)  # a run came back: the store is fine
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
        means = [(row["mean"], s) for s, row in enumerate(table) if row["mean"] is not None]
        if not means:  # every setting diverged (recorded, never retried)
            if flight.tuned:
                reason = f"every one of {len(table)} settings diverged; the last: {result.reason}"
            else:
                reason = result.reason or "no finite final loss"
            attrs = TrialRecord(
                train=train,
                curve=curve_rows(result.curve),
                setting=None if flight.tuned else flight.settings[0],
                settings=table,
            ).to_attrs()
            self._tell(
                flight.study, trial, TrialOutcome.DIVERGED, reason, TrialState.FAIL, attrs=attrs
            )
            self._finish_run(flight, RunState.DIVERGED, reason)
            return
        best = min(means, key=lambda m: m[0])[1]  # the first of equal means
        losses = [x for x in table[best]["losses"] if x is not None]
        stats = seed_statistics(losses)
        first = next(r for r in flight.runs if r.setting == best and r.seed == 0)
        ratio = bpb_per_loss(first.result.final_val_bpb, first.result.final_val_loss)
        values = objective_values(flight.spec, stats["mean"], flight.priced.metrics, ratio)
        record = TrialRecord(
            train=train,
            curve=curve_rows(first.result.curve),
            setting=flight.settings[best],
            settings=table,
            seeds=stats | {"values": losses},
            bpb=None if ratio is None else stats["mean"] * ratio,
            nulls=frozenset({TrialAttr.BPB}),
        )
        attrs = record.to_attrs()
        if not all(math.isfinite(v) for v in values):  # val_bpb of a corpus of raw tokens
            reason = (
                "val_bpb is unknown: the corpus holds raw tokens, not text, so its loss "
                "has no bytes to be counted per"
            )
            self._tell(
                flight.study, trial, TrialOutcome.FAILED, reason, TrialState.FAIL, attrs=attrs
            )
            self._finish_run(flight, RunState.FAILED, reason)
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
        self._tell(flight.study, trial, TrialOutcome.COMPLETED, "", values=values, attrs=attrs)
        self._finish_run(flight, RunState.COMPLETED, "")

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
        self._close_run(flight.run_id, RunState.COMPLETED, waiting)
        if flight.next_run_id is not None:
            self._drop_run(flight.next_run_id)
            flight.next_run_id = None
        if flight in self.flights:
            self.flights.remove(flight)
        if rung > flight.first:
            for s, k in flight.plan:
                self._delete_artifact(checkpoint_key(flight.job_id, trial.number, s, k, rung - 1))

    def _artifacts(self) -> ArtifactStore:
        store: ArtifactStore | None = getattr(self, "_store", None)
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
            flight.next_run_id = self._new_run(
                flight.job_id, flight.trial.number, flight.priced.params, flight.attempt
            )
        state = RunState.DIVERGED if diverged else RunState.COMPLETED
        self._close_run(flight.run_id, state, f"{done}: {run.result.reason}" if diverged else done)
        flight.run_id, flight.next_run_id = flight.next_run_id, None
        flight.index = following
        self._launch(flight)

    def _fail(self, flight: Flight, reason: str) -> None:
        self._tell(flight.study, flight.trial, TrialOutcome.FAILED, reason, TrialState.FAIL)
        self._finish_run(flight, RunState.FAILED, reason)
        self._event(flight.job_id, EventKind.TRIAL_FAILED, f"trial {flight.trial.number}: {reason}")

    def _lost_worker(self, flight: Flight, exc: BaseException) -> None:
        if store_fault(exc):
            self._store_fault(flight, exc)
            return
        reason = describe(exc)
        if self.backend.retryable(exc) and flight.attempt < MAX_ATTEMPTS:
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

    def _store_fault(self, flight: Flight, exc: BaseException) -> None:
        """The artifact store failed the flight's run (see the module's docstring): the
        flight waits (its run row stays open) and its job is paused, or, after
        `store_retries` faults in a row, the job fails and its trials are concluded as lost."""
        job_id = flight.job_id
        self.store_faults[job_id] += 1
        n, bound = self.store_faults[job_id], self.settings.store_retries
        reason = f"the artifact store failed: {_scrub(describe(exc), self.settings.artifact_store)}"
        if flight in self.flights:
            self.flights.remove(flight)
        if n >= bound:
            self.parked.append((0.0, flight))  # concluded with the job's others below
            self._conclude_store_lost(job_id, reason)
            self.store_faults.pop(job_id, None)
            self._fail_job(job_id, f"{reason} ({n} times in a row)")
            return
        delay = min(STORE_RETRY_MAX_S, self.settings.store_retry_s * 2 ** (n - 1))
        self.parked.append((time.monotonic() + delay, flight))
        log.warning("job %s: %s; paused, retrying in %.1f s", job_id, reason, delay)
        self._event(
            job_id,
            EventKind.RUNNER_ERROR,
            f"{reason} (fault {n} of {bound}); the job is paused, trial "
            f"{flight.trial.number} is tried again in {delay:g} s and not counted",
        )

    def _conclude_store_lost(self, job_id: str, reason: str) -> None:
        """Every trial of the job in flight or parked concluded as lost (not counted)."""
        self._record_asked()
        mine = [f for f in self.flights if f.job_id == job_id]
        mine += [f for _, f in self.parked if f.job_id == job_id]
        self.parked = [(at, f) for at, f in self.parked if f.job_id != job_id]
        for flight in mine:
            self._stop_task(flight)
            self._tell(
                flight.study,
                flight.trial,
                TrialOutcome.LOST,
                reason,
                TrialState.FAIL,
                attrs=TrialRecord(lost=True).to_attrs(),
            )
            self._finish_run(flight, RunState.FAILED, reason)

    def _relaunch_parked(self, job_id: str) -> bool:
        """Launch again the job's parked flights whose pause is over; True while the job
        still has one waiting (it stays paused)."""
        now, waiting = time.monotonic(), False
        for at, flight in [p for p in self.parked if p[1].job_id == job_id]:
            if at > now:
                waiting = True
                continue
            self.parked.remove((at, flight))
            self._launch(flight)
            self.flights.append(flight)
        return waiting

    def _stop_task(self, flight: Flight) -> None:
        try:
            self.backend.cancel(flight.gen)
        except Exception as exc:  # already finished or its worker gone: nothing to stop
            log.debug("cancel of trial %d: %s", flight.trial.number, exc)

    def _cancel_flights(self, job_id: str, outcome: TrialOutcome, reason: str) -> None:
        self._record_asked()
        parked = [f for _, f in self.parked if f.job_id == job_id]
        self.parked = [(at, f) for at, f in self.parked if f.job_id != job_id]
        for flight in [f for f in self.flights if f.job_id == job_id] + parked:
            self._stop_task(flight)
            self._tell(flight.study, flight.trial, outcome, reason, TrialState.FAIL)
            self._finish_run(flight, RunState.FAILED, reason)

    def _abandon_flights(self) -> None:
        """Stop every task without telling anything (the lease holder recovers them)."""
        for flight in self.flights:
            self._stop_task(flight)
        self.flights.clear()
        self.parked.clear()
        self._unrecorded = []  # written by nobody: the lease holder recovers their trials


def store_fault(exc: BaseException) -> bool:
    """Whether a run ended because the artifact store failed a write (`StoreError` of the
    field `artifact_store`, raised in the worker): the operator's fault, not the candidate's."""
    cause = _task_cause(exc) or exc
    return isinstance(cause, StoreError) and cause.field == "artifact_store"
