"""`layout: auto`: `POST /v1/cost` at the fastest layout on a number of devices (200, and a
422 naming the field for every bad input or when no layout is feasible), and a job whose
objective and constraint are the best layout's metrics, priced through `price_candidate`."""

from __future__ import annotations

from typing import Any

import pytest
from fastapi.testclient import TestClient

from cost_model import (
    LAYOUT_METRICS,
    METRICS,
    ArchConfig,
    LayoutSpace,
    Workload,
    price,
    search_layout,
)
from nas_service.search.pricing import price_candidate
from nas_service.search.study import objective_values
from nas_service.spec import SpecError, parse_spec
from tests.support.api import error

ARCH: dict[str, Any] = {"n_layers": 8, "d_model": 256, "n_heads": 8, "seq_len": 256}
AUTO = {"arch": ARCH, "layout": "auto", "devices": 8, "global_batch": 32}


def test_auto_prices_the_best_layout(client: TestClient) -> None:
    r = client.post("/v1/cost", json=AUTO | {"feasible_layouts": 5, "hardware": "a100"})
    assert r.status_code == 200, r.text
    body = r.json()
    cfg = ArchConfig(**ARCH)
    expected = search_layout(cfg, LayoutSpace(8, 32, max_virtual=4), Workload(), "a100")
    assert expected.best is not None
    best = body["layout"]["best"]
    assert best == expected.best.as_dict()
    assert body["layout"]["feasible_count"] == expected.feasible_count
    assert len(body["layout"]["feasible"]) == 5
    assert body["layout"]["feasible"][0] == best
    times = [row["step_time_s"] for row in body["layout"]["feasible"]]
    assert times == sorted(times)
    assert best["memory_bytes"] <= body["layout"]["memory_cap_bytes"] == 80e9
    assert best["tensor"] * best["pipeline"] * best["data"] == 8
    assert best["data"] * best["micro_batch"] * best["microbatches"] == 32
    # the report is priced at the best layout
    report = price(cfg, expected.best.layout.workload(), expected.best.layout.parallelism(), "a100")
    assert body["cost"]["metrics"]["step_time_s"] == pytest.approx(report.step_time.total_s)
    assert body["cost"]["metrics"]["step_time_s"] == pytest.approx(best["step_time_s"])


def test_auto_defaults_and_the_cap(client: TestClient) -> None:
    plain = client.post("/v1/cost", json={"arch": ARCH, "layout": "auto", "devices": 4}).json()
    best = plain["layout"]["best"]
    # the global batch defaults to 8 sequences per device; no list unless asked
    assert best["data"] * best["micro_batch"] * best["microbatches"] == 32
    assert plain["layout"]["feasible"] == []
    cap = best["memory_bytes"] / 2
    capped = client.post(
        "/v1/cost", json={"arch": ARCH, "layout": "auto", "devices": 4, "memory_cap_bytes": cap}
    )
    assert capped.status_code == 200
    tight = capped.json()["layout"]["best"]
    assert tight["memory_bytes"] <= cap and tight["step_time_s"] >= best["step_time_s"]
    fixed = client.post("/v1/cost", json={"arch": ARCH})
    assert fixed.status_code == 200 and fixed.json()["layout"] is None


def test_no_feasible_layout_is_a_422_naming_why(client: TestClient) -> None:
    tiny = error(client.post("/v1/cost", json=AUTO | {"memory_cap_bytes": 1000}), 422)
    assert tiny["field"] == "memory_cap_bytes"
    assert "over the cap of 1000 bytes" in tiny["message"]
    assert "bytes per device" in tiny["message"]
    odd = {"n_layers": 3, "d_model": 6, "n_heads": 3, "seq_len": 64}
    none = error(
        client.post(
            "/v1/cost", json={"arch": odd, "layout": "auto", "devices": 8, "global_batch": 1}
        ),
        422,
    )
    assert none["field"] == "devices" and "divides the architecture" in none["message"]


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"layout": "best"}, "layout"),
        ({"devices": 0}, "devices"),
        ({"devices": 1 << 17}, "devices"),
        ({"devices": "8"}, "devices"),
        ({"devices": None}, "devices"),
        ({"global_batch": 0}, "global_batch"),
        ({"global_batch": 1.5}, "global_batch"),
        ({"memory_cap_bytes": -1}, "memory_cap_bytes"),
        ({"memory_cap_bytes": 1e30}, "memory_cap_bytes"),
        ({"memory_cap_bytes": "80GB"}, "memory_cap_bytes"),
        ({"max_virtual": 0}, "max_virtual"),
        ({"max_virtual": 65}, "max_virtual"),
        ({"feasible_layouts": -1}, "feasible_layouts"),
        ({"feasible_layouts": 1001}, "feasible_layouts"),
        ({"feasible_layouts": True}, "feasible_layouts"),
        ({"parallelism": {"tensor": 2}}, "parallelism"),
        ({"workload": {"micro_batch": 2}}, "workload.micro_batch"),
        ({"workload": {"recompute": "full"}}, "workload.recompute"),
        ({"workload": {"microbatches": 4}}, "workload.microbatches"),
        ({"workload": {"seq_len": 0}}, "workload.seq_len"),
        ({"hardware": "tpu"}, "hardware"),
        # too many layouts to search: refused before they are all built
        ({"devices": 1 << 16, "global_batch": 1 << 24, "max_virtual": 64}, "devices"),
    ],
)
def test_a_bad_auto_request_is_a_422_naming_the_field(
    client: TestClient, change: dict[str, Any], field: str
) -> None:
    assert error(client.post("/v1/cost", json=AUTO | change), 422)["field"] == field


@pytest.mark.parametrize(
    "field", ["devices", "global_batch", "memory_cap_bytes", "max_virtual", "feasible_layouts"]
)
def test_a_search_field_without_auto_is_a_422(client: TestClient, field: str) -> None:
    refused = error(client.post("/v1/cost", json={"arch": ARCH, field: 2}), 422)
    assert (refused["field"], refused["message"]) == (field, "only with layout: auto")


# -- a job at its candidates' best layouts ------------------------------------------------------
JOB: dict[str, Any] = {
    "name": "layouts",
    "space": {"n_layers": [2, 4, 8], "d_model": [128, 256], "head_dim": 32},
    "budget": {"tokens": 1_000_000},
    "n_trials": 6,
    "training": {"seq_len": 128, "batch_size": 8},
    "objectives": ["val_loss", "best_step_time_s"],
    "cost": {"layout": "auto", "devices": 8, "global_batch": 64, "hardware": "h100"},
}


def test_a_job_prices_each_candidate_at_its_best_layout() -> None:
    spec = parse_spec(JOB)
    priced = price_candidate(spec, {"residual": "baseline", "n_layers": 8, "d_model": 256})
    assert priced.outcome == "train", priced.reason
    assert set(priced.metrics) == set(METRICS) | set(LAYOUT_METRICS)
    cfg = ArchConfig(n_layers=8, d_model=256, n_heads=8, seq_len=128)
    expected = search_layout(cfg, LayoutSpace(8, 64, max_virtual=4), Workload(seq_len=128))
    assert expected.best is not None
    for name, value in expected.metrics().items():
        assert priced.metrics[name] == pytest.approx(value), name
    assert priced.metrics["step_time_s"] == pytest.approx(priced.metrics["best_step_time_s"])
    assert objective_values(spec, 2.5, priced.metrics) == [2.5, expected.best.step_time_s]


def test_a_stored_spec_reads_back() -> None:
    """The service stores `model_dump()` (every field written out) and validates it again."""
    for data in (JOB, JOB | {"cost": {}, "objectives": ["val_loss"]}):
        spec = parse_spec(data)
        assert parse_spec(spec.model_dump()) == spec


def test_a_constraint_on_the_best_layout_is_applied() -> None:
    params = {"residual": "baseline", "n_layers": 8, "d_model": 256}
    free = price_candidate(parse_spec(JOB), params)
    best_time = free.metrics["best_step_time_s"]
    capped = JOB | {"constraints": [{"metric": "best_step_time_s", "max": best_time / 2}]}
    over = price_candidate(parse_spec(capped), params)
    assert over.outcome == "over_constraint" and over.reason.startswith("best_step_time_s = ")
    roomy = JOB | {"constraints": [{"metric": "best_layout_memory_bytes", "max": 80e9}]}
    assert price_candidate(parse_spec(roomy), params).outcome == "train"
    fits_on_one = JOB | {"constraints": [{"metric": "best_layout_tensor", "max": 1}]}
    one = price_candidate(parse_spec(fits_on_one), params)
    assert (one.outcome == "train") == (free.metrics["best_layout_tensor"] <= 1)


def test_a_candidate_without_a_feasible_layout_is_infeasible() -> None:
    tiny = JOB | {"cost": JOB["cost"] | {"memory_cap_bytes": 1000}}
    priced = price_candidate(
        parse_spec(tiny), {"residual": "baseline", "n_layers": 2, "d_model": 128}
    )
    assert priced.outcome == "infeasible" and priced.train_spec is None
    assert priced.reason.startswith("no parallel layout: no layout fits the memory cap")
    assert priced.metrics == {}


@pytest.mark.parametrize(
    ("change", "field", "fragment"),
    [
        ({"cost": {"layout": "auto"}}, "cost.devices", "needs the number of devices"),
        ({"cost": {"layout": "auto", "devices": 8, "tensor": 2}}, "cost.tensor", "searches it"),
        (
            {"cost": {"layout": "auto", "devices": 8, "micro_batch": 2}},
            "cost.micro_batch",
            "searches it",
        ),
        ({"cost": {"devices": 8}}, "cost.devices", "only with layout: auto"),
        ({"cost": {"memory_cap_bytes": 1e9}}, "cost.memory_cap_bytes", "only with layout: auto"),
        ({"cost": {"layout": "auto", "devices": 1 << 20}}, "cost.devices", "less than or equal"),
        (
            {"cost": {"layout": "auto", "devices": 4096, "global_batch": 1 << 20}},
            "cost.devices",
            "more than 5000 layouts",
        ),
        (
            {"cost": {"layout": "auto", "devices": 8, "memory_cap_bytes": -1}},
            "cost.memory_cap_bytes",
            "greater than 0",
        ),
        ({"cost": {"layout": "auto", "devices": 8, "max_virtual": 0}}, "cost.max_virtual", ""),
        (
            {"cost": {"hardware": "h100"}, "objectives": ["best_step_time_s"]},
            "objectives",
            "needs cost.layout: auto",
        ),
        (
            {
                "cost": {},
                "objectives": ["val_loss"],
                "constraints": [{"metric": "best_layout_memory_bytes", "max": 1}],
            },
            "constraints.0.metric",
            "needs cost.layout: auto",
        ),
        ({"objectives": ["best_layout_colour"]}, "objectives", "unknown metric"),
    ],
)
def test_a_bad_layout_spec_is_refused_naming_the_field(
    change: dict[str, Any], field: str, fragment: str
) -> None:
    with pytest.raises(SpecError) as info:
        parse_spec(JOB | change)
    assert info.value.field == field, info.value.errors
    assert fragment in info.value.reason


@pytest.mark.parametrize("layout", [{}, {"layout": "auto", "devices": 2}])
@pytest.mark.parametrize(
    ("workload", "field"),
    [
        ({"prefill_tokens": 17}, "workload.prefill_tokens"),
        ({"decode_context": 32}, "workload.decode_context"),
        ({"seq_len": 17}, "workload.seq_len"),
    ],
)
def test_a_length_past_learned_positions_is_a_422_naming_the_workload_field(
    client: TestClient, layout: dict[str, Any], workload: dict[str, int], field: str
) -> None:
    """A learned position table of seq_len = 16 runs no longer prefill, decode context or
    training sequence, with either layout; the error names the request's field."""
    learned = {"n_layers": 2, "d_model": 64, "n_heads": 4, "seq_len": 16, "positions": "learned"}
    refused = error(
        client.post("/v1/cost", json={"arch": learned, "workload": workload} | layout), 422
    )
    assert refused["field"] == field
    assert "seq_len = 16" in refused["message"] and "learned positions" in refused["message"]
    rope = learned | {"positions": "rope"}
    ok = client.post("/v1/cost", json={"arch": rope, "workload": workload} | layout)
    assert ok.status_code == 200, ok.text
