"""The trial table's reads of Optuna's tables (`results.read_trials`): decoded exactly as
Optuna's storage decodes them, and read in bulk — a cold `GET /v1/jobs/{id}` reads each
trial table in one statement, never the tables no row uses, and a refresh reads what
changed in one statement per table, however many trials that is. (Through Optuna's storage,
a table of 10,000 trials took 15 s to build: an ORM object per stored row, a `FrozenTrial`
per trial; each new trial one more read.)"""

from __future__ import annotations

import datetime as dt
import math
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import optuna
import pytest
from fastapi.testclient import TestClient
from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution
from optuna.trial import FrozenTrial, TrialState, create_trial
from sqlalchemy import Engine, event

from nas_service.api.app import create_app
from nas_service.results.decode import _row
from nas_service.settings import get_settings
from nas_service.spec import parse_spec
from nas_service.store.jobs import optuna_storage
from nas_service.store.trial_tables import StoredTrial, read_trials
from tests.support.api import SPEC, _synthetic

JOB = SPEC | {"objectives": ["val_loss", "train_memory_bytes"], "n_trials": 60}
#: Optuna's tables of a trial that no row of the table reads.
UNREAD = ("trial_system_attributes", "trial_intermediate_values", "trial_heartbeats")
READ = ("trial_user_attributes", "trial_params", "trial_values")


def _mixed_study(url: str) -> optuna.Study:
    """Two objectives; trials complete (an infinite value among them), pruned, failed,
    running and waiting; float, int and categorical parameters; nested attributes,
    system attributes and intermediate values."""
    study = optuna.create_study(
        study_name="mixed", storage=optuna_storage(url), directions=["minimize", "minimize"]
    )
    dists = {
        "lr": FloatDistribution(1e-4, 1e-1, log=True),
        "n_layers": IntDistribution(1, 16),
        "residual": CategoricalDistribution(["baseline", "block_attnres/S=2", None]),
    }
    for i in range(6):
        params = {"lr": 1e-3 * (i + 1), "n_layers": i + 1, "residual": [None, "baseline"][i % 2]}
        values = [2.0 - i / 10, math.inf if i == 3 else 1e6 * (i + 1)]
        state = [TrialState.COMPLETE, TrialState.PRUNED, TrialState.FAIL][i % 3]
        study.add_trial(
            create_trial(
                state=state,
                params=params,
                distributions=dists,
                values=values if state == TrialState.COMPLETE else None,
                intermediate_values={1: 3.0, 2: 2.5} if state == TrialState.PRUNED else None,
                user_attrs={
                    "arch": {"variant": "baseline", "n_layers": i + 1, "d_model": 64},
                    "train": [{"final_val_loss": 2.0, "flops_spent": 1e12}],
                    "outcome": "completed",
                    "curve": [[1, 2, 3.5]],
                    "note": None,
                },
                system_attrs={"fixed_params": {"lr": 0.1}},
            )
        )
    running = study.ask(dists)
    running.set_user_attr("train", [{"final_val_loss": 2.5}])
    study.enqueue_trial({"lr": 0.01, "n_layers": 3, "residual": "baseline"})
    return study


def _stored(t: FrozenTrial) -> StoredTrial:
    return StoredTrial(
        trial_id=t._trial_id,
        number=t.number,
        state=t.state,
        values=t.values,
        params=t.params,
        user_attrs=t.user_attrs,
        datetime_start=t.datetime_start,
        datetime_complete=t.datetime_complete,
    )


def _same(ours: StoredTrial, theirs: FrozenTrial) -> None:
    mirror = _stored(theirs)
    for name in ("trial_id", "number", "state", "values", "params", "user_attrs"):
        assert getattr(ours, name) == getattr(mirror, name), name
    # stored as naive UTC; Optuna shows them in local time: the same instants
    for name in ("datetime_start", "datetime_complete"):
        mine, shown = getattr(ours, name), getattr(mirror, name)
        assert (mine is None) == (shown is None), name
        if mine is not None:
            assert mine.replace(tzinfo=dt.UTC) == shown.astimezone(), name
    assert _row(ours, ["val_loss", "params"], 1e15) == _row(mirror, ["val_loss", "params"], 1e15)


def test_trials_read_in_bulk_are_optunas_trials(db_url: str) -> None:
    """Over SQLite and PostgreSQL: every field a row reads, as Optuna's storage reads it."""
    url = db_url
    study = _mixed_study(url)
    storage = optuna_storage(url)
    sid = storage.get_study_id_from_name("mixed")
    theirs = storage.get_all_trials(sid, deepcopy=False)
    ours = read_trials(storage.engine, sid)
    assert [t.number for t in ours] == list(range(8)) == [t.number for t in theirs]
    assert {t.state for t in ours} == set(TrialState)
    for mine, frozen in zip(ours, theirs, strict=True):
        _same(mine, frozen)
    assert ours[3].values == [1.7, math.inf]
    unfinished = read_trials(storage.engine, sid, states=(TrialState.RUNNING, TrialState.WAITING))
    assert [t.number for t in unfinished] == [6, 7]
    some = read_trials(storage.engine, sid, trial_ids=[theirs[1]._trial_id], from_number=5)
    assert [t.number for t in some] == [1, 5, 6, 7]
    assert read_trials(storage.engine, sid, trial_ids=[]) == []
    assert study.trials[0].system_attrs  # there to be left unread


class Statements:
    """The SQL statements an engine runs (its cursor's, as sent)."""

    def __init__(self, engine: Engine) -> None:
        self.seen: list[str] = []
        event.listen(engine, "before_cursor_execute", self._record)

    def _record(self, conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        self.seen.append(statement)

    def reading(self, table: str) -> list[str]:
        return [s for s in self.seen if f"FROM {table}" in s or f"JOIN {table}" in s]


@pytest.fixture
def stored_job(tmp_path: Path) -> Iterator[tuple[str, str, optuna.Study]]:
    """A job (no runner) with 60 synthetic trials stored through Optuna; its database URL."""
    url = f"sqlite:///{tmp_path / 'cold.db'}"
    with TestClient(create_app(get_settings(database_url=url))) as c:
        job = c.post("/v1/jobs", json=JOB).json()
        c.post(f"/v1/jobs/{job['id']}/cancel").raise_for_status()
    study = optuna.load_study(study_name=job["study_name"], storage=optuna_storage(url))
    study.add_trials(_synthetic().synthetic_trials(parse_spec(JOB), 60))  # type: ignore[attr-defined]
    yield url, job["id"], study


def test_a_cold_job_read_reads_each_trial_table_once(
    stored_job: tuple[str, str, optuna.Study],
) -> None:
    """A service just started: the job's first read builds its table with one statement per
    trial table, and none of the tables no row uses (Optuna's storage read them all, and
    one more statement per table for each 500 trials)."""
    url, job, study = stored_job
    app = create_app(get_settings(database_url=url))
    with TestClient(app) as c:
        sql = Statements(app.state.results.storage.engine)
        answer = c.get(f"/v1/jobs/{job}").json()
        assert answer["progress"]["completed"] == answer["progress"]["counted"] == 60
        for table in UNREAD:
            assert sql.reading(table) == [], table
        for table in READ:
            assert len(sql.reading(table)) == 1, table
        # the charts' reads of the same state read no trial again
        sql.seen.clear()
        assert c.get(f"/v1/jobs/{job}/points").json()["total"] == 60
        assert not any(sql.reading(table) for table in (*READ, *UNREAD))

        # a refresh reads the trials added since in one statement per table, however many
        study.add_trials(_synthetic().synthetic_trials(parse_spec(JOB), 12, seed=3))  # type: ignore[attr-defined]
        time.sleep(app.state.settings.results_fresh_s + 0.05)
        sql.seen.clear()
        assert c.get(f"/v1/jobs/{job}").json()["progress"]["completed"] == 72
        for table in UNREAD:
            assert sql.reading(table) == [], table
        for table in READ:
            assert len(sql.reading(table)) == 1, table


@pytest.fixture
def away_from_utc(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Local time 5 hours behind UTC (New York in winter) for the test, then as it was."""
    monkeypatch.setenv("TZ", "America/New_York")
    time.tzset()
    yield
    monkeypatch.undo()
    time.tzset()


@pytest.mark.usefixtures("away_from_utc")
def test_bulk_stored_trials_equal_optunas_add_trials(db_url: str) -> None:
    """bench/support.py's `store_trials` (the benchmarks' and the 10,000-trial browser
    test's loader) stores what `Study.add_trials` stores: the same trials, field by field,
    numbered after the trials already there, over SQLite and PostgreSQL; in a time zone
    away from UTC (Optuna stores naive UTC and shows local time)."""
    support = _synthetic()
    storage = optuna_storage(db_url)
    template = _mixed_study(db_url)
    finished = [t for t in template.get_trials() if t.state.is_finished()]
    synthetic = support.synthetic_trials(parse_spec(JOB), 20, seed=5)  # type: ignore[attr-defined]
    for name, batch in (("mixed", finished), ("synthetic", synthetic)):
        stored = {}
        for how in ("optuna", "bulk"):
            study = optuna.create_study(
                study_name=f"{name}-{how}", storage=storage, directions=["minimize", "minimize"]
            )
            study.add_trial(batch[0])  # the numbering continues after the trials there
            if how == "optuna":
                study.add_trials(batch[1:])
            else:
                support.store_trials(study, batch[1:])  # type: ignore[attr-defined]
            stored[how] = optuna.load_study(study_name=study.study_name, storage=storage)
        bulk, reference = stored["bulk"].get_trials(), stored["optuna"].get_trials()
        assert len(bulk) == len(batch) and [t.number for t in bulk] == list(range(len(batch)))
        for a, b in zip(reference, bulk, strict=True):
            assert {k: v for k, v in vars(a).items() if k != "_trial_id"} == {
                k: v for k, v in vars(b).items() if k != "_trial_id"
            }
    with pytest.raises(ValueError, match="only finished trials"):
        running = [t for t in template.get_trials() if not t.state.is_finished()]
        support.store_trials(stored["bulk"], running)  # type: ignore[attr-defined]


@pytest.mark.usefixtures("away_from_utc")
def test_complete_reads_are_optunas_frozen_trials(db_url: str) -> None:
    """`read_trials(complete=True)` then `frozen()` (the runner's storage reads a study so)
    gives what Optuna's storage gives, every field: distributions, system attributes,
    intermediate values, times in local time; by ids and above an id as its reads ask."""
    _mixed_study(db_url)
    storage = optuna_storage(db_url)
    sid = storage.get_study_id_from_name("mixed")
    theirs = storage.get_all_trials(sid, deepcopy=False)
    ours = [t.frozen() for t in read_trials(storage.engine, sid, complete=True)]
    assert len(ours) == len(theirs) == 8
    assert any(t.system_attrs for t in ours) and any(t.intermediate_values for t in ours)
    for mine, frozen in zip(ours, theirs, strict=True):
        assert vars(mine) == vars(frozen)
    ids = [t._trial_id for t in theirs]
    some = read_trials(storage.engine, sid, trial_ids={ids[1]}, after_trial_id=ids[5])
    assert [t.number for t in some] == [1, 6, 7]
    partial = read_trials(storage.engine, sid)  # not complete: those fields left unread
    assert all(not t.system_attrs and not t.intermediate_values for t in partial)
