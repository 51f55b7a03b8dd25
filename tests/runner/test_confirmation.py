"""Held-out confirmation (`confirm` in the spec), through the real runner on a SQLite file
replaying the shipped crossover landscape (three recorded seeds per setting): each trial
chooses its setting on the tuning seed, trains that one setting on the confirmation seeds,
and is scored on those; its runs, records, progress and the comparison say so; a chosen
setting that diverges on a confirmation seed ends the trial diverged."""

from __future__ import annotations

import math
import statistics
from pathlib import Path
from typing import Any

import pytest
from optuna.trial import TrialState
from sqlalchemy import select

from nas_service.jobs import submit
from nas_service.results import comparison
from nas_service.results.cache import ResultsCache
from nas_service.results.landscape import load_landscape
from nas_service.results.queries import read_job
from nas_service.runner.loop import Runner
from nas_service.runner.simulated import SimulatedBackend
from nas_service.store import TrialRun
from nas_service.store.jobs import optuna_storage
from nas_service.store.records import TrialRead
from tests.support.jobs import counted, setup, study_of

ROOT = Path(__file__).resolve().parents[2]
LANDSCAPE_PATH = ROOT / "bench" / "landscapes" / "crossover.json"
LANDSCAPE = load_landscape(LANDSCAPE_PATH)
SPEC: dict[str, Any] = LANDSCAPE.job.spec.model_dump(mode="json")
#: tune on seed 0, confirm on seeds 1 and 2 (each recorded)
CONFIRMED = SPEC | {"name": "confirmed", "seeds": 1, "confirm": {"seeds": 2}}
RECORDED = {tuple(sorted(t.params.items())): t for t in LANDSCAPE.trials}


def _recorded_loss(params: dict[str, Any], setting: dict[str, float], seed: int) -> float | None:
    rec = RECORDED[tuple(sorted(params.items()))]
    for run in rec.train:
        if run.setting == setting and run.seed == seed:
            return run.final_val_loss
    raise AssertionError(f"no recorded run at {setting}, seed {seed}")


def _run(url: str, spec: dict[str, Any], landscape: Any = LANDSCAPE) -> tuple[Any, Any, Any]:
    settings, Session = setup(url)
    job = submit(Session, settings, spec)
    Runner(settings, backend=SimulatedBackend(landscape, 2)).run(poll_s=0, timeout_s=120)
    return settings, Session, job


def _rows(url: str, job: Any) -> list[Any]:
    cache = ResultsCache(optuna_storage(url), fresh_s=0.0, job_runs=True)
    return [r for r in cache.get(job.study_name, ["val_loss"], job_id=job.id).rows if not r.lost]


def test_a_confirmed_trial_is_scored_on_fresh_seeds(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'c.db'}"
    _, Session, job = _run(url, CONFIRMED)
    trials = counted(study_of(url, job))
    assert len(trials) == 12 and all(t.state == TrialState.COMPLETE for t in trials)
    for t in trials:
        table, train = t.user_attrs["settings"], t.user_attrs["train"]
        # chosen on seed 0 alone: the setting of lowest recorded seed-0 loss
        chosen = min(range(len(table)), key=lambda s: table[s]["mean"])
        assert t.user_attrs["setting"] == table[chosen]["setting"]
        for entry in table:
            assert entry["losses"] == [_recorded_loss(t.params, entry["setting"], 0)]
        # the plan: every setting on seed 0, then the chosen one on seeds 1 and 2
        n = len(table)
        assert [e["seed"] for e in train] == [0] * n + [1, 2]
        assert [e["setting"] for e in train[n:]] == [table[chosen]["setting"]] * 2
        fresh = [_recorded_loss(t.params, table[chosen]["setting"], k) for k in (1, 2)]
        confirm = t.user_attrs["confirm"]
        assert confirm == {
            "setting": table[chosen]["setting"],
            "seeds": [1, 2],
            "losses": pytest.approx(fresh),
            "mean": pytest.approx(statistics.fmean(fresh)),  # type: ignore[arg-type]
        }
        # the value is the confirmation seeds' mean, never the loss that chose the setting
        assert t.values == [pytest.approx(statistics.fmean(fresh))]  # type: ignore[arg-type]
        stats = t.user_attrs["val_loss_seeds"]
        assert stats["seeds"] == [1, 2] and stats["values"] == pytest.approx(fresh)
        assert t.user_attrs["curve"][-1][3] == pytest.approx(fresh[0])
    with Session() as s:
        rows = list(s.scalars(select(TrialRun).where(TrialRun.job_id == job.id)))
    # one row per run, each "run i of n" counting the confirmation runs
    first = next(t for t in trials if len(t.user_attrs["settings"]) == 9)
    reasons = sorted(
        (r.reason for r in rows if r.trial_number == first.number),
        key=lambda x: (len(x), x),
    )
    assert reasons == ["", *[f"run {i} of 11" for i in range(1, 11)]]

    # the API's trial shows the confirmation; progress counts its runs
    decoded = {r.number: r for r in _rows(url, job)}
    for t in trials:
        read = TrialRead.model_validate(decoded[t.number].as_dict())
        assert read.confirm is not None and read.confirm.seeds == [1, 2]
        assert read.seeds == pytest.approx(t.user_attrs["confirm"]["losses"])
    cache = ResultsCache(optuna_storage(url), fresh_s=0.0, job_runs=True)
    with Session() as s:
        progress = read_job(s, cache, job.id).progress
    # 4 baseline trials × (3 settings + 2) + 8 AttnRes trials × (9 settings + 2)
    assert progress.runs_total == progress.runs_done == 4 * 5 + 8 * 11


def test_compare_uses_the_confirmation_seeds_and_warns_without_them(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'c.db'}"
    _, _, job = _run(url, CONFIRMED)
    held = comparison.compare(_rows(url, job))
    assert held["scored_on"] == "confirmation" and held["warning"] is None
    assert held["pairs"] and all(p["seeds"] == [1, 2] for p in held["pairs"])
    for pair in held["pairs"]:
        assert pair["scored_on"] == "confirmation"
        assert pair["settings_chosen_from"] == [9, 3]
    # the same job without confirmation: scored on the seeds that chose the settings
    plain_url = f"sqlite:///{tmp_path / 'p.db'}"
    _, _, plain = _run(plain_url, SPEC | {"name": "plain"})
    same = comparison.compare(_rows(plain_url, plain))
    assert same["scored_on"] == "selection"
    assert same["warning"] is not None and "confirm: {seeds: N}" in same["warning"]
    assert all(p["seeds"] == [0, 1, 2] for p in same["pairs"])


def test_a_chosen_setting_that_diverges_on_confirmation_ends_the_trial(tmp_path: Path) -> None:
    """The chosen setting of one trial diverges on confirmation seed 1: the trial is
    diverged with that reason, and its seed 2 is never trained."""
    data = LANDSCAPE.model_copy(deep=True)
    victim = data.trials[0]
    seed0 = {
        str(sorted(r.setting.items())): r.final_val_loss
        for r in victim.train
        if r.seed == 0 and r.setting is not None
    }
    chosen_key = min(seed0, key=lambda k: seed0[k] or math.inf)
    for run in victim.train:
        if str(sorted((run.setting or {}).items())) == chosen_key and run.seed == 1:
            run.status, run.reason = "diverged", "training loss 1e9 is over the limit"
            run.final_val_loss = None
    url = f"sqlite:///{tmp_path / 'd.db'}"
    _, _, job = _run(url, CONFIRMED, data)
    [t] = [t for t in counted(study_of(url, job)) if t.params == victim.params]
    assert t.state == TrialState.FAIL and t.user_attrs["outcome"] == "diverged"
    assert t.user_attrs["reason"].startswith(
        "the setting chosen on the tuning seeds diverged on confirmation seed 1"
    )
    assert [e["seed"] for e in t.user_attrs["train"]][-1] == 1  # seed 2 skipped
    assert t.user_attrs["confirm"]["losses"] == [None, None]
    others = [u for u in counted(study_of(url, job)) if u.number != t.number]
    assert all(u.state == TrialState.COMPLETE for u in others)


WSD = load_landscape(ROOT / "bench" / "landscapes" / "crossover_wsd.json")


def test_multi_fidelity_confirms_at_the_last_rung_only(tmp_path: Path) -> None:
    """Rungs of a third and all of the budget, resumed from checkpoints: a trial confirms
    its chosen setting only at the last rung, each confirmation seed trained from the start
    (it has no earlier rung to resume), and is scored on those seeds; a trial stopped at the
    first rung has no confirmation."""
    spec = WSD.job.spec.model_dump(mode="json") | {
        "name": "wsd-confirmed",
        "confirm": {"seeds": 2},
        "fidelity": {"rungs": [1 / 3, 1], "reduction": 3, "reuse": "checkpoint"},
    }
    url = f"sqlite:///{tmp_path / 'f.db'}"
    settings, Session = setup(url, artifact_store=str(tmp_path / "artifacts"))
    job = submit(Session, settings, spec)
    backend = SimulatedBackend(WSD, 2)
    Runner(settings, backend=backend).run(poll_s=0, timeout_s=300)
    trials = counted(study_of(url, job))
    finished = [t for t in trials if t.state == TrialState.COMPLETE]
    stopped = [t for t in trials if t.state == TrialState.PRUNED]
    assert finished and stopped
    for t in stopped:
        assert "confirm" not in t.user_attrs
        assert all(e["seed"] == 0 for e in t.user_attrs["train"])
    for t in finished:
        train = t.user_attrs["train"]
        confirm = t.user_attrs["confirm"]
        assert confirm["seeds"] == [1, 2] and confirm["setting"] == t.user_attrs["setting"]
        last = [e for e in train if e["rung"] == 1]
        assert [e["seed"] for e in last][-2:] == [1, 2]
        assert all(e["rung"] == 0 for e in train if e not in last)
        budget = spec["budget"]["flops"]
        resumed = [e for e in last if e["seed"] == 0]
        assert all(e["flops_spent"] < 0.7 * budget for e in resumed)  # the last two thirds
        for e in last[-2:]:  # from the start: the whole budget, not the last rung's segment
            assert e["flops_spent"] == pytest.approx(budget, rel=0.01)
        assert t.values == [pytest.approx(confirm["mean"])]
