"""`prime_layouts`: a `cost.layout: auto` job's whole space priced at its best layouts in one
vectorised pass when the runner loads the job. Every candidate's `price_candidate` answer
is then the one-candidate search's to the bit (layout, metrics, calibrated time, reasons),
no one-candidate search runs, and the answers go with the job's spec."""

from __future__ import annotations

import gc
from pathlib import Path
from typing import Any

import pytest

from cost_model import LAYOUT_METRICS, METRICS, search_layout
from nas_service import search
from nas_service.jobs import submit
from nas_service.landscape import load_landscape
from nas_service.runner import Runner
from nas_service.search import (
    Priced,
    price_candidate,
    prime_layouts,
    primed_architectures,
)
from nas_service.simulated import SimulatedBackend
from nas_service.spec import CALIBRATED, CandidateSpace, JobSpec, enumerate_candidates, parse_spec
from tests.service.jobkit import setup

ROOT = Path(__file__).resolve().parents[2]

#: 72 candidates of five variants (Block AttnRes at two block sizes) on 8 devices and a
#: global batch of 4: a depth of 1 or 3 with 3 heads divides no layout, the cap leaves out
#: the largest, the constraint some more; the rest train.
JOB: dict[str, Any] = {
    "name": "primed",
    "space": {
        "n_layers": [1, 2, 3, 4],
        "d_model": [64, 96, 128],
        "head_dim": 32,
        "variants": ["baseline", "full_attnres", "block_attnres", "mhc_lite", "denseformer"],
        "block_sizes": [1, 2],
    },
    "budget": {"tokens": 1_000_000},
    "n_trials": 1000,
    "training": {"seq_len": 64, "batch_size": 4},
    "objectives": ["val_loss", "best_step_time_s"],
    "constraints": [{"metric": "best_layout_tensor", "max": 2}],
    "cost": {
        "layout": "auto",
        "devices": 8,
        "global_batch": 4,
        "hardware": "h100",
        "memory_cap_bytes": 2.5e6,
    },
}
CALIBRATION = {"compute_factor": 1.3, "memory_factor": 1.1, "overhead_s": 0.01}


def _study_params(spec: JobSpec) -> list[dict[str, Any]]:
    return [CandidateSpace.to_study(c.params) for c in enumerate_candidates(spec)]


def _same(a: Priced, b: Priced) -> None:
    assert (a.outcome, a.reason, a.arch_dict) == (b.outcome, b.reason, b.arch_dict)
    assert list(a.metrics.items()) == list(b.metrics.items())  # exact, and in the same order
    assert a.train_spec == b.train_spec


@pytest.mark.parametrize("calibrated", [False, True], ids=["roofline", "calibrated"])
def test_primed_answers_are_the_one_candidate_answers(calibrated: bool) -> None:
    data = JOB | {"cost": JOB["cost"] | {"calibration": CALIBRATION}} if calibrated else JOB
    spec, reference = parse_spec(data), parse_spec(data)
    archs = {c.arch for c in enumerate_candidates(spec) if c.arch is not None}
    assert prime_layouts(spec, 1000, searches_per_group=0) == len(archs) > 40
    assert primed_architectures(spec) == len(archs)
    assert primed_architectures(reference) == 0  # an equal spec is another job: not primed
    kinds = set()
    for params in _study_params(spec):
        primed, one = price_candidate(spec, params), price_candidate(reference, params)
        _same(primed, one)
        kinds.add(_kind(primed))
        if primed.outcome == "train":
            assert set(primed.metrics) == set(METRICS) | set(LAYOUT_METRICS) | (
                {CALIBRATED} if calibrated else set()
            )
    # every kind of answer is compared: trained, over the constraint, no layout divides, none fits
    assert kinds == {"train", "over_constraint", "divides none", "fits none"}


def _kind(priced: Priced) -> str:
    if priced.outcome != "infeasible":
        return priced.outcome
    assert priced.reason.startswith("no parallel layout: "), priced.reason
    return "divides none" if "divides the architecture" in priced.reason else "fits none"


def test_a_primed_job_never_searches_one_candidate(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[Any] = []

    def counted(*args: Any, **kwargs: Any) -> Any:
        calls.append(args[0])
        return search_layout(*args, **kwargs)

    monkeypatch.setattr(search, "search_layout", counted)
    search._best_layout_metrics.cache_clear()
    spec = parse_spec(JOB)
    assert prime_layouts(spec, 1000, searches_per_group=0) > 0
    priced = [price_candidate(spec, params) for params in _study_params(spec)]
    assert calls == []
    assert {p.outcome for p in priced} == {"train", "infeasible", "over_constraint"}
    # the same job unprimed searches each of its architectures once (the wrapper counts)
    unprimed = parse_spec(JOB)
    for params in _study_params(unprimed):
        price_candidate(unprimed, params)
    assert len(calls) == primed_architectures(spec)
    # a candidate outside the primed space (an enqueued trial) is searched on its own
    outside = {"residual": "baseline", "n_layers": 8, "d_model": 64}
    assert price_candidate(spec, outside).outcome == "train"
    assert len(calls) == primed_architectures(spec) + 1
    assert calls[-1].n_layers == 8


def test_what_is_not_primed() -> None:
    fixed = JOB | {"cost": {"hardware": "h100"}, "objectives": ["val_loss"], "constraints": []}
    assert prime_layouts(parse_spec(fixed), 1000, searches_per_group=0) == 0
    # a space over the operator's enumeration limit keeps the one-candidate path
    assert prime_layouts(parse_spec(JOB), 71, searches_per_group=0) == 0
    # a job that prices fewer architectures than a grid search costs: the default rule
    few = parse_spec(JOB | {"n_trials": 20})
    assert prime_layouts(few, 1000) == 0 == primed_architectures(few)
    assert prime_layouts(parse_spec(JOB), 1000) == 0  # 1000 trials, 72 architectures
    searched = parse_spec(JOB | {"n_trials": 20})
    assert prime_layouts(searched, 1000, searches_per_group=0) == primed_architectures(searched)
    assert primed_architectures(searched) > 0


def test_the_answers_go_with_the_spec_and_are_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    spec = parse_spec(JOB)
    prime_layouts(spec, 1000, searches_per_group=0)
    key = id(spec)
    assert key in search._PRIMED
    del spec
    gc.collect()
    assert key not in search._PRIMED
    monkeypatch.setattr(search, "PRIMED_JOBS", 2)
    small = JOB | {"space": JOB["space"] | {"variants": ["baseline"], "block_sizes": None}}
    specs = [parse_spec(small) for _ in range(3)]
    for s in specs:
        prime_layouts(s, 1000, searches_per_group=0)
    assert len(search._PRIMED) <= 2
    assert primed_architectures(specs[0]) == 0 < primed_architectures(specs[2])
    # an evicted job prices as before, by the one-candidate path
    params = _study_params(specs[0])[5]
    _same(price_candidate(specs[0], params), price_candidate(specs[2], params))


def test_the_runner_primes_an_auto_job_when_it_loads_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(search, "PRIME_SEARCHES_PER_GROUP", 0)
    settings, Session = setup(f"sqlite:///{tmp_path / 'depthscope.db'}")
    job = submit(Session, settings, JOB | {"n_trials": 4})
    plain = {"name": "fixed", "cost": {}, "constraints": [], "objectives": ["val_loss"]}
    fixed = submit(Session, settings, JOB | plain | {"n_trials": 4})
    landscape = load_landscape(ROOT / "bench" / "landscapes" / "crossover.json")
    runner = Runner(settings, backend=SimulatedBackend(landscape))
    active = runner._job(job)
    archs = {c.arch for c in enumerate_candidates(active.spec) if c.arch is not None}
    assert primed_architectures(active.spec) == len(archs)
    assert primed_architectures(runner._job(fixed).spec) == 0
    params = _study_params(active.spec)[0]
    _same(price_candidate(active.spec, params), price_candidate(parse_spec(JOB), params))
    # a finished job's spec is dropped by the runner, and its answers with it
    key = id(active.spec)
    assert key in search._PRIMED
    runner.jobs.pop(job.id)
    del active
    gc.collect()
    assert key not in search._PRIMED
