"""Candidates priced per second: the scalar path (`price`, one ArchConfig at a time) against
the vectorised path (`price_grid`, one ArchGrid), side by side in one run over the same
10,000-point grid, and `price_many` (arbitrary configs grouped into grids).

    python bench/cost_model.py [--points 10000] [--repeats 5] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from cost_model import ArchConfig, Parallelism, Workload, price, price_grid, price_many

WORKLOAD = Workload(micro_batch=4, seq_len=2048, microbatches=8, prefill_tokens=8192)
PARALLEL = Parallelism(tensor=2, pipeline=4, virtual=2)


def grid_axes(points: int) -> dict[str, np.ndarray]:
    side = round(points**0.5)
    depths = np.arange(1, side + 1)
    widths = 64 * np.arange(1, side + 1)
    n_layers, d_model = (a.reshape(-1) for a in np.meshgrid(depths, widths, indexing="ij"))
    return {"n_layers": n_layers, "d_model": d_model, "n_heads": d_model // 64}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--points", type=int, default=10_000)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--json", type=Path, help="write the results here")
    args = parser.parse_args()

    base = ArchConfig(n_layers=8, d_model=512, n_heads=8, variant="block_attnres", block_size=2)
    axes = grid_axes(args.points)
    n = len(axes["n_layers"])
    configs = [
        base.replace(n_layers=int(lb), d_model=int(d), n_heads=int(h))
        for lb, d, h in zip(axes["n_layers"], axes["d_model"], axes["n_heads"], strict=True)
    ]

    def scalar() -> None:
        for cfg in configs:
            price(cfg, WORKLOAD, PARALLEL, "h100").metrics()

    def vectorised() -> None:
        price_grid(base, WORKLOAD, PARALLEL, "h100", **axes)

    def many() -> None:
        price_many(configs, WORKLOAD, PARALLEL, "h100")

    # the three paths agree before anything is timed
    grid = price_grid(base, WORKLOAD, PARALLEL, "h100", **axes).metrics
    grouped = price_many(configs, WORKLOAD, PARALLEL, "h100")
    probe = price(configs[-1], WORKLOAD, PARALLEL, "h100").metrics()
    for name, value in probe.items():
        assert np.isclose(grid[name][-1], float(value), rtol=1e-12), name
        assert np.isclose(grouped[name][-1], float(value), rtol=1e-12), name

    timings: dict[str, list[float]] = {"scalar": [], "vectorised": [], "price_many": []}
    for _ in range(args.repeats):  # interleaved, so drift hits every path alike
        for name, fn in (("scalar", scalar), ("vectorised", vectorised), ("price_many", many)):
            start = time.perf_counter()
            fn()
            timings[name].append(time.perf_counter() - start)

    rows: list[dict[str, Any]] = []
    for name, runs in timings.items():
        med = statistics.median(runs)
        rows.append({"path": name, "points": n, "median_s": med, "candidates_per_s": n / med})
    scalar_rate = rows[0]["candidates_per_s"]
    print(f"cost model over a {n}-point grid, median of {args.repeats} interleaved runs")
    print(f"{'path':12} {'median s':>10} {'candidates/s':>14} {'vs scalar':>10}")
    for row in rows:
        row["speedup_vs_scalar"] = row["candidates_per_s"] / scalar_rate
        print(
            f"{row['path']:12} {row['median_s']:10.4f} {row['candidates_per_s']:14,.0f} "
            f"{row['speedup_vs_scalar']:9.1f}x"
        )
    if args.json:
        args.json.write_text(json.dumps({"benchmark": "cost_model", "rows": rows}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
