"""Search efficiency on a recorded landscape, honestly: every strategy under the same
compute cap, a quantile target, a two-objective target that can fail, a bootstrap interval
per strategy, and Optuna's own samplers and pruners in the same run (`bench/search_peers.py`)
with the same accounting. Replayed on the simulated backend (`nas_service.runner.simulated`) over
bench/landscapes/crossover_wsd.json (WSD, a curve per run; crossover.json where it is
absent, or `--landscape`).

    python bench/search_efficiency.py [--seeds 20] [--cap 1.0] [--top 0.01 0.05]
        [--strategies grid random tpe nsga2] [--modes none auto median fidelity]
        [--peers grid random tpe nsga2] [--peer-pruners sha hyperband none]
        [--syne asha bohb moasha] [--objectives loss pareto] [--workers 1] [--processes 2]
        [--json FILE]

The space: the landscape's 12 architectures (3 variants × 4 depths at its parameter target)
× `training.lr` × `training.depth_lr_mult` as choices of the recorded values: 108 grid
points, answered from 84 distinct recorded points (the standard residual ignores
`depth_lr_mult`). depthscope's strategies run through the real runner: sampler grid, random,
TPE, NSGA-II, each with `pruner: none`, `auto` (the default), `median` (the raw-step rule of
earlier versions) and multi-fidelity (`fidelity`: rungs 1/9, 1/3, 1, η = 3). The peers
(`optuna-<sampler>/<pruner>`) are Optuna studies the benchmark drives itself over the same
training specs on the same backend; `syne-tune/<scheduler>` are Syne Tune 0.16's ASHA and
BOHB (`syne_tune.optimizer.baselines`) for the loss and MOASHA for both objectives, as
shipped, driven the same way, run where a bench-only
install imports (`.bench-peers/`, see `bench/search_peers.py`), else reported not available
with the import error. A mode the runner refuses, or a fidelity mode in which
no run trained shorter, is reported "not available".

Accounting, the same for every row: compute = FLOPs trained (partial runs included, up to
the result) over C_grid, the FLOPs of the full grid without pruning. Every search stops at
`--cap` × C_grid (default 1.0; a result after the cap does not count) or once its measure is
decided; n_trials: the grid's size for a grid sampler, else 10× it (the cap ends the search).

- Single objective: the compute until the first full-budget result at a point in the top
  q of the space (`--top`, default 1% and 5%) ranked by *true mean loss* (the mean over the
  recorded seeds of the recorded point; on a one-seed landscape such as the WSD one, the one
  recorded value, said so in the output); the top q holds ceil(q × 84) distinct points (1 at
  1%: a single point on this small landscape, said so). Not reached within the cap: a miss
  (∞). *Best pruned*: the seeds in which a run of the space's best point was cancelled.
- Two objectives (val_loss, train_memory_bytes): the hypervolume of the full-budget
  results, normalised by the grid's Pareto front (its ideal point 0, its nadir 1), reference
  point (1.1, 1.1), as a share of the grid front's; the target is 95% of it within the cap.
  Every point of the front carries a share (the output gives the front's size and the
  largest share one point holds alone), so a search that finds only the best-loss point
  fails (on the WSD landscape the front is 2 points, 52% and 48%).
- Per row, over `--seeds` seeds: the median and a 95% bootstrap interval of the median
  (2000 resamples, misses as ∞), and the misses. No minimum over medians is reported.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import logging
import math
import multiprocessing
import random
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.search_peers import (
    PEER_PRUNERS,
    PEER_SAMPLERS,
    SYNE_OBJECTIVES,
    SYNE_SCHEDULERS,
    point_key,
    run_peer,
    run_syne,
    syne_tune,
)
from nas_service.search.numbers import finite_or_none

LANDSCAPES = Path(__file__).resolve().parent / "landscapes"
#: The WSD landscape (a curve per run, exact segments) once recorded, else the cosine one.
LANDSCAPE = next(
    p for p in (LANDSCAPES / "crossover_wsd.json", LANDSCAPES / "crossover.json") if p.exists()
)
STRATEGIES = ("grid", "random", "tpe", "nsga2")
#: `optimum`: the sampler that places shapes by the fitted optimum (`sampler: optimum`).
SAMPLERS = (*STRATEGIES, "optimum")
MODES = ("none", "auto", "median", "fidelity")
#: The spec's `pruner` of each mode (`median`: the raw-step rule, the naive peer of `auto`).
PRUNER = {"none": "none", "auto": "auto", "median": "median", "fidelity": "auto"}
#: `optimum`: the loss, measured by how soon the search locates each variant's optimum
#: d_model/L_b (`bench/optimum_search.py`).
OBJECTIVES = {
    "loss": ["val_loss"],
    "pareto": ["val_loss", "train_memory_bytes"],
    "optimum": ["val_loss"],
}
TOPS = (0.01, 0.05)
HV_SHARE = 0.95
REFERENCE = (1.1, 1.1)  # in objectives normalised by the grid's front
FIDELITY = {"rungs": [1 / 9, 1 / 3, 1.0], "reduction": 3, "reuse": "checkpoint"}
BOOTSTRAP = 2000


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
    from nas_service.search.study import grid_space
    from nas_service.spec import parse_spec

    return math.prod(len(v) for v in grid_space(parse_spec(spec)).values())


def hypervolume(
    points: list[tuple[float, float]], reference: tuple[float, float] = REFERENCE
) -> float:
    """The area dominated by `points` (normalised, minimised) up to `reference`."""
    rx, ry = reference
    area, best_y = 0.0, ry
    for x, y in sorted(p for p in points if p[0] < rx and p[1] < ry):
        if y < best_y:
            area += (rx - x) * (best_y - y)
            best_y = y
    return area


def front(points: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """The non-dominated points (both minimised), each once."""
    out: list[tuple[float, float]] = []
    for x, y in sorted(set(points)):
        if not out or y < out[-1][1]:
            out.append((x, y))
    return out


def truth(landscape: Any) -> dict[tuple[Any, Any], float]:
    """The true mean loss of every recorded point (trial, setting): the mean final loss of
    its recorded seeds (keys as `point` gives them for a run answered from it)."""
    return {k: sum(v) / len(v) for k, v in _recorded_losses(landscape).items()}


def seed_counts(landscape: Any) -> dict[tuple[Any, Any], int]:
    """How many seeds each recorded point holds."""
    return {k: len(v) for k, v in _recorded_losses(landscape).items()}


def _recorded_losses(landscape: Any) -> dict[tuple[Any, Any], list[float]]:
    losses: dict[tuple[Any, Any], list[float]] = {}
    for t in landscape.trials:
        chosen = dict(t.setting or {})
        for run in t.train or []:
            if run.final_val_loss is None or not math.isfinite(run.final_val_loss):
                continue
            key = (t.number, tuple(sorted(dict(run.setting or chosen).items())))
            losses.setdefault(key, []).append(float(run.final_val_loss))
    return losses


class Reference:
    """The grid's compute, the space's top sets by true mean loss, the grid's front."""

    def __init__(
        self,
        compute: float,
        results: list[tuple[float, float]],
        means: dict[tuple[Any, Any], float],
        reached: list[tuple[Any, Any]],
        tops: tuple[float, ...] = TOPS,
    ) -> None:
        self.compute = compute
        # the space: the recorded points the grid's runs were answered from
        ranked = sorted({p for p in reached if p in means}, key=lambda p: means[p])
        self.points = len(ranked)
        self.tops = {q: set(ranked[: max(1, math.ceil(q * len(ranked)))]) for q in tops}
        #: the space's best point by true mean loss, the *eventual best*
        self.point = ranked[0] if ranked else None
        self.front = front(results)
        self.lo = (min(p[0] for p in self.front), min(p[1] for p in self.front))
        self.hi = (max(p[0] for p in self.front), max(p[1] for p in self.front))
        normed = [self.norm(p) for p in self.front]
        self.hv = hypervolume(normed)
        alone = [self.hv - hypervolume(normed[:i] + normed[i + 1 :]) for i in range(len(normed))]
        #: the largest share of the front's hypervolume one point holds alone
        self.largest_share = max(alone, default=0.0) / self.hv if self.hv else 1.0
        self.best_alone = hypervolume(normed[:1]) / self.hv if self.hv else 1.0

    def norm(self, r: tuple[float, float]) -> tuple[float, float]:
        return (
            (r[0] - self.lo[0]) / ((self.hi[0] - self.lo[0]) or 1.0),
            (r[1] - self.lo[1]) / ((self.hi[1] - self.lo[1]) or 1.0),
        )

    def as_dict(self) -> dict[str, Any]:
        return {
            "compute": self.compute,
            "points": self.points,
            "top_points": {str(q): len(v) for q, v in self.tops.items()},
            "front": self.front,
            "hypervolume": self.hv,
            "largest_share": self.largest_share,
            "best_loss_point_share": self.best_alone,
            "normalised_by": {"ideal": self.lo, "nadir": self.hi},
            "reference_point": REFERENCE,
        }


def _memory(landscape: Any) -> dict[int, float]:
    return {t.number: float(t.metrics.get("train_memory_bytes") or 0.0) for t in landscape.trials}


def point(event: Any) -> tuple[Any, Any]:
    """The recorded point a run was answered from: the landscape trial and its setting."""
    setting = event.identity.get("recorded_setting") or {}
    return event.identity.get("trial"), tuple(sorted(setting.items()))


def measure(
    events: list[Any], memory: dict[int, float], ref: Reference, cap: float
) -> dict[str, Any]:
    """The benchmark's measures from a search's event log (results within the cap)."""
    first: dict[float, float | None] = dict.fromkeys(ref.tops)
    hv, hv_compute = 0.0, None
    points: list[tuple[float, float]] = []
    for e in events:
        share = e.compute / ref.compute
        if share > cap * (1 + 1e-9):
            break
        if not e.full or e.loss is None:
            continue
        at = point(e)
        for q, top in ref.tops.items():
            if first[q] is None and at in top:
                first[q] = share
        points.append(ref.norm((e.loss, memory[e.identity["trial"]])))
        hv = hypervolume(points) / ref.hv if ref.hv else 0.0
        if hv_compute is None and hv >= HV_SHARE:
            hv_compute = share
    return {
        "first": {str(q): v for q, v in first.items()},
        "hv_at_cap": hv,
        "hv_reached": hv_compute,
        "shorter_runs": any(e.identity.get("stop_step") is not None or not e.full for e in events),
        "best_pruned": any(e.kind == "cancelled" and point(e) == ref.point for e in events),
    }


def measure_optimum(events: list[Any], task: dict[str, Any]) -> dict[str, Any]:
    """How soon a search locates every variant's loss-optimal d_model/L_b: the compute (share
    of the grid's) at the first full-budget result after which each variant's fitted optimum
    lies inside its explored shapes with a 90% interval at most `width` wide in
    ln(d_model/L_b) (`search.optimum.located`, the rule of `stop: {optimum_interval}`).
    `located` when every such interval holds the landscape's true optimum; `answered` in
    either case (a search stops there: an answer that misses the truth is a miss, `wrong`)."""
    from nas_service.search.optimum import located

    opt, total = task["optimum"], task["ref_compute"]
    points: dict[str, tuple[list[float], list[float]]] = {}
    out: dict[str, Any] = {"located": None, "answered": None, "wrong": False, "trials": 0}
    for e in events:
        share = e.compute / total
        if share > task["cap"] * (1 + 1e-9):
            break
        if not e.full or e.loss is None:
            continue
        out["trials"] += 1
        variant, ratio = opt["shapes"][str(e.identity["trial"])]
        ratios, losses = points.setdefault(variant, ([], []))
        ratios.append(ratio)
        losses.append(e.loss)
        fits = located(points, opt["truth"], opt["width"])
        if fits is not None:
            out["answered"] = share
            held = all(
                f.ci_low is not None
                and f.ci_high is not None
                and f.ci_low <= opt["truth"][f.variant] <= f.ci_high
                for f in fits
            )
            out["located"] = share if held else None
            out["wrong"] = not held
            out["fits"] = [f.as_dict() for f in fits]
            break
    return out


def decided(
    events: list[Any], compute: float, memory: dict[int, float], ref: Reference | None, task: Any
) -> bool:
    """Whether the search may stop: past the cap, or its measure known."""
    if task.get("optimum"):
        return (
            compute > task["cap"] * task["ref_compute"]
            or measure_optimum(events, task)["answered"] is not None
        )
    assert ref is not None
    if compute > task["cap"] * ref.compute:
        return True
    m = measure(events, memory, ref, task["cap"])
    if task["objectives"] == "loss":
        return all(v is not None for v in m["first"].values())
    return m["hv_reached"] is not None


def _reference(task: dict[str, Any]) -> Reference | None:
    if not task.get("ref_results"):
        return None
    return Reference(
        task["ref_compute"],
        task["ref_results"],
        task["means"],
        task["reached"],
        tuple(task["tops"]),
    )


def run_search(task: dict[str, Any]) -> dict[str, Any]:
    """One search (depthscope's runner, or an Optuna peer); its event log's measures."""
    import optuna

    from nas_service.results.landscape import load_landscape

    optuna.logging.set_verbosity(optuna.logging.ERROR)
    logging.getLogger("nas_service").setLevel(logging.ERROR)
    landscape = load_landscape(task["landscape"])
    memory = _memory(landscape)
    ref = _reference(task)
    out: dict[str, Any] = {k: task[k] for k in ("strategy", "mode", "objectives", "seed")}
    start = time.perf_counter()
    specs = dict(zip(map(tuple, task.get("spec_keys", [])), task.get("specs", []), strict=True))

    def stop(events: list[Any], compute: float) -> bool:
        measured = ref is not None or bool(task.get("optimum"))
        return measured and decided(events, compute, memory, ref, task)

    if task.get("syne"):
        why = syne_tune(task["mode"])
        if why is not None:
            out["refused"] = why
            return out
        backend = run_syne(
            landscape, specs, task["mode"], task["seed"], task["n_trials"], stop, memory
        )
    elif task.get("peer"):
        backend = run_peer(
            landscape,
            specs,
            task["strategy"].removeprefix("optuna-"),
            task["mode"],
            task["objectives"],
            task["seed"],
            task["n_trials"],
            memory,
            stop,
        )
    else:
        done = _run_depthscope(task, landscape, stop, out)
        if done is None:
            return out
        backend = done
    out["wall_s"] = time.perf_counter() - start
    out["compute"] = backend.compute_spent
    out["runs"] = backend.runs_launched
    out["results"] = [
        (e.loss, memory[e.identity["trial"]], e.compute)
        for e in backend.events
        if e.full and e.loss is not None
    ]
    out["points"] = [point(e) for e in backend.events if e.full and e.loss is not None]
    if task.get("capture"):
        out["specs"] = backend.specs
    if task.get("optimum"):
        out |= measure_optimum(backend.events, task)
    elif ref is not None:
        out |= measure(backend.events, memory, ref, task["cap"])
    return out


def _run_depthscope(task: dict[str, Any], landscape: Any, stop: Any, out: dict[str, Any]) -> Any:
    """A search by the real runner on a fresh copy of the template database (its backend;
    None when the runner refused the spec, said in `out`)."""
    from nas_service.jobs import submit
    from nas_service.runner.loop import Runner
    from nas_service.runner.simulated import SimulatedBackend
    from nas_service.settings import Settings, get_settings
    from nas_service.spec import SpecError
    from nas_service.store import make_engine, make_sessionmaker

    folder = Path(tempfile.mkdtemp(prefix="ds-search-", dir=task["tmp"]))
    db = folder / "search.db"
    shutil.copy(task["template"], db)
    url = f"sqlite:///{db}"
    overrides: dict[str, Any] = {"database_url": url, "max_trials": 100_000}
    if "artifact_store" in Settings.model_fields:
        overrides["artifact_store"] = str(folder / "artifacts")
    settings = get_settings(**overrides)
    Session = make_sessionmaker(make_engine(url))
    spec = job_spec(landscape, task["strategy"], task["mode"], task["objectives"], task["seed"])
    spec["n_trials"] = task["n_trials"]
    spec["max_concurrent"] = task["workers"]
    if task.get("optimum") and task["mode"] != "fidelity":  # the service's own stop rule
        spec["stop"] = {"optimum_interval": task["optimum"]["width"]}

    class Stopping(SimulatedBackend):
        seen = 0
        specs: dict[tuple[str, float, float], Any]

        def launch(self, train: Any) -> Any:
            handle = super().launch(train)
            if task.get("capture") and train.stop_step is None:
                self.specs.setdefault(point_key(handle.identity), train)
            return handle

        def wait(self, handles: list[Any], timeout_s: float) -> list[Any]:
            if len(self.events) > self.seen:
                self.seen = len(self.events)
                if stop(self.events, self.compute_spent):
                    raise Decided
            return super().wait(handles, timeout_s)

    backend = Stopping(landscape, workers=task["workers"])
    backend.specs = {}
    try:
        submit(Session, settings, spec)
        Runner(settings, backend=backend).run(poll_s=0, timeout_s=task.get("timeout_s", 900))
    except Decided:
        pass
    except SpecError as exc:
        out["refused"] = str(exc)
        return None
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    return backend


def in_processes(fn: Any, tasks: list[dict[str, Any]], processes: int) -> list[Any]:
    """`fn` over `tasks` in `processes` fresh (spawned) processes, results in task order."""
    ctx = multiprocessing.get_context("spawn")
    with concurrent.futures.ProcessPoolExecutor(processes, mp_context=ctx) as pool:
        return list(pool.map(fn, tasks))


def _rank(v: list[float], p: float) -> float:
    return v[round(p * (len(v) - 1))]


def median_interval(values: list[float], seed: int = 0) -> dict[str, float]:
    """The median of `values` (nearest rank; a miss is ∞ and counts against it) and a 95%
    bootstrap interval of the median (`BOOTSTRAP` resamples)."""
    if not values:
        return {"median": math.nan, "lo": math.nan, "hi": math.nan}
    rng = random.Random(seed)
    n = len(values)
    medians = sorted(
        _rank(sorted(rng.choices(values, k=n)), 0.5) for _ in range(BOOTSTRAP if n > 1 else 1)
    )
    return {
        "median": _rank(sorted(values), 0.5),
        "lo": _rank(medians, 0.025),
        "hi": _rank(medians, 0.975),
    }


def summarise(rows: list[dict[str, Any]], tops: tuple[float, ...]) -> dict[str, Any]:
    if any("refused" in r for r in rows):
        return {"available": False, "why": next(r["refused"] for r in rows if "refused" in r)}
    if rows[0]["mode"] == "fidelity" and not any(r["shorter_runs"] for r in rows):
        why = "the runner trained every candidate to its full budget (no rung ran shorter)"
        return {"available": False, "why": why}
    inf = math.inf
    out: dict[str, Any] = {"available": True, "seeds": len(rows), "first": {}, "missed": {}}
    for q in map(str, tops):
        first = [r["first"][q] if r["first"][q] is not None else inf for r in rows]
        out["first"][q] = median_interval(first)
        out["missed"][q] = sum(x == inf for x in first)
    hv = [r["hv_reached"] if r["hv_reached"] is not None else inf for r in rows]
    out |= {
        "hv_at_cap": median_interval([r["hv_at_cap"] for r in rows]),
        "hv_reached": median_interval(hv),
        "hv_missed": sum(x == inf for x in hv),
        "best_pruned": sum(bool(r["best_pruned"]) for r in rows),
        "wall_s": sum(r["wall_s"] for r in rows),
    }
    return out


def _json_finite(x: Any) -> Any:
    """`x` with every non-finite float as None, all through (JSON has no ∞)."""
    if isinstance(x, float):
        return finite_or_none(x)
    if isinstance(x, dict):
        return {k: _json_finite(v) for k, v in x.items()}
    if isinstance(x, list | tuple):
        return [_json_finite(v) for v in x]
    return x


def _pct(x: float) -> str:
    """A share in percent: whole percents, one decimal under 10% (a large space's top 1% is
    reached with under 1% of its grid's compute)."""
    if x == math.inf:
        return "∞"
    if math.isnan(x):
        return "-"
    return f"{100 * x:.1f}" if 100 * x < 10 else f"{100 * x:.0f}"


def _cell(m: dict[str, float], missed: int) -> str:
    return f"{_pct(m['median'])} [{_pct(m['lo'])}, {_pct(m['hi'])}] ({missed})"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--landscape", type=Path, default=LANDSCAPE)
    parser.add_argument("--seeds", type=int, default=20, help="sampler seeds per strategy")
    parser.add_argument("--cap", type=float, default=1.0, help="compute cap, share of C_grid")
    parser.add_argument("--top", type=float, nargs="+", default=list(TOPS))
    parser.add_argument("--workers", type=int, default=1, help="simulated workers")
    parser.add_argument("--trials", type=int, help="n_trials per search (default: see module)")
    parser.add_argument("--strategies", nargs="*", default=list(STRATEGIES), choices=SAMPLERS)
    parser.add_argument("--modes", nargs="*", default=list(MODES), choices=MODES)
    parser.add_argument("--peers", nargs="*", default=list(PEER_SAMPLERS), choices=PEER_SAMPLERS)
    parser.add_argument(
        "--peer-pruners", nargs="*", default=list(PEER_PRUNERS), choices=PEER_PRUNERS
    )
    parser.add_argument(
        "--syne",
        nargs="*",
        default=list(SYNE_SCHEDULERS),
        choices=SYNE_SCHEDULERS,
        help="Syne Tune schedulers (run where a bench-only install imports, else skipped)",
    )
    parser.add_argument(
        "--objectives", nargs="+", default=["loss", "pareto"], choices=["loss", "pareto"]
    )
    parser.add_argument("--processes", type=int, default=2)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    for name in ("seeds", "workers", "processes"):
        if getattr(args, name) < 1:
            parser.error(f"--{name}: must be at least 1, got {getattr(args, name)}")
    if not 0 < args.cap <= 10:
        parser.error(f"--cap: a share of the grid's compute in (0, 10], got {args.cap}")
    if not all(0 < q < 1 for q in args.top):
        parser.error(f"--top: quantiles in (0, 1), got {args.top}")

    from nas_service.results.landscape import load_landscape
    from nas_service.store import upgrade
    from nas_service.store.jobs import optuna_storage

    landscape = load_landscape(args.landscape)
    means = truth(landscape)
    seeds_recorded = max(seed_counts(landscape).values(), default=0)
    size = grid_size(job_spec(landscape, "grid", "none", "loss", 0))
    tmp = tempfile.mkdtemp(
        prefix="ds-search-efficiency-", dir="/dev/shm" if Path("/dev/shm").is_dir() else None
    )
    template = Path(tmp) / "template.db"
    upgrade(f"sqlite:///{template}")
    optuna_storage(f"sqlite:///{template}")  # Optuna's tables too
    tops = tuple(args.top)
    base: dict[str, Any] = {
        "landscape": str(args.landscape),
        "template": str(template),
        "tmp": tmp,
        "workers": args.workers,
        "cap": args.cap,
        "tops": tops,
    }
    started = time.perf_counter()
    try:
        grid = run_search(
            base
            | dict(strategy="grid", mode="none", objectives="loss", seed=0)
            | {"n_trials": size, "capture": True}
        )
        ref = Reference(
            grid["compute"],
            [(loss, mem) for loss, mem, _ in grid["results"]],
            means,
            [tuple(p) for p in grid["points"]],
            tops,
        )
        keys = list(grid["specs"])
        base |= {
            "ref_compute": ref.compute,
            "ref_results": ref.front,
            "means": means,
            "reached": [tuple(p) for p in grid["points"]],
        }

        def trials(sampler: str) -> int:
            return args.trials or (size if sampler.endswith("grid") else 10 * size)

        tasks = [
            base | {"strategy": s, "mode": m, "objectives": o, "seed": k, "n_trials": trials(s)}
            for o in args.objectives
            for s in args.strategies
            for m in args.modes
            for k in range(args.seeds)
        ]
        peer = {"peer": True, "spec_keys": keys, "specs": [grid["specs"][k] for k in keys]}
        tasks += [
            base
            | peer
            | {"strategy": f"optuna-{s}", "mode": m, "objectives": o, "seed": k}
            | {"n_trials": trials(s)}
            for o in args.objectives
            for s in args.peers
            for m in (args.peer_pruners if o == "loss" else ["none"])
            for k in range(args.seeds)
        ]
        tasks += [
            base
            | peer
            | {"syne": True, "strategy": "syne-tune", "mode": m, "seed": k}
            | {"objectives": SYNE_OBJECTIVES[m], "n_trials": trials("")}
            for m in args.syne
            if SYNE_OBJECTIVES[m] in args.objectives
            for k in range(args.seeds)
        ]
        rows = in_processes(run_search, tasks, args.processes)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    wall = time.perf_counter() - started
    table: dict[str, dict[str, dict[str, Any]]] = {}
    for r in rows:
        table.setdefault(r["objectives"], {}).setdefault(f"{r['strategy']}/{r['mode']}", {})
    for o, names in table.items():
        for name in names:
            mine = [
                r for r in rows if r["objectives"] == o and f"{r['strategy']}/{r['mode']}" == name
            ]
            names[name] = summarise(mine, tops)

    one_seed = seeds_recorded <= 1
    print(
        f"search efficiency on {args.landscape.name}: {size} grid points answered from "
        f"{ref.points} recorded points, {args.seeds} seeds, {args.workers} worker(s), cap "
        f"{100 * args.cap:.0f}% of the grid's compute ({ref.compute:.3g} FLOPs), {wall:.0f} s"
    )
    print(
        "single objective: compute (% of the grid's) to a full-budget result in the top q by "
        + (
            "the recorded loss (one seed per point: no mean over seeds on this landscape)"
            if one_seed
            else f"true mean loss over {seeds_recorded} recorded seeds"
        )
        + "; "
        + ", ".join(f"top {100 * q:g}% = {len(ref.tops[q])} point(s)" for q in tops)
    )
    print(
        f"two objectives: hypervolume normalised by the grid's front ({len(ref.front)} points; "
        f"one point holds at most {100 * ref.largest_share:.0f}% alone, the best-loss point "
        f"alone {100 * ref.best_alone:.0f}%), reference (1.1, 1.1); target {100 * HV_SHARE:.0f}%"
    )
    print("cells: median [95% bootstrap interval] (seeds missed within the cap)")
    header = f"{'strategy/mode':<24}" + "".join(f" {'→top ' + f'{100 * q:g}%':>22}" for q in tops)
    print(header + f" {'best pruned':>11} {'HV@cap':>6} {'→' + f'{100 * HV_SHARE:.0f}%HV':>22}")
    empty: dict[str, Any] = {"available": False, "why": "not run"}
    rows_named = list(dict.fromkeys(k for o in table.values() for k in o))
    for name in rows_named:
        a, b = table.get("loss", {}).get(name, empty), table.get("pareto", {}).get(name, empty)
        if not a["available"] and not b["available"]:
            why = a["why"] if a["why"] != "not run" else b["why"]
            print(f"{name:<24} not available: {why}")
            continue
        cols = "".join(f" {'-':>22}" for _ in tops) + f" {'-':>11}"
        if a["available"]:
            cols = (
                "".join(f" {_cell(a['first'][str(q)], a['missed'][str(q)]):>22}" for q in tops)
                + f" {str(a['best_pruned']) + '/' + str(a['seeds']):>11}"
            )
        pareto = f" {'-':>6} {'-':>22}"
        if b["available"]:
            pareto = (
                f" {100 * b['hv_at_cap']['median']:>5.0f}%"
                f" {_cell(b['hv_reached'], b['hv_missed']):>22}"
            )
        print(f"{name:<24}{cols}{pareto}")
    if args.json:
        args.json.write_text(
            json.dumps(
                _json_finite(
                    {
                        "landscape": str(args.landscape),
                        "grid_points": size,
                        "seeds": args.seeds,
                        "recorded_seeds": seeds_recorded,
                        "workers": args.workers,
                        "cap": args.cap,
                        "tops": tops,
                        "reference": ref.as_dict(),
                        "summary": table,
                        "runs": [{k: v for k, v in r.items() if k != "specs"} for r in rows],
                        "wall_s": wall,
                    }
                ),
                indent=1,
            )
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
