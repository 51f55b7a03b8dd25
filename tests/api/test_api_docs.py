"""Authentication on and off, the OpenAPI document (every error documented, every body a
named schema), health and the Prometheus metrics."""

from __future__ import annotations

import socket
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from nas_service.api.app import create_app
from nas_service.settings import get_settings
from tests.support.api import (
    SPEC,
    _free_port,
    _token_app,
    error,
    serve,
)


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


def test_health_metrics_openapi(client: TestClient) -> None:
    assert client.get("/v1/health").json() == {"status": "ok", "database": "ok"}
    assert "depthscope_jobs" in client.get("/metrics").text
    paths = client.get("/openapi.json").json()["paths"]
    assert {"/v1/jobs", "/v1/jobs/{job_id}/pareto", "/v1/jobs/{job_id}/optimum", "/v1/cost"} <= set(
        paths
    )
    assert client.get("/docs").status_code == 200


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


def test_metrics_count_what_the_database_holds(client: TestClient) -> None:
    import datetime as dt

    from prometheus_client.parser import text_string_to_metric_families
    from sqlalchemy import update

    from nas_service.store import Job, TrialRun

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


def _untyped(document: dict[str, Any]) -> list[str]:
    """Every place of a request or response body's schema (named schemas followed) that
    accepts any value or any object: `Any`, `dict[str, Any]`, a list of anything, an extra
    field allowed."""
    schemas = document["components"]["schemas"]
    found: list[str] = []
    seen: set[str] = set()

    def walk(schema: dict[str, Any], where: str) -> None:
        if "$ref" in schema:
            name = schema["$ref"].rsplit("/", 1)[1]
            if name not in seen:
                seen.add(name)
                walk(schemas[name], name)
            return
        union = [k for k in ("anyOf", "oneOf", "allOf") if k in schema]
        for key in union:
            for i, option in enumerate(schema[key]):
                walk(option, f"{where}|{i}")
        if union:
            return
        kind = schema.get("type")
        if kind is None and "const" not in schema and "enum" not in schema:
            found.append(where)
        elif kind == "object":
            extra = schema.get("additionalProperties", "properties" not in schema)
            if extra is True or extra == {}:
                found.append(where)
            elif isinstance(extra, dict):
                walk(extra, f"{where}{{}}")
            for name, field in schema.get("properties", {}).items():
                walk(field, f"{where}.{name}")
        elif kind == "array":
            for i, item in enumerate(schema.get("prefixItems", [])):
                walk(item, f"{where}[{i}]")
            if "prefixItems" not in schema:
                if not schema.get("items"):
                    found.append(where)
                else:
                    walk(schema["items"], f"{where}[]")

    for path, operations in document["paths"].items():
        for method, op in operations.items():
            bodies = [("body", op.get("requestBody", {}))]
            bodies += [(code, answer) for code, answer in op["responses"].items()]
            for label, body in bodies:
                schema = body.get("content", {}).get("application/json", {}).get("schema")
                if schema is not None:
                    walk(schema, f"{method.upper()} {path} {label}: ")
    return found


def test_every_body_has_a_typed_named_schema(tmp_path: Path) -> None:
    """No request or response body, nor any field inside one, is an untyped object or `Any`
    in the OpenAPI document; every JSON response is a named schema."""
    with TestClient(_token_app(tmp_path)) as c:
        document = c.get("/openapi.json").json()
    assert _untyped(document) == []
    for path, operations in document["paths"].items():
        for method, op in operations.items():
            for code, answer in op["responses"].items():
                schema = answer.get("content", {}).get("application/json", {}).get("schema")
                if schema is not None:
                    assert set(schema) == {"$ref"}, (method, path, code, schema)
    # the walk does find what it looks for
    loose = {
        "paths": {
            "/x": {
                "get": {
                    "responses": {
                        "200": {"content": {"application/json": {"schema": {"$ref": "#/c/Loose"}}}}
                    }
                }
            }
        },
        "components": {
            "schemas": {
                "Loose": {
                    "type": "object",
                    "properties": {
                        "a": {"type": "object", "additionalProperties": True},
                        "b": {},
                        "c": {"type": "array", "items": {}},
                        "d": {"type": "integer"},
                    },
                }
            }
        },
    }
    assert _untyped(loose) == ["Loose.a", "Loose.b", "Loose.c"]


# -- the API explorer and the gaps of the document ------------------------------------------
def test_docs_come_from_the_service_alone(tmp_path: Path) -> None:
    """`/docs` names no other origin: its scripts and styles are served by the service (the
    vendored Swagger UI, byte for byte the files its VERSION names), under a policy that
    allows this origin alone; ReDoc (a CDN page) is not served."""
    import hashlib
    import re

    from nas_service.api.docs import SWAGGER

    with TestClient(_token_app(tmp_path)) as c:
        page = c.get("/docs")
        assert page.status_code == 200
        assert "script-src 'self'" in page.headers["content-security-policy"]
        assert "connect-src 'self'" in page.headers["content-security-policy"]
        assert "//" not in page.text.replace("<!doctype html>", "")  # no URL of another origin
        named = re.findall(r'(?:src|href)="([^"]+)"', page.text)
        assets = [a for a in named if a != "data:,"]  # the icon: none
        assert len(assets) == 3 and all(a.startswith("/docs/static/") for a in assets)
        for asset in assets:
            served = c.get(asset)
            assert served.status_code == 200 and served.content, asset
        init = c.get("/docs/static/init.js").text
        assert '"/openapi.json"' in init and "validatorUrl: null" in init
        version = (SWAGGER / "VERSION").read_text()
        for name in ("swagger-ui-bundle.js", "swagger-ui.css"):
            digest = hashlib.sha256(c.get(f"/docs/static/{name}").content).hexdigest()
            assert f"{name} (sha256 {digest})" in version.replace("\n", " "), name
        assert c.get("/redoc").status_code == 404
        assert c.get("/docs/oauth2-redirect").status_code == 404


#: The API alone, as an operator starts it.


def test_the_docs_page_renders_in_a_browser_from_this_origin_alone(tmp_path: Path) -> None:
    """The real service and headless Chromium: `/docs` renders the document's operations,
    every request the page makes goes to the service, and the policy blocks nothing (no
    console error)."""
    from playwright.sync_api import sync_playwright

    from tests.browser.conftest import chromium_path
    from tests.support.procs import terminate_session

    origin, proc = serve(
        tmp_path, "--no-runner", "--database-url", f"sqlite:///{tmp_path / 'd.db'}", timeout_s=60
    )
    try:
        requested: list[str] = []
        problems: list[str] = []
        with sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=chromium_path(), headless=True)
            page = browser.new_page()
            page.on("request", lambda r: requested.append(r.url))
            page.on("console", lambda m: problems.append(m.text) if m.type == "error" else None)
            page.on("pageerror", lambda e: problems.append(str(e)))
            page.on("response", lambda r: problems.append(r.url) if r.status >= 400 else None)
            page.goto(f"{origin}/docs")
            page.wait_for_selector(".opblock", timeout=60_000)
            operations = page.locator(".opblock").count()
            browser.close()
    finally:
        terminate_session(proc, grace=30)
    assert operations >= 13
    assert requested and all(u.startswith(origin) or u.startswith("data:") for u in requested), [
        u for u in requested if not u.startswith(origin)
    ]
    assert problems == []


def test_openapi_documents_the_compare_conflict_and_the_layout_rules(tmp_path: Path) -> None:
    """What the service refuses, the document says: `/compare` and `/landscape` answer 409
    (no shared shape yet; a stored spec this version no longer reads); a searched axis's
    list has at least one value; under `layout: fixed` the cost request's layout-search
    fields (`feasible_layouts`, …) stay at their defaults — and a request the schema says
    so of is refused, one it allows is answered."""
    from nas_service.api.schemas import CostRequest

    with TestClient(_token_app(tmp_path)) as c:
        document = c.get("/openapi.json").json()
        good = {"Authorization": "Bearer s3cret"}
        arch = {"n_layers": 2, "d_model": 64, "n_heads": 1}
        assert c.post("/v1/cost", json={"arch": arch}, headers=good).status_code == 200
        refused = c.post("/v1/cost", json={"arch": arch, "feasible_layouts": 3}, headers=good)
        assert error(refused, 422)["field"] == "feasible_layouts"
    paths = document["paths"]
    error_ref = {"$ref": "#/components/schemas/ErrorBody"}
    for path in ("/v1/jobs/{job_id}/compare", "/v1/jobs/{job_id}/landscape"):
        conflict = paths[path]["get"]["responses"]["409"]
        assert conflict["content"]["application/json"]["schema"] == error_ref
    schemas = document["components"]["schemas"]
    n_layers = schemas["SearchSpace"]["properties"]["n_layers"]
    lists = [o for o in n_layers["oneOf"] if o.get("type") == "array"]
    assert lists == [{"type": "array", "items": {"type": "integer"}, "minItems": 1}]
    cost = schemas["CostRequest"]
    assert cost["if"] == {
        "not": {"required": ["layout"], "properties": {"layout": {"const": "auto"}}}
    }
    fixed = cost["then"]["properties"]
    assert fixed["feasible_layouts"] == {"const": 0}
    assert "layout: auto only" in cost["properties"]["feasible_layouts"]["description"]
    for name, rule in fixed.items():  # each rule is the field's default
        default = CostRequest.model_fields[name].default
        assert rule == ({"type": "null"} if default is None else {"const": default}), name
