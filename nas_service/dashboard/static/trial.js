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
      ...(t.confirm
        ? [el("dt", {}, "scored on"), el("dd", {}, `held-out confirmation seeds ${t.confirm.seeds.join(", ")} `
            + "(the setting was chosen on the tuning seeds)")]
        : []),
      el("dt", {}, "seeds' losses"), el("dd", {}, losses(t.seeds) || "–"),
      el("dt", {}, "runs"), el("dd", {}, String(t.train.length)),
      el("dt", {}, "outcome"), el("dd", {}, `${t.outcome}${t.reason ? `: ${t.reason}` : ""}`)),
    ...runTable(t),
  ];
}

function losses(values) {
  return values.map((s) => (s === null ? "–" : fixed(s))).join(", ");
}

/** Every run the trial trained: its phase (tuning or confirmation), seed, setting, status and
 * final loss, in the order run. */
function runTable(t) {
  if (!t.train.length) return [];
  const confirmation = new Set(t.confirm ? t.confirm.seeds : []);
  const head = ["phase", "seed", "setting", "status", "final loss"];
  return [
    el("table", { class: "grid", id: "trial-runs" },
      el("thead", {}, el("tr", {}, ...head.map((h) => el("th", {}, h)))),
      el("tbody", {}, ...t.train.map((r) => el("tr", {},
        el("td", {}, confirmation.has(r.seed) ? "confirmation" : "tuning"),
        el("td", { class: "num" }, r.seed === null ? "–" : String(r.seed)),
        el("td", {}, r.setting ? Object.entries(r.setting).map(([k, v]) => `${k}=${v}`).join(" ") : "–"),
        el("td", {}, r.status || "–"),
        el("td", { class: "num" }, r.final_val_loss === null ? "–" : fixed(r.final_val_loss)))))),
  ];
}
