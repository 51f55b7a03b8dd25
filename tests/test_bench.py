"""The benchmarks run and write their JSON (tiny sizes; no timing is asserted)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_cost_model_bench_writes_json(tmp_path: Path) -> None:
    out = tmp_path / "bench.json"
    run = subprocess.run(
        [
            sys.executable,
            "bench/cost_model.py",
            "--points",
            "100",
            "--repeats",
            "1",
            "--json",
            str(out),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 0, run.stderr
    rows = json.loads(out.read_text())["rows"]
    assert [r["path"] for r in rows] == ["scalar", "vectorised", "price_many"]
    assert all(r["points"] == 100 and r["candidates_per_s"] > 0 for r in rows)
    assert "candidates/s" in run.stdout
