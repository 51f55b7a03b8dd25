"""The benchmarks run and write their JSON (tiny sizes; no timing is asserted)."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]


def test_cost_model_bench_writes_json(tmp_path: Path) -> None:
    out = tmp_path / "bench.json"
    run = subprocess.run(
        [
            sys.executable,
            "bench/cost_model.py",
            "--points",
            "100",
            "--repeats",
            "1",
            "--json",
            str(out),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 0, run.stderr
    rows = json.loads(out.read_text())["rows"]
    assert [r["path"] for r in rows] == ["scalar", "vectorised", "price_many"]
    assert all(r["points"] == 100 and r["candidates_per_s"] > 0 for r in rows)
    assert "candidates/s" in run.stdout


def run_bench(*args: str, timeout: int = 300) -> subprocess.CompletedProcess[str]:
    out = subprocess.run(
        [sys.executable, *args], cwd=ROOT, capture_output=True, text=True, timeout=timeout
    )
    assert out.returncode == 0, out.stderr[-3000:]
    return out


def test_variants_and_trainer_benches_run(tmp_path: Path) -> None:
    out = tmp_path / "v.json"
    run_bench(
        "bench/variants.py",
        "--n-layers",
        "1",
        "--d-model",
        "32",
        "--n-heads",
        "2",
        "--seq-len",
        "32",
        "--batch",
        "2",
        "--rounds",
        "1",
        "--steps",
        "1",
        "--decode-tokens",
        "2",
        "--decode-prompt",
        "8",
        "--json",
        str(out),
    )
    rows = json.loads(out.read_text())["rows"]
    assert {r["variant"] for r in rows if r["kind"] == "train_step"} >= {
        "baseline",
        "block_attnres",
        "mhc_lite",
    }
    t = tmp_path / "t.json"
    run_bench("bench/trainer.py", "--steps", "3", "--rounds", "1", "--json", str(t))
    assert json.loads(t.read_text())["ratio"] > 0


@pytest.mark.postgres
def test_storage_bench_runs(tmp_path: Path) -> None:
    out = tmp_path / "s.json"
    run_bench(
        "bench/storage.py", "--jobs", "2", "--cycles", "3", "--repeats", "1", "--json", str(out)
    )
    rates = json.loads(out.read_text())["rates"]
    assert rates["sqlite"][0] > 0 and rates["postgresql"][0] > 0


@pytest.mark.ray
@pytest.mark.slow
def test_scheduling_bench_runs(tmp_path: Path) -> None:
    out = tmp_path / "sch.json"
    run_bench(
        "bench/scheduling.py",
        "--trials",
        "2",
        "--repeats",
        "1",
        "--tokens",
        "512",
        "--json",
        str(out),
    )
    assert json.loads(out.read_text())["runs"][0]["ratio"] > 0


@pytest.mark.postgres
def test_service_bench_runs(tmp_path: Path) -> None:
    out = tmp_path / "svc.json"
    run_bench("bench/service.py", "--trials", "200", "--calls", "3", "--json", str(out))
    results = json.loads(out.read_text())["results"]
    assert results["sqlite"]["latency_ms"]["pareto"]["p95"] > 0
    assert results["postgresql"]["latency_ms"]["optimum"]["p95"] > 0


@pytest.mark.ray
@pytest.mark.slow
@pytest.mark.e2e
def test_load_bench_runs(tmp_path: Path) -> None:
    out = tmp_path / "load.json"
    run = run_bench(
        "bench/load.py",
        "--seconds",
        "2",
        "--clients",
        "4",
        "--jobs",
        "1",
        "--submits",
        "4",
        "--max-jobs",
        "2",
        "--json",
        str(out),
        timeout=400,
    )
    result = json.loads(out.read_text())
    assert result["polls"]["all"]["requests"] > 0
    assert set(result["polls"]) == {"status", "trials", "pareto", "all"}
    burst = result["submissions"]
    assert burst["accepted"] == burst["expected"] and burst["server_errors"] == 0
    assert "p95 ms" in run.stdout
    assert set(result["server"]) == {"status", "trials", "pareto"}  # the service's own view
    assert result["server"]["status"]["p50_ms"] > 0


def test_search_efficiency_bench_runs(tmp_path: Path) -> None:
    out = tmp_path / "se.json"
    run = run_bench(
        "bench/search_efficiency.py",
        "--seeds",
        "1",
        "--cap",
        "0.3",
        "--strategies",
        "tpe",
        "--modes",
        "auto",
        "median",
        "--peers",
        "tpe",
        "--peer-pruners",
        "sha",
        "--syne",
        "--processes",
        "1",
        "--json",
        str(out),
    )
    result = json.loads(out.read_text())
    assert result["grid_points"] == 108 and result["reference"]["compute"] > 0
    assert result["reference"]["points"] == 84  # the standard residual ignores depth_lr_mult
    assert result["reference"]["top_points"] == {"0.01": 1, "0.05": 5}
    assert len(result["reference"]["front"]) >= 2  # a front of several points
    loss = result["summary"]["loss"]
    assert set(loss) == {"tpe/auto", "tpe/median", "optuna-tpe/sha"}
    assert all(0 <= v["best_pruned"] <= 1 for v in loss.values())
    # the raw-step median rule takes a single objective: refused with two, said so
    assert not result["summary"]["pareto"]["tpe/median"]["available"]
    # the same cap for every row: no search trains past it
    for r in result["runs"]:
        if "refused" not in r:
            assert r["runs"] > 0 and 0 < r["compute"] <= 0.3 * result["reference"]["compute"] * 1.3
    assert (
        "→top 1%" in run.stdout and "best pruned" in run.stdout and "optuna-tpe/sha" in run.stdout
    )


class _Event:
    """A simulated run's end as the benchmark reads it (`nas_service.runner.simulated.SimEvent`)."""

    def __init__(self, compute: float, trial: int, loss: float, kind: str = "completed") -> None:
        self.compute, self.kind, self.loss = compute, kind, loss
        self.full = kind == "completed"
        self.identity = {"trial": trial, "recorded_setting": {"lr": 0.1}, "stop_step": None}


def _reference() -> object:
    from bench.search_efficiency import Reference

    setting = (("lr", 0.1),)
    means = {(i, setting): 3.0 + 0.1 * i for i in range(10)}  # trial 0 best, 9 worst
    # the grid's results (loss, memory): two points on the front, trial 0 (best loss, most
    # memory) and trial 5 (less memory); the rest dominated
    results = [(3.0 + 0.1 * i, 10.0 if i == 0 else (1.0 if i == 5 else 20.0)) for i in range(10)]
    return Reference(100.0, results, means, list(means), (0.1, 0.3))


def test_search_target_is_a_quantile_of_true_mean_loss() -> None:
    from bench.search_efficiency import measure

    ref = _reference()
    memory = {i: (10.0 if i == 0 else (1.0 if i == 5 else 20.0)) for i in range(10)}
    # trial 2 is in the top 30% (3 points) but not the top 10% (1 point): a lucky observed
    # loss at it does not count as the best point
    events = [_Event(20.0, 2, 2.0), _Event(50.0, 0, 3.0)]
    m = measure(events, memory, ref, cap=1.0)  # type: ignore[arg-type]
    assert m["first"] == {"0.1": 0.5, "0.3": 0.2}


def test_search_results_after_the_cap_do_not_count() -> None:
    from bench.search_efficiency import measure

    ref = _reference()
    memory = {i: 1.0 for i in range(10)}
    events = [_Event(40.0, 7, 3.7), _Event(60.0, 0, 3.0)]
    m = measure(events, memory, ref, cap=0.5)  # type: ignore[arg-type]
    assert m["first"]["0.1"] is None  # the best point was found at 60% > the 50% cap


def test_search_two_objective_target_fails_on_the_best_loss_point_alone() -> None:
    from bench.search_efficiency import HV_SHARE, measure

    ref = _reference()
    memory = {i: (10.0 if i == 0 else (1.0 if i == 5 else 20.0)) for i in range(10)}
    only_best = measure([_Event(10.0, 0, 3.0)], memory, ref, cap=1.0)  # type: ignore[arg-type]
    assert only_best["hv_reached"] is None and only_best["hv_at_cap"] < HV_SHARE
    both = measure(
        [_Event(10.0, 0, 3.0), _Event(30.0, 5, 3.5)],
        memory,
        ref,  # type: ignore[arg-type]
        cap=1.0,
    )
    assert both["hv_reached"] == 0.3 and both["hv_at_cap"] == 1.0


def test_search_median_counts_misses_and_has_an_interval() -> None:
    from bench.search_efficiency import median_interval

    inf = float("inf")
    m = median_interval([0.1, 0.2, inf, inf, inf])
    assert m["median"] == inf  # most seeds missed: the median is a miss, not the best seed
    m = median_interval([0.1, 0.2, 0.3, 0.4, inf])
    assert m["median"] == 0.3 and m["lo"] <= 0.3 <= m["hi"] and m["lo"] >= 0.1


def test_search_best_pruned_is_the_space_best_point() -> None:
    from bench.search_efficiency import measure

    ref = _reference()
    memory = {i: 1.0 for i in range(10)}
    m = measure([_Event(5.0, 0, 4.0, kind="cancelled")], memory, ref, cap=1.0)  # type: ignore[arg-type]
    assert m["best_pruned"] and m["first"]["0.1"] is None


@pytest.mark.postgres
def _optimum_task(truth: float) -> dict[str, Any]:
    """Ten shapes of one variant, d_model/L_b 2 … 1024 (trial i at 2^(i+1))."""
    shapes = {str(i): ("v", 2.0 ** (i + 1)) for i in range(10)}
    optimum = {"width": 1.5, "truth": {"v": truth}, "shapes": shapes}
    return {"optimum": optimum, "ref_compute": 100.0, "cap": 1.0}


def test_search_optimum_is_located_only_by_an_interval_that_holds_the_truth() -> None:
    from bench.search_efficiency import decided, measure_optimum

    # loss = (x − ln 32)² / 10 exactly: the fit's vertex is 32, its interval narrow
    def at(i: int, compute: float) -> _Event:
        x = math.log(2.0 ** (i + 1))
        return _Event(compute, i, 2.0 + (x - math.log(32.0)) ** 2 / 10 + 1e-4 * (-1) ** i)

    events = [at(i, 10.0 * (k + 1)) for k, i in enumerate([0, 9, 4, 2, 7, 6, 1])]
    right = measure_optimum(events, _optimum_task(32.0))
    # six points at least before an answer: located at the sixth result (60% of the grid)
    assert right["answered"] == right["located"] == 0.6 and not right["wrong"]
    assert right["trials"] == 6
    assert decided(events, 60.0, {}, None, _optimum_task(32.0))
    assert not decided(events[:5], 50.0, {}, None, _optimum_task(32.0))
    wrong = measure_optimum(events, _optimum_task(500.0))  # the same answer, another truth
    assert wrong["answered"] == 0.6 and wrong["located"] is None and wrong["wrong"]
    capped = measure_optimum(events, _optimum_task(32.0) | {"cap": 0.5})
    assert capped["answered"] is None and capped["located"] is None


@pytest.mark.slow
def test_optimum_search_bench_runs(tmp_path: Path) -> None:
    out = tmp_path / "optimum.json"
    run = subprocess.run(
        [
            *(sys.executable, "bench/optimum_search.py", "--seeds", "2", "--processes", "1"),
            *("--strategies", "optimum", "--peers", "grid", "--peer-pruners", "none", "--syne"),
            *("--json", str(out)),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0, run.stderr
    result = json.loads(out.read_text())
    assert set(result["summary"]) == {"optimum/none", "grid/fidelity", "optuna-grid/none"}
    assert 10 < result["true_optimum"] < 30  # Full AttnRes's fitted optimum, inside its shapes
    for r in result["runs"]:
        assert r["answered"] is None or r["trials"] >= 6
    assert "→ located" in run.stdout


@pytest.mark.slow
def test_tabular_bench_ranks_by_true_mean_and_runs_the_services_sampler(tmp_path: Path) -> None:
    import optuna

    from bench import tabular

    name = "nasbench201/cifar10"
    bench = tabular.table(name)
    top, size = tabular.top_set(name, 0.01)
    assert size == 5**6 and len(top) == 157  # ceil(1% of 15,625 cells)
    # the top set holds the cells of best mean accuracy over their recorded seeds
    accuracy = {k: sum(v["val_acc"]) / len(v["val_acc"]) for k, v in bench._dataset.items()}
    assert min(accuracy[k] for k in top) >= max(a for k, a in accuracy.items() if k not in top)
    # depthscope's samplers are the service's own (make_sampler on a spec), the peer differs
    tpe = tabular.make_sampler("depthscope-tpe", 3)
    assert isinstance(tpe, optuna.samplers.TPESampler) and tpe._multivariate
    assert not tabular.make_sampler("optuna-tpe-univariate", 3)._multivariate
    assert isinstance(tabular.make_sampler("depthscope-random", 3), optuna.samplers.RandomSampler)
    out = tmp_path / "tabular.json"
    args = ["--seeds", "3", "--cap", "30", "--processes", "1", "--benchmarks", name]
    assert tabular.main([*args, "--json", str(out)]) == 0
    result = json.loads(out.read_text())
    runs = result["runs"]
    assert len(runs) == 9 and all(r["reached"] is None or 1 <= r["reached"] <= 30 for r in runs)
    # a search that never reaches the top set within the cap is a miss, not a figure
    row = result["summary"][name]["samplers"]["depthscope-random"]
    missed = sum(r["reached"] is None for r in runs if r["sampler"] == "depthscope-random")
    assert row["missed"] == missed


def test_scale_bench_runs(tmp_path: Path) -> None:
    out = tmp_path / "scale.json"
    run_bench(
        "bench/scale.py", "--workers", "5", "--trials", "30", "--kills", "1", "--json", str(out)
    )
    result = json.loads(out.read_text())
    assert result["job_status"] == "completed"
    check = result["check"]
    assert check["counted"] == 30 and check["lost"] == 0 and check["duplicated"] == 0
    assert result["utilisation"] > 0 and result["latency_ms"]["pareto"]["median_ms"] > 0


def test_search_peer_that_does_not_import_is_reported_not_run() -> None:
    import importlib.util

    from bench.search_efficiency import TOPS, summarise
    from bench.search_peers import SYNE_PATH, syne_tune

    if importlib.util.find_spec("statsmodels") is not None or (SYNE_PATH / "statsmodels").is_dir():
        pytest.skip("statsmodels is installed here: Syne Tune's BOHB may import")
    why = syne_tune("bohb")
    assert why is not None and "BOHB is not importable" in why
    row = summarise([{"refused": why, "mode": "bohb"}], TOPS)
    assert row == {"available": False, "why": why}


def test_search_moasha_peer_searches_both_objectives(tmp_path: Path) -> None:
    """Syne Tune's MOASHA, where the bench-only install imports: a two-objective row, its
    runs capped like every other (it is skipped, said so, where it does not import)."""
    from bench.search_peers import syne_tune

    if (why := syne_tune("moasha")) is not None:
        pytest.skip(why)
    out = tmp_path / "mo.json"
    run_bench(
        "bench/search_efficiency.py",
        *("--seeds", "2", "--cap", "0.3", "--objectives", "pareto", "--strategies"),
        *("--peers", "--syne", "moasha", "--processes", "1", "--json", str(out)),
    )
    result = json.loads(out.read_text())
    row = result["summary"]["pareto"]["syne-tune/moasha"]
    assert row["available"]
    runs = [r for r in result["runs"] if r["strategy"] == "syne-tune"]
    assert len(runs) == 2 and all(r["objectives"] == "pareto" for r in runs)
    assert all(0 < r["compute"] <= 0.3 * result["reference"]["compute"] * 1.3 for r in runs)


def test_search_optuna_grid_peer_survives_an_exhausted_grid() -> None:
    import optuna

    from bench.search_peers import _sampler

    shapes, lrs = ["a", "b"], [0.1]
    study = optuna.create_study(sampler=_sampler("grid", 0, {"shape": shapes, "lr": lrs}))
    for k in range(3):  # one more than the grid: a revisit, not `study.stop()` outside optimize
        trial = study.ask()
        trial.suggest_categorical("shape", shapes)
        trial.suggest_categorical("lr", lrs)
        study.tell(trial, float(k))
    assert len(study.trials) == 3


def test_side_by_side_reads_nested_figures_and_fails_a_slower_commit() -> None:
    from bench import side_by_side as sbs

    flat = sbs.flatten({"first_visit": {"first_chart_ms": 120, "rows": [1, 2]}, "trials": 10})
    assert flat == {"first_visit.first_chart_ms": 120, "first_visit.rows": [1, 2], "trials": 10}
    assert sbs.figure(flat, "first_visit.first_chart_ms") == 120.0
    assert sbs.figure(flat, "first_chart_ms") == 120.0  # the one key ending with it
    assert sbs.figure(flat, "rows") is None  # not a number
    assert sbs.verdict(1.04, "lower", 0.05) == "ok"
    assert sbs.verdict(1.06, "lower", 0.05) == "WORSE"
    assert sbs.verdict(0.96, "higher", 0.05) == "ok"
    assert sbs.verdict(0.94, "higher", 0.05) == "WORSE"
    assert sbs.verdict(None, "lower", 0.05) == "n/a"


def test_regime_bench_runs(tmp_path: Path) -> None:
    """The regime sweep runs a job through a local service and reads its answers back: its
    parameters and tokens per parameter, each variant's optimum, the front, and the job as a
    landscape."""
    out = tmp_path / "out"
    report = tmp_path / "regime.json"
    run = run_bench(
        "bench/regime.py",
        "--regimes",
        "smoke",
        "--out",
        str(out),
        "--export",
        str(tmp_path / "landscapes"),
        "--json",
        str(report),
    )
    assert "smoke" in run.stdout and "tok/param" in run.stdout
    [row] = json.loads(report.read_text())
    assert row["status"] == "completed" and row["runs"] == 4
    assert 1e4 < row["params"] < 4e4 and row["tokens_per_param"] > 0
    assert {f["variant"] for f in row["fits"]} == {"baseline", "block_attnres"}
    assert row["front"] >= 1
    landscape = json.loads((tmp_path / "landscapes" / "smoke.json").read_text())
    assert landscape["format"] == "depthscope-landscape" and len(landscape["trials"]) == 4


def _trial(variant: str, n_layers: int, tuning: dict[float, float], confirm: list[float]) -> Any:
    """A trial as the API returns it: its settings table (lr → mean on the tuning seeds)
    and the confirmation of its best setting on seeds 2, 3, …"""

    def setting(lr: float) -> dict[str, float]:
        return {"lr": lr, "depth_lr_mult": 1.0}

    best = min(tuning, key=lambda lr: tuning[lr])
    return {
        "state": "complete",
        "lost": False,
        "arch": {"variant": variant, "n_layers": n_layers, "d_model": 64 // n_layers * 4},
        "settings": [{"setting": setting(lr), "mean": m} for lr, m in tuning.items()],
        "confirm": {
            "setting": setting(best),
            "seeds": list(range(2, 2 + len(confirm))),
            "losses": confirm,
            "mean": sum(confirm) / len(confirm),
        },
    }


def test_crossover_joined_chooses_over_every_job_and_pairs_by_seed(tmp_path: Path) -> None:
    import bench.crossover_joined as joined
    from nas_service.results.analysis import paired_interval

    jobs = {
        # the first job: both variants; the standard residual's best lr at the grid's end
        "a": [
            _trial("baseline", 2, {0.01: 2.20, 0.02: 2.10}, [2.10, 2.12, 2.08, 2.11]),
            _trial("block_attnres", 2, {0.01: 2.15, 0.02: 2.18}, [2.05, 2.09, 2.02, 2.06]),
        ],
        # the follow-up: the standard residual at larger rates, 0.04 better on tuning seeds
        "b": [_trial("baseline", 2, {0.02: 2.10, 0.04: 2.05}, [2.04, 2.07, 2.03, 2.05])],
    }
    result = joined.answer(jobs["a"] + jobs["b"], ["a", "b"], "baseline")
    base = next(s for s in result["shapes"] if s["variant"] == "baseline")
    assert base["setting"]["lr"] == 0.04 and base["losses"] == [2.04, 2.07, 2.03, 2.05]
    (pair,) = result["pairs"]
    diffs = [2.05 - 2.04, 2.09 - 2.07, 2.02 - 2.03, 2.06 - 2.05]  # seed by seed, 2 … 5
    assert pair["seeds"] == [2, 3, 4, 5] and pair["differences"] == pytest.approx(diffs)
    mean, lo, hi = paired_interval(diffs)
    assert (pair["mean"], pair["ci_low"], pair["ci_high"]) == pytest.approx((mean, lo, hi))
    # 0.04 is the largest lr the standard residual tried, 0.01 the smallest of Block AttnRes
    assert result["widen"] == [
        "baseline L_b=2: lr 0.04 at the high end",
        "block_attnres L_b=2: lr 0.01 at the low end",
    ]
    # the same answer from the jobs' landscape files, as bench/landscapes records them
    files = []
    for job, trials in jobs.items():
        files.append(tmp_path / f"{job}.json")
        landscape = {"format": "depthscope-landscape", "job": {"id": job}, "trials": trials}
        files[-1].write_text(json.dumps(landscape))
    out = tmp_path / "joined.json"
    assert joined.main(["--landscapes", *map(str, files), "--json", str(out)]) == 0
    assert json.loads(out.read_text()) == json.loads(json.dumps(result))
