"""The simulated backend (`nas_service.runner.simulated`): the real runner on a SQLite file replays
the shipped crossover landscape (bench/landscapes/crossover.json) on a simulated clock — the
recorded losses come back exactly, the clock's makespan is the work over the workers, queued
runs start when a worker frees, cancel frees one, a lost worker is retried, the median pruner
saves compute — and runs the landscape did not record are answered from the nearest point."""

from __future__ import annotations

import itertools
import math
import subprocess
import sys
from pathlib import Path
from typing import Any

import optuna
import pytest
from optuna.trial import TrialState
from sqlalchemy import select

from nas_service.jobs import submit
from nas_service.results.landscape import load_landscape
from nas_service.runner.loop import Runner
from nas_service.runner.simulated import SimulatedBackend, SimulatedLookupError, SimulatedWorkerLost
from nas_service.search.pricing import price_candidate
from nas_service.store import TrialRun
from tests.support.jobs import counted, setup, study_of
from workers.contract import EvalPoint, TrainResult, TrainSpec

ROOT = Path(__file__).resolve().parents[2]
LANDSCAPE = load_landscape(ROOT / "bench" / "landscapes" / "crossover.json")
SPEC: dict[str, Any] = LANDSCAPE.job.spec.model_dump(mode="json")
RECORDED = {tuple(sorted(t.params.items())): t for t in LANDSCAPE.trials}


def run_job(url: str, spec: dict[str, Any], backend: SimulatedBackend) -> list[Any]:
    settings, Session = setup(url)
    job = submit(Session, settings, spec)
    Runner(settings, backend=backend).run(poll_s=0, timeout_s=120)
    trials = counted(study_of(url, job))
    assert len(trials) == spec["n_trials"]
    return trials


def train_spec(params: dict[str, Any], **changes: Any) -> TrainSpec:
    priced = price_candidate(LANDSCAPE.job.spec, params)
    assert priced.train_spec is not None
    return priced.train_spec.replace(**changes)


def drain(backend: SimulatedBackend, handle: Any) -> list[Any]:
    """Every item of one run, waiting on it alone."""
    items: list[Any] = []
    while not items or isinstance(items[-1], EvalPoint):
        assert backend.wait([handle], 0) == [handle]
        items.append(backend.next_item(handle))
    return items


def test_the_grid_replays_the_landscape_exactly(tmp_path: Path) -> None:
    trials = run_job(f"sqlite:///{tmp_path / 'g.db'}", SPEC, SimulatedBackend(LANDSCAPE, 2))
    for t in trials:
        rec = RECORDED[tuple(sorted(t.params.items()))]
        assert t.state == TrialState.COMPLETE
        assert t.values == rec.values  # the mean of the chosen setting's three seeds
        assert t.user_attrs["setting"] == rec.setting
        assert [s["losses"] for s in t.user_attrs["settings"]] == [s.losses for s in rec.settings]
    # one seed: the best setting by its seed-0 loss
    one = run_job(
        f"sqlite:///{tmp_path / 'one.db'}", SPEC | {"seeds": 1}, SimulatedBackend(LANDSCAPE, 2)
    )
    for t in one:
        rec = RECORDED[tuple(sorted(t.params.items()))]
        assert t.values == [min(float(s.losses[0] or math.inf) for s in rec.settings)]


def test_makespan_is_the_work_over_the_workers(tmp_path: Path) -> None:
    spec = SPEC | {"tune": None, "seeds": 1, "max_concurrent": 4}
    backend = SimulatedBackend(LANDSCAPE, workers=4, duration_s=60.0, overhead_scale=0.0)
    trials = run_job(f"sqlite:///{tmp_path / 'm.db'}", spec, backend)
    assert len(trials) == 12 and backend.runs_launched == 12
    assert backend.makespan_s == pytest.approx(12 * 60 / 4)
    assert backend.busy_s == pytest.approx(12 * 60)
    assert backend.utilisation == pytest.approx(1.0)
    done = [e for e in backend.events if e.kind == "completed"]
    assert len(done) == 12 and all(e.full for e in done)
    flops = sum(t.user_attrs["train"][0]["flops_spent"] for t in trials)
    assert backend.compute_spent == pytest.approx(flops)
    assert done[-1].compute == pytest.approx(flops)
    # the recorded durations: each run as long as its recorded run
    real = SimulatedBackend(LANDSCAPE, workers=2, overhead_scale=0.0)
    run_job(f"sqlite:///{tmp_path / 'r.db'}", spec | {"max_concurrent": 2}, real)
    total = real.busy_s
    assert (
        total / 2
        <= real.makespan_s
        <= total / 2 + max(r.wall_time_s or 0 for t in LANDSCAPE.trials for r in t.train)
    )


def test_queued_runs_start_when_a_worker_frees_and_cancel_frees_one() -> None:
    backend = SimulatedBackend(LANDSCAPE, workers=1, duration_s=100.0, overhead_scale=0.0)
    backend.connect()
    spec = train_spec({"residual": "baseline", "n_layers": 4})
    a, b, c = (backend.launch(spec) for _ in range(3))
    assert next(i for i in drain(backend, a) if isinstance(i, TrainResult)).wall_time_s == 100
    assert backend.now == pytest.approx(100)  # the clock jumped to a's end
    first = backend.wait([b], 0)
    assert first == [b] and backend.now == pytest.approx(125)  # b started at 100: a quarter
    backend.cancel(b)  # at 125: c starts on the freed worker
    items = drain(backend, c)
    assert backend.now == pytest.approx(225)
    assert isinstance(items[-1], TrainResult)
    kinds = [(e.kind, e.time) for e in backend.events]
    assert kinds == [("completed", 100), ("cancelled", 125), ("completed", 225)]
    assert backend.busy_s == pytest.approx(225) and backend.makespan_s == pytest.approx(225)
    full = items[-1].flops_spent
    assert backend.compute_spent == pytest.approx(2.25 * full)  # b trained a quarter
    # cancelling a queued run frees nothing and trains nothing
    d, e = backend.launch(spec), backend.launch(spec)
    backend.cancel(e)
    drain(backend, d)
    assert backend.now == pytest.approx(325) and backend.runs_launched == 5


def test_a_lost_worker_is_retried(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'lost.db'}"
    training = SPEC["training"] | {"lr": 0.004}  # a recorded setting of every trial
    spec = SPEC | {"tune": None, "seeds": 1, "n_trials": 6, "training": training}
    backend = SimulatedBackend(LANDSCAPE, workers=2, lose_every=3, overhead_scale=0.0)
    trials = run_job(url, spec, backend)
    assert all(t.state == TrialState.COMPLETE for t in trials)
    for t in trials:
        rec = RECORDED[tuple(sorted(t.params.items()))]
        seed0 = next(s for s in rec.settings if s.setting == t.user_attrs["setting"])
        assert t.values == [seed0.losses[0]]
    _, Session = setup(url)
    with Session() as s:
        runs = list(s.scalars(select(TrialRun)))
    lost = [r for r in runs if r.state == "lost"]
    assert lost and all(r.attempt == 1 for r in lost)
    assert {r.trial_number for r in runs if r.attempt == 2} == {r.trial_number for r in lost}
    assert sum(e.kind == "lost" for e in backend.events) == len(lost)
    assert backend.retryable(SimulatedWorkerLost("x")) and not backend.retryable(ValueError())


def test_median_pruning_spends_less_than_the_grid(tmp_path: Path) -> None:
    space = SPEC | {
        "tune": None,
        "seeds": 1,
        "max_concurrent": 1,
        "training": SPEC["training"] | {"lr": [0.002, 0.004, 0.008]},
        "n_trials": 36,
    }
    full = SimulatedBackend(LANDSCAPE, workers=1)
    run_job(f"sqlite:///{tmp_path / 'none.db'}", space, full)
    pruned = SimulatedBackend(LANDSCAPE, workers=1)
    trials = run_job(f"sqlite:///{tmp_path / 'auto.db'}", space | {"pruner": "auto"}, pruned)
    stopped = [t for t in trials if t.user_attrs.get("outcome") == "pruned"]
    assert stopped and all(t.state == TrialState.PRUNED for t in stopped)
    assert sum(e.kind == "cancelled" for e in pruned.events) == len(stopped)
    assert pruned.compute_spent < 0.9 * full.compute_spent
    assert pruned.makespan_s < full.makespan_s


def test_an_unrecorded_run_takes_the_nearest_point() -> None:
    backend = SimulatedBackend(LANDSCAPE, workers=1, overhead_scale=0.0)
    backend.connect()
    rec = RECORDED[(("n_layers", 8), ("residual", "block_attnres/S=4"))]
    recorded = train_spec({"residual": "block_attnres/S=4", "n_layers": 8})
    # lr 0.005 → 0.004, depth_lr_mult 0.2 → 0.1 (on log scales), seed 7 → seed 0
    result = drain(backend, backend.launch(recorded.replace(lr=0.005, depth_lr_mult=0.2, seed=7)))
    want = next(
        s for s in rec.settings if s.setting["lr"] == 0.004 and s.setting["depth_lr_mult"] == 0.1
    )
    assert result[-1].final_val_loss == want.losses[0]
    assert backend.events[-1].identity["recorded_setting"]["depth_lr_mult"] == 0.1
    # the same at seed 2
    result = drain(backend, backend.launch(recorded.replace(lr=0.005, depth_lr_mult=0.2, seed=2)))
    assert result[-1].final_val_loss == want.losses[2]
    # a depth not recorded (6 sublayer pairs, width 48): the nearest, 8 layers at 48
    shape = recorded.replace(arch=recorded.arch.replace(n_layers=6, block_size=4))
    drain(backend, backend.launch(shape))
    assert backend.events[-1].identity["trial"] == rec.number
    # the baseline ignores depth_lr_mult (it recorded 1.0 only)
    base = train_spec({"residual": "baseline", "n_layers": 4}, lr=0.008, depth_lr_mult=10.0)
    base_rec = RECORDED[(("n_layers", 4), ("residual", "baseline"))]
    at = next(s for s in base_rec.settings if s.setting["lr"] == 0.008)
    assert drain(backend, backend.launch(base))[-1].final_val_loss == at.losses[0]
    # a variant the landscape never trained: the run fails, not retried
    mhc = recorded.replace(
        arch=recorded.arch.replace(variant="mhc_lite", block_size=None, mhc_streams=2)
    )
    item = drain(backend, backend.launch(mhc))[-1]
    assert isinstance(item, SimulatedLookupError) and not backend.retryable(item)


def test_a_shorter_budget_and_a_segment_read_the_curve_part_way() -> None:
    backend = SimulatedBackend(LANDSCAPE, workers=1, overhead_scale=0.0)
    backend.connect()
    params: dict[str, Any] = {"residual": "baseline", "n_layers": 8}
    rec = RECORDED[(("n_layers", 8), ("residual", "baseline"))]
    full = train_spec(params)
    curve = rec.curve or []
    # half the budget (a cosine rung that retrains): the curve at half the tokens
    half = full.replace(budget_flops=full.budget_flops / 2)  # type: ignore[operator]
    items = drain(backend, backend.launch(half))
    frac = half.planned_steps() / full.planned_steps()
    x = frac * curve[-1][1]  # type: ignore[operator]
    (lo, hi) = next((a, b) for a, b in itertools.pairwise(curve) if a[1] <= x <= b[1])  # type: ignore[operator]
    w = (x - lo[1]) / (hi[1] - lo[1])  # type: ignore[operator]
    assert items[-1].final_val_loss == pytest.approx(lo[3] + w * (hi[3] - lo[3]))  # type: ignore[operator]
    assert items[-1].steps == half.planned_steps()
    assert backend.events[-1].full is False
    # a segment of a WSD run: the main line's points in (start, stop], the loss at stop/T
    total = full.planned_steps()
    wsd = full.replace(
        schedule="wsd", stop_step=total // 2, checkpoint_out="a", artifact_store="/x"
    )
    seg = drain(backend, backend.launch(wsd))
    points = [p for p in seg if isinstance(p, EvalPoint)]
    assert total == 629 and [p.step for p in points] == [157, 314]
    result = seg[-1]
    branch = max(1, int(wsd.decay_frac * (total // 2)))
    assert result.tokens_seen == (total // 2 + branch) * full.tokens_per_step
    assert result.steps == total // 2 and result.branch_steps == branch
    assert result.checkpoint == "a"
    resume = wsd.replace(
        start_step=total // 2, stop_step=None, checkpoint_in="a", checkpoint_out=None
    )
    rest = drain(backend, backend.launch(resume))
    assert next(p.step for p in rest if isinstance(p, EvalPoint)) > total // 2
    chosen = next(s for s in rec.settings if s.setting == rec.setting)  # lr 0.003 → 0.004
    assert rest[-1].final_val_loss == chosen.losses[0]
    assert rest[-1].tokens_seen == (total - total // 2) * full.tokens_per_step


def test_the_simulated_backend_never_loads_torch() -> None:
    code = (
        "import sys, nas_service.runner.simulated\n"
        "print('torch' in sys.modules, 'ray' in sys.modules)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["False", "False"]


def test_optuna_sees_an_ordinary_study(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'o.db'}"
    spec = SPEC | {"tune": None, "seeds": 1, "n_trials": 3, "sampler": "random"}
    run_job(url, spec, SimulatedBackend(LANDSCAPE, workers=3))
    assert len(optuna.get_all_study_summaries(f"sqlite:///{tmp_path / 'o.db'}")) == 1


def test_a_run_with_its_own_curve_is_replayed_without_scaling() -> None:
    landscape = LANDSCAPE.model_copy(deep=True)
    trial = next(t for t in landscape.trials if t.params == {"residual": "baseline", "n_layers": 8})
    run = next(r for r in trial.train if r.seed == 1 and r.setting == trial.setting)
    own = [[157.0, 80384.0, 0.0, 2.9], [629.0, 322048.0, 0.0, run.final_val_loss]]
    run.curve = own  # type: ignore[assignment]
    backend = SimulatedBackend(landscape, workers=1, overhead_scale=0.0)
    backend.connect()
    spec = train_spec(dict(trial.params), **trial.setting, seed=1)
    items = drain(backend, backend.launch(spec))
    points = [p for p in items if isinstance(p, EvalPoint)]
    assert [p.step for p in points] == [157, 629] and points[0].val_loss == 2.9
    assert items[-1].final_val_loss == run.final_val_loss
