// depthscope's dashboard: the views (#/jobs, #/job/<id>, #/cost), each reading the API
// (api.js) and polling it while a job is active, no reload. Plain ES modules, no build step.

import { api, ApiError, getToken, onUnauthorised, query, setToken } from "./api.js";
import { disposeAll, drawCompare, drawCurves, drawOptimum, drawPareto } from "./charts.js";
import { compute, duration, fixed, human } from "./format.js";

const POLL_MS = 2000;
const PAGE = 50;
const $ = (sel, root = document) => root.querySelector(sel);
const view = $("#view");
let catalogue = null; // GET /v1/catalogue
let current = null; // the view shown: { stop() }

// -- small helpers ------------------------------------------------------------------------
function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (v === undefined || v === null || v === false) continue;
    if (k === "class") node.className = v;
    else if (k === "dataset") Object.assign(node.dataset, v);
    else if (k.startsWith("on")) node.addEventListener(k.slice(2), v);
    else node.setAttribute(k, v === true ? "" : v);
  }
  for (const c of children.flat()) if (c !== null && c !== undefined) node.append(c);
  return node;
}

function banner(message) {
  const b = $("#banner");
  b.textContent = message || "";
  b.hidden = !message;
}

function unitOf(metric) {
  return catalogue && catalogue.metrics[metric] ? catalogue.metrics[metric].unit : "";
}

function units() {
  const out = {};
  for (const [name, info] of Object.entries(catalogue ? catalogue.metrics : {})) out[name] = info.unit;
  return out;
}

/** Runs `fn` now and every `ms` while `active()` holds, never two at once; errors go to the
 * banner (a 401 to the token prompt), never to the console. */
function poller(fn, ms, active) {
  let timer = null;
  let busy = false;
  let stopped = false;
  async function tick() {
    if (stopped || busy) return;
    busy = true;
    try {
      await fn();
    } catch (exc) {
      report(exc);
    } finally {
      busy = false;
      if (!stopped && active()) timer = setTimeout(tick, ms);
    }
  }
  tick();
  return {
    stop() { stopped = true; clearTimeout(timer); },
    kick() { if (!stopped) { clearTimeout(timer); tick(); } },
  };
}

function report(exc) {
  if (exc instanceof ApiError && exc.status === 401) return; // the token prompt says it
  banner(exc instanceof ApiError ? `${exc.status}: ${exc.message}` : String(exc && exc.message ? exc.message : exc));
}

// -- the token ------------------------------------------------------------------------------
function showToken(message) {
  $("#token-message").textContent = message;
  $("#token-panel").hidden = false;
  $("#token-input").value = "";
  $("#token-input").focus();
}

onUnauthorised(() => {
  showToken(getToken()
    ? "The service refused this token (401). Enter the right API token."
    : "This service needs its API token (401). Enter it to continue.");
});

$("#token-form").addEventListener("submit", (event) => {
  event.preventDefault();
  setToken($("#token-input").value.trim());
  $("#token-panel").hidden = true;
  banner("");
  catalogue = null;
  route();
});
$("#token-clear").addEventListener("click", () => { setToken(null); $("#token-input").value = ""; });
$("#token-cancel").addEventListener("click", () => { $("#token-panel").hidden = true; });
$("#token-open").addEventListener("click", () => showToken("Enter the service's API token (kept for this browser session only)."));

// -- routing --------------------------------------------------------------------------------
async function route() {
  if (current) current.stop();
  current = null;
  disposeAll();
  view.replaceChildren();
  banner("");
  if (document.body.dataset.auth === "token" && !getToken()) {
    // the service says it needs a token: ask before any read (which would be a 401)
    showToken("This service needs its API token. Enter it to continue.");
    return;
  }
  try {
    if (!catalogue) catalogue = await api("/v1/catalogue");
  } catch (exc) {
    report(exc);
    return;
  }
  const hash = location.hash || "#/jobs";
  const job = hash.match(/^#\/job\/([^/?]+)$/);
  if (job) current = jobView(decodeURIComponent(job[1]));
  else if (hash === "#/cost") current = costView();
  else current = jobsView();
}
window.addEventListener("hashchange", route);

// -- jobs -----------------------------------------------------------------------------------
function progressText(job) {
  const p = job.progress;
  let text = `${p.counted}/${job.n_trials} trials`;
  if (p.runs_total) text += ` · ${p.runs_done}/${p.runs_total} runs`;
  if (p.rungs && p.rungs.length) text += ` · rungs ${p.rungs.map((r) => r.reached).join("/")}`;
  return text;
}

/** The compute spent, of the job's budget: "1.2 PFLOP of 4 PFLOP (30%)". */
function computeText(job) {
  const c = job.compute;
  return `${compute(c.spent, c.kind)} of ${compute(c.budget, c.kind)} (${(100 * c.fraction).toFixed(0)}%)`;
}

/** Training runs (settings × seeds of each trial) done, of the job's, and its seeds. */
function runsText(job) {
  const seeds = job.spec.seeds || 1;
  return `${job.progress.runs_done}/${job.progress.runs_total} (${seeds} seed${seeds === 1 ? "" : "s"} per setting)`;
}

const ACTIVE = new Set(["pending", "running"]);

async function cancel(id) {
  try {
    await api(`/v1/jobs/${encodeURIComponent(id)}/cancel`, { method: "POST" });
  } catch (exc) {
    report(exc);
  }
}

function jobsView() {
  view.append($("#tpl-jobs").content.cloneNode(true));
  const body = $("#jobs-table tbody");
  const text = $("#spec-text");
  $("#spec-file").addEventListener("change", async (event) => {
    const file = event.target.files[0];
    if (file) text.value = await file.text();
  });
  $("#spec-submit").addEventListener("click", () => submit(text.value).catch(report));

  // a row is rebuilt only when what it shows changed: a button under the pointer stays put
  const rows = new Map();
  async function refresh() {
    const jobs = await api("/v1/jobs?limit=200");
    $("#jobs-empty").hidden = jobs.total > 0;
    body.replaceChildren(...jobs.items.map((job) => {
      const shown = [job.name, job.status, progressText(job), computeText(job), ACTIVE.has(job.status) ? duration(job.eta_s) : "–"];
      const sig = JSON.stringify(shown);
      const kept = rows.get(job.id);
      if (kept && kept.sig === sig) return kept.tr;
      const tr = jobRow(job);
      rows.set(job.id, { sig, tr });
      return tr;
    }));
  }

  function jobRow(job) {
    return el("tr", { dataset: { job: job.id } },
      el("td", {}, el("a", { href: `#/job/${encodeURIComponent(job.id)}` }, job.name), " ", el("small", {}, job.id.slice(0, 8))),
      el("td", {}, el("span", { class: `status ${job.status}` }, job.status)),
      el("td", {}, progressText(job)),
      el("td", {}, computeText(job)),
      el("td", {}, ACTIVE.has(job.status) ? duration(job.eta_s) : "–"),
      el("td", {}, ACTIVE.has(job.status)
        ? el("button", { type: "button", class: "cancel", onclick: () => cancel(job.id).then(() => poll.kick()) }, "Cancel")
        : null),
    );
  }
  const poll = poller(refresh, POLL_MS, () => true);
  return poll;
}

/** The line of `field` (a.b.c) in the YAML text: the last key of the path, found in order. */
function lineOf(text, field) {
  const lines = text.split("\n");
  let at = 0;
  let found = -1;
  for (const part of String(field).split(".")) {
    if (/^\d+$/.test(part)) continue;
    const re = new RegExp(`^\\s*(-\\s*)?["']?${part.replace(/[.*+?^${}()|[\]\\]/g, "\\$&")}["']?\\s*:`);
    for (let i = at; i < lines.length; i++) if (re.test(lines[i])) { found = i; at = i; break; }
  }
  return found < 0 ? null : found + 1;
}

function showErrors(list, text) {
  const ul = $("#spec-errors");
  ul.replaceChildren(...list.map((e) => {
    const line = e.field ? lineOf(text, e.field) : null;
    return el("li", { dataset: { field: e.field || "" } },
      el("code", {}, e.field || "spec"), `: ${e.message}`, line ? ` (line ${line})` : "");
  }));
}

async function submit(text) {
  showErrors([], text);
  const parsed = await api("/v1/specs/parse", { method: "POST", body: { text } });
  if (parsed.errors.length) {
    showErrors(parsed.errors, text);
    return;
  }
  try {
    const job = await api("/v1/jobs", { method: "POST", body: parsed.spec });
    location.hash = `#/job/${encodeURIComponent(job.id)}`;
  } catch (exc) {
    if (exc instanceof ApiError && exc.status !== 401) {
      showErrors(exc.errors.length ? exc.errors : [{ field: exc.field, message: exc.message }], text);
    } else {
      throw exc;
    }
  }
}

// -- one job --------------------------------------------------------------------------------
function jobView(id) {
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
      notes.replaceChildren(...answer.crossover.map((c) => el("li", {}, el("b", {}, c.variant), `: ${c.message}`)),
        el("li", {}, `${answer.pairs.length} matched shapes; ${answer.method}`));
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
    const rows = Object.entries(t.metrics).sort(([a], [b]) => a.localeCompare(b));
    const arch = Object.entries(t.arch || {}).filter(([, v]) => v !== null);
    $("#trial-detail").replaceChildren(
      el("h3", {}, "cost breakdown and measured loss"),
      el("table", { class: "grid", id: "trial-costs" }, el("tbody", {}, ...rows.map(([m, v]) => el("tr", {},
        el("td", {}, m), el("td", { class: "num" }, human(v, unitOf(m))),
        el("td", { class: "hint" }, catalogue.metrics[m] ? catalogue.metrics[m].description : ""))))),
      el("h3", {}, "architecture"),
      el("dl", { class: "kv" }, ...arch.flatMap(([k, v]) => [el("dt", {}, k), el("dd", {}, String(v))])),
      el("h3", {}, "training"),
      el("dl", { class: "kv" },
        el("dt", {}, "setting"), el("dd", {}, JSON.stringify(t.setting)),
        el("dt", {}, "seeds' losses"), el("dd", {}, t.seeds.map((s) => (s === null ? "–" : fixed(s))).join(", ") || "–"),
        el("dt", {}, "runs"), el("dd", {}, String(t.train.length)),
        el("dt", {}, "outcome"), el("dd", {}, `${t.outcome}${t.reason ? `: ${t.reason}` : ""}`)));
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

function residualLabels(spec) {
  const out = [];
  for (const v of spec.space.variants) {
    if (v === "block_attnres") for (const s of spec.space.block_sizes || []) out.push(`block_attnres/S=${s}`);
    else out.push(v);
  }
  return out;
}

function label(t) {
  const arch = t.arch || {};
  return arch.block_size && t.variant === "block_attnres" ? `${t.variant}/S=${arch.block_size}` : t.variant;
}

function fitLabel(fit, cols) {
  const labels = new Set(cols.variant);
  if (labels.has(fit.variant)) return fit.variant;
  const match = [...labels].find((l) => l.startsWith(`${fit.variant}/`));
  return match || fit.variant;
}

// -- cost -----------------------------------------------------------------------------------
const COST_ROWS = [
  ["parameters", (c) => c.params.total, "parameters"],
  ["of which depth mixing", (c) => c.params.depth_mixing + c.params.depth_aggregation, "parameters"],
  ["training FLOPs per token", (c) => c.train_flops_per_token, "FLOPs"],
  ["decode FLOPs per token", (c) => c.decode_flops_per_token, "FLOPs"],
  ["training memory per device", (c) => c.training_memory.total_bytes, "bytes"],
  ["  activations", (c) => c.training_memory.activation_bytes, "bytes"],
  ["  depth-mixing activations", (c) => c.training_memory.depth_mixing_activation_bytes, "bytes"],
  ["inference memory per device", (c) => c.inference_memory.total_bytes, "bytes"],
  ["  KV cache", (c) => c.inference_memory.kv_cache_bytes, "bytes"],
  ["  prefill depth cache", (c) => c.inference_memory.depth_cache_bytes, "bytes"],
  ["pipeline traffic per step, naive", (c) => c.pipeline.naive_bytes_per_step, "bytes"],
  ["pipeline traffic per step, cached", (c) => c.pipeline.cached_bytes_per_step, "bytes"],
  ["pipeline bubble", (c) => c.pipeline.bubble_fraction, "fraction"],
  ["residual I/O per token per sublayer", (c) => c.residual_io.bytes_per_token_per_sublayer, "bytes"],
  ["training step (roofline)", (c) => c.step_time.total_s, "seconds"],
  ["decode step (roofline)", (c) => c.decode_time.total_s, "seconds"],
];

function costView() {
  view.append($("#tpl-cost").content.cloneNode(true));
  const hardware = $("#cost-hardware");
  hardware.replaceChildren(...catalogue.hardware.map((h) => el("option", { value: h }, h)));
  hardware.value = catalogue.hardware.includes("h100") ? "h100" : catalogue.hardware[0];
  const box = $("#cost-variants");
  for (const v of catalogue.variants) {
    const input = el("input", { type: "checkbox", value: v, dataset: { variant: v } });
    input.checked = true; // every variant side by side; untick to narrow
    box.append(el("label", {}, v, input));
  }
  $("#cost-form").addEventListener("submit", (event) => {
    event.preventDefault();
    price().catch(report);
  });

  function read() {
    const out = { arch: {}, workload: {}, parallelism: {}, hardware: hardware.value };
    for (const input of document.querySelectorAll("#cost-form [data-field]")) {
      const [group, name] = input.dataset.field.split(".");
      if (!name) continue;
      const raw = input.value.trim();
      if (raw === "") continue;
      out[group][name] = input.type === "number" ? Number(raw) : raw;
    }
    return out;
  }

  function clearErrors() {
    for (const e of document.querySelectorAll("#cost-form .field-error")) e.remove();
    for (const e of document.querySelectorAll("#cost-form .invalid")) e.classList.remove("invalid");
    $("#cost-error").hidden = true;
  }

  /** Each refusal once, next to the input it names (or below the form), with the variants
   * it refuses: "every variant: …" when all the chosen ones were refused alike. */
  function showRefusals(refusals, chosen) {
    const groups = new Map();
    for (const [variant, exc] of refusals) {
      const key = JSON.stringify([exc.field, exc.message]);
      if (!groups.has(key)) groups.set(key, { field: exc.field, message: exc.message, variants: [] });
      groups.get(key).variants.push(variant);
    }
    const general = [];
    for (const { field, message, variants } of groups.values()) {
      const who = variants.length === chosen.length && chosen.length > 1 ? "every variant" : variants.join(", ");
      const text = `${who}: ${message}`;
      const input = field ? document.querySelector(`#cost-form [data-field="${CSS.escape(field)}"]`) : null;
      if (input) {
        input.classList.add("invalid");
        input.closest("label").after(el("span", { class: "field-error", dataset: { field } }, text));
      } else {
        general.push(`${field || "request"}: ${text}`);
      }
    }
    $("#cost-error").hidden = general.length === 0;
    $("#cost-error").textContent = general.join("; ");
  }

  async function price() {
    clearErrors();
    const request = read();
    const chosen = [...document.querySelectorAll("#cost-variants input:checked")].map((i) => i.value);
    const results = [];
    const refusals = [];
    for (const variant of chosen) {
      const arch = { ...request.arch, variant };
      if (variant !== "block_attnres") delete arch.block_size;
      if (variant !== "mhc_lite") delete arch.mhc_streams;
      try {
        results.push([variant, await api("/v1/cost", { method: "POST", body: { ...request, arch } })]);
      } catch (exc) {
        if (!(exc instanceof ApiError) || exc.status === 401) throw exc;
        refusals.push([variant, exc]);
      }
    }
    showRefusals(refusals, chosen);
    const table = $("#cost-table");
    table.hidden = results.length === 0; // every variant refused: the messages say why
    $("thead", table).replaceChildren(el("tr", {}, el("th", {}, "per variant"), ...results.map(([v]) => el("th", { class: "num" }, v))));
    $("tbody", table).replaceChildren(...COST_ROWS.map(([name, get, unit]) => el("tr", {},
      el("td", {}, name),
      ...results.map(([, r]) => {
        const value = get(r.cost);
        return el("td", { class: "num" }, unit === "fraction" ? `${(100 * value).toFixed(1)}%` : human(value, unit));
      }))));
  }
  return { stop() {} };
}

route();
