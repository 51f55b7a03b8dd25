"""`stop: {optimum_interval}` through the real runner on a SQLite file: on a surrogate
landscape of fifteen shapes whose true optimum is known, the job ends as soon as the optimum
is located to the asked width, says so in its completion event with the very optimum the
results then report, which holds the truth; replaying the main job's recorded regime
(`bench/landscapes/regime/p30k-25tpp.json`, five shapes of the standard residual), it runs
every trial: five points are too few to stop on, and so is a width never reached."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select

from nas_service.jobs import submit
from nas_service.results import answers
from nas_service.results.cache import ResultsCache
from nas_service.results.landscape import load_landscape
from nas_service.runner.loop import Runner
from nas_service.runner.simulated import SimulatedBackend
from nas_service.store import Job, JobEvent
from nas_service.store.jobs import optuna_storage
from tests.support.jobs import counted, setup, study_of

ROOT = Path(__file__).resolve().parents[2]
LANDSCAPE = load_landscape(ROOT / "bench" / "landscapes" / "regime" / "p30k-25tpp.json")
SPEC: dict[str, Any] = LANDSCAPE.job.spec.model_dump(mode="json")
#: the standard residual's five shapes (L_b 1–6), one at a time, in the grid's seeded order
BASELINE: dict[str, Any] = SPEC | {
    "name": "stop",
    "space": SPEC["space"] | {"variants": ["baseline"], "block_sizes": None},
    "objectives": ["val_loss"],
    "n_trials": 5,
    "max_concurrent": 1,
    "sampler_seed": 0,
}


def _run(tmp_path: Path, width: float, **change: Any) -> tuple[Any, Any, list[str]]:
    url = f"sqlite:///{tmp_path / f'stop-{width}.db'}"
    settings, Session = setup(url)
    job = submit(Session, settings, BASELINE | {"stop": {"optimum_interval": width}} | change)
    Runner(settings, backend=SimulatedBackend(LANDSCAPE, 2)).run(poll_s=0, timeout_s=120)
    with Session() as s:
        assert s.get(Job, job.id).status == "completed"
        events = [e.message for e in s.scalars(select(JobEvent).where(JobEvent.job_id == job.id))]
    return url, job, events


@pytest.fixture(scope="module")
def surrogate(tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, float]:
    """Full AttnRes's surrogate over fifteen depths (L_b 2–16, one setting), its optimum
    inside them (`bench/surrogate.py`, fitted to the recorded WSD runs), a point's noise that
    of a mean over 8 seeds; and the model's true optimum d_model/L_b."""
    from bench.optimum_search import true_ratio
    from bench.surrogate import NOISE_FROM, RECORDED, fit, generate, recorded_runs, seed_sigma

    recorded = load_landscape(RECORDED)
    model = fit(recorded_runs(recorded), seed_sigma(load_landscape(NOISE_FROM)) / 8**0.5)
    doc = generate(model, recorded, tuple(range(2, 17)), (0.004,), (0.5,), 1, 0, ("full_attnres",))
    path = tmp_path_factory.mktemp("surrogate") / "full_attnres.json"
    path.write_text(json.dumps(doc))
    return load_landscape(path), true_ratio(model, "full_attnres", 0.004)


def test_a_job_stops_once_the_optimum_is_located_to_the_asked_width(
    tmp_path: Path, surrogate: tuple[Any, float]
) -> None:
    from bench.search_efficiency import job_spec

    landscape, truth = surrogate
    url = f"sqlite:///{tmp_path / 'stop.db'}"
    settings, Session = setup(url)
    spec = job_spec(landscape, "optimum", "none", "optimum", 0)
    spec |= {"n_trials": 15, "max_concurrent": 1, "stop": {"optimum_interval": 1.0}}
    job = submit(Session, settings, spec)
    Runner(settings, backend=SimulatedBackend(landscape, 1)).run(poll_s=0, timeout_s=120)
    with Session() as s:
        assert s.get(Job, job.id).status == "completed"
        events = [e.message for e in s.scalars(select(JobEvent).where(JobEvent.job_id == job.id))]
    trials = counted(study_of(url, job))
    assert 6 <= len(trials) < 15  # ended by its answer, not by n_trials
    assert "stopped early: every variant's optimum d_model/L_b is located" in events[-1]
    # the event's optimum is the one the results report for the stored trials, and it holds
    # the landscape's true optimum
    cache = ResultsCache(optuna_storage(url), fresh_s=0.0, job_runs=True)
    (fit,) = answers.optimum_by_variant(cache.get(job.study_name, ["val_loss"], job_id=job.id))
    assert fit["verdict"] == "ok" and fit["ci_low"] <= truth <= fit["ci_high"]
    shown = f"full_attnres {fit['optimum_ratio']:.3g} [{fit['ci_low']:.3g}, {fit['ci_high']:.3g}]"
    assert shown in events[-1]


def test_five_shapes_never_stop_the_job(tmp_path: Path) -> None:
    """However wide the asked interval: a fit of five points is not enough to stop on."""
    url, job, events = _run(tmp_path, 10.0)
    assert len(counted(study_of(url, job))) == BASELINE["n_trials"]
    assert events[-1] == f"{BASELINE['n_trials']} trials"


def test_a_width_never_reached_runs_every_trial(tmp_path: Path) -> None:
    url, job, events = _run(tmp_path, 0.01)
    assert len(counted(study_of(url, job))) == BASELINE["n_trials"]
    assert events[-1] == f"{BASELINE['n_trials']} trials"


def test_the_optimum_sampler_spreads_three_shapes_then_closes_in(tmp_path: Path) -> None:
    """`sampler: optimum` on the same five shapes: the deepest and the shallowest, the middle
    in ln(d_model/L_b), then the untried shapes nearest the fitted minimum (here L_b = 2, then
    4, around the standard residual's optimum of d_model/L_b ≈ 11 at L_b = 2–3)."""
    url, job, events = _run(tmp_path, 0.01, sampler="optimum")
    trials = sorted(counted(study_of(url, job)), key=lambda t: t.number)
    assert [t.user_attrs["arch"]["n_layers"] for t in trials] == [6, 1, 3, 2, 4]
    assert events[-1] == f"{BASELINE['n_trials']} trials"
