// "Decided by you": the cards the viewer decided (or approved) from this browser, each with
// what came of it, read back from GET /sessions/{id}/calls/{call_id} until nothing changes.
//
// Kept in this browser (localStorage, per organisation and user), not read from the server:
// the audit trail, where every decision is, can be filtered by session, tool and kind but not
// by who decided, so one person's decisions could only be found there by reading the
// organisation's whole trail.
import { api, path } from "./api.js";
import { outcomeText } from "./cards.js";
import { $, el, when } from "./dom.js";
import { page } from "./state.js";

const KEPT = 20; // the most recent decisions listed
const EVERY = 4000; // ms between reads of the outcomes still open
let last = 0;
let reading = false;

const storeKey = () => `handrail:decided:${page.me.org_id || ""}:${page.me.user_id}`;

function read() {
  try {
    const items = JSON.parse(localStorage.getItem(storeKey()) || "[]");
    return Array.isArray(items) ? items : [];
  } catch {
    return [];
  }
}

function write(items) {
  localStorage.setItem(storeKey(), JSON.stringify(items.slice(0, KEPT)));
}

/** Keep the cards just decided on `sessionId` (whose owner is `owner`), newest first. */
export function recordDecided(sessionId, owner, cards) {
  if (!page.me || !cards.length) return;
  const same = (i) => i.session_id === sessionId && cards.some((c) => c.tool_call_id === i.tool_call_id);
  const at = Date.now() / 1000;
  const fresh = cards.map((c) => ({
    session_id: sessionId,
    tool_call_id: c.tool_call_id,
    tool_name: c.kind === "batch" ? `${((c.current_args || c.args).actions || []).length} actions` : c.tool_name,
    owner: owner || page.me.user_id,
    at,
    text: "Decided; what came of it is read next…",
    done: false,
  }));
  write([...fresh, ...read().filter((i) => !same(i))]);
  last = 0;
  refreshDecided();
}

/** Draw the list, and read again what came of the decisions not settled yet. */
export async function refreshDecided() {
  if (!page.me) return;
  draw(read());
  if (reading || Date.now() - last < EVERY) return;
  reading = true;
  last = Date.now();
  try {
    for (const item of read().filter((i) => !i.done)) {
      let text;
      let done = false;
      try {
        const outcome = await api("GET", path`/sessions/${item.session_id}/calls/${item.tool_call_id}`);
        text = outcomeText(outcome);
        done = outcome.done;
      } catch (error) {
        if (error.status !== 404) continue; // read again next time
        text = "What came of it can no longer be read (the session is gone).";
        done = true;
      }
      write(read().map((i) => (i.session_id === item.session_id && i.tool_call_id === item.tool_call_id ? { ...i, text, done } : i)));
    }
  } finally {
    reading = false;
  }
  draw(read());
}

export function clearDecided() {
  $("decided").hidden = true;
  $("decided-list").replaceChildren();
}

function draw(items) {
  $("decided").hidden = items.length === 0;
  const comma = () => el("span", { class: "visually-hidden", text: ", " });
  $("decided-list").replaceChildren(
    ...items.map((i) =>
      el(
        "li",
        { class: `decided-item${i.done ? "" : " open"}`, "data-session": i.session_id, "data-call": i.tool_call_id },
        el("span", { class: "decided-tool", text: i.tool_name }),
        comma(),
        el("span", { class: "decided-whose", text: i.owner === page.me.user_id ? "your session" : `${i.owner}'s session` }),
        comma(),
        el("span", { class: "decided-outcome", text: i.text }),
        comma(),
        el("span", { class: "when", text: when(i.at) }),
      ),
    ),
  );
}
