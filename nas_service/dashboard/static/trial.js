// One trial's detail in the job view: its cost breakdown and measured loss, its architecture
// and its training.

import { el } from "./dom.js";
import { fixed, human } from "./format.js";
import { catalogue, unitOf } from "./names.js";

/** The nodes of trial `t`'s detail (GET /v1/jobs/<id>/trials/<n>). */
export function trialDetail(t) {
  const rows = Object.entries(t.metrics).sort(([a], [b]) => a.localeCompare(b));
  const arch = Object.entries(t.arch || {}).filter(([, v]) => v !== null);
  return [
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
      el("dt", {}, "outcome"), el("dd", {}, `${t.outcome}${t.reason ? `: ${t.reason}` : ""}`)),
  ];
}
