"""A job's results as a table (`JobResults`: one row per Optuna trial, `decode`), loaded once
per job and refreshed only when the study changed, so queries stay fast at 10,000 trials; the
answers of the queries over it, memoised per state of the study; and what the service keeps of
them all, within a memory bound (`ResultsCache`).

The fingerprint rests on two facts of Optuna's storage: trial numbers are 0, 1, 2, … in
order of creation, and a finished trial never changes. So a table of n trials is current
while trial n does not exist (one indexed lookup) and none of its unfinished trials has
finished. For a job's study the latter is read from the service's own `ds_trial_runs`
(one indexed aggregate: the runner closes or drops a trial's run row after telling the
trial, and recovery closes the rows of what it concludes); for any other study, from the
states of the study's unfinished trials."""

from __future__ import annotations

import collections
import contextlib
import gc
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, TypeVar

import numpy as np
import optuna
from optuna.trial import TrialState
from sqlalchemy import func, select
from sqlalchemy.orm import Session

from nas_service.results import profiles
from nas_service.results.decode import STATE_NAMES, _row
from nas_service.results.rows import TrialRow
from nas_service.store import Job, TrialRun
from nas_service.store.jobs import stored_spec
from nas_service.store.trial_tables import read_trials

T = TypeVar("T")

_UNFINISHED = (TrialState.RUNNING, TrialState.WAITING)
#: A table's fingerprint: (its number of trials, whether trial n exists, and its job's run
#: rows as (count, last id, last finish) or else its unfinished trials as (id, state)).
Fingerprint = tuple[int, bool, tuple[Any, ...]]


@dataclass
class JobResults:
    study_name: str
    objectives: list[str]
    rows: list[TrialRow] = field(default_factory=list)
    fingerprint: Fingerprint = (0, False, ())
    #: query answers for this fingerprint, least recently used first, and their sizes
    memo: collections.OrderedDict[Any, Any] = field(default_factory=collections.OrderedDict)
    memo_bytes: int = 0
    #: what the memo may hold, in bytes (estimated: `approx_bytes`)
    memo_limit: int = 0
    _sizes: dict[Any, int] = field(default_factory=dict, repr=False, compare=False)
    _guard: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)
    _computing: dict[Any, threading.Lock] = field(default_factory=dict, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.memo_limit <= 0:
            self.memo_limit = MEMO_BYTES

    def memoised(self, key: Any, compute: Callable[[], T]) -> T:
        """The answer to a query, computed once per state of the study and kept while the
        memo's answers fit in `memo_limit` bytes (at most `MEMO_LIMIT` of them): the least
        recently used go first, and an answer larger than the whole limit is answered, not
        kept. Computed once even when several requests ask at the same time: the later ones
        wait for the first one's answer (a page's first visit asks several queries at once,
        each over the same profile); an exception is never kept."""
        with self._guard:
            if key in self.memo:
                self.memo.move_to_end(key)
                hit: T = self.memo[key]
                return hit
            if len(self._computing) >= MEMO_LIMIT:  # that many distinct queries at once
                lock = None
            else:
                lock = self._computing.setdefault(key, threading.Lock())
        if lock is None:
            return compute()
        try:
            with lock:
                with self._guard:
                    if key in self.memo:
                        kept: T = self.memo[key]
                        return kept
                value = compute()
                self._keep(key, value)
                return value
        finally:
            with self._guard:
                if self._computing.get(key) is lock:  # those waiting on it hold it
                    del self._computing[key]

    def _keep(self, key: Any, value: Any) -> None:
        """Keep `value` under `key` if it fits, evicting the least recently used answers."""
        size = approx_bytes(value, self.memo_limit)
        if size > self.memo_limit:
            return
        with self._guard:
            while self.memo and (
                self.memo_bytes + size > self.memo_limit or len(self.memo) >= MEMO_LIMIT
            ):
                old, _ = self.memo.popitem(last=False)
                self.memo_bytes -= self._sizes.pop(old, 0)
            self.memo[key] = value
            self._sizes[key] = size
            self.memo_bytes += size

    def counted(self) -> list[TrialRow]:
        return [r for r in self.rows if not r.lost and r.state.finished]

    def profile(self) -> list[profiles.ProfileRow]:
        """`profiles.profile` of the counted trials, once per state of the study: each
        architecture (at its budget) at its best training setting. Every query on the
        profile reads it from here, a subset of architectures filtered out of it (a
        profile is per architecture, so the profile of a subset of architectures is this
        one's rows of those architectures, in the same order)."""
        return self.memoised(("profile",), lambda: profiles.profile(self.counted()))


#: Answers kept per state of a study at most (`JobResults.memoised`).
MEMO_LIMIT = 1024
#: Bytes of answers kept per state of a study at most (`JobResults.memoised`).
MEMO_BYTES = 32 << 20


def approx_bytes(value: Any, limit: int) -> int:
    """An estimate of the memory `value` holds (`sys.getsizeof` of everything it reaches,
    each object once), stopping as soon as it passes `limit`. A table's rows (`TrialRow`)
    are not counted: the table holds them anyway, and an answer refers to them."""
    seen: set[int] = set()
    stack = [value]
    total = 0
    while stack and total <= limit:
        obj = stack.pop()
        if id(obj) in seen or isinstance(obj, TrialRow):
            continue
        seen.add(id(obj))
        total += sys.getsizeof(obj)
        if isinstance(obj, str | bytes | int | float | bool) or obj is None:
            continue
        if isinstance(obj, np.ndarray):
            total += int(obj.nbytes)
        elif isinstance(obj, dict):
            stack.extend(obj.keys())
            stack.extend(obj.values())
        elif isinstance(obj, list | tuple | set | frozenset):
            stack.extend(obj)
        else:
            attrs = getattr(obj, "__dict__", None)
            if attrs is not None:
                stack.append(attrs)
            for extra in ("__pydantic_extra__", "__pydantic_fields_set__"):
                if getattr(obj, extra, None) is not None:
                    stack.append(getattr(obj, extra))
            for slot in getattr(type(obj), "__slots__", ()):
                if isinstance(slot, str) and hasattr(obj, slot):
                    stack.append(getattr(obj, slot))
    return total


def _unfinished(rows: list[TrialRow]) -> tuple[tuple[int, str], ...]:
    return tuple(sorted((r.trial_id, str(r.state)) for r in rows if not r.state.finished))


#: A table build that leaves more objects than this behind freezes them (`_no_cycle_collection`).
FREEZE_AFTER = 100_000


@contextlib.contextmanager
def _no_cycle_collection() -> Iterator[None]:
    """Python's cycle collector off while a table is built: building one allocates a few
    objects per stored row and none in a cycle, and each of the collections that many
    allocations set off walks every object the process holds (half the build's time at
    10,000 trials). Reference counting frees everything meanwhile as always; the collector
    is back on at the end (unless it was off before).

    A build that left more than `FREEZE_AFTER` objects behind (a job's first load: about a
    hundred per trial) moves them to the collector's permanent generation (`gc.freeze`):
    each of them would otherwise be walked by the next collections of every generation,
    whichever request set them off (a third of a 10,000-trial job's first page, spent in
    its next reads). They hold no cycle, and a refresh that drops them frees them by
    reference counting as always; what else the process held at that moment is frozen
    too, which costs at most the cycles among it, once per such load."""
    was_on = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if gc.get_count()[0] > FREEZE_AFTER:
            gc.freeze()
        if was_on:
            gc.enable()


#: What a service keeps of every study's tables and their answers, in bytes (estimated).
CACHE_BYTES = 768 << 20
#: Rows of a table whose size is measured to estimate the whole table's (`table_bytes`).
SIZE_SAMPLE = 64


def table_bytes(rows: list[TrialRow]) -> int:
    """An estimate of the memory a table's rows hold: the size of up to `SIZE_SAMPLE` rows
    spread over the table, scaled to all of them (a row's size is mostly its curve and its
    training summary, alike across a job), each with the bytes of its encoded read."""
    if not rows:
        return 0
    step = max(1, len(rows) // SIZE_SAMPLE)
    sample = rows[::step]
    # with each row's encoded read (`TrialRow.read_json`), as if every row had been shown
    measured = sum(
        approx_bytes({k: v for k, v in vars(r).items() if k != "read_json"}, 1 << 62)
        + sys.getsizeof(r.read_json)
        for r in sample
    )
    return int(measured / len(sample) * len(rows)) + sys.getsizeof(rows)


class ResultsCache:
    """Per-study result tables, refreshed when the study's fingerprint changes. The tables
    and their memoised answers together are kept within `max_bytes` (estimated): past it,
    the tables read least recently are dropped (a later read loads them again)."""

    def __init__(
        self,
        storage: optuna.storages.RDBStorage,
        fresh_s: float = 0.0,
        job_runs: bool = False,
        max_bytes: int = CACHE_BYTES,
    ) -> None:
        self.storage = storage
        self.fresh_s = fresh_s
        self.max_bytes = max_bytes
        # a job's run rows (the service's tables, same database) tell when its study changed;
        # they are read on the storage's own pool, never on the requests' (see `_runs`)
        self.job_runs = job_runs
        self._jobs: dict[str, str] = {}  # study name -> job id
        self._cache: collections.OrderedDict[str, JobResults] = collections.OrderedDict()
        self._sizes: dict[str, int] = {}  # study name -> its table's bytes (`table_bytes`)
        self._study_ids: dict[str, int] = {}
        self._checked: dict[str, tuple[float, Fingerprint]] = {}
        self._recent: dict[Any, tuple[float, Any]] = {}
        self._lock = threading.Lock()
        self._study_locks: dict[str, threading.Lock] = {}

    def recent(self, key: Any, compute: Callable[[], T]) -> T:
        """`compute()`, reused for `fresh_s` seconds per key (a job's row, say: pollers
        asking many times a second cost the database one read per `fresh_s`). An exception
        is never kept."""
        now = time.monotonic()
        hit = self._recent.get(key)
        if hit is not None and now - hit[0] < self.fresh_s:
            kept: T = hit[1]
            return kept
        value = compute()
        if self.fresh_s > 0:
            if len(self._recent) >= 10_000:  # bounded: stale entries go first
                self._recent = {k: v for k, v in self._recent.items() if now - v[0] < self.fresh_s}
            self._recent[key] = (now, value)
        return value

    def forget(self, key: Any) -> None:
        self._recent.pop(key, None)

    def _study_id_of(self, study_name: str) -> int:
        if study_name not in self._study_ids:
            self._study_ids[study_name] = self.storage.get_study_id_from_name(study_name)
        return self._study_ids[study_name]

    def _fingerprint(self, study_name: str) -> Fingerprint:
        """Changes whenever a trial is added, finishes or changes state. A fingerprint read
        less than `fresh_s` ago is reused: many clients polling one job then cost the
        database one read per `fresh_s`."""
        now = time.monotonic()
        checked = self._checked.get(study_name)
        if checked is not None and now - checked[0] < self.fresh_s:
            return checked[1]
        fp = self._read_fingerprint(study_name)
        self._checked[study_name] = (now, fp)
        return fp

    def _read_fingerprint(self, study_name: str) -> Fingerprint:
        """The study's fingerprint as seen from the cached table: whether trial n (the
        table's count) exists, and the states of the study's unfinished trials (read only
        when the table has some, or a new trial appeared: else none can exist)."""
        sid = self._study_id_of(study_name)
        with self._lock:
            cached = self._cache.get(study_name)
        n = len(cached.rows) if cached is not None else 0
        more = self._trial_id_at(sid, n) is not None
        job_id = self._jobs.get(study_name)
        if job_id is not None and self.job_runs:
            return (n, more, self._runs(job_id))
        if cached is not None and not more and not _unfinished(cached.rows):
            return (n, False, ())
        unfinished = read_trials(self.storage.engine, sid, states=_UNFINISHED)
        return (
            n,
            more,
            tuple(sorted((t.trial_id, str(STATE_NAMES[t.state])) for t in unfinished)),
        )

    def _runs(self, job_id: str) -> tuple[str, ...]:
        """The job's run rows: how many, the last made, the last finish (one indexed read).

        On the Optuna storage's engine, not the requests' sessions: a request asks for
        results while its own transaction holds a connection of the requests' pool, and
        readers queued behind this study's refresh (`get`) would hold the very connections
        the refresh needs."""
        with Session(self.storage.engine) as s:
            row = s.execute(
                select(
                    func.count(TrialRun.id), func.max(TrialRun.id), func.max(TrialRun.finished_at)
                ).where(TrialRun.job_id == job_id)
            ).one()
        return tuple(str(v) for v in row)

    def _trial_id_at(self, study_id: int, number: int) -> int | None:
        try:
            return self.storage.get_trial_id_from_study_id_trial_number(study_id, number)
        except KeyError:
            return None

    def get(
        self,
        study_name: str,
        objectives: list[str],
        budget: float | None = None,
        job_id: str | None = None,
    ) -> JobResults:
        """The table of `job_id`'s study (or of any study). Finished trials never change in
        Optuna, so a refresh fetches only the trials added since the last one and those that
        were still unfinished."""
        if job_id is not None:
            self._jobs[study_name] = job_id
        with self._lock:
            study_lock = self._study_locks.setdefault(study_name, threading.Lock())
        # one reader of a study at a time: pollers that arrive while its fingerprint is
        # read or its table refreshed wait for that answer instead of reading it again
        with study_lock:
            return self._current(study_name, objectives, budget)

    def _current(self, study_name: str, objectives: list[str], budget: float | None) -> JobResults:
        fp = self._fingerprint(study_name)
        with self._lock:
            cached = self._cache.get(study_name)
            if cached is not None:
                self._cache.move_to_end(study_name)
        if cached is not None and cached.fingerprint == fp:
            self._evict(study_name)  # its memo may have grown since
            return cached
        read_at = time.monotonic()
        with _no_cycle_collection():
            rows = self._refresh(study_name, cached, objectives, budget)
        # current as of the fingerprint read before it: a change since shows at the next one
        runs = fp[2] if study_name in self._jobs and self.job_runs else None
        table = (len(rows), False, runs if runs is not None else _unfinished(rows))
        results = JobResults(study_name, objectives, rows, table)
        size = table_bytes(rows)
        with self._lock:
            self._cache[study_name] = results
            self._cache.move_to_end(study_name)
            self._sizes[study_name] = size
        self._checked[study_name] = (read_at, results.fingerprint)  # current as of its read
        self._evict(study_name)
        return results

    def held_bytes(self) -> int:
        """What the cached tables and their memos hold (estimated)."""
        with self._lock:
            return sum(self._sizes.get(n, 0) + t.memo_bytes for n, t in self._cache.items())

    def _evict(self, keep: str) -> None:
        """Drop the tables read least recently (never `keep`, the one being read) while the
        tables and their memos hold more than `max_bytes`."""
        with self._lock:
            held = sum(self._sizes.get(n, 0) + t.memo_bytes for n, t in self._cache.items())
            for name in list(self._cache):
                if held <= self.max_bytes:
                    break
                if name == keep:
                    continue
                table = self._cache.pop(name)
                held -= self._sizes.pop(name, 0) + table.memo_bytes
                self._checked.pop(name, None)

    def _refresh(
        self,
        study_name: str,
        cached: JobResults | None,
        objectives: list[str],
        budget: float | None,
    ) -> list[TrialRow]:
        """The rows now: those of `cached` that were finished, and in one bulk read
        (`read_trials`) the study's unfinished ones, those finished since and the new ones
        (numbered from the table's count on)."""
        sid = self._study_id_of(study_name)
        if cached is None:
            return self._load_all(sid, objectives, budget)
        by_id = {r.trial_id: r for r in cached.rows}
        fresh = read_trials(
            self.storage.engine,
            sid,
            states=_UNFINISHED,
            trial_ids=[r.trial_id for r in cached.rows if not r.state.finished],
            from_number=len(cached.rows),
        )
        for trial in fresh:
            by_id[trial.trial_id] = _row(trial, objectives, budget)
        return sorted(by_id.values(), key=lambda r: r.number)

    def _load_all(
        self, study_id: int, objectives: list[str], budget: float | None
    ) -> list[TrialRow]:
        return [_row(t, objectives, budget) for t in read_trials(self.storage.engine, study_id)]


def job_results(cache: ResultsCache, job: Job) -> JobResults:
    stored = stored_spec(job)
    return cache.get(job.study_name, stored.objectives, stored.single_budget, job_id=job.id)
