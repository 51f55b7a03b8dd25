"""Study-level helpers over the runner's Optuna storage: a study's storage and ids (read
from Optuna's private fields here, so that nothing outside `store/` does), several user
attributes in one transaction, `tell` without its answer, the sampler's hook for a trial
concluded otherwise, and the database storage under a cached one."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import optuna
from optuna.pruners import _filter_study
from optuna.storages import RDBStorage
from optuna.storages._cached_storage import _CachedStorage
from optuna.study._tell import _tell_with_warning
from optuna.trial import FrozenTrial, TrialState

from nas_service.store.optuna_storage import OwnedTrials


def storage_of(study: optuna.Study) -> optuna.storages.BaseStorage:
    """The storage a study reads and writes through (Optuna keeps it private)."""
    storage: optuna.storages.BaseStorage = study._storage
    return storage


def study_id_of(study: optuna.Study) -> int:
    """The study's id in its storage (Optuna keeps it private)."""
    return int(study._study_id)


def trial_id_of(trial: optuna.Trial | FrozenTrial) -> int:
    """A trial's id in its storage, unique across studies (Optuna keeps it private)."""
    return int(trial._trial_id)


def set_user_attrs(
    study: optuna.Study, trial: optuna.Trial | FrozenTrial, attrs: dict[str, Any]
) -> None:
    """Several user attributes of one trial, in one transaction on the runner's storage (in
    the order given, one per attribute on any other). An `optuna.Trial`'s own copy is kept
    up to date as `Trial.set_user_attr` keeps it."""
    storage = study._storage
    if isinstance(storage, OwnedTrials):
        storage.set_trial_user_attrs(trial._trial_id, attrs)
        if isinstance(trial, optuna.Trial):
            trial._cached_frozen_trial.user_attrs.update(attrs)
        return
    for key, value in attrs.items():
        if isinstance(trial, optuna.Trial):
            trial.set_user_attr(key, value)
        else:  # a trial of a stopped runner, read back from the storage
            storage.set_trial_user_attr(trial._trial_id, key, value)


def tell(
    study: optuna.Study,
    trial: optuna.Trial | int,
    values: Sequence[float] | None = None,
    state: TrialState | None = None,
) -> None:
    """`Study.tell` without its answer. `tell` returns a copy of the trial read back after
    its state changed, which on the runner's storage is a read of the whole trial from the
    database (six statements: the state change marks it for a re-read, which the loop's next
    read of the study makes for every trial told since, in one query); the runner never
    uses that copy. The same checks, sampler hook and write as `tell`."""
    _tell_with_warning(study, trial, values, state)


def after_trial(
    study: optuna.Study,
    trial: FrozenTrial,
    state: TrialState,
    values: Sequence[float] | None = None,
) -> None:
    """The sampler's `after_trial` hook, as `Study.tell` calls it (on the study as the
    sampler sees it), for a trial concluded otherwise (`recovery`'s bulk requeue)."""
    study.sampler.after_trial(_filter_study(study, trial), trial, state, values)


def rdb_storage(storage: optuna.storages.BaseStorage) -> RDBStorage:
    """The database storage under `storage`: itself, or the one under Optuna's cache (the
    runner's `OwnedTrials` among them), for a reader that reads the tables in bulk."""
    if isinstance(storage, RDBStorage):
        return storage
    if isinstance(storage, _CachedStorage):
        return storage._backend
    raise TypeError(f"not a database storage: {type(storage).__name__}")
