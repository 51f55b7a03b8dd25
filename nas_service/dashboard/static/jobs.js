// The jobs view (#/jobs): every job with its progress, and the spec editor that submits one.

import { api, ApiError } from "./api.js";
import { $, el, POLL_MS, poller, report, view } from "./dom.js";
import { compute, duration } from "./format.js";

function progressText(job) {
  const p = job.progress;
  let text = `${p.counted}/${job.n_trials} trials`;
  if (p.runs_total) text += ` · ${p.runs_done}/${p.runs_total} runs`;
  if (p.rungs && p.rungs.length) text += ` · rungs ${p.rungs.map((r) => r.reached).join("/")}`;
  return text;
}

/** The compute spent, of the job's budget: "1.2 PFLOP of 4 PFLOP (30%)". */
export function computeText(job) {
  const c = job.compute;
  return `${compute(c.spent, c.kind)} of ${compute(c.budget, c.kind)} (${(100 * c.fraction).toFixed(0)}%)`;
}

/** Training runs (settings × seeds of each trial, then its confirmation seeds) done, of the
 * job's, and its seeds. */
export function runsText(job) {
  const seeds = job.spec.seeds || 1;
  const plural = (n) => `${n} seed${n === 1 ? "" : "s"}`;
  const confirm = job.spec.confirm ? `, ${plural(job.spec.confirm.seeds)} to confirm the chosen one` : "";
  return `${job.progress.runs_done}/${job.progress.runs_total} (${plural(seeds)} per setting${confirm})`;
}

export const ACTIVE = new Set(["pending", "running"]);

export async function cancel(id) {
  try {
    await api(`/v1/jobs/${encodeURIComponent(id)}/cancel`, { method: "POST" });
  } catch (exc) {
    report(exc);
  }
}

export function jobsView() {
  view.append($("#tpl-jobs").content.cloneNode(true));
  // held from the start: a refresh in flight when the view is left updates these, detached
  const body = $("#jobs-table tbody");
  const empty = $("#jobs-empty");
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
    empty.hidden = jobs.total > 0;
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
