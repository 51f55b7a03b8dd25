"""The runner's view of its studies: Optuna's cached storage, without re-reading every
unfinished trial on every read.

Optuna's `_CachedStorage` re-reads every unfinished trial (with its parameters and
attributes) on each `get_all_trials`, because another process may have changed it; a runner
reads its studies several times per trial, so with N trials in flight each trial would cost
O(N) rows read.

A runner owns the unfinished trials of the jobs it drives: it holds its cluster's lease
(`nas_service.store.lease`), and nothing else writes a trial (the API writes jobs, never
trials; recovery runs in the runner). So `OwnedTrials` writes to the database first (the
source of truth) and then puts the same write into its cached copy; it re-reads an
unfinished trial only after its state changed or a write to it failed, plus the trials
created since the last read: a read costs O(trials changed since). Several attributes of one
trial go in one transaction (`set_user_attrs`). Use it only in the process that holds the
lease; every other reader keeps Optuna's storage.

Counting the finished trials and Optuna's `ask` (which lists the WAITING trials by filtering
every cached trial) would still cost O(trials recorded) per pass of the loop, so the storage
keeps, as trials enter its cache, a tally of its finished trials per state (one marked
`uncounted` is tallied apart), and answers a read of unfinished states from its set of
unfinished trials alone. The statements it writes in one transaction are in
`nas_service.store.optuna_statements`; the study-level helpers in
`nas_service.store.optuna_study`.
"""

from __future__ import annotations

import copy
import json
from collections import Counter
from collections.abc import Container, Iterable, Sequence
from typing import Any

import optuna
from optuna import distributions
from optuna.distributions import BaseDistribution
from optuna.storages import RDBStorage
from optuna.storages._cached_storage import _CachedStorage, _StudyInfo
from optuna.storages._rdb import models
from optuna.storages._rdb.storage import _create_scoped_session
from optuna.trial import FrozenTrial, TrialState
from sqlalchemy import insert as sql_insert

from nas_service.store.optuna_statements import (
    attrs_upsert,
    can_upsert,
    check_unfinished,
    check_updatable,
    requeue_statements,
)
from nas_service.store.trial_tables import read_trials


class OwnedTrials(_CachedStorage):
    """`_CachedStorage` that keeps its copy of an unfinished trial up to date (the module)."""

    def __init__(self, backend: RDBStorage, uncounted: str | None = None) -> None:
        """`uncounted`: a user attribute keeping a finished trial out of `finished_count`."""
        super().__init__(backend)
        self._uncounted = uncounted
        self._written: set[int] = set()  # trial ids written since they were last read
        self._newest: dict[int, int] = {}  # per study: the largest trial id read
        self._loaded: set[int] = set()  # studies read in full once
        self._tally: dict[int, Counter[TrialState]] = {}  # per study: finished, by state
        self._tallied: set[int] = set()  # trial ids in a tally (or set apart as uncounted)
        # per trial: suggested, unwritten (name, internal value, distribution, study's then)
        self._pending: dict[int, list[tuple[str, float, BaseDistribution, Any]]] = {}

    @property
    def uncounted(self) -> str | None:
        return self._uncounted

    def _add_trials_to_cache(self, study_id: int, trials: list[FrozenTrial]) -> None:
        super()._add_trials_to_cache(study_id, trials)
        tally = self._tally.setdefault(study_id, Counter())
        for trial in trials:
            if not trial.state.is_finished() or trial._trial_id in self._tallied:
                continue
            self._tallied.add(trial._trial_id)
            if self._uncounted is None or not trial.user_attrs.get(self._uncounted):
                tally[trial.state] += 1

    def finished_count(self, study_id: int, states: Iterable[TrialState]) -> int:
        """The study's finished trials in `states`, less those marked `uncounted`: what
        `get_all_trials` would give, filtered, counted, in O(trials changed since the last
        read)."""
        self._read_trials_from_remote_storage(study_id)
        with self._lock:
            tally = self._tally.get(study_id, Counter())
            return sum(tally[state] for state in states)

    def get_all_trials(
        self,
        study_id: int,
        deepcopy: bool = True,
        states: Container[TrialState] | None = None,
    ) -> list[FrozenTrial]:
        """As `_CachedStorage`; a read of unfinished states only (`ask` listing the WAITING
        trials, recovery the RUNNING ones) looks at the unfinished trials alone, and a read
        of the WAITING ones only (every `ask`) does not go to the database once the study is
        loaded: a trial is WAITING only as this storage created it (enqueued), and leaves
        that state only by this storage's write, which its cached copy follows."""
        finished = (TrialState.COMPLETE, TrialState.PRUNED, TrialState.FAIL)
        if states is None or any(state in states for state in finished):
            return super().get_all_trials(study_id, deepcopy, states)
        others = (TrialState.RUNNING,)
        if study_id not in self._loaded or any(state in states for state in others):
            self._read_trials_from_remote_storage(study_id)
        with self._lock:
            study = self._studies[study_id]
            place = self._trial_id_to_study_id_and_number
            unfinished = (study.trials[place[i][1]] for i in study.unfinished_trial_ids)
            trials = sorted((t for t in unfinished if t.state in states), key=lambda t: t.number)
            return copy.deepcopy(trials) if deepcopy else trials

    def _wrote(self, trial_id: int) -> None:
        with self._lock:
            self._written.add(trial_id)

    def _apply(self, trial_id: int, **changes: Any) -> None:
        """Put the runner's own write into its cached copy: a new copy of the trial with the
        dictionaries it wrote into merged (readers holding the old copy keep it as it was).
        A trial not cached is marked for a re-read instead."""
        with self._lock:
            place = self._trial_id_to_study_id_and_number.get(trial_id)
            if place is None or trial_id in self._written:
                self._written.add(trial_id)
                return
            study_id, number = place
            old = self._studies[study_id].trials[number]
            new = copy.copy(old)
            for name, items in changes.items():
                setattr(new, name, getattr(old, name) | items)
            self._studies[study_id].trials[number] = new

    def _write(self, trial_id: int, write: Any, **changes: Any) -> None:
        """A write to the database, then to the cached copy; a write that fails leaves the
        trial to be re-read (the database is the truth)."""
        try:
            write()
        except BaseException:
            self._wrote(trial_id)
            raise
        self._apply(trial_id, **changes)

    def create_new_trial(self, study_id: int, template_trial: FrozenTrial | None = None) -> int:
        """The trial as the database created it (Optuna's storage returns it), cached."""
        trial_id = super().create_new_trial(study_id, template_trial)
        with self._lock:
            self._studies[study_id].unfinished_trial_ids.add(trial_id)
            self._newest[study_id] = max(self._newest.get(study_id, -1), trial_id)
        return trial_id

    def set_trial_param(
        self,
        trial_id: int,
        param_name: str,
        param_value_internal: float,
        distribution: BaseDistribution,
    ) -> None:
        """Checked now as the database would check it (the trial unfinished, the distribution
        compatible with the study's), cached, and written with the trial's next write — in
        the same transaction as its attributes (`set_trial_user_attrs`: the runner writes a
        trial's costs right after suggesting it) — or before the next read of the database.
        A runner stopped in between leaves a running trial without parameters: it was never
        launched, and recovery re-enqueues it as any trial left running."""
        external = distribution.to_external_repr(param_value_internal)
        with self._lock:
            place = self._trial_id_to_study_id_and_number.get(trial_id)
            deferred = place is not None and trial_id not in self._written
            if deferred:
                assert place is not None
                study = self._studies[place[0]]
                check_updatable(study.trials[place[1]].number, study.trials[place[1]].state)
                previous = study.param_distribution.get(param_name)
                if previous is not None:
                    distributions.check_distribution_compatibility(previous, distribution)
                else:
                    study.param_distribution[param_name] = distribution
                self._pending.setdefault(trial_id, []).append(
                    (param_name, param_value_internal, distribution, previous)
                )
        if deferred:
            self._apply(
                trial_id, _params={param_name: external}, _distributions={param_name: distribution}
            )
            return
        self._write(
            trial_id,
            lambda: super(OwnedTrials, self).set_trial_param(
                trial_id, param_name, param_value_internal, distribution
            ),
            _params={param_name: external},
            _distributions={param_name: distribution},
        )

    def _write_params(self, session: Any, trial_id: int) -> bool:
        """The trial's pending parameters into `session` (True if there were any), the
        trial checked unfinished first (`check_unfinished`)."""
        with self._lock:
            pending = list(self._pending.get(trial_id, ()))
        if pending:
            try:
                check_unfinished(session, [trial_id])
            except optuna.exceptions.UpdateFinishedTrialError:
                # another writer finished it: they can never be written; it is re-read
                with self._lock:
                    self._pending.pop(trial_id, None)
                    self._written.add(trial_id)
                raise
        rows = []
        for name, internal, dist, previous in pending:
            if previous is None:  # the database's check against the study's other trials
                self._backend._set_trial_param_without_commit(
                    session, trial_id, name, internal, dist, None
                )
                continue
            rows.append(
                {
                    "trial_id": trial_id,
                    "param_name": name,
                    "param_value": internal,
                    "distribution_json": distributions.distribution_to_json(dist),
                }
            )
        if rows:  # one statement for all (ORM objects went one INSERT each)
            session.execute(sql_insert(models.TrialParamModel.__table__), rows)
        return bool(pending)

    def _written_params(self, trial_id: int, count: int) -> None:
        with self._lock:
            left = self._pending.get(trial_id, [])[count:]
            if left:
                self._pending[trial_id] = left
            else:
                self._pending.pop(trial_id, None)

    def _flush(self, trial_id: int) -> None:
        """The trial's pending parameters, in a transaction of their own. Those of a trial
        another writer finished are dropped (`_write_params`); the next write to it raises."""
        with self._lock:
            count = len(self._pending.get(trial_id, ()))
        if not count:
            return
        try:
            with _create_scoped_session(self._backend.scoped_session, True) as session:
                self._write_params(session, trial_id)
        except optuna.exceptions.UpdateFinishedTrialError:
            return
        self._written_params(trial_id, count)

    def _flush_all(self) -> None:
        with self._lock:
            ids = list(self._pending)
        for trial_id in ids:
            self._flush(trial_id)

    def set_trial_state_values(
        self, trial_id: int, state: TrialState, values: Sequence[float] | None = None
    ) -> bool:
        """The trial is re-read after its state changes (the database sets the timestamps);
        until then its cached copy has the new state (so a trial taken from WAITING is no
        longer listed there). A change the database refuses is re-read at once."""
        self._flush(trial_id)
        try:
            changed = super().set_trial_state_values(trial_id, state, values)
        except BaseException:
            self._wrote(trial_id)
            raise
        if not changed:  # another writer changed it first: the database's copy
            self._wrote(trial_id)
            self.get_trial(trial_id)
            return changed
        with self._lock:
            place = self._trial_id_to_study_id_and_number.get(trial_id)
            if place is not None:  # a new copy (readers holding the old one keep it)
                trials = self._studies[place[0]].trials
                trials[place[1]] = copy.copy(trials[place[1]])
                trials[place[1]].state = state
            self._written.add(trial_id)
        return changed

    def set_trial_intermediate_value(
        self, trial_id: int, step: int, intermediate_value: float
    ) -> None:
        self._flush(trial_id)
        self._write(
            trial_id,
            lambda: super(OwnedTrials, self).set_trial_intermediate_value(
                trial_id, step, intermediate_value
            ),
            intermediate_values={step: intermediate_value},
        )

    def set_trial_user_attr(self, trial_id: int, key: str, value: Any) -> None:
        self.set_trial_user_attrs(trial_id, {key: value})

    def set_trial_user_attrs(self, trial_id: int, attrs: dict[str, Any]) -> None:
        """Several user attributes of one trial in one transaction: on PostgreSQL and SQLite
        one check of the trial's state and one multi-row upsert (Optuna's storage writes an
        attribute as a read of the trial and an upsert, in a transaction of its own)."""
        backend = self._backend
        rows = [
            {"trial_id": trial_id, "key": key, "value_json": json.dumps(value)}
            for key, value in attrs.items()
        ]

        dialect = backend.engine.name
        with self._lock:
            params = len(self._pending.get(trial_id, ()))

        def write() -> None:
            with _create_scoped_session(backend.scoped_session) as session:
                self._write_params(session, trial_id)  # the suggested parameters first
                if not can_upsert(dialect) or len(rows) < 2:
                    for key, value in attrs.items():
                        backend._set_trial_attr_without_commit(
                            session, models.TrialUserAttributeModel, trial_id, key, value
                        )
                    return
                check_unfinished(session, [trial_id])
                session.execute(attrs_upsert(dialect, rows))

        self._write(trial_id, write, _user_attrs=dict(attrs))
        self._written_params(trial_id, params)

    def set_many_user_attrs(self, items: Sequence[tuple[int, dict[str, Any]]]) -> None:
        """User attributes of several trials (trial id, attributes), with their suggested
        parameters, in one transaction: one read of their states (each must be unfinished,
        as the database checks one trial's), one multi-row upsert. The runner writes the
        trials it asked in one pass of its loop so (a thousand at a restart, while the
        workers wait for their trials); elsewhere a trial at a time."""
        backend = self._backend
        if not can_upsert(backend.engine.name) or len(items) < 2:
            for trial_id, attrs in items:
                self.set_trial_user_attrs(trial_id, attrs)
            return
        ids = [trial_id for trial_id, _ in items]
        rows = [
            {"trial_id": trial_id, "key": key, "value_json": json.dumps(value)}
            for trial_id, attrs in items
            for key, value in attrs.items()
        ]
        with self._lock:
            counts = {trial_id: len(self._pending.get(trial_id, ())) for trial_id in ids}
        try:
            with _create_scoped_session(backend.scoped_session) as session:
                check_unfinished(session, ids)  # before anything is written
                for trial_id in ids:
                    self._write_params(session, trial_id)
                session.execute(attrs_upsert(backend.engine.name, rows))
        except BaseException:
            with self._lock:
                self._written.update(ids)
            raise
        for trial_id, attrs in items:
            self._apply(trial_id, _user_attrs=dict(attrs))
            self._written_params(trial_id, counts[trial_id])

    def requeue_lost(
        self,
        study_id: int,
        lost: Sequence[tuple[int, dict[str, Any]]],
        retries: Sequence[tuple[dict[str, Any], dict[str, Any]]],
    ) -> list[int]:
        """In one transaction: `retries` enqueued (each (params, user attributes), as
        `Study.enqueue_trial` enqueues one), then every `lost` trial (trial id, user
        attributes) given its attributes and failed, as `set_trial_user_attrs` and
        `set_trial_state_values(FAIL)` would one at a time. A lost trial not RUNNING any
        more rolls the whole back (`UpdateFinishedTrialError`): nothing is enqueued without
        its lost trial failed, nor failed without its retry. Returns the new trials' ids.
        Recovery of a killed runner does this for every trial it left running, while every
        worker waits (`requeue_statements`)."""
        backend = self._backend
        templates = [
            optuna.trial.create_trial(
                state=TrialState.WAITING, system_attrs={"fixed_params": p}, user_attrs=a
            )
            for p, a in retries
        ]
        rows = [
            {"trial_id": tid, "key": key, "value_json": json.dumps(value)}
            for tid, attrs in lost
            for key, value in attrs.items()
        ]
        ids = [tid for tid, _ in lost]
        self._flush_all()
        try:
            new = requeue_statements(backend.engine, study_id, templates, rows, ids)
        finally:  # re-read what it touched (or may have), as after any write
            with self._lock:
                self._written.update(ids)
        with self._lock:  # the new trials cached as `create_new_trial` caches one
            if study_id not in self._studies:
                self._studies[study_id] = _StudyInfo()
            self._add_trials_to_cache(study_id, new)
            self._studies[study_id].unfinished_trial_ids.update(t._trial_id for t in new)
            self._newest[study_id] = max(
                [self._newest.get(study_id, -1)] + [t._trial_id for t in new]
            )
        return [t._trial_id for t in new]

    def set_trial_system_attr(self, trial_id: int, key: str, value: Any) -> None:
        self._flush(trial_id)
        self._write(
            trial_id,
            lambda: super(OwnedTrials, self).set_trial_system_attr(trial_id, key, value),
            _system_attrs={key: value},
        )

    def get_trial(self, trial_id: int) -> FrozenTrial:
        """From the cache, unless its state changed or a write failed since it was read: then
        from the database, and that copy cached (the runner reads and writes from one
        thread, so nothing is written between the read and the caching)."""
        with self._lock:
            place = self._trial_id_to_study_id_and_number.get(trial_id)
            if place is not None and trial_id not in self._written:
                study_id, number = place
                return self._studies[study_id].trials[number]
        self._flush_all()  # the database's copy must have them
        trial = self._backend.get_trial(trial_id)  # not `super()`'s: it trusts a finished copy
        if place is not None:  # the database's copy: cache it (no re-read needed after)
            self._reread(place[0], trial)
        return trial

    def _reread(self, study_id: int, trial: FrozenTrial) -> None:
        with self._lock:
            study = self._studies[study_id]
            if trial._trial_id not in self._written:
                return
            self._written.discard(trial._trial_id)
            self._add_trials_to_cache(study_id, [trial])
            if trial.state.is_finished():
                study.unfinished_trial_ids.discard(trial._trial_id)
                study.last_finished_trial_id = max(study.last_finished_trial_id, trial._trial_id)

    def _read_trials_from_remote_storage(self, study_id: int) -> None:
        """The first read of a study reads every trial (as Optuna does); later reads only
        the unfinished trials this storage wrote since (with any trial newer than its newest,
        in the same query), and none at all when it wrote none: the runner's storage is the
        only one that creates its studies' trials (`ask`, and recovery's `enqueue_trial`),
        and it knows each trial it created. Pending parameters are written first (the
        database's copies must have them)."""
        self._flush_all()
        with self._lock:
            first = study_id not in self._loaded
        if first:
            with self._lock:
                if study_id not in self._studies:
                    self._studies[study_id] = _StudyInfo()
                study = self._studies[study_id]
                trials = self._read(
                    study_id, study.unfinished_trial_ids, study.last_finished_trial_id
                )
                self._cache_read(study_id, trials)
                ids = {t._trial_id for t in study.trials.values()}
                self._newest[study_id] = max([self._newest.get(study_id, -1), *ids])
                self._written -= ids
                self._loaded.add(study_id)
            return
        with self._lock:
            study = self._studies[study_id]
            written = study.unfinished_trial_ids & self._written
            if not written:  # only this storage creates trials: nothing newer exists
                return
            trials = self._read(study_id, written, self._newest.get(study_id, -1))
            self._written -= written
            self._cache_read(study_id, trials)

    def _read(self, study_id: int, trial_ids: set[int], after_id: int) -> list[FrozenTrial]:
        """The study's trials with these ids or an id above `after_id`, read in bulk
        (`trial_tables.read_trials`: a statement per table, not an ORM object per row, which
        made a restarted runner's first read of a study of 14,000 trials take seconds while
        its workers waited), ordered by id as Optuna's storage reads them. A study that does
        not exist raises KeyError, as there."""
        backend = self._backend
        if after_id < 0 and not trial_ids:
            backend.get_study_name_from_id(study_id)  # KeyError for a study that is not there
        stored = read_trials(
            backend.engine,
            study_id,
            trial_ids=trial_ids,
            after_trial_id=after_id,
            complete=True,
        )
        return sorted((t.frozen() for t in stored), key=lambda t: t._trial_id)

    def _cache_read(self, study_id: int, trials: list[FrozenTrial]) -> None:
        """Trials just read into the cache (as `_CachedStorage` does after its read)."""
        study = self._studies[study_id]
        if trials:
            self._add_trials_to_cache(study_id, trials)
            for trial in trials:
                self._newest[study_id] = max(self._newest.get(study_id, -1), trial._trial_id)
                if not trial.state.is_finished():
                    study.unfinished_trial_ids.add(trial._trial_id)
                    continue
                study.last_finished_trial_id = max(study.last_finished_trial_id, trial._trial_id)
                study.unfinished_trial_ids.discard(trial._trial_id)
