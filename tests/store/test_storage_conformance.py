"""Optuna's own storage conformance suite (`optuna.testing.pytest_storages.StorageTestCase`,
shipped with the Optuna the project pins) run over the runner's storage
(`nas_service.store.optuna_storage.OwnedTrials`) on SQLite and PostgreSQL: whatever the
runner's cache changes, a reader and a writer see what Optuna's storage contract says. Each
test has a timeout, so a deadlock (a lock taken twice) fails instead of hanging the run."""

from __future__ import annotations

import optuna
import pytest
from optuna.storages import BaseStorage
from optuna.testing.pytest_storages import StorageTestCase
from sqlalchemy import inspect, text

from nas_service.store import make_engine
from nas_service.store.jobs import optuna_storage
from nas_service.store.optuna_compat import TESTED_OPTUNA, OptunaMismatch, check_optuna
from nas_service.store.optuna_storage import OwnedTrials
from nas_service.store.records import TrialAttr

pytestmark = pytest.mark.timeout(20)


@pytest.fixture
def storage(db_url: str) -> BaseStorage:
    return OwnedTrials(optuna_storage(db_url), uncounted=TrialAttr.LOST)


class TestRunnerStorage(StorageTestCase):
    """Every test of Optuna's suite, over `OwnedTrials`."""


# -- the Optuna this version was tested with, checked at start-up (`optuna_compat`) --------


def _optuna_tables_at(url: str, revision: str) -> None:
    """Optuna's tables created by the installed Optuna, then recorded at `revision` (as an
    older or newer Optuna would have left them)."""
    engine = make_engine(url)
    optuna.storages.RDBStorage(url)  # creates them at the installed Optuna's revision
    with engine.begin() as conn:
        conn.execute(text("UPDATE alembic_version SET version_num = :r"), {"r": revision})
    engine.dispose()


def test_the_tested_optuna_on_a_fresh_or_its_own_database_passes(db_url: str) -> None:
    check_optuna(db_url)  # no Optuna tables yet
    optuna.storages.RDBStorage(db_url)
    check_optuna(db_url)  # the installed Optuna's own tables
    assert optuna.__version__.startswith("{}.{}.".format(*TESTED_OPTUNA))


@pytest.mark.parametrize("version", ["5.2.0", "4.5.0", "6.0.0"])
def test_another_optuna_series_is_refused(sqlite_url: str, version: str) -> None:
    with pytest.raises(OptunaMismatch, match=rf"optuna {version} is installed.*tested"):
        check_optuna(sqlite_url, installed=version)


def test_optuna_tables_at_another_revision_are_refused(db_url: str) -> None:
    _optuna_tables_at(db_url, "v3.0.0.d")
    with pytest.raises(OptunaMismatch, match=r"schema revision 'v3.0.0.d'.*'v3.2.0.a'"):
        check_optuna(db_url)


def test_the_runner_and_the_api_refuse_to_start_on_another_schema(
    sqlite_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Before anything is written: the service's own tables are not created either."""
    from fastapi.testclient import TestClient

    from nas_service.api.app import create_app
    from nas_service.runner.loop import main
    from nas_service.settings import get_settings

    _optuna_tables_at(sqlite_url, "v9.9.9.z")
    monkeypatch.setenv("DEPTHSCOPE_DATABASE_URL", sqlite_url)
    monkeypatch.setattr("signal.signal", lambda *_: None)  # keep this process's handlers
    with pytest.raises(OptunaMismatch, match=r"schema revision 'v9\.9\.9\.z'"):
        main(["--cluster", "local"])
    app = create_app(get_settings(database_url=sqlite_url))
    with pytest.raises(OptunaMismatch, match=r"schema revision 'v9\.9\.9\.z'"), TestClient(app):
        pass
    engine = make_engine(sqlite_url)
    try:
        assert "ds_jobs" not in inspect(engine).get_table_names()
    finally:
        engine.dispose()
