"""Storage throughput: ask + tell per second with 8 concurrent jobs (one process and one study
each, in the same database), SQLite and PostgreSQL side by side. Each cycle writes what the
runner writes: the architecture and cost attributes, then the values.

    python bench/storage.py [--jobs 8 --cycles 40 --repeats 3] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def _support() -> Any:
    """bench/support.py, loaded by path (bench/ is no package)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(
        "bench_support", Path(__file__).resolve().parent / "support.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _worker(url: str, name: str, cycles: int, barrier: object) -> None:
    import optuna

    from nas_service.store.jobs import optuna_storage
    from nas_service.store.records import TrialAttr

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.load_study(study_name=name, storage=optuna_storage(url))
    costs = {f"metric_{i}": float(i) for i in range(19)}
    barrier.wait()  # type: ignore[attr-defined]
    for i in range(cycles):
        trial = study.ask()
        x = trial.suggest_int("n_layers", 1, 32)
        trial.set_user_attr(TrialAttr.ARCH, {"n_layers": x, "d_model": 64 * i})
        trial.set_user_attr(TrialAttr.COSTS, costs)
        study.tell(trial, [float(x), float(i)])


def measure(url: str, jobs: int, cycles: int) -> float:
    import optuna

    from nas_service.store.jobs import optuna_storage

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    storage = optuna_storage(url)
    names = []
    for _ in range(jobs):
        name = f"bench-{uuid.uuid4().hex[:8]}"
        optuna.create_study(study_name=name, storage=storage, directions=["minimize", "minimize"])
        names.append(name)
    ctx = mp.get_context("spawn")
    barrier = ctx.Barrier(jobs + 1)
    procs = [ctx.Process(target=_worker, args=(url, n, cycles, barrier)) for n in names]
    for p in procs:
        p.start()
    barrier.wait()
    start = time.perf_counter()
    for p in procs:
        p.join()
    wall = time.perf_counter() - start
    if any(p.exitcode for p in procs):
        raise RuntimeError("a worker failed")
    return jobs * cycles / wall


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=8)
    parser.add_argument("--cycles", type=int, default=40)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    rates: dict[str, list[float]] = {"sqlite": [], "postgresql": []}
    for _ in range(args.repeats):  # interleaved
        rates["sqlite"].append(
            measure(f"sqlite:///{tempfile.mkdtemp()}/s.db", args.jobs, args.cycles)
        )
        url, drop = _support().temp_postgres()
        try:
            rates["postgresql"].append(measure(url, args.jobs, args.cycles))
        finally:
            drop()
    print(
        f"storage: {args.jobs} concurrent jobs × {args.cycles} ask+tell, median of {args.repeats}"
    )
    print(f"{'backend':12} {'ask+tell/s':>11}")
    for name, values in rates.items():
        print(f"{name:12} {statistics.median(values):11.1f}")
    ratio = statistics.median(
        p / s for p, s in zip(rates["postgresql"], rates["sqlite"], strict=True)
    )
    print(f"postgresql / sqlite: {ratio:.2f}")
    if args.json:
        args.json.write_text(json.dumps({"benchmark": "storage", "rates": rates}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
