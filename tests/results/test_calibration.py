"""The roofline's calibration over a real job (`GET /v1/jobs/{id}/calibration`, the plot,
the CLI's rendering): measured steps of the trainer's own step against its roofline, the fit
and its cross-validated error, memory measured against analytic; and the service's grouping
rules on hand-made trial rows (ready or not, device kinds, what is skipped)."""

from __future__ import annotations

import argparse
import statistics
from collections.abc import Iterator
from pathlib import Path
from typing import Any, cast

import pytest
from fastapi.testclient import TestClient

from cost_model import ArchConfig, Parallelism, Workload, get_hardware
from cost_model.calibration import MIN_TRIALS
from cost_model.timing import train_step_time
from nas_service.results.calibration import preset_of, trial_points
from nas_service.results.rows import TrialRow
from nas_service.spec import Training, parse_spec, read_stored
from nas_service.store import TrialOutcome, TrialStatus
from nas_service.store.records import TrainRun
from tests.support.jobs import TINY, setup, study_of

#: Eight trials (the minimum for a fit), each in about a second: two depths, two widths, two
#: variants, a grid. The trainer's step (batch 4 × 32 tokens) differs from the job's cost
#: workload (micro-batch 8): the calibration prices the trainer's.
JOB: dict[str, Any] = TINY | {
    "name": "calibration",
    "sampler": "grid",
    "n_trials": MIN_TRIALS,
    "space": TINY["space"] | {"d_model": [32, 96]},
    "budget": {"tokens": 4 * 32 * 24},
}


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory, ray_local: None) -> Iterator[tuple[str, str]]:
    """A finished job of `MIN_TRIALS` trials on the local Ray: (database URL, job id)."""
    from nas_service.jobs import submit
    from nas_service.runner.loop import Runner

    url = f"sqlite:///{tmp_path_factory.mktemp('calibration') / 'db.sqlite'}"
    settings, Session = setup(url)
    job = submit(Session, settings, JOB)
    Runner(settings).run(timeout_s=300)
    yield url, job.id


@pytest.fixture(scope="module")
def api(trained: tuple[str, str]) -> Iterator[TestClient]:
    from nas_service.api.app import create_app
    from nas_service.settings import get_settings

    with TestClient(create_app(get_settings(database_url=trained[0]))) as c:
        yield c


@pytest.mark.ray
@pytest.mark.slow
@pytest.mark.e2e
def test_a_real_job_is_calibrated_against_the_trainers_own_step(
    trained: tuple[str, str], api: TestClient
) -> None:
    url, job_id = trained
    r = api.get(f"/v1/jobs/{job_id}/calibration")
    assert r.status_code == 200, r.text
    out = r.json()
    assert out["ready"] and out["scope"] == "job" and out["cluster"] == "local"
    assert out["min_trials"] == MIN_TRIALS and out["skipped"] == []
    (group,) = out["groups"]
    assert group["device_kind"] == "cpu" and group["hardware"] == "cpu" and group["ready"]
    assert group["trials"] == MIN_TRIALS and group["needed"] == 0
    hw = get_hardware("cpu")
    assert group["peak_flops"] == hw.peak("float32") and group["dtype"] == "float32"
    model, cv = group["model"], group["cross_validation"]
    assert min(model["compute_factor"], model["memory_factor"], model["overhead_s"]) >= 0
    assert model["rows"] == MIN_TRIALS and cv["folds"] == MIN_TRIALS  # leave-one-out
    assert 0 <= cv["median_error"] <= cv["p90_error"]
    assert 0 <= cv["roofline_median_error"] <= cv["roofline_p90_error"]
    # the roofline is a lower bound far below a CPU step of a tiny model: calibrated is better
    assert cv["median_error"] < cv["roofline_median_error"]

    # every point recomputed here from the study's own records
    study = study_of(url, _job(url, job_id))
    trials = {t.number: t for t in study.get_trials() if t.user_attrs.get("train")}
    assert sorted(p["trial"] for p in group["points"]) == sorted(trials)
    for p in group["points"]:
        t = trials[p["trial"]]
        runs = t.user_attrs["train"]
        step_tokens = 4 * 32  # training.batch_size × seq_len, not the cost workload's 8
        assert p["measured_s"] == pytest.approx(
            statistics.median(step_tokens / run["tokens_per_s"] for run in runs)
        )
        arch = ArchConfig(**t.user_attrs["arch"])
        roof = train_step_time(arch, Workload(micro_batch=4, seq_len=32), Parallelism(), hw)
        assert p["roofline_s"] == pytest.approx(float(roof.total_s))
        assert p["compute_s"] == pytest.approx(float(roof.compute_s))
        expected = (
            model["compute_factor"] * p["compute_s"]
            + model["memory_factor"] * p["memory_s"]
            + model["overhead_s"]
        )
        assert p["calibrated_s"] == pytest.approx(expected)
        assert p["cv_predicted_s"] is not None and p["cv_predicted_s"] >= 0
        # memory: the trainer's measurement against the analytic one of the same step
        assert p["memory_kind"] == "cpu_saved_tensors"
        assert p["saved_tensor_bytes"] == pytest.approx(p["analytic_activation_bytes"], rel=0.02)
        assert p["state_bytes"] == pytest.approx(p["analytic_state_bytes"], rel=0.01)
    (memory,) = group["memory"]
    assert memory["memory_kind"] == "cpu_saved_tensors" and memory["trials"] == MIN_TRIALS
    assert memory["median_activation_ratio"] == pytest.approx(1.0, rel=0.02)

    cluster = api.get(f"/v1/jobs/{job_id}/calibration", params={"scope": "cluster"}).json()
    assert cluster["scope"] == "cluster" and cluster["groups"][0]["trials"] == MIN_TRIALS

    png = api.get(f"/v1/jobs/{job_id}/plots/calibration.png")
    assert png.status_code == 200 and png.headers["content-type"] == "image/png"
    assert png.content.startswith(b"\x89PNG")


def _job(url: str, job_id: str) -> Any:
    from nas_service.store import Job, make_engine, make_sessionmaker

    with make_sessionmaker(make_engine(url))() as s:
        job = s.get(Job, job_id)
        s.expunge(job)
        return job


@pytest.mark.ray
@pytest.mark.slow
@pytest.mark.e2e
def test_the_cli_prints_the_fit_and_writes_the_plot(
    trained: tuple[str, str],
    api: TestClient,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """`depthscope calibration JOB --plot`: the real app answers, in process (the transport,
    `cli.transport._request`, goes through the test client instead of a socket)."""
    from nas_service import cli

    def through_the_app(args: argparse.Namespace, method: str, path: str, **kw: Any) -> Any:
        response = api.request(method, path, **kw)
        assert response.status_code == 200, response.text
        if response.headers["content-type"].startswith("image/"):
            return response.content
        return response.json()

    monkeypatch.setattr(cli.transport, "_request", through_the_app)
    plot = tmp_path / "calibration.png"
    assert cli.main(["calibration", trained[1], "--plot", str(plot)]) == 0
    text = capsys.readouterr().out
    assert "cpu (preset cpu, float32" in text and f"{MIN_TRIALS} measured trials" in text
    assert "cross-validated: calibrated median" in text and "raw roofline median" in text
    assert "memory (cpu_saved_tensors" in text
    assert plot.read_bytes().startswith(b"\x89PNG")


def test_before_any_trial_not_ready_and_the_plot_is_409(client: TestClient) -> None:
    job = client.post("/v1/jobs", json=TINY).json()
    out = client.get(f"/v1/jobs/{job['id']}/calibration").json()
    assert out["ready"] is False and out["groups"] == []
    assert f"needs {MIN_TRIALS}" in out["message"]
    r = client.get(f"/v1/jobs/{job['id']}/plots/calibration.png")
    assert r.status_code == 409 and "no measured trial" in r.json()["error"]["message"]


def test_bad_queries_are_4xx_naming_the_field(client: TestClient) -> None:
    job = client.post("/v1/jobs", json=TINY).json()
    for path in ("calibration", "plots/calibration.png"):
        r = client.get(f"/v1/jobs/{job['id']}/{path}", params={"scope": "world"})
        assert r.status_code == 422 and r.json()["error"]["field"] == "scope"
    r = client.get("/v1/jobs/00000000-0000-0000-0000-000000000000/calibration")
    assert r.status_code == 404


# -- the grouping rules on hand-made rows ----------------------------------------------------


def row(number: int, runs: list[TrainRun], d_model: int = 32) -> TrialRow:
    arch = ArchConfig(n_layers=1, d_model=d_model, n_heads=2, seq_len=32).to_dict()
    return TrialRow(
        number=number,
        state=TrialStatus.COMPLETE,
        outcome=TrialOutcome.COMPLETED,
        reason="",
        params={},
        arch=arch,
        metrics={},
        values=[1.0],
        train=runs,
        curve=[],
        lost=False,
        duration_s=1.0,
    )


def run(rate: float, **kw: Any) -> TrainRun:
    base = {"status": "completed", "steps": 10, "tokens_per_s": rate, "device": "cpu"}
    return cast(TrainRun, base | kw)


#: The job's spec as stored: only the batch size matters to a trial's step (read back through
#: `StoredSpec.batch_size`, the stale row's way).
SPEC = {"training": {"batch_size": 4}, "cluster": "local"}
BATCH_SIZE = read_stored(SPEC).batch_size


def test_the_batch_size_of_a_stored_spec_reads_back_also_from_a_stale_row() -> None:
    """A readable spec's, a stale row's where it is a positive whole number, else the
    training section's default (a section that is no mapping included)."""
    assert BATCH_SIZE == 4
    readable = read_stored(parse_spec(TINY).model_dump(mode="json"))
    assert readable.spec is not None
    assert readable.batch_size == readable.spec.training.batch_size
    default = Training().batch_size
    assert read_stored({"training": "fast"}).batch_size == default
    assert read_stored({"training": {"batch_size": True}}).batch_size == default
    assert read_stored({"training": {"batch_size": 0}}).batch_size == default
    assert read_stored({}).batch_size == default


def test_trial_points_median_of_runs_per_device_kind_and_skips() -> None:
    rows = [
        row(0, [run(1000.0), run(2000.0), run(4000.0)]),  # median rate 2000 tok/s
        row(1, [run(1000.0, status="diverged"), run(500.0)]),  # the diverged run left out
        row(2, [run(800.0, device="cuda", device_name="NVIDIA H100 80GB HBM3")]),
        row(3, [run(800.0, device="cuda", device_name="Tesla T4")]),  # no preset
        row(4, []),  # never trained
    ]
    points, skipped = trial_points("job", BATCH_SIZE, rows)
    by = {(p.trial, p.device_kind): p for p in points}
    assert by[(0, "cpu")].measured_s == pytest.approx(4 * 32 / 2000.0)
    assert by[(0, "cpu")].runs == 3
    assert by[(1, "cpu")].measured_s == pytest.approx(4 * 32 / 500.0) and by[(1, "cpu")].runs == 1
    h100 = by[(2, "NVIDIA H100 80GB HBM3")]
    assert h100.hardware == "h100"
    cfg = ArchConfig(**rows[2].arch).replace(dtype="bfloat16")  # CUDA trains under bf16
    expected = train_step_time(
        cfg, Workload(micro_batch=4, seq_len=32), Parallelism(), get_hardware("h100")
    )
    assert float(h100.roofline.total_s) == pytest.approx(float(expected.total_s))
    assert [(s.trial, "Tesla T4" in s.reason) for s in skipped] == [(3, True)]
    assert preset_of("NVIDIA A100-SXM4-80GB") == "a100" and preset_of("cpu") == "cpu"


def test_below_the_minimum_a_group_says_how_many_more() -> None:
    from nas_service.results.calibration import _group

    rows = [row(i, [run(1000.0 + 100 * i)], d_model=16 * (i + 1)) for i in range(MIN_TRIALS - 3)]
    points, _ = trial_points("job", BATCH_SIZE, rows)
    group = _group("cpu", points)
    assert not group.ready and group.needed == 3 and group.trials == MIN_TRIALS - 3
    assert group.model is None and group.cross_validation is None
    assert all(p.calibrated_s is None and p.cv_predicted_s is None for p in group.points)


# -- calibrated_step_time_s as a job's metric ---------------------------------------------
CALIBRATED_JOB: dict[str, Any] = TINY | {
    "name": "calibrated",
    "objectives": ["val_loss", "calibrated_step_time_s"],
    "pruner": "none",
}


@pytest.mark.ray
@pytest.mark.slow
@pytest.mark.e2e
def test_a_job_naming_the_calibrated_metric_takes_its_clusters_fit_at_submission(
    trained: tuple[str, str], api: TestClient
) -> None:
    """The fit of the cluster's measured trials on the job's hardware is stored with the job,
    and every candidate is priced by it: a·compute_s + b·memory_s + c of its own step."""
    from nas_service.search.pricing import price_candidate
    from nas_service.spec import parse_spec

    url, _ = trained
    r = api.post("/v1/jobs", json=CALIBRATED_JOB)
    assert r.status_code == 201, r.text
    job_id = r.json()["id"]
    stored = _job(url, job_id).spec["cost"]["calibration"]
    cluster = api.get(f"/v1/jobs/{job_id}/calibration", params={"scope": "cluster"}).json()
    (group,) = [g for g in cluster["groups"] if g["hardware"] == "cpu"]
    for key in ("compute_factor", "memory_factor", "overhead_s"):
        assert stored[key] == pytest.approx(group["model"][key], rel=1e-9)
    assert stored["trials"] == group["trials"] >= MIN_TRIALS
    assert stored["device_kind"] == "cpu"

    spec = parse_spec(_job(url, job_id).spec)
    params = {"residual": "baseline", "n_layers": 2, "d_model": 64}
    priced = price_candidate(spec, params)
    arch = ArchConfig(**priced.arch_dict)  # type: ignore[arg-type]
    roof = train_step_time(
        arch, spec.cost.workload(spec.training), spec.cost.parallelism(), get_hardware("cpu")
    )
    expected = (
        stored["compute_factor"] * float(roof.compute_s)
        + stored["memory_factor"] * float(roof.memory_s)
        + stored["overhead_s"]
    )
    assert priced.metrics["calibrated_step_time_s"] == pytest.approx(expected, rel=1e-9)
    api.post(f"/v1/jobs/{job_id}/cancel")


@pytest.mark.ray
@pytest.mark.slow
@pytest.mark.e2e
def test_too_few_measured_trials_on_the_jobs_hardware_is_refused_naming_the_field(
    trained: tuple[str, str], api: TestClient
) -> None:
    """On hardware the cluster has no measured trials for (h100: its trials ran on the CPU)
    the job is refused where it names the metric, and nothing is stored."""
    before = api.get("/v1/jobs").json()
    spec = CALIBRATED_JOB | {
        "objectives": ["val_loss"],
        "constraints": [{"metric": "calibrated_step_time_s", "max": 1.0}],
        "cost": {"hardware": "h100"},
    }
    r = api.post("/v1/jobs", json=spec)
    assert r.status_code == 422, r.text
    body = r.text
    assert "constraints" in body and "0 measured trials on h100" in body
    assert api.get("/v1/jobs").json() == before


def test_given_factors_need_no_measured_trials(client: TestClient) -> None:
    """`cost.calibration` given in the spec: accepted on an empty service, priced by it;
    factors out of range are refused naming the field."""
    given = {"compute_factor": 2.0, "memory_factor": 1.5, "overhead_s": 0.01}
    spec = CALIBRATED_JOB | {"cost": {"hardware": "cpu", "calibration": given}}
    r = client.post("/v1/jobs", json=spec)
    assert r.status_code == 201, r.text
    client.post(f"/v1/jobs/{r.json()['id']}/cancel")
    refused = CALIBRATED_JOB | {"cost": {"hardware": "cpu"}}
    r = client.post("/v1/jobs", json=refused)
    assert r.status_code == 422 and "objectives" in r.text and "needs 8" in r.text, r.text
    for bad in ({**given, "memory_factor": -1}, {**given, "compute_factor": 1e9}):
        r = client.post("/v1/jobs", json=CALIBRATED_JOB | {"cost": {"calibration": bad}})
        assert r.status_code == 422 and "calibration" in r.text, r.text
    zeros = {"compute_factor": 0, "memory_factor": 0, "overhead_s": 0}
    r = client.post("/v1/jobs", json=CALIBRATED_JOB | {"cost": {"calibration": zeros}})
    assert r.status_code == 422 and "all zeros" in r.text, r.text
