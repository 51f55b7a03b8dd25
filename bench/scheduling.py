"""Scheduling efficiency of the runner: a job of short trials on a fixed number of worker
slots; makespan divided by the ideal (the sum of the trials' own training times / slots).

    python bench/scheduling.py [--trials 20 --slots 2 --repeats 3] [--json FILE]

Target: ≤ 1.15.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import optuna

from nas_service.jobs import submit
from nas_service.runner.loop import Runner, connect_ray
from nas_service.settings import ClusterSettings, get_settings
from nas_service.store import make_engine, make_sessionmaker, upgrade
from nas_service.store.jobs import optuna_storage
from nas_service.store.records import TrialAttr


def one_run(url: str, trials: int, slots: int, tokens: int) -> dict[str, float]:
    settings = get_settings(database_url=url, clusters={"local": ClusterSettings(num_cpus=slots)})
    upgrade(url)
    Session = make_sessionmaker(make_engine(url))
    spec = {
        "name": "scheduling",
        "space": {
            "n_layers": [1, 2],
            "d_model": [32, 64],
            "head_dim": 16,
            "variants": ["baseline"],
        },
        "budget": {"tokens": tokens},
        "sampler": "random",
        "pruner": "none",
        "n_trials": trials,
        "max_concurrent": slots,
        "training": {"seq_len": 32, "batch_size": 4, "n_evals": 2, "eval_batches": 2, "threads": 1},
        "cost": {"hardware": "cpu"},
    }
    job = submit(Session, settings, spec)
    start = time.perf_counter()
    Runner(settings).run(timeout_s=1800, poll_s=0.05)
    makespan = time.perf_counter() - start
    study = optuna.load_study(study_name=job.study_name, storage=optuna_storage(url))
    busy = sum(t.user_attrs[TrialAttr.TRAIN][0]["wall_time_s"] for t in study.trials)
    ideal = busy / slots
    return {"makespan_s": makespan, "ideal_s": ideal, "ratio": makespan / ideal}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=20)
    parser.add_argument("--slots", type=int, default=2)
    parser.add_argument("--tokens", type=int, default=4 * 32 * 150, help="budget per trial")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--database-url", help="default: a fresh SQLite file per run")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    connect_ray(ClusterSettings(num_cpus=args.slots))
    one_run(
        f"sqlite:///{tempfile.mkdtemp()}/warm.db", args.slots, args.slots, args.tokens
    )  # warm workers
    rows = []
    for _ in range(args.repeats):
        url = args.database_url or f"sqlite:///{tempfile.mkdtemp()}/bench.db"
        rows.append(one_run(url, args.trials, args.slots, args.tokens))
    ratio = statistics.median(r["ratio"] for r in rows)
    print(f"scheduling: {args.trials} trials on {args.slots} slots, median of {args.repeats} runs")
    print(f"{'run':>4} {'makespan s':>11} {'ideal s':>9} {'ratio':>7}")
    for i, r in enumerate(rows):
        print(f"{i:>4} {r['makespan_s']:11.2f} {r['ideal_s']:9.2f} {r['ratio']:7.3f}")
    print(f"median makespan / ideal: {ratio:.3f} (target ≤ 1.15)")
    if args.json:
        args.json.write_text(
            json.dumps({"benchmark": "scheduling", "runs": rows, "ratio": ratio}, indent=2)
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
