"""Service latency with 10,000 trials stored: GET pareto, GET optimum (200 bootstrap
resamples), a GET trials page and POST jobs, median and p95 over repeated calls to a real
uvicorn server, SQLite and PostgreSQL side by side. The first read after new trials loads
the job's table (reported apart as "cold"); later reads use the cached table, and a query's
answer is memoised until the study changes (the first optimum, which computes, is reported
apart too).

    python bench/service.py [--trials 10000 --calls 30] [--json FILE]

Targets: pareto p95 ≤ 50 ms, optimum p95 ≤ 200 ms, submit p95 ≤ 100 ms.
"""

from __future__ import annotations

import argparse
import json
import socket
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import importlib.util

import httpx
import optuna
import uvicorn

from nas_service.api.app import create_app
from nas_service.settings import get_settings
from nas_service.spec import parse_spec
from nas_service.store.jobs import optuna_storage


def _load_support() -> Any:
    path = Path(__file__).resolve().parent / "support.py"
    spec = importlib.util.spec_from_file_location("bench_support", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


support = _load_support()
synthetic_trials = support.synthetic_trials
SPEC: dict[str, Any] = {
    "name": "bench",
    "space": {
        "n_layers": [1, 2, 3, 4, 6, 8, 12, 16],
        "d_model": [64, 128, 192, 256, 384, 512],
        "head_dim": 64,
        "variants": ["baseline", "block_attnres"],
        "block_sizes": [2],
    },
    "budget": {"flops": 1e15},
    "objectives": ["val_loss", "train_memory_bytes"],
    "n_trials": 10_000,
    "training": {"seq_len": 256, "batch_size": 16},
}
TARGETS = {"pareto": 50.0, "optimum": 200.0, "submit": 100.0}


def serve(url: str) -> tuple[str, uvicorn.Server, threading.Thread]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    settings = get_settings(database_url=url, max_trials=20_000, max_concurrent_jobs=10_000)
    server = uvicorn.Server(uvicorn.Config(create_app(settings), port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    base = f"http://127.0.0.1:{port}"
    for _ in range(200):
        try:
            if httpx.get(f"{base}/v1/health").status_code == 200:
                break
        except httpx.HTTPError:
            time.sleep(0.1)
    return base, server, thread


def timed(call: Any, n: int) -> list[float]:
    out = []
    for _ in range(n):
        start = time.perf_counter()
        r = call()
        out.append((time.perf_counter() - start) * 1e3)
        assert r.status_code < 300, r.text
    return out


def measure(url: str, trials: int, calls: int) -> dict[str, Any]:
    base, server, thread = serve(url)
    try:
        with httpx.Client(base_url=base, timeout=300) as c:
            job = c.post("/v1/jobs", json=SPEC).json()
            study = optuna.load_study(study_name=job["study_name"], storage=optuna_storage(url))
            support.store_trials(study, synthetic_trials(parse_spec(SPEC), trials))
            jid = job["id"]
            start = time.perf_counter()
            c.get(f"/v1/jobs/{jid}/pareto", params={"metrics": "val_loss,train_memory_bytes"})
            cold = (time.perf_counter() - start) * 1e3
            start = time.perf_counter()
            c.get(f"/v1/jobs/{jid}/optimum", params={"bootstrap": 200})
            first_optimum = (time.perf_counter() - start) * 1e3
            lat = {
                "pareto": timed(
                    lambda: c.get(
                        f"/v1/jobs/{jid}/pareto", params={"metrics": "val_loss,train_memory_bytes"}
                    ),
                    calls,
                ),
                "optimum": timed(
                    lambda: c.get(f"/v1/jobs/{jid}/optimum", params={"bootstrap": 200}), calls
                ),
                "trials_page": timed(
                    lambda: c.get(f"/v1/jobs/{jid}/trials", params={"limit": 100, "offset": 5000}),
                    calls,
                ),
                "submit": timed(lambda: c.post("/v1/jobs", json=SPEC | {"n_trials": 10}), calls),
            }
            refresh = []
            for i in range(5):  # one new trial, then the next read: an incremental refresh
                study.add_trials(synthetic_trials(parse_spec(SPEC), 1, seed=100 + i))
                refresh += timed(
                    lambda: c.get(
                        f"/v1/jobs/{jid}/pareto", params={"metrics": "val_loss,train_memory_bytes"}
                    ),
                    1,
                )
            lat["pareto_after_new_trial"] = refresh
    finally:
        server.should_exit = True
        thread.join(timeout=30)
    return {
        "cold_load_ms": cold,
        "first_optimum_ms": first_optimum,
        "latency_ms": {
            k: {"median": statistics.median(v), "p95": sorted(v)[int(0.95 * (len(v) - 1))]}
            for k, v in lat.items()
        },
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=10_000)
    parser.add_argument("--calls", type=int, default=30)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    results = {"sqlite": measure(f"sqlite:///{tempfile.mkdtemp()}/svc.db", args.trials, args.calls)}
    url, drop = support.temp_postgres()
    try:
        results["postgresql"] = measure(url, args.trials, args.calls)
    finally:
        drop()
    print(f"service latency with {args.trials} trials stored, {args.calls} calls each (ms)")
    head = ["sqlite p50", "sqlite p95", "pg p50", "pg p95", "target p95"]
    print(f"{'endpoint':12} " + " ".join(f"{h:>11}" for h in head))
    for name in ("pareto", "optimum", "trials_page", "submit", "pareto_after_new_trial"):
        s, p = results["sqlite"]["latency_ms"][name], results["postgresql"]["latency_ms"][name]
        target = f"≤ {TARGETS[name]:.0f}" if name in TARGETS else ""
        cells = [f"{v:11.1f}" for v in (s["median"], s["p95"], p["median"], p["p95"])]
        print(f"{name:12} " + " ".join(cells) + f" {target:>11}")
    print(
        f"first read after new trials (loads the table): sqlite "
        f"{results['sqlite']['cold_load_ms']:.0f} ms, postgresql "
        f"{results['postgresql']['cold_load_ms']:.0f} ms\nfirst optimum (fits and a 200-resample "
        f"bootstrap, memoised until the study changes): sqlite "
        f"{results['sqlite']['first_optimum_ms']:.0f} ms, postgresql "
        f"{results['postgresql']['first_optimum_ms']:.0f} ms"
    )
    if args.json:
        args.json.write_text(
            json.dumps(
                {"benchmark": "service", "trials": args.trials, "results": results}, indent=2
            )
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
