"""Optuna's trial tables read in bulk: one statement per table, whatever the number of
trials, through Optuna's own table definitions, decoded as its `RDBStorage` decodes them
(tested equal, field by field, over SQLite and PostgreSQL). Read only, never written.

Optuna's storage builds an ORM object per stored row (a trial has one per parameter, value,
attribute and intermediate value) and then a `FrozenTrial` per trial: a cost per trial
that dominates reading a large study with its attributes. Two readers need a
whole study at once: a job's results table (`nas_service.results.cache`, on a first visit of its
page) and the runner's storage (`nas_service.store.optuna_storage`, on its first read of a study,
which a restarted runner makes for every job it drives, while its workers wait).

`read_trials` gives `StoredTrial`s: the fields a results table reads, the times naive UTC as
stored; with `complete=True` every field of a `FrozenTrial` (`StoredTrial.frozen()`, equal to
the storage's own), system attributes and intermediate values included.

`insert_trials` writes trials as `RDBStorage.create_new_trial(template_trial=…)` writes each
(tested equal to `Study.add_trials`), all in a few statements of the caller's transaction:
the runner's recovery re-enqueues what a killed runner left running so (a thousand trials at
a time on a large cluster, while its workers wait), and the benchmarks store synthetic
trials so."""

from __future__ import annotations

import copy
import datetime as dt
import functools
import json
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field
from typing import Any

import optuna
from optuna.distributions import BaseDistribution, distribution_to_json, json_to_distribution
from optuna.storages import RDBStorage
from optuna.storages._cached_storage import _CachedStorage
from optuna.storages._rdb import models
from optuna.trial import FrozenTrial, TrialState
from sqlalchemy import Connection, Engine, Select, func, insert, or_, select


@dataclass(frozen=True, slots=True)
class StoredTrial:
    """A trial's fields as Optuna's storage holds them (the datetimes naive UTC, as stored);
    `distributions`, `system_attrs` and `intermediate_values` are read only when asked for
    (`read_trials(complete=True)`)."""

    trial_id: int
    number: int
    state: TrialState
    values: list[float] | None
    params: dict[str, Any]
    user_attrs: dict[str, Any]
    datetime_start: dt.datetime | None
    datetime_complete: dt.datetime | None
    distributions: dict[str, BaseDistribution] = field(default_factory=dict)
    system_attrs: dict[str, Any] = field(default_factory=dict)
    intermediate_values: dict[int, float] = field(default_factory=dict)

    def frozen(self) -> FrozenTrial:
        """The trial as `RDBStorage.get_all_trials` gives it (its times in local time)."""
        return FrozenTrial(
            number=self.number,
            state=self.state,
            value=None,
            values=self.values,
            datetime_start=_local(self.datetime_start),
            datetime_complete=_local(self.datetime_complete),
            params=dict(self.params),
            distributions=dict(self.distributions),
            user_attrs=self.user_attrs,
            system_attrs=self.system_attrs,
            intermediate_values=self.intermediate_values,
            trial_id=self.trial_id,
        )


def _local(when: dt.datetime | None) -> dt.datetime | None:
    """Stored naive UTC to naive local time, as Optuna's trial model shows it."""
    if when is None:
        return None
    return when.replace(tzinfo=dt.UTC).astimezone().replace(tzinfo=None)


def read_trials(
    engine: Engine,
    study_id: int,
    states: Collection[TrialState] | None = None,
    trial_ids: Collection[int] | None = None,
    from_number: int | None = None,
    after_trial_id: int | None = None,
    complete: bool = False,
) -> list[StoredTrial]:
    """The study's trials, ordered by number: every one, or those in `states`, with these
    `trial_ids`, numbered from `from_number` on, or with an id above `after_trial_id` (any
    of them); `complete` reads the distributions, system attributes and intermediate values
    too (two more statements)."""
    trials = models.TrialModel.__table__
    wanted = select(trials.c.trial_id).where(trials.c.study_id == study_id)
    any_of = []
    if states is not None:
        any_of.append(trials.c.state.in_(list(states)))
    if trial_ids:
        any_of.append(trials.c.trial_id.in_(list(trial_ids)))
    if from_number is not None:
        any_of.append(trials.c.number >= from_number)
    if after_trial_id is not None:
        any_of.append(trials.c.trial_id > after_trial_id)
    if any_of:
        wanted = wanted.where(or_(*any_of))
    elif trial_ids is not None:  # asked for no trial
        return []
    subset = wanted.scalar_subquery()
    values_t = models.TrialValueModel.__table__
    params_t = models.TrialParamModel.__table__
    user_t = models.TrialUserAttributeModel.__table__
    system_t = models.TrialSystemAttributeModel.__table__
    steps_t = models.TrialIntermediateValueModel.__table__
    with engine.connect() as conn:
        head = conn.execute(
            select(
                trials.c.trial_id,
                trials.c.number,
                trials.c.state,
                trials.c.datetime_start,
                trials.c.datetime_complete,
            ).where(trials.c.trial_id.in_(subset))
        ).all()
        values: dict[int, dict[int, float]] = {}
        for tid, objective, value, kind in conn.execute(
            select(
                values_t.c.trial_id, values_t.c.objective, values_t.c.value, values_t.c.value_type
            ).where(values_t.c.trial_id.in_(subset))
        ).all():
            stored = models.TrialValueModel.stored_repr_to_value(value, kind)
            values.setdefault(tid, {})[objective] = stored
        params: dict[int, list[tuple[int, str, float, str]]] = {}
        for tid, pid, name, value, dist in conn.execute(
            select(
                params_t.c.trial_id,
                params_t.c.param_id,
                params_t.c.param_name,
                params_t.c.param_value,
                params_t.c.distribution_json,
            ).where(params_t.c.trial_id.in_(subset))
        ).all():
            params.setdefault(tid, []).append((pid, name, value, dist))
        attrs = [_attributes(conn, user_t, subset)]
        steps: dict[int, dict[int, float]] = {}
        if complete:
            attrs.append(_attributes(conn, system_t, subset))
            for tid, step, value, kind in conn.execute(
                select(
                    steps_t.c.trial_id,
                    steps_t.c.step,
                    steps_t.c.intermediate_value,
                    steps_t.c.intermediate_value_type,
                ).where(steps_t.c.trial_id.in_(subset))
            ).all():
                decoded = models.TrialIntermediateValueModel.stored_repr_to_intermediate_value(
                    value, kind
                )
                steps.setdefault(tid, {})[step] = decoded
    user = _decoded(attrs[0])
    system = _decoded(attrs[1]) if complete else {}
    out = []
    for tid, number, state, start, finish in head:
        by_objective = values.get(tid)
        ordered = sorted(params.get(tid, []))
        out.append(
            StoredTrial(
                trial_id=tid,
                number=number,
                state=state if isinstance(state, TrialState) else TrialState[state],
                values=[by_objective[k] for k in sorted(by_objective)] if by_objective else None,
                params={
                    name: _distribution(dist).to_external_repr(value)
                    for _, name, value, dist in ordered
                },
                user_attrs=user.get(tid, {}),
                datetime_start=start,
                datetime_complete=finish,
                distributions=(
                    {name: _distribution(dist) for _, name, _, dist in ordered} if complete else {}
                ),
                system_attrs=system.get(tid, {}) if complete else {},
                intermediate_values=steps.get(tid, {}) if complete else {},
            )
        )
    out.sort(key=lambda t: t.number)
    return out


def _attributes(conn: Any, table: Any, subset: Any) -> list[Any]:
    """(trial id, key, JSON text) of an attribute table's rows of the trials in `subset`, in
    the order they were written (Optuna's, where a key was written twice: the last wins)."""
    return list(
        conn.execute(
            select(table.c.trial_id, table.c.key, table.c.value_json)
            .where(table.c.trial_id.in_(subset))
            .order_by(*table.primary_key.columns)
        ).all()
    )


def _decoded(rows: list[Any]) -> dict[int, dict[str, Any]]:
    """Per trial, its attributes decoded: every value in one parse (each is a JSON text of
    Optuna's `json.dumps`; a parse per value costs as much again in calls as in parsing)."""
    decoded = json.loads("[" + ",".join(text for _, _, text in rows) + "]")
    out: dict[int, dict[str, Any]] = {}
    for (tid, key, _), value in zip(rows, decoded, strict=True):
        out.setdefault(tid, {})[key] = value
    return out


@functools.lru_cache(maxsize=1024)
def _distribution(text: str) -> BaseDistribution:
    """A parameter's distribution from its JSON (a study's trials share a few)."""
    return json_to_distribution(text)


def studies_with_trials_in(states: Collection[TrialState]) -> Select[tuple[str]]:
    """A query of the names of the studies with a trial in one of `states` (a subquery for
    the service's own queries: recovery looks for the studies a runner left trials RUNNING
    in)."""
    studies_t = models.StudyModel.__table__
    trials_t = models.TrialModel.__table__
    return (
        select(studies_t.c.study_name)
        .join(trials_t, trials_t.c.study_id == studies_t.c.study_id)
        .where(trials_t.c.state.in_(list(states)))
    )


def insert_trials(
    conn: Connection, study_id: int, trials: Sequence[FrozenTrial]
) -> list[FrozenTrial]:
    """`trials` (templates, as `create_trial` makes them) added to the study in `conn`'s
    transaction, as `RDBStorage.create_new_trial(study_id, template_trial=t)` adds each:
    numbered after the study's trials (its row locked for the count, as there), with their
    state, times, values, parameters, user and system attributes and intermediate values.
    One statement per table. Returns the trials as stored (as `create_new_trial` gives each:
    a copy of its template with its number and id)."""
    trials_t = models.TrialModel.__table__
    studies_t = models.StudyModel.__table__
    found = conn.execute(
        select(studies_t.c.study_id).where(studies_t.c.study_id == study_id).with_for_update()
    ).first()
    if found is None:
        raise KeyError(f"no study with study_id {study_id} exists")
    start = conn.execute(
        select(func.count()).select_from(trials_t).where(trials_t.c.study_id == study_id)
    ).scalar_one()
    heads = [
        {
            "number": start + i,
            "study_id": study_id,
            "state": t.state,
            "datetime_start": _naive_utc(t.datetime_start),
            "datetime_complete": _naive_utc(t.datetime_complete),
        }
        for i, t in enumerate(trials)
    ]
    if not heads:
        return []
    ids = list(
        conn.execute(
            insert(trials_t).returning(trials_t.c.trial_id, sort_by_parameter_order=True), heads
        ).scalars()
    )
    rows: dict[Any, list[dict[str, Any]]] = {
        model: []
        for model in (
            models.TrialValueModel,
            models.TrialParamModel,
            models.TrialUserAttributeModel,
            models.TrialSystemAttributeModel,
            models.TrialIntermediateValueModel,
        )
    }
    for tid, t in zip(ids, trials, strict=True):
        for objective, value in enumerate(t.values or []):
            stored, kind = models.TrialValueModel.value_to_stored_repr(value)
            rows[models.TrialValueModel].append(
                {"trial_id": tid, "objective": objective, "value": stored, "value_type": kind}
            )
        for name, value in t.params.items():
            dist = t.distributions[name]
            rows[models.TrialParamModel].append(
                {
                    "trial_id": tid,
                    "param_name": name,
                    "param_value": dist.to_internal_repr(value),
                    "distribution_json": distribution_to_json(dist),
                }
            )
        for model, attrs in (
            (models.TrialUserAttributeModel, t.user_attrs),
            (models.TrialSystemAttributeModel, t.system_attrs),
        ):
            rows[model].extend(
                {"trial_id": tid, "key": k, "value_json": json.dumps(v)} for k, v in attrs.items()
            )
        steps = models.TrialIntermediateValueModel
        for step, value in t.intermediate_values.items():
            inter, inter_kind = steps.intermediate_value_to_stored_repr(value)
            rows[models.TrialIntermediateValueModel].append(
                {
                    "trial_id": tid,
                    "step": step,
                    "intermediate_value": inter,
                    "intermediate_value_type": inter_kind,
                }
            )
    for model, table_rows in rows.items():
        if table_rows:
            conn.execute(insert(model.__table__), table_rows)
    out = []
    for i, (tid, t) in enumerate(zip(ids, trials, strict=True)):
        made = copy.deepcopy(t)
        made.number, made._trial_id = start + i, tid
        out.append(made)
    return out


def _naive_utc(when: dt.datetime | None) -> dt.datetime | None:
    """A time as Optuna's trial table stores it: naive UTC (a naive time is local time)."""
    return None if when is None else when.astimezone(dt.UTC).replace(tzinfo=None)


def add_finished_trials(study: optuna.Study, trials: Sequence[FrozenTrial]) -> None:
    """`trials` (finished, as `optuna.trial.create_trial` makes them) added to `study` as
    `study.add_trials(trials)` adds them, in one transaction with one bulk statement per
    table (`insert_trials`): for the benchmarks and tests that fill a study with thousands."""
    storage = study._storage
    if isinstance(storage, _CachedStorage):  # the runner's `OwnedTrials` among them
        storage = storage._backend
    if not isinstance(storage, RDBStorage):
        raise TypeError(f"not a database storage: {type(storage).__name__}")
    for t in trials:
        if not t.state.is_finished():
            raise ValueError(f"trial {t.number}: only finished trials are stored in bulk")
    with storage.engine.begin() as conn:
        insert_trials(conn, study._study_id, trials)
