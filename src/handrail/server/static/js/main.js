// The handrail web page: sign in with an API key, chat with the engine, decide its cards,
// read the audit trail.
//
// Everything the page shows about a session comes from the server: the conversation and the
// pending cards from GET /sessions/{id} (so a reload shows the same cards), the live turn from
// its event stream (stream.js). The modules follow what the page shows: sessions.js (the
// list, the open session), conversation.js, cards.js, inbox.js ("To decide"), audit.js; and
// what they share: api.js, dom.js, state.js, forms.js.
import { api, onUnauthorized } from "./api.js";
import { setUpAudit, showAudit } from "./audit.js";
import { approveAll } from "./cards.js";
import { clearDecided } from "./decided.js";
import { $ } from "./dom.js";
import { loadInbox, stopWatchingInbox, watchInbox } from "./inbox.js";
import { listSessions, loadDomain, newSession, openSession, send } from "./sessions.js";
import { KEY, page, say } from "./state.js";
import { stopStream } from "./stream.js";

function signOut(why) {
  stopStream();
  stopWatchingInbox();
  clearDecided();
  localStorage.removeItem(KEY);
  page.key = null;
  page.me = null;
  page.sessionId = null;
  showSignIn(why || "");
}

function showSignIn(error) {
  $("app").hidden = true;
  $("sign-out").hidden = true;
  $("show-audit").hidden = true;
  $("sign-in").hidden = false;
  $("sign-in-error").textContent = error;
  $("api-key").focus();
}

async function signIn(key) {
  page.key = key;
  try {
    page.me = await api("GET", "/me");
    await listSessions();
    await loadDomain();
    await loadInbox();
  } catch (error) {
    page.key = null;
    page.me = null;
    const why = error.status === 401 ? "That API key was not accepted (401)." : error.message;
    showSignIn(why);
    return false;
  }
  localStorage.setItem(KEY, key);
  $("sign-in").hidden = true;
  $("app").hidden = false;
  $("sign-out").hidden = false;
  $("who").textContent = `Signed in as ${page.me.user_id}`;
  $("show-audit").hidden = !page.me.audit;
  watchInbox();
  return true;
}

function hashParams() {
  return new URLSearchParams(location.hash.replace(/^#/, ""));
}

async function start() {
  onUnauthorized(signOut);
  $("sign-in-form").addEventListener("submit", async (e) => {
    e.preventDefault();
    const key = $("api-key").value.trim();
    if (!key) {
      $("sign-in-error").textContent = "Enter an API key.";
      $("api-key").focus();
      return;
    }
    if (await signIn(key)) {
      $("api-key").value = "";
      $("composer-text").focus();
    }
  });
  $("sign-out").addEventListener("click", () => signOut(""));
  $("new-session").addEventListener("click", newSession);
  $("refresh-inbox").addEventListener("click", () => loadInbox().catch((error) => say(error.message, true)));
  $("composer").addEventListener("submit", send);
  $("composer-text").addEventListener("keydown", (e) => {
    if (e.key === "Enter" && !e.shiftKey && !e.isComposing) {
      e.preventDefault();
      if (!$("send").disabled) $("composer").requestSubmit();
    }
  });
  $("approve-all").addEventListener("click", approveAll);
  $("pending").tabIndex = -1;
  setUpAudit();

  const params = hashParams();
  const key = params.get("key");
  if (key) {
    // A printed URL (#key=...): sign in with it, and take it out of the address bar.
    page.key = key;
    params.delete("key");
    history.replaceState(null, "", params.toString() ? `#${params}` : location.pathname);
  }
  if (!page.key) {
    showSignIn("");
    return;
  }
  if (!(await signIn(page.key))) return;
  if (hashParams().has("audit") && page.me.audit) {
    await showAudit();
    return;
  }
  const sessionId = hashParams().get("session");
  if (sessionId) await openSession(sessionId, { focus: true, resume: true });
}

start();
