"""The dashboard in headless Chromium against the real service (`depthscope serve`, its
runner, a local Ray): load it with the token, see a bad spec's validation message next to
its field, submit a tiny job through the page and watch it complete, switch the Pareto
metrics, see the optimum's fits (profiled and raw), sort and filter the trials by state,
variant and shape, open a trial's curve and its costs, upload a second (multi-fidelity) job
as a file, see its rungs fill and cancel it, price every variant on the cost page, and see
a wrong token's 401 handled (no request ever carries the token in its URL). No
console error or page error (but the HTTP statuses a step provokes on purpose, which the
browser logs as failed loads). Screenshots in tests/browser/artifacts/."""

from __future__ import annotations

import contextlib
import json
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from bench import dashboard as bench_dashboard
from tests.browser.conftest import TOKEN, Service, Watched, login, start_service
from tests.support.api import _free_port
from tests.support.jobs import TINY
from tests.support.procs import kill_session, terminate_session

pytestmark = [pytest.mark.e2e, pytest.mark.browser, pytest.mark.slow, pytest.mark.timeout(400)]

#: The tiny job of the service tests over its whole grid (two depths, two widths, both
#: variants: a paired comparison to draw), with two objectives (a Pareto front to draw).
JOB: dict[str, Any] = TINY | {
    "name": "browser-tiny",
    "objectives": ["val_loss", "params"],
    "sampler": "grid",
    "n_trials": 8,
}
#: A multi-fidelity job (two rungs: a quarter of the budget, then all of it; each rung
#: retrained, so no artifact store) long enough to be cancelled while it runs: its rungs
#: are shown as they fill.
LONG: dict[str, Any] = TINY | {
    "name": "browser-long",
    "n_trials": 40,
    "fidelity": {"rungs": [0.25, 1], "reduction": 2, "reuse": "retrain"},
}


def chart_option(w: Watched, element: str) -> dict[str, Any]:
    """The option the chart in `element` holds (series and axes), read from ECharts."""
    option: dict[str, Any] = w.page.evaluate(
        """(id) => {
            const o = echarts.getInstanceByDom(document.getElementById(id)).getOption();
            return {x: o.xAxis[0].name, y: o.yAxis[0].name,
                    series: o.series.map((s) => ({name: s.name, n: (s.data || []).length}))};
        }""",
        element,
    )
    return option


def drawn(w: Watched, element: str) -> int:
    value = w.page.get_attribute(f"#{element}", "data-drawn")
    return int(value or 0)


def wait_redrawn(w: Watched, element: str, before: int) -> None:
    w.page.wait_for_function(
        "([id, n]) => Number(document.getElementById(id).dataset.drawn || 0) > n",
        arg=[element, before],
    )


def submit_through_the_page(w: Watched, spec: dict[str, Any]) -> str:
    w.page.fill("#spec-text", yaml.safe_dump(spec, sort_keys=False))
    w.page.click("#spec-submit")
    w.page.wait_for_url(re.compile(r".*#/job/[^/]+$"))
    return str(w.page.url).rsplit("/", 1)[-1]


def test_the_dashboard_end_to_end(service: Service, watched: Watched, tmp_path: Path) -> None:
    w, page = watched, watched.page
    urls: list[str] = []
    page.on("request", lambda request: urls.append(request.url))
    login(w, service)
    page.wait_for_selector("#jobs-table")
    assert page.locator("#token-panel").is_hidden()
    assert page.evaluate("sessionStorage.getItem('depthscope.token')") == "browser-token"
    assert "token" not in page.url  # never in a URL

    # a bad spec: the API's message next to the field it names (and its line in the text)
    w.allow.add(422)
    page.fill("#spec-text", yaml.safe_dump(JOB | {"n_trials": 0}, sort_keys=False))
    page.click("#spec-submit")
    message = page.locator('#spec-errors li[data-field="n_trials"]')
    message.wait_for()
    assert "greater than or equal to 1" in message.inner_text()
    assert re.search(r"\(line \d+\)", message.inner_text())
    page.fill("#spec-text", "name: [unclosed")
    page.click("#spec-submit")
    page.locator('#spec-errors li[data-field="text"]').wait_for()
    assert "not valid YAML" in page.inner_text("#spec-errors")
    w.shot("01-bad-spec")

    # a tiny job through the page, watched to its end without a reload
    job = submit_through_the_page(w, JOB)
    page.wait_for_selector("#job-status")
    page.wait_for_function(
        "() => document.getElementById('job-status').textContent === 'completed'",
        timeout=300_000,
    )
    page.wait_for_function(
        "() => document.querySelectorAll('#trials tbody tr').length === 8", timeout=30_000
    )
    assert service.api("GET", f"/v1/jobs/{job}").json()["status"] == "completed"
    assert page.inner_text("#job-trials").startswith("8/8")
    assert page.inner_text("#job-runs") == "8/8 (1 seed per setting)"
    # the compute spent, of the budget (4 × 32 × 16 tokens per trial, 8 trials)
    assert page.inner_text("#job-compute") == "16.4 k tokens of 16.4 k tokens (100%)"
    page.wait_for_selector("#chart-pareto[data-drawn]")
    w.shot("02-job-completed")

    # the Pareto front over the job's objectives, then over other metrics
    first = chart_option(w, "chart-pareto")
    assert "params" in first["x"] and "val_loss" in first["y"] and "nats" in first["y"]
    front = next(s for s in first["series"] if s["name"] == "Pareto front")
    assert front["n"] >= 1
    assert sum(s["n"] for s in first["series"] if s["name"] != "Pareto front") == 8
    before = drawn(w, "chart-pareto")
    page.select_option("#pareto-x", "train_memory_bytes")
    wait_redrawn(w, "chart-pareto", before)
    switched = chart_option(w, "chart-pareto")
    assert switched["x"].startswith("train_memory_bytes (") and "B)" in switched["x"]
    assert "on the front of" in page.inner_text("#pareto-note")
    before = drawn(w, "chart-pareto")
    page.select_option("#pareto-y", "train_flops_per_token")
    wait_redrawn(w, "chart-pareto", before)
    both = chart_option(w, "chart-pareto")
    assert both["x"] == switched["x"] and both["y"].startswith("train_flops_per_token (")
    assert re.search(r"\((k|M|G)?FLOP\)$", both["y"]), both["y"]
    assert sum(s["n"] for s in both["series"] if s["name"] != "Pareto front") == 8
    w.shot("03-pareto-switched")

    # the optimum's chart, profiled and raw
    page.wait_for_selector("#chart-optimum[data-drawn]")
    profiled = chart_option(w, "chart-optimum")
    fits = [s for s in profiled["series"] if s["name"].endswith(" fit")]
    assert len(fits) == 2 and all(s["n"] > 10 for s in fits), profiled
    assert all(re.search(r" @ [0-9.]+ k tokens fit$", s["name"]) for s in fits), fits
    # each fit's optimum line (where its optimum lies in the chart) names its variant; that
    # two labels never cover each other is test_dashboard_10k's (optima 0.2 apart)
    labels = page.evaluate(
        """() => echarts.getInstanceByDom(document.getElementById('chart-optimum'))
            .getOption().series.filter((s) => s.markLine && s.markLine.data.length)
            .map((s) => s.markLine.label.formatter)"""
    )
    assert len(labels) == 2, labels
    assert sorted(t.split(": optimum ")[0] for t in labels) == ["baseline", "block_attnres/S=1"]
    notes = page.inner_text("#optimum-notes")
    assert "baseline" in notes and "block_attnres" in notes
    assert re.search(r"\b(ok|at_edge|no_minimum|too_few_shapes)\b", notes)  # each fit's verdict
    before = drawn(w, "chart-optimum")
    page.select_option("#opt-view", "raw")
    wait_redrawn(w, "chart-optimum", before)
    raw = chart_option(w, "chart-optimum")
    assert "d_model / L_b" in raw["x"]
    assert sum(s["n"] for s in raw["series"] if not s["name"].endswith(" fit")) == 8

    # sort and filter the table
    page.click('#trials th[data-sort="val_loss"]')
    page.wait_for_selector('#trials th.sorted[data-sort="val_loss"]')
    page.wait_for_function(
        """() => {
            const cells = [...document.querySelectorAll('#trials tbody tr')]
                .map((r) => Number(r.children[7].textContent));
            return cells.length === 8 && cells.every((v, i) => i === 0 || cells[i - 1] <= v);
        }"""
    )
    page.click('#trials th[data-sort="val_loss"]')
    page.wait_for_selector('#trials th.sorted.desc[data-sort="val_loss"]')
    page.wait_for_function(
        """() => {
            const cells = [...document.querySelectorAll('#trials tbody tr')]
                .map((r) => Number(r.children[7].textContent));
            return cells.length === 8 && cells.every((v, i) => i === 0 || cells[i - 1] >= v);
        }"""
    )
    page.select_option("#f-state", "failed")
    page.wait_for_function(
        """() => document.querySelectorAll('#trials tbody tr').length === 0
            && document.getElementById('page-info').textContent === 'no trials'"""
    )
    page.select_option("#f-state", "complete")
    page.wait_for_function("() => document.querySelectorAll('#trials tbody tr').length === 8")
    page.select_option("#f-state", "")
    page.fill("#f-dmodel", "32")
    page.dispatch_event("#f-dmodel", "change")
    page.wait_for_function(
        """() => {
            const rows = [...document.querySelectorAll('#trials tbody tr')];
            return rows.length === 4 && rows.every((r) => r.children[5].textContent === '32');
        }"""
    )
    page.fill("#f-dmodel", "")
    page.dispatch_event("#f-dmodel", "change")
    page.wait_for_function("() => document.querySelectorAll('#trials tbody tr').length === 8")
    page.select_option("#f-variant", "baseline")
    page.wait_for_function(
        """() => {
            const rows = [...document.querySelectorAll('#trials tbody tr')];
            return rows.length === 4
                && rows.every((r) => r.children[3].textContent === 'baseline');
        }"""
    )
    page.select_option("#f-variant", "")
    page.fill("#f-layers", "2")
    page.dispatch_event("#f-layers", "change")
    page.wait_for_function(
        """() => {
            const rows = [...document.querySelectorAll('#trials tbody tr')];
            return rows.length === 4 && rows.every((r) => r.children[4].textContent === '2');
        }"""
    )
    page.fill("#f-layers", "")
    page.dispatch_event("#f-layers", "change")
    page.wait_for_function("() => document.querySelectorAll('#trials tbody tr').length === 8")

    # the paired difference against depth (baseline is the reference)
    page.wait_for_selector("#chart-compare[data-drawn]")
    compared = chart_option(w, "chart-compare")
    assert "depth" in compared["x"] and "difference" in compared["y"]
    pair = "block_attnres/S=1 − baseline"
    assert any(s["name"] == pair and s["n"] >= 1 for s in compared["series"])

    # a trial's learning curve, and its cost breakdown
    row = page.locator("#trials tbody tr").first
    number = int(row.get_attribute("data-trial") or -1)
    row.locator("input.pick").check()
    page.wait_for_selector("#chart-curves[data-drawn]")
    page.wait_for_function(
        """() => echarts.getInstanceByDom(document.getElementById('chart-curves'))
                .getOption().series.length === 1"""
    )
    curves = chart_option(w, "chart-curves")
    assert curves["series"][0]["name"].startswith(f"trial {number} ")
    assert curves["series"][0]["n"] >= 2 and "tokens" in curves["x"]
    row.click()
    page.wait_for_selector("#trial-costs")
    costs = page.inner_text("#trial-costs")
    assert "train_memory_bytes" in costs and re.search(r"\d (B|kB|MB)\b", costs)
    w.shot("04-curve-and-costs")

    # a second job, uploaded as a JSON file: its rungs fill while it runs; cancelled from
    # the list
    page.goto(service.url + "/#/jobs")
    page.wait_for_selector("#spec-text")
    upload = tmp_path / "long.json"
    upload.write_text(json.dumps(LONG))
    page.set_input_files("#spec-file", str(upload))
    page.wait_for_function("() => document.getElementById('spec-text').value.length > 0")
    assert json.loads(page.input_value("#spec-text")) == LONG
    page.click("#spec-submit")
    page.wait_for_url(re.compile(r".*#/job/[^/]+$"))
    second = str(page.url).rsplit("/", 1)[-1]
    page.wait_for_selector("#rungs:not([hidden])")
    page.wait_for_function(
        """() => {
            const rows = [...document.querySelectorAll('#rungs tbody tr')];
            return rows.length === 2 && rows[0].children[1].textContent === '0.25'
                && rows[1].children[1].textContent === '1' && rows[0].children[2].textContent >= 1;
        }""",
        timeout=180_000,
    )
    # while it runs: an ETA from the compute spent so far, and a cancel button
    assert re.fullmatch(r"\d+ s|\d+ min \d+ s|\d+ h \d+ min", page.inner_text("#job-eta"))
    assert re.search(
        r"^[0-9.]+ (k )?tokens of [0-9.]+ k tokens \(\d+%\)$", page.inner_text("#job-compute")
    )
    assert page.locator("#job-cancel").is_visible()
    w.shot("05-rungs")
    page.goto(service.url + "/#/jobs")
    page.wait_for_selector(f'#jobs-table tr[data-job="{second}"]')
    assert " · rungs " in page.inner_text(f'#jobs-table tr[data-job="{second}"]')
    cancel = page.locator(f'#jobs-table tr[data-job="{second}"] button.cancel')
    cancel.click()
    page.wait_for_function(
        """(id) => document.querySelector(`#jobs-table tr[data-job="${id}"] .status`)
                .textContent === 'cancelled'""",
        arg=second,
    )
    assert service.api("GET", f"/v1/jobs/{second}").json()["status"] == "cancelled"
    assert page.locator(f'#jobs-table tr[data-job="{second}"] button.cancel').count() == 0
    w.shot("06-cancelled")

    # the cost page: every variant side by side, a refused field named next to its input
    page.goto(service.url + "/#/cost")
    page.wait_for_selector("#cost-variants input")
    variants = page.evaluate(
        "() => [...document.querySelectorAll('#cost-variants input')].map((i) => i.value)"
    )
    catalogue = service.api("GET", "/v1/catalogue").json()["variants"]
    assert variants == catalogue and len(catalogue) >= 5
    page.click("#cost-run")
    page.wait_for_selector("#cost-table tbody tr")
    heads = page.evaluate(
        "() => [...document.querySelectorAll('#cost-table thead th')].map((h) => h.textContent)"
    )
    assert heads == ["per variant", *catalogue]  # every variant side by side, by default
    table = page.inner_text("#cost-table")
    for words in (
        "parameters",
        "training FLOPs per token",
        "training memory",
        "inference memory",
        "KV cache",
        "pipeline traffic",
        "residual I/O per token per sublayer",
        "M params",
        "GFLOP",
        "GB",
        "kB",
        "ms",
    ):
        assert words in table, words
    cells = page.evaluate(
        "() => [...document.querySelectorAll('#cost-table tbody td.num')].map((c) => c.textContent)"
    )
    assert len(cells) == len(catalogue) * 16 and "–" not in cells
    w.shot("07-cost")
    page.fill('[data-field="arch.n_heads"]', "7")
    page.click("#cost-run")
    error = page.locator('.field-error[data-field="arch.n_heads"]').first
    error.wait_for()
    assert "n_heads" in error.inner_text() or "divide" in error.inner_text()
    page.locator("#cost-table").wait_for(state="hidden")  # no empty table of refused variants
    # one message for the variants it refuses alike, not one per variant
    assert page.locator(".field-error").count() == 1
    assert error.inner_text().startswith("every variant: ")
    w.shot("08-cost-refused")

    # a wrong token: the 401 is said, and the token asked for again
    w.allow.add(401)
    page.click("#token-open")
    page.fill("#token-input", "wrong-token")
    page.click("#token-save")
    page.locator("#token-panel").wait_for(state="visible")
    assert "refused" in page.inner_text("#token-message")
    w.shot("09-wrong-token")
    page.fill("#token-input", "browser-token")
    page.click("#token-save")
    page.locator("#token-panel").wait_for(state="hidden")
    page.wait_for_selector("#cost-run")
    assert len(urls) > 20 and not [u for u in urls if "browser-token" in u or "wrong-token" in u]


def test_optuna_dashboard_reads_a_finished_jobs_study(service: Service, tmp_path: Path) -> None:
    """Studies are ordinary Optuna studies: `optuna-dashboard` on the service's database
    reads a finished job's study: its objective names, its trials and their values, the
    attributes the service writes."""
    spec = TINY | {"name": "optuna-dashboard", "objectives": ["val_loss", "params"], "n_trials": 2}
    job = service.api("POST", "/v1/jobs", json=spec).json()
    deadline = time.monotonic() + 300
    while service.api("GET", f"/v1/jobs/{job['id']}").json()["status"] != "completed":
        assert time.monotonic() < deadline, "the job did not complete"
        time.sleep(1)
    ours = service.api("GET", f"/v1/jobs/{job['id']}/trials", params={"limit": 10}).json()
    port = _free_port()
    executable = str(Path(sys.executable).with_name("optuna-dashboard"))  # the dev extra's
    command = [executable, service.db_url, "--host", "127.0.0.1", "--port", str(port)]
    with (tmp_path / "optuna-dashboard.log").open("wb") as log:
        proc = subprocess.Popen(
            command,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    base = f"http://127.0.0.1:{port}"
    try:
        summaries = None
        deadline = time.monotonic() + 60
        while summaries is None and time.monotonic() < deadline:
            assert proc.poll() is None, (tmp_path / "optuna-dashboard.log").read_text()
            with contextlib.suppress(httpx.HTTPError):
                summaries = httpx.get(f"{base}/api/studies", timeout=5).json()["study_summaries"]
            time.sleep(0.3)
        assert summaries is not None, "optuna-dashboard did not answer"
        summary = next(s for s in summaries if s["study_name"] == job["study_name"])
        assert summary["directions"] == ["minimize", "minimize"]
        study = httpx.get(f"{base}/api/studies/{summary['study_id']}?after=0", timeout=30).json()
    finally:
        kill_session(proc)
    assert study["objective_names"] == ["val_loss", "params"]
    assert len(study["trials"]) == 2 == ours["total"]
    by_number = {t["number"]: t for t in ours["items"]}
    for trial in study["trials"]:
        mine = by_number[trial["number"]]
        assert trial["state"] == "Complete"
        assert trial["values"] == pytest.approx(
            [mine["metrics"]["val_loss"], mine["metrics"]["params"]]
        )
        attrs = {a["key"]: a["value"] for a in trial["user_attrs"]}
        assert {"arch", "costs", "train", "outcome"} <= set(attrs)
        assert json.loads(attrs["arch"])["d_model"] == mine["arch"]["d_model"]
        assert attrs["outcome"] == "completed"  # a string attribute is shown as it is


def test_numbers_read_in_human_units(service: Service, watched: Watched) -> None:
    """The page's own formatting (static/format.js, as the browser loads it): bytes, FLOPs,
    seconds, parameters and tokens each in one readable unit, and durations whose rounding
    never shows a 60 in place of the next minute or hour."""
    login(watched, service)
    watched.page.wait_for_selector("#jobs-table")
    shown = watched.page.evaluate(
        """async () => {
            const f = await import('/dashboard/static/format.js');
            return [
                f.human(1.5e9, 'bytes'), f.human(2.21e9, 'FLOPs'), f.human(0.0123, 'seconds'),
                f.human(3.49e-5, 'seconds'), f.human(2.34e8, 'parameters'),
                f.human(16384, 'tokens'), f.human(3.7791, 'loss'),
                f.duration(42.2), f.duration(119.6), f.duration(3599.7), f.duration(7199.9),
                f.duration(5400),
            ];
        }"""
    )
    assert shown == [
        "1.5 GB",
        "2.21 GFLOP",
        "12.3 ms",
        "34.9 µs",
        "234 M params",
        "16.4 k tokens",
        "3.779",
        "42 s",
        "2 min 0 s",
        "1 h 0 min",
        "2 h 0 min",
        "1 h 30 min",
    ]


#: Each text drawn in a chart that holds `words`, as the box its glyphs cover on the page
#: (the bottom font-size rows of ZRender's text box, which also holds the line's leading),
#: turned as the label is turned: [text, x, y, width, height].
LABEL_BOXES = """([id, words]) => {
    const chart = echarts.getInstanceByDom(document.getElementById(id));
    const out = [];
    for (const el of chart.getZr().storage.getDisplayList()) {
        const text = el.style && el.style.text;
        if (typeof text !== 'string' || !text.includes(words)) continue;
        const box = el.getBoundingRect().clone();
        const size = el.style.fontSize || 12;
        box.y += box.height - size;
        box.height = size;
        const transform = el.getComputedTransform();
        if (transform) box.applyTransform(transform);
        out.push([text, box.x, box.y, box.width, box.height]);
    }
    return out;
}"""


def overlap(a: list[Any], b: list[Any]) -> bool:
    """Whether two [text, x, y, width, height] boxes share any area."""
    _, ax, ay, aw, ah = a
    _, bx, by, bw, bh = b
    return bool(ax < bx + bw and bx < ax + aw and ay < by + bh and by < ay + ah)


def test_two_optima_close_together_are_labelled_apart(tmp_path: Path, watched: Watched) -> None:
    """bench/service.py's synthetic losses put both variants' optima at d_model/L_b ≈ 40: the
    chart labels each optimum's line with its variant, inside the chart, neither label over
    the other. (`depthscope serve --no-runner` of its own: nothing trains the stored job.)"""
    service = start_service(tmp_path, runner=False)
    try:
        job = bench_dashboard.stored_job(service.url, service.db_url, 400, TOKEN)
        page = watched.page
        login(watched, service)
        page.wait_for_selector("#jobs-table")
        page.goto(f"{service.url}/#/job/{job}")
        page.wait_for_selector("#chart-optimum[data-drawn]")
        page.wait_for_function("() => document.querySelectorAll('#optimum-notes li').length === 2")
        notes = page.inner_text("#optimum-notes")
        boxes = page.evaluate(LABEL_BOXES, ["chart-optimum", ": optimum "])
        size = page.evaluate(
            """() => { const c = echarts.getInstanceByDom(document.getElementById('chart-optimum'));
                       return [c.getWidth(), c.getHeight()]; }"""
        )
        watched.shot("10-optima-close")
    finally:
        terminate_session(service.proc)
    assert notes.count(": ok, optimum d/L") == 2, notes
    assert sorted(b[0].split(":")[0] for b in boxes) == ["baseline", "block_attnres/S=2"], boxes
    assert not overlap(boxes[0], boxes[1]), boxes
    for _, x, y, w, h in boxes:
        assert x >= 0 and y >= 0 and x + w <= size[0] and y + h <= size[1], (boxes, size)


def test_a_confirmed_job_shows_its_confirmation_runs(tmp_path: Path, watched: Watched) -> None:
    """A job with held-out confirmation (replayed on the simulated backend into the service's
    database): the comparison says it is scored on the confirmation seeds, and a trial's
    detail lists every run it trained, its tuning runs and its confirmation runs apart."""
    from nas_service.jobs import submit
    from nas_service.runner.loop import Runner
    from nas_service.runner.simulated import SimulatedBackend
    from tests.runner.test_confirmation import CONFIRMED, LANDSCAPE
    from tests.support.jobs import setup

    service = start_service(tmp_path, runner=False)
    try:
        settings, Session = setup(service.db_url)
        job = submit(Session, settings, CONFIRMED)
        Runner(settings, backend=SimulatedBackend(LANDSCAPE, 2)).run(poll_s=0, timeout_s=120)
        page = watched.page
        login(watched, service)
        page.wait_for_selector("#jobs-table")
        page.goto(f"{service.url}/#/job/{job.id}")
        page.wait_for_function(
            "() => document.getElementById('compare-notes').textContent"
            ".includes('held-out confirmation seeds')"
        )
        assert page.locator("#compare-warning").count() == 0
        runs_line = page.inner_text("#job-runs")
        assert page.inner_text("#banner") == ""  # no error on the way
        page.locator("#trials tbody tr").first.click()
        page.wait_for_selector("#trial-runs")
        runs = page.inner_text("#trial-runs")
        detail = page.inner_text("#trial-detail")
        watched.shot("11-confirmation")
    finally:
        terminate_session(service.proc)
    phases = [line.split("\t")[0] for line in runs.splitlines()[1:]]
    assert phases.count("confirmation") == 2 and phases[-2:] == ["confirmation"] * 2, runs
    assert set(phases[:-2]) == {"tuning"}, runs
    assert "held-out confirmation seeds 1, 2" in detail
    # 4 baseline trials × (3 settings + 2) + 8 AttnRes trials × (9 settings + 2)
    assert runs_line == "108/108 (1 seed per setting, 2 seeds to confirm the chosen one)"
