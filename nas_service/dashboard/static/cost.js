// The cost view (#/cost): an architecture priced by the cost model, every chosen variant side
// by side (POST /v1/cost), each refusal next to the input it names.

import { api, ApiError } from "./api.js";
import { $, el, report, view } from "./dom.js";
import { human } from "./format.js";
import { archFor, catalogue } from "./names.js";

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

export function costView() {
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
      const arch = archFor(variant, request.arch);
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
