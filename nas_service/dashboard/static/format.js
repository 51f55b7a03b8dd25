// Numbers in human units: bytes as kB/MB/GB (decimal, 1 MB = 10^6 bytes), FLOPs as
// kFLOP…PFLOP, seconds as µs/ms/s, parameter counts as k/M/B. Every axis a chart draws is
// scaled to one such unit and labelled with it.

const SCALES = {
  bytes: [[1e12, "TB"], [1e9, "GB"], [1e6, "MB"], [1e3, "kB"], [1, "B"]],
  FLOPs: [[1e15, "PFLOP"], [1e12, "TFLOP"], [1e9, "GFLOP"], [1e6, "MFLOP"], [1e3, "kFLOP"], [1, "FLOP"]],
  parameters: [[1e9, "B params"], [1e6, "M params"], [1e3, "k params"], [1, "params"]],
  seconds: [[1, "s"], [1e-3, "ms"], [1e-6, "µs"], [1e-9, "ns"]],
  tokens: [[1e9, "B tokens"], [1e6, "M tokens"], [1e3, "k tokens"], [1, "tokens"]],
};

const ENTITIES = { "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" };

/** `value` as text safe inside HTML (an element's content or a quoted attribute): every
 * string a chart's tooltip builds from data (a variant, a metric, a unit, a label) goes
 * through this, so planted markup shows as text and never runs, CSP or not. */
export function escapeHtml(value) {
  return String(value).replace(/[&<>"']/g, (c) => ENTITIES[c]);
}

/** The scale [factor, label] of `unit` that shows `magnitude` as 1 to 999. */
export function scaleFor(unit, magnitude) {
  const table = SCALES[unit];
  if (!table) return [1, unit || ""];
  const m = Math.abs(magnitude || 0);
  for (const [factor, label] of table) if (m >= factor) return [factor, label];
  return table[table.length - 1];
}

/** `value` in `unit` as text with its own scale: 1.23 GB, 45.6 GFLOP, 12.3 ms. */
export function human(value, unit) {
  if (value === null || value === undefined || Number.isNaN(value)) return "–";
  if (typeof value !== "number") return String(value);
  if (!SCALES[unit]) return fixed(value) + (unit && unit !== "loss" ? ` ${unit}` : "");
  const [factor, label] = scaleFor(unit, value);
  return `${fixed(value / factor, 3)} ${label}`;
}

/** `digits` significant digits (by default four below 10, as losses read, else three), no
 * exponent between 10^-3 and 10^6. */
export function fixed(x, digits) {
  if (x === 0) return "0";
  const a = Math.abs(x);
  if (a >= 1e6 || a < 1e-3) return x.toExponential(2);
  return Number(x.toPrecision(digits || (a < 10 ? 4 : 3))).toString();
}

/** A duration to the second below an hour, to the minute above: rounded once, so that
 * 119.6 s reads "2 min 0 s", never "1 min 60 s". */
export function duration(seconds) {
  if (seconds === null || seconds === undefined) return "–";
  const s = Math.round(seconds);
  if (s < 60) return `${s} s`;
  if (s < 3600) return `${Math.floor(s / 60)} min ${s % 60} s`;
  const m = Math.round(seconds / 60);
  return `${Math.floor(m / 60)} h ${m % 60} min`;
}

/** A compute budget: FLOPs or tokens. */
export function compute(value, kind) {
  return human(value, kind === "tokens" ? "tokens" : "FLOPs");
}
