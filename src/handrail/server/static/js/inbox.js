// "To decide": the cards of the organisation the caller may decide (GET /pending), a line
// each; read again every few seconds, and a new one is announced.
import { api } from "./api.js";
import { $, el, when } from "./dom.js";
import { select } from "./sessions.js";
import { announce, page } from "./state.js";

const EVERY = 5000; // ms between reads of the inbox while the page is open
let known = null; // the ids of the cards listed (null: none read yet)
let timer = null;

/** The inbox: the cards of the organisation the caller may decide, a line each. */
export async function loadInbox() {
  const { cards } = await api("GET", "/pending?limit=100");
  page.inbox = cards;
  const list = $("inbox-list");
  const focused = list.contains(document.activeElement) ? document.activeElement.dataset.call : null;
  list.replaceChildren(...cards.map(line));
  if (!cards.length) list.append(el("li", { class: "none", text: "Nothing waits for you." }));
  if (focused) list.querySelector(`[data-call="${CSS.escape(focused)}"]`)?.focus();
  const ids = new Set(cards.map((c) => c.tool_call_id));
  if (known !== null) {
    const fresh = cards.filter((c) => !known.has(c.tool_call_id) && c.session_id !== page.sessionId);
    if (fresh.length === 1) announce(`New in To decide: ${title(fresh[0])}, from ${fresh[0].requester || "?"}.`);
    else if (fresh.length) announce(`${fresh.length} new cards in To decide.`);
  }
  known = ids;
  $("inbox-count").textContent = cards.length ? `(${cards.length})` : "";
}

const title = (c) => (c.kind === "batch" ? `${c.args.actions.length} actions` : c.tool);

function line(c) {
  const approved = (c.approved_by || []).length;
  const changed = Object.keys(c.changes || {}).length > 0;
  // The spans lay the line out for the eye; the hidden commas make it one phrase to a screen
  // reader ("pay, from ana, 1 approved, ...").
  const comma = () => el("span", { class: "visually-hidden", text: ", " });
  return el(
    "li",
    {},
    el(
      "button",
      {
        type: "button",
        class: "inbox-card",
        "data-session": c.session_id,
        "data-call": c.tool_call_id,
        "aria-current": c.session_id === page.sessionId ? "true" : undefined,
        onclick: () => select(c.session_id),
      },
      el("span", { class: "inbox-tool", text: title(c) }),
      comma(),
      el("span", { class: "inbox-who", text: `from ${c.requester || "?"}` }),
      changed ? [comma(), el("span", { class: "badge changed", text: "changed" })] : null,
      approved ? [comma(), el("span", { class: "badge", text: `${approved} approved` })] : null,
      c.created_at ? [comma(), el("span", { class: "when", text: when(c.created_at) })] : null,
    ),
  );
}

/** Read the inbox every few seconds while the page is visible. */
export function watchInbox() {
  clearInterval(timer);
  timer = setInterval(() => {
    if (page.key && document.visibilityState === "visible") loadInbox().catch(() => {});
  }, EVERY);
}

export function stopWatchingInbox() {
  clearInterval(timer);
  known = null;
}
