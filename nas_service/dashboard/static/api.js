// The API with the session's token: kept in sessionStorage (this tab, this session), sent
// as the Authorization header, never in a URL. A 401 calls the handler the page installs
// (it asks for the token again).

const KEY = "depthscope.token";

export class ApiError extends Error {
  constructor(status, body) {
    const error = (body && body.error) || {};
    super(error.message || `HTTP ${status}`);
    this.status = status;
    this.field = error.field || null;
    this.errors = error.errors || [];
  }
}

export function getToken() {
  return sessionStorage.getItem(KEY);
}

export function setToken(token) {
  if (token) sessionStorage.setItem(KEY, token);
  else sessionStorage.removeItem(KEY);
}

let unauthorised = () => {};
export function onUnauthorised(handler) {
  unauthorised = handler;
}

export async function api(path, { method = "GET", body } = {}) {
  const headers = { Accept: "application/json" };
  const token = getToken();
  if (token) headers.Authorization = `Bearer ${token}`;
  const init = { method, headers, cache: "no-store" };
  if (body !== undefined) {
    headers["Content-Type"] = "application/json";
    init.body = JSON.stringify(body);
  }
  let response;
  try {
    response = await fetch(path, init);
  } catch (exc) {
    throw new ApiError(0, { error: { message: `the service is unreachable (${exc.message})` } });
  }
  const text = await response.text();
  let data = null;
  try {
    data = text ? JSON.parse(text) : null;
  } catch {
    data = null;
  }
  if (!response.ok) {
    const error = new ApiError(response.status, data);
    if (response.status === 401) unauthorised(error);
    throw error;
  }
  return data;
}

/** A query string of the defined values of `params`. */
export function query(params) {
  const q = new URLSearchParams();
  for (const [k, v] of Object.entries(params)) if (v !== undefined && v !== null && v !== "") q.set(k, v);
  const s = q.toString();
  return s ? `?${s}` : "";
}
