"""The dashboard's page and reads, in-process (no browser): the page and its files at / with
their security headers, the YAML parse, the catalogue, a job's trials as columns, the sorted
and filtered table, one trial with its curve; bad input is a 4xx naming the field."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import optuna
import pytest
from fastapi.testclient import TestClient

from nas_service.api.app import create_app
from nas_service.settings import get_settings
from nas_service.spec import parse_spec
from nas_service.store.jobs import optuna_storage
from tests.support.api import SPEC, _synthetic, error

TOKEN = "dash-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
BIG = SPEC | {"objectives": ["val_loss", "train_memory_bytes"], "n_trials": 40}


@pytest.fixture
def client(tmp_path: Path) -> Iterator[TestClient]:
    url = f"sqlite:///{tmp_path / 'dash.db'}"
    with TestClient(create_app(get_settings(database_url=url, api_token=TOKEN))) as c:
        yield c


@pytest.fixture
def stored(client: TestClient) -> tuple[str, int]:
    """A job with 120 synthetic trials (bench/support.py), no training."""
    job = client.post("/v1/jobs", json=BIG, headers=AUTH).json()
    url = str(client.app.state.settings.database_url)  # type: ignore[attr-defined]
    study = optuna.load_study(study_name=job["study_name"], storage=optuna_storage(url))
    support = _synthetic()
    trials = support.synthetic_trials(parse_spec(BIG), 120)  # type: ignore[attr-defined]
    support.store_trials(study, trials)  # type: ignore[attr-defined]
    return job["id"], 120


def test_the_page_and_its_files_are_served_without_a_token(client: TestClient) -> None:
    page = client.get("/")
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    csp = page.headers["content-security-policy"]
    assert "default-src 'self'" in csp and "script-src 'self'" in csp
    assert 'src="/dashboard/static/app.js"' in page.text
    assert '<body data-auth="token">' in page.text  # the page asks for the token first
    assert "/dashboard/static/vendor/echarts/echarts.common.min.js" in page.text
    modules = ("app.js", "dom.js", "names.js", "jobs.js", "job.js", "trial.js", "cost.js")
    for name in (*modules, "style.css", "vendor/echarts/echarts.common.min.js"):
        r = client.get(f"/dashboard/static/{name}")
        assert r.status_code == 200 and len(r.content) > 100, name
    assert "http://" not in page.text and "https://" not in page.text  # nothing from a CDN
    assert error(client.get("/dashboard/static/nothing.js"), 404)
    assert error(client.post("/"), 405)
    # the API itself still asks for the token, and the page is not in the OpenAPI document
    assert error(client.get("/v1/catalogue"), 401)["field"] == "authorization"
    assert "/" not in client.get("/openapi.json", headers=AUTH).json()["paths"]


def test_without_a_token_configured_the_page_asks_for_none(tmp_path: Path) -> None:
    app = create_app(get_settings(database_url=f"sqlite:///{tmp_path / 'open.db'}"))
    with TestClient(app) as c:
        assert '<body data-auth="">' in c.get("/").text
        assert c.get("/v1/catalogue").status_code == 200


def test_yaml_text_parses_into_the_json_that_post_jobs_validates(client: TestClient) -> None:
    text = (Path(__file__).resolve().parents[2] / "examples" / "quick.yaml").read_text()
    parsed = client.post("/v1/specs/parse", json={"text": text}, headers=AUTH).json()
    assert parsed["errors"] == [] and parsed["spec"]["name"] == "quick-baseline-vs-block"
    parse_spec(parsed["spec"])
    # exponent numbers without a dot are floats, as in spec files
    one = client.post("/v1/specs/parse", json={"text": "budget: {flops: 4e11}"}, headers=AUTH)
    assert one.json()["spec"] == {"budget": {"flops": 4e11}}


@pytest.mark.parametrize(
    ("text", "field", "words"),
    [
        ("name: [unclosed", "text", "not valid YAML"),
        ("- a\n- b\n", "text", "mapping"),
        ("", "text", "nothing"),
        ("a: &x 1\nb: *x\n", "text", "anchors"),
        ("budget: {flops: .nan}", "budget.flops", "finite"),
        ("n_trials: 99999999999999999999999", "n_trials", "64-bit"),
        ("space: {1: 2}", "space", "not a string"),
        ("when: !!binary aGVsbG8=", "when", "not JSON"),
        ("name: bell\x07", "text", "not valid YAML"),  # a control character YAML refuses
    ],
)
def test_text_that_is_no_json_mapping_is_answered_with_the_field(
    client: TestClient, text: str, field: str, words: str
) -> None:
    r = client.post("/v1/specs/parse", json={"text": text}, headers=AUTH)
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["spec"] is None
    assert body["errors"][0]["field"] == field and words in body["errors"][0]["message"]


def test_a_malformed_parse_request_is_a_422_naming_the_field(client: TestClient) -> None:
    assert error(client.post("/v1/specs/parse", json={}, headers=AUTH), 422)["field"] == "text"
    bad = client.post("/v1/specs/parse", json={"text": 3}, headers=AUTH)
    assert error(bad, 422)["field"] == "text"
    extra = client.post("/v1/specs/parse", json={"text": "a: 1", "x": 1}, headers=AUTH)
    assert error(extra, 422)["field"] == "x"


def test_the_parse_request_documents_the_nul_it_refuses(client: TestClient) -> None:
    """Every request body refuses a NUL character (no database stores one); the parse's only
    field says so in its schema, so a schema-valid text is never refused (the fuzz test's
    positive data holds)."""
    import re

    doc = client.get("/openapi.json", headers=AUTH).json()
    pattern = doc["components"]["schemas"]["SpecText"]["properties"]["text"]["pattern"]
    assert re.search(pattern, "name: x\n\u00e9\u0090\u0012") and not re.search(pattern, "f\u0000")
    nul = client.post("/v1/specs/parse", json={"text": "name: a\u0000b"}, headers=AUTH)
    assert error(nul, 422)["field"] == "text" and "NUL" in nul.json()["error"]["message"]


def test_the_catalogue_names_every_metric_with_its_unit(client: TestClient) -> None:
    from cost_model import METRICS

    body = client.get("/v1/catalogue", headers=AUTH).json()
    assert set(body["metrics"]) == {"val_loss", "val_bpb", *METRICS}
    assert body["metrics"]["train_memory_bytes"]["unit"] == "bytes"
    assert body["metrics"]["val_bpb"]["unit"] == "bits/byte"
    assert "baseline" in body["variants"] and "h100" in body["hardware"]


def test_the_catalogue_says_how_variants_are_labelled(client: TestClient) -> None:
    """The fields each variant takes and the residual codec's parts, as the dashboard reads
    them: a label written from the parts is the one the service's codec writes."""
    from cost_model.residuals import BLOCK_SIZED, STREAMED
    from nas_service.spec import decode_residual, encode_residual

    body = client.get("/v1/catalogue", headers=AUTH).json()
    fields = body["variant_fields"]
    assert list(fields) == body["variants"]
    for variant, taken in fields.items():
        assert ("block_size" in taken) == (variant in BLOCK_SIZED)
        assert ("mhc_streams" in taken) == (variant in STREAMED)
    assert fields["baseline"] == [] and fields["block_attnres"] == ["block_size"]
    codec = body["residual_codec"]
    (part,) = codec["parts"]
    assert part == {
        "tag": "S",
        "field": "block_size",
        "space_field": "block_sizes",
        "variants": sorted(BLOCK_SIZED),
    }
    for variant in part["variants"]:
        written = f"{variant}{codec['separator']}{part['tag']}{codec['assign']}4"
        assert written == encode_residual(variant, {"block_size": 4})
        assert decode_residual(written)[part["field"]] == 4


def test_points_are_every_trial_as_columns(client: TestClient, stored: tuple[str, int]) -> None:
    job, n = stored
    body = client.get(f"/v1/jobs/{job}/points", headers=AUTH).json()
    assert body["total"] == n == len(body["number"]) == len(body["variant"]) == len(body["ratio"])
    assert set(body["metrics"]) == {"val_loss", "train_memory_bytes"}
    assert all(len(v) == n for v in body["metrics"].values())
    i = body["number"].index(7)
    trial = client.get(f"/v1/jobs/{job}/trials/7", headers=AUTH).json()
    assert body["metrics"]["val_loss"][i] == pytest.approx(trial["metrics"]["val_loss"])
    assert body["d_model"][i] == trial["arch"]["d_model"]
    assert body["ratio"][i] == pytest.approx(trial["arch"]["d_model"] / trial["arch"]["n_layers"])
    # the profile: one point per architecture, its best mean loss
    assert 0 < len(body["profile_trials"]) == len(body["profile_loss"]) <= n
    chosen = client.get(f"/v1/jobs/{job}/points?metrics=params, val_loss", headers=AUTH).json()
    assert list(chosen["metrics"]) == ["params", "val_loss"]
    bad = client.get(f"/v1/jobs/{job}/points?metrics=val_loss,colour", headers=AUTH)
    assert error(bad, 422)["field"] == "metrics"
    assert error(client.get("/v1/jobs/nope/points", headers=AUTH), 404)["field"] == "job_id"


def _rows(client: TestClient, job: str, **params: Any) -> dict[str, Any]:
    r = client.get(f"/v1/jobs/{job}/table", params=params, headers=AUTH)
    assert r.status_code == 200, r.text
    return dict(r.json())


def test_the_table_sorts_filters_and_pages(client: TestClient, stored: tuple[str, int]) -> None:
    job, n = stored
    first = _rows(client, job, limit=10)
    assert first["total"] == n and [t["number"] for t in first["items"]] == list(range(10))
    by_loss = _rows(client, job, sort="val_loss", limit=1000)["items"]
    losses = [t["metrics"].get("val_loss") for t in by_loss]
    known = [v for v in losses if v is not None]
    assert known == sorted(known) and losses[: len(known)] == known  # missing ones last
    down = _rows(client, job, sort="val_loss", descending=True, limit=1000)["items"]
    assert [t["metrics"].get("val_loss") for t in down][: len(known)] == sorted(known)[::-1]
    some = by_loss[0]
    shape = _rows(client, job, n_layers=some["arch"]["n_layers"], d_model=some["arch"]["d_model"])
    assert shape["total"] >= 1
    assert all(t["arch"]["d_model"] == some["arch"]["d_model"] for t in shape["items"])
    base = _rows(client, job, variant="baseline", limit=1000)
    assert base["total"] >= 1 and {t["variant"] for t in base["items"]} == {"baseline"}
    labelled = _rows(client, job, variant="block_attnres/S=1", limit=1000)
    assert labelled["total"] + base["total"] == n
    page = _rows(client, job, sort="d_model", offset=n - 5, limit=10)
    assert len(page["items"]) == 5
    for params, field in (
        ({"sort": "colour"}, "sort"),
        ({"state": "asleep"}, "state"),
        ({"variant": "Baseline!"}, "variant"),
        ({"limit": 0}, "limit"),
        ({"n_layers": 0}, "n_layers"),
    ):
        r = client.get(f"/v1/jobs/{job}/table", params=params, headers=AUTH)
        assert error(r, 422)["field"] == field, params


def test_one_trial_with_its_curve(client: TestClient, stored: tuple[str, int]) -> None:
    job, _ = stored
    one = client.get(f"/v1/jobs/{job}/trials/3", headers=AUTH).json()
    assert one["number"] == 3 and one["curve"] is not None
    bare = client.get(f"/v1/jobs/{job}/trials/3?curve=false", headers=AUTH).json()
    assert bare["curve"] is None
    assert error(client.get(f"/v1/jobs/{job}/trials/100000", headers=AUTH), 404)["field"] == (
        "number"
    )
    assert error(client.get(f"/v1/jobs/{job}/trials/-1", headers=AUTH), 422)["field"] == "number"
