"""The benchmarks run and write their JSON (tiny sizes; no timing is asserted)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

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
        "--trials",
        "12",
        "--strategies",
        "random",
        "tpe",
        "--modes",
        "none",
        "auto",
        "median",
        "--processes",
        "1",
        "--json",
        str(out),
    )
    result = json.loads(out.read_text())
    assert result["grid_points"] == 108 and result["reference"]["compute"] > 0
    names = {f"{s}/{m}" for s in ("random", "tpe") for m in ("none", "auto", "median")}
    assert set(result["summary"]["loss"]) == names
    assert all(0 <= v["best_pruned"] <= 1 for v in result["summary"]["loss"].values())
    # the raw-step median rule takes a single objective: refused with two, said so
    assert not result["summary"]["pareto"]["tpe/median"]["available"]
    assert all(r["compute"] > 0 and r["runs"] > 0 for r in result["runs"] if "refused" not in r)
    assert "→0.5%" in run.stdout and "best pruned" in run.stdout


@pytest.mark.postgres
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
