// The server's API: every request carries the key; every error is an ApiError with the
// server's own words.
import { page } from "./state.js";

export class ApiError extends Error {
  constructor(status, type, message) {
    super(message);
    this.status = status;
    this.type = type;
  }
}

let unauthorized = () => {};

/** What to do when the key is refused (401) on a request after sign-in. */
export function onUnauthorized(handler) {
  unauthorized = handler;
}

export const path = (strings, ...values) =>
  strings.reduce((out, s, i) => out + s + (i < values.length ? encodeURIComponent(values[i]) : ""), "");

export async function api(method, url, body) {
  const init = { method, headers: { Authorization: `Bearer ${page.key}` } };
  if (body !== undefined) {
    init.headers["Content-Type"] = "application/json";
    init.body = JSON.stringify(body);
  }
  let response;
  try {
    response = await fetch(url, init);
  } catch (error) {
    throw new ApiError(0, "network", `The server cannot be reached (${error.message}).`);
  }
  if (response.status === 204) return null;
  const text = await response.text();
  let data = null;
  try {
    data = text ? JSON.parse(text) : null;
  } catch {
    data = null;
  }
  if (!response.ok) {
    const error = (data && data.error) || {};
    if (response.status === 401 && url !== "/me") unauthorized("Your API key was refused.");
    throw new ApiError(
      response.status,
      error.type || `http_${response.status}`,
      error.message || `The server answered ${response.status}.`,
    );
  }
  return data;
}
