"""Candidates priced per second: the scalar path (`price`, one ArchConfig at a time) against
the vectorised path (`price_grid`, one ArchGrid), side by side in one run over the same
10,000-point grid, and `price_many` (arbitrary configs grouped into grids).

Then the layout search (`cost_model.layout`): candidates per second at their best layout on
`--devices` devices (global batch `--global-batch` sequences, up to `--max-virtual` virtual
stages, the H100's 80 GB per device) over the same grid in bfloat16 at seq_len 2048, the
vectorised search (`search_layout_grid`, the whole grid through each layout) against the
scalar one (`search_layout`, one candidate at a time) on an evenly spread subset of
`--scalar-subset` candidates, whose best layouts must agree before anything is timed.

With `--against DIR` (a checkout of another commit, e.g. `git worktree add /tmp/base c911590`),
the layout search side by side in one run: `--rounds` rounds, each timing this tree's
search and then the other's (the same code below run in a subprocess that imports the other
tree's `cost_model`), and the medians per candidate and their ratio. `--layout-only` skips
the pricing paths.

With `--job N`, a job-shaped measurement: a `cost.layout: auto` job of N candidates (four
variants, Block AttnRes at S = 2 and 4; depths 1-50, widths multiples of 64, seq_len 2048)
primed as the runner primes it (`nas_service.search.pricing.prime_layouts`: enumerated, searched
with `best_layouts`, priced per chosen layout), against the one-candidate path
(`price_candidate` unprimed, `--scalar-subset` candidates, extrapolated), whose answers must
be equal first. `--job-only` skips everything else.

    python bench/cost_model.py [--points 10000] [--repeats 5] [--devices 64]
        [--global-batch 512] [--max-virtual 4] [--scalar-subset 20] [--job N] [--job-only]
        [--layout-only] [--against DIR --rounds 3] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

# the tree whose `cost_model` is measured: this one, or `--against`'s (set for the subprocess)
sys.path.insert(
    0, os.environ.get("DEPTHSCOPE_BENCH_TREE") or str(Path(__file__).resolve().parents[1])
)

from cost_model import (
    LAYOUT_METRICS,
    ArchConfig,
    ArchGrid,
    LayoutSpace,
    Parallelism,
    Workload,
    price,
    price_grid,
    price_many,
    search_layout,
    search_layout_grid,
)

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
    parser.add_argument("--devices", type=int, default=64, help="devices of the layout search")
    parser.add_argument("--global-batch", type=int, default=512, help="sequences per step")
    parser.add_argument("--max-virtual", type=int, default=4, help="virtual stages tried")
    parser.add_argument("--scalar-subset", type=int, default=20, help="candidates, scalar path")
    parser.add_argument("--job", type=int, default=0, help="candidates of a primed job")
    parser.add_argument("--job-only", action="store_true", help="only the --job measurement")
    parser.add_argument("--layout-only", action="store_true", help="only the layout search")
    parser.add_argument("--against", type=Path, help="another checkout to compare the search to")
    parser.add_argument("--rounds", type=int, default=3, help="rounds of the side by side")
    parser.add_argument("--json", type=Path, help="write the results here")
    args = parser.parse_args()
    if args.against:
        side = side_by_side(args)
        if args.json:
            args.json.write_text(json.dumps({"benchmark": "cost_model", "against": side}, indent=2))
        return 0
    if args.layout_only:
        layout = layout_search(args)
        if args.json:
            args.json.write_text(json.dumps({"benchmark": "cost_model", "layout_search": layout}))
        return 0
    if args.job_only:
        job = job_priming(args)
        if args.json:
            args.json.write_text(json.dumps({"benchmark": "cost_model", "job": job}, indent=2))
        return 0

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
    layout = layout_search(args)
    primed = job_priming(args) if args.job else None
    if args.json:
        out: dict[str, Any] = {"benchmark": "cost_model", "rows": rows, "layout_search": layout}
        if primed is not None:
            out["job"] = primed
        args.json.write_text(json.dumps(out, indent=2))
    return 0


def job_spec(args: argparse.Namespace) -> dict[str, Any]:
    """A `cost.layout: auto` job of about `args.job` candidates (see the module docstring)."""
    depths = min(50, max(1, args.job // 5))
    widths = max(1, round(args.job / (5 * depths)))
    return {
        "name": "primed",
        "space": {
            "n_layers": {"low": 1, "high": depths},
            "d_model": {"low": 64, "high": 64 * widths, "step": 64},
            "variants": ["baseline", "full_attnres", "mhc_lite", "block_attnres"],
            "block_sizes": [2, 4],
        },
        "budget": {"tokens": 1_000_000_000},
        "n_trials": max(1, args.job),
        "training": {"seq_len": 2048, "batch_size": 8},
        "objectives": ["val_loss", "best_step_time_s"],
        "cost": {
            "layout": "auto",
            "devices": args.devices,
            "global_batch": args.global_batch,
            "max_virtual": args.max_virtual,
            "hardware": "h100",
        },
    }


def job_priming(args: argparse.Namespace) -> dict[str, Any]:
    """A job's space primed in one pass against the one-candidate path; prints a line."""
    from nas_service.search.pricing import price_candidate, prime_layouts
    from nas_service.spec import CandidateSpace, enumerate_candidates, parse_spec

    data = job_spec(args)
    spec = parse_spec(data)
    candidates = [CandidateSpace.to_study(c.params) for c in enumerate_candidates(spec)]
    start = time.perf_counter()
    layouts = prime_layouts(spec, None, searches_per_group=0)
    prime_s = time.perf_counter() - start
    primed = len(layouts)
    assert primed > 0
    start = time.perf_counter()
    answers = [price_candidate(spec, params, layouts=layouts) for params in candidates]
    read_s = time.perf_counter() - start
    subset = np.unique(
        np.linspace(0, len(candidates) - 1, min(args.scalar_subset, len(candidates)))
        .round()
        .astype(int)
    )
    start = time.perf_counter()
    one = [price_candidate(spec, candidates[i]) for i in subset]
    one_s = time.perf_counter() - start
    for i, other in zip(subset, one, strict=True):  # the two paths answer alike
        mine = answers[i]
        assert (mine.outcome, mine.reason) == (other.outcome, other.reason), i
        assert list(mine.metrics.items()) == list(other.metrics.items()), i
    one_rate = len(subset) / one_s
    row = {
        "candidates": len(candidates),
        "architectures": primed,
        "layouts": len(spec.cost.layout_space().layouts()),
        "devices": args.devices,
        "prime_s": prime_s,
        "read_s": read_s,
        "one_candidate_per_s": one_rate,
        "one_candidate_all_s": primed / one_rate,
    }
    print(
        f"\njob: {row['candidates']} candidates ({primed} architectures, 4 variants) on "
        f"{args.devices} devices, {row['layouts']} layouts each: primed in {prime_s:.1f} s, "
        f"read back in {read_s:.1f} s; one candidate at a time: {one_rate:.1f}/s, "
        f"~{row['one_candidate_all_s']:.0f} s for all"
    )
    return row


def layout_search(args: argparse.Namespace) -> dict[str, Any]:
    """Every grid point at its best layout, the vectorised search against the scalar one on
    a subset (see the module docstring); prints a short table and returns it."""
    base = ArchConfig(
        n_layers=8,
        d_model=512,
        n_heads=8,
        variant="block_attnres",
        block_size=2,
        seq_len=2048,
        dtype="bfloat16",
    )
    grid = ArchGrid.build(base, **grid_axes(args.points))
    n = len(grid)
    workload = Workload(seq_len=2048)
    space = LayoutSpace(args.devices, args.global_batch, max_virtual=args.max_virtual)
    layouts = len(space.layouts())
    subset = np.unique(np.linspace(0, n - 1, min(args.scalar_subset, n)).round().astype(int))
    configs = [
        base.replace(
            n_layers=int(grid.n_layers[i]),
            d_model=int(grid.d_model[i]),
            n_heads=int(grid.n_heads[i]),
        )
        for i in subset
    ]

    start = time.perf_counter()
    found = search_layout_grid(grid, space, workload, "h100")
    grid_s = time.perf_counter() - start
    start = time.perf_counter()
    scalar = [search_layout(cfg, space, workload, "h100") for cfg in configs]
    scalar_s = time.perf_counter() - start
    for i, one in zip(subset, scalar, strict=True):  # the two paths pick the same layouts
        assert bool(found.found[i]) == (one.best is not None), i
        if one.best is not None:
            for name, value in one.metrics().items():
                assert np.isclose(found.metrics[name][i], value, rtol=1e-12), (i, name)

    scalar_rate, grid_rate = len(configs) / scalar_s, n / grid_s
    rows: list[dict[str, Any]] = [
        {"path": "scalar", "candidates": len(configs), "seconds": scalar_s},
        {"path": "vectorised", "candidates": n, "seconds": grid_s},
    ]
    for row, rate in zip(rows, (scalar_rate, grid_rate), strict=True):
        row["candidates_per_s"] = rate
        row["speedup_vs_scalar"] = rate / scalar_rate
    print(
        f"\nlayout search: {n} candidates on {args.devices} devices, global batch "
        f"{args.global_batch}, v <= {args.max_virtual}: {layouts} layouts each; "
        f"{int(found.found.sum())} candidates fit in 80 GB"
    )
    print(f"{'path':12} {'candidates':>10} {'seconds':>9} {'candidates/s':>13} {'vs scalar':>10}")
    for row in rows:
        print(
            f"{row['path']:12} {row['candidates']:10d} {row['seconds']:9.2f} "
            f"{row['candidates_per_s']:13,.1f} {row['speedup_vs_scalar']:9.1f}x"
        )
    metrics = {m: float(np.nanmedian(found.metrics[m])) for m in LAYOUT_METRICS}
    return {
        "devices": args.devices,
        "global_batch": args.global_batch,
        "max_virtual": args.max_virtual,
        "layouts": layouts,
        "fitting": int(found.found.sum()),
        "rows": rows,
        "median_best": metrics if found.found.any() else {},
    }


def side_by_side(args: argparse.Namespace) -> dict[str, Any]:
    """This tree's layout search and `args.against`'s, alternately, `args.rounds` times each;
    the medians of seconds per candidate (vectorised and scalar paths) and their ratio."""
    trees = {"this": str(Path(__file__).resolve().parents[1]), "against": str(args.against)}
    flags = [
        f"--points={args.points}",
        f"--devices={args.devices}",
        f"--global-batch={args.global_batch}",
        f"--max-virtual={args.max_virtual}",
        f"--scalar-subset={args.scalar_subset}",
        "--layout-only",
    ]
    runs: dict[str, list[dict[str, float]]] = {name: [] for name in trees}
    with tempfile.TemporaryDirectory() as tmp:
        for _ in range(args.rounds):
            for name, tree in trees.items():
                out = Path(tmp) / f"{name}.json"
                env = os.environ | {"DEPTHSCOPE_BENCH_TREE": tree}
                subprocess.run(
                    [sys.executable, __file__, *flags, f"--json={out}"],
                    env=env,
                    check=True,
                    stdout=subprocess.DEVNULL,
                )
                rows = json.loads(out.read_text())["layout_search"]["rows"]
                runs[name].append({r["path"]: r["seconds"] / r["candidates"] for r in rows})
    result: dict[str, Any] = {"trees": trees, "rounds": args.rounds}
    print(
        f"layout search side by side, {args.rounds} alternating rounds: seconds per candidate "
        f"(median), {args.points} candidates on {args.devices} devices"
    )
    print(f"{'path':12} {'this':>12} {'against':>12} {'ratio':>7}")
    for path in ("vectorised", "scalar"):
        this = statistics.median(r[path] for r in runs["this"])
        other = statistics.median(r[path] for r in runs["against"])
        result[path] = {"this_s": this, "against_s": other, "ratio": this / other}
        print(f"{path:12} {this * 1e3:10.3f}ms {other * 1e3:10.3f}ms {this / other:6.2f}x")
    return result


if __name__ == "__main__":
    sys.exit(main())
