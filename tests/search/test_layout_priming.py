"""`prime_layouts`: a `cost.layout: auto` job's whole space priced at its best layouts in one
vectorised pass when the runner loads the job. Every candidate's `price_candidate` answer
is then the one-candidate search's to the bit (layout, metrics, calibrated time, reasons),
and no one-candidate search runs: not in the runner's own asks either."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from cost_model import LAYOUT_METRICS, METRICS, search_layout
from nas_service.jobs import submit
from nas_service.results.landscape import load_landscape
from nas_service.runner.loop import Runner
from nas_service.runner.simulated import SimulatedBackend
from nas_service.search import pricing as search
from nas_service.search.pricing import Priced, price_candidate, prime_layouts
from nas_service.spec import CALIBRATED, CandidateSpace, JobSpec, enumerate_candidates, parse_spec
from nas_service.store.records import TrialAttr
from tests.support.jobs import setup

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
    spec = parse_spec(data)
    archs = {c.arch for c in enumerate_candidates(spec) if c.arch is not None}
    layouts = prime_layouts(spec, 1000, searches_per_group=0)
    assert set(layouts) == archs and len(archs) > 40
    kinds = set()
    for params in _study_params(spec):
        primed, one = price_candidate(spec, params, layouts=layouts), price_candidate(spec, params)
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
    calls = _count_searches(monkeypatch)
    spec = parse_spec(JOB)
    layouts = prime_layouts(spec, 1000, searches_per_group=0)
    assert layouts
    priced = [price_candidate(spec, params, layouts=layouts) for params in _study_params(spec)]
    assert calls == []
    assert {p.outcome for p in priced} == {"train", "infeasible", "over_constraint"}
    # the same job unprimed searches each of its architectures once (the wrapper counts)
    for params in _study_params(spec):
        price_candidate(spec, params)
    assert len(calls) == len(layouts)
    # a candidate outside the primed space (an enqueued trial) is searched on its own
    outside = {"residual": "baseline", "n_layers": 8, "d_model": 64}
    assert price_candidate(spec, outside, layouts=layouts).outcome == "train"
    assert len(calls) == len(layouts) + 1
    assert calls[-1].n_layers == 8


def _count_searches(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """The real one-candidate search, wrapped to record each architecture it is asked for."""
    calls: list[Any] = []

    def counted(*args: Any, **kwargs: Any) -> Any:
        calls.append(args[0])
        return search_layout(*args, **kwargs)

    monkeypatch.setattr(search, "search_layout", counted)
    search._best_layout_metrics.cache_clear()
    return calls


def test_what_is_not_primed() -> None:
    fixed = JOB | {"cost": {"hardware": "h100"}, "objectives": ["val_loss"], "constraints": []}
    assert prime_layouts(parse_spec(fixed), 1000, searches_per_group=0) == {}
    # a space over the operator's enumeration limit keeps the one-candidate path
    assert prime_layouts(parse_spec(JOB), 71, searches_per_group=0) == {}
    # a job that prices fewer architectures than a grid search costs: the default rule
    assert prime_layouts(parse_spec(JOB | {"n_trials": 20}), 1000) == {}
    assert prime_layouts(parse_spec(JOB), 1000) == {}  # 1000 trials, 72 architectures
    assert prime_layouts(parse_spec(JOB | {"n_trials": 20}), 1000, searches_per_group=0)


def test_the_runner_primes_an_auto_job_and_asks_no_one_candidate_search(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(search, "PRIME_SEARCHES_PER_GROUP", 0)
    settings, Session = setup(f"sqlite:///{tmp_path / 'depthscope.db'}")
    job = submit(Session, settings, JOB | {"n_trials": 6, "sampler": "random"})
    plain = {"name": "fixed", "cost": {}, "constraints": [], "objectives": ["val_loss"]}
    fixed = submit(Session, settings, JOB | plain | {"n_trials": 4})
    landscape = load_landscape(ROOT / "bench" / "landscapes" / "crossover.json")
    runner = Runner(settings, backend=SimulatedBackend(landscape))
    active = runner.active(job)
    archs = {c.arch for c in enumerate_candidates(active.spec) if c.arch is not None}
    assert set(active.layouts) == archs
    assert runner.active(fixed).layouts == {}
    # the runner's own asks read the job's answers: no one-candidate search at all
    calls = _count_searches(monkeypatch)
    for _ in range(6):
        runner.ask(job.id, active)
    runner.outcomes.record_asked()  # as at the end of the loop's pass
    assert calls == []
    costs = [t.user_attrs.get(TrialAttr.COSTS) for t in active.study.get_trials()]
    assert len(costs) == 6 and any(c and "best_step_time_s" in c for c in costs)
