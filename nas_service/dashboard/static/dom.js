// The page's small helpers every view uses: element building, the banner, the poller and
// how an error is reported.

import { ApiError } from "./api.js";

export const POLL_MS = 2000;
export const PAGE = 50;
export const $ = (sel, root = document) => root.querySelector(sel);
export const view = $("#view");

export function el(tag, attrs = {}, ...children) {
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

export function banner(message) {
  const b = $("#banner");
  b.textContent = message || "";
  b.hidden = !message;
}

/** Runs `fn` now and every `ms` while `active()` holds, never two at once; errors go to the
 * banner (a 401 to the token prompt), never to the console. */
export function poller(fn, ms, active) {
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

export function report(exc) {
  if (exc instanceof ApiError && exc.status === 401) return; // the token prompt says it
  banner(exc instanceof ApiError ? `${exc.status}: ${exc.message}` : String(exc && exc.message ? exc.message : exc));
}
