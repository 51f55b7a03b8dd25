"""A user's own cluster: described in a job spec's `cost.cluster` and with the `depthscope
cost` flags, priced on its networks, and every bad value refused naming the field (the spec's
`SpecError`, a 422 at the API; exit 2 from the command line)."""

from __future__ import annotations

import copy
import json
import math
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from cost_model import ArchConfig, LayoutSpace, Workload, get_hardware, price, search_layout
from nas_service.search.pricing import price_candidate
from nas_service.spec import SpecError, parse_spec
from tests.support.api import error

CLUSTER = {
    "devices_per_node": 4,
    "intra_node_bandwidth": 100e9,
    "inter_node_bandwidth": 12.5e9,
    "inter_node_latency_s": 1e-5,
    "nodes": 4,
}
JOB: dict[str, Any] = {
    "name": "own-cluster",
    "space": {"n_layers": [2, 4, 8], "d_model": [128, 256], "head_dim": 32},
    "budget": {"tokens": 1_000_000},
    "n_trials": 6,
    "training": {"seq_len": 128, "batch_size": 8},
    "objectives": ["val_loss", "best_step_time_s"],
    "cost": {
        "layout": "auto",
        "devices": 8,
        "global_batch": 64,
        "hardware": "h100",
        "cluster": CLUSTER,
    },
}


def _with(cost: dict[str, Any]) -> dict[str, Any]:
    job = copy.deepcopy(JOB)
    job["cost"] = cost
    if cost.get("layout") != "auto":
        job["objectives"] = ["val_loss", "step_time_s"]
    return job


def test_a_spec_describes_its_cluster_and_the_job_is_priced_on_it() -> None:
    spec = parse_spec(JOB)
    hw = spec.cost.hardware_model()
    assert hw.devices_per_node == 4 and hw.peak("bfloat16") == 989e12
    assert hw.network_for(4) == (100e9, 0.0)
    assert hw.network_for(8) == (12.5e9, 1e-5)
    assert hw.compute_efficiency == get_hardware("h100").compute_efficiency
    priced = price_candidate(spec, {"residual": "baseline", "n_layers": 8, "d_model": 256})
    cfg = ArchConfig(n_layers=8, d_model=256, n_heads=8, seq_len=128)
    expected = search_layout(cfg, LayoutSpace(8, 64, max_virtual=4), Workload(seq_len=128), hw)
    assert expected.best is not None
    assert priced.metrics["best_step_time_s"] == pytest.approx(expected.best.step_time_s)
    # the same job on the preset's DGX H100 (8 per node, NVLink between all 8) is faster
    preset = search_layout(cfg, LayoutSpace(8, 64, max_virtual=4), Workload(seq_len=128), "h100")
    assert preset.best is not None and preset.best.step_time_s < expected.best.step_time_s
    # a fixed layout is priced on the cluster too
    fixed = parse_spec(_with({"hardware": "h100", "tensor": 8, "cluster": CLUSTER}))
    priced = price_candidate(fixed, {"residual": "baseline", "n_layers": 8, "d_model": 256})
    report = price(cfg, fixed.cost.workload(fixed.training), fixed.cost.parallelism(), hw)
    assert priced.metrics["step_time_s"] == pytest.approx(float(report.step_time.total_s))


def _cluster(**changes: Any) -> dict[str, Any]:
    return CLUSTER | changes


@pytest.mark.parametrize(
    ("cost", "field"),
    [
        # a node size that does not divide the devices (auto)
        ({**JOB["cost"], "cluster": _cluster(devices_per_node=3)}, "cost.cluster.devices_per_node"),
        # the preset's node (8) against 12 devices
        ({"layout": "auto", "devices": 12, "hardware": "h100"}, "cost.devices"),
        # more devices than the cluster has
        ({**JOB["cost"], "devices": 32}, "cost.devices"),
        # a tensor group larger than the cluster (fixed layout)
        ({"hardware": "h100", "tensor": 32, "cluster": CLUSTER}, "cost.tensor"),
        ({"hardware": "h100", "tensor": 8, "pipeline": 4, "cluster": CLUSTER}, "cost.pipeline"),
        # bandwidths: non-positive, non-finite, not numbers
        (
            {**JOB["cost"], "cluster": _cluster(inter_node_bandwidth=0)},
            "cost.cluster.inter_node_bandwidth",
        ),
        (
            {**JOB["cost"], "cluster": _cluster(intra_node_bandwidth=-1e9)},
            "cost.cluster.intra_node_bandwidth",
        ),
        (
            {**JOB["cost"], "cluster": _cluster(intra_node_bandwidth=math.inf)},
            "cost.cluster.intra_node_bandwidth",
        ),
        (
            {**JOB["cost"], "cluster": _cluster(inter_node_bandwidth=math.nan)},
            "cost.cluster.inter_node_bandwidth",
        ),
        (
            {**JOB["cost"], "cluster": _cluster(inter_node_bandwidth="fast")},
            "cost.cluster.inter_node_bandwidth",
        ),
        (
            {**JOB["cost"], "cluster": _cluster(inter_node_latency_s=-1)},
            "cost.cluster.inter_node_latency_s",
        ),
        ({**JOB["cost"], "cluster": _cluster(devices_per_node=0)}, "cost.cluster.devices_per_node"),
        (
            {**JOB["cost"], "cluster": _cluster(compute_efficiency=1.2)},
            "cost.cluster.compute_efficiency",
        ),
        ({**JOB["cost"], "cluster": _cluster(nodes=0)}, "cost.cluster.nodes"),
        ({**JOB["cost"], "cluster": _cluster(speed=1)}, "cost.cluster.speed"),
        ({**JOB["cost"], "cluster": {"devices_per_node": 8}}, "cost.cluster.intra_node_bandwidth"),
    ],
)
def test_a_bad_cluster_in_a_spec_is_refused_naming_the_field(
    cost: dict[str, Any], field: str
) -> None:
    with pytest.raises(SpecError) as info:
        parse_spec(_with(cost))
    assert field in [f for f, _ in info.value.errors], info.value.errors


ARCH = ("--n-layers", "8", "--d-model", "256", "--n-heads", "8", "--seq-len", "256")


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "nas_service.cli", "cost", *ARCH, *args],
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_the_cli_prices_the_described_cluster() -> None:
    flags = (
        "--hardware", "h100", "--devices-per-node", "4", "--intra-node-bandwidth", "100e9",
        "--inter-node-bandwidth", "12.5e9", "--inter-node-latency", "1e-5",
    )  # fmt: skip
    out = run(*flags, "--layout", "auto", "--devices", "8", "--global-batch", "32", "--json")
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    hw = get_hardware("h100").replace(
        devices_per_node=4,
        link_bandwidth=100e9,
        inter_node_bandwidth=12.5e9,
        inter_node_latency_s=1e-5,
    )
    cfg = ArchConfig(n_layers=8, d_model=256, n_heads=8, seq_len=256)
    found = search_layout(cfg, LayoutSpace(8, 32, max_virtual=4), Workload(seq_len=256), hw)
    assert found.best is not None
    assert data["layout"]["best"] == found.best.as_dict()
    assert data["cost"]["device"]["networks"][1]["bandwidth"] == 12.5e9
    assert data["cost"]["device"]["datasheet_peak_flops"] == 67e12  # float32
    table = run("--hardware", "a100", "--tp", "2")
    assert table.returncode == 0, table.stderr
    assert "datasheet" in table.stdout and "achievable (0.54)" in table.stdout
    assert "mfu (of datasheet peak)" in table.stdout


@pytest.mark.parametrize(
    ("args", "flag"),
    [
        (("--devices-per-node", "6", "--layout", "auto", "--devices", "8"), "--devices"),
        (("--layout", "auto", "--devices", "12"), "--devices"),
        (("--nodes", "2", "--layout", "auto", "--devices", "32"), "--devices"),
        (("--nodes", "1", "--tp", "16"), "--tp"),
        (("--inter-node-bandwidth", "-5"), "--inter-node-bandwidth"),
        (("--intra-node-bandwidth", "0"), "--intra-node-bandwidth"),
        (("--inter-node-bandwidth", "nan"), "--inter-node-bandwidth"),
        (("--inter-node-bandwidth", "inf"), "--inter-node-bandwidth"),
        (("--compute-efficiency", "1.5"), "--compute-efficiency"),
        (("--hardware", "cpu", "--devices-per-node", "4"), "--inter-node-bandwidth"),
    ],
)
def test_a_bad_cluster_flag_exits_2_naming_it(args: tuple[str, ...], flag: str) -> None:
    base = ("--hardware", "a100")
    out = run(*base, *args)
    assert out.returncode == 2
    assert flag in out.stderr, out.stderr


@pytest.fixture
def client(tmp_path: Path) -> Iterator[TestClient]:
    """The app in process on a fresh SQLite file (no runner, no Ray)."""
    from nas_service.api.app import create_app
    from nas_service.settings import get_settings

    app = create_app(get_settings(database_url=f"sqlite:///{tmp_path / 'api.db'}", max_trials=50))
    with TestClient(app) as c:
        yield c


def test_the_api_refuses_a_bad_cluster_with_a_422_and_stores_nothing(client: TestClient) -> None:
    arch = {"n_layers": 8, "d_model": 256, "n_heads": 8, "seq_len": 256}
    auto = {"arch": arch, "layout": "auto", "global_batch": 48, "hardware": "a100"}
    refused = error(client.post("/v1/cost", json=auto | {"devices": 12}), 422)
    assert refused["field"] == "devices" and "nodes of 8 devices" in refused["message"]
    assert client.post("/v1/cost", json=auto | {"devices": 16}).status_code == 200
    bad = _with({**JOB["cost"], "cluster": _cluster(devices_per_node=3)})
    refused = error(client.post("/v1/jobs", json=bad), 422)
    assert refused["field"] == "cost.cluster.devices_per_node"
    bad = _with({**JOB["cost"], "cluster": _cluster(inter_node_bandwidth=-1.0)})
    assert error(client.post("/v1/jobs", json=bad), 422)["field"] == (
        "cost.cluster.inter_node_bandwidth"
    )
    assert client.get("/v1/jobs").json()["total"] == 0
    assert client.post("/v1/jobs", json=JOB).status_code == 201
