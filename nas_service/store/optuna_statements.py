"""The statements the runner's Optuna storage (`nas_service.store.optuna_storage`) writes to
Optuna's own tables in one transaction: the checks that a trial may still change, the
multi-row upsert of user attributes, and the bulk requeue of a stopped runner's trials."""

from __future__ import annotations

import datetime as dt
import sqlite3
from collections.abc import Sequence
from typing import Any

import optuna
from optuna.storages._rdb import models
from optuna.trial import FrozenTrial, TrialState
from sqlalchemy import select
from sqlalchemy.dialects import postgresql, sqlite

from nas_service.store.trial_tables import insert_trials


def check_updatable(number: int, state: TrialState) -> None:
    """`UpdateFinishedTrialError` for a finished trial, as Optuna's
    `check_trial_is_updatable` raises it, without its read of the trial: that read goes
    through `get_trial` (this storage's lock, held by the caller: a deadlock) and, on the
    database's side, through Optuna's thread-local session (which commits what the caller's
    transaction wrote so far, then closes it)."""
    if state.is_finished():
        raise optuna.exceptions.UpdateFinishedTrialError(
            f"Trial#{number} has already finished and can not be updated."
        )


def check_unfinished(session: Any, trial_ids: Sequence[int]) -> None:
    """Each trial exists (KeyError) and is unfinished (`check_updatable`), read in
    `session` in one statement, before the caller writes anything in it."""
    trials_t = models.TrialModel.__table__
    found = {
        row.trial_id: row
        for row in session.execute(
            select(trials_t.c.trial_id, trials_t.c.number, trials_t.c.state).where(
                trials_t.c.trial_id.in_(list(trial_ids))
            )
        )
    }
    for trial_id in trial_ids:
        if trial_id not in found:
            raise KeyError(f"No trial with trial_id {trial_id} exists.")
        state = found[trial_id].state
        state = state if isinstance(state, TrialState) else TrialState[state]
        check_updatable(found[trial_id].number, state)


def can_upsert(dialect: str) -> bool:
    """Whether the dialect has INSERT … ON CONFLICT (PostgreSQL; SQLite from 3.24)."""
    return dialect == "postgresql" or (
        dialect == "sqlite" and sqlite3.sqlite_version_info >= (3, 24, 0)
    )


def attrs_upsert(dialect: str, rows: list[dict[str, Any]]) -> Any:
    """User-attribute rows (trial_id, key, value_json) written as one multi-row INSERT …
    ON CONFLICT (trial, key) DO UPDATE, as Optuna's storage upserts one (`can_upsert`)."""
    model = models.TrialUserAttributeModel
    insert = postgresql.insert(model) if dialect == "postgresql" else sqlite.insert(model)
    statement = insert.values(rows)
    return statement.on_conflict_do_update(
        index_elements=[model.trial_id, model.key],
        set_={"value_json": statement.excluded.value_json},
    )


def requeue_statements(
    engine: Any,
    study_id: int,
    templates: list[FrozenTrial],
    rows: list[dict[str, Any]],
    ids: list[int],
) -> list[FrozenTrial]:
    """`OwnedTrials.requeue_lost`'s one transaction: the retries inserted, the lost trials'
    attribute rows written and the lost trials failed, or nothing if one is no longer
    RUNNING (`UpdateFinishedTrialError`). Returns the inserted trials."""
    model = models.TrialUserAttributeModel
    trials_t = models.TrialModel.__table__
    with engine.begin() as conn:
        new = insert_trials(conn, study_id, templates)
        if rows:
            if not can_upsert(engine.name):  # the old rows replaced
                attr_t = model.__table__
                conn.execute(
                    attr_t.delete().where(
                        attr_t.c.trial_id.in_(ids),
                        attr_t.c.key.in_({r["key"] for r in rows}),
                    )
                )
                conn.execute(attr_t.insert(), rows)
            else:
                conn.execute(attrs_upsert(engine.name, rows))
        if ids:
            now = dt.datetime.now(dt.UTC).replace(tzinfo=None)
            failed = conn.execute(
                trials_t.update()
                .where(
                    trials_t.c.trial_id.in_(ids),
                    trials_t.c.state == TrialState.RUNNING,
                )
                .values(state=TrialState.FAIL, datetime_complete=now)
            ).rowcount
            if failed != len(ids):
                raise optuna.exceptions.UpdateFinishedTrialError(
                    f"{len(ids) - failed} of the trials to fail are no longer running"
                )
    return new
