"""The jobs API in process (no Ray): submit, read, list, cancel; bad specs and queries are
a 422 naming the field; odd ids are a 404; analysis over stored trials; the job limit. Then
end to end over real HTTP with uvicorn and the runner, and the CLI against the same
server."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi.testclient import TestClient

from nas_service.api.app import create_app
from nas_service.settings import get_settings
from tests.support.api import (
    SPEC,
    _synthetic,
    bad_spec,
    cli,
    error,
)


def test_submit_read_list_cancel(client: TestClient) -> None:
    r = client.post("/v1/jobs", json=SPEC)
    assert r.status_code == 201
    job = r.json()
    assert job["status"] == "pending" and job["n_trials"] == 4
    assert job["progress"]["counted"] == 0 and job["compute"]["kind"] == "tokens"
    assert client.get(f"/v1/jobs/{job['id']}").json()["id"] == job["id"]
    listing = client.get("/v1/jobs", params={"status": "pending"}).json()
    assert listing["total"] == 1 and listing["items"][0]["id"] == job["id"]
    assert client.get("/v1/jobs", params={"status": "completed"}).json()["total"] == 0
    assert client.post(f"/v1/jobs/{job['id']}/cancel").json()["status"] == "cancelled"
    assert error(client.post(f"/v1/jobs/{job['id']}/cancel"), 409)["field"] == "status"
    assert client.get(f"/v1/jobs/{job['id']}/trials").json() == {
        "items": [],
        "total": 0,
        "limit": 100,
        "offset": 0,
    }


@pytest.mark.parametrize(
    ("spec", "field"),
    [
        (bad_spec("n_trials", 0), "n_trials"),
        (bad_spec("n_trials", 500), "n_trials"),  # over the configured limit of 50
        (bad_spec("space.n_layers", {"low": 4, "high": 1}), "space.n_layers"),
        (bad_spec("space.variants", ["nope"]), "space.variants"),
        (bad_spec("objectives", ["val_loss", "speed"]), "objectives"),
        (bad_spec("cluster", "elsewhere"), "cluster"),
        (bad_spec("budget", {"tokens": 3}), "budget.tokens"),
        ({"name": "x"}, "space"),
    ],
)
def test_bad_specs_are_422_and_store_nothing(
    client: TestClient, spec: dict[str, Any], field: str
) -> None:
    body = error(client.post("/v1/jobs", json=spec), 422)
    assert field in [e["field"] for e in body["errors"]]
    assert client.get("/v1/jobs").json()["total"] == 0


def test_bad_queries(client: TestClient) -> None:
    job = client.post("/v1/jobs", json=SPEC).json()["id"]
    assert error(client.get("/v1/jobs/unknown"), 404)["field"] == "job_id"
    assert error(client.get("/v1/jobs/unknown/trials"), 404)["field"] == "job_id"
    assert error(client.get("/v1/jobs", params={"status": "sleeping"}), 422)["field"] == "status"
    assert error(client.get("/v1/jobs", params={"limit": 0}), 422)["field"] == "limit"
    assert (
        error(client.get(f"/v1/jobs/{job}/trials", params={"state": "odd"}), 422)["field"]
        == "state"
    )
    assert (
        error(client.get(f"/v1/jobs/{job}/trials", params={"variant": "odd"}), 422)["field"]
        == "variant"
    )
    assert (
        error(client.get(f"/v1/jobs/{job}/pareto", params={"metrics": "val_loss"}), 422)["field"]
        == "metrics"
    )
    assert (
        error(client.get(f"/v1/jobs/{job}/pareto", params={"metrics": "val_loss,colour"}), 422)[
            "field"
        ]
        == "metrics"
    )
    assert error(client.get(f"/v1/jobs/{job}/pareto"), 422)["field"] == "metrics"
    assert (
        error(client.get(f"/v1/jobs/{job}/optimum", params={"bootstrap": -1}), 422)["field"]
        == "bootstrap"
    )
    assert error(client.get(f"/v1/jobs/{job}/scaling", params={"loss": -2}), 422)["field"] == "loss"
    assert error(client.get(f"/v1/jobs/{job}/plots/optimum.png"), 409)
    assert (
        error(
            client.post(
                "/v1/jobs", content=b"{not json", headers={"content-type": "application/json"}
            ),
            422,
        )["field"]
        == "body"  # not the character offset of the decode error
    )


def test_odd_job_ids_are_404_without_the_database(db_url: str) -> None:
    """A NUL byte, or anything that is not a job id, is a 404 (on PostgreSQL, too: its text
    cannot hold a NUL); a string that no database stores in a spec is a 422, not a 500."""
    app = create_app(get_settings(database_url=db_url, max_trials=50))
    with TestClient(app) as c:
        job = c.post("/v1/jobs", json=SPEC).json()["id"]
        for odd in ("%00", "a%00b", f"{job}%00", job.upper(), "%C3%A9", "x" * 300):
            for path in (f"/v1/jobs/{odd}", f"/v1/jobs/{odd}/trials"):
                assert error(c.get(path), 404)["field"] == "job_id", path
            assert error(c.post(f"/v1/jobs/{odd}/cancel"), 404)["field"] == "job_id"
        spec = json.dumps(SPEC | {"name": "nul\x00name"})  # sent as \u0000
        r = c.post("/v1/jobs", content=spec, headers={"content-type": "application/json"})
        assert error(r, 422)["field"] == "name"
        assert c.get("/v1/jobs").json()["total"] == 1
        assert c.get(f"/v1/jobs/{job}").status_code == 200


def test_analysis_over_stored_trials_and_incremental_refresh(
    client: TestClient, tmp_path: Path
) -> None:
    """Trials written straight into the study (no training): Pareto, optimum and trial pages
    answer from them, and a new trial is seen by the next query (incremental refresh)."""
    import optuna

    from nas_service.spec import parse_spec
    from nas_service.store.jobs import optuna_storage

    spec = SPEC | {"objectives": ["val_loss", "train_memory_bytes"], "n_trials": 40}
    job = client.post("/v1/jobs", json=spec).json()
    url = str(client.app.state.settings.database_url)  # type: ignore[attr-defined]
    study = optuna.load_study(study_name=job["study_name"], storage=optuna_storage(url))
    synthetic = _synthetic().synthetic_trials  # type: ignore[attr-defined]
    trials = synthetic(parse_spec(SPEC | {"objectives": ["val_loss", "train_memory_bytes"]}), 300)
    study.add_trials(trials)
    metrics = {"metrics": "val_loss,train_memory_bytes"}
    raw = client.get(f"/v1/jobs/{job['id']}/pareto", params=metrics | {"profile": "false"})
    assert raw.json()["n_candidates"] == 300 and raw.json()["front"]
    # by default one candidate per architecture: its best trial (the synthetic trials repeat)
    archs = {json.dumps(t.user_attrs["arch"], sort_keys=True) for t in trials}
    assert 1 < len(archs) < 300
    front = client.get(f"/v1/jobs/{job['id']}/pareto", params=metrics).json()
    assert front["n_candidates"] == len(archs) and front["front"]
    best = min(t.values[0] for t in trials)
    assert min(t["metrics"]["val_loss"] for t in front["front"]) == pytest.approx(best)
    fits = {f["variant"]: f for f in client.get(f"/v1/jobs/{job['id']}/optimum").json()["fits"]}
    assert fits["baseline"]["verdict"] == "ok"
    assert fits["baseline"]["optimum_ratio"] == pytest.approx(
        40.0, rel=0.25
    )  # the synthetic minimum
    assert client.get(f"/v1/jobs/{job['id']}").json()["progress"]["completed"] == 300
    study.add_trials(
        synthetic(parse_spec(SPEC | {"objectives": ["val_loss", "train_memory_bytes"]}), 5, seed=9)
    )
    fresh = client.app.state.settings.results_fresh_s  # type: ignore[attr-defined]
    time.sleep(fresh + 0.05)  # read again at most `results_fresh_s` later
    assert client.get(f"/v1/jobs/{job['id']}/trials", params={"limit": 1}).json()["total"] == 305
    # the front is sent as encoded once per state of the study: the new trials are in it,
    # in the bytes FastAPI's own encoding of the documented schema gives
    again = client.get(f"/v1/jobs/{job['id']}/pareto", params=metrics | {"profile": "false"})
    assert again.json()["n_candidates"] == 305
    assert again.headers["content-type"] == "application/json"
    from pydantic import TypeAdapter

    from nas_service.results.reads import ParetoRead

    schema = TypeAdapter(ParetoRead)
    assert again.content == schema.dump_json(schema.validate_json(again.content))
    # a page of trials is assembled from each row's encoded read: the same bytes, with or
    # without curves, on the API's page and on the dashboard's table
    from nas_service.results.reads import TrialList

    pages = TypeAdapter(TrialList)
    for path, params in (
        ("trials", {"limit": 7, "offset": 3}),
        ("trials", {"limit": 2, "curve": "true"}),
        ("trials", {"limit": 5, "offset": 400}),  # past the end: no items
    ):
        got = client.get(f"/v1/jobs/{job['id']}/{path}", params=params)
        assert got.status_code == 200 and got.headers["content-type"] == "application/json"
        assert got.content == pages.dump_json(pages.validate_json(got.content))
    table = client.get(f"/v1/jobs/{job['id']}/table", params={"limit": 4})
    assert table.status_code == 200, table.text
    assert table.content == pages.dump_json(pages.validate_json(table.content))
    assert len(table.json()["items"]) == 4 and table.json()["total"] == 305
    page = client.get(
        f"/v1/jobs/{job['id']}/trials", params={"variant": "block_attnres", "state": "complete"}
    ).json()
    assert 0 < page["total"] < 305 and all(t["variant"] == "block_attnres" for t in page["items"])
    scaling = client.get(
        f"/v1/jobs/{job['id']}/scaling", params={"reference": "baseline", "loss": 2.0}
    ).json()
    assert scaling["problems"]  # one budget: no scaling fit, and it says so
    assert (
        client.get(
            f"/v1/jobs/{job['id']}/plots/pareto.png",
            params={"metrics": "val_loss,train_memory_bytes"},
        ).content[:4]
        == b"\x89PNG"
    )
    assert client.get(f"/v1/jobs/{job['id']}/plots/optimum.png").content[:4] == b"\x89PNG"


def test_progress_and_eta_count_finished_runs(client: TestClient) -> None:
    """A job of 3 trials × 2 tune settings × 2 seeds: one trial finished (4 runs) and one
    running with its first run done show 5 of 12 runs; the ETA is the mean run time × the
    runs left ÷ the concurrency. The runs of the running trial are what moves the bar."""
    import datetime as dt

    import optuna

    from nas_service.store.jobs import optuna_storage

    spec = SPEC | {"n_trials": 3, "seeds": 2, "tune": {"lr": [0.003, 0.01]}, "max_concurrent": 1}
    job = client.post("/v1/jobs", json=spec).json()
    assert job["progress"]["runs_total"] == 12 and job["progress"]["runs_done"] == 0
    url = str(client.app.state.settings.database_url)  # type: ignore[attr-defined]
    study = optuna.load_study(study_name=job["study_name"], storage=optuna_storage(url))
    run = {"status": "completed", "final_val_loss": 2.0, "tokens_seen": 512}
    start = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
    study.add_trial(
        optuna.trial.FrozenTrial(
            number=0,
            state=optuna.trial.TrialState.COMPLETE,
            value=None,
            values=[2.0, 1000.0],
            datetime_start=start,
            datetime_complete=start + dt.timedelta(seconds=40),  # 4 runs of 10 s
            params={},
            distributions={},
            user_attrs={"outcome": "completed", "train": [run] * 4},
            system_attrs={},
            intermediate_values={},
            trial_id=0,
        )
    )
    running = study.ask()
    running.set_user_attr("train", [run])

    def progress() -> dict[str, Any]:
        fresh = client.app.state.settings.results_fresh_s  # type: ignore[attr-defined]
        time.sleep(fresh + 0.05)
        return dict(client.get(f"/v1/jobs/{job['id']}").json())

    state = progress()
    assert state["progress"]["counted"] == 1 and state["progress"]["running"] == 1
    assert (state["progress"]["runs_done"], state["progress"]["runs_total"]) == (5, 12)
    assert state["compute"]["spent"] == 5 * 512
    assert state["eta_s"] == pytest.approx(10.0 * 7)
    running.set_user_attr("train", [run, run])  # the second run of the running trial
    study.tell(study.ask(), state=optuna.trial.TrialState.FAIL)  # a change the cache sees
    state = progress()
    assert state["progress"]["runs_done"] == 4 + 4 + 2  # a failed trial counts all its runs


def test_runs_are_planned_per_variant(client: TestClient) -> None:
    """With depth_lr_mult in the tune grid the standard residual trains 2 settings and Block
    AttnRes 6: a job of 4 trials plans 4 × the mean (16) until it knows its trials' variants;
    a finished baseline trial then counts its own 2."""
    import optuna

    from nas_service.store.jobs import optuna_storage

    tune = {"lr": [0.003, 0.01], "depth_lr_mult": [0.1, 1.0, 10.0]}
    job = client.post("/v1/jobs", json=SPEC | {"n_trials": 4, "tune": tune}).json()
    assert job["progress"]["runs_total"] == 16 and job["progress"]["runs_done"] == 0
    url = str(client.app.state.settings.database_url)  # type: ignore[attr-defined]
    study = optuna.load_study(study_name=job["study_name"], storage=optuna_storage(url))
    study.add_trial(
        optuna.trial.create_trial(
            values=[2.0, 1000.0],
            user_attrs={"outcome": "completed", "arch": {"variant": "baseline"}, "train": []},
        )
    )
    fresh = client.app.state.settings.results_fresh_s  # type: ignore[attr-defined]
    time.sleep(fresh + 0.05)
    progress = client.get(f"/v1/jobs/{job['id']}").json()["progress"]
    assert (progress["runs_done"], progress["runs_total"]) == (2, 2 + 3 * 4)


def test_concurrent_job_limit(tmp_path: Path) -> None:
    app = create_app(
        get_settings(database_url=f"sqlite:///{tmp_path / 'l.db'}", max_concurrent_jobs=1)
    )
    with TestClient(app) as c:
        assert c.post("/v1/jobs", json=SPEC).status_code == 201
        assert error(c.post("/v1/jobs", json=SPEC), 429)["field"] == "jobs"
        assert c.get("/v1/jobs").json()["total"] == 1


@pytest.mark.e2e
@pytest.mark.ray
@pytest.mark.slow
def test_end_to_end_over_http_and_the_cli(server: str, tmp_path: Path) -> None:
    job = httpx.post(f"{server}/v1/jobs", json=SPEC, timeout=60).json()
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        state = httpx.get(f"{server}/v1/jobs/{job['id']}", timeout=30).json()
        if state["status"] not in ("pending", "running"):
            break
        time.sleep(1)
    assert state["status"] == "completed", state
    assert state["progress"]["counted"] == 4 and state["compute"]["fraction"] == pytest.approx(1.0)
    trials = httpx.get(
        f"{server}/v1/jobs/{job['id']}/trials", params={"curve": "true"}, timeout=30
    ).json()
    assert trials["total"] == 4 and all(t["curve"] for t in trials["items"])
    front = httpx.get(
        f"{server}/v1/jobs/{job['id']}/pareto", params={"metrics": "val_loss,params"}, timeout=30
    ).json()
    assert 1 <= len(front["front"]) <= 4 and front["n_candidates"] == 4
    optimum = httpx.get(f"{server}/v1/jobs/{job['id']}/optimum", timeout=30).json()
    assert {f["variant"] for f in optimum["fits"]} == {"baseline", "block_attnres"}

    spec_file = tmp_path / "spec.json"
    spec_file.write_text(json.dumps(SPEC | {"name": "cli"}))
    out = cli(server, "submit", str(spec_file), "--wait")
    assert out.returncode == 0, out.stderr
    job_id = out.stdout.split()[2]
    assert "completed" in out.stdout
    assert job_id in cli(server, "status").stdout
    assert "trials 4/4" in cli(server, "status", job_id).stdout
    plot = tmp_path / "front.png"
    out = cli(server, "pareto", job_id, "--metrics", "val_loss,params", "--plot", str(plot))
    assert out.returncode == 0 and "Pareto front over val_loss, params" in out.stdout
    assert plot.read_bytes()[:4] == b"\x89PNG"
    out = cli(server, "optimum", job_id, "--plot", str(tmp_path / "opt.png"))
    assert out.returncode == 0 and "baseline" in out.stdout and (tmp_path / "opt.png").exists()
    assert "4 of 4 trials" in cli(server, "trials", job_id).stdout
    bad = cli(server, "pareto", job_id, "--metrics", "val_loss")
    assert bad.returncode == 1 and "metrics" in bad.stderr

    long = httpx.post(
        f"{server}/v1/jobs",
        json=SPEC | {"name": "long", "budget": {"tokens": 4 * 32 * 100_000}},
        timeout=60,
    ).json()
    time.sleep(3)
    out = cli(server, "cancel", long["id"])
    assert out.returncode == 0 and "cancelled" in out.stdout
    assert cli(server, "cancel", long["id"]).returncode == 1


def test_compare_and_sensitivity_before_any_trial(client: TestClient) -> None:
    """A job with no trial yet: the comparison is a 409 naming the reference (nothing to
    compare yet), a variant the job does not have a 404 naming it, a bad level a 422, and the
    sensitivity an empty answer."""
    job = client.post("/v1/jobs", json=SPEC).json()
    base = f"/v1/jobs/{job['id']}"
    assert error(client.get(f"{base}/compare"), 409)["field"] == "reference"
    assert error(client.get(f"{base}/plots/compare.png"), 409)["field"] == "reference"
    missing = error(client.get(f"{base}/compare", params={"reference": "mhc_lite"}), 404)
    assert missing["field"] == "reference" and "block_attnres/S=1" in missing["message"]
    assert error(client.get(f"{base}/compare", params={"level": 1.5}), 422)["field"] == "level"
    assert error(client.get(f"{base}/compare", params={"reference": "a b"}), 422)
    assert client.get(f"{base}/sensitivity").json() == {"job_id": job["id"], "variants": []}
