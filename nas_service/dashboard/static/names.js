// The catalogue (GET /v1/catalogue) the views read, and what it says about names: each
// metric's unit, the architecture fields each residual variant takes, and how a variant's
// label is written (`block_attnres/S=4`: the codec's parts, as the service describes them).

export let catalogue = null;

export function setCatalogue(value) {
  catalogue = value;
}

export function unitOf(metric) {
  return catalogue && catalogue.metrics[metric] ? catalogue.metrics[metric].unit : "";
}

export function units() {
  const out = {};
  for (const [name, info] of Object.entries(catalogue ? catalogue.metrics : {})) out[name] = info.unit;
  return out;
}

function partsOf(variant) {
  return catalogue.residual_codec.parts.filter((p) => p.variants.includes(variant));
}

/** The label of `variant` with the values of its parts (by field). */
function labelOf(variant, values) {
  const { separator, assign } = catalogue.residual_codec;
  return [variant, ...partsOf(variant).map((p) => `${p.tag}${assign}${values[p.field]}`)].join(separator);
}

/** Every label a job's spec searches: each variant with each combination of its parts' values
 * (a variant with parts but no values listed has none). */
export function residualLabels(spec) {
  const out = [];
  for (const v of spec.space.variants) {
    let combos = [{}];
    for (const p of partsOf(v)) {
      combos = combos.flatMap((c) => (spec.space[p.space_field] || []).map((x) => ({ ...c, [p.field]: x })));
    }
    for (const c of combos) out.push(labelOf(v, c));
  }
  return out;
}

/** A trial's label: its variant, with its parts where its architecture sets them. */
export function label(t) {
  const arch = t.arch || {};
  const parts = partsOf(t.variant);
  return parts.length && parts.every((p) => arch[p.field]) ? labelOf(t.variant, arch) : t.variant;
}

export function fitLabel(fit, cols) {
  const labels = new Set(cols.variant);
  if (labels.has(fit.variant)) return fit.variant;
  const prefix = `${fit.variant}${catalogue.residual_codec.separator}`;
  const match = [...labels].find((l) => l.startsWith(prefix));
  return match || fit.variant;
}

/** `arch` for `variant`: without the fields only other variants take. */
export function archFor(variant, arch) {
  const out = { ...arch, variant };
  const own = catalogue.variant_fields[variant] || [];
  for (const fields of Object.values(catalogue.variant_fields)) {
    for (const f of fields) if (!own.includes(f)) delete out[f];
  }
  return out;
}
