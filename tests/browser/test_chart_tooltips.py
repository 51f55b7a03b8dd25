"""The charts' tooltips are HTML built from trial data: a planted label must show as text and
never run, even with the page's Content-Security-Policy off (the policy is a second line,
not the only one). The real page of `depthscope serve --no-runner`, its own charts module
and ECharts in headless Chromium; each chart drawn with labels that are markup, and its
tooltip shown on a point."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.browser.conftest import Watched, login, start_service
from tests.support.procs import terminate_session

pytestmark = [pytest.mark.browser, pytest.mark.timeout(300)]

#: Markup that, put into the page as HTML, runs (an image that fails to load calls onerror).
PLANTED = '<img src="/nothing.png" onerror="window.__pwned=(window.__pwned||0)+1">'

#: Draw each chart in a box of its own with PLANTED as every label that comes from data
#: (a variant, a metric name, a unit, a fit's label), show the tooltip of a point,
#: and return, per chart, the tooltip's text and whether it holds an <img> element.
DRAW_AND_HOVER = """async (planted) => {
    const charts = await import('/dashboard/static/charts.js');
    const box = (id) => {
        const el = document.createElement('div');
        el.id = id;
        el.style.cssText = 'width:600px;height:400px';
        document.body.appendChild(el);
        return el;
    };
    const points = {number: [0, 1, 2], variant: [planted, planted, 'baseline'],
                     metrics: {[planted]: [1, 2, 3], val_loss: [3.1, 3.0, 2.9]}};
    const units = {[planted]: planted, val_loss: 'loss'};
    const draws = {
        pareto: (el) => charts.drawPareto(el, points, planted, 'val_loss', units, [0, 1]),
        optimum: (el) => charts.drawOptimum(el, [[planted, [[10, 3.0, 7], [20, 2.9, 8]]]],
            [{label: planted, budgetText: planted, coefficients: [0.1, -0.2, 3.0],
              explored: [10, 20], optimum_ratio: 15, ci_low: 12, ci_high: 18}]),
        compare: (el) => charts.drawCompare(el, [{variant: planted, by_depth: [
            {n_layers: 2, mean: -0.01, ci_low: -0.02, ci_high: 0.0},
            {n_layers: 3, mean: -0.015, ci_low: -0.025, ci_high: -0.005},
            {n_layers: 4, mean: -0.02, ci_low: -0.03, ci_high: -0.01}]}], planted),
        curves: (el) => charts.drawCurves(el, [{number: 3, variant: planted,
            curve: [[1, 512, 1e9, 3.2], [2, 1024, 2e9, 3.1], [3, 1536, 3e9, 3.05]]}]),
    };
    const out = {};
    for (const [name, draw] of Object.entries(draws)) {
        const el = box('xss-' + name);
        draw(el);
        const chart = echarts.getInstanceByDom(el);
        if (chart.getOption().tooltip[0].trigger === 'axis') {  // at a middle point's pixel
            const middle = chart.getOption().series[0].data[1];
            const [x, y] = chart.convertToPixel({seriesIndex: 0}, middle);
            chart.dispatchAction({type: 'showTip', x, y});
        } else {
            chart.dispatchAction({type: 'showTip', seriesIndex: 0, dataIndex: 0});
        }
        await new Promise((done) => setTimeout(done, 300));
        const tips = [...el.querySelectorAll('div')].filter(
            (d) => d.style.position === 'absolute' && d.textContent.length > 0);
        const tip = tips[tips.length - 1];
        out[name] = {text: tip ? tip.textContent : null,
                     images: tip ? tip.querySelectorAll('img').length : -1};
    }
    await new Promise((done) => setTimeout(done, 500));  // time for an image to fail
    out.pwned = window.__pwned || 0;
    return out;
}"""


def test_planted_labels_show_as_text_and_never_run_without_the_csp(
    tmp_path: Path, browser: Any
) -> None:
    service = start_service(tmp_path, runner=False)
    context = browser.new_context(viewport={"width": 1400, "height": 1000}, bypass_csp=True)
    watched = Watched(context.new_page())
    watched.page.on(
        "console", lambda m: watched.errors.append(m.text) if m.type == "error" else None
    )
    watched.page.on("pageerror", lambda exc: watched.errors.append(f"page error: {exc}"))
    try:
        login(watched, service)
        watched.page.wait_for_selector("#jobs-table")
        # the policy is really off: an inline handler runs
        assert (
            watched.page.evaluate(
                """() => { const d = document.createElement('div');
                       d.setAttribute('onclick', 'window.__inline = 1'); d.click();
                       return window.__inline; }"""
            )
            == 1
        )
        shown = watched.page.evaluate(DRAW_AND_HOVER, PLANTED)
    finally:
        context.close()
        terminate_session(service.proc)
    assert shown["pwned"] == 0, shown
    for name in ("pareto", "optimum", "compare", "curves"):
        assert shown[name]["images"] == 0, (name, shown[name])
        assert shown[name]["text"] and PLANTED in shown[name]["text"], (name, shown[name])
    assert watched.errors == [], watched.errors  # no image was requested, nothing failed
