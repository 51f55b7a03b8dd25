"""The runner at scale: 1,000 simulated workers, 20,000 trials of 60 simulated seconds on
PostgreSQL, the runner killed twice (SIGKILL) and restarted, on the simulated backend
(`nas_service.runner.simulated`, answers from bench/landscapes/crossover.json).

    python bench/scale.py [--workers 1000 --trials 20000 --duration 60 --kills 2] [--json FILE]
    python bench/scale.py --workers 50 --trials 500          # a quick run

The job: random sampling over the landscape's 12 architectures × its recorded lr and
depth_lr_mult (joint axes), one seed, `max_concurrent` = workers (the operator limits raised
to fit), in a fresh database of its own on the server at 127.0.0.1:5432 (dropped at the
end). The runner runs in a child process (`--child`); the parent kills it with SIGKILL by
its pid when a third and two thirds of the trials are counted, then starts a new one, whose
recovery re-enqueues what the killed one left running (the lease is 5 s, so it waits at most
that for it).

Measured:
- runner overhead per trial: in the child, the wall time of the runner's loop minus the time
  spent inside the backend's `wait` (the simulation's own work), over the trials it concluded
  (ask + price + launch + every database write + tell; summed over the lives);
- worker utilisation: busy worker-seconds / (workers × makespan), simulated, over the
  lives (a killed life counts until its last stats write, once a second);
- the database's size (`pg_database_size`) and the latency of the Pareto and optimum
  queries at the end (the HTTP app in process: the first call, then the median of 5);
- trials lost or duplicated (0 expected): the study has exactly n_trials counted trials,
  every trial a killed runner left is re-enqueued once (`ds_retry_of`) and counted once, and
  no counted trial was re-enqueued as well.

Findings (2 cores, PostgreSQL on 127.0.0.1, 60-s trials). Side by side, `--workers 100
--trials 600 --kills 0 --storage optuna` then `--storage owned`: 124 ms then 43 ms of runner
time per trial, utilisation 97.9% then 98.8%. With Optuna's cached storage every read
re-read every unfinished trial (a trial cost O(trials in flight)); the runner's own
`OwnedTrials` (`nas_service/store/optuna_storage.py`) re-reads only what changed.

The default run (1,000 workers, 20,000 trials, 2 SIGKILLs), side by side on one quiet
machine, before and after the runner recorded in bulk: recovery re-enqueues and fails a
job's left trials in one transaction (`OwnedTrials.requeue_lost`), a restarted runner reads
a study with one statement per Optuna table (`trial_tables.read_trials`), and the trials
asked in one pass of the loop are recorded together at its end (`Outcomes.record_asked`):
24.8 ms of runner time per trial and 94.8% utilisation (lives 97.3%, 96.2%, 91.6%) before,
18.5 ms and 95.5% (97.8%, 97.0%, 92.4%) after, and again 19.0 ms and 95.5% (97.8%, 96.9%,
92.4%); the session's starting commit measured 25.1 ms and 92.8% (97.5%, 93.2%, 88.6%) on
that machine. Makespan 1,302 s against an ideal 1,200 s, 20,000 trials counted, 1,998 left
by the kills re-enqueued, 0 lost, 0 duplicated; a retry keeps its trial's parameters,
except a trial asked in the pass the runner died in, whose parameters were not recorded yet
(`retries_sampled_afresh`); the database 114 MiB; Pareto and optimum 13 ms warm (1.6 s and
0.5 s for the first call, which builds the results cache of 22,000 trials).

Where the rest goes. The runner keeps up in the steady state (about 50 trials/s against
the 16.7/s that 1,000 workers of 60-s trials need); what is left is at the edges of a life.
Each life starts with every worker idle while the runner asks a trial per worker (about 7 s
for 1,000), a restart adds its recovery (about 2 s), and the last life ends with a tail: the
workers' phases spread over the 60 s of a trial, so the last trials end over up to a trial's
length while the others wait. The first two lives (no tail) reach 97-98%; the last, with
the tail, 92%. Past it: asking trials in bulk at a life's start (Optuna creates a trial at a
time, one transaction of four statements each: half of what is left of the first pass),
and beyond one runner per cluster, runners that split a cluster's jobs.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

ROOT = Path(__file__).resolve().parents[1]
LANDSCAPE = ROOT / "bench" / "landscapes" / "crossover.json"
PG_ADMIN = "postgresql+psycopg://postgres@127.0.0.1:5432/postgres"
LEASE_S = 5.0


def settings_for(url: str, workers: int, trials: int) -> Any:
    from nas_service.settings import get_settings

    return get_settings(
        database_url=url,
        max_trials=max(trials, 1000),
        max_concurrent_trials=max(workers, 64),
        max_job_runs=max(trials, 20_000),
        runner_lease_s=LEASE_S,
        max_trial_recoveries=10,
    )


def job_spec(trials: int, workers: int) -> dict[str, Any]:
    from nas_service.results.landscape import load_landscape

    spec: dict[str, Any] = load_landscape(LANDSCAPE).job.spec.model_dump(mode="json")
    tune = spec.pop("tune") or {}
    return spec | {
        "name": "scale",
        "training": spec["training"] | {k: tune[k] for k in ("lr", "depth_lr_mult")},
        "tune": None,
        "seeds": 1,
        "sampler": "random",
        "pruner": "none",
        "n_trials": trials,
        "max_concurrent": workers,
    }


# -- the child: one runner life -----------------------------------------------------------
def child(args: argparse.Namespace) -> int:
    import optuna

    from nas_service.results.landscape import load_landscape
    from nas_service.runner.loop import Runner
    from nas_service.runner.simulated import SimulatedBackend
    from workers.contract import TrainResult

    optuna.logging.set_verbosity(optuna.logging.ERROR)
    logging.basicConfig(level=logging.WARNING)
    settings = settings_for(args.database_url, args.workers, args.trials)
    stats_path = Path(args.stats)

    class Measured(SimulatedBackend):
        in_wait = 0.0
        results = 0
        started = time.perf_counter()
        written = 0.0

        def wait(self, handles: list[Any], timeout_s: float) -> list[Any]:
            start = time.perf_counter()
            try:
                return super().wait(handles, timeout_s)
            finally:
                now = time.perf_counter()
                self.in_wait += now - start
                if now - self.written > 1.0:
                    self.write()

        def next_item(self, handle: Any) -> Any:
            item = super().next_item(handle)
            self.results += isinstance(item, TrainResult)
            return item

        def write(self, final: bool = False) -> None:
            self.written = time.perf_counter()
            wall = self.written - self.started
            stats = self.counters() | {
                "wall_s": wall,
                "in_wait_s": self.in_wait,
                "trials_concluded": self.results,
                "final": final,
            }
            tmp = stats_path.with_suffix(".tmp")
            tmp.write_text(json.dumps(stats))
            tmp.replace(stats_path)

    backend = Measured(load_landscape(LANDSCAPE), workers=args.workers, duration_s=args.duration)
    runner = Runner(settings, backend=backend)
    if args.storage == "optuna":  # Optuna's own cache: every unfinished trial re-read per read
        from nas_service.store.jobs import optuna_storage

        runner.storage = optuna_storage(args.database_url)
    backend.started = time.perf_counter()
    if args.profile:  # the runner's loop under cProfile, written when the life ends
        import cProfile

        profile = cProfile.Profile()
        profile.runcall(runner.run, poll_s=0, timeout_s=args.timeout)
        profile.dump_stats(args.profile)
    else:
        runner.run(poll_s=0, timeout_s=args.timeout)
    backend.write(final=True)
    return 0


# -- the parent -----------------------------------------------------------------------------
def counted_now(url: str, study_name: str) -> int:
    """Finished trials of the study (lost ones included: a trigger, not the check)."""
    from sqlalchemy import create_engine, text

    engine = create_engine(url)
    try:
        with engine.connect() as c:
            return int(
                c.execute(
                    text(
                        "SELECT count(*) FROM trials t JOIN studies s ON s.study_id = t.study_id "
                        "WHERE s.study_name = :n AND t.state IN ('COMPLETE', 'PRUNED', 'FAIL')"
                    ),
                    {"n": study_name},
                ).scalar_one()
            )
    finally:
        engine.dispose()


def start_child(args: argparse.Namespace, url: str, stats: Path, log: Any) -> subprocess.Popen[Any]:
    cmd = [
        sys.executable,
        str(Path(__file__).resolve()),
        "--child",
        "--database-url",
        url,
        "--workers",
        str(args.workers),
        "--trials",
        str(args.trials),
        "--duration",
        str(args.duration),
        "--stats",
        str(stats),
        "--timeout",
        str(args.timeout),
        "--storage",
        args.storage,
        *(["--profile", str(args.profile)] if args.profile else []),
    ]
    return subprocess.Popen(cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)


def check_trials(url: str, study_name: str, n_trials: int) -> dict[str, Any]:
    """Counted trials, and trials lost or duplicated by the kills."""
    import optuna
    from optuna.trial import TrialState

    from nas_service.store.jobs import optuna_storage
    from nas_service.store.records import TrialAttr

    study = optuna.load_study(study_name=study_name, storage=optuna_storage(url))
    trials = study.get_trials(deepcopy=False)
    finished = (TrialState.COMPLETE, TrialState.PRUNED, TrialState.FAIL)
    counted = [t for t in trials if t.state in finished and not t.user_attrs.get(TrialAttr.LOST)]
    by_number = {t.number: t for t in trials}
    left = [t for t in trials if t.user_attrs.get(TrialAttr.LOST)]
    retries: dict[int, list[Any]] = {}
    for t in trials:
        if t.user_attrs.get(TrialAttr.RETRY_OF) is not None:
            retries.setdefault(int(t.user_attrs[TrialAttr.RETRY_OF]), []).append(t)
    counted_ids = {t.number for t in counted}

    def descendant_counted(number: int, depth: int = 0) -> int:
        """How many counted trials stand for the lost trial `number` (following re-losses)."""
        total = 0
        for r in retries.get(number, []):
            if r.number in counted_ids:
                total += 1
            elif r.user_attrs.get(TrialAttr.LOST) and depth < 10:
                total += descendant_counted(r.number, depth + 1)
        return total

    lost = sum(descendant_counted(t.number) == 0 for t in left)
    duplicated = sum(max(0, descendant_counted(t.number) - 1) for t in left)
    duplicated += sum(1 for n in retries if n in counted_ids)  # counted and re-run too
    # a retry keeps its trial's parameters, unless the runner died in the pass of its loop
    # that asked the trial, before recording it: then none were recorded, and the retry is
    # sampled afresh (`nas_service.runner.recovery`)
    originals = [
        (by_number[int(r.user_attrs[TrialAttr.RETRY_OF])], r) for rs in retries.values() for r in rs
    ]
    same_params = all(t.params == r.params for t, r in originals if t.params)
    afresh = sum(1 for t, _ in originals if not t.params)
    return {
        "counted": len(counted),
        "expected": n_trials,
        "left_by_kills": len(left),
        "lost": lost,
        "duplicated": duplicated,
        "retries_keep_params": same_params,
        "retries_sampled_afresh": afresh,
        "all_trials": len(trials),
    }


def query_latency(url: str, job_id: str, calls: int = 5) -> dict[str, dict[str, float]]:
    from fastapi.testclient import TestClient

    from nas_service.api.app import create_app
    from nas_service.settings import get_settings

    app = create_app(get_settings(database_url=url, results_fresh_s=0.0))
    out: dict[str, dict[str, float]] = {}
    with TestClient(app) as c:
        for name, path, params in (
            ("pareto", "pareto", {"metrics": "val_loss,train_memory_bytes"}),
            ("optimum", "optimum", {"bootstrap": 200}),
        ):
            times = []
            for _ in range(calls + 1):
                start = time.perf_counter()
                r = c.get(f"/v1/jobs/{job_id}/{path}", params=params)
                times.append((time.perf_counter() - start) * 1e3)
                assert r.status_code == 200, r.text[:500]
            out[name] = {"first_ms": times[0], "median_ms": statistics.median(times[1:])}
    return out


def parent(args: argparse.Namespace) -> int:
    from sqlalchemy import create_engine, text

    from nas_service.jobs import submit
    from nas_service.store import Job, make_engine, make_sessionmaker, upgrade

    name = f"ds_scale_{uuid.uuid4().hex[:10]}"
    admin = create_engine(args.admin_url, isolation_level="AUTOCOMMIT")
    with admin.connect() as c:
        c.execute(text(f'CREATE DATABASE "{name}"'))
    url = args.admin_url.rsplit("/", 1)[0] + f"/{name}"
    folder = Path(tempfile.mkdtemp(prefix="ds-scale-"))
    lives: list[dict[str, Any]] = []
    started = time.perf_counter()
    try:
        upgrade(url)
        settings = settings_for(url, args.workers, args.trials)
        engine = make_engine(url)
        Session = make_sessionmaker(engine)
        job = submit(Session, settings, job_spec(args.trials, args.workers))
        thresholds = [args.trials * (i + 1) // (args.kills + 1) for i in range(args.kills)]
        for life in range(args.kills + 1):
            stats = folder / f"life{life}.json"
            with (folder / f"life{life}.log").open("w") as log:
                proc = start_child(args, url, stats, log)
                if life < args.kills:
                    while counted_now(url, job.study_name) < thresholds[life]:
                        if proc.poll() is not None:
                            break
                        time.sleep(0.5)
                    if proc.poll() is None:
                        os.kill(proc.pid, signal.SIGKILL)
                proc.wait()
            life_stats = json.loads(stats.read_text()) if stats.exists() else {}
            life_stats["returncode"] = proc.returncode
            lives.append(life_stats)
            if proc.returncode not in (0, -signal.SIGKILL):
                print((folder / f"life{life}.log").read_text()[-3000:], file=sys.stderr)
                raise SystemExit(f"runner life {life} exited with {proc.returncode}")
        wall = time.perf_counter() - started
        with Session() as s:
            row = s.get(Job, job.id)
            assert row is not None
            status = str(row.status)
        check = check_trials(url, job.study_name, args.trials)
        with engine.connect() as c:
            size = int(c.execute(text("SELECT pg_database_size(current_database())")).scalar_one())
        latency = query_latency(url, job.id)
        engine.dispose()
    finally:
        with admin.connect() as c:
            c.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()
        shutil.rmtree(folder, ignore_errors=True)
    concluded = sum(life.get("trials_concluded", 0) for life in lives)
    runner_s = sum(life.get("wall_s", 0.0) - life.get("in_wait_s", 0.0) for life in lives)
    span = sum(life.get("makespan_s", 0.0) for life in lives)
    # each life's utilisation counts its running runs up to its last stats write
    busy = sum(
        life.get("utilisation", 0.0) * args.workers * life.get("makespan_s", 0.0) for life in lives
    )
    result = {
        "workers": args.workers,
        "trials": args.trials,
        "duration_s": args.duration,
        "kills": args.kills,
        "job_status": status,
        "wall_s": wall,
        "overhead_ms_per_trial": 1e3 * runner_s / concluded if concluded else None,
        "utilisation": busy / (args.workers * span) if span else None,
        "simulated_makespan_s": span,
        "ideal_makespan_s": args.trials * args.duration / args.workers,
        "database_bytes": size,
        "latency_ms": latency,
        "check": check,
        "lives": lives,
    }
    print(
        f"scale: {args.trials} trials of {args.duration:g} s on {args.workers} simulated "
        f"workers, runner killed {args.kills}× — {wall:.0f} s wall, job {status}"
    )
    rows = [
        ("runner overhead per trial", f"{result['overhead_ms_per_trial'] or 0:.1f} ms"),
        ("worker utilisation", f"{100 * (result['utilisation'] or 0):.1f} %"),
        ("simulated makespan / ideal", f"{span:.0f} s / {result['ideal_makespan_s']:.0f} s"),
        ("database size", f"{size / 2**20:.1f} MiB"),
        (
            "pareto query (first / median)",
            "{first_ms:.0f} / {median_ms:.0f} ms".format(**latency["pareto"]),
        ),
        (
            "optimum query (first / median)",
            "{first_ms:.0f} / {median_ms:.0f} ms".format(**latency["optimum"]),
        ),
        ("counted / expected trials", f"{check['counted']} / {check['expected']}"),
        (
            "left by the kills, lost, duplicated",
            f"{check['left_by_kills']}, {check['lost']}, {check['duplicated']}",
        ),
    ]
    for label, value in rows:
        print(f"  {label:<38} {value:>16}")
    if args.json:
        args.json.write_text(json.dumps(result, indent=1))
    ok = check["lost"] == 0 and check["duplicated"] == 0 and check["counted"] == args.trials
    return 0 if ok and status == "completed" else 1


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=1000)
    parser.add_argument("--trials", type=int, default=20_000)
    parser.add_argument("--duration", type=float, default=60.0, help="simulated s per trial")
    parser.add_argument("--kills", type=int, default=2, help="SIGKILLs of the runner")
    parser.add_argument("--admin-url", default=PG_ADMIN, help="a database to create ours from")
    parser.add_argument("--timeout", type=float, default=3600.0, help="per runner life")
    parser.add_argument(
        "--storage",
        choices=("owned", "optuna"),
        default="owned",
        help="the runner's study cache: its own (default) or Optuna's, for comparison",
    )
    parser.add_argument("--json", type=Path)
    parser.add_argument(
        "--profile", type=Path, help="cProfile of the runner's last life to FILE (pstats)"
    )
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--database-url", help=argparse.SUPPRESS)
    parser.add_argument("--stats", help=argparse.SUPPRESS)
    args = parser.parse_args()
    return child(args) if args.child else parent(args)


if __name__ == "__main__":
    sys.exit(main())
