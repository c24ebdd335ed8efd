// "To decide": the cards of the organisation the caller may decide (GET /pending), a line
// each; read again every few seconds, and a new one is announced.
import { api } from "./api.js";
import { $, el, when } from "./dom.js";
import { refreshDecided } from "./decided.js";
import { select } from "./sessions.js";
import { announce, page } from "./state.js";

const EVERY = 5000; // ms between reads of the inbox while the page is open
let known = null; // the ids of the cards listed (null: none read yet)
let timer = null;

/** The inbox: the cards of the organisation the caller may decide, a line each. */
export async function loadInbox() {
  const { cards } = await api("GET", "/pending?limit=100");
  page.inbox = cards;
  // A card the viewer approved already waits for someone else: it is not theirs to decide.
  const mine = cards.filter((c) => !approvedByMe(c));
  const others = cards.filter(approvedByMe);
  const list = $("inbox-list");
  const waiting = $("waiting-list");
  const focus = document.activeElement;
  const focused = list.contains(focus) || waiting.contains(focus) ? focus.dataset.call : null;
  list.replaceChildren(...mine.map(line));
  if (!mine.length) list.append(el("li", { class: "none", text: "Nothing waits for you." }));
  waiting.replaceChildren(...others.map(line));
  $("inbox-waiting").hidden = others.length === 0;
  $("waiting-summary").textContent = `Waiting for others (${others.length})`;
  if (focused) document.querySelector(`#inbox [data-call="${CSS.escape(focused)}"]`)?.focus();
  const ids = new Set(mine.map((c) => c.tool_call_id));
  if (known !== null) {
    const fresh = mine.filter((c) => !known.has(c.tool_call_id) && c.session_id !== page.sessionId);
    if (fresh.length === 1) announce(`New in To decide: ${title(fresh[0])}, from ${fresh[0].requester || "?"}.`);
    else if (fresh.length) announce(`${fresh.length} new cards in To decide.`);
  }
  known = ids;
  $("inbox-count").textContent = mine.length ? `(${mine.length})` : "";
  refreshDecided().catch(() => {});
}

/** The viewer approved this card's current arguments already (see cards.js). */
export const approvedByMe = (c) => Boolean(page.me) && c.kind !== "batch" && (c.approved_by || []).includes(page.me.user_id);

/** How many approvals a card's tool needs (1 unless its decision policy says more). */
function needed(c) {
  const tool = page.domain && page.domain.tools[c.tool];
  return (tool && tool.decision_policy && tool.decision_policy.approvals) || 1;
}

const title = (c) => (c.kind === "batch" ? `${c.args.actions.length} actions` : c.tool);

function line(c) {
  const approved = (c.approved_by || []).length;
  const changed = Object.keys(c.changes || {}).length > 0;
  // The spans lay the line out for the eye; the hidden commas make it one phrase to a screen
  // reader ("pay, from ana, proposed by desk, 1 approved, ...").
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
      c.agent ? [comma(), el("span", { class: "inbox-agent", text: `proposed by ${c.agent}` })] : null,
      changed ? [comma(), el("span", { class: "badge changed", text: "changed" })] : null,
      approvedByMe(c)
        ? [comma(), el("span", { class: "badge you-approved", text: `you approved · ${approved} of ${needed(c)}` })]
        : approved
          ? [comma(), el("span", { class: "badge", text: `${approved} approved` })]
          : null,
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
