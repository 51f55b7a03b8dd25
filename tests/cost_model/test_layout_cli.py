"""`depthscope cost --layout auto` as a user runs it: a real process printing each variant's
fastest layout (what `cost_model.search_layout` finds), the feasible list on request, and its
refusals naming the flag."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys

import pytest

from cost_model import ArchConfig, LayoutSpace, Workload, price, search_layout
from nas_service.cli.local import _byte_size

ARCH = ("--n-layers", "8", "--d-model", "256", "--n-heads", "8", "--seq-len", "256")


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "nas_service.cli", "cost", *args],
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_json_gives_the_library_s_best_layout_and_the_report_at_it() -> None:
    out = run(*ARCH, "--layout", "auto", "--devices", "8", "--global-batch", "32", "--json")
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    cfg = ArchConfig(n_layers=8, d_model=256, n_heads=8, seq_len=256)
    found = search_layout(cfg, LayoutSpace(8, 32, max_virtual=4), Workload(seq_len=256))
    assert found.best is not None
    assert data["layout"]["best"] == found.best.as_dict()
    assert data["layout"]["feasible"] == []  # listed only with --all-layouts
    lay = found.best.layout
    report = price(cfg, lay.workload(Workload(seq_len=256)), lay.parallelism())
    assert data["cost"]["metrics"]["train_memory_bytes"] == pytest.approx(
        float(report.training_memory.total_bytes)
    )


def test_the_table_prints_each_variant_s_layout_and_every_feasible_one() -> None:
    out = run(
        *ARCH,
        "--variant",
        "baseline,block_attnres",
        "--block-size",
        "4",
        "--layout",
        "auto",
        "--devices",
        "4",
        "--memory-cap",
        "0.5GiB",
        "--max-virtual",
        "2",
        "--all-layouts",
    )
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert "devices=4, each variant at its fastest layout" in lines[0]
    heads = [line for line in lines if line.startswith("best layout (")]
    assert [h.split(")")[0] for h in heads] == [
        "best layout (baseline",
        "best layout (block_attnres",
    ]
    cfg = ArchConfig(n_layers=8, d_model=256, n_heads=8, seq_len=256)
    found = search_layout(
        cfg, LayoutSpace(4, 32, max_virtual=2), Workload(seq_len=256), "h100", 0.5 * 2**30
    )
    assert f"{found.feasible_count} of {found.enumerated} layouts feasible" in heads[0]
    assert "(cap 512 MiB)" in heads[0]
    rows = [line for line in lines if line.startswith("  TP=")]
    assert len(rows) >= found.feasible_count  # both variants' lists
    assert "step_time_s" in out.stdout  # the metrics table follows


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (("--devices", "8"), "--devices: only with --layout auto"),
        (("--memory-cap", "80GB"), "--memory-cap: only with --layout auto"),
        (("--all-layouts",), "--all-layouts: only with --layout auto"),
        (("--layout", "auto"), "--devices: --layout auto needs the number of devices"),
        (("--layout", "auto", "--devices", "8", "--tp", "2"), "--tp: --layout auto searches it"),
        (
            ("--layout", "auto", "--devices", "8", "--micro-batch", "2"),
            "--micro-batch: --layout auto searches it",
        ),
        (
            ("--layout", "auto", "--devices", "8", "--memory-cap", "1KB"),
            "--memory-cap: baseline: no layout fits the memory cap",
        ),
        (("--layout", "auto", "--devices", "0"), "--devices: must be positive"),
        (("--layout", "auto", "--devices", "8", "--memory-cap", "lots"), "not a size: 'lots'"),
        (("--layout", "best"), "invalid choice: 'best'"),
    ],
)
def test_a_bad_flag_is_refused_naming_it(args: tuple[str, ...], fragment: str) -> None:
    out = run(*ARCH, *args)
    assert out.returncode == 2
    assert fragment in out.stderr, out.stderr
    assert "Traceback" not in out.stderr


def test_memory_sizes_take_decimal_and_binary_units() -> None:
    assert _byte_size("80GB") == 80e9
    assert _byte_size("75 GiB") == 75 * 2**30
    assert _byte_size("1e9") == 1e9
    assert _byte_size("512kib") == 512 * 1024
    for bad in ("", "GB", "-1GB", "0", "inf", "nan", "12 parsecs"):
        with pytest.raises(argparse.ArgumentTypeError):
            _byte_size(bad)
