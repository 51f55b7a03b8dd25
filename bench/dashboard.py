"""The dashboard with 10,000 stored trials in headless Chromium (Debian's `chromium`, driven
by Playwright): the time from navigation to the first chart drawn (`performance.now()` when
the page's first chart has rendered: the mark `depthscope:first-chart`), on the first visit
(the service loads the job's table) and on a second one; the time to redraw the Pareto
chart after switching its metric, and to show the next page of the trial table (paged by the
service). The job is bench/service.py's (its spec and synthetic trials, imported).

    python bench/dashboard.py [--trials 10000] [--json FILE] [--chromium /usr/bin/chromium]

Target: first chart ≤ 2 s with 10,000 trials. `--cold-reads DB_URL JOB` times only the
page's first API reads of a job already stored, in process, each round in a fresh app.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import httpx
import optuna

from bench import service as bench_service
from nas_service.spec import parse_spec
from nas_service.store.jobs import optuna_storage

TARGET_MS = 2000.0
CHROMIUM = "/usr/bin/chromium"


def stored_job(base: str, db_url: str, trials: int, token: str | None = None) -> str:
    """bench/service.py's job of `trials` trials, submitted, cancelled (nothing trains it)
    and given `trials` synthetic trials, stored in bulk into Optuna's tables (as
    `Study.add_trials` stores them, in seconds instead of minutes). Returns its id."""
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    spec = bench_service.SPEC | {"n_trials": trials}
    with httpx.Client(base_url=base, headers=headers, timeout=120) as c:
        r = c.post("/v1/jobs", json=spec)
        assert r.status_code == 201, r.text
        job = r.json()
        c.post(f"/v1/jobs/{job['id']}/cancel").raise_for_status()
    study = optuna.load_study(study_name=job["study_name"], storage=optuna_storage(db_url))
    bench_service.support.store_trials(
        study, bench_service.synthetic_trials(parse_spec(spec), trials)
    )
    return str(job["id"])


def visit(browser: Any, base: str, job: str, token: str | None = None) -> dict[str, Any]:
    """Open the job's page in a fresh tab (the token already in its session, as after a
    login) and measure it: first chart (ms since navigation), points drawn in the Pareto
    chart, the table's first page; then a switch of the Pareto metric and the next page
    (ms each). Returns the figures and the console errors seen."""
    context = browser.new_context(viewport={"width": 1400, "height": 1000})
    if token:
        context.add_init_script(f"sessionStorage.setItem('depthscope.token', {json.dumps(token)})")
    page = context.new_page()
    page.set_default_timeout(120_000)
    errors: list[str] = []
    page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    try:
        page.goto(f"{base}/#/job/{job}")
        page.wait_for_selector("body[data-first-chart]")
        first = float(page.evaluate("window.__depthscope.firstChartMs"))
        # the API reads before the first chart, each by its route's last word: ms taken
        reads = page.evaluate(
            """(t) => performance.getEntriesByType('resource')
                .filter((e) => e.name.includes('/v1/') && e.startTime < t)
                .map((e) => [new URL(e.name).pathname.split('/').slice(-1)[0], e.duration])""",
            first,
        )
        page.wait_for_selector("#chart-pareto[data-drawn]")
        page.wait_for_function(
            "() => /of \\d+$/.test(document.getElementById('page-info').textContent)"
        )
        drawn = page.evaluate(
            """() => echarts.getInstanceByDom(document.getElementById('chart-pareto'))
                .getOption().series.filter((s) => s.type === 'scatter')
                .reduce((n, s) => n + s.data.length, 0)"""
        )
        table = page.inner_text("#page-info")
        rows = page.locator("#trials tbody tr").count()
        before = int(page.get_attribute("#chart-pareto", "data-drawn") or 0)
        start = time.perf_counter()
        page.select_option("#pareto-x", "params")
        page.wait_for_function(
            "(n) => Number(document.getElementById('chart-pareto').dataset.drawn) > n", arg=before
        )
        switch = (time.perf_counter() - start) * 1e3
        start = time.perf_counter()
        page.click("#page-next")
        page.wait_for_function(
            "() => document.getElementById('page-info').textContent.startsWith('51–')"
        )
        next_page = (time.perf_counter() - start) * 1e3
        screenshot = page.screenshot(full_page=True)
        return {
            "first_chart_ms": first,
            "api_before_first_chart_ms": {
                ("job" if name == job else name): round(ms) for name, ms in reads
            },
            "pareto_points": int(drawn),
            "table": table,
            "rows": rows,
            "switch_metric_ms": switch,
            "next_page_ms": next_page,
            "next_table": page.inner_text("#page-info"),
            "errors": errors,
            "screenshot": screenshot,
        }
    finally:
        context.close()


def report(trials: int, cold: dict[str, Any], warm: dict[str, Any]) -> str:
    lines = [f"dashboard with {trials} trials stored (headless Chromium, ms)"]
    lines.append(f"{'':28} {'first visit':>12} {'second visit':>13} {'target':>8}")
    for key, name, target in (
        ("first_chart_ms", "navigation → first chart", f"≤ {TARGET_MS:.0f}"),
        ("switch_metric_ms", "switch the Pareto metric", ""),
        ("next_page_ms", "next page of the table", ""),
    ):
        lines.append(f"{name:28} {cold[key]:12.0f} {warm[key]:13.0f} {target:>8}")
    lines.append(f"Pareto chart points drawn: {cold['pareto_points']}; table: {cold['table']}")
    for name, visit in (("first", cold), ("second", warm)):
        reads = ", ".join(f"{k} {v}" for k, v in visit["api_before_first_chart_ms"].items())
        lines.append(f"API reads before the first chart, {name} visit (ms): {reads}")
    return "\n".join(lines)


#: What the page asks before its first chart, in its order (bench/service.py's objectives).
FIRST_READS = (
    ("job", ""),
    ("points", "/points?metrics=val_loss,train_memory_bytes"),
    ("pareto", "/pareto?metrics=val_loss,train_memory_bytes"),
)


def cold_reads(db_url: str, job: str, repeat: int) -> dict[str, list[float]]:
    """The page's first reads (`FIRST_READS`) in process, each round in a fresh app (a
    service just started: nothing cached), in seconds per read."""
    from fastapi.testclient import TestClient

    from nas_service.api.app import create_app
    from nas_service.settings import get_settings

    times: dict[str, list[float]] = {name: [] for name, _ in FIRST_READS}
    for _ in range(repeat):
        app = create_app(get_settings(database_url=db_url, max_trials=20_000))
        with TestClient(app) as c:
            for name, path in FIRST_READS:
                began = time.perf_counter()
                c.get(f"/v1/jobs/{job}{path}").raise_for_status()
                times[name].append(time.perf_counter() - began)
    return times


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--trials", type=int, default=10_000)
    parser.add_argument("--json", type=Path)
    parser.add_argument("--chromium", default=CHROMIUM, help="the system's Chromium")
    parser.add_argument(
        "--cold-reads",
        nargs=2,
        metavar=("DB_URL", "JOB"),
        help="only time the page's first API reads of a stored job in a fresh app, in process",
    )
    parser.add_argument("--repeat", type=int, default=5, help="rounds of --cold-reads")
    args = parser.parse_args()
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    if args.cold_reads:
        db_url, job = args.cold_reads
        times = cold_reads(db_url, job, args.repeat)
        for name, seen in times.items():
            runs = ", ".join(f"{t:.2f}" for t in seen)
            print(f"cold {name:7} median {statistics.median(seen):6.2f} s  ({runs})")
        total = [sum(round_) for round_ in zip(*times.values(), strict=True)]
        print(f"cold all     median {statistics.median(total):6.2f} s")
        return 0
    from playwright.sync_api import sync_playwright

    db_url = f"sqlite:///{tempfile.mkdtemp()}/dashboard.db"
    base, server, thread = bench_service.serve(db_url)  # the real app in uvicorn, no runner
    try:
        job = stored_job(base, db_url, args.trials)
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=args.chromium, headless=True)
            try:
                cold = visit(browser, base, job)
                warm = visit(browser, base, job)
            finally:
                browser.close()
    finally:
        server.should_exit = True
        thread.join(timeout=30)
    print(report(args.trials, cold, warm))
    if args.json:
        figures = {
            k: {n: v for n, v in r.items() if n != "screenshot"}
            for k, r in (("first_visit", cold), ("second_visit", warm))
        }
        args.json.write_text(
            json.dumps({"benchmark": "dashboard", "trials": args.trials, **figures}, indent=2)
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
