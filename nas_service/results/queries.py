"""What the API reads, as its response schemas: a job's summary (progress, compute spent,
ETA), pages of jobs and trials, the Pareto front, the d_model/L optimum, scaling fits, and
the plots' images.

The service layer of the read routes: every function takes the request's `Session` (it
never commits; the request's boundary does) and the `ResultsCache`, and raises domain
errors (`JobNotFound`, `NothingYet`) that the API renders."""

from __future__ import annotations

import datetime as dt
import functools
import logging
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import TypeAdapter
from sqlalchemy.orm import Session

from cost_model import Variant
from cost_model.calibration import MIN_TRIALS
from nas_service.results import comparison
from nas_service.results.answers import optimum_by_variant, pareto_rows, scaling_by_variant
from nas_service.results.cache import JobResults, ResultsCache
from nas_service.results.cache import job_results as job_results
from nas_service.results.calibration import (
    SCOPES,
    Point,
    _cluster_jobs,
    _group,
    trial_points,
)
from nas_service.results.reads import (
    CalibrationRead,
    CalibrationSkipRead,
    CompareRead,
    Compute,
    JobList,
    JobRead,
    LandscapeJobRead,
    LandscapeRead,
    OptimumFitRead,
    OptimumRead,
    ParetoRead,
    Progress,
    RungProgress,
    ScalingRead,
    SensitivityRead,
    TrialRead,
)
from nas_service.results.rows import TrialRow, encode
from nas_service.search.scheduler import scheduler_for
from nas_service.search.study import runs_of
from nas_service.spec import CandidateSpace, JobSpec, decode_residual
from nas_service.store import Job, JobStatus, TrialOutcome, TrialStatus
from nas_service.store.jobs import get_job, list_jobs
from nas_service.store.jobs import stored_spec as stored_spec

log = logging.getLogger(__name__)


class NothingYet(LookupError):
    """A query that needs trials the job does not have yet (the API's 409)."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field, self.message = field, message


def job_row(session: Session, cache: ResultsCache, job_id: str) -> Job:
    """The job's row, read at most every `results_fresh_s` (a cancel forgets it). The row
    kept is detached from the request's session, so that session's end (a rollback expires
    what it holds) leaves it as it was read."""

    def read() -> Job:
        job = get_job(session, job_id)
        session.expunge(job)
        return job

    return cache.recent(("job", job_id), read)


@dataclass(frozen=True)
class RunPlan:
    """A job's training runs (settings × seeds of each trial): in all and finished so far;
    `per_trial`, the mean runs of a trial still to come (over the job's variants)."""

    total: int
    done: int
    per_trial: float


def _run_plan(
    spec: JobSpec | None, rows: list[TrialRow], counted: list[TrialRow], n: int
) -> RunPlan:
    """Each trial asked for counts the runs of its own variant (a counted trial all of them,
    a running one those finished); each trial still to come the mean over the variants. A
    spec this version no longer reads (None) plans one run per trial."""
    mean, planned = 1.0, {}
    if spec is not None:
        labels = [decode_residual(str(v))["variant"] for v in residual_choices(spec)]
        mean = sum(runs_of(spec, v) for v in labels) / len(labels)
        planned = {r.trial_id: runs_of(spec, r.variant) if r.variant else round(mean) for r in rows}
    running = [r for r in rows if r.state == TrialStatus.RUNNING]
    asked = [*counted, *running]
    done = sum(planned.get(r.trial_id, round(mean)) for r in counted)
    done += sum(min(len(r.train), planned.get(r.trial_id, len(r.train))) for r in running)
    total = sum(planned.get(r.trial_id, round(mean)) for r in asked)
    total += round(max(0, n - len(asked)) * mean)
    return RunPlan(total=total, done=done, per_trial=mean)


@dataclass(frozen=True)
class Tally:
    """What a job's summary counts of its trials: by outcome, its training runs, the
    compute spent, its finished runs' times — once per state of its study
    (`JobResults.memoised`), so pollers of a job of 10,000 trials cost no pass over them."""

    progress: Progress
    per_trial: float
    spent: float
    run_times: tuple[float, ...]


def _tally(job: Job, stored: JobSpec | None, kind: str, results: JobResults) -> Tally:
    rows = [r for r in results.rows if not r.lost]
    counted = results.counted()
    outcome = [r.outcome for r in counted]
    plan = _run_plan(stored, rows, counted, job.n_trials)
    key: Literal["flops_spent", "tokens_seen"] = "flops_spent" if kind == "flops" else "tokens_seen"
    return Tally(
        progress=Progress(
            counted=len(counted),
            completed=sum(1 for r in counted if r.state == TrialStatus.COMPLETE),
            running=sum(1 for r in rows if r.state == TrialStatus.RUNNING),
            pruned=outcome.count(TrialOutcome.PRUNED),
            infeasible=outcome.count(TrialOutcome.INFEASIBLE)
            + outcome.count(TrialOutcome.OVER_CONSTRAINT),
            failed=outcome.count(TrialOutcome.FAILED) + outcome.count(TrialOutcome.CANCELLED),
            diverged=outcome.count(TrialOutcome.DIVERGED),
            runs_done=plan.done,
            runs_total=plan.total,
            rungs=[RungProgress(**r) for r in scheduler_for(stored).progress(rows)]
            if stored is not None
            else [],
        ),
        per_trial=plan.per_trial,
        spent=sum(t.get(key, 0.0) or 0.0 for r in rows for t in r.train),
        run_times=tuple(
            r.duration_s / len(r.train)
            for r in counted
            if r.state == TrialStatus.COMPLETE and r.duration_s and r.train
        ),
    )


def summarise(job: Job, results: JobResults) -> JobRead:
    """The job as the API shows it: its row, its progress by outcome and by training run
    (settings × seeds, counted as each run finishes), the compute spent of its budget, and
    an ETA: the mean time of a finished run × the runs left ÷ the job's concurrency. The
    trials' tally is memoised per state of the study; the ETA is the row's and the clock's."""
    read = stored_spec(job)
    stored = read.spec  # None: a spec this version no longer reads (`read.reason` says why)
    kind, values = read.budget
    scheduler = scheduler_for(stored) if stored is not None else None
    tally = results.memoised(
        ("summary", job.id, job.n_trials), lambda: _tally(job, stored, kind, results)
    )
    per_trial = sum(values) / len(values) * tally.per_trial if values else 0.0
    spent = tally.spent
    total = per_trial * job.n_trials
    runs_total, runs_done = tally.progress.runs_total, tally.progress.runs_done
    run_times = tally.run_times
    eta = None
    if scheduler is not None and scheduler.pauses:  # the plan's expected compute; the ETA
        total *= scheduler.expected_compute()  # from its rate
        elapsed = _elapsed_s(job)
        if job.status.active and spent > 0 and elapsed is not None:
            eta = max(0.0, elapsed * (total - spent) / spent)
    elif job.status.active and run_times:
        concurrency = max(1, stored.max_concurrent if stored is not None else 1)
        eta = sum(run_times) / len(run_times) * (runs_total - runs_done) / concurrency
    return JobRead(
        id=job.id,
        name=job.name,
        status=job.status,
        n_trials=job.n_trials,
        study_name=job.study_name,
        objectives=read.objectives,
        created_at=job.created_at,
        started_at=job.started_at,
        finished_at=job.finished_at,
        error=job.error,
        progress=tally.progress.model_copy(deep=True),
        compute=Compute(
            kind=kind, spent=spent, budget=total, fraction=spent / total if total else 0.0
        ),
        eta_s=eta,
        spec=stored if stored is not None else read.data,
        spec_error=read.reason,
    )


def _elapsed_s(job: Job) -> float | None:
    if job.started_at is None:
        return None
    started = job.started_at
    if started.tzinfo is None:
        started = started.replace(tzinfo=dt.UTC)
    return (dt.datetime.now(dt.UTC) - started).total_seconds()


def new_job(job: Job) -> JobRead:
    """A job just submitted: its study has no trial yet (nothing is read for it, so the
    submission's transaction ends as soon as it can)."""
    return summarise(job, JobResults(job.study_name, stored_spec(job).objectives, []))


def read_job(session: Session, cache: ResultsCache, job_id: str) -> JobRead:
    job = job_row(session, cache, job_id)
    return summarise(job, job_results(cache, job))


def job_page(
    session: Session, cache: ResultsCache, status: JobStatus | None, limit: int, offset: int
) -> JobList:
    jobs, total = list_jobs(session, status, limit, offset)
    return JobList(
        items=[summarise(j, job_results(cache, j)) for j in jobs],
        total=total,
        limit=limit,
        offset=offset,
    )


def _trial(row: TrialRow, curve: bool = False) -> TrialRead:
    return row.read(curve)


def page_json(rows: list[TrialRow], total: int, limit: int, offset: int, curve: bool) -> bytes:
    """A `TrialList` as the API sends it (the bytes FastAPI's own encoding gives), from each
    row's encoded read (`TrialRow.read_json`; a page with curves is encoded afresh)."""
    items = [encode(r.read(True)) if curve else r.read_json for r in rows]
    tail = f'],"total":{total},"limit":{limit},"offset":{offset}}}'.encode()
    return b'{"items":[' + b",".join(items) + tail


@dataclass(frozen=True)
class TrialsAsk:
    """A page of a job's trials asked for: of one state and one variant (or all), with or
    without their curves."""

    state: TrialStatus | None = None
    variant: Variant | None = None
    curve: bool = False
    limit: int = 100
    offset: int = 0


def trial_page(session: Session, cache: ResultsCache, job_id: str, ask: TrialsAsk) -> bytes:
    """A page of the job's trials as the API sends it (`page_json`)."""
    results = job_results(cache, job_row(session, cache, job_id))
    state, variant, curve, limit, offset = ask.state, ask.variant, ask.curve, ask.limit, ask.offset

    def matching() -> list[TrialRow]:
        return [
            r
            for r in results.rows
            if (state is None or r.state == state) and (variant is None or r.variant == variant)
        ]

    # the rows a filter keeps, once per state of the study (a list of the table's own rows);
    # a page of them is built on each request, never kept: a client asking for ever new
    # pages would otherwise fill the memory with them
    rows = results.memoised(("trials", state, variant), matching)
    page = rows[offset : offset + limit]
    return page_json(page, len(rows), limit, offset, curve)


@dataclass(frozen=True)
class ParetoAsk:
    """A Pareto front asked for: over `metrics` (each minimised), of one variant or all, among
    each architecture's best-setting trial (`profile`) or every trial."""

    metrics: tuple[str, ...]
    variant: Variant | None = None
    profile: bool = True


def pareto(session: Session, cache: ResultsCache, job_id: str, ask: ParetoAsk) -> ParetoRead:
    """The non-dominated trials `ask` asks for, memoised per study state."""
    return _pareto(job_results(cache, job_row(session, cache, job_id)), ask)


def pareto_json(session: Session, cache: ResultsCache, job_id: str, ask: ParetoAsk) -> bytes:
    """`pareto` as the API sends it (the bytes FastAPI's own encoding of `ParetoRead` gives),
    encoded once per study state: a front's pollers read the same answer again and again."""
    results = job_results(cache, job_row(session, cache, job_id))
    key = ("pareto.json", ask.metrics, ask.variant, ask.profile)
    return results.memoised(
        key, lambda: _PARETO_JSON.dump_json(_pareto(results, ask), by_alias=True)
    )


_PARETO_JSON = TypeAdapter(ParetoRead)


def _pareto(results: JobResults, ask: ParetoAsk) -> ParetoRead:
    metrics, variant, profile = list(ask.metrics), ask.variant, ask.profile

    def answer() -> ParetoRead:
        front, candidates = pareto_rows(results, metrics, variant, profile=profile)
        front.sort(key=lambda r: [r.metrics[m] for m in metrics])
        return ParetoRead(
            metrics=metrics,
            variant=variant,
            n_candidates=len(candidates),
            front=[_trial(r) for r in front],
        )

    return results.memoised(("pareto", tuple(metrics), variant, profile), answer)


def optimum(
    session: Session, cache: ResultsCache, job_id: str, bootstrap: int, profile: bool = True
) -> OptimumRead:
    """The loss-optimal d_model/L_b per variant: on the profile (each architecture at its
    best training setting) unless `profile` is off, with the fixed-setting view beside it."""
    results = job_results(cache, job_row(session, cache, job_id))
    fits = results.memoised(
        ("optimum", bootstrap, profile),
        lambda: optimum_by_variant(results, bootstrap, profile=profile),
    )
    return OptimumRead(
        job_id=job_id,
        profile=profile,
        fits=[
            OptimumFitRead.model_validate({k: v for k, v in f.items() if not k.startswith("_")})
            for f in fits
        ],
    )


def scaling(
    session: Session,
    cache: ResultsCache,
    job_id: str,
    reference: Variant | None = None,
    loss: float | None = None,
) -> ScalingRead:
    results = job_results(cache, job_row(session, cache, job_id))
    return ScalingRead.model_validate(
        {"job_id": job_id} | scaling_by_variant(results, reference, loss)
    )


def landscape(session: Session, cache: ResultsCache, job_id: str) -> LandscapeRead:
    """The job recorded as a landscape (`nas_service.results.landscape`): its spec and every trial
    with its curve (a running job's as far as it got)."""
    from nas_service.results.landscape import landscape as record

    job = job_row(session, cache, job_id)
    read = stored_spec(job)
    if read.spec is None:  # a landscape is replayed from its spec
        raise NothingYet("job_id", f"the stored spec is no longer valid: {read.reason}")
    results = job_results(cache, job)
    meta = LandscapeJobRead(
        id=job.id,
        name=job.name,
        status=job.status,
        study_name=job.study_name,
        objectives=read.objectives,
        spec=read.spec,
    )
    return results.memoised(
        ("landscape",), lambda: record(meta, [_trial(r, curve=True) for r in results.rows])
    )


def residual_choices(spec: JobSpec) -> list[str]:
    """A spec's residual variants as the study and the comparisons name them
    (`block_attnres/S=4`)."""
    return [str(v) for v in CandidateSpace(spec).study_axes()[0].values()]


def residual_labels(job: Job) -> list[str]:
    """The job's residual variants as the comparisons name them (none for a stored spec this
    version no longer reads)."""
    spec = stored_spec(job).spec
    return [] if spec is None else residual_choices(spec)


def _comparison(results: JobResults, reference: str, level: float) -> dict[str, Any]:
    """The paired comparison against `reference` (a variant of the job: the API checks it
    against `residual_labels`), memoised per study state."""

    def answer() -> dict[str, Any]:
        try:
            return comparison.compare(
                results.counted(), reference, level, profiled=results.profile()
            )
        except ValueError as exc:
            raise NothingYet("reference", str(exc)) from None

    out: dict[str, Any] = results.memoised(("compare", reference, level), answer)
    return out


def compare(
    session: Session, cache: ResultsCache, job_id: str, reference: str, level: float = 0.95
) -> CompareRead:
    """Paired comparisons of every variant against `reference`, shape by shape and seed by
    seed, each at its best training setting; the difference against depth and the crossover."""
    job = job_row(session, cache, job_id)
    out = _comparison(job_results(cache, job), reference, level)
    return CompareRead.model_validate({"job_id": job_id} | out)


def sensitivity(session: Session, cache: ResultsCache, job_id: str) -> SensitivityRead:
    """Loss against each training axis per shape, the best lr per shape, edge flags."""
    results = job_results(cache, job_row(session, cache, job_id))
    out = results.memoised(("sensitivity",), lambda: comparison.sensitivity(results.counted()))
    return SensitivityRead.model_validate({"job_id": job_id} | out)


def calibration(
    session: Session, cache: ResultsCache, job_id: str, scope: str = "job"
) -> CalibrationRead:
    """The job's calibration (scope "job"), or its cluster's (scope "cluster": every recent
    job of the same cluster), one group per device kind."""
    if scope not in SCOPES:
        raise ValueError(f"scope must be one of {SCOPES}, got {scope!r}")
    job = job_row(session, cache, job_id)
    cluster = job.cluster
    jobs = [job] if scope == "job" else _cluster_jobs(session, cluster)
    if scope == "cluster" and all(j.id != job.id for j in jobs):
        jobs.append(job)
    points: list[Point] = []
    skipped: list[CalibrationSkipRead] = []
    for j in jobs:
        results = job_results(cache, j)
        found = results.memoised(
            ("calibration_points",),
            functools.partial(trial_points, j.id, stored_spec(j).batch_size, results.rows),
        )
        points += found[0]
        skipped += found[1]
    kinds: dict[str, list[Point]] = {}
    for p in points:
        kinds.setdefault(p.device_kind, []).append(p)
    groups = [_group(kind, kinds[kind]) for kind in sorted(kinds)]
    if not groups:
        message = f"no measured trial yet: a calibration needs {MIN_TRIALS} per device kind"
    elif any(g.ready for g in groups):
        message = "calibrated: " + ", ".join(
            f"{g.device_kind} on {g.trials} trials" for g in groups if g.ready
        )
    else:
        message = "; ".join(
            f"{g.device_kind}: {g.trials} measured trials, {g.needed} more needed" for g in groups
        )
    return CalibrationRead(
        job_id=job_id,
        cluster=cluster,
        scope=scope,
        min_trials=MIN_TRIALS,
        ready=any(g.ready for g in groups),
        message=message,
        groups=groups,
        skipped=skipped,
    )
