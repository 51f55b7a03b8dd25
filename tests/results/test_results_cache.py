"""The results cache under many pollers of one job: one refresh serves them all."""

from __future__ import annotations

import gc
import json
import threading
import time
from pathlib import Path
from typing import Any

import optuna
import pytest

from nas_service.results.cache import JobResults, ResultsCache
from nas_service.store.jobs import optuna_storage


def test_concurrent_readers_of_a_changed_study_share_one_refresh(tmp_path: Path) -> None:
    """Pollers that find a study changed wait for the refresh in flight instead of each
    reading the trials again (a herd of identical reads is what slowed the API under load)."""
    storage = optuna_storage(f"sqlite:///{tmp_path / 'r.db'}")
    study = optuna.create_study(study_name="s", storage=storage)
    study.add_trial(optuna.trial.create_trial(value=1.0))
    cache = ResultsCache(storage)  # fresh_s 0: every call reads the fingerprint
    assert len(cache.get("s", ["val_loss"]).rows) == 1
    study.add_trial(optuna.trial.create_trial(value=2.0))

    refreshes = 0
    original = cache._refresh

    def slow_refresh(*args: Any) -> Any:
        nonlocal refreshes
        refreshes += 1
        time.sleep(0.3)  # long enough for every reader to arrive meanwhile
        return original(*args)

    cache._refresh = slow_refresh  # type: ignore[method-assign,assignment]
    seen: list[JobResults] = []
    start = threading.Barrier(8)

    def read() -> None:
        start.wait()
        seen.append(cache.get("s", ["val_loss"]))

    threads = [threading.Thread(target=read) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert len(seen) == 8 and all(len(r.rows) == 2 for r in seen)
    assert refreshes == 1


def test_a_refresh_of_one_study_does_not_hold_up_another(tmp_path: Path) -> None:
    storage = optuna_storage(f"sqlite:///{tmp_path / 'r.db'}")
    for name in ("a", "b"):
        optuna.create_study(study_name=name, storage=storage).add_trial(
            optuna.trial.create_trial(value=1.0)
        )
    cache = ResultsCache(storage)
    cache.get("b", ["val_loss"])
    original = cache._refresh
    entered = threading.Event()

    def slow_refresh(name: str, *args: Any) -> Any:
        if name == "a":
            entered.set()
            time.sleep(1.0)
        return original(name, *args)

    cache._refresh = slow_refresh  # type: ignore[method-assign,assignment]
    slow = threading.Thread(target=cache.get, args=("a", ["val_loss"]))
    slow.start()
    assert entered.wait(10)
    began = time.monotonic()
    assert len(cache.get("b", ["val_loss"]).rows) == 1
    assert time.monotonic() - began < 0.5  # b's answer did not wait for a's refresh
    slow.join(timeout=30)


def test_results_never_wait_for_the_pool_a_request_holds(tmp_path: Path) -> None:
    """A request holds its session's connection while it asks for results; the cache reads
    a job's run rows on the Optuna storage's own pool. Sharing the requests' pool, readers
    queued behind one study's refresh held every connection that refresh needed (under load:
    a 10 s stall, then 503s)."""
    from sqlalchemy import select

    from nas_service.store import TrialRun, make_engine, make_sessionmaker, upgrade

    url = f"sqlite:///{tmp_path / 'r.db'}"
    upgrade(url)
    storage = optuna_storage(url)
    optuna.create_study(study_name="s", storage=storage).add_trial(
        optuna.trial.create_trial(value=1.0)
    )
    sessions = make_sessionmaker(make_engine(url, pool_size=1, max_overflow=0, pool_timeout=0.5))
    cache = ResultsCache(storage, job_runs=True)
    with sessions() as request:  # the request's transaction holds the pool's one connection
        request.execute(select(TrialRun.id)).all()
        results = cache.get("s", ["val_loss"], job_id="job-1")
        assert len(results.rows) == 1
        assert len(cache.get("s", ["val_loss"], job_id="job-1").rows) == 1


def test_concurrent_askers_of_one_answer_share_one_computation() -> None:
    """A page's first visit asks several queries at once over one job: an answer asked by
    several requests at the same time is computed once, the others wait for it; an answer
    that raised is not kept; different answers do not wait for each other."""
    results = JobResults("s", ["val_loss"])
    computed = 0
    start = threading.Barrier(6)

    def slow() -> int:
        nonlocal computed
        computed += 1
        time.sleep(0.3)  # long enough for every asker to arrive meanwhile
        return 42

    seen: list[int] = []

    def ask() -> None:
        start.wait()
        seen.append(results.memoised("answer", slow))

    threads = [threading.Thread(target=ask) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert seen == [42] * 6 and computed == 1

    def fails() -> int:
        raise RuntimeError("not yet")

    for _ in range(2):
        with pytest.raises(RuntimeError):
            results.memoised("failing", fails)
    assert "failing" not in results.memo and results.memoised("failing", lambda: 7) == 7

    entered = threading.Event()

    def blocking() -> int:
        entered.set()
        time.sleep(1.0)
        return 1

    other = threading.Thread(target=results.memoised, args=("slow", blocking))
    other.start()
    assert entered.wait(10)
    began = time.monotonic()
    assert results.memoised("quick", lambda: 2) == 2
    assert time.monotonic() - began < 0.5
    other.join(timeout=30)


def test_a_large_first_load_is_frozen_out_of_the_cycle_collector(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A table's first load leaves about a hundred objects per trial behind: when a load
    leaves more than FREEZE_AFTER, they go to the collector's permanent generation (every
    later collection would walk them); a refresh that adds a few rows freezes nothing, and
    the collector is on afterwards."""
    from nas_service.results import cache as results_module
    from tests.support.api import SPEC, _synthetic

    storage = optuna_storage(f"sqlite:///{tmp_path / 'r.db'}")
    study = optuna.create_study(study_name="s", storage=storage)
    support: Any = _synthetic()
    from nas_service.spec import parse_spec

    job = parse_spec(SPEC | {"objectives": ["val_loss"]})
    support.store_trials(study, support.synthetic_trials(job, 300))
    monkeypatch.setattr(results_module, "FREEZE_AFTER", 5_000)  # 300 trials: ~30,000 objects
    cache = ResultsCache(storage)
    gc.unfreeze()
    assert gc.isenabled() and gc.get_freeze_count() == 0
    assert len(cache.get("s", ["val_loss"]).rows) == 300
    frozen = gc.get_freeze_count()  # the table, and what else the process held
    assert frozen > 300 * 50 and gc.isenabled()
    support.store_trials(study, support.synthetic_trials(job, 2, seed=1))
    assert len(cache.get("s", ["val_loss"]).rows) == 302
    assert gc.get_freeze_count() <= frozen and gc.isenabled()  # some were freed since
    gc.unfreeze()


def test_a_rows_shown_read_is_encoded_once_and_a_changed_trial_shows_anew(
    tmp_path: Path,
) -> None:
    """A row's API read is encoded once (pollers of one page share it); a trial that changes
    gets a new row at the refresh, so its read shows the change, never the old one."""
    storage = optuna_storage(f"sqlite:///{tmp_path / 'r.db'}")
    study = optuna.create_study(study_name="s", storage=storage)
    study.add_trial(optuna.trial.create_trial(value=1.0))
    running = study.ask()
    cache = ResultsCache(storage)
    first = cache.get("s", ["val_loss"])
    done, pending = first.rows
    assert done.read_json is done.read_json  # encoded once
    shown = json.loads(pending.read_json)
    assert shown["state"] == "running" and shown["values"] is None
    study.tell(running, 0.5)
    done2, finished = cache.get("s", ["val_loss"]).rows
    assert done2 is done  # a finished trial's row (and its encoded read) is kept
    now = json.loads(finished.read_json)
    assert now["state"] == "complete" and now["values"] == [0.5]
    assert json.loads(pending.read_json)["state"] == "running"  # the old row is only replaced


def test_a_tables_size_counts_its_rows_encoded_reads(tmp_path: Path) -> None:
    """The cache's memory bound counts each row's encoded read, shown or not: a table whose
    rows were all shown is not larger than its estimate said."""
    from nas_service.results.cache import table_bytes

    storage = optuna_storage(f"sqlite:///{tmp_path / 'r.db'}")
    study = optuna.create_study(study_name="s", storage=storage)
    study.add_trials([optuna.trial.create_trial(value=float(k)) for k in range(200)])
    rows = ResultsCache(storage).get("s", ["val_loss"]).rows
    unshown = [r for r in rows if "read_json" not in vars(r)]
    assert unshown, "the estimate encodes a sample of the rows, not all of them"
    before = table_bytes(rows)
    for r in rows:
        assert r.read_json
    assert table_bytes(rows) == before  # counted the same, shown or not
    assert before >= sum(len(r.read_json) for r in rows)
