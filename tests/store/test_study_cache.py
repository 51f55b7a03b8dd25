"""The runner's study cache (`nas_service.store.optuna_storage.OwnedTrials`) answers exactly
what the database holds: after any sequence of the runner's own writes, its trials, its WAITING and
RUNNING lists and its finished count equal a fresh reader's, on a real SQLite database."""

from __future__ import annotations

import random
from pathlib import Path

import optuna
import pytest
from optuna.distributions import FloatDistribution
from optuna.trial import TrialState

from nas_service.runner.active import COUNTED, counted
from nas_service.runner.recovery import _requeue
from nas_service.store.jobs import optuna_storage
from nas_service.store.optuna_storage import OwnedTrials
from nas_service.store.records import TrialAttr

optuna.logging.set_verbosity(optuna.logging.ERROR)


def _fresh(url: str, name: str) -> list[optuna.trial.FrozenTrial]:
    study = optuna.load_study(study_name=name, storage=optuna_storage(url))
    return study.get_trials(deepcopy=False)


def _expected_count(trials: list[optuna.trial.FrozenTrial]) -> int:
    return sum(1 for t in trials if t.state in COUNTED and not t.user_attrs.get(TrialAttr.LOST))


def _summary(trials: list[optuna.trial.FrozenTrial]) -> list[tuple[object, ...]]:
    return [
        (
            t.number,
            t.state,
            t.values,
            t.params,
            t.distributions,
            sorted(t.user_attrs.items()),
            sorted(t.system_attrs.items()),
            t.intermediate_values,
            t.datetime_start,
            t.datetime_complete,
        )
        for t in trials
    ]


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_owned_trials_equal_a_fresh_reader_after_random_writes(db_url: str, seed: int) -> None:
    """On both backends (the attributes' one-transaction upsert is dialect SQL)."""
    url = db_url
    storage = OwnedTrials(optuna_storage(url), uncounted=TrialAttr.LOST)
    study = optuna.create_study(study_name="s", storage=storage)
    rng = random.Random(seed)
    running: list[optuna.Trial] = []
    for step in range(120):
        op = rng.random()
        if op < 0.15:
            study.enqueue_trial({"x": rng.uniform(0, 1)})
        elif op < 0.45 or not running:
            trial = study.ask()
            trial.suggest_float("x", 0, 1)
            trial.suggest_categorical("kind", ["a", "b"])
            running.append(trial)
        elif op < 0.6:  # writes to a running trial, applied to the cached copy
            trial = rng.choice(running)
            trial.report(rng.random(), step)  # also writes Optuna's own copy of the trial
            storage.set_trial_intermediate_value(trial._trial_id, step + 1000, rng.random())
            trial.set_user_attr(f"k{step % 3}", {"step": step})
            storage.set_trial_user_attrs(trial._trial_id, {"a": step, "b": [step]})
            storage.set_trial_system_attr(trial._trial_id, "sys", step)
            # several running trials' attributes (and pending parameters) in one transaction
            some = rng.sample(running, min(len(running), 3))
            storage.set_many_user_attrs(
                [(t._trial_id, {"many": step, "n": t.number}) for t in some]
            )
            by_number = {t.number: t for t in _fresh(url, "s")}
            assert _summary([storage.get_trial(trial._trial_id)]) == _summary(
                [by_number[trial.number]]
            )
        else:
            trial = running.pop(rng.randrange(len(running)))
            kind = rng.random()
            if kind < 0.5:
                study.tell(trial, trial.params["x"])
            elif kind < 0.7:
                study.tell(trial, state=TrialState.PRUNED)
            elif kind < 0.75:  # lost: marked before it is failed, as recovery does
                trial.set_user_attr(TrialAttr.LOST, True)
                study.tell(trial, state=TrialState.FAIL)
            elif kind < 0.85:  # lost with others, retried: recovery's bulk write
                lost = [trial] + [running.pop() for _ in range(min(len(running), 2))]
                storage.requeue_lost(
                    study._study_id,
                    [(t._trial_id, {TrialAttr.LOST: True, "why": step}) for t in lost],
                    [(dict(t.params), {"retry_of": t.number}) for t in lost[:2]],
                )
            else:
                trial.set_user_attr("note", step)
                study.tell(trial, state=TrialState.FAIL)
        if step % 10 == 9:
            # suggested parameters reach the database with the trial's next write, or
            # before the storage's next read of the database
            study.get_trials(deepcopy=False)
            fresh = _fresh(url, "s")
            assert counted(study) == _expected_count(fresh)
            assert storage.finished_count(study._study_id, COUNTED) == _expected_count(fresh)
            for states in ((TrialState.WAITING,), (TrialState.RUNNING,), COUNTED, None):
                mine = study.get_trials(deepcopy=False, states=states)
                theirs = [t for t in fresh if states is None or t.state in states]
                assert _summary(mine) == _summary(theirs), states
    assert counted(study) == _expected_count(_fresh(url, "s"))
    assert any(t.user_attrs.get(TrialAttr.LOST) for t in _fresh(url, "s"))


def test_suggested_parameters_are_written_with_the_trials_attributes(tmp_path: Path) -> None:
    """A trial's parameters wait for its next write and go in its transaction: a reader sees
    them with the attributes, and a refused distribution is refused at the suggestion."""
    url = f"sqlite:///{tmp_path / 'db.sqlite'}"
    storage = OwnedTrials(optuna_storage(url))
    study = optuna.create_study(study_name="s", storage=storage)
    trial = study.ask()
    x = trial.suggest_float("x", 0, 1)
    kind = trial.suggest_categorical("kind", ["a", "b"])
    assert _fresh(url, "s")[0].params == {}  # not yet written
    assert storage.get_trial(trial._trial_id).params == {"x": x, "kind": kind}  # cached
    storage.set_trial_user_attrs(trial._trial_id, {"costs": {"m": 1.0}, "arch": {}})
    (seen,) = _fresh(url, "s")
    assert seen.params == {"x": x, "kind": kind} and seen.user_attrs["costs"] == {"m": 1.0}
    second = study.ask()
    with pytest.raises(ValueError):  # incompatible with the study's distribution of "x"
        second.suggest_categorical("x", ["p", "q"])
    study.tell(second, 0.5)  # its state change writes what it had
    study.tell(trial, 0.25)
    assert _summary(_fresh(url, "s")) == _summary(study.get_trials())


def test_a_failed_write_leaves_the_trial_to_be_re_read(tmp_path: Path) -> None:
    """A write the database refuses (the trial finished meanwhile) changes nothing cached:
    the next read is the database's."""
    url = f"sqlite:///{tmp_path / 'db.sqlite'}"
    storage = OwnedTrials(optuna_storage(url))
    study = optuna.create_study(study_name="s", storage=storage)
    trial = study.ask()
    other = optuna_storage(url)  # another writer (never the case in service; here the test's)
    other.set_trial_state_values(trial._trial_id, TrialState.FAIL)
    with pytest.raises(optuna.exceptions.UpdateFinishedTrialError):
        storage.set_trial_user_attrs(trial._trial_id, {"a": 1, "b": 2})
    with pytest.raises(optuna.exceptions.UpdateFinishedTrialError):
        storage.set_trial_user_attrs(trial._trial_id, {"a": 1})
    frozen = storage.get_trial(trial._trial_id)
    assert frozen.state == TrialState.FAIL
    assert frozen.user_attrs == {}


def test_a_reopened_cache_counts_what_an_earlier_one_wrote(tmp_path: Path) -> None:
    """A new runner's storage (after a restart) reads the study in full once: the tally
    starts from the database, lost trials kept apart."""
    url = f"sqlite:///{tmp_path / 'db.sqlite'}"
    first = optuna.create_study(study_name="s", storage=OwnedTrials(optuna_storage(url)))
    for i in range(5):
        trial = first.ask()
        if i == 2:
            trial.set_user_attr(TrialAttr.LOST, True)
            first.tell(trial, state=TrialState.FAIL)
        else:
            first.tell(trial, float(i))
    first.enqueue_trial({})
    storage = OwnedTrials(optuna_storage(url), uncounted=TrialAttr.LOST)
    study = optuna.load_study(study_name="s", storage=storage)
    assert counted(study) == 4
    assert [t.number for t in study.get_trials(states=(TrialState.WAITING,))] == [5]
    popped = study.ask()  # the WAITING trial, found in the unfinished set
    assert popped.number == 5
    study.tell(popped, 1.0)
    assert counted(study) == 5
    assert study.get_trials(states=(TrialState.WAITING,)) == []


def test_counted_on_optunas_own_storage_is_the_same(tmp_path: Path) -> None:
    """Any other storage (a reader, the benchmark's comparison) counts by listing."""
    url = f"sqlite:///{tmp_path / 'db.sqlite'}"
    study = optuna.create_study(study_name="s", storage=optuna_storage(url))
    for i in range(4):
        trial = study.ask()
        if i == 1:
            trial.set_user_attr(TrialAttr.LOST, True)
            study.tell(trial, state=TrialState.FAIL)
        else:
            study.tell(trial, state=TrialState.PRUNED)
    assert counted(study) == 3


def _lost_study(url: str, name: str, storage: optuna.storages.BaseStorage) -> optuna.Study:
    """Three trials left running (one with an attribute the conclusion overwrites), one
    complete, one retry of trial 1 enqueued already; the same parameters every time."""
    study = optuna.create_study(
        study_name=name, storage=storage, sampler=optuna.samplers.RandomSampler(seed=0)
    )
    study.add_trial(
        optuna.trial.create_trial(
            params={"x": 0.5}, distributions={"x": FloatDistribution(0, 1)}, value=1.0
        )
    )
    for i in range(3):
        trial = study.ask()
        trial.suggest_float("x", 0, 1)
        trial.set_user_attr("costs", {"params": i})
        if i == 1:
            trial.set_user_attr(TrialAttr.OUTCOME, "stale")
    study.enqueue_trial({"x": 0.25}, user_attrs={TrialAttr.RETRY_OF: 1, TrialAttr.SUSPECT: 0})
    return study


def test_recovery_in_bulk_writes_what_a_trial_at_a_time_writes(db_url: str) -> None:
    """`recovery._requeue` on the runner's storage (one transaction, `requeue_lost`) leaves
    the same trials as on Optuna's (enqueue, then conclude, a trial at a time): the same
    retries (with their fixed parameters), the same lost trials, field by field; and the
    runner's cache reads what the database holds."""
    stored = {}
    for name, storage in (
        ("one-at-a-time", optuna_storage(db_url)),
        ("bulk", OwnedTrials(optuna_storage(db_url), uncounted=TrialAttr.LOST)),
    ):
        study = _lost_study(db_url, name, storage)
        left = study.get_trials(deepcopy=False, states=(TrialState.RUNNING,))
        assert len(left) == 3
        _requeue(study, [(t, k) for k, t in enumerate(left)], retried={1})
        if isinstance(storage, OwnedTrials):
            assert _summary(study.get_trials(deepcopy=False)) == _summary(_fresh(db_url, name))
        stored[name] = _fresh(db_url, name)
    bulk, reference = stored["bulk"], stored["one-at-a-time"]
    assert len(bulk) == len(reference) == 7
    for mine, theirs in zip(bulk, reference, strict=True):
        a, b = vars(mine).copy(), vars(theirs).copy()
        for moment in ("_trial_id", "datetime_complete", "_datetime_start"):
            a.pop(moment), b.pop(moment)
        assert a == b
    assert [t.user_attrs.get(TrialAttr.RETRY_OF) for t in bulk[4:]] == [1, 2, 3]
    assert all(t.user_attrs[TrialAttr.OUTCOME] == "lost" for t in bulk[1:4])


def test_a_bulk_requeue_is_all_or_nothing(tmp_path: Path) -> None:
    """A trial to fail that is no longer running rolls the whole write back: no retry is
    enqueued without its lost trial failed (recovery then goes a trial at a time)."""
    url = f"sqlite:///{tmp_path / 'db.sqlite'}"
    storage = OwnedTrials(optuna_storage(url), uncounted=TrialAttr.LOST)
    study = _lost_study(url, "s", storage)
    before = _summary(_fresh(url, "s"))
    running = study.get_trials(deepcopy=False, states=(TrialState.RUNNING,))
    done = study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
    with pytest.raises(optuna.exceptions.UpdateFinishedTrialError):
        storage.requeue_lost(
            study._study_id,
            [(t._trial_id, {TrialAttr.LOST: True}) for t in [*running, *done]],
            [({"x": 0.1}, {})],
        )
    assert _summary(_fresh(url, "s")) == before
    assert _summary(study.get_trials(deepcopy=False)) == before


def test_many_trials_attributes_are_refused_together_for_a_finished_one(tmp_path: Path) -> None:
    """`set_many_user_attrs` checks every trial's state as the database checks one: a
    finished one refuses the whole write, and the cache re-reads what it touched."""
    url = f"sqlite:///{tmp_path / 'db.sqlite'}"
    storage = OwnedTrials(optuna_storage(url), uncounted=TrialAttr.LOST)
    study = optuna.create_study(study_name="s", storage=storage)
    running = [study.ask() for _ in range(3)]
    study.tell(running[1], 1.0)
    with pytest.raises(optuna.exceptions.UpdateFinishedTrialError):
        storage.set_many_user_attrs([(t._trial_id, {"k": 1}) for t in running])
    assert all("k" not in t.user_attrs for t in _fresh(url, "s"))
    assert _summary(study.get_trials(deepcopy=False)) == _summary(_fresh(url, "s"))


def test_a_refused_batch_writes_nothing_and_the_next_write_succeeds(db_url: str) -> None:
    """A batch refused for a trial another writer finished writes none of the batch (not
    the other trials' suggested parameters either: Optuna's check of a finished trial once
    committed them through its thread-local session), and each other trial's own write
    afterwards records its parameters and attributes."""
    storage = OwnedTrials(optuna_storage(db_url), uncounted=TrialAttr.LOST)
    study = optuna.create_study(study_name="s", storage=storage)
    running = [study.ask() for _ in range(3)]
    for t in running:
        t.suggest_float("x", 0, 1)
    other = optuna_storage(db_url)  # another writer finishes one; the cache does not know
    other.set_trial_state_values(running[1]._trial_id, TrialState.FAIL)
    with pytest.raises(optuna.exceptions.UpdateFinishedTrialError):
        storage.set_many_user_attrs([(t._trial_id, {"k": 1, "j": 2}) for t in running])
    fresh = _fresh(db_url, "s")
    assert all(t.params == {} and t.user_attrs == {} for t in fresh)
    for t in (running[0], running[2]):
        storage.set_trial_user_attrs(t._trial_id, {"k": 1, "j": 2})
    fresh = _fresh(db_url, "s")
    for stored in (fresh[0], fresh[2]):
        assert stored.user_attrs == {"k": 1, "j": 2} and set(stored.params) == {"x"}
    assert fresh[1].params == {} and fresh[1].state == TrialState.FAIL
    assert _summary(study.get_trials(deepcopy=False)) == _summary(fresh)


def test_a_parameter_set_on_a_finished_trial_is_refused_not_deadlocked(tmp_path: Path) -> None:
    """`set_trial_param` on a trial the cache knows finished raises at once (Optuna's
    check re-read the trial through this storage's own lock, which it held: a deadlock)."""
    import threading

    url = f"sqlite:///{tmp_path / 'db.sqlite'}"
    storage = OwnedTrials(optuna_storage(url), uncounted=TrialAttr.LOST)
    study = optuna.create_study(study_name="s", storage=storage)
    trial = study.ask()
    study.tell(trial, 1.0)
    study.get_trials()  # the finished state cached
    raised: list[BaseException] = []

    def attempt() -> None:
        try:
            storage.set_trial_param(trial._trial_id, "x", 0.5, FloatDistribution(0, 1))
        except BaseException as exc:
            raised.append(exc)

    worker = threading.Thread(target=attempt, daemon=True)
    worker.start()
    worker.join(10)
    assert not worker.is_alive(), "set_trial_param deadlocked"
    assert len(raised) == 1 and isinstance(raised[0], optuna.exceptions.UpdateFinishedTrialError)


class _CountingSampler(optuna.samplers.RandomSampler):
    """Counts the `after_trial` calls per trial number."""

    def __init__(self) -> None:
        super().__init__(seed=0)
        self.told: dict[int, int] = {}

    def after_trial(
        self,
        study: optuna.Study,
        trial: optuna.trial.FrozenTrial,
        state: TrialState,
        values: object,
    ) -> None:
        self.told[trial.number] = self.told.get(trial.number, 0) + 1


def test_recoverys_fallback_tells_the_sampler_once(tmp_path: Path) -> None:
    """Should a lost trial be concluded meanwhile (by another writer), the bulk requeue is
    refused and recovery concludes the others one at a time: the sampler hears of each lost
    trial once (it was told twice: before the refused transaction, then by `tell`), and the
    others are still failed, marked lost and retried."""
    url = f"sqlite:///{tmp_path / 'db.sqlite'}"
    storage = OwnedTrials(optuna_storage(url), uncounted=TrialAttr.LOST)
    study = _lost_study(url, "s", storage)
    sampler = _CountingSampler()
    study.sampler = sampler
    left = study.get_trials(deepcopy=False, states=(TrialState.RUNNING,))
    optuna_storage(url).set_trial_state_values(left[0]._trial_id, TrialState.FAIL)
    _requeue(study, [(t, 0) for t in left], retried={1})
    assert sampler.told == {t.number: 1 for t in left}
    fresh = {t.number: t for t in _fresh(url, "s")}
    for t in left[1:]:
        assert fresh[t.number].state == TrialState.FAIL
        assert fresh[t.number].user_attrs[TrialAttr.LOST] is True
    retries = [t.user_attrs.get(TrialAttr.RETRY_OF) for t in fresh.values()]
    assert {left[2].number} <= set(retries)
    assert _summary(study.get_trials(deepcopy=False)) == _summary(list(fresh.values()))


def test_the_database_storage_under_a_cache_is_found(tmp_path: Path) -> None:
    """`rdb_storage`: the one accessor of the storage under Optuna's cache (calibration's
    bulk reads), for the runner's storage and Optuna's own cached one alike."""
    from optuna.storages import InMemoryStorage, get_storage

    from nas_service.store.optuna_study import rdb_storage

    rdb = optuna_storage(f"sqlite:///{tmp_path / 'db.sqlite'}")
    assert rdb_storage(rdb) is rdb
    assert rdb_storage(OwnedTrials(rdb)) is rdb
    assert rdb_storage(get_storage(rdb)) is rdb
    with pytest.raises(TypeError, match="not a database storage: InMemoryStorage"):
        rdb_storage(InMemoryStorage())
