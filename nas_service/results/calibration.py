"""How far the measured training steps are from the roofline: a job's (or its cluster's)
measured trials, per device kind, fitted with `cost_model.calibration` (t ≈ a·compute_s +
b·memory_s + c, non-negative least squares of the relative error, cross-validated), and the
measured peak memory beside the analytic one.

What a trial's measured step is: the trainer's own step, `batch_size` (the job's
`training.batch_size`, the `TrainSpec`'s) × `seq_len` tokens, timed as tokens per step ÷ the
run's `tokens_per_s` (training throughput, evaluation excluded); the median over the trial's
finished runs on one device kind (runs of one architecture share the roofline's terms; the
median resists a run slowed by a neighbour). That step may differ from the job's cost
workload (`cost.micro_batch`, `microbatches`, its layout): the roofline it is compared with is
the one of the step the worker ran — `cost_model.timing.train_step_time` of the architecture
with the worker's compute dtype (float32 on the CPU, bfloat16 under CUDA autocast) on one
device (`Parallelism()`), a `Workload(micro_batch=batch_size, seq_len=seq_len)`, on the
hardware of the device kind: "cpu" → the "cpu" preset (its peaks measured on the machine the
service runs on, `cost_model.machine`: for a remote cluster of other CPUs the fitted factors
absorb the difference), a CUDA device name → the preset it names (A100, H100, H200); another
device kind is listed as skipped.

A device kind is calibrated once it has `cost_model.calibration.MIN_TRIALS` measured trials;
below that, its group is returned with `ready: false` and how many more are needed (a 200,
not an error: the job is fine, it has not trained enough yet). The cluster scope gathers the
trials of the `CLUSTER_JOBS` most recent jobs of the job's cluster (the spec's `cluster`).

`calibrated_step_time_s` is the fitted model applied to a candidate's roofline terms (for the
same step, device kind and hardware as the fit).

The answer of `GET /v1/jobs/{id}/calibration` (and its plot) is `queries.calibration`, built
from this module's points and groups; this module stays below `jobs` (whose submission takes
a cluster's fit, `cluster_fit`) and `queries`."""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import optuna
from sqlalchemy import select
from sqlalchemy.orm import Session

from cost_model import ArchConfig, CostInputError, Parallelism, Workload, get_hardware
from cost_model.calibration import (
    MIN_TRIALS,
    StepModel,
    cross_validate,
    fit_step_model,
)
from cost_model.hardware import Hardware, RooflineTime
from cost_model.memory import training_memory
from cost_model.timing import train_step_time
from nas_service.results.cache import ResultsCache, job_results
from nas_service.results.reads import (
    CalibrationGroupRead,
    CalibrationPointRead,
    CalibrationRead,
    CalibrationSkipRead,
    CrossValidationRead,
    MemoryComparisonRead,
    StepModelRead,
)
from nas_service.results.rows import TrialRow
from nas_service.store import Job
from nas_service.store.jobs import stored_spec
from nas_service.store.optuna_study import rdb_storage
from nas_service.store.records import TrainRun

#: Jobs of a cluster read for the cluster scope, the most recent first.
CLUSTER_JOBS = 200
#: Run statuses whose throughput counts (a diverged run may stop at its first step).
MEASURED_STATUSES = ("completed", "stopped")
#: CUDA device names (as `torch.cuda.get_device_name` gives them) → hardware presets.
CUDA_PRESETS = {"A100": "a100", "H100": "h100", "H200": "h200"}
SCOPES = ("job", "cluster")


def preset_of(device_kind: str) -> str | None:
    """The hardware preset of a device kind: "cpu", or the preset a CUDA name contains."""
    if device_kind == "cpu":
        return "cpu"
    upper = device_kind.upper()
    return next((p for name, p in CUDA_PRESETS.items() if name in upper), None)


def device_kind(run: TrainRun) -> str:
    """A run's device kind: its recorded device name, else its device ("cpu", "cuda")."""
    return str(run.get("device_name") or run.get("device") or "unknown")


def compute_dtype(device_kind: str) -> str:
    """The dtype the trainer computes in on this device kind (`workers.train._autocast`)."""
    return "float32" if device_kind == "cpu" else "bfloat16"


def trainer_workload(batch_size: int, arch: dict[str, Any]) -> Workload:
    """The step the worker ran: `batch_size` sequences (the job's `training.batch_size`,
    `StoredSpec.batch_size`) of the architecture's `seq_len`, one micro-batch."""
    return Workload(micro_batch=batch_size, seq_len=int(arch["seq_len"]), microbatches=1)


@dataclass
class Point:
    """One trial on one device kind: its measured step and the roofline of that step."""

    job_id: str
    trial: int
    variant: str
    device_kind: str
    hardware: str
    runs: int
    measured_s: float
    roofline: RooflineTime
    memory: dict[str, Any] = field(default_factory=dict)


def _run_step_s(run: TrainRun, tokens_per_step: int) -> float | None:
    rate = run.get("tokens_per_s")
    if run.get("status") not in MEASURED_STATUSES or not isinstance(rate, int | float):
        return None
    if not (rate > 0 and math.isfinite(rate)) or not run.get("steps"):
        return None
    return tokens_per_step / float(rate)


def _median_int(values: list[Any]) -> int | None:
    kept = [int(v) for v in values if isinstance(v, int | float) and v > 0]
    return int(statistics.median(kept)) if kept else None


def trial_points(
    job_id: str, batch_size: int, rows: list[TrialRow]
) -> tuple[list[Point], list[CalibrationSkipRead]]:
    """Every trial with measured runs of a job training `batch_size` sequences per step, one
    `Point` per device kind it ran on; the trials that have runs but cannot be compared, with
    why."""
    points: list[Point] = []
    skipped: list[CalibrationSkipRead] = []
    for row in rows:
        if row.lost or not row.train or not row.arch:
            continue
        by_kind: dict[str, list[TrainRun]] = {}
        for run in row.train:
            if isinstance(run, dict):
                by_kind.setdefault(device_kind(run), []).append(run)
        try:
            workload = trainer_workload(batch_size, row.arch)
            base = ArchConfig(**row.arch)
        except (CostInputError, TypeError, KeyError, ValueError) as exc:
            reason = f"its architecture or training cannot be priced: {exc}"
            skipped.append(CalibrationSkipRead(job_id=job_id, trial=row.number, reason=reason))
            continue
        tokens = workload.micro_batch * int(row.arch["seq_len"])
        for kind, runs in by_kind.items():
            steps = [s for r in runs if (s := _run_step_s(r, tokens)) is not None]
            if not steps:
                continue
            preset = preset_of(kind)
            if preset is None:
                reason = f"device {kind!r} has no hardware preset ({', '.join(CUDA_PRESETS)})"
                skipped.append(CalibrationSkipRead(job_id=job_id, trial=row.number, reason=reason))
                continue
            cfg = base.replace(dtype=compute_dtype(kind))
            hw = get_hardware(preset)
            roof = train_step_time(cfg, workload, Parallelism(), hw)
            points.append(
                Point(
                    job_id=job_id,
                    trial=row.number,
                    variant=row.variant,
                    device_kind=kind,
                    hardware=preset,
                    runs=len(steps),
                    measured_s=float(statistics.median(steps)),
                    roofline=roof,
                    memory=_memory(cfg, workload, runs),
                )
            )
    return points, skipped


def _memory(cfg: ArchConfig, workload: Workload, runs: list[TrainRun]) -> dict[str, Any]:
    """The measured peak memory (median over runs, its kind) beside the analytic training
    memory of the step the worker ran (`cost_model.training_memory`): in all, activations
    (saved tensors) and state (weights, gradients, AdamW)."""
    mem = training_memory(cfg, workload)
    kinds = [r.get("memory_kind") for r in runs if r.get("memory_kind")]
    return {
        "memory_kind": statistics.mode(kinds) if kinds else None,
        "peak_memory_bytes": _median_int([r.get("peak_memory_bytes") for r in runs]),
        "analytic_memory_bytes": float(mem.total_bytes),
        "saved_tensor_bytes": _median_int([r.get("saved_tensor_bytes") for r in runs]),
        "analytic_activation_bytes": float(mem.activation_bytes),
        "state_bytes": _median_int([r.get("state_bytes") for r in runs]),
        "analytic_state_bytes": float(mem.weights_bytes + mem.gradient_bytes + mem.optimizer_bytes),
    }


def _ratio(values: list[tuple[int | None, float]]) -> float | None:
    ratios = [m / a for m, a in values if m is not None and a > 0]
    return float(statistics.median(ratios)) if ratios else None


def _memory_comparison(points: list[Point]) -> list[MemoryComparisonRead]:
    """Per memory kind, the median of measured / analytic: in all, activations, state."""
    out = []
    for kind in sorted({str(p.memory["memory_kind"]) for p in points if p.memory["memory_kind"]}):
        mine = [p.memory for p in points if p.memory["memory_kind"] == kind]
        out.append(
            MemoryComparisonRead(
                memory_kind=kind,
                trials=len(mine),
                median_ratio=_ratio(
                    [(m["peak_memory_bytes"], m["analytic_memory_bytes"]) for m in mine]
                ),
                median_activation_ratio=_ratio(
                    [(m["saved_tensor_bytes"], m["analytic_activation_bytes"]) for m in mine]
                ),
                median_state_ratio=_ratio(
                    [(m["state_bytes"], m["analytic_state_bytes"]) for m in mine]
                ),
            )
        )
    return out


def calibrated_step_time_s(model: StepModel, roofline: RooflineTime) -> float:
    """The metric `calibrated_step_time_s`: a·compute_s + b·memory_s + c of the fitted model
    on a candidate's roofline terms (of the step, device kind and hardware it was fitted for)."""
    return float(model.step_time(roofline))


def _group(kind: str, points: list[Point]) -> CalibrationGroupRead:
    """One device kind: its fit and cross-validation once it has `MIN_TRIALS` points."""
    hw: Hardware = get_hardware(points[0].hardware)
    compute = np.array([float(p.roofline.compute_s) for p in points])
    memory = np.array([float(p.roofline.memory_s) for p in points])
    measured = np.array([p.measured_s for p in points])
    raw = np.array([float(p.roofline.total_s) for p in points])
    ready = len(points) >= MIN_TRIALS
    model = fit_step_model(compute, memory, measured) if ready else None
    cv = cross_validate(compute, memory, measured, raw) if ready else None
    reads = [
        CalibrationPointRead(
            job_id=p.job_id,
            trial=p.trial,
            variant=p.variant,
            runs=p.runs,
            measured_s=p.measured_s,
            roofline_s=float(raw[i]),
            compute_s=float(compute[i]),
            memory_s=float(memory[i]),
            calibrated_s=calibrated_step_time_s(model, p.roofline) if model else None,
            cv_predicted_s=float(cv.predicted_s[i]) if cv is not None else None,
            **p.memory,
        )
        for i, p in enumerate(points)
    ]
    dtype = compute_dtype(kind)
    return CalibrationGroupRead(
        device_kind=kind,
        hardware=points[0].hardware,
        peak_flops=hw.peak(dtype),
        memory_bandwidth=hw.memory_bandwidth,
        dtype=dtype,
        ready=ready,
        trials=len(points),
        needed=max(0, MIN_TRIALS - len(points)),
        model=StepModelRead(**model.as_dict()) if model else None,
        cross_validation=CrossValidationRead(**cv.as_dict()) if cv is not None else None,
        memory=_memory_comparison(points),
        points=reads,
    )


def _cluster_jobs(session: Session, cluster: str) -> list[Job]:
    recent = select(Job).where(Job.cluster == cluster).order_by(Job.created_at.desc())
    return list(session.scalars(recent.limit(CLUSTER_JOBS)))


def plot_calibration(answer: CalibrationRead, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 5))
    values: list[float] = []
    for i, g in enumerate(answer.groups):
        color = f"C{i}"
        measured = [p.measured_s for p in g.points]
        raw = [p.roofline_s for p in g.points]
        ax.scatter(measured, raw, s=22, marker="x", color=color, alpha=0.6)
        label = f"{g.device_kind}: roofline"
        if g.cross_validation is not None:
            label += f" (median error {g.cross_validation.roofline_median_error:.0%})"
        ax.scatter([], [], marker="x", color=color, label=label)
        values += measured + raw
        calibrated = [p.cv_predicted_s for p in g.points]
        if g.cross_validation is not None and all(c is not None for c in calibrated):
            cal = [float(c) for c in calibrated if c is not None]
            text = f"{g.device_kind}: calibrated, cross-validated (median error "
            text += (
                f"{g.cross_validation.median_error:.0%}, p90 {g.cross_validation.p90_error:.0%})"
            )
            ax.scatter(measured, cal, s=26, color=color, label=text)
            values += cal
    positive = [v for v in values if v > 0]
    if positive:
        low, high = min(positive) / 1.5, max(positive) * 1.5
        ax.plot([low, high], [low, high], color="black", lw=1, label="y = x")
        ax.set_xlim(low, high)
        ax.set_ylim(low, high)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("measured step time (s)")
    ax.set_ylabel("predicted step time (s)")
    ax.set_title(f"step time, predicted vs measured ({answer.scope}, cluster {answer.cluster})")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


@dataclass(frozen=True)
class ClusterFit:
    """A cluster's step-time fit on one hardware preset: the model (None below
    `MIN_TRIALS` measured trials), the trials it rests on and the device kinds they ran on."""

    model: StepModel | None
    trials: int
    device_kinds: tuple[str, ...]


def cluster_fit(
    session: Session, storage: optuna.storages.BaseStorage, cluster: str, hardware: str
) -> ClusterFit:
    """The fit of the measured trials of `cluster`'s recent jobs (`CLUSTER_JOBS`) whose
    device kind maps to the preset `hardware`: what a job that names `calibrated_step_time_s`
    takes when it is submitted (`jobs.submit_job`)."""
    cache = ResultsCache(rdb_storage(storage))
    points: list[Point] = []
    for job in _cluster_jobs(session, cluster):
        found, _ = trial_points(job.id, stored_spec(job).batch_size, job_results(cache, job).rows)
        points += [p for p in found if p.hardware == hardware]
    kinds = tuple(sorted({p.device_kind for p in points}))
    if len(points) < MIN_TRIALS:
        return ClusterFit(None, len(points), kinds)
    model = fit_step_model(
        [float(p.roofline.compute_s) for p in points],
        [float(p.roofline.memory_s) for p in points],
        [p.measured_s for p in points],
    )
    return ClusterFit(model, len(points), kinds)
