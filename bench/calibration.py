"""Calibration of the roofline on the CPU from a real job: the runner trains a grid of tiny
candidates on the local Ray (the built-in corpus), then the service's calibration
(`nas_service.results.calibration`, as `GET /v1/jobs/{id}/calibration` answers it) fits
t ≈ a·compute_s + b·memory_s + c to the measured steps and reports the cross-validated
median and 90th-percentile relative error, calibrated against the raw roofline's, and the
measured peak memory against the analytic.

    python bench/calibration.py [--layers 1,2,4 --widths 32,64,128,192 --tokens 15360]
                                [--concurrency 1] [--json FILE] [--plot FILE]

The grid is layers × widths × {baseline, block_attnres S=2}: 24 trials by default. The
trainer's step is `training.batch_size` (8) × `seq_len` (64) tokens; every trial trains
`--tokens` tokens (30 steps by default) with one intra-op thread.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import optuna

from nas_service.jobs import submit
from nas_service.results.cache import ResultsCache
from nas_service.results.calibration import plot_calibration
from nas_service.results.queries import calibration
from nas_service.runner.loop import Runner, connect_ray
from nas_service.settings import ClusterSettings, get_settings
from nas_service.store import Job, make_engine, make_sessionmaker, upgrade
from nas_service.store.jobs import optuna_storage


def job_spec(args: argparse.Namespace) -> dict[str, Any]:
    layers = [int(v) for v in args.layers.split(",")]
    widths = [int(v) for v in args.widths.split(",")]
    return {
        "name": "calibration-bench",
        "space": {
            "n_layers": layers,
            "d_model": widths,
            "head_dim": 16,
            "variants": ["baseline", "block_attnres"],
            "block_sizes": [2],
        },
        "budget": {"tokens": args.tokens},
        "objectives": ["val_loss"],
        "sampler": "grid",
        "pruner": "none",
        "n_trials": len(layers) * len(widths) * 2,
        "max_concurrent": args.concurrency,
        "training": {
            "seq_len": 64,
            "batch_size": 8,
            "n_evals": 2,
            "eval_batches": 2,
            "threads": 1,
        },
        "cost": {"hardware": "cpu"},
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", default="1,2,4")
    parser.add_argument("--widths", default="32,64,128,192")
    parser.add_argument("--tokens", type=int, default=8 * 64 * 30, help="budget per trial")
    parser.add_argument("--concurrency", type=int, default=1)
    parser.add_argument("--database-url", help="default: a fresh SQLite file")
    parser.add_argument("--job", help="report on this job of --database-url (no training)")
    parser.add_argument("--json", type=Path)
    parser.add_argument("--plot", type=Path)
    args = parser.parse_args()
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    url = args.database_url or f"sqlite:///{tempfile.mkdtemp()}/calibration.db"
    upgrade(url)
    cluster = ClusterSettings(num_cpus=max(1, args.concurrency))
    settings = get_settings(database_url=url, clusters={"local": cluster})
    Session = make_sessionmaker(make_engine(url))
    spec = job_spec(args)
    elapsed = None
    if args.job is None:
        connect_ray(cluster)
        job_id = submit(Session, settings, spec).id
        start = time.perf_counter()
        Runner(settings).run(timeout_s=3600, poll_s=0.05)
        elapsed = time.perf_counter() - start
    else:
        job_id = args.job
    cache = ResultsCache(optuna_storage(url, settings), job_runs=True)
    with Session() as session:
        answer = calibration(session, cache, job_id)
        job = session.get(Job, job_id)
        n_trials = job.n_trials if job is not None else 0
    took = f", trained in {elapsed:.0f} s" if elapsed is not None else ""
    print(
        f"calibration bench: job {job_id} of {n_trials} trials on the CPU{took}; {answer.message}"
    )
    for g in answer.groups:
        print(
            f"{g.device_kind}: peaks {g.peak_flops:.3g} FLOP/s, {g.memory_bandwidth:.3g} B/s "
            f"(measured); {g.trials} trials"
        )
        if g.model is not None and g.cross_validation is not None:
            m, cv = g.model, g.cross_validation
            print(
                f"  fit: t = {m.compute_factor:.3g}·compute_s + {m.memory_factor:.3g}·memory_s "
                f"+ {m.overhead_s * 1e3:.3g} ms"
            )
            print(f"  {'relative error':28} {'median':>8} {'p90':>8}")
            print(f"  {'calibrated (' + str(cv.folds) + '-fold CV)':28} ", end="")
            print(f"{cv.median_error:8.1%} {cv.p90_error:8.1%}")
            print(f"  {'raw roofline':28} {cv.roofline_median_error:8.1%}", end="")
            print(f" {cv.roofline_p90_error:8.1%}")
        for mem in g.memory:
            ratios = [mem.median_ratio, mem.median_activation_ratio, mem.median_state_ratio]
            text = ["-" if r is None else f"{r:.4f}" for r in ratios]
            print(
                f"  memory ({mem.memory_kind}), measured / analytic, median: {text[0]} in all, "
                f"activations {text[1]}, state {text[2]}"
            )
        print(f"  {'trial':>5} {'variant':14} {'measured ms':>12} {'roofline ms':>12} {'CV ms':>9}")
        for p in sorted(g.points, key=lambda p: p.measured_s):
            cv_ms = f"{p.cv_predicted_s * 1e3:9.2f}" if p.cv_predicted_s is not None else "-"
            print(
                f"  {p.trial:>5} {p.variant:14} {p.measured_s * 1e3:12.2f} "
                f"{p.roofline_s * 1e3:12.3f} {cv_ms}"
            )
    if args.json:
        args.json.write_text(json.dumps(answer.model_dump(mode="json"), indent=1))
    if args.plot:
        plot_calibration(answer, str(args.plot))
    return 0 if answer.ready else 1


if __name__ == "__main__":
    sys.exit(main())
