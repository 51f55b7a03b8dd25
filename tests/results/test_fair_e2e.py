"""Fair comparisons end to end over HTTP with real training on the built-in corpus: a job with
a per-shape learning-rate grid, two variants and two seeds; the paired comparison, the
sensitivity and the profiled optimum the service answers are recomputed here from the trials
it lists, by arithmetic written out in the test."""

from __future__ import annotations

import math
import statistics
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from nas_service.results.analysis import fit_optimum
from nas_service.results.landscape import load_landscape
from tests.support.api import cli
from tests.support.jobs import TINY

LRS = [0.003, 0.02]
SPEC: dict[str, Any] = TINY | {
    "name": "fair",
    "space": {
        "n_layers": [1, 2, 3],
        "d_model": [32],
        "head_dim": 16,
        "variants": ["baseline", "full_attnres"],
    },
    "sampler": "grid",
    "n_trials": 6,
    "seeds": 2,
    "tune": {"lr": LRS},
}
#: Student's t quantile 0.975 with 1 degree of freedom (two paired seeds), from the tables.
T_975_DF1 = 12.7062


def _wait(server: str, job_id: str, timeout_s: float = 400) -> dict[str, Any]:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        state: dict[str, Any] = httpx.get(f"{server}/v1/jobs/{job_id}", timeout=30).json()
        if state["status"] not in ("pending", "running"):
            return state
        time.sleep(1)
    raise AssertionError(f"job {job_id} still running after {timeout_s}s")


def _shape(t: dict[str, Any]) -> tuple[int, int]:
    return int(t["arch"]["n_layers"]), int(t["arch"]["d_model"])


@pytest.mark.e2e
@pytest.mark.ray
@pytest.mark.slow
def test_compare_sensitivity_and_profile_agree_with_the_trials(server: str, tmp_path: Path) -> None:
    job = httpx.post(f"{server}/v1/jobs", json=SPEC, timeout=60).json()
    assert "id" in job, job
    state = _wait(server, job["id"])
    assert state["status"] == "completed", state
    progress = state["progress"]
    assert progress["runs_total"] == 6 * 2 * len(LRS) == progress["runs_done"]

    base = f"{server}/v1/jobs/{job['id']}"
    trials = httpx.get(f"{base}/trials", timeout=30).json()["items"]
    assert len(trials) == 6 and all(t["state"] == "complete" for t in trials)
    by = {(t["variant"], *_shape(t)): t for t in trials}

    # every run is first-class: settings × seeds, in order, each with its seed and setting
    for t in trials:
        runs = [(r["setting"]["lr"], r["seed"]) for r in t["train"]]
        assert runs == [(lr, s) for lr in LRS for s in (0, 1)], runs
        means = {}
        for entry in t["settings"]:
            losses = [r["final_val_loss"] for r in t["train"] if r["setting"] == entry["setting"]]
            assert entry["losses"] == pytest.approx(losses)
            assert entry["mean"] == pytest.approx(statistics.fmean(losses))
            means[entry["setting"]["lr"]] = entry["mean"]
        best_lr = min(means, key=lambda lr: means[lr])
        assert t["setting"]["lr"] == best_lr
        assert t["metrics"]["val_loss"] == pytest.approx(means[best_lr])
        chosen = [r["final_val_loss"] for r in t["train"] if r["setting"]["lr"] == best_lr]
        assert t["seeds"] == pytest.approx(chosen)

    # the paired comparison, recomputed: per shape, per seed, full_attnres − baseline
    compare = httpx.get(f"{base}/compare", params={"reference": "baseline"}, timeout=30).json()
    assert compare["reference"] == "baseline" and "t" in compare["method"]
    assert len(compare["pairs"]) == 3
    for pair in compare["pairs"]:
        assert pair["variant"] == "full_attnres"
        ours = by[("full_attnres", pair["n_layers"], pair["d_model"])]
        ref = by[("baseline", pair["n_layers"], pair["d_model"])]
        diffs = [a - b for a, b in zip(ours["seeds"], ref["seeds"], strict=True)]
        assert pair["differences"] == pytest.approx(diffs)
        mean = statistics.fmean(diffs)
        half = T_975_DF1 * statistics.stdev(diffs) / math.sqrt(2)
        assert pair["mean"] == pytest.approx(mean)
        assert pair["ci_low"] == pytest.approx(mean - half, rel=1e-3, abs=1e-9)
        assert pair["ci_high"] == pytest.approx(mean + half, rel=1e-3, abs=1e-9)
        verdict = "better" if mean + half < 0 else "worse" if mean - half > 0 else "no_difference"
        assert pair["verdict"] == verdict
        assert pair["setting"] == ours["setting"] and pair["reference_setting"] == ref["setting"]
    [cross] = compare["crossover"]
    assert [p["n_layers"] for p in cross["by_depth"]] == [1, 2, 3] and cross["message"]

    # sensitivity: the lr curve of every shape is its settings' mean losses
    sens = httpx.get(f"{base}/sensitivity", timeout=30).json()
    assert {v["variant"] for v in sens["variants"]} == {"baseline", "full_attnres"}
    for v in sens["variants"]:
        [axis] = [a for a in v["axes"] if a["axis"] == "lr"]
        assert axis["values"] == LRS
        for curve in axis["curves"]:
            t = by[(v["variant"], curve["n_layers"], curve["d_model"])]
            expected = {e["setting"]["lr"]: e["mean"] for e in t["settings"]}
            assert {x: y for x, y in curve["points"]} == pytest.approx(expected)
            assert curve["best"] == t["setting"]["lr"]
            edge = {LRS[0]: "low", LRS[-1]: "high"}[curve["best"]]
            assert curve["at_edge"] == edge
        assert any("widen lr" in flag for flag in v["flags"])

    # the profiled optimum is the fit of each shape's best setting; the raw one of the trials
    optimum = httpx.get(f"{base}/optimum", params={"bootstrap": 0}, timeout=30).json()
    assert optimum["profile"] is True
    for fit in optimum["fits"]:
        rows = [t for t in trials if t["variant"] == fit["variant"]]
        ratios = [t["arch"]["d_model"] / t["arch"]["n_layers"] for t in rows]
        ours = fit_optimum(fit["variant"], ratios, [t["metrics"]["val_loss"] for t in rows], 0)
        assert fit["view"] == "profile" and fit["verdict"] == ours.verdict
        assert fit["coefficients"] == pytest.approx(ours.coefficients)
        assert fit["n_shapes"] == 3
        assert fit["fixed"] is not None and fit["fixed"]["setting"]["lr"] in LRS
        assert isinstance(fit["moved"], bool)
    raw = httpx.get(f"{base}/optimum", params={"profile": "false"}, timeout=30).json()
    assert raw["profile"] is False and all(f["view"] == "raw" for f in raw["fits"])

    # a reference that is not a variant of the job is not found, naming the field
    bad = httpx.get(f"{base}/compare", params={"reference": "mhc_lite"}, timeout=30)
    assert bad.status_code == 404 and bad.json()["error"]["field"] == "reference"
    assert "full_attnres" in bad.json()["error"]["message"]

    # the same from the CLI, with the plot
    plot = tmp_path / "compare.png"
    out = cli(server, "compare", job["id"], "--plot", str(plot))
    assert out.returncode == 0, out.stderr
    assert "full_attnres" in out.stdout and "paired comparison against baseline" in out.stdout
    assert plot.read_bytes()[:4] == b"\x89PNG"
    out = cli(server, "sensitivity", job["id"])
    assert out.returncode == 0 and "widen lr" in out.stdout, out.stdout + out.stderr
    out = cli(server, "trials", job["id"])
    assert out.returncode == 0 and out.stdout.count("at lr=") == 6, out.stdout
    exported = tmp_path / "landscape.json"
    out = cli(server, "export", job["id"], "--out", str(exported))
    assert out.returncode == 0 and "6 trials, 24 training runs" in out.stdout, out.stdout
    land = load_landscape(exported)
    assert (
        land.corpus is not None
        and land.corpus["source"] == trials[0]["train"][0]["corpus"]["source"]
    )
    assert [t.seeds for t in land.trials] == [t["seeds"] for t in trials]
