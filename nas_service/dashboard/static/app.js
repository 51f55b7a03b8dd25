// depthscope's dashboard: the token prompt and the routing between the views (#/jobs: jobs.js,
// #/job/<id>: job.js, #/cost: cost.js), each reading the API (api.js) and polling it while a
// job is active, no reload; the catalogue they read is names.js's. Plain ES modules, no build
// step.

import { api, getToken, onUnauthorised, setToken } from "./api.js";
import { disposeAll } from "./charts.js";
import { costView } from "./cost.js";
import { $, banner, report, view } from "./dom.js";
import { jobView } from "./job.js";
import { jobsView } from "./jobs.js";
import { catalogue, setCatalogue } from "./names.js";

let current = null; // the view shown: { stop() }

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
  setCatalogue(null);
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
    if (!catalogue) setCatalogue(await api("/v1/catalogue"));
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

route();
