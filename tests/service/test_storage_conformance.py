"""Optuna's own storage conformance suite (`optuna.testing.pytest_storages.StorageTestCase`,
shipped with the Optuna the project pins) run over the runner's storage
(`nas_service.study_cache.OwnedTrials`) on SQLite and PostgreSQL: whatever the runner's cache
changes, a reader and a writer see what Optuna's storage contract says. Each test has a
timeout, so a deadlock (a lock taken twice) fails instead of hanging the run."""

from __future__ import annotations

import pytest
from optuna.storages import BaseStorage
from optuna.testing.pytest_storages import StorageTestCase

from nas_service.jobs import optuna_storage
from nas_service.search import ATTR_LOST
from nas_service.study_cache import OwnedTrials

pytestmark = pytest.mark.timeout(20)


@pytest.fixture
def storage(db_url: str) -> BaseStorage:
    return OwnedTrials(optuna_storage(db_url), uncounted=ATTR_LOST)


class TestRunnerStorage(StorageTestCase):
    """Every test of Optuna's suite, over `OwnedTrials`."""
