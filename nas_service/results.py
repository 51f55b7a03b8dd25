"""A job's results as a table: one row per Optuna trial with its parameters, architecture,
every metric (the measured loss and each cost), outcome and curve — what the trial, Pareto,
optimum and scaling queries read. Loaded once per job and refreshed only when the study
changed, through Optuna's storage API alone (never SQL on its tables), so queries stay fast
at 10,000 trials.

The fingerprint rests on two facts of Optuna's storage: trial numbers are 0, 1, 2, … in
order of creation, and a finished trial never changes. So a table of n trials is current
while trial n does not exist (one indexed lookup) and none of its unfinished trials has
finished. For a job's study the latter is read from the service's own `ds_trial_runs`
(one indexed aggregate: the runner closes or drops a trial's run row after telling the
trial, and recovery closes the rows of what it concludes); for any other study, from the
states of the study's unfinished trials."""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

import numpy as np
import optuna
from optuna.trial import FrozenTrial, TrialState
from sqlalchemy import func, select
from sqlalchemy.orm import Session

from nas_service.analysis import (
    compute_multiplier,
    fit_optimum,
    fit_scaling,
    pareto_front,
)
from nas_service.db import TrialOutcome, TrialRun, TrialStatus
from nas_service.search import ATTR_LOST, ATTR_OUTCOME

T = TypeVar("T")

STATE_NAMES = {
    TrialState.COMPLETE: TrialStatus.COMPLETE,
    TrialState.PRUNED: TrialStatus.PRUNED,
    TrialState.FAIL: TrialStatus.FAILED,
    TrialState.RUNNING: TrialStatus.RUNNING,
    TrialState.WAITING: TrialStatus.WAITING,
}
_UNFINISHED = (TrialState.RUNNING, TrialState.WAITING)
#: A table's fingerprint: (its number of trials, whether trial n exists, and its job's run
#: rows as (count, last id, last finish) or else its unfinished trials as (id, state)).
Fingerprint = tuple[int, bool, tuple[Any, ...]]


@dataclass
class TrialRow:
    number: int
    state: TrialStatus
    outcome: TrialOutcome | str  # "" for a trial finished without an outcome (not the runner's)
    reason: str
    params: dict[str, Any]
    arch: dict[str, Any]
    metrics: dict[str, float]
    values: list[float] | None
    train: list[dict[str, Any]]
    curve: list[list[float]]
    lost: bool
    duration_s: float | None
    budget: float | None = None  # FLOPs or tokens the trial was trained with
    trial_id: int = -1  # Optuna's storage id (for incremental refreshes)

    def __post_init__(self) -> None:
        self.state = TrialStatus(self.state)  # a plain string of the vocabulary is taken too

    @property
    def variant(self) -> str:
        return str(self.arch.get("variant", "")) if self.arch else ""

    def as_dict(self, curve: bool = False) -> dict[str, Any]:
        out = {
            "number": self.number,
            "state": self.state,
            "outcome": self.outcome,
            "reason": self.reason,
            "variant": self.variant,
            "params": self.params,
            "arch": self.arch,
            "metrics": self.metrics,
            "values": self.values,
            "train": self.train,
            "duration_s": self.duration_s,
            "budget": self.budget,
        }
        if curve:
            out["curve"] = self.curve
        return out


def _outcome(t: FrozenTrial) -> TrialOutcome | str:
    value = t.user_attrs.get(ATTR_OUTCOME)
    if value is None:
        return TrialOutcome.RUNNING if t.state == TrialState.RUNNING else ""
    try:
        return TrialOutcome(value)
    except ValueError:  # written by something else than this service
        return str(value)


def _row(t: FrozenTrial, objectives: list[str], budget: float | None) -> TrialRow:
    attrs = t.user_attrs
    metrics = dict(attrs.get("costs", {}))
    train = attrs.get("train", [])
    if t.state == TrialState.COMPLETE and t.values is not None:
        for name, value in zip(objectives, t.values, strict=False):
            metrics[name] = value
    elif train and train[0].get("final_val_loss") is not None:
        metrics["val_loss"] = train[0]["final_val_loss"]
    duration = None
    if t.datetime_start and t.datetime_complete:
        duration = (t.datetime_complete - t.datetime_start).total_seconds()
    return TrialRow(
        number=t.number,
        state=STATE_NAMES[t.state],
        outcome=_outcome(t),
        reason=str(attrs.get("reason", "")),
        params=dict(t.params),
        arch=dict(attrs.get("arch", {})),
        metrics=metrics,
        values=list(t.values) if t.values is not None else None,
        train=train,
        curve=attrs.get("curve", []),
        lost=bool(attrs.get(ATTR_LOST)),
        duration_s=duration,
        budget=float(t.params["budget"]) if "budget" in t.params else budget,
        trial_id=t._trial_id,
    )


@dataclass
class JobResults:
    study_name: str
    objectives: list[str]
    rows: list[TrialRow] = field(default_factory=list)
    fingerprint: Fingerprint = (0, False, ())
    memo: dict[Any, Any] = field(default_factory=dict)  # query answers for this fingerprint

    def memoised(self, key: Any, compute: Callable[[], T]) -> T:
        """The answer to a query, computed once per state of the study (at most 1024 kept
        per state: a client asking for ever new pages is answered, not remembered)."""
        if key not in self.memo:
            if len(self.memo) >= 1024:
                return compute()
            self.memo[key] = compute()
        value: T = self.memo[key]
        return value

    def counted(self) -> list[TrialRow]:
        return [r for r in self.rows if not r.lost and r.state.finished]


def _unfinished(rows: list[TrialRow]) -> tuple[tuple[int, str], ...]:
    return tuple(sorted((r.trial_id, str(r.state)) for r in rows if not r.state.finished))


class ResultsCache:
    """Per-study result tables, refreshed when the study's fingerprint changes."""

    def __init__(
        self,
        storage: optuna.storages.RDBStorage,
        fresh_s: float = 0.0,
        job_runs: bool = False,
    ) -> None:
        self.storage = storage
        self.fresh_s = fresh_s
        # a job's run rows (the service's tables, same database) tell when its study changed;
        # they are read on the storage's own pool, never on the requests' (see `_runs`)
        self.job_runs = job_runs
        self._jobs: dict[str, str] = {}  # study name -> job id
        self._cache: dict[str, JobResults] = {}
        self._study_ids: dict[str, int] = {}
        self._checked: dict[str, tuple[float, Fingerprint]] = {}
        self._recent: dict[Any, tuple[float, Any]] = {}
        self._lock = threading.Lock()
        self._study_locks: dict[str, threading.Lock] = {}

    def recent(self, key: Any, compute: Callable[[], T]) -> T:
        """`compute()`, reused for `fresh_s` seconds per key (a job's row, say: pollers
        asking many times a second cost the database one read per `fresh_s`). An exception
        is never kept."""
        now = time.monotonic()
        hit = self._recent.get(key)
        if hit is not None and now - hit[0] < self.fresh_s:
            kept: T = hit[1]
            return kept
        value = compute()
        if self.fresh_s > 0:
            if len(self._recent) >= 10_000:  # bounded: stale entries go first
                self._recent = {k: v for k, v in self._recent.items() if now - v[0] < self.fresh_s}
            self._recent[key] = (now, value)
        return value

    def forget(self, key: Any) -> None:
        self._recent.pop(key, None)

    def _study_id(self, study_name: str) -> int:
        if study_name not in self._study_ids:
            self._study_ids[study_name] = self.storage.get_study_id_from_name(study_name)
        return self._study_ids[study_name]

    def _fingerprint(self, study_name: str) -> Fingerprint:
        """Changes whenever a trial is added, finishes or changes state. A fingerprint read
        less than `fresh_s` ago is reused: many clients polling one job then cost the
        database one read per `fresh_s`."""
        now = time.monotonic()
        checked = self._checked.get(study_name)
        if checked is not None and now - checked[0] < self.fresh_s:
            return checked[1]
        fp = self._read_fingerprint(study_name)
        self._checked[study_name] = (now, fp)
        return fp

    def _read_fingerprint(self, study_name: str) -> Fingerprint:
        """The study's fingerprint as seen from the cached table: whether trial n (the
        table's count) exists, and the states of the study's unfinished trials (read only
        when the table has some, or a new trial appeared: else none can exist)."""
        sid = self._study_id(study_name)
        with self._lock:
            cached = self._cache.get(study_name)
        n = len(cached.rows) if cached is not None else 0
        more = self._trial_id(sid, n) is not None
        job_id = self._jobs.get(study_name)
        if job_id is not None and self.job_runs:
            return (n, more, self._runs(job_id))
        if cached is not None and not more and not _unfinished(cached.rows):
            return (n, False, ())
        unfinished = self.storage.get_all_trials(sid, deepcopy=False, states=_UNFINISHED)
        return (
            n,
            more,
            tuple(sorted((t._trial_id, str(STATE_NAMES[t.state])) for t in unfinished)),
        )

    def _runs(self, job_id: str) -> tuple[str, ...]:
        """The job's run rows: how many, the last made, the last finish (one indexed read).

        On the Optuna storage's engine, not the requests' sessions: a request asks for
        results while its own transaction holds a connection of the requests' pool, and
        readers queued behind this study's refresh (`get`) would hold the very connections
        the refresh needs."""
        with Session(self.storage.engine) as s:
            row = s.execute(
                select(
                    func.count(TrialRun.id), func.max(TrialRun.id), func.max(TrialRun.finished_at)
                ).where(TrialRun.job_id == job_id)
            ).one()
        return tuple(str(v) for v in row)

    def _trial_id(self, study_id: int, number: int) -> int | None:
        try:
            return self.storage.get_trial_id_from_study_id_trial_number(study_id, number)
        except KeyError:
            return None

    def get(
        self,
        study_name: str,
        objectives: list[str],
        budget: float | None = None,
        job_id: str | None = None,
    ) -> JobResults:
        """The table of `job_id`'s study (or of any study). Finished trials never change in
        Optuna, so a refresh fetches only the trials added since the last one and those that
        were still unfinished."""
        if job_id is not None:
            self._jobs[study_name] = job_id
        with self._lock:
            study_lock = self._study_locks.setdefault(study_name, threading.Lock())
        # one reader of a study at a time: pollers that arrive while its fingerprint is
        # read or its table refreshed wait for that answer instead of reading it again
        with study_lock:
            return self._current(study_name, objectives, budget)

    def _current(self, study_name: str, objectives: list[str], budget: float | None) -> JobResults:
        fp = self._fingerprint(study_name)
        with self._lock:
            cached = self._cache.get(study_name)
        if cached is not None and cached.fingerprint == fp:
            return cached
        read_at = time.monotonic()
        rows = self._refresh(study_name, cached, objectives, budget)
        # current as of the fingerprint read before it: a change since shows at the next one
        runs = fp[2] if study_name in self._jobs and self.job_runs else None
        table = (len(rows), False, runs if runs is not None else _unfinished(rows))
        results = JobResults(study_name, objectives, rows, table)
        with self._lock:
            self._cache[study_name] = results
        self._checked[study_name] = (read_at, results.fingerprint)  # current as of its read
        return results

    def _refresh(
        self,
        study_name: str,
        cached: JobResults | None,
        objectives: list[str],
        budget: float | None,
    ) -> list[TrialRow]:
        """The rows now: those of `cached` that were finished, the study's unfinished ones
        (one read), those finished since, and the new ones (one lookup per number past the
        table's, one read each) — or everything read again when more than a tenth changed."""
        sid = self._study_id(study_name)
        if cached is None:
            return self._load_all(sid, objectives, budget)
        limit = max(100, len(cached.rows) // 10)
        by_id = {r.trial_id: r for r in cached.rows}
        unfinished = self.storage.get_all_trials(sid, deepcopy=False, states=_UNFINISHED)
        fresh = {t._trial_id: t for t in unfinished}
        refetch = [r.trial_id for r in cached.rows if not r.state.finished]
        refetch = [i for i in refetch if i not in fresh]  # finished since the last read
        number = len(cached.rows)
        while (trial_id := self._trial_id(sid, number)) is not None:  # numbers: 0, 1, 2, …
            if trial_id not in fresh:
                refetch.append(trial_id)
            number += 1
            if len(refetch) > limit:  # one read of everything beats this many
                return self._load_all(sid, objectives, budget)
        for trial_id in refetch:
            fresh[trial_id] = self.storage.get_trial(trial_id)
        for trial_id, trial in fresh.items():
            by_id[trial_id] = _row(trial, objectives, budget)
        return sorted(by_id.values(), key=lambda r: r.number)

    def _load_all(
        self, study_id: int, objectives: list[str], budget: float | None
    ) -> list[TrialRow]:
        trials = self.storage.get_all_trials(study_id, deepcopy=False)
        return sorted((_row(t, objectives, budget) for t in trials), key=lambda r: r.number)


# -- queries ----------------------------------------------------------------------------------


def pareto_rows(
    results: JobResults, metrics: list[str], variant: str | None = None
) -> tuple[list[TrialRow], list[TrialRow]]:
    """(front, candidates): the non-dominated rows over `metrics` (each minimised) among the
    rows that have every metric (trained trials for val_loss), optionally one variant."""
    rows = [
        r
        for r in results.counted()
        if all(m in r.metrics and _finite(r.metrics[m]) for m in metrics)
        and (variant is None or r.variant == variant)
    ]
    if not rows:
        return [], []
    points = np.array([[r.metrics[m] for m in metrics] for r in rows], dtype=float)
    front = pareto_front(points)
    return [rows[i] for i in front], rows


def _finite(x: Any) -> bool:
    return isinstance(x, int | float) and math.isfinite(x)


def optimum_by_variant(results: JobResults, bootstrap: int = 200) -> list[dict[str, Any]]:
    """Per residual variant (and per budget, for jobs over several): the loss-optimal
    d_model/L_b among trained trials at matched compute."""
    groups: dict[tuple[str, float | None], list[TrialRow]] = {}
    for r in results.counted():
        if r.state == "complete" and _finite(r.metrics.get("val_loss")) and r.arch:
            groups.setdefault((r.variant, r.budget), []).append(r)
    out = []
    for (variant, budget), rows in sorted(groups.items(), key=lambda kv: (kv[0][0], kv[0][1] or 0)):
        ratios = [r.arch["d_model"] / r.arch["n_layers"] for r in rows]
        losses = [r.metrics["val_loss"] for r in rows]
        best = min(rows, key=lambda r: r.metrics["val_loss"])
        fit = fit_optimum(
            variant,
            ratios,
            losses,
            bootstrap=bootstrap,
            best_observed={
                "trial": best.number,
                "val_loss": best.metrics["val_loss"],
                "d_model": best.arch["d_model"],
                "n_layers": best.arch["n_layers"],
                "ratio": best.arch["d_model"] / best.arch["n_layers"],
            },
        )
        out.append(fit.as_dict() | {"budget": budget, "_fit": fit, "_data": (ratios, losses)})
    return out


def scaling_by_variant(
    results: JobResults, reference: str | None = None, loss: float | None = None
) -> dict[str, Any]:
    """ℒ = A·C^−α per variant from the best loss at each budget, and the compute multiplier
    of every variant over `reference` at `loss` (how much more compute the reference needs)."""
    best: dict[str, dict[float, float]] = {}
    for r in results.counted():
        if r.state == "complete" and _finite(r.metrics.get("val_loss")) and r.budget:
            per = best.setdefault(r.variant, {})
            if r.budget not in per or r.metrics["val_loss"] < per[r.budget]:
                per[r.budget] = r.metrics["val_loss"]
    fits = {}
    problems = {}
    for variant, pts in sorted(best.items()):
        try:
            fits[variant] = fit_scaling(variant, list(pts), list(pts.values()))
        except ValueError as exc:
            problems[variant] = str(exc)
    out: dict[str, Any] = {"fits": {v: f.as_dict() for v, f in fits.items()}, "problems": problems}
    if reference is not None and loss is not None:
        if reference not in fits:
            problems[reference] = "no scaling fit for the reference variant"
        else:
            out["reference"], out["loss"] = reference, loss
            out["multipliers"] = {
                v: compute_multiplier(f, fits[reference], loss)
                for v, f in fits.items()
                if v != reference
            }
    return out
