"""The API's refusals: bad input anywhere is a 4xx naming the field, never a 500; the cost
endpoint's; the request size limit; a database outage is a JSON 503; an unexpected error
keeps the JSON shape; a method the path lacks is a 405 listing every method."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from fastapi.testclient import TestClient

from nas_service.api.app import create_app
from nas_service.settings import get_settings
from tests.support.api import (
    SPEC,
    bad_spec,
    error,
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


def test_a_database_outage_is_a_json_503(tmp_path: Path) -> None:
    """Every data route answers a JSON 503 with Retry-After when the database is down or its
    pool has no connection to give (health says degraded); the cost model still answers."""
    from sqlalchemy import create_engine

    from nas_service.store import make_engine, make_sessionmaker

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
        busy = make_engine(app.state.settings.database_url, pool_size=1, max_overflow=0,
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


def test_a_method_the_path_lacks_is_405_listing_every_method(client: TestClient) -> None:
    r = client.put("/v1/jobs")
    assert error(r, 405) and r.headers["allow"] == "GET, POST"
    r = client.delete("/v1/jobs/0/cancel")
    assert error(r, 405) and r.headers["allow"] == "POST"
