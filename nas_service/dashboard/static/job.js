// The job view (#/job/<id>): its progress, its trials as a sorted, filtered table, their
// curves, and the Pareto, optimum and comparison charts, polled while the job is active.

import { api, ApiError, query } from "./api.js";
import { drawCompare, drawCurves, drawOptimum, drawPareto } from "./charts.js";
import { $, el, PAGE, POLL_MS, poller, report, view } from "./dom.js";
import { compute, duration, fixed, human } from "./format.js";
import { ACTIVE, cancel, computeText, runsText } from "./jobs.js";
import { catalogue, fitLabel, label, residualLabels, unitOf, units } from "./names.js";
import { trialDetail } from "./trial.js";

// -- one job --------------------------------------------------------------------------------
export function jobView(id) {
  view.append($("#tpl-job").content.cloneNode(true));
  const base = `/v1/jobs/${encodeURIComponent(id)}`;
  const state = {
    job: null, sort: "number", descending: false, offset: 0, selected: new Set(),
    curves: new Map(), seen: null, variants: [], points: new Map(),
  };
  let stopped = false;

  // the metric pickers
  const metricNames = Object.keys(catalogue.metrics);
  for (const sel of [$("#pareto-x"), $("#pareto-y")]) {
    sel.replaceChildren(...metricNames.map((m) => el("option", { value: m }, `${m} (${unitOf(m)})`)));
  }

  $("#job-cancel").addEventListener("click", () => cancel(id).then(() => poll.kick()));
  for (const f of ["#f-state", "#f-variant", "#f-layers", "#f-dmodel"]) {
    $(f).addEventListener("change", () => { state.offset = 0; refreshTable().catch(report); });
  }
  $("#page-prev").addEventListener("click", () => { state.offset = Math.max(0, state.offset - PAGE); refreshTable().catch(report); });
  $("#page-next").addEventListener("click", () => { state.offset += PAGE; refreshTable().catch(report); });
  for (const f of ["#pareto-x", "#pareto-y"]) $(f).addEventListener("change", () => refreshPareto().catch(report));
  $("#opt-view").addEventListener("change", () => refreshOptimum().catch(report));
  $("#compare-ref").addEventListener("change", () => refreshCompare().catch(report));

  function renderHead(job) {
    $("#job-name").textContent = job.name;
    $("#job-id").textContent = job.id;
    const status = $("#job-status");
    status.textContent = job.status;
    status.className = `status ${job.status}`;
    $("#job-trials").textContent = `${job.progress.counted}/${job.n_trials} (${job.progress.completed} complete, ${job.progress.running} running, ${job.progress.pruned} pruned, ${job.progress.failed} failed)`;
    $("#job-runs").textContent = runsText(job);
    $("#job-compute").textContent = computeText(job);
    $("#job-eta").textContent = ACTIVE.has(job.status) ? duration(job.eta_s) : "–";
    $("#job-cancel").hidden = !ACTIVE.has(job.status);
    $("#job-bar").style.width = `${Math.min(100, (100 * job.progress.counted) / Math.max(1, job.n_trials))}%`;
    $("#job-error").hidden = !job.error;
    $("#job-error").textContent = job.error || "";
    const rungs = job.progress.rungs || [];
    $("#rungs").hidden = rungs.length === 0;
    $("#rungs tbody").replaceChildren(...rungs.map((r) => el("tr", {},
      el("td", {}, String(r.rung)), el("td", { class: "num" }, fixed(r.fraction)),
      el("td", { class: "num" }, String(r.reached)), el("td", { class: "num" }, String(r.training)),
      el("td", { class: "num" }, String(r.waiting)), el("td", { class: "num" }, String(r.promoted)))));
  }

  function setupOnce(job) {
    if (state.variants.length) return;
    const labels = residualLabels(job.spec);
    state.variants = labels;
    $("#f-variant").append(...labels.map((v) => el("option", { value: v }, v)));
    const [x, y] = job.objectives.length >= 2 ? job.objectives : ["train_memory_bytes", "val_loss"];
    $("#pareto-x").value = y === "val_loss" ? x : y;
    $("#pareto-y").value = y === "val_loss" ? y : x;
    if (labels.length > 1) {
      $("#compare-card").hidden = false;
      $("#compare-ref").replaceChildren(...labels.map((v) => el("option", { value: v }, v)));
      $("#compare-ref").value = labels.includes("baseline") ? "baseline" : labels[0];
    }
    const cols = [["", null], ["#", "number"], ["state", "state"], ["variant", "variant"],
      ["n_layers", "n_layers"], ["d_model", "d_model"], ["d/L", "ratio"],
      ...job.objectives.map((m) => [`${m} (${unitOf(m)})`, m]), ["duration", "duration_s"]];
    state.columns = cols;
    $("#trials thead tr").replaceChildren(...cols.map(([label, key]) => el("th", {
      dataset: key ? { sort: key } : {}, class: key === "number" ? "sorted" : null,
      onclick: key ? () => sortBy(key) : null,
    }, label)));
  }

  function sortBy(key) {
    state.descending = state.sort === key ? !state.descending : false;
    state.sort = key;
    state.offset = 0;
    for (const th of document.querySelectorAll("#trials th[data-sort]")) {
      th.classList.toggle("sorted", th.dataset.sort === key);
      th.classList.toggle("desc", th.dataset.sort === key && state.descending);
    }
    refreshTable().catch(report);
  }

  async function refreshTable() {
    const job = state.job;
    const page = await api(`${base}/table${query({
      sort: state.sort, descending: state.descending, limit: PAGE, offset: state.offset,
      state: $("#f-state").value, variant: $("#f-variant").value,
      n_layers: $("#f-layers").value, d_model: $("#f-dmodel").value,
    })}`);
    if (stopped) return;
    $("#page-info").textContent = page.total
      ? `${page.offset + 1}–${Math.min(page.total, page.offset + page.items.length)} of ${page.total}`
      : "no trials";
    $("#page-prev").disabled = page.offset === 0;
    $("#page-next").disabled = page.offset + page.items.length >= page.total;
    $("#trials tbody").replaceChildren(...page.items.map((t) => {
      const arch = t.arch || {};
      const ratio = arch.d_model && arch.n_layers ? arch.d_model / arch.n_layers : null;
      const box = el("input", { type: "checkbox", class: "pick", "aria-label": `curve of trial ${t.number}` });
      box.checked = state.selected.has(t.number);
      box.addEventListener("click", (event) => { event.stopPropagation(); toggleCurve(t.number, box.checked).catch(report); });
      return el("tr", { dataset: { trial: t.number }, class: state.selected.has(t.number) ? "selected" : null, onclick: () => showTrial(t.number).catch(report) },
        el("td", {}, box),
        el("td", { class: "num" }, String(t.number)),
        el("td", {}, el("span", { class: `status ${t.state}` }, t.state)),
        el("td", {}, label(t)),
        el("td", { class: "num" }, arch.n_layers ?? "–"),
        el("td", { class: "num" }, arch.d_model ?? "–"),
        el("td", { class: "num" }, ratio === null ? "–" : fixed(ratio)),
        ...job.objectives.map((m) => el("td", { class: "num" }, human(t.metrics[m], unitOf(m)))),
        el("td", { class: "num" }, t.duration_s === null ? "–" : `${fixed(t.duration_s)} s`));
    }));
  }

  /** The trials as columns (GET /points), asked once per state of the job (the charts
   * drawn together share one answer). */
  function points(x, y) {
    const names = [...new Set(["val_loss", x, y])].join(",");
    if (!state.points.has(names)) {
      const answer = api(`${base}/points${query({ metrics: names })}`);
      answer.catch(() => state.points.delete(names)); // asked again next time
      state.points.set(names, answer);
    }
    return state.points.get(names);
  }

  async function refreshPareto() {
    const x = $("#pareto-x").value;
    const y = $("#pareto-y").value;
    const note = $("#pareto-note");
    if (x === y) { note.textContent = "Pick two different metrics."; return; }
    const asked = points(x, y); // both at once: the columns and the front
    const frontAnswer = state.job.progress.completed > 0
      ? api(`${base}/pareto${query({ metrics: `${x},${y}` })}`)
      : null;
    if (frontAnswer) frontAnswer.catch(() => {}); // awaited below; no unhandled rejection meanwhile
    const cols = await asked;
    let front = [];
    note.textContent = "";
    if (frontAnswer) {
      try {
        const answer = await frontAnswer;
        front = answer.front.map((t) => t.number);
        note.textContent = `${answer.front.length} trials on the front of ${answer.n_candidates} (each architecture at its best setting); click a point for its trial.`;
      } catch (exc) {
        if (!(exc instanceof ApiError) || exc.status === 401) throw exc;
        note.textContent = exc.message;
      }
    } else {
      note.textContent = "No completed trial yet.";
    }
    if (stopped) return;
    drawPareto($("#chart-pareto"), cols, x, y, units(), front, (n) => showTrial(n).catch(report));
  }

  async function refreshOptimum() {
    const profile = $("#opt-view").value === "profile";
    const notes = $("#optimum-notes");
    const cols = await points("val_loss", "val_loss");
    const groups = new Map();
    const add = (variant, ratio, loss, n) => {
      if (ratio === null || loss === null) return;
      if (!groups.has(variant)) groups.set(variant, []);
      groups.get(variant).push([ratio, loss, n]);
    };
    const index = new Map(cols.number.map((n, i) => [n, i]));
    if (profile) {
      cols.profile_trials.forEach((n, j) => {
        const i = index.get(n);
        if (i !== undefined) add(cols.variant[i], cols.ratio[i], cols.profile_loss[j], n);
      });
    } else {
      cols.number.forEach((n, i) => { if (cols.state[i] === "complete") add(cols.variant[i], cols.ratio[i], cols.metrics.val_loss[i], n); });
    }
    let fits = [];
    notes.replaceChildren();
    if (state.job.progress.completed > 0) {
      try {
        const answer = await api(`${base}/optimum${query({ profile })}`);
        const kind = state.job.compute.kind;
        fits = answer.fits.map((f) => ({
          ...f, label: fitLabel(f, cols), budgetText: f.budget ? compute(f.budget, kind) : null,
        }));
        notes.replaceChildren(...answer.fits.map((f) => el("li", {},
          el("b", {}, f.variant), `: ${f.verdict}`,
          f.optimum_ratio ? `, optimum d/L ${fixed(f.optimum_ratio)}` : "",
          f.ci_low && f.ci_high ? ` (90% interval ${fixed(f.ci_low)}–${fixed(f.ci_high)})` : "",
          f.message ? `. ${f.message}` : "")));
      } catch (exc) {
        if (!(exc instanceof ApiError) || exc.status === 401) throw exc;
        notes.replaceChildren(el("li", {}, exc.message));
      }
    }
    if (stopped) return;
    drawOptimum($("#chart-optimum"), groups, fits);
  }

  async function refreshCompare() {
    if ($("#compare-card").hidden || state.job.progress.completed === 0) return;
    const reference = $("#compare-ref").value;
    const notes = $("#compare-notes");
    const cols = await points("val_loss", "val_loss");
    if (!cols.variant.some((v, i) => v === reference && cols.state[i] === "complete")) {
      notes.replaceChildren(el("li", {}, `No trained trial of ${reference} yet.`));
      return;
    }
    try {
      const answer = await api(`${base}/compare${query({ reference })}`);
      if (stopped) return;
      drawCompare($("#chart-compare"), answer.crossover, reference);
      const scored = answer.scored_on === "confirmation"
        ? "scored on held-out confirmation seeds"
        : answer.scored_on ? `scored on ${answer.scored_on} seeds` : "";
      notes.replaceChildren(...answer.crossover.map((c) => el("li", {}, el("b", {}, c.variant), `: ${c.message}`)),
        el("li", {}, `${answer.pairs.length} matched shapes; ${answer.method}${scored ? `; ${scored}` : ""}`),
        ...(answer.warning ? [el("li", { class: "warn", id: "compare-warning" }, answer.warning)] : []));
    } catch (exc) {
      if (!(exc instanceof ApiError) || exc.status === 401) throw exc;
      notes.replaceChildren(el("li", {}, exc.message));
    }
  }

  async function toggleCurve(number, on) {
    if (on) {
      state.selected.add(number);
      if (!state.curves.has(number)) state.curves.set(number, await api(`${base}/trials/${number}`));
    } else {
      state.selected.delete(number);
    }
    await drawSelected();
  }

  async function drawSelected() {
    const trials = [...state.selected].map((n) => state.curves.get(n)).filter(Boolean);
    $("#curves-note").textContent = trials.length
      ? `${trials.length} trial(s): validation loss against tokens seen.`
      : "Tick trials in the table to draw their curves.";
    if (stopped) return;
    drawCurves($("#chart-curves"), trials);
    for (const tr of document.querySelectorAll("#trials tbody tr")) {
      tr.classList.toggle("selected", state.selected.has(Number(tr.dataset.trial)));
    }
  }

  async function showTrial(number) {
    const t = await api(`${base}/trials/${number}?curve=false`);
    if (stopped) return;
    $("#trial-card").hidden = false;
    $("#trial-number").textContent = `${t.number} · ${label(t)} · ${t.state}`;
    $("#trial-detail").replaceChildren(...trialDetail(t));
  }

  async function refreshCharts() {
    await Promise.all([refreshPareto(), refreshOptimum(), refreshCompare()]);
  }

  async function tick() {
    const job = await api(base);
    if (stopped) return;
    state.job = job;
    setupOnce(job);
    renderHead(job);
    const key = `${job.status}/${job.progress.counted}/${job.progress.running}/${job.progress.runs_done}`;
    if (key !== state.seen) {
      state.seen = key;
      state.points.clear();
      await Promise.all([refreshTable(), refreshCharts()]);
      const live = [...state.selected].filter((n) => { const t = state.curves.get(n); return t && !["complete", "pruned", "failed"].includes(t.state); });
      for (const n of live) state.curves.set(n, await api(`${base}/trials/${n}`));
      if (live.length) await drawSelected();
    }
  }

  const poll = poller(tick, POLL_MS, () => !state.job || ACTIVE.has(state.job.status));
  return { stop() { stopped = true; poll.stop(); }, kick: () => poll.kick() };
}
