// The sessions: the caller's own, each by its title, and the one open (in the URL, so a
// reload or a shared link opens it again); a message starts a turn.
import { api, path } from "./api.js";
import { hideAudit } from "./audit.js";
import { clearOutcomes, renderCards } from "./cards.js";
import { renderSession, userBubble } from "./conversation.js";
import { $, el, when } from "./dom.js";
import { loadInbox } from "./inbox.js";
import { page, say, setBusy } from "./state.js";
import { afterKey, follow, liveKey, restoreLive, stopStream } from "./stream.js";

export async function loadDomain() {
  const domain = await api("GET", "/domain");
  page.domain = {
    agents: Object.fromEntries(domain.agents.map((a) => [a.name, a])),
    tools: Object.fromEntries(domain.tools.map((t) => [t.name, t])),
  };
}

/** A session's name for people: its title (its first message), else its id. */
export const titleOf = (session) => session.title || session.id;

export async function listSessions() {
  const { sessions } = await api("GET", "/sessions");
  page.mine = new Set(sessions.map((s) => s.id));
  const list = $("session-list");
  list.replaceChildren(
    ...sessions.map((s) => {
      const current = s.id === page.sessionId;
      return el(
        "li",
        {},
        el(
          "button",
          {
            type: "button",
            class: "session",
            "data-session": s.id,
            title: s.id,
            "aria-current": current ? "true" : undefined,
            onclick: () => select(s.id),
          },
          el("span", { class: `session-title${s.title ? "" : " untitled"}`, text: s.title || "New session" }),
          el("span", { class: `badge ${s.status}`, text: s.running ? "running" : s.status }),
          el("span", { class: "when", text: when(s.updated_at) }),
        ),
      );
    }),
  );
  if (!sessions.length) list.append(el("li", { class: "none", text: "No sessions yet." }));
}

export async function select(sessionId) {
  stopStream();
  clearOutcomes();
  history.replaceState(null, "", `#session=${encodeURIComponent(sessionId)}`);
  await openSession(sessionId, { focus: true, resume: true });
}

/** Show a session from the store; resume its stream if this tab was following it. */
export async function openSession(sessionId, { focus = false, resume = false } = {}) {
  hideAudit();
  let session;
  try {
    session = await api("GET", path`/sessions/${sessionId}`);
  } catch (error) {
    if (error.status === 404) {
      history.replaceState(null, "", "#");
      loadInbox().catch(() => {});
      page.sessionId = null;
      page.session = null;
      $("transcript").replaceChildren();
      renderCards([]);
      $("chat-title").textContent = "";
      $("empty").hidden = false;
      say("That session does not exist (or is not yours).", true);
      await listSessions().catch(() => {});
      return;
    }
    say(error.message, true);
    return;
  }
  page.sessionId = sessionId;
  page.session = session;
  $("chat-title").textContent = session.user_id && page.me && session.user_id !== page.me.user_id
    ? `${titleOf(session)} (${session.user_id}'s)`
    : titleOf(session);
  renderSession(session);
  listSessions().catch(() => {});
  loadInbox().catch(() => {});
  const after = sessionStorage.getItem(afterKey(sessionId));
  if (resume && after !== null) {
    if (session.running) {
      restoreLive(sessionId);
      follow(sessionId, Number(after));
      return;
    }
    // The turn ended while nobody watched: the store has all of it.
    sessionStorage.removeItem(afterKey(sessionId));
    sessionStorage.removeItem(liveKey(sessionId));
  }
  if (session.running && !page.stream) {
    // A turn runs, started elsewhere: show it once it has ended (or suspended).
    setBusy(true);
    say("A turn of this session is running elsewhere…");
    page.poll = setTimeout(() => page.sessionId === sessionId && openSession(sessionId, { focus }), 1000);
    return;
  }
  if (!page.stream) setBusy(false);
  if (session.pending.length) {
    say(`${session.pending.length === 1 ? "A call waits" : `${session.pending.length} calls wait`} for your decision.`);
    if (focus) $("cards").querySelector(".card").focus();
  } else if (focus && !page.stream) {
    $("composer-text").focus();
  }
}

export async function newSession() {
  try {
    const session = await api("POST", "/sessions");
    await select(session.id);
  } catch (error) {
    say(error.message, true);
  }
}

export async function send(event) {
  event.preventDefault();
  const box = $("composer-text");
  const text = box.value.trim();
  if (!text) {
    say("Write a message first.", true);
    box.focus();
    return;
  }
  try {
    if (!page.sessionId) {
      const session = await api("POST", "/sessions");
      history.replaceState(null, "", `#session=${encodeURIComponent(session.id)}`);
      page.sessionId = session.id;
      page.session = session;
    }
    const sessionId = page.sessionId;
    setBusy(true);
    const turn = await api("POST", `${path`/sessions/${sessionId}`}/turns`, { text });
    box.value = "";
    $("empty").hidden = true;
    userBubble({ id: `pending-${Date.now()}`, parts: [{ type: "text", text }] }, "You");
    say("The agent is working…");
    listSessions().catch(() => {});
    follow(sessionId, turn.after);
  } catch (error) {
    setBusy(false);
    say(`${error.message}${error.status ? ` (${error.status})` : ""}`, true);
  }
}
