// The sessions: the caller's own, each by its title, and the one open (in the URL, so a
// reload or a shared link opens it again); a message starts a turn.
import { api, path } from "./api.js";
import { hideAudit } from "./audit.js";
import { approvedByMe, clearOutcomes, renderCards, showOutcomes } from "./cards.js";
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
      $("composer").hidden = false;
      $("not-yours").hidden = true;
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
  const theirs = Boolean(session.user_id && page.me && session.user_id !== page.me.user_id);
  $("chat-title").textContent = theirs ? `${titleOf(session)} (${session.user_id}'s)` : titleOf(session);
  // Only its owner writes to a session's agent (the server refuses anyone else's message).
  $("composer").hidden = theirs;
  $("not-yours").hidden = !theirs;
  $("not-yours").textContent = theirs ? `${session.user_id}'s conversation; you can decide its cards, not write in it.` : "";
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
    say(waitingText(session.pending));
    if (focus) ($("cards").querySelector(".card:not(.approved-by-me)") || $("cards").querySelector(".card")).focus();
    watch(sessionId, session);
  } else if (focus && !page.stream && !theirs) {
    $("composer-text").focus();
  }
}

/** What the session's cards wait for, as the viewer reads it: them, or others they approved. */
function waitingText(pending) {
  const yours = pending.filter((c) => !approvedByMe(c)).length;
  const others = pending.length - yours;
  const calls = (n) => (n === 1 ? "A call waits" : `${n} calls wait`);
  const parts = [];
  if (yours) parts.push(`${calls(yours)} for your decision.`);
  if (others) parts.push(`${yours ? `${others} you approved` : `You approved ${others === 1 ? "the call" : `${others} calls`}`}: ${others === 1 ? "it waits" : "they wait"} for another approver.`);
  return parts.join(" ");
}

const WATCH = 3000; // ms between reads of a session whose cards wait, while it is shown

/** What the session's cards stand on: a read that differs means someone decided meanwhile. */
const standing = (session) =>
  JSON.stringify([session.status, session.running, session.messages.length, session.pending.map((c) => [c.tool_call_id, c.digest, c.approved_by])]);

/**
 * While a session's cards wait, read it again every few seconds: another approver's approval
 * or amendment, the turn resuming, show here as they happen. A colleague's session that is no
 * longer theirs to read (decided by others) shows what came of the cards they approved.
 */
function watch(sessionId, shown) {
  clearTimeout(page.poll);
  page.poll = setTimeout(async () => {
    if (page.sessionId !== sessionId || page.stream) return;
    if (document.visibilityState !== "visible") return watch(sessionId, shown);
    let session;
    try {
      session = await api("GET", path`/sessions/${sessionId}`);
    } catch (error) {
      if (page.sessionId !== sessionId) return;
      if (error.status === 404 && !page.mine.has(sessionId)) {
        const approved = shown.pending.filter(approvedByMe);
        page.session.pending = [];
        renderCards([]);
        say(approved.length ? "Decided by the other approvers; the turn resumes in the background." : "Decided by someone else.");
        if (approved.length) showOutcomes(sessionId, approved);
        loadInbox().catch(() => {});
        return;
      }
      return watch(sessionId, shown);
    }
    if (page.sessionId !== sessionId || page.stream) return;
    if (standing(session) === standing(shown)) return watch(sessionId, shown);
    await openSession(sessionId);
  }, WATCH);
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
