// The charts, drawn with Apache ECharts (the vendored global `echarts`): a scatter of every
// trial with the Pareto front, loss against d_model/L_b with the fitted curves, the optimum
// and its interval, the paired difference against depth with its interval, learning curves.
// Every axis names its quantity and unit; values are scaled to that unit (format.js).

import { escapeHtml as esc, fixed, human, scaleFor } from "./format.js";

const echarts = window.echarts;
const charts = new Map();
const PALETTE = ["#2f6fde", "#e4572e", "#17a398", "#a64ac9", "#f2a541", "#5d6d7e", "#c2185b", "#33691e"];

/** Marks, once, the time from navigation to the first chart drawn (performance.now(), ms). */
function markFirst() {
  if (window.__depthscope.firstChartMs !== null) return;
  window.__depthscope.firstChartMs = performance.now();
  performance.mark("depthscope:first-chart");
  document.body.dataset.firstChart = String(Math.round(window.__depthscope.firstChartMs));
}
window.__depthscope = window.__depthscope || { firstChartMs: null, drawn: {} };

function chartOf(el) {
  let chart = charts.get(el.id);
  if (!chart || chart.isDisposed() || chart.getDom() !== el) {
    chart = echarts.init(el, null, { renderer: "canvas" });
    chart.on("finished", () => {
      markFirst();
      window.__depthscope.drawn[el.id] = (window.__depthscope.drawn[el.id] || 0) + 1;
      el.dataset.drawn = String(window.__depthscope.drawn[el.id]);
    });
    charts.set(el.id, chart);
  }
  return chart;
}

export function disposeAll() {
  for (const chart of charts.values()) if (!chart.isDisposed()) chart.dispose();
  charts.clear();
}

window.addEventListener("resize", () => {
  for (const chart of charts.values()) if (!chart.isDisposed()) chart.resize();
});

/** An axis for `values` in `unit`: [factor, name with unit]. */
function axisScale(values, unit, label) {
  let max = 0;
  for (const v of values) if (v !== null && Math.abs(v) > max) max = Math.abs(v);
  const [factor, shown] = scaleFor(unit, max);
  const name = unit === "loss" ? `${label} (nats)` : `${label} (${shown})`;
  return [factor, name];
}

function baseOption(xName, yName, extra = {}) {
  return {
    animation: false,
    color: PALETTE,
    grid: { left: 70, right: 20, top: 40, bottom: 55 },
    legend: { type: "scroll", top: 0 },
    tooltip: { trigger: "item", confine: true },
    xAxis: { type: "value", name: xName, nameLocation: "middle", nameGap: 30, scale: true },
    yAxis: { type: "value", name: yName, nameLocation: "middle", nameGap: 52, scale: true },
    ...extra,
  };
}

/** Every trial as a point of (x, y) per variant, and the front as a line over its points.
 * `points`: the columns of GET /points; `front`: the trial numbers of the Pareto front. */
export function drawPareto(el, points, x, y, units, front, onPick) {
  const xs = points.metrics[x];
  const ys = points.metrics[y];
  const [fx, xName] = axisScale(xs, units[x], x);
  const [fy, yName] = axisScale(ys, units[y], y);
  const byVariant = new Map();
  const index = new Map();
  points.number.forEach((n, i) => {
    index.set(n, i);
    if (xs[i] === null || ys[i] === null) return;
    const v = points.variant[i];
    if (!byVariant.has(v)) byVariant.set(v, []);
    byVariant.get(v).push([xs[i] / fx, ys[i] / fy, n]);
  });
  const series = [...byVariant.entries()].map(([name, data]) => ({
    name, type: "scatter", data, symbolSize: 5, large: data.length > 2000, largeThreshold: 2000,
    itemStyle: { opacity: 0.55 },
  }));
  const frontData = front
    .map((n) => index.get(n))
    .filter((i) => i !== undefined && xs[i] !== null && ys[i] !== null)
    .map((i) => [xs[i] / fx, ys[i] / fy, points.number[i]])
    .sort((a, b) => a[0] - b[0]);
  series.push({
    name: "Pareto front", type: "line", data: frontData, step: "end", symbol: "circle",
    symbolSize: 9, lineStyle: { width: 2, color: "#111" }, itemStyle: { color: "#111" }, z: 5,
  });
  const chart = chartOf(el);
  chart.setOption(baseOption(xName, yName, {
    tooltip: {
      trigger: "item", confine: true,
      formatter: (p) => `trial ${esc(p.data[2])} (${esc(p.seriesName)})`
        + `<br>${esc(x)}: ${esc(human(p.data[0] * fx, units[x]))}`
        + `<br>${esc(y)}: ${esc(human(p.data[1] * fy, units[y]))}`,
    },
    series,
  }), true);
  chart.off("click");
  chart.on("click", (p) => { if (p.data && onPick) onPick(p.data[2]); });
}

/** Loss against d_model/L_b (log axis) per variant; each fit's quadratic in ln(ratio) over
 * its explored range, its optimum as a vertical line and its interval as a band. */
export function drawOptimum(el, groups, fits) {
  const series = [];
  const colours = new Map();
  const colour = (v) => {
    if (!colours.has(v)) colours.set(v, PALETTE[colours.size % PALETTE.length]);
    return colours.get(v);
  };
  for (const [variant, data] of groups) {
    series.push({ name: variant, type: "scatter", data, symbolSize: 6, large: data.length > 2000,
      itemStyle: { color: colour(variant), opacity: 0.7 } });
  }
  // each optimum's label above the plot, one row per labelled optimum, so that optima close
  // together (or equal) never print one label over another
  let row = 0;
  for (const fit of fits) {
    const name = fit.budgetText ? `${fit.label} @ ${fit.budgetText}` : fit.label;
    const c = colour(fit.label);
    if (fit.coefficients.length === 3 && fit.explored) {
      const [a, b, k] = fit.coefficients;
      const [lo, hi] = fit.explored;
      const curve = [];
      for (let j = 0; j <= 60; j++) {
        const r = Math.exp(Math.log(lo) + ((Math.log(hi) - Math.log(lo)) * j) / 60);
        const u = Math.log(r);
        curve.push([r, a * u * u + b * u + k]);
      }
      const marks = {};
      if (fit.optimum_ratio) {
        marks.markLine = { symbol: "none", silent: true, lineStyle: { color: c, type: "dashed" },
          label: { formatter: `${fit.label}: optimum ${fixed(fit.optimum_ratio)}`, position: "end",
            distance: [0, LABEL_GAP + LABEL_ROW * row++], color: c, fontSize: 12 },
          data: [{ xAxis: fit.optimum_ratio }] };
      }
      if (fit.ci_low && fit.ci_high) {
        marks.markArea = { silent: true, itemStyle: { color: c, opacity: 0.12 },
          data: [[{ xAxis: fit.ci_low }, { xAxis: fit.ci_high }]] };
      }
      series.push({ name: `${name} fit`, type: "line", data: curve, symbol: "none", smooth: true,
        lineStyle: { color: c, width: 2 }, itemStyle: { color: c }, ...marks });
    }
  }
  const chart = chartOf(el);
  const base = baseOption("d_model / L_b (log scale)", "validation loss (nats)");
  chart.setOption(baseOption("d_model / L_b (log scale)", "validation loss (nats)", {
    grid: { ...base.grid, top: base.grid.top + LABEL_ROW * row },
    xAxis: { type: "log", name: "d_model / L_b (log scale)", nameLocation: "middle", nameGap: 30 },
    tooltip: { trigger: "item", confine: true,
      formatter: (p) => `${esc(p.seriesName)}<br>d/L ${esc(fixed(p.data[0]))}, loss ${esc(fixed(p.data[1]))}`
        + (p.data[2] !== undefined ? `<br>trial ${esc(p.data[2])}` : "") },
    series,
  }), true);
  keepLabelsInside(chart, series);
}

/** Rows of the optimum labels above the plot: the gap to the plot, and each row's height. */
const LABEL_GAP = 4;
const LABEL_ROW = 16;
let measure = null;

/** An optimum's label is centred on its line; one near the chart's side is aligned to its
 * line instead (left of it, or right), so that all of it stays in the chart. */
function keepLabelsInside(chart, series) {
  measure = measure || document.createElement("canvas").getContext("2d");
  measure.font = "12px sans-serif";
  const width = chart.getWidth();
  let moved = false;
  const updates = series.map((s) => {
    if (!s.markLine) return {};
    const x = chart.convertToPixel({ xAxisIndex: 0 }, s.markLine.data[0].xAxis);
    const half = measure.measureText(s.markLine.label.formatter).width / 2;
    let align = "center";
    if (x - half < 2) align = "left";
    else if (x + half > width - 2) align = "right";
    moved = moved || align !== "center";
    return { markLine: { label: { align } } };
  });
  if (moved) chart.setOption({ series: updates });
}

/** Per variant, the mean paired loss difference against the reference at each depth, and
 * its interval as dashed bounds; zero marked. */
export function drawCompare(el, crossover, reference) {
  const series = [];
  crossover.forEach((c, i) => {
    const colour = PALETTE[i % PALETTE.length];
    const pts = c.by_depth.filter((d) => d.mean !== null);
    series.push({ name: `${c.variant} − ${reference}`, type: "line", symbolSize: 7,
      data: pts.map((d) => [d.n_layers, d.mean]), lineStyle: { color: colour }, itemStyle: { color: colour },
      markLine: i === 0 ? { symbol: "none", silent: true, data: [{ yAxis: 0 }], lineStyle: { color: "#999" } } : undefined });
    for (const [bound, key] of [["low", "ci_low"], ["high", "ci_high"]]) {
      series.push({ name: `${c.variant} interval ${bound}`, type: "line", symbol: "none",
        data: pts.filter((d) => d[key] !== null).map((d) => [d.n_layers, d[key]]),
        lineStyle: { color: colour, type: "dashed", width: 1 }, itemStyle: { color: colour } });
    }
  });
  const chart = chartOf(el);
  chart.setOption(baseOption("depth n_layers (blocks)", "loss difference (nats, negative: better)", {
    legend: { type: "scroll", top: 0, data: series.filter((s) => !s.name.includes(" interval ")).map((s) => s.name) },
    tooltip: { trigger: "axis", confine: true },
    xAxis: { type: "value", name: "depth n_layers (blocks)", nameLocation: "middle", nameGap: 30, minInterval: 1, scale: true },
    series,
  }), true);
}

/** Validation loss against tokens seen, one line per trial (curve rows: step, tokens,
 * FLOPs, loss). */
export function drawCurves(el, trials) {
  const series = trials.map((t) => ({
    name: `trial ${t.number} (${t.variant})`, type: "line", symbolSize: 5,
    data: (t.curve || []).filter((r) => r[3] !== null).map((r) => [r[1], r[3]]),
  }));
  let max = 0;
  for (const s of series) for (const p of s.data) max = Math.max(max, p[0]);
  const [fx, label] = scaleFor("tokens", max);
  for (const s of series) s.data = s.data.map((p) => [p[0] / fx, p[1]]);
  const chart = chartOf(el);
  chart.setOption(baseOption(`tokens seen (${label})`, "validation loss (nats)", {
    tooltip: { trigger: "axis", confine: true },
    series,
  }), true);
}
