"""A job's results as a table: one row per Optuna trial with its parameters, architecture,
every metric (the measured loss and each cost), outcome and curve — what the trial, Pareto,
optimum and scaling queries read. Loaded once per job and refreshed only when the study
changed, so queries stay fast at 10,000 trials. The trials are read in bulk from Optuna's
tables (`read_trials`: a few statements through Optuna's own table definitions, decoded as
its storage decodes them, and never written): Optuna's storage builds an ORM object per
stored row and a `FrozenTrial` per trial, which made a service's first read of a job of
10,000 trials take 15 s.

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
import logging
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, TypeVar

import numpy as np
import optuna
from optuna.trial import FrozenTrial, TrialState
from sqlalchemy import func, select
from sqlalchemy.orm import Session

from nas_service.results import profiles
from nas_service.results.analysis import (
    OptimumFit,
    compute_multiplier,
    fit_optimum,
    fit_scaling,
    pareto_front,
)
from nas_service.results.rows import SettingKey as SettingKey
from nas_service.results.rows import TrialRow as TrialRow
from nas_service.results.rows import _finite, _loss_or_none
from nas_service.results.rows import setting_key as setting_key
from nas_service.store import Job, TrialOutcome, TrialRun, TrialStatus
from nas_service.store.jobs import stored_spec
from nas_service.store.records import SettingRecord, TrainRun, TrialAttr, TrialRecord
from nas_service.store.trial_tables import StoredTrial, read_trials

log = logging.getLogger(__name__)

T = TypeVar("T")

STATE_NAMES = {
    TrialState.COMPLETE: TrialStatus.COMPLETE,
    TrialState.PRUNED: TrialStatus.PRUNED,
    TrialState.FAIL: TrialStatus.FAILED,
    TrialState.RUNNING: TrialStatus.RUNNING,
    TrialState.WAITING: TrialStatus.WAITING,
}
_UNFINISHED = (TrialState.RUNNING, TrialState.WAITING)
#: A table's fingerprint: (its number of trials, whether trial n exists, and its job's run
#: rows as (count, last id, last finish) or else its unfinished trials as (id, state)).
Fingerprint = tuple[int, bool, tuple[Any, ...]]


def _outcome(t: StoredTrial | FrozenTrial) -> TrialOutcome | str:
    value = t.user_attrs.get(TrialAttr.OUTCOME)
    if value is None:
        return TrialOutcome.RUNNING if t.state == TrialState.RUNNING else ""
    try:
        return TrialOutcome(value)
    except ValueError:  # written by something else than this service
        return str(value)


def _row(t: StoredTrial | FrozenTrial, objectives: list[str], budget: float | None) -> TrialRow:
    rec = TrialRecord.from_attrs(t.user_attrs)
    metrics = dict(rec.costs or {})
    train = rec.train or []
    if t.state == TrialState.COMPLETE and t.values is not None:
        for name, value in zip(objectives, t.values, strict=False):
            metrics[name] = value
    elif train and (first_loss := train[0].get("final_val_loss")) is not None:
        metrics["val_loss"] = first_loss
    seeds: Any = rec.seeds or {}
    if "val_loss" not in metrics and isinstance(seeds.get("mean"), int | float):
        metrics["val_loss"] = float(seeds["mean"])  # a job whose objective is val_bpb
    if "val_bpb" not in metrics:  # the loss in bits per byte, where the corpus is text
        bpb = rec.bpb if t.state == TrialState.COMPLETE else None
        if bpb is None and "val_loss" in metrics and train and t.state != TrialState.COMPLETE:
            bpb = train[0].get("final_val_bpb")
        if isinstance(bpb, int | float) and not isinstance(bpb, bool):
            metrics["val_bpb"] = float(bpb)
    duration = None
    if t.datetime_start and t.datetime_complete:
        duration = (t.datetime_complete - t.datetime_start).total_seconds()
    setting = {str(k): float(v) for k, v in (rec.setting or {}).items()}
    settings: list[SettingRecord] = [
        {
            "setting": {str(k): float(v) for k, v in (e.get("setting") or {}).items()},
            "losses": [_loss_or_none(v) for v in e.get("losses", [])],
            "mean": _loss_or_none(e.get("mean")),
        }
        for e in rec.settings or []
    ]
    return TrialRow(
        number=t.number,
        state=STATE_NAMES[t.state],
        outcome=_outcome(t),
        reason=str(rec.reason or ""),
        params=dict(t.params),
        arch=dict(rec.arch or {}),
        metrics=metrics,
        values=list(t.values) if t.values is not None else None,
        train=train,
        curve=rec.curve or [],
        lost=bool(rec.lost),
        duration_s=duration,
        budget=float(t.params["budget"]) if "budget" in t.params else budget,
        trial_id=t.trial_id if isinstance(t, StoredTrial) else t._trial_id,
        setting=setting,
        settings=settings,
        seeds=_seeds(seeds, train, setting, settings),
        rungs=rec.rungs or [],
        waiting=rec.waiting,
        retry_of=rec.retry_of,
        suspect=rec.suspect,
        seed_stats=_seed_stats(seeds),
    )


def _seed_stats(seeds: Any) -> dict[str, float] | None:
    """The chosen setting's seed statistics (`val_loss_seeds`: mean, std, min, max), the
    finite ones; None when the trial has none."""
    stats = {k: float(v) for k, v in seeds.items() if k != "values" and _finite(v)}
    return stats or None


def _seeds(
    stats: Any,
    train: list[TrainRun],
    setting: dict[str, float],
    settings: list[SettingRecord],
) -> list[float | None]:
    """The chosen setting's final loss per seed: from its `settings` entry, else from
    `val_loss_seeds` (older trials); a trial still training: its finished runs at the
    setting of its first run (so far)."""
    chosen = setting_key(setting)
    for entry in settings:
        if setting_key(entry["setting"]) == chosen:
            return list(entry["losses"])
    values = stats.get("values")
    if values is not None:
        return [_loss_or_none(v) for v in values]
    if not train:
        return []
    first = train[0].get("setting")
    return [_loss_or_none(r.get("final_val_loss")) for r in train if r.get("setting") == first]


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
    training summary, alike across a job)."""
    if not rows:
        return 0
    step = max(1, len(rows) // SIZE_SAMPLE)
    sample = rows[::step]
    measured = sum(approx_bytes(vars(r), 1 << 62) for r in sample)
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

    def _study_id(self, study_name: str) -> int:
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
        sid = self._study_id(study_name)
        with self._lock:
            cached = self._cache.get(study_name)
        n = len(cached.rows) if cached is not None else 0
        more = self._trial_id(sid, n) is not None
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

    def _trial_id(self, study_id: int, number: int) -> int | None:
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
        sid = self._study_id(study_name)
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


# -- queries ----------------------------------------------------------------------------------


def pareto_rows(
    results: JobResults, metrics: list[str], variant: str | None = None, profile: bool = False
) -> tuple[list[TrialRow], list[TrialRow]]:
    """(front, candidates): the non-dominated rows over `metrics` (each minimised) among the
    rows that have every metric (trained trials for val_loss), optionally one variant. With
    `profile`, each trained architecture is its best-setting trial alone (`profiles.profile`);
    trials of architectures with no completed training (infeasible, pruned) stay as they are."""
    rows = results.counted()
    if profile:
        best = results.profile()
        chosen = {id(p.row) for p in best}
        profiled = {p.arch_key for p in best}
        rows = [r for r in rows if id(r) in chosen or r.arch_key not in profiled]
    rows = [
        r
        for r in rows
        if all(m in r.metrics and _finite(r.metrics[m]) for m in metrics)
        and (variant is None or r.variant == variant)
    ]
    if not rows:
        return [], []
    points = np.array([[r.metrics[m] for m in metrics] for r in rows], dtype=float)
    front = pareto_front(points)
    return [rows[i] for i in front], rows


def _ratio(row: TrialRow) -> float:
    return float(row.arch["d_model"]) / float(row.arch["n_layers"])


def _points(
    results: JobResults, rows: list[TrialRow], profile: bool
) -> list[tuple[TrialRow, float, dict[str, float]]]:
    """(trial, loss, setting) per point of a fit of `rows` (trials of whole architectures:
    all of an architecture's trials or none): one per architecture at its best setting
    (the job's profile, filtered), or every trained trial at its own."""
    if profile:
        archs = {r.arch_key for r in rows}
        return [(p.row, p.loss, p.setting) for p in results.profile() if p.arch_key in archs]
    return [
        (r, r.metrics["val_loss"], r.setting) for r in rows if _finite(r.metrics.get("val_loss"))
    ]


def optimum_by_variant(
    results: JobResults, bootstrap: int = 200, profile: bool = True
) -> list[dict[str, Any]]:
    """Per residual variant (and per budget, for jobs over several): the loss-optimal
    d_model/L_b among trained trials at matched compute (`analysis.fit_optimum`), fitted on
    the profile (one point per architecture: its best training setting's mean loss) or, with
    `profile` off, on every trained trial (`view`).

    Where the variant was trained at more than one setting, `fixed` is the same fit on
    `profiles.fixed_view` of the variant's trials at that budget (every shape at the one
    setting that is best for the variant as a whole, as if the job had fixed it), and `moved` says
    whether the optimum moves between the two: the fit's optimum lies outside the fixed
    view's interval (or, without one, the fixed optimum outside the fit's), or the verdicts
    differ; `move_message` says which way and by what factor."""
    groups: dict[tuple[str, float | None], list[TrialRow]] = {}
    for r in results.counted():
        if r.state == "complete" and r.arch and "d_model" in r.arch and r.arch.get("n_layers"):
            groups.setdefault((r.variant, r.budget), []).append(r)
    out = []
    for (variant, budget), rows in sorted(groups.items(), key=lambda kv: (kv[0][0], kv[0][1] or 0)):
        points = _points(results, rows, profile)
        if not points:
            continue
        ratios = [_ratio(r) for r, _, _ in points]
        losses = [loss for _, loss, _ in points]
        best, best_loss, best_setting = min(points, key=lambda p: (p[1], p[0].number))
        fit = fit_optimum(
            variant,
            ratios,
            losses,
            bootstrap=bootstrap,
            best_observed={
                "trial": best.number,
                "val_loss": best_loss,
                "d_model": best.arch["d_model"],
                "n_layers": best.arch["n_layers"],
                "ratio": _ratio(best),
                "setting": best_setting,
            },
        )
        edge = _one_block_edge(fit, points)
        if edge:  # no wider shape exists: say what would locate it instead
            fit.message = f"{fit.message.replace(': widen the space', '')} {edge}".strip()
        answer = fit.as_dict() | {
            "budget": budget,
            "view": "profile" if profile else "raw",
            "_fit": fit,
            "_data": (ratios, losses),
        }
        tried = profiles.records(rows)
        if len({p.setting_key for p in tried}) > 1:
            setting, fixed_rows = profiles.fixed_view(rows)
            varied = {k for k in setting if len({r.setting.get(k) for r in tried}) > 1}
            fixed = fit_optimum(
                variant, [p.ratio for p in fixed_rows], [p.loss for p in fixed_rows], bootstrap
            )
            answer["fixed"] = {
                "setting": setting,
                "optimum_ratio": fixed.optimum_ratio,
                "ci_low": fixed.ci_low,
                "ci_high": fixed.ci_high,
                "verdict": fixed.verdict,
                "n_shapes": fixed.n_shapes,
                "message": fixed.message,
            }
            shown = {k: v for k, v in setting.items() if k in varied} or setting
            answer["moved"], answer["move_message"] = _moved(fit, fixed, shown, profile)
        out.append(answer)
    return out


def _one_block_edge(fit: OptimumFit, points: list[tuple[TrialRow, float, Any]]) -> str:
    """Where the fitted minimum lies beyond the widest shape and that shape has one block
    already, widening the space at this parameter count is impossible: say so, and what
    would locate the optimum."""
    if fit.verdict != "at_edge" or fit.optimum_ratio is None or fit.explored is None:
        return ""
    widest = max(points, key=lambda p: _ratio(p[0]))[0]
    if fit.optimum_ratio <= fit.explored[1] or widest.arch.get("n_layers") != 1:
        return ""
    return (
        f"The widest shape explored already has one block (L_b = 1, d_model = "
        f"{widest.arch['d_model']}): at this parameter count no shape is wider, so the data "
        "say only that the shallowest shape is best here. Locating the optimum needs a larger "
        "parameter target (at one block, d_model/L_b grows as the square root of the "
        "parameters) or a longer budget per candidate."
    )


def _moved(
    fit: OptimumFit, fixed: OptimumFit, setting: dict[str, float], profile: bool
) -> tuple[bool, str]:
    """Whether the optimum moves between the fixed-setting view and `fit`, and a sentence."""
    shared = ", ".join(f"{k}={v:.3g}" for k, v in sorted(setting.items())) or "one setting"
    fixed_says = f"every shape at {shared}"
    fit_says = "each architecture at its best setting" if profile else "every trial"
    opt, ref = fit.optimum_ratio, fixed.optimum_ratio
    if fit.verdict != fixed.verdict:
        where = f" (from {ref:.3g} to {opt:.3g})" if opt is not None and ref is not None else ""
        return True, (
            f"the optimum's verdict moves from {fixed.verdict} ({fixed_says}) to "
            f"{fit.verdict} ({fit_says}){where}"
        )
    if opt is None or ref is None:
        return False, f"neither view locates an optimum ({fit.verdict})"
    factor = opt / ref
    way = f"{factor:.3g}× larger" if factor >= 1 else f"{1 / factor:.3g}× smaller"
    if fixed.ci_low is not None and fixed.ci_high is not None:
        outside = not fixed.ci_low <= opt <= fixed.ci_high
        against = f"the fixed view's interval [{fixed.ci_low:.3g}, {fixed.ci_high:.3g}]"
    elif fit.ci_low is not None and fit.ci_high is not None:
        outside = not fit.ci_low <= ref <= fit.ci_high
        against = f"the interval [{fit.ci_low:.3g}, {fit.ci_high:.3g}] (the fixed view has none)"
    else:
        return False, (
            f"no interval to tell: the optimum is {ref:.3g} with {fixed_says} and {opt:.3g} "
            f"with {fit_says}"
        )
    if outside:
        return True, (
            f"the optimum moves from {ref:.3g} ({fixed_says}) to {opt:.3g} ({fit_says}): "
            f"{way}, outside {against}"
        )
    return False, (
        f"the optimum does not move: {opt:.3g} ({fit_says}) against {ref:.3g} ({fixed_says}), "
        f"within {against}"
    )


def scaling_by_variant(
    results: JobResults,
    reference: str | None = None,
    loss: float | None = None,
    profile: bool = True,
) -> dict[str, Any]:
    """ℒ = A·C^−α per variant from the best loss at each budget (over the profile: each
    architecture at its best setting; the best per budget is the same over the raw trials),
    and the compute multiplier of every variant over `reference` at `loss` (how much more
    compute the reference needs)."""
    best: dict[str, dict[float, float]] = {}
    trained = [r for r in results.counted() if r.state == "complete" and r.budget]
    for r, value, _ in _points(results, trained, profile):
        if r.budget:
            per = best.setdefault(r.variant, {})
            if r.budget not in per or value < per[r.budget]:
                per[r.budget] = value
    fits = {}
    problems = {}
    for variant, pts in sorted(best.items()):
        try:
            fits[variant] = fit_scaling(variant, list(pts), list(pts.values()))
        except ValueError as exc:
            problems[variant] = str(exc)
    out: dict[str, Any] = {"fits": {v: f.as_dict() for v, f in fits.items()}, "problems": problems}
    if reference is not None and loss is not None:
        if reference not in fits:
            problems[reference] = "no scaling fit for the reference variant"
        else:
            out["reference"], out["loss"] = reference, loss
            out["multipliers"] = {
                v: compute_multiplier(f, fits[reference], loss)
                for v, f in fits.items()
                if v != reference
            }
    return out


def job_results(cache: ResultsCache, job: Job) -> JobResults:
    stored = stored_spec(job)
    return cache.get(job.study_name, stored.objectives, stored.single_budget, job_id=job.id)
