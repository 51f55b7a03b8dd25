"""A job's results as a table: one row per Optuna trial with its parameters, architecture,
every metric (the measured loss and each cost), outcome and curve — what the trial, Pareto,
optimum and scaling queries read. Loaded once per job and refreshed only when the study
changed (a cheap fingerprint query on Optuna's own tables), so queries stay fast at 10,000
trials."""

from __future__ import annotations

import math
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import optuna
from optuna.trial import TrialState
from sqlalchemy import text

from nas_service.analysis import (
    compute_multiplier,
    fit_optimum,
    fit_scaling,
    pareto_front,
)
from nas_service.search import ATTR_LOST

STATE_NAMES = {
    TrialState.COMPLETE: "complete",
    TrialState.PRUNED: "pruned",
    TrialState.FAIL: "failed",
    TrialState.RUNNING: "running",
    TrialState.WAITING: "waiting",
}


@dataclass
class TrialRow:
    number: int
    state: str
    outcome: str
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


def _row(t: optuna.trial.FrozenTrial, objectives: list[str], budget: float | None) -> TrialRow:
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
        state=STATE_NAMES.get(t.state, t.state.name.lower()),
        outcome=str(attrs.get("outcome", "running" if t.state == TrialState.RUNNING else "")),
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
    fingerprint: tuple[Any, ...] = ()
    memo: dict[Any, Any] = field(default_factory=dict)  # query answers for this fingerprint

    def memoised(self, key: Any, compute: Any) -> Any:
        """The answer to a query, computed once per state of the study."""
        if key not in self.memo:
            self.memo[key] = compute()
        return self.memo[key]

    def counted(self) -> list[TrialRow]:
        return [r for r in self.rows if not r.lost and r.state in ("complete", "pruned", "failed")]


class ResultsCache:
    """Per-study result tables, refreshed when the study's fingerprint changes."""

    def __init__(self, storage: optuna.storages.RDBStorage, fresh_s: float = 0.0) -> None:
        self.storage = storage
        self.fresh_s = fresh_s
        self._cache: dict[str, JobResults] = {}
        self._study_ids: dict[str, int] = {}
        self._checked: dict[str, tuple[float, tuple[Any, ...]]] = {}
        self._recent: dict[Any, tuple[float, Any]] = {}
        self._lock = threading.Lock()

    def recent(self, key: Any, compute: Any) -> Any:
        """`compute()`, reused for `fresh_s` seconds per key (a job's row, say: pollers
        asking many times a second cost the database one read per `fresh_s`). An exception
        is never kept."""
        now = time.monotonic()
        hit = self._recent.get(key)
        if hit is not None and now - hit[0] < self.fresh_s:
            return hit[1]
        value = compute()
        if self.fresh_s > 0:
            if len(self._recent) >= 10_000:  # bounded: stale entries go first
                self._recent = {k: v for k, v in self._recent.items() if now - v[0] < self.fresh_s}
            self._recent[key] = (now, value)
        return value

    def forget(self, key: Any) -> None:
        self._recent.pop(key, None)

    def _fingerprint(self, study_name: str) -> tuple[Any, ...]:
        """Changes whenever a trial is added, finishes or changes state (one indexed query
        on Optuna's `trials` table). A fingerprint read less than `fresh_s` ago is reused:
        many clients polling one job then cost the database one query per `fresh_s`."""
        now = time.monotonic()
        checked = self._checked.get(study_name)
        if checked is not None and now - checked[0] < self.fresh_s:
            return checked[1]
        fp = self._read_fingerprint(study_name)
        self._checked[study_name] = (now, fp)
        return fp

    def _read_fingerprint(self, study_name: str) -> tuple[Any, ...]:
        if study_name not in self._study_ids:
            self._study_ids[study_name] = self.storage.get_study_id_from_name(study_name)
        with self.storage.engine.connect() as conn:
            row = conn.execute(
                text(
                    "SELECT count(trial_id), max(trial_id), max(datetime_complete), "
                    "sum(CASE WHEN state = 'COMPLETE' THEN 1 ELSE 0 END), "
                    "sum(CASE WHEN state = 'RUNNING' THEN 1 ELSE 0 END) "
                    "FROM trials WHERE study_id = :sid"
                ),
                {"sid": self._study_ids[study_name]},
            ).one()
        return tuple(str(v) for v in row)

    def get(
        self, study_name: str, objectives: list[str], budget: float | None = None
    ) -> JobResults:
        """The job's table. Finished trials never change in Optuna, so a refresh fetches
        only the trials added since the last one and those that were still unfinished."""
        fp = self._fingerprint(study_name)
        with self._lock:
            cached = self._cache.get(study_name)
        if cached is not None and cached.fingerprint == fp:
            return cached
        refetch: set[int] = set()
        if cached is not None:
            known = max((r.trial_id for r in cached.rows), default=-1)
            with self.storage.engine.connect() as conn:
                refetch = set(
                    conn.execute(
                        text(
                            "SELECT trial_id FROM trials "
                            "WHERE study_id = :sid AND trial_id > :known"
                        ),
                        {"sid": self._study_ids[study_name], "known": known},
                    ).scalars()
                )
            refetch |= {r.trial_id for r in cached.rows if r.state in ("running", "waiting")}
        # one query per changed trial beats reloading everything only while few changed
        if cached is None or len(refetch) > max(100, len(cached.rows) // 10):
            study = optuna.load_study(study_name=study_name, storage=self.storage)
            rows = [_row(t, objectives, budget) for t in study.get_trials(deepcopy=False)]
        else:
            by_id = {r.trial_id: r for r in cached.rows}
            for trial_id in refetch:
                by_id[trial_id] = _row(self.storage.get_trial(trial_id), objectives, budget)
            rows = sorted(by_id.values(), key=lambda r: r.number)
        results = JobResults(study_name, objectives, rows, fp)
        with self._lock:
            self._cache[study_name] = results
        return results


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
