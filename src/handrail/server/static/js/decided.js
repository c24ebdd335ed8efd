// "Decided by you": the cards the viewer decided (or approved), newest first, read from the
// server (GET /me/decided: the viewer's own decisions in the organisation's audit trail, so
// the same on every device), each with what came of it, read back from
// GET /sessions/{id}/calls/{call_id} until nothing changes.
import { api, path } from "./api.js";
import { outcomeText } from "./cards.js";
import { $, el, when } from "./dom.js";
import { page } from "./state.js";

const KEPT = 20; // the most recent calls listed
const READ = 50; // decisions read for them (a call approved twice is listed once)
const EVERY = 4000; // ms between reads of the list and of the outcomes still open
const BATCH = "handrail.apply"; // the tool of a batch card
let last = 0;
let reading = false;
let items = []; // the calls listed, newest decision first
let outcomes = new Map(); // session and call -> { text, done, actions }

const keyOf = (i) => `${i.session_id}\n${i.tool_call_id}`;

/** The viewer just decided: read the list again now, not at the next round. */
export function decidedNow() {
  last = 0;
  refreshDecided();
}

/** Draw the list; read it again, and what came of the decisions not settled yet. */
export async function refreshDecided() {
  if (!page.me) return;
  draw();
  if (reading || Date.now() - last < EVERY) return;
  reading = true;
  last = Date.now();
  const me = page.me;
  try {
    const found = await api("GET", `/me/decided?limit=${READ}`);
    if (page.me !== me) return; // signed out (or in as another) meanwhile
    const seen = new Set();
    items = found.decisions.filter((d) => !seen.has(keyOf(d)) && seen.add(keyOf(d))).slice(0, KEPT);
    for (const item of items) {
      const known = outcomes.get(keyOf(item));
      if (known && known.done) continue;
      let next;
      try {
        const outcome = await api("GET", path`/sessions/${item.session_id}/calls/${item.tool_call_id}`);
        const actions = outcome.output && outcome.output.actions;
        next = { text: outcomeText(outcome), done: outcome.done, actions: actions ? actions.length : null };
      } catch (error) {
        if (error.status !== 404) continue; // read again next time
        next = { text: "What came of it can no longer be read (the session is gone).", done: true };
      }
      if (page.me !== me) return;
      outcomes.set(keyOf(item), next);
    }
  } catch {
    // the list is read again next time; what is drawn stays
  } finally {
    reading = false;
  }
  draw();
}

export function clearDecided() {
  items = [];
  outcomes = new Map();
  last = 0;
  $("decided").hidden = true;
  $("decided-list").replaceChildren();
}

function toolName(item, outcome) {
  if (item.tool !== BATCH) return item.tool;
  return outcome && outcome.actions ? `${outcome.actions} actions` : "a batch of actions";
}

function draw() {
  $("decided").hidden = items.length === 0;
  const comma = () => el("span", { class: "visually-hidden", text: ", " });
  $("decided-list").replaceChildren(
    ...items.map((i) => {
      const outcome = outcomes.get(keyOf(i));
      const whose = !i.owner ? "a session since deleted" : i.owner === page.me.user_id ? "your session" : `${i.owner}'s session`;
      return el(
        "li",
        { class: `decided-item${outcome && outcome.done ? "" : " open"}`, "data-session": i.session_id, "data-call": i.tool_call_id },
        el("span", { class: "decided-tool", text: toolName(i, outcome) }),
        comma(),
        el("span", { class: "decided-whose", text: whose }),
        comma(),
        el("span", { class: "decided-outcome", text: outcome ? outcome.text : "Decided; what came of it is read next…" }),
        comma(),
        el("span", { class: "when", text: when(i.at) }),
      );
    }),
  );
}
