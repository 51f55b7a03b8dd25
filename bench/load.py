"""Load on the real service (`depthscope serve`, its runner and local Ray, on loopback):
concurrent clients polling jobs that are training, then a burst of concurrent submissions
against the active-job limit.

Phase 1: the service trains `--jobs` small jobs; `--clients` asyncio clients each poll, for
`--seconds`, GET /v1/jobs/{id} (status), GET /v1/jobs/{id}/trials and
GET /v1/jobs/{id}/pareto?metrics=val_loss,train_memory_bytes in turn (one of the jobs each,
round robin), `--interval` seconds between rounds. Per route and overall: requests, errors
(non-2xx and exceptions), p50/p95/p99 latency.

Phase 2: the jobs are cancelled; `--submits` concurrent POST /v1/jobs against
`max_concurrent_jobs` (`--max-jobs`, DEPTHSCOPE_MAX_CONCURRENT_JOBS): how many were accepted
(it must equal the limit less the active jobs), the status codes, the 5xx.

    python bench/load.py [--db sqlite|postgres] [--seconds 30] [--clients 50] [--json FILE]

Targets: 0 errors, p95 ≤ 100 ms per route, accepted == limit − active, no 5xx. The service
runs in a process session of its own; at the end exactly its processes are stopped (its
group and its process tree: Ray's workers sit in groups of their own). `--db postgres` uses a
fresh database on the server at 127.0.0.1:5432, dropped afterwards.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # the project before bench/ (whose cost_model.py would shadow it)

from bench.served import RawHTTP, Service  # noqa: E402  (bench/ as a namespace package of the root)

P95_TARGET_MS = 100.0
JOB: dict[str, Any] = {
    "name": "load",
    "space": {
        "n_layers": [1, 2],
        "d_model": [32, 64],
        "head_dim": 16,
        "variants": ["baseline", "block_attnres"],
        "block_sizes": [1],
    },
    "budget": {"tokens": 4 * 32 * 100},
    "objectives": ["val_loss", "train_memory_bytes"],
    "sampler": "random",
    "pruner": "none",
    "n_trials": 500,  # more than the measurement can finish: the jobs keep training
    "max_concurrent": 1,
    "training": {"seq_len": 32, "batch_size": 4, "n_evals": 4, "eval_batches": 2, "threads": 1},
    "cost": {"hardware": "cpu"},
}
PARETO = {"metrics": "val_loss,train_memory_bytes"}


# -- measurement --------------------------------------------------------------------------


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    k = (len(ordered) - 1) * q
    lo, hi = int(k), min(int(k) + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (k - lo)


def summarise(samples: list[tuple[float, int | str]]) -> dict[str, Any]:
    lat = [ms for ms, _ in samples]
    codes = collections.Counter(str(c) for _, c in samples)
    errors = sum(n for c, n in codes.items() if not (c.isdigit() and 200 <= int(c) < 300))
    return {
        "requests": len(samples),
        "errors": errors,
        "codes": dict(codes),
        "p50_ms": percentile(lat, 0.50),
        "p95_ms": percentile(lat, 0.95),
        "p99_ms": percentile(lat, 0.99),
        "max_ms": max(lat) if lat else float("nan"),
    }


def poll_phase(
    base: str, job_ids: list[str], clients: int, seconds: float, interval: float, procs: int
) -> dict[str, Any]:
    """The poll phase with the clients spread over `procs` processes (50 users are 50
    browsers, not one Python event loop: one loop driving them all on these cores adds its
    own queueing to every latency it measures)."""
    import concurrent.futures
    import multiprocessing

    procs = max(1, min(procs, clients))
    shares = [list(range(i, clients, procs)) for i in range(procs)]
    work = [(base, job_ids, share, clients, seconds, interval) for share in shares]
    if procs == 1:
        parts = [_poll_clients(work[0])]
    else:
        ctx = multiprocessing.get_context("spawn")
        with concurrent.futures.ProcessPoolExecutor(procs, mp_context=ctx) as pool:
            parts = list(pool.map(_poll_clients, work))
    samples: dict[str, list[tuple[float, int | str]]] = {r: [] for r in parts[0][0]}
    for part, _ in parts:
        for name, values in part.items():
            samples[name] += values
    elapsed = max(e for _, e in parts)
    out = {name: summarise(v) for name, v in samples.items()}
    out["all"] = summarise([x for v in samples.values() for x in v])
    out["all"]["per_s"] = out["all"]["requests"] / elapsed
    out["all"]["client_processes"] = procs
    return out


def _poll_clients(
    args: tuple[str, list[str], list[int], int, float, float],
) -> tuple[dict[str, list[tuple[float, int | str]]], float]:
    return asyncio.run(_poll(*args))


async def _poll(
    base: str, job_ids: list[str], mine: list[int], clients: int, seconds: float, interval: float
) -> tuple[dict[str, list[tuple[float, int | str]]], float]:
    query = "&".join(f"{k}={v}" for k, v in PARETO.items())
    routes = {
        "status": "/v1/jobs/{}",
        "trials": "/v1/jobs/{}/trials",
        "pareto": "/v1/jobs/{}/pareto?" + query,
    }
    samples: dict[str, list[tuple[float, int | str]]] = {r: [] for r in routes}
    deadline = time.monotonic() + seconds

    async def client(i: int) -> None:
        job = job_ids[i % len(job_ids)]
        http = RawHTTP(base)
        await asyncio.sleep(interval * i / clients)  # spread the clients' rounds
        order = list(routes.items())
        try:
            while time.monotonic() < deadline:
                order = order[1:] + order[:1]  # each route in each place of a round in turn
                for name, template in order:
                    start = time.perf_counter()
                    try:
                        code: int | str = await asyncio.wait_for(http.get(template.format(job)), 30)
                    except (OSError, asyncio.IncompleteReadError, TimeoutError, ValueError) as exc:
                        code = type(exc).__name__
                        await http.close()
                        http = RawHTTP(base)
                    samples[name].append(((time.perf_counter() - start) * 1e3, code))
                if interval:
                    await asyncio.sleep(interval)
        finally:
            await http.close()

    started = time.monotonic()
    await asyncio.gather(*(client(i) for i in mine))
    elapsed = time.monotonic() - started
    return samples, elapsed


async def submit_phase(base: str, submits: int) -> dict[str, Any]:
    codes: list[int | str] = []
    accepted: list[str] = []
    limits = httpx.Limits(max_connections=submits, max_keepalive_connections=submits)
    async with httpx.AsyncClient(base_url=base, timeout=60, limits=limits) as http:
        barrier = asyncio.Event()

        async def submit(i: int) -> None:
            await barrier.wait()
            spec = JOB | {"name": f"burst{i}", "n_trials": 2, "sampler_seed": i}
            try:
                r = await http.post("/v1/jobs", json=spec)
                codes.append(r.status_code)
                if r.status_code == 201:
                    accepted.append(str(r.json()["id"]))
            except httpx.HTTPError as exc:
                codes.append(type(exc).__name__)

        tasks = [asyncio.create_task(submit(i)) for i in range(submits)]
        await asyncio.sleep(0.1)
        start = time.perf_counter()
        barrier.set()
        await asyncio.gather(*tasks)
        elapsed_ms = (time.perf_counter() - start) * 1e3
        for job_id in accepted:  # do not leave them to train
            with contextlib.suppress(httpx.HTTPError):
                await http.post(f"/v1/jobs/{job_id}/cancel")
    hist = collections.Counter(str(c) for c in codes)
    return {
        "submitted": submits,
        "accepted": len(accepted),
        "codes": dict(hist),
        "server_errors": sum(n for c, n in hist.items() if c.isdigit() and int(c) >= 500),
        "exceptions": sum(n for c, n in hist.items() if not c.isdigit()),
        "elapsed_ms": elapsed_ms,
    }


SERVER_ROUTES = {
    "status": "/v1/jobs/{job_id}",
    "trials": "/v1/jobs/{job_id}/trials",
    "pareto": "/v1/jobs/{job_id}/pareto",
}


def server_histograms(http: httpx.Client) -> dict[str, dict[float, float]]:
    """Per polled route, the service's own cumulative latency buckets (upper bound in
    seconds → requests), from its Prometheus histogram of successful GETs."""
    from prometheus_client.parser import text_string_to_metric_families

    out: dict[str, dict[float, float]] = {name: {} for name in SERVER_ROUTES}
    routes = {v: k for k, v in SERVER_ROUTES.items()}
    for family in text_string_to_metric_families(http.get("/metrics").text):
        if family.name != "depthscope_http_request_duration_seconds":
            continue
        for sample in family.samples:
            labels = sample.labels
            name = routes.get(labels.get("route", ""))
            if sample.name.endswith("_bucket") and name and labels.get("status") == "200":
                le = float(labels["le"])
                out[name][le] = out[name].get(le, 0.0) + sample.value
    return out


def histogram_quantile(buckets: dict[float, float], q: float) -> float:
    """Prometheus's `histogram_quantile`: linear within the bucket holding the quantile."""
    bounds = sorted(buckets)
    if not bounds or buckets[bounds[-1]] <= 0:
        return float("nan")
    rank = q * buckets[bounds[-1]]
    lower, below = 0.0, 0.0
    for upper in bounds:
        count = buckets[upper]
        if count >= rank:
            if upper == float("inf"):
                return lower
            return lower + (upper - lower) * (rank - below) / max(count - below, 1e-12)
        lower, below = upper, count
    return lower


def server_view(
    before: dict[str, dict[float, float]], after: dict[str, dict[float, float]]
) -> dict[str, dict[str, float]]:
    """Server-side p50/p95/p99 (ms) of the poll phase: the histogram's increase over it."""
    out = {}
    for name in SERVER_ROUTES:
        delta = {le: n - before[name].get(le, 0.0) for le, n in after[name].items()}
        out[name] = {
            f"p{int(q * 100)}_ms": histogram_quantile(delta, q) * 1e3 for q in (0.5, 0.95, 0.99)
        }
    return out


def active_jobs(http: httpx.Client) -> int:
    return sum(
        int(http.get("/v1/jobs", params={"status": s, "limit": 1}).json()["total"])
        for s in ("pending", "running")
    )


def measure(db_url: str, args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    svc = Service(db_url, args.max_jobs, workdir)
    try:
        svc.wait_healthy()
        with httpx.Client(base_url=svc.base, timeout=60) as http:
            job_ids = []
            for i in range(args.jobs):
                r = http.post("/v1/jobs", json=JOB | {"name": f"load{i}", "sampler_seed": i})
                if r.status_code != 201:
                    raise RuntimeError(f"submission refused: {r.status_code} {r.text[:500]}")
                job_ids.append(str(r.json()["id"]))
            deadline = time.monotonic() + args.warmup_timeout
            while time.monotonic() < deadline:  # trials to read before measuring
                done = [http.get(f"/v1/jobs/{j}").json()["progress"]["completed"] for j in job_ids]
                if min(done) >= 1:
                    break
                time.sleep(1)
            progress = [http.get(f"/v1/jobs/{j}").json()["progress"] for j in job_ids]
            hist_before = server_histograms(http)
            polls = poll_phase(
                svc.base, job_ids, args.clients, args.seconds, args.interval, args.client_procs
            )
            server = server_view(hist_before, server_histograms(http))
            after = [http.get(f"/v1/jobs/{j}").json() for j in job_ids]
            training = sum(j["progress"]["running"] for j in after)
            pairs = zip(after, progress, strict=True)
            trained = sum(a["progress"]["completed"] - b["completed"] for a, b in pairs)
            for j in job_ids:
                http.post(f"/v1/jobs/{j}/cancel")
            active = active_jobs(http)
            burst = asyncio.run(submit_phase(svc.base, args.submits))
            burst["active_before"] = active
            burst["expected"] = max(0, args.max_jobs - active)
            alive = svc.proc.poll() is None
    finally:
        left = svc.stop()
    return {
        "polls": polls,
        "server": server,
        "submissions": burst,
        "trials_completed_during": trained,
        "running_at_end": training,
        "service_alive": alive,
        "killed_after_grace": left,
        "log": str(svc.log_path),
    }


def report(db: str, r: dict[str, Any], args: argparse.Namespace) -> None:
    print(
        f"\n{db}: {args.clients} clients ({args.client_procs} processes) for {args.seconds:.0f} s, "
        f"{args.interval:g} s between "
        f"rounds, {args.jobs} jobs training ({r['trials_completed_during']} trials completed "
        f"meanwhile); {r['polls']['all']['per_s']:.0f} requests/s"
    )
    head = ["requests", "errors", "p50 ms", "p95 ms", "p99 ms", "max ms"]
    print(f"{'route':8} " + " ".join(f"{h:>9}" for h in head))
    for name in ("status", "trials", "pareto", "all"):
        s = r["polls"][name]
        cells = [f"{s['requests']:9d}", f"{s['errors']:9d}"] + [
            f"{s[k]:9.1f}" for k in ("p50_ms", "p95_ms", "p99_ms", "max_ms")
        ]
        print(f"{name:8} " + " ".join(cells))
    print(
        "in the service (its own histogram, bucket-interpolated): "
        + "; ".join(
            f"{name} p50 {v['p50_ms']:.0f} / p95 {v['p95_ms']:.0f} / p99 {v['p99_ms']:.0f} ms"
            for name, v in r["server"].items()
        )
    )
    errs = {c: n for c, n in r["polls"]["all"]["codes"].items() if c != "200"}
    if errs:
        print(f"non-2xx / exceptions: {errs}")
    b = r["submissions"]
    print(
        f"submissions: {b['submitted']} concurrent against max_concurrent_jobs={args.max_jobs} "
        f"with {b['active_before']} active: accepted {b['accepted']} (expected {b['expected']}); "
        f"codes {b['codes']}; 5xx {b['server_errors']}; exceptions {b['exceptions']}; "
        f"{b['elapsed_ms']:.0f} ms"
    )
    worst = max(r["polls"][n]["p95_ms"] for n in ("status", "trials", "pareto"))
    ok = (
        r["polls"]["all"]["errors"] == 0
        and worst <= P95_TARGET_MS
        and b["accepted"] == b["expected"]
        and b["server_errors"] == 0
        and b["exceptions"] == 0
    )
    print(
        f"target (0 errors, p95 ≤ {P95_TARGET_MS:.0f} ms, accepted == limit − active, no 5xx): "
        f"{'met' if ok else 'NOT met'}; service alive at the end: {r['service_alive']}"
    )
    r["target_met"] = ok


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--db", choices=("sqlite", "postgres"), default="sqlite")
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--clients", type=int, default=50)
    parser.add_argument("--interval", type=float, default=0.5, help="per client, between rounds")
    parser.add_argument("--jobs", type=int, default=4)
    parser.add_argument(
        "--client-procs", type=int, default=1, help="processes the clients are spread over"
    )
    parser.add_argument("--submits", type=int, default=50)
    parser.add_argument("--max-jobs", type=int, default=8, help="DEPTHSCOPE_MAX_CONCURRENT_JOBS")
    parser.add_argument("--warmup-timeout", type=float, default=120.0)
    parser.add_argument("--json", type=Path)
    parser.add_argument("--keep", action="store_true", help="keep the service's log and files")
    args = parser.parse_args()
    workdir = Path(tempfile.mkdtemp(prefix="ds-load-"))
    drop = None
    if args.db == "postgres":
        from bench import support

        db_url, drop = support.temp_postgres()
    else:
        db_url = f"sqlite:///{workdir / 'load.db'}"
    try:
        result = measure(db_url, args, workdir)
    except BaseException:
        print(f"the service's log: {workdir / 'service.log'}", file=sys.stderr)
        raise
    finally:
        if drop is not None:
            drop()
    report(args.db, result, args)
    if not args.keep:
        shutil.rmtree(workdir, ignore_errors=True)
        result["log"] = None
    if args.json:
        args.json.write_text(
            json.dumps(
                {
                    "benchmark": "load",
                    "db": args.db,
                    "args": vars(args) | {"json": str(args.json)},
                    **result,
                },
                indent=2,
                default=str,
            )
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
