"""A job recorded as a landscape (`GET /v1/jobs/{id}/landscape`, `nas_service.results.landscape`):
every trial with its settings, runs and curve, the corpus identity; read back checked; and
the landscape shipped in bench/landscapes/ (recorded from a real grid run) loads."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import optuna
import pytest
from fastapi.testclient import TestClient

from nas_service.results.landscape import FORMAT, VERSION, LandscapeError, load_landscape
from nas_service.store.jobs import optuna_storage
from tests.support.api import ROOT, SPEC

CORPUS = {"name": "stdlib-py3.11", "checksum": "d4d2", "n_tokens": 100}


def _run(seed: int, lr: float, loss: float, corpus: dict[str, Any] = CORPUS) -> dict[str, Any]:
    return {
        "status": "completed",
        "final_val_loss": loss,
        "tokens_seen": 2048,
        "flops_spent": 1e9,
        "wall_time_s": 1.5 + seed,
        "seed": seed,
        "setting": {"lr": lr, "depth_lr_mult": 1.0, "warmup_frac": 0.05, "weight_decay": 0.1},
        "corpus": corpus,
    }


def _trial(number: int, runs: list[dict[str, Any]]) -> optuna.trial.FrozenTrial:
    curve = [[1.0, 512.0, 2.5e8, 3.0], [4.0, 2048.0, 1e9, runs[0]["final_val_loss"]]]
    return optuna.trial.create_trial(
        params={"residual": "baseline", "n_layers": 1 + number, "d_model": 32},
        distributions={
            "residual": optuna.distributions.CategoricalDistribution(["baseline"]),
            "n_layers": optuna.distributions.IntDistribution(1, 8),
            "d_model": optuna.distributions.CategoricalDistribution([32]),
        },
        values=[runs[0]["final_val_loss"], 1000.0],
        user_attrs={
            "outcome": "completed",
            "arch": {"variant": "baseline", "n_layers": 1 + number, "d_model": 32, "n_heads": 2},
            "costs": {"params": 1000.0, "train_memory_bytes": 1e6},
            "train": runs,
            "curve": curve,
            "setting": runs[0]["setting"],
            "settings": [
                {"setting": runs[0]["setting"], "losses": [r["final_val_loss"] for r in runs]}
                | {"mean": sum(r["final_val_loss"] for r in runs) / len(runs)}
            ],
        },
    )


def _job_with_trials(client: TestClient, trials: list[optuna.trial.FrozenTrial]) -> str:
    job = client.post("/v1/jobs", json=SPEC | {"seeds": 2}).json()
    url = str(client.app.state.settings.database_url)  # type: ignore[attr-defined]
    study = optuna.load_study(study_name=job["study_name"], storage=optuna_storage(url))
    study.add_trials(trials)
    time.sleep(client.app.state.settings.results_fresh_s + 0.05)  # type: ignore[attr-defined]
    return str(job["id"])


def test_a_job_exported_as_a_landscape_and_read_back(client: TestClient, tmp_path: Path) -> None:
    trials = [_trial(n, [_run(0, 3e-3, 2.0 + n), _run(1, 3e-3, 2.1 + n)]) for n in range(3)]
    job_id = _job_with_trials(client, trials)
    out = client.get(f"/v1/jobs/{job_id}/landscape").json()
    assert out["format"] == FORMAT and out["version"] == VERSION
    assert out["job"]["id"] == job_id and out["job"]["spec"]["seeds"] == 2
    assert out["corpus"] == CORPUS
    assert [t["number"] for t in out["trials"]] == [0, 1, 2]
    for t, trial in zip(out["trials"], trials, strict=True):
        assert t["curve"] == trial.user_attrs["curve"]
        assert [(r["seed"], r["tokens_seen"], r["wall_time_s"]) for r in t["train"]] == [
            (0, 2048, 1.5),
            (1, 2048, 2.5),
        ]
        assert t["metrics"]["train_memory_bytes"] == 1e6 and t["params"]["n_layers"] >= 1
        assert t["seeds"] == [r["final_val_loss"] for r in trial.user_attrs["train"]]
    path = tmp_path / "landscape.json"
    path.write_text(json.dumps(out))
    back = load_landscape(path)
    assert back.model_dump(mode="json") == out


def test_runs_of_different_corpora_give_no_one_identity(client: TestClient) -> None:
    other = CORPUS | {"checksum": "ffff"}
    trials = [_trial(0, [_run(0, 3e-3, 2.0), _run(1, 3e-3, 2.1, other)])]
    out = client.get(f"/v1/jobs/{_job_with_trials(client, trials)}/landscape").json()
    assert out["corpus"] is None  # each run keeps its own
    assert [r["corpus"]["checksum"] for r in out["trials"][0]["train"]] == ["d4d2", "ffff"]


def test_a_bad_landscape_file_is_refused_naming_the_field(tmp_path: Path) -> None:
    path = tmp_path / "l.json"
    with pytest.raises(LandscapeError) as err:
        load_landscape(path)
    assert err.value.field == "path"
    path.write_text("{not json")
    with pytest.raises(LandscapeError):
        load_landscape(path)
    good = {"format": FORMAT, "version": VERSION, "job": None, "corpus": None, "trials": []}
    path.write_text(json.dumps(good | {"format": "something-else"}))
    with pytest.raises(LandscapeError) as err:
        load_landscape(path)
    assert err.value.field == "format"
    shipped = json.loads((ROOT / "bench/landscapes/crossover.json").read_text())
    path.write_text(json.dumps(shipped | {"version": VERSION + 1}))
    with pytest.raises(LandscapeError) as err:
        load_landscape(path)
    assert err.value.field == "version"
    with pytest.raises(LandscapeError) as err:
        load_landscape(ROOT / "bench/landscapes/crossover.json", max_bytes=1000)
    assert err.value.field == "path" and "over the limit" in err.value.reason


def test_the_shipped_landscape_is_a_real_grid_run() -> None:
    """bench/landscapes/crossover.json: the crossover study (docs/study.md) as recorded: 12
    trials of the grid, every one complete with its 9 or 27 runs (lr × depth_lr_mult × 3
    seeds) on the built-in corpus, each run with its tokens and wall time."""
    land = load_landscape(ROOT / "bench/landscapes/crossover.json")
    assert land.job.status == "completed" and land.job.spec.sampler == "grid"
    assert land.corpus is not None and str(land.corpus["source"]).startswith("builtin:")
    assert len(land.trials) == 12 and all(t.state == "complete" for t in land.trials)
    runs = {t.variant: len(t.train) for t in land.trials}
    assert runs == {"baseline": 9, "block_attnres": 27, "full_attnres": 27}
    assert sum(len(t.train) for t in land.trials) == 252
    for t in land.trials:
        assert t.curve and all(r.tokens_seen and r.wall_time_s for r in t.train)
        best = min(t.settings, key=lambda s: s.mean if s.mean is not None else float("inf"))
        assert t.setting == best.setting and t.metrics["val_loss"] == pytest.approx(best.mean)
