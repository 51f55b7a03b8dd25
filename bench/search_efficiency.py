"""Search efficiency on a recorded landscape: how much compute each search strategy spends
before it finds what the full grid finds, replayed by the real runner on the simulated
backend (`nas_service.simulated`) over bench/landscapes/crossover_wsd.json (WSD, a curve per
run; crossover.json, the cosine grid, where the WSD one is absent, or `--landscape`).

    python bench/search_efficiency.py [--seeds 20] [--workers 2] [--processes 2] [--json FILE]
        [--strategies grid random tpe nsga2] [--modes none auto median fidelity]
        [--objectives loss pareto]

The space: the landscape's 12 architectures (3 variants × 4 depths at its parameter target)
× its training settings searched jointly (`training.lr` and `training.depth_lr_mult` as
choices of the recorded values, 0.002/0.004/0.008 × 0.1/1/10): 108 points, one seed each,
every run answered from the recorded run at that setting (seed 0). The strategies: grid,
random, TPE and NSGA-II (`sampler`), each with `pruner: none`, with `pruner: auto` (the
default: the median rule at equal fractions of the budget, `nas_service.pruning`; for two
objectives the runner's `cannot_reach_front`), with `pruner: median` (Optuna's median rule at
raw optimizer steps, the default of earlier versions: its naive peer; single objective only,
the spec refuses it with two), and with multi-fidelity
(the spec's `fidelity` section: rungs 1/9, 1/3, 1, η = 3, `reuse: checkpoint` under WSD —
on the cosine landscape the simulated curves are the cosine ones). A mode the runner
refuses, or one in which no run trained less than a full budget, is reported "not available
yet". Each runs
`--seeds` sampler seeds (`sampler_seed` 0…), `n_trials` = the grid's 108 (a sampler may
revisit points) — with multi-fidelity as many as the grid's compute buys under the rungs'
plan, 108 / `rungs.expected_compute` (≈ 420: a search at the same expected compute), unless
`--trials` is given —, `max_concurrent` = `--workers` simulated workers.

The reference is the grid without pruning: its compute C_grid (FLOPs of the 108 runs), its
best loss, its hypervolume. Measures (compute = FLOPs trained, partial runs included, up to
the time of the result, over C_grid):

- single objective (val_loss): the compute until the first *full-budget* result within 0.5%
  of the grid's best loss (a shorter rung never counts); median and IQR over seeds, a seed
  that never gets there counts as not reached (∞ in the median) and is counted apart; and
  *best pruned*: the seeds in which a run of the grid's best point (the recorded point its
  best result was answered from, the eventual best) was pruned before the search's measure
  was decided (target ≤ 1 of 20 for the default pruner; on this landscape only that point
  is within 0.5%, so a seed that prunes it misses unless the sampler proposes it again);
- two objectives (val_loss, train_memory_bytes): the hypervolume of the full-budget results,
  both objectives normalised to [0, 1] by the grid's range, reference point (1.1, 1.1), as a
  fraction of the grid's: the fraction reached with 30% of C_grid, and the compute needed
  for 95% of it.

Measured (`--modes auto median none --objectives loss`, 20 seeds, 760 s on 2 busy cores): the
best pruned in 0 of 20 seeds of every sampler under `auto`, in 18 (grid), 6 (random), 16
(TPE), 6 (NSGA-II) under `median`; compute to 0.5% of the grid's best, median: TPE 17% with
`auto`, 19% with `none`; the grid 25% and 38%; random and NSGA-II miss it in 10 seeds with
`auto` (random also without pruning: it never proposes the point; NSGA-II 7 without).

A search stops once its measure is decided (the target found; 95% of the hypervolume found
and 30% of C_grid spent), or at n_trials. Targets: the best strategy reaches 0.5% of the
grid's best with ≤ 25% of the grid's compute, and ≥ 95% of the grid's hypervolume with
≤ 30% of it.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import logging
import math
import multiprocessing
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

LANDSCAPES = Path(__file__).resolve().parent / "landscapes"
#: The WSD landscape (a curve per run, exact segments) once recorded, else the cosine one.
LANDSCAPE = next(
    p for p in (LANDSCAPES / "crossover_wsd.json", LANDSCAPES / "crossover.json") if p.exists()
)
STRATEGIES = ("grid", "random", "tpe", "nsga2")
MODES = ("none", "auto", "median", "fidelity")
#: The spec's `pruner` of each mode (`median`: the raw-step rule, the naive peer of `auto`).
PRUNER = {"none": "none", "auto": "auto", "median": "median", "fidelity": "auto"}
OBJECTIVES = {"loss": ["val_loss"], "pareto": ["val_loss", "train_memory_bytes"]}
WITHIN = 0.005  # of the grid's best loss
HV_SHARE, HV_COMPUTE = 0.95, 0.30
REFERENCE = (1.1, 1.1)  # in normalised objectives
FIDELITY = {"rungs": [1 / 9, 1 / 3, 1.0], "reduction": 3, "reuse": "checkpoint"}


class Decided(Exception):
    """Raised out of the runner once a search's measure is known: the rest is not needed."""


def job_spec(
    landscape: Any, strategy: str, mode: str, objectives: str, seed: int
) -> dict[str, Any]:
    """The benchmark's job over the landscape's space (see the module)."""
    spec: dict[str, Any] = landscape.job.spec.model_dump(mode="json")
    tune = spec.pop("tune") or {}
    training = spec["training"] | {k: tune[k] for k in ("lr", "depth_lr_mult") if tune.get(k)}
    spec |= {
        "name": f"{strategy}-{mode}-{objectives}-{seed}",
        "training": training,
        "tune": None,
        "seeds": 1,
        "sampler": strategy,
        "pruner": PRUNER[mode],
        "sampler_seed": seed,
        "objectives": OBJECTIVES[objectives],
    }
    if mode == "fidelity":
        spec["fidelity"] = FIDELITY
        spec["training"] = spec["training"] | {"schedule": "wsd"}
    return spec


def grid_size(spec: dict[str, Any]) -> int:
    from nas_service.search import grid_space
    from nas_service.spec import parse_spec

    return math.prod(len(v) for v in grid_space(parse_spec(spec)).values())


def hypervolume(points: list[tuple[float, float]]) -> float:
    """The area dominated by `points` (normalised, minimised) up to `REFERENCE`."""
    rx, ry = REFERENCE
    area, best_y = 0.0, ry
    for x, y in sorted(p for p in points if p[0] < rx and p[1] < ry):
        if y < best_y:
            area += (rx - x) * (best_y - y)
            best_y = y
    return area


class Reference:
    """What the grid found: its compute, best loss, the objectives' ranges, hypervolume."""

    def __init__(
        self, compute: float, results: list[tuple[float, float]], best: Any = None
    ) -> None:
        self.compute = compute
        #: the recorded point of the grid's best result (`point`), the *eventual best*
        self.point = (best[0], tuple(map(tuple, best[1]))) if best is not None else None
        self.best = min(loss for loss, _ in results)
        losses, mems = [r[0] for r in results], [r[1] for r in results]
        self.lo = (min(losses), min(mems))
        self.hi = (max(losses), max(mems))
        self.hv = hypervolume([self.norm(r) for r in results])

    def norm(self, r: tuple[float, float]) -> tuple[float, float]:
        return (
            (r[0] - self.lo[0]) / ((self.hi[0] - self.lo[0]) or 1.0),
            (r[1] - self.lo[1]) / ((self.hi[1] - self.lo[1]) or 1.0),
        )

    def as_dict(self) -> dict[str, Any]:
        return {"compute": self.compute, "best": self.best, "lo": self.lo, "hi": self.hi}


def _memory(landscape: Any) -> dict[int, float]:
    return {t.number: float(t.metrics.get("train_memory_bytes") or 0.0) for t in landscape.trials}


def measure(events: list[Any], memory: dict[int, float], ref: Reference) -> dict[str, Any]:
    """The benchmark's measures from a simulated search's event log."""
    target = ref.best * (1 + WITHIN)
    first: float | None = None
    hv_at_budget, hv_compute = 0.0, None
    points: list[tuple[float, float]] = []
    for e in events:
        if not e.full or e.loss is None:
            continue
        share = e.compute / ref.compute
        if first is None and e.loss <= target:
            first = share
        points.append(ref.norm((e.loss, memory[e.identity["trial"]])))
        hv = hypervolume(points) / ref.hv
        if share <= HV_COMPUTE:
            hv_at_budget = hv
        if hv_compute is None and hv >= HV_SHARE:
            hv_compute = share
    short = any(e.identity.get("stop_step") is not None or not e.full for e in events)
    return {
        "first": first,
        "hv_at_30": hv_at_budget,
        "hv_95": hv_compute,
        "shorter_runs": short,
        "best_pruned": any(e.kind == "cancelled" and point(e) == ref.point for e in events),
    }


def point(event: Any) -> tuple[Any, Any]:
    """The recorded point a run was answered from: the landscape trial and its setting."""
    setting = event.identity.get("recorded_setting") or {}
    return event.identity.get("trial"), tuple(sorted(setting.items()))


def decided(events: list[Any], memory: dict[int, float], ref: Reference, objectives: str) -> bool:
    m = measure(events, memory, ref)
    if objectives == "loss":
        return m["first"] is not None
    spent = events[-1].compute / ref.compute if events else 0.0
    return m["hv_95"] is not None and spent > HV_COMPUTE


def run_search(task: dict[str, Any]) -> dict[str, Any]:
    """One search on a fresh copy of the template database; its event log's measures."""
    import optuna

    from nas_service.jobs import submit
    from nas_service.landscape import load_landscape
    from nas_service.runner import Runner
    from nas_service.settings import Settings, get_settings
    from nas_service.simulated import SimulatedBackend
    from nas_service.spec import SpecError

    optuna.logging.set_verbosity(optuna.logging.ERROR)
    logging.getLogger("nas_service").setLevel(logging.ERROR)
    landscape = load_landscape(task["landscape"])
    memory = _memory(landscape)
    ref = (
        Reference(task["ref_compute"], task["ref_results"], task["ref_point"])
        if task.get("ref_results")
        else None
    )
    folder = Path(tempfile.mkdtemp(prefix="ds-search-", dir=task["tmp"]))
    db = folder / "search.db"
    shutil.copy(task["template"], db)
    url = f"sqlite:///{db}"
    overrides: dict[str, Any] = {"database_url": url, "max_trials": 100_000}
    if "artifact_store" in Settings.model_fields:
        overrides["artifact_store"] = str(folder / "artifacts")
    settings = get_settings(**overrides)
    from nas_service.db import make_engine, make_sessionmaker

    Session = make_sessionmaker(make_engine(url))
    spec = job_spec(landscape, task["strategy"], task["mode"], task["objectives"], task["seed"])
    spec["n_trials"] = task["n_trials"]
    if task["mode"] == "fidelity" and task.get("same_compute"):
        # as many candidates as the grid's compute buys under the rungs' plan
        from nas_service.rungs import expected_compute
        from nas_service.spec import parse_spec

        spec["n_trials"] = math.ceil(task["n_trials"] / expected_compute(parse_spec(spec)))
    spec["max_concurrent"] = task["workers"]

    class Stopping(SimulatedBackend):
        seen = 0

        def wait(self, handles: list[Any], timeout_s: float) -> list[Any]:
            if ref is not None and len(self.events) > self.seen:
                self.seen = len(self.events)
                if decided(self.events, memory, ref, task["objectives"]):
                    raise Decided
            return super().wait(handles, timeout_s)

    backend = Stopping(landscape, workers=task["workers"])
    out: dict[str, Any] = {k: task[k] for k in ("strategy", "mode", "objectives", "seed")}
    start = time.perf_counter()
    try:
        submit(Session, settings, spec)
        Runner(settings, backend=backend).run(poll_s=0, timeout_s=task.get("timeout_s", 600))
    except Decided:
        pass
    except SpecError as exc:
        out["refused"] = str(exc)
        return out
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    out["wall_s"] = time.perf_counter() - start
    out["compute"] = backend.compute_spent
    out["runs"] = backend.runs_launched
    out["results"] = [
        (e.loss, memory[e.identity["trial"]], e.compute)
        for e in backend.events
        if e.full and e.loss is not None
    ]
    full = [e for e in backend.events if e.full and e.loss is not None]
    out["best_point"] = point(min(full, key=lambda e: e.loss or math.inf)) if full else None
    if ref is not None:
        out |= measure(backend.events, memory, ref)
    return out


def _quantiles(values: list[float]) -> dict[str, float]:
    """Median and IQR by nearest rank (not reached: ∞, so it counts against them)."""
    if not values:
        return {"median": math.nan, "q25": math.nan, "q75": math.nan}
    v = sorted(values)

    def rank(p: float) -> float:
        return v[round(p * (len(v) - 1))]

    return {"median": rank(0.5), "q25": rank(0.25), "q75": rank(0.75)}


def summarise(rows: list[dict[str, Any]]) -> dict[str, Any]:
    if any("refused" in r for r in rows):
        return {"available": False, "why": next(r["refused"] for r in rows if "refused" in r)}
    if rows[0]["mode"] == "fidelity" and not any(r["shorter_runs"] for r in rows):
        why = "the runner trained every candidate to its full budget (no rung ran shorter)"
        return {"available": False, "why": why}
    inf = math.inf
    first = [r["first"] if r["first"] is not None else inf for r in rows]
    hv95 = [r["hv_95"] if r["hv_95"] is not None else inf for r in rows]
    return {
        "available": True,
        "seeds": len(rows),
        "first": _quantiles(first),
        "first_not_reached": sum(x == inf for x in first),
        "hv_at_30": _quantiles([r["hv_at_30"] for r in rows]),
        "hv_95": _quantiles(hv95),
        "hv_95_not_reached": sum(x == inf for x in hv95),
        "best_pruned": sum(bool(r["best_pruned"]) for r in rows),
        "wall_s": sum(r["wall_s"] for r in rows),
    }


def _finite(x: Any) -> Any:
    """`x` with every non-finite float as None (JSON has no ∞)."""
    if isinstance(x, float):
        return x if math.isfinite(x) else None
    if isinstance(x, dict):
        return {k: _finite(v) for k, v in x.items()}
    if isinstance(x, list | tuple):
        return [_finite(v) for v in x]
    return x


def _pct(x: float) -> str:
    return "  ∞" if x == math.inf else ("  -" if math.isnan(x) else f"{100 * x:3.0f}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--landscape", type=Path, default=LANDSCAPE)
    parser.add_argument("--seeds", type=int, default=20, help="sampler seeds per strategy")
    parser.add_argument("--workers", type=int, default=2, help="simulated workers")
    parser.add_argument("--trials", type=int, help="n_trials per search (default: the grid's)")
    parser.add_argument("--strategies", nargs="+", default=list(STRATEGIES), choices=STRATEGIES)
    parser.add_argument("--modes", nargs="+", default=list(MODES), choices=MODES)
    parser.add_argument(
        "--objectives", nargs="+", default=list(OBJECTIVES), choices=list(OBJECTIVES)
    )
    parser.add_argument("--processes", type=int, default=2)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()

    from nas_service.db import upgrade
    from nas_service.jobs import optuna_storage
    from nas_service.landscape import load_landscape

    landscape = load_landscape(args.landscape)
    size = grid_size(job_spec(landscape, "grid", "none", "loss", 0))
    n_trials = args.trials or size
    tmp = tempfile.mkdtemp(
        prefix="ds-search-efficiency-", dir="/dev/shm" if Path("/dev/shm").is_dir() else None
    )
    template = Path(tmp) / "template.db"
    upgrade(f"sqlite:///{template}")
    optuna_storage(f"sqlite:///{template}")  # Optuna's tables too
    base = {
        "landscape": str(args.landscape),
        "template": str(template),
        "tmp": tmp,
        "workers": args.workers,
        "n_trials": n_trials,
        "same_compute": args.trials is None,
    }
    started = time.perf_counter()
    try:
        grid = run_search(
            base | dict(strategy="grid", mode="none", objectives="loss", seed=0, n_trials=size)
        )
        ref = Reference(
            grid["compute"], [(loss, mem) for loss, mem, _ in grid["results"]], grid["best_point"]
        )
        base |= {
            "ref_compute": ref.compute,
            "ref_results": [(r[0], r[1]) for r in grid["results"]],
            "ref_point": grid["best_point"],
        }
        tasks = [
            base | {"strategy": s, "mode": m, "objectives": o, "seed": k}
            for o in args.objectives
            for s in args.strategies
            for m in args.modes
            for k in range(args.seeds)
        ]
        ctx = multiprocessing.get_context("spawn")
        with concurrent.futures.ProcessPoolExecutor(args.processes, mp_context=ctx) as pool:
            rows = list(pool.map(run_search, tasks))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    wall = time.perf_counter() - started
    table: dict[str, dict[str, dict[str, Any]]] = {}
    for o in args.objectives:
        for s in args.strategies:
            for m in args.modes:
                mine = [r for r in rows if (r["objectives"], r["strategy"], r["mode"]) == (o, s, m)]
                table.setdefault(o, {})[f"{s}/{m}"] = summarise(mine)

    print(
        f"search efficiency on {args.landscape.name}: {size} grid points, {args.seeds} seeds, "
        f"{args.workers} workers; compute as % of the grid's ({ref.compute:.3g} FLOPs), "
        f"{wall:.0f} s"
    )
    print(
        f"{'strategy/mode':<16} {'→0.5% med [IQR]':>18} {'miss':>5} {'best pruned':>11} "
        f"{'HV@30% med':>11} {'→95%HV med [IQR]':>18} {'miss':>5}"
    )
    empty: dict[str, Any] = {"available": False, "why": "not run"}
    for name in dict.fromkeys(k for o in table.values() for k in o):
        a, b = table.get("loss", {}).get(name, empty), table.get("pareto", {}).get(name, empty)
        if not a["available"] and not b["available"]:
            print(
                f"{name:<16} not available yet: {a['why'] if a['why'] != 'not run' else b['why']}"
            )
            continue
        loss_cols = f"{'-':>18} {'-':>5} {'-':>11}"
        if a["available"]:
            f = a["first"]
            pruned = f"{a['best_pruned']}/{a['seeds']}"
            loss_cols = (
                f"{_pct(f['median'])} [{_pct(f['q25'])},{_pct(f['q75'])}] %  "
                f"{a['first_not_reached']:>5} {pruned:>11}"
            )
        pareto_cols = f"{'-':>11} {'-':>18} {'-':>5}"
        if b["available"]:
            h, h95 = b["hv_at_30"], b["hv_95"]
            pareto_cols = (
                f"{100 * h['median']:>10.0f}% "
                f"{_pct(h95['median'])} [{_pct(h95['q25'])},{_pct(h95['q75'])}] %  "
                f"{b['hv_95_not_reached']:>5}"
            )
        print(f"{name:<16} {loss_cols} {pareto_cols}")
    firsts = [v["first"]["median"] for v in table.get("loss", {}).values() if v["available"]]
    hvs = [v["hv_at_30"]["median"] for v in table.get("pareto", {}).values() if v["available"]]
    best_first = min(firsts, default=math.nan)
    best_hv = max(hvs, default=math.nan)
    print(
        f"best: 0.5% of the grid's best with {_pct(best_first)}% of its compute (target ≤ 25%); "
        f"{100 * best_hv:.0f}% of its hypervolume with 30% (target ≥ 95%); best pruned: the "
        "seeds in which a run of the grid's best point was pruned (target ≤ 1 of 20)"
    )
    if args.json:
        args.json.write_text(
            json.dumps(
                _finite(
                    {
                        "landscape": str(args.landscape),
                        "grid_points": size,
                        "seeds": args.seeds,
                        "workers": args.workers,
                        "n_trials": n_trials,
                        "reference": ref.as_dict() | {"hypervolume": ref.hv, "point": REFERENCE},
                        "summary": table,
                        "best": {"first": best_first, "hv_at_30": best_hv},
                        "runs": rows,
                        "wall_s": wall,
                    }
                ),
                indent=1,
            )
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
