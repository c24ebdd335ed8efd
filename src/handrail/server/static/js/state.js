// What the page holds between requests, and the page-wide status line.
import { $ } from "./dom.js";

export const KEY = "handrail:key";

export const page = {
  key: localStorage.getItem(KEY),
  me: null, // GET /me: {org_id, user_id, roles, audit}
  sessionId: null,
  domain: null, // {agents: {name: agent}, tools: {name: tool}}
  session: null, // the last GET /sessions/{id}
  history: { first: 0, messages: [] }, // the messages drawn, from position `first` on
  applied: new Map(), // call id -> its action as an applied batch reports it
  mine: new Set(), // the caller's own sessions (its list): the others it only decides
  inbox: [], // the cards the caller may decide (GET /pending)
  stream: null, // the AbortController of the open event stream
  poll: null,
};

/** The status line (a `role="status"` region): what the page is doing, or what went wrong. */
export function say(text, error = false) {
  const status = $("status");
  status.textContent = text;
  status.classList.toggle("error", error);
}

/** Tell a screen reader something new that is not where its focus is (a new card). */
export function announce(text) {
  const region = $("announce");
  // Emptied first, so the same words said twice are announced twice.
  region.textContent = "";
  setTimeout(() => (region.textContent = text), 50);
}

export function setBusy(busy) {
  const waiting = Boolean(page.session && page.session.pending.length);
  $("send").disabled = busy || waiting;
  $("composer-text").setAttribute("aria-disabled", String(busy || waiting));
  $("transcript").setAttribute("aria-busy", String(busy));
}

export function scrollDown() {
  const last = $("transcript").lastElementChild;
  if (last && !$("pending").contains(document.activeElement)) last.scrollIntoView({ block: "nearest" });
}
