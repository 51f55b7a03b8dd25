"""The HTTP API: every endpoint's bad input gives its 4xx with a message naming the field,
auth on and off (in-process, no Ray); then end to end over real HTTP with uvicorn and the
runner, and the CLI against the same server."""

from __future__ import annotations

import copy
import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi.testclient import TestClient

from nas_service.api.app import create_app
from nas_service.settings import get_settings

ROOT = Path(__file__).resolve().parents[2]
SPEC: dict[str, Any] = {
    "name": "api",
    "space": {
        "n_layers": [1, 2],
        "d_model": [32, 64],
        "head_dim": 16,
        "variants": ["baseline", "block_attnres"],
        "block_sizes": [1],
    },
    "budget": {"tokens": 4 * 32 * 16},
    "objectives": ["val_loss", "params"],
    "sampler": "grid",
    "pruner": "none",
    "n_trials": 4,
    "max_concurrent": 2,
    "training": {"seq_len": 32, "batch_size": 4, "n_evals": 2, "eval_batches": 2, "threads": 1},
    "cost": {"hardware": "cpu"},
}


@pytest.fixture
def client(tmp_path: Path) -> Iterator[TestClient]:
    app = create_app(get_settings(database_url=f"sqlite:///{tmp_path / 'api.db'}", max_trials=50))
    with TestClient(app) as c:
        yield c


def error(response: httpx.Response, status: int) -> dict[str, Any]:
    assert response.status_code == status, response.text
    body = response.json()["error"]
    assert body["status"] == status and body["message"]
    return dict(body)


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


def bad_spec(path: str, value: Any) -> dict[str, Any]:
    spec = copy.deepcopy(SPEC)
    node = spec
    *parents, last = path.split(".")
    for p in parents:
        node = node[p]
    node[last] = value
    return spec


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


def test_cost_endpoint(client: TestClient) -> None:
    ok = client.post(
        "/v1/cost", json={"arch": {"n_layers": 2, "d_model": 64, "n_heads": 4}, "hardware": "h200"}
    )
    assert ok.status_code == 200 and ok.json()["cost"]["metrics"]["params"] > 0
    bad = [
        ({"arch": {"n_layers": 2, "d_model": 65, "n_heads": 4}}, "arch.n_heads"),
        ({"arch": {"n_layers": 2, "d_model": 64}}, "arch.n_heads"),
        ({"arch": {"n_layers": 2, "d_model": 64, "n_heads": 4, "colour": 1}}, "arch.colour"),
        (
            {"arch": {"n_layers": 2, "d_model": 64, "n_heads": 4}, "workload": {"recompute": "x"}},
            "workload.recompute",
        ),
        (
            {"arch": {"n_layers": 2, "d_model": 64, "n_heads": 4}, "parallelism": {"virtual": 2}},
            "parallelism.virtual",
        ),
        ({"arch": {"n_layers": 2, "d_model": 64, "n_heads": 4}, "hardware": "tpu"}, "hardware"),
        ({}, "arch"),
    ]
    for body, field in bad:
        assert error(client.post("/v1/cost", json=body), 422)["field"] == field


def test_request_size_limit(client: TestClient) -> None:
    huge = {"name": "x" * (2 << 20)}
    assert error(client.post("/v1/jobs", json=huge), 413)["field"] == "body"


def test_auth_on(tmp_path: Path) -> None:
    app = create_app(
        get_settings(database_url=f"sqlite:///{tmp_path / 'a.db'}", api_token="s3cret")
    )
    with TestClient(app) as c:
        assert c.get("/v1/health").status_code == 200  # no token needed
        for method, path in (("GET", "/v1/jobs"), ("POST", "/v1/cost"), ("GET", "/metrics")):
            assert error(c.request(method, path), 401)["field"] == "authorization"
        assert error(c.get("/v1/jobs", headers={"Authorization": "Bearer wrong"}), 401)
        assert error(c.get("/v1/jobs", headers=[(b"authorization", "Bearer tökén".encode())]), 401)
        assert c.get("/v1/jobs", headers={"Authorization": "Bearer s3cret"}).status_code == 200


def test_bad_input_is_a_4xx_naming_the_field_never_a_500(client: TestClient) -> None:
    job = client.post("/v1/jobs", json=SPEC).json()["id"]
    huge = str(2**63)
    assert error(client.get("/v1/jobs", params={"offset": huge}), 422)["field"] == "offset"
    assert (
        error(client.get(f"/v1/jobs/{job}/trials", params={"offset": huge}), 422)["field"]
        == "offset"
    )
    assert error(client.get(f"/v1/jobs/{job}/scaling", params={"loss": "inf"}), 422)["field"] == (
        "loss"
    )

    def arch(extra: str = "", **fields: str) -> str:
        values = {"n_layers": "2", "d_model": "64", "n_heads": "4"} | fields
        inner = ", ".join(f'"{k}": {v}' for k, v in values.items())
        return '{"arch": {' + inner + "}" + extra + "}"

    raw = [  # JSON as sent; Python's json parser would take NaN and Infinity
        (arch(ff_ratio="Infinity"), "arch.ff_ratio"),
        (arch(ff_ratio="-Infinity"), "arch.ff_ratio"),
        (arch(ff_ratio="NaN"), "arch.ff_ratio"),
        (arch(ff_ratio="1e999"), "arch.ff_ratio"),
        (arch(n_layers="null"), "arch.n_layers"),
        (arch(d_model="null"), "arch.d_model"),
        (arch(', "workload": {"micro_batch": null}'), "workload.micro_batch"),
        (arch(', "hardware": null'), "hardware"),
        (arch(n_layers=str(10**30)), "arch.n_layers"),
        (arch(n_layers="9" * 5000), "arch.n_layers"),
        (arch(seq_len=str(2**62)), "arch.seq_len"),
        (arch(variant=r'"x\u0000"'), "arch.variant"),
        ("[1, 2]", "request"),
        ("{", "body"),
        (arch() + " trailing", "body"),
    ]
    for body, field in raw:
        r = client.post("/v1/cost", content=body, headers={"content-type": "application/json"})
        assert error(r, 422)["field"] == field, body[:80]
    not_utf8 = client.post(
        "/v1/cost", content=b'{"hardware": "\xff"}', headers={"content-type": "application/json"}
    )
    assert error(not_utf8, 422)["field"] == "body"
    # strings no database stores, and numbers no field holds, in a job spec: named, not stored
    for path, value, field in (
        ("name", r'"a\u0000b"', "name"),
        ("name", r'"\ud800"', "name"),
        ("training.lr", "Infinity", "training.lr"),
        ("sampler_seed", str(2**64), "sampler_seed"),
    ):
        spec = json.dumps(bad_spec(path, "@@")).replace('"@@"', value)
        r = client.post("/v1/jobs", content=spec, headers={"content-type": "application/json"})
        assert error(r, 422)["field"] == field, spec[:80]
    assert client.get("/v1/jobs").json()["total"] == 1


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


def test_a_database_outage_is_a_json_503(tmp_path: Path) -> None:
    """Every data route answers a JSON 503 with Retry-After when the database is down or its
    pool has no connection to give (health says degraded); the cost model still answers."""
    from sqlalchemy import create_engine

    from nas_service.db import make_engine, make_sessionmaker

    app = create_app(get_settings(database_url=f"sqlite:///{tmp_path / 'o.db'}", max_trials=50))
    with TestClient(app, raise_server_exceptions=False) as c:
        job = c.post("/v1/jobs", json=SPEC).json()["id"]
        routes = [
            ("GET", "/v1/jobs", None),
            ("POST", "/v1/jobs", SPEC),
            ("GET", f"/v1/jobs/{job}", None),
            ("POST", f"/v1/jobs/{job}/cancel", None),
            ("GET", f"/v1/jobs/{job}/trials", None),
            ("GET", f"/v1/jobs/{job}/pareto?metrics=val_loss,params", None),
            ("GET", f"/v1/jobs/{job}/optimum", None),
            ("GET", f"/v1/jobs/{job}/scaling", None),
            ("GET", f"/v1/jobs/{job}/plots/pareto.png?metrics=val_loss,params", None),
            ("GET", f"/v1/jobs/{job}/plots/optimum.png", None),
            ("GET", "/metrics", None),
        ]
        live = app.state.sessions
        down = create_engine("postgresql+psycopg://postgres@127.0.0.1:1/gone")  # refused
        busy = make_engine(c.app.state.settings.database_url, pool_size=1, max_overflow=0,
                           pool_timeout=0.2)  # fmt: skip
        held = busy.connect()  # the pool's only connection, held: the next one times out
        try:
            for engine in (down, busy):
                app.state.sessions = make_sessionmaker(engine)
                for method, path, body in routes:
                    r = c.request(method, path, json=body)
                    assert error(r, 503)["field"] == "database", (method, path)
                    assert int(r.headers["retry-after"]) > 0
                health = c.get("/v1/health")
                assert health.status_code == 503 and health.json()["status"] == "degraded"
                assert (
                    c.post(
                        "/v1/cost", json={"arch": {"n_layers": 2, "d_model": 64, "n_heads": 4}}
                    ).status_code
                    == 200
                )
        finally:
            held.close()
            app.state.sessions = live
            down.dispose()
            busy.dispose()
        assert c.get(f"/v1/jobs/{job}").json()["status"] == "pending"  # nothing was changed
        assert c.get("/v1/jobs").json()["total"] == 1


def test_unexpected_errors_are_the_json_shape(tmp_path: Path, monkeypatch: Any) -> None:
    import nas_service.api.cost as cost_api

    def broken(*_: Any) -> Any:
        raise RuntimeError("a bug")

    monkeypatch.setattr(cost_api, "price", broken)
    app = create_app(get_settings(database_url=f"sqlite:///{tmp_path / 'u.db'}"))
    with TestClient(app, raise_server_exceptions=False) as c:
        r = c.post("/v1/cost", json={"arch": {"n_layers": 2, "d_model": 64, "n_heads": 4}})
    assert r.headers["content-type"] == "application/json"
    assert error(r, 500)["message"] == "internal error (RuntimeError)"  # no traceback


def test_metrics_count_what_the_database_holds(client: TestClient) -> None:
    import datetime as dt

    from prometheus_client.parser import text_string_to_metric_families
    from sqlalchemy import update

    from nas_service.db import Job, TrialRun

    ids = [client.post("/v1/jobs", json=SPEC | {"name": f"m{i}"}).json()["id"] for i in range(3)]
    assert client.post(f"/v1/jobs/{ids[0]}/cancel").status_code == 200
    t0 = dt.datetime(2026, 1, 1, 12, 0, 0, tzinfo=dt.UTC)
    runs = [  # state, seconds (None: still running)
        ("completed", 1.000125),
        ("completed", 2.5),
        ("failed", 0.250001),
        ("pruned", 3.0),
        ("running", None),
    ]
    with client.app.state.sessions.begin() as s:  # type: ignore[attr-defined]
        s.execute(update(Job).where(Job.id == ids[1]).values(status="running", started_at=t0))
        for n, (state, seconds) in enumerate(runs):
            s.add(
                TrialRun(
                    job_id=ids[1],
                    trial_number=n,
                    state=state,
                    params={},
                    started_at=t0,
                    finished_at=None if seconds is None else t0 + dt.timedelta(seconds=seconds),
                )
            )
    r = client.get("/metrics")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain; version=")
    families = {f.name: f for f in text_string_to_metric_families(r.text)}
    jobs = {s.labels["state"]: s.value for s in families["depthscope_jobs"].samples}
    assert jobs == {"pending": 1, "running": 1, "completed": 0, "failed": 0, "cancelled": 1}
    trial_runs = {s.labels["state"]: s.value for s in families["depthscope_trial_runs"].samples}
    assert trial_runs == {
        "running": 1,
        "completed": 2,
        "pruned": 1,
        "infeasible": 0,
        "diverged": 0,
        "failed": 1,
        "lost": 0,
    }
    assert [s.value for s in families["depthscope_queue_depth"].samples] == [1]
    summary = families["depthscope_trial_duration_seconds"]
    assert summary.type == "summary"
    values = {s.name: s.value for s in summary.samples}
    assert values["depthscope_trial_duration_seconds_count"] == 4
    assert values["depthscope_trial_duration_seconds_sum"] == pytest.approx(
        1.000125 + 2.5 + 0.250001 + 3.0, abs=1e-9
    )


def test_metrics_time_every_request_by_route_template(client: TestClient) -> None:
    from prometheus_client.parser import text_string_to_metric_families

    job_id = "00000000-0000-4000-8000-000000000000"
    for _ in range(3):
        client.get(f"/v1/jobs/{job_id}")  # a 404, one label value for every id
    client.get("/v1/jobs")
    client.get("/no/such/path")
    text = client.get("/metrics").text
    family = next(
        f
        for f in text_string_to_metric_families(text)
        if f.name == "depthscope_http_request_duration_seconds"
    )
    assert family.type == "histogram"
    counts = {
        (s.labels["route"], s.labels["method"], s.labels["status"]): s.value
        for s in family.samples
        if s.name.endswith("_count")
    }
    assert counts[("/v1/jobs/{job_id}", "GET", "404")] == 3
    assert counts[("/v1/jobs", "GET", "200")] == 1
    assert counts[("unmatched", "GET", "404")] == 1
    assert not any(job_id in route for route, _, _ in counts)


def _token_app(tmp_path: Path) -> Any:
    return create_app(
        get_settings(database_url=f"sqlite:///{tmp_path / 't.db'}", api_token="s3cret")
    )


def test_every_route_but_health_needs_the_token(tmp_path: Path) -> None:
    """Every path and method of the OpenAPI document, with no token, a wrong one, another
    scheme, and a non-ASCII one (raw bytes on the wire): a JSON 401, before the body is read."""
    good = {"Authorization": "Bearer s3cret"}
    with TestClient(_token_app(tmp_path)) as c:
        job = c.post("/v1/jobs", json=SPEC, headers=good).json()["id"]
        document = c.get("/openapi.json").json()
        operations = [
            (method.upper(), path.replace("{job_id}", job))
            for path, ops in document["paths"].items()
            for method in ops
        ]
        assert len(operations) >= 13
        bad: list[Any] = [
            None,
            [(b"authorization", b"Bearer wrong")],
            [(b"authorization", b"Basic czNjcmV0")],
            [(b"authorization", b"s3cret")],
            [(b"authorization", b"Bearer s3cret-and-more")],
            [(b"authorization", "Bearer tökén".encode())],
            [(b"authorization", "Bearer s3cretö".encode("latin-1"))],
        ]
        for method, path in operations:
            if path == "/v1/health":
                assert c.request(method, path).status_code == 200
                continue
            for headers in bad:
                for content in (None, b"{not json"):
                    r = c.request(
                        method,
                        path,
                        headers=(headers or []) + [(b"content-type", b"application/json")],
                        content=content,
                    )
                    assert error(r, 401)["field"] == "authorization", (method, path, headers)
        assert c.get(f"/v1/jobs/{job}", headers=good).status_code == 200
        assert c.get("/v1/jobs", headers=good).json()["total"] == 1  # nothing else was stored


def test_openapi_documents_auth_errors_bodies_and_plots(tmp_path: Path) -> None:
    with TestClient(_token_app(tmp_path)) as c:
        document = c.get("/openapi.json").json()
    schemes = document["components"]["securitySchemes"]
    assert [s for s in schemes.values() if s == {**s, "type": "http", "scheme": "bearer"}]
    error_ref = {"$ref": "#/components/schemas/ErrorBody"}
    assert "HTTPValidationError" not in document["components"]["schemas"]

    def documented(op: dict[str, Any], code: int) -> bool:
        content = op["responses"].get(str(code), {}).get("content", {})
        return bool(content.get("application/json", {}).get("schema") == error_ref)

    for path, ops in document["paths"].items():
        for method, op in ops.items():
            if path == "/v1/health":
                assert "security" not in op
                continue
            assert op.get("security"), (method, path)
            assert documented(op, 401), (method, path)
            if path != "/v1/cost":
                assert documented(op, 503), (method, path)
            if op.get("parameters") or op.get("requestBody"):
                assert documented(op, 422), (method, path)
            if "{job_id}" in path:
                assert documented(op, 404), (method, path)
            if op.get("requestBody"):
                assert documented(op, 413), (method, path)
            if path.endswith(".png"):
                assert set(op["responses"]["200"]["content"]) == {"image/png"}
                assert documented(op, 409)
    paths = document["paths"]
    assert documented(paths["/v1/jobs/{job_id}/cancel"]["post"], 409)
    create = paths["/v1/jobs"]["post"]
    assert documented(create, 429)
    body = create["requestBody"]["content"]["application/json"]
    assert body["schema"] == {"$ref": "#/components/schemas/JobSpec"}
    from nas_service.spec import parse_spec

    example = body["examples"]["quick"]["value"]
    assert example["name"] == "quick-baseline-vs-block"
    parse_spec(example)
    assert "n_layers" in document["components"]["schemas"]["SearchSpace"]["properties"]
    trials = document["components"]["schemas"]["TrialList"]["properties"]["items"]
    assert trials["items"] == {"$ref": "#/components/schemas/TrialRead"}
    cost = document["components"]["schemas"]["CostRequest"]["properties"]["arch"]
    assert cost == {"$ref": "#/components/schemas/ArchIn"}
    # without a configured token, the document asks for none
    open_app = create_app(get_settings(database_url=f"sqlite:///{tmp_path / 'open.db'}"))
    with TestClient(open_app) as c:
        document = c.get("/openapi.json").json()
    assert "securitySchemes" not in document.get("components", {})
    for ops in document["paths"].values():
        for op in ops.values():
            assert "security" not in op and "401" not in op["responses"]
            assert "503" in op["responses"] or ops is document["paths"]["/v1/cost"]


def test_a_method_the_path_lacks_is_405_listing_every_method(client: TestClient) -> None:
    r = client.put("/v1/jobs")
    assert error(r, 405) and r.headers["allow"] == "GET, POST"
    r = client.delete("/v1/jobs/0/cancel")
    assert error(r, 405) and r.headers["allow"] == "POST"


def test_health_metrics_openapi(client: TestClient) -> None:
    assert client.get("/v1/health").json() == {"status": "ok", "database": "ok"}
    assert "depthscope_jobs" in client.get("/metrics").text
    paths = client.get("/openapi.json").json()["paths"]
    assert {"/v1/jobs", "/v1/jobs/{job_id}/pareto", "/v1/jobs/{job_id}/optimum", "/v1/cost"} <= set(
        paths
    )
    assert client.get("/docs").status_code == 200


# -- end to end over real HTTP ---------------------------------------------------------------------
def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def server(tmp_path: Path) -> Iterator[str]:
    port = _free_port()
    env = os.environ | {"RAY_USAGE_STATS_ENABLED": "0"}
    log = (tmp_path / "server.log").open("w")
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "nas_service.cli",
            "serve",
            "--port",
            str(port),
            "--database-url",
            f"sqlite:///{tmp_path / 'e2e.db'}",
        ],
        env=env,
        cwd=ROOT,
        stdout=log,
        stderr=log,
        start_new_session=True,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            try:
                if httpx.get(f"{url}/v1/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.3)
        else:
            pytest.fail(
                "the server did not come up: " + (tmp_path / "server.log").read_text()[-2000:]
            )
        yield url
    finally:
        from tests.service.procs import terminate_session

        terminate_session(proc, grace=60)  # the server, its runner and their Ray, nothing else


def cli(url: str, *args: str, timeout: int = 400) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "nas_service.cli", *args, "--url", url],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


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


def _synthetic() -> object:
    import importlib.util

    spec = importlib.util.spec_from_file_location("bench_synthetic", ROOT / "bench" / "support.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_analysis_over_stored_trials_and_incremental_refresh(
    client: TestClient, tmp_path: Path
) -> None:
    """Trials written straight into the study (no training): Pareto, optimum and trial pages
    answer from them, and a new trial is seen by the next query (incremental refresh)."""
    import optuna

    from nas_service.jobs import optuna_storage
    from nas_service.spec import parse_spec

    spec = SPEC | {"objectives": ["val_loss", "train_memory_bytes"], "n_trials": 40}
    job = client.post("/v1/jobs", json=spec).json()
    url = str(client.app.state.settings.database_url)  # type: ignore[attr-defined]
    study = optuna.load_study(study_name=job["study_name"], storage=optuna_storage(url))
    synthetic = _synthetic().synthetic_trials  # type: ignore[attr-defined]
    study.add_trials(
        synthetic(parse_spec(SPEC | {"objectives": ["val_loss", "train_memory_bytes"]}), 300)
    )
    front = client.get(
        f"/v1/jobs/{job['id']}/pareto", params={"metrics": "val_loss,train_memory_bytes"}
    ).json()
    assert front["n_candidates"] == 300 and front["front"]
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


def test_concurrent_job_limit(tmp_path: Path) -> None:
    app = create_app(
        get_settings(database_url=f"sqlite:///{tmp_path / 'l.db'}", max_concurrent_jobs=1)
    )
    with TestClient(app) as c:
        assert c.post("/v1/jobs", json=SPEC).status_code == 201
        assert error(c.post("/v1/jobs", json=SPEC), 429)["field"] == "jobs"
        assert c.get("/v1/jobs").json()["total"] == 1


def test_health_reports_configured_ray_clusters(tmp_path: Path) -> None:
    from nas_service.settings import ClusterSettings

    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        up = f"127.0.0.1:{listener.getsockname()[1]}"
        down = f"127.0.0.1:{_free_port()}"
        clusters = {
            "local": ClusterSettings(),
            "up": ClusterSettings(address=up),
            "down": ClusterSettings(address=down),
        }
        app = create_app(
            get_settings(database_url=f"sqlite:///{tmp_path / 'h.db'}", clusters=clusters)
        )
        with TestClient(app) as c:
            body = c.get("/v1/health").json()
    assert body["database"] == "ok"
    assert body["ray"] == {"up": "ok", "down": "unreachable"}
