"""How much compute each search needs to answer the question a user asks: where is the
loss-optimal d_model/L_b, to a given width, with the truth inside the interval?

    python bench/optimum_search.py [--seeds 20] [--width 1.0] [--point-seeds 8]
        [--variant full_attnres]
        [--depths 2 3 ... 16] [--lr 0.004] [--dlm 0.5] [--cap 1.0]
        [--strategies grid random tpe optimum] [--fidelity] [--peers grid random tpe]
        [--peer-pruners none sha] [--syne asha] [--processes 2] [--json FILE]

The landscape: the surrogate of `bench/surrogate.py` (fitted to the recorded WSD runs) for
one variant over a fine grid of depths at one training setting, so that the only axis is the
shape. Full AttnRes is the default because it is the variant whose fitted optimum lies inside
the recorded depths (d_model/L ≈ 18 at lr 0.004; the standard residual's and Block AttnRes's
lie beyond the shallow edge, where no search can locate them). Each benchmark seed draws its
own seed noise (the generator's `--rng-seed`): a strategy is judged over noise draws, not on
one lucky landscape. The truth is the model's own minimum, exp(−(b + r·ln lr)/2c). A point's
value is the mean of `--point-seeds` training seeds (drawn directly, as one draw of noise
σ/√n: every trial costs the same, so shares of the grid's compute do not change): with the
recorded seed noise (σ ≈ 0.06) against the optimum's curvature (≈ 0.04 nats per unit of
ln(d_model/L)²), one seed per shape locates the optimum to ln-width 1 in a fifth of the noise
draws even with every shape trained, eight seeds in nine of ten.

Each search stops at the first full-budget result after which the variant's fitted optimum
(`search.optimum.located`, the rule of `stop: {optimum_interval}`) lies inside the explored
shapes with a 90% interval at most `--width` wide in ln(d_model/L_b), or at the cap. Cells:
the compute to that moment as % of the grid's (C_grid: every shape once, full budget), median
[95% bootstrap interval] over seeds, a seed that stopped on an interval missing the truth
("wrong") or reached the cap unanswered counted as ∞; then the wrong answers and the misses.

depthscope's rows run through the real runner with `stop: {optimum_interval: width}` in the
spec (`grid`, `random`, `tpe`, and `optimum`, the sampler that places shapes by the fitted
optimum); `grid/fidelity` is the grid with successive-halving rungs (`stop` refuses rungs, so
the benchmark's rule ends it). The peers (`bench/search_peers.py`) are Optuna's samplers with
or without its `SuccessiveHalvingPruner`, and Syne Tune's ASHA where a bench-only install
imports, over the same training specs with the same accounting.
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench import surrogate
from bench.search_efficiency import _json_finite, _pct, in_processes, median_interval, run_search
from bench.search_peers import SYNE_SCHEDULERS

DEPTHS = tuple(range(2, 17))
STRATEGIES = ("grid", "random", "tpe", "optimum")
PEERS = ("grid", "random", "tpe")
PEER_PRUNERS = ("none", "sha")


def true_ratio(model: surrogate.Model, variant: str, lr: float) -> float:
    """The model's loss-optimal d_model/L at `lr`: the vertex of its quadratic in x."""
    _a, b, c, _p, _q, r = model.coef[variant][:6]
    if c <= 0:
        raise SystemExit(f"{variant}: the fitted loss does not curve upwards in ln(d_model/L)")
    return math.exp(-(b + r * math.log(lr)) / (2 * c))


def landscapes(
    args: argparse.Namespace, folder: Path
) -> tuple[list[Path], float, dict[str, tuple[str, float]]]:
    """One generated landscape per seed (its own seed noise); the true optimum; the shapes."""
    from nas_service.results.landscape import load_landscape

    recorded = load_landscape(surrogate.RECORDED)
    model = surrogate.fit(
        surrogate.recorded_runs(recorded),
        surrogate.seed_sigma(load_landscape(surrogate.NOISE_FROM)),
    )
    model.sigma /= math.sqrt(args.point_seeds)  # the noise of a mean over the point's seeds
    paths = []
    for k in range(args.seeds):
        doc = surrogate.generate(
            model, recorded, tuple(args.depths), (args.lr,), (args.dlm,), 1, k, (args.variant,)
        )
        paths.append(folder / f"landscape-{k}.json")
        paths[-1].write_text(json.dumps(doc, separators=(",", ":")))
    shapes = {
        str(t["number"]): (t["arch"]["variant"], t["arch"]["d_model"] / t["arch"]["n_layers"])
        for t in doc["trials"]
    }
    return paths, true_ratio(model, args.variant, args.lr), shapes


def summarise(rows: list[dict[str, Any]]) -> dict[str, Any]:
    if any("refused" in r for r in rows):
        return {"available": False, "why": next(r["refused"] for r in rows if "refused" in r)}
    located = [r["located"] if r["located"] is not None else math.inf for r in rows]
    return {
        "available": True,
        "seeds": len(rows),
        "located": median_interval(located),
        "wrong": sum(bool(r["wrong"]) for r in rows),
        "unanswered": sum(r["answered"] is None for r in rows),
        "trials": statistics.median(r["trials"] for r in rows),
        "wall_s": sum(r.get("wall_s", 0.0) for r in rows),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--seeds", type=int, default=20)
    ap.add_argument("--width", type=float, default=1.0, help="asked ln-width of the interval")
    ap.add_argument("--point-seeds", type=int, default=8, help="seeds averaged per point")
    ap.add_argument("--variant", default="full_attnres")
    ap.add_argument("--depths", type=int, nargs="+", default=list(DEPTHS))
    ap.add_argument("--lr", type=float, default=0.004)
    ap.add_argument("--dlm", type=float, default=0.5)
    ap.add_argument("--cap", type=float, default=1.0, help="compute cap, share of C_grid")
    ap.add_argument("--strategies", nargs="*", default=list(STRATEGIES), choices=STRATEGIES)
    ap.add_argument("--fidelity", action=argparse.BooleanOptionalAction, default=True)
    ap.add_argument("--peers", nargs="*", default=list(PEERS), choices=PEERS)
    ap.add_argument("--peer-pruners", nargs="*", default=list(PEER_PRUNERS), choices=PEER_PRUNERS)
    ap.add_argument("--syne", nargs="*", default=["asha"], choices=SYNE_SCHEDULERS)
    ap.add_argument("--processes", type=int, default=2)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args(argv)
    if min(args.seeds, args.processes, args.point_seeds) < 1:
        ap.error("--seeds, --point-seeds and --processes: at least 1")
    if args.width <= 0:
        ap.error(f"--width: a positive ln-width, got {args.width}")
    if len(set(args.depths)) < 3:
        ap.error("--depths: at least 3 distinct depths (a quadratic needs three shapes)")

    from nas_service.store import upgrade
    from nas_service.store.jobs import optuna_storage

    started = time.perf_counter()
    tmp = tempfile.mkdtemp(
        prefix="ds-optimum-search-", dir="/dev/shm" if Path("/dev/shm").is_dir() else None
    )
    try:
        paths, truth, shapes = landscapes(args, Path(tmp))
        template = Path(tmp) / "template.db"
        upgrade(f"sqlite:///{template}")
        optuna_storage(f"sqlite:///{template}")
        base: dict[str, Any] = {
            "template": str(template),
            "tmp": tmp,
            "workers": 1,
            "cap": args.cap,
            "tops": [],
        }
        size = len(shapes)
        grid = run_search(
            base
            | {"landscape": str(paths[0]), "strategy": "grid", "mode": "none"}
            | {"objectives": "loss", "seed": 0, "n_trials": size, "capture": True}
        )
        keys = list(grid["specs"])
        base |= {
            "ref_compute": grid["compute"],
            "objectives": "optimum",
            "optimum": {"width": args.width, "truth": {args.variant: truth}, "shapes": shapes},
        }

        def n_trials(sampler: str) -> int:
            return size if sampler.endswith("grid") else 10 * size

        runs = [(s, "none") for s in args.strategies] + [("grid", "fidelity")] * args.fidelity
        tasks = [
            base
            | {"landscape": str(paths[k]), "strategy": s, "mode": m, "seed": k}
            | {"n_trials": n_trials(s)}
            for s, m in runs
            for k in range(args.seeds)
        ]
        peer = {"peer": True, "spec_keys": keys, "specs": [grid["specs"][k] for k in keys]}
        tasks += [
            base
            | peer
            | {"landscape": str(paths[k]), "strategy": f"optuna-{s}", "mode": m, "seed": k}
            | {"n_trials": n_trials(s)}
            for s in args.peers
            for m in args.peer_pruners
            for k in range(args.seeds)
        ]
        tasks += [
            base
            | peer
            | {"syne": True, "landscape": str(paths[k]), "strategy": "syne-tune", "mode": m}
            | {"seed": k, "n_trials": n_trials("")}
            for m in args.syne
            for k in range(args.seeds)
        ]
        rows = in_processes(run_search, tasks, args.processes)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    wall = time.perf_counter() - started
    names = list(dict.fromkeys(f"{r['strategy']}/{r['mode']}" for r in rows))
    table = {n: summarise([r for r in rows if f"{r['strategy']}/{r['mode']}" == n]) for n in names}
    ratios = sorted(r for _, r in shapes.values())
    print(
        f"locating the optimum d_model/L_b of {args.variant} on its surrogate: {size} shapes "
        f"(d_model/L_b {ratios[0]:.3g}–{ratios[-1]:.3g}) at lr {args.lr:g}, depth_lr_mult "
        f"{args.dlm:g}; true optimum {truth:.3g}; a point the mean of {args.point_seeds} "
        f"seeds; asked ln-width ≤ {args.width:g}; "
        f"{args.seeds} seeds (noise draws); cap {100 * args.cap:.0f}% of the grid's compute; "
        f"{wall:.0f} s"
    )
    print("cells: compute (% of the grid's) to a located optimum, median [95% bootstrap]")
    print(f"{'strategy/mode':<26} {'→ located':>22} {'wrong':>6} {'unanswered':>10} {'trials':>7}")
    for name, row in table.items():
        if not row["available"]:
            print(f"{name:<26} not available: {row['why']}")
            continue
        m = row["located"]
        cell = f"{_pct(m['median'])} [{_pct(m['lo'])}, {_pct(m['hi'])}]"
        print(
            f"{name:<26} {cell:>22} {row['wrong']:>6} {row['unanswered']:>10} {row['trials']:>7g}"
        )
    if args.json:
        doc = {
            "variant": args.variant,
            "shapes": size,
            "true_optimum": truth,
            "width": args.width,
            "point_seeds": args.point_seeds,
            "seeds": args.seeds,
            "cap": args.cap,
            "grid_compute": grid["compute"],
            "summary": table,
            "runs": [{k: v for k, v in r.items() if k != "specs"} for r in rows],
            "wall_s": wall,
        }
        args.json.write_text(json.dumps(_json_finite(doc), indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
