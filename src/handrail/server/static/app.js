// The handrail web page: sign in with an API key, chat with the engine, decide its cards.
//
// Everything the page shows about a session comes from the server: the conversation and the
// pending cards from GET /sessions/{id} (so a reload shows the same cards), the live turn from
// its event stream. The stream is read with fetch (EventSource cannot send the Authorization
// header); the number of the last event seen is kept per session in sessionStorage, so a
// reload mid-stream resumes with ?after= and misses nothing.
"use strict";

const KEY = "handrail:key";
const TERMINAL = new Set(["run-completed", "run-suspended", "run-failed"]);
const $ = (id) => document.getElementById(id);

const page = {
  key: localStorage.getItem(KEY),
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

// -- the API -------------------------------------------------------------------------------

class ApiError extends Error {
  constructor(status, type, message) {
    super(message);
    this.status = status;
    this.type = type;
  }
}

async function api(method, path, body) {
  const init = { method, headers: { Authorization: `Bearer ${page.key}` } };
  if (body !== undefined) {
    init.headers["Content-Type"] = "application/json";
    init.body = JSON.stringify(body);
  }
  let response;
  try {
    response = await fetch(path, init);
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
    if (response.status === 401 && path !== "/sessions") signOut("Your API key was refused.");
    throw new ApiError(
      response.status,
      error.type || `http_${response.status}`,
      error.message || `The server answered ${response.status}.`,
    );
  }
  return data;
}

// -- the event stream ------------------------------------------------------------------------

const afterKey = (sessionId) => `handrail:after:${sessionId}`;
const liveKey = (sessionId) => `handrail:live:${sessionId}`;

/** Read the session's events after `after` until the turn ends (or suspends). */
async function follow(sessionId, after) {
  stopStream();
  const controller = new AbortController();
  page.stream = controller;
  sessionStorage.setItem(afterKey(sessionId), String(after));
  setBusy(true);
  let retries = 0;
  while (!controller.signal.aborted) {
    let ended = false;
    try {
      ended = await readStream(sessionId, controller.signal);
      if (ended) break;
    } catch (error) {
      if (controller.signal.aborted) return;
      if (error instanceof ApiError && error.status >= 400 && error.status < 500) {
        say(error.message, true);
        break;
      }
    }
    // The connection dropped mid-turn: reconnect after the last event seen.
    retries += 1;
    say(`Connection lost; reconnecting (attempt ${retries})…`);
    await sleep(Math.min(250 * 2 ** retries, 4000));
  }
  if (page.stream === controller) page.stream = null;
  if (!controller.signal.aborted) {
    sessionStorage.removeItem(afterKey(sessionId));
    sessionStorage.removeItem(liveKey(sessionId));
    if (page.sessionId === sessionId) await openSession(sessionId, { focus: true });
  }
}

/** One connection: true once the event that ends the turn arrived. */
async function readStream(sessionId, signal) {
  const after = sessionStorage.getItem(afterKey(sessionId)) || "0";
  const response = await fetch(`/sessions/${encodeURIComponent(sessionId)}/events?after=${after}`, {
    headers: { Authorization: `Bearer ${page.key}`, Accept: "text/event-stream" },
    signal,
  });
  if (!response.ok) {
    let message = `The event stream answered ${response.status}.`;
    try {
      message = (await response.json()).error.message;
    } catch {}
    throw new ApiError(response.status, "stream", message);
  }
  if ($("status").textContent.startsWith("Connection lost")) say("Reconnected; the agent is working…");
  const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
  let buffer = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) return false;
    buffer = (buffer + value).replace(/\r\n/g, "\n");
    let end;
    while ((end = buffer.indexOf("\n\n")) >= 0) {
      const frame = parseFrame(buffer.slice(0, end));
      buffer = buffer.slice(end + 2);
      if (frame === null) continue;
      if (page.sessionId === sessionId) apply(frame.event);
      sessionStorage.setItem(afterKey(sessionId), frame.id);
      if (page.sessionId === sessionId) saveLive(sessionId);
      if (TERMINAL.has(frame.event.type)) {
        reader.cancel().catch(() => {});
        return true;
      }
    }
  }
}

/** An SSE frame's id and event (null for a comment, such as a keep-alive ping). */
function parseFrame(text) {
  let id = null;
  const data = [];
  for (const line of text.split("\n")) {
    if (line.startsWith(":")) continue;
    const colon = line.indexOf(":");
    const field = colon < 0 ? line : line.slice(0, colon);
    let value = colon < 0 ? "" : line.slice(colon + 1);
    if (value.startsWith(" ")) value = value.slice(1);
    if (field === "id") id = value;
    else if (field === "data") data.push(value);
  }
  if (!data.length || id === null) return null;
  return { id, event: JSON.parse(data.join("\n")) };
}

function stopStream() {
  if (page.stream) page.stream.abort();
  page.stream = null;
  clearTimeout(page.poll);
}

const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

// -- the live turn ---------------------------------------------------------------------------

/** Show one event of the live turn. */
function apply(event) {
  switch (event.type) {
    case "text-delta": {
      if (isSupervisor(event.agent)) return;
      const bubble = bubbleFor(event.message_id, event.agent);
      bubble.setAttribute("aria-busy", "true");
      bubble.querySelector(".text").textContent += event.delta;
      scrollDown();
      return;
    }
    case "agent-completed":
      document.querySelectorAll('.bubble[aria-busy="true"]').forEach((b) => b.removeAttribute("aria-busy"));
      if (isSupervisor(event.agent) && event.output && event.output.route) {
        routeLine(`route-${event.agent}-${Date.now()}`, event.output);
      }
      return;
    case "tool-call-started":
      callLine({
        id: event.tool_call_id,
        name: event.name,
        args: event.args || {},
        status: "running",
        executor: event.executor,
      });
      return;
    case "tool-call-completed":
      callLine({
        id: event.tool_call_id,
        name: event.name,
        status: event.status,
        digest: event.digest,
        summary: event.summary,
        error: event.error,
        executor: event.executor,
        reused: event.reused_from || undefined,
      });
      return;
    case "approval-required":
    case "input-required":
    case "client-exec-required":
      callLine({ id: event.tool_call_id, name: event.name, args: event.args, status: "waiting" });
      return;
    case "run-suspended":
      say("The agent is waiting for your decision.");
      return;
    case "run-completed":
      if (event.stop_reason === "cut") {
        note(`The reply was cut off before it was complete (${event.finish_reason || "unknown"}).`, "failed");
        say("The reply was cut off before it was complete.", true);
      } else {
        say("The reply is complete.");
      }
      return;
    case "run-failed":
      note(`The turn stopped (${event.reason})${event.error ? `: ${event.error}` : "."}`, "failed");
      say(`The turn stopped: ${event.reason}.`, true);
      return;
    default:
  }
}

/** Keep what the live turn shows, so a reload mid-stream shows it before it resumes.

The store may be ahead of the last event seen (it saves as the turn goes), so the page shows
exactly what it showed at that event, then the events after it; once the turn ends it draws
the session from the store again. */
function saveLive(sessionId) {
  sessionStorage.setItem(liveKey(sessionId), $("transcript").innerHTML);
}

function restoreLive(sessionId) {
  const shown = sessionStorage.getItem(liveKey(sessionId));
  if (shown !== null) $("transcript").innerHTML = shown; // the page's own markup, saved above
}

// -- rendering -------------------------------------------------------------------------------

function el(tag, props = {}, ...children) {
  const node = document.createElement(tag);
  for (const [name, value] of Object.entries(props)) {
    if (value === undefined || value === null || value === false) continue;
    if (name === "class") node.className = value;
    else if (name === "text") node.textContent = value;
    else if (name.startsWith("on")) node.addEventListener(name.slice(2), value);
    else if (name in node && typeof value !== "string") node[name] = value;
    else node.setAttribute(name, value === true ? "" : value);
  }
  for (const child of children.flat()) if (child !== null && child !== undefined) node.append(child);
  return node;
}

const isScratch = (agent) => Boolean(page.domain && page.domain.agents[agent] && page.domain.agents[agent].scratch);
const isSupervisor = (agent) => Boolean(page.domain && page.domain.agents[agent] && page.domain.agents[agent].supervisor);

function bubbleFor(messageId, agent) {
  let bubble = document.querySelector(`#transcript .bubble[data-message="${CSS.escape(messageId)}"]`);
  if (!bubble) {
    const note = isScratch(agent);
    bubble = el(
      "article",
      { class: `bubble assistant${note ? " note" : ""}`, "data-message": messageId, "data-agent": agent || "" },
      el("p", { class: "who", text: note ? `${agent} · working note` : agent || "assistant" }),
      el("p", { class: "text" }),
    );
    $("transcript").append(bubble);
  }
  return bubble;
}

function userBubble(message) {
  $("transcript").append(
    el(
      "article",
      { class: "bubble user", "data-message": message.id },
      el("p", { class: "who", text: "You" }),
      el("p", { class: "text", text: textOf(message) }),
    ),
  );
}

function note(text, kind = "") {
  $("transcript").append(el("p", { class: `line ${kind}`, text }));
}

function routeLine(id, output) {
  const text = `Route: ${output.route}${output.reason ? ` (${output.reason})` : ""}`;
  $("transcript").append(el("p", { class: "line route", "data-route": id, text }));
}

const STATUS = {
  pending: ["○", "pending"],
  running: ["↻", "running"],
  waiting: ["⚑", "waiting for a decision"],
  proposed: ["◌", "proposed"], // captured with nobody present: nothing ran
  applied: ["✓", "applied"],
  skipped: ["⊘", "skipped"],
  completed: ["✓", "done"],
  failed: ["✗", "failed"],
  rejected: ["⊘", "rejected"],
  interrupted: ["■", "interrupted"],
};

/** A tool call's compact line (created, or updated with what is known now). */
function callLine(call) {
  let line = document.querySelector(`#transcript .call[data-call="${CSS.escape(call.id)}"]`);
  const known = line ? JSON.parse(line.dataset.live) : {};
  const merged = { ...known, ...Object.fromEntries(Object.entries(call).filter(([, v]) => v !== undefined)) };
  const [icon, word] = STATUS[merged.status] || ["•", merged.status];
  const parts = [
    el("span", { class: "call-status", text: `${icon} ${word}` }),
    " ",
    el("code", { class: "call-name", text: merged.name }),
  ];
  const args = describe(merged.args);
  if (args) parts.push(" ", el("span", { class: "call-args", text: args }));
  // A repeated read got the result of the identical call before it: it did not run again.
  if (merged.reused) parts.push(" ", el("span", { class: "call-reused", text: "reused, not run again" }));
  // An answer from documents carries its citations: listed under the line, not in it.
  let digest = merged.digest;
  let citations = null;
  if (digest && typeof digest === "object" && Array.isArray(digest.citations)) {
    ({ citations, ...digest } = digest);
  }
  // A call the model provider ran (a hosted web search...) reads as its summary line, and a
  // search lists its sources under it.
  const hosted = merged.executor === "provider";
  const shown = hosted ? merged.error || merged.summary : merged.error || describe(digest) || merged.summary;
  if (shown) parts.push(el("span", { class: "call-digest", text: `→ ${shown}` }));
  if (citations && citations.length) parts.push(citationList(citations));
  if (hosted && digest && Array.isArray(digest.sources) && digest.sources.length) {
    parts.push(sourceList(digest.sources));
  }
  if (!line) {
    line = el("p", { class: "call line", "data-call": call.id });
    $("transcript").append(line);
  }
  line.dataset.status = merged.status;
  line.dataset.live = JSON.stringify(merged);
  line.replaceChildren(...parts);
  scrollDown();
}

/** A web link only when it is one: anything but http(s) is never a link (javascript:...). */
function webLink(url) {
  try {
    const parsed = new URL(String(url));
    return parsed.protocol === "http:" || parsed.protocol === "https:" ? parsed.href : null;
  } catch {
    return null;
  }
}

/** The sources of a hosted web search: untrusted titles and URLs, written as text only. */
function sourceList(sources) {
  const list = el("ol", { class: "sources", "aria-label": "Sources" });
  for (const source of sources) {
    const url = source && source.url;
    const title = (source && source.title) || String(url || "");
    const href = webLink(url);
    const item = href
      ? el("a", { href, text: title, target: "_blank", rel: "noopener noreferrer nofollow" })
      : el("span", { text: title });
    list.append(el("li", {}, item));
  }
  return list;
}

/** The sources an answer rests on: where each quote is, and the quote. */
function citationList(citations) {
  const list = el("ol", { class: "citations", "aria-label": "Sources" });
  for (const c of citations) {
    const where = c.page ? `${c.source}, page ${c.page}` : c.source;
    list.append(el("li", {}, el("cite", { text: where }), " ", el("q", { text: c.quote })));
  }
  return list;
}

function describe(value) {
  if (value === null || value === undefined || value === "") return "";
  if (typeof value !== "object") return String(value);
  if (Array.isArray(value)) return value.map(describe).join(", ");
  return Object.entries(value)
    .map(([k, v]) => `${k}: ${typeof v === "object" && v !== null ? JSON.stringify(v) : v}`)
    .join(" · ");
}

const textOf = (message) =>
  message.parts.filter((p) => p.type === "text").map((p) => p.text).join("");

function renderMessage(message, agentOf) {
  if (message.role === "system") return;
  const texts = message.parts.filter((p) => p.type === "text");
  if (message.role === "user") {
    // The engine's own messages (a handover note, a nudge) are for the agents, not for you.
    if (!(texts.length && texts.every((p) => p.synthetic))) userBubble(message);
    return;
  }
  const agent = message.agent || agentOf;
  if (isSupervisor(agent)) {
    try {
      routeLine(message.id, JSON.parse(textOf(message)));
    } catch {}
    return;
  }
  if (texts.length) bubbleFor(message.id, agent).querySelector(".text").textContent = textOf(message);
  const decided = new Map(
    message.parts.filter((p) => p.type === "approval" && p.decision).map((p) => [p.tool_call_id, p]),
  );
  for (const part of message.parts) {
    if (part.type === "tool-call") {
      const card = decided.get(part.id);
      if (card) note(decidedText(card), `decided ${card.decision}`);
      if (part.captured !== null && part.captured !== undefined) {
        capturedLine(part);
        continue;
      }
      callLine({
        id: part.id,
        name: part.name,
        args: part.args,
        status: part.status,
        digest: part.status === "completed" ? part.digest : undefined,
        summary: part.result && part.result.summary,
        error: part.status === "failed" && part.result ? part.result.error : undefined,
        executor: part.executor,
        reused: part.reused_from || undefined,
      });
    } else if (part.type === "approval" && part.decision && !message.parts.some((p) => p.id === part.tool_call_id)) {
      note(decidedText(part), `decided ${part.decision}`);
      if (part.kind === "batch" && part.output && Array.isArray(part.output.actions)) batchReport(part);
    }
  }
}

/** A call captured with nobody present: proposed (nothing ran), or what applying it did. */
function capturedLine(part) {
  const action = page.applied.get(part.id);
  const predicted = part.result ? part.result.data : undefined;
  const status = action ? action.status : "proposed";
  callLine({
    id: part.id,
    name: part.name,
    args: action ? action.args : part.args,
    status: status === "captured" ? "proposed" : status,
    digest: action && action.status === "applied" ? action.output : action ? undefined : predicted,
    summary: undefined,
    error: action && action.status !== "applied" ? action.error || undefined : undefined,
  });
}

/** An applied batch: "applied n of m", and each action with what it really made. */
function batchReport(card) {
  const actions = card.output.actions;
  const applied = actions.filter((a) => a.status === "applied").length;
  const list = el("ol", { class: "batch-report", "aria-label": "Applied actions" });
  for (const a of actions) {
    const [icon, word] = STATUS[a.status === "captured" ? "proposed" : a.status] || ["•", a.status];
    const outcome = a.status === "applied" ? describe(a.output) : a.error || "";
    list.append(
      el(
        "li",
        { class: `batch-action ${a.status}`, "data-index": String(a.local_index) },
        el("span", { class: "call-status", text: `${icon} ${word}` }),
        " ",
        el("code", { text: a.tool }),
        " ",
        el("span", { class: "call-args", text: describe(a.args) }),
        outcome ? el("span", { class: "call-digest", text: ` → ${outcome}` }) : null,
      ),
    );
  }
  $("transcript").append(
    el("div", { class: "line batch-summary" }, el("p", { class: "batch-applied", text: `Applied ${applied} of ${actions.length}` }), list),
  );
}

function decidedText(card) {
  const who = card.decided_by ? ` by ${card.decided_by}` : "";
  const verbs = { approve: "Approved", reject: "Rejected", answer: "Answered", client_result: "Ran in the client", skip: "Skipped", expire: "Expired" };
  if (card.kind === "batch") {
    // What was approved, out of what was proposed, and what was skipped (by name): the
    // report of what was applied is drawn under it.
    const plan = (card.output && card.output.actions) || (card.amended_args && card.amended_args.actions) || card.args.actions || [];
    const count = plan.length;
    const skipped = card.decision === "approve" ? plan.filter((a) => a.status === "skipped") : [];
    const of = card.decision === "approve" && skipped.length ? `${count - skipped.length} of ` : "";
    let text = `${verbs[card.decision] || card.decision}${who}: ${of}${count} action${count === 1 ? "" : "s"}`;
    if (skipped.length) text += `; skipped: ${skipped.map((a) => a.tool).join(", ")}`;
    return text + (card.reason ? `: “${card.reason}”` : "");
  }
  let text = `${verbs[card.decision] || card.decision}${who}: ${card.tool_name}`;
  const changed = Object.entries(card.amended_args || {}).filter(
    ([k, v]) => JSON.stringify(v) !== JSON.stringify(card.args[k]),
  );
  if (changed.length) {
    text += ` (amended: ${changed.map(([k, v]) => `${k} ${describe(card.args[k])} → ${describe(v)}`).join(", ")})`;
  }
  if (card.reason) text += `: “${card.reason}”`;
  if (card.decision === "answer") text += ` (${describe(card.output)})`;
  return text;
}

const SHOWN = 100; // messages drawn when a session opens; earlier ones a page at a time
const EARLIER = 50;

const opensTurn = (m) => m.role === "user" && !m.parts.every((p) => p.type === "text" && p.synthetic);

/** Draw a session as the store has it: its latest messages, a waiting turn's scratch, its cards. */
function renderSession(session) {
  // The session holds what a turn reads (all of it, or what follows a compaction summary):
  // its latest messages are drawn, and the whole history is there a page at a time.
  const skip = Math.max(session.messages.length - SHOWN, 0);
  page.history = { first: (session.first || 0) + skip, messages: session.messages.slice(skip) };
  drawHistory(session);
  renderCards(session.pending);
  scrollDown();
}

function drawHistory(session) {
  $("transcript").replaceChildren();
  // What applying a batch did to each captured call (by its call id).
  page.applied = new Map();
  for (const m of session.messages || []) {
    for (const p of m.parts) {
      if (p.type === "approval" && p.kind === "batch" && p.output && Array.isArray(p.output.actions)) {
        for (const a of p.output.actions) if (a.call_id) page.applied.set(a.call_id, a);
      }
    }
  }
  const { first, messages } = page.history;
  if (first > 0) {
    $("transcript").append(
      el(
        "p",
        { class: "line earlier" },
        el("button", { type: "button", class: "earlier", text: `Show earlier messages (${first})`, onclick: showEarlier }),
      ),
    );
  }
  let last = -1;
  messages.forEach((m, i) => {
    if (opensTurn(m)) last = i;
  });
  // The history is in the order things happened: a turn's scratch (what its agents did out
  // of the conversation, marked `scratch`) sits between the person's message and the answer.
  for (const m of messages.slice(0, Math.max(last, 0))) renderMessage(m);
  // The latest turn: while it waits (suspended), its scratch is still the session's, and its
  // scratch agents worked before the agents that publish.
  if (last >= 0) renderMessage(messages[last]);
  for (const [agent, scratch] of Object.entries(session.scratch || {})) {
    for (const m of scratch) if (m.role !== "user") renderMessage(m, agent);
  }
  messages.slice(last + 1).forEach((m) => renderMessage(m));
  $("empty").hidden = messages.length > 0 || first > 0;
}

/** Read the page of history before what is drawn, and draw it above. */
async function showEarlier() {
  const sessionId = page.sessionId;
  const before = page.history.first;
  let older;
  try {
    older = await api("GET", `/sessions/${encodeURIComponent(sessionId)}/messages?before=${before}&limit=${EARLIER}`);
  } catch (error) {
    say(error.message, true);
    return;
  }
  if (page.sessionId !== sessionId || page.history.first !== before) return; // moved on meanwhile
  page.history = { first: older.first, messages: [...older.messages, ...page.history.messages] };
  drawHistory(page.session);
  $("transcript").firstElementChild.scrollIntoView({ block: "start" });
}

// -- cards -----------------------------------------------------------------------------------

function renderCards(pending) {
  const cards = $("cards");
  cards.replaceChildren(...pending.map(cardFor));
  $("pending").hidden = pending.length === 0;
  $("batch-error").textContent = "";
  const approvable = pending.filter((c) => ["approval", "recovery", "batch"].includes(c.kind));
  const all = $("approve-all");
  all.hidden = approvable.length < 2;
  all.textContent = `Approve all (${approvable.length})`;
}

function cardFor(card) {
  const id = `card-${card.tool_call_id}`;
  const tool = (page.domain && page.domain.tools[card.tool_name]) || null;
  const titles = {
    approval: `Approve ${card.tool_name}?`,
    elicitation: `${card.tool_name} asks you`,
    question: `${card.tool_name} asks you`,
    client_exec: `${card.tool_name} runs in the client app`,
    recovery: `${card.tool_name} may have run before a crash`,
    batch: "Approve these actions?",
  };
  const form = el("form", { class: "card-form", novalidate: true });
  const node = el(
    "section",
    {
      class: `card ${card.kind}`,
      id,
      tabindex: "-1",
      "aria-labelledby": `${id}-title`,
      "data-call": card.tool_call_id,
    },
    el("h4", { id: `${id}-title`, text: titles[card.kind] || card.tool_name }),
    card.prompt ? el("p", { class: "prompt", text: card.prompt }) : null,
    card.kind === "batch" ? null : argsList(now(card), id),
    standing(card, id),
    form,
    el("p", { class: "error", role: "alert", id: `${id}-error` }),
  );
  const fields = [];
  if (card.kind === "approval" && card.amendable.length) {
    const schema = (tool && tool.parameters) || {};
    const box = el("fieldset", {}, el("legend", { text: "Change before approving" }));
    for (const name of card.amendable) {
      const field = schemaField(`${id}-amend-${name}`, name, propertySchema(schema, name), now(card)[name]);
      fields.push(field);
      box.append(field.node);
    }
    form.append(box);
  }
  if (card.kind === "batch") form.append(batchRows(card, id, node));
  if (card.kind === "question") {
    // A tool asked while it ran: the answer is text, and the tool runs again with it.
    const field = schemaField(`${id}-answer`, "Your answer", { type: "string" }, undefined);
    field.input.required = true;
    fields.push(field);
    form.append(field.node);
  }
  if (card.kind === "elicitation") {
    const schema = (tool && tool.output_schema) || { type: "string" };
    const resolved = deref(schema, schema);
    if (resolved.type === "object" && resolved.properties) {
      const box = el("fieldset", {}, el("legend", { text: "Your answer" }));
      for (const [name, prop] of Object.entries(resolved.properties)) {
        const field = schemaField(`${id}-answer-${name}`, name, deref(prop, schema), prop.default);
        field.required = (resolved.required || []).includes(name);
        if (field.required) field.input.required = true;
        fields.push(field);
        box.append(field.node);
      }
      form.append(box);
    } else {
      const field = schemaField(`${id}-answer`, "Your answer", resolved, undefined);
      field.input.required = true;
      fields.push(field);
      form.append(field.node);
    }
  }
  const reason = el("input", { id: `${id}-reason`, type: "text", name: "reason", autocomplete: "off" });
  const asks = card.kind === "elicitation" || card.kind === "question";
  const rejectLabel = asks ? "Decline" : card.kind === "recovery" ? "Skip" : "Reject";
  const approveLabel = { approval: "Approve", elicitation: "Send answer", question: "Send answer", recovery: "Run it again", batch: "Apply" }[card.kind];
  const buttons = el("div", { class: "buttons" });
  if (approveLabel) {
    buttons.append(el("button", { type: "submit", class: "primary", text: approveLabel }));
  } else {
    form.append(el("p", { class: "hint", text: "The client app posts its result; you can only cancel the call here." }));
  }
  const reject = el("button", { type: "button", class: "reject", text: rejectLabel, onclick: () => decide(card, node, { decision: "reject", reason: reason.value.trim() || null, digest: card.digest }) });
  buttons.append(reject);
  reason.addEventListener("keydown", (e) => {
    // Enter in the reason means reject, never the form's approve.
    if (e.key === "Enter" && !e.isComposing) {
      e.preventDefault();
      if (!reject.disabled) reject.click();
    }
  });
  form.append(
    el("div", { class: "reason" }, el("label", { for: reason.id, text: `Reason (if you ${rejectLabel.toLowerCase()})` }), reason),
    buttons,
  );
  form.addEventListener("submit", (e) => {
    e.preventDefault();
    const decision = decisionFrom(card, fields, node);
    if (decision) decide(card, node, decision);
  });
  node.fields = fields;
  return node;
}

/** The arguments a card's call runs with if it is approved now (as approvers amended them). */
function now(card) {
  return card.current_args || card.args;
}

/**
 * Where a card stands, in words: what approvers changed from the model's proposal (and who),
 * and who approved these exact arguments so far, out of how many the policy needs.
 */
function standing(card, id) {
  const lines = [];
  const changes = Object.entries(card.changes || {});
  if (changes.length && card.kind !== "batch") {
    const amenders = (card.approvals || []).filter((a) => a.amended_args).map((a) => a.by);
    const by = amenders.length ? ` by ${amenders[amenders.length - 1]}` : "";
    const what = changes.map(([k, c]) => `${k} ${describe(c.proposed)} → ${describe(c.now)}`).join(", ");
    lines.push(el("p", { class: "changed", id: `${id}-changed`, text: `Changed${by} from the agent's proposal: ${what}` }));
  } else if (changes.length) {
    lines.push(el("p", { class: "changed", id: `${id}-changed`, text: "An approver changed the agent's proposed actions (shown as they are now)." }));
  }
  const tool = page.domain && page.domain.tools[card.tool_name];
  const needed = (tool && tool.decision_policy && tool.decision_policy.approvals) || 1;
  const by = card.approved_by || [];
  if (needed > 1 || by.length) {
    const who = by.length ? `approved by ${by.join(", ")}` : "no approvals yet";
    lines.push(el("p", { class: "approvals", id: `${id}-approvals`, text: `${by.length} of ${needed} approvals of these arguments: ${who}` }));
  }
  return lines.length ? el("div", { class: "standing" }, ...lines) : null;
}

/** A batch card's actions, a row each: the call, what it would make, approve / skip / amend. */
function batchRows(card, id, node) {
  const amendable = now(card).amendable || card.args.amendable || {};
  const list = el("ol", { class: "batch-actions", "aria-label": "Proposed actions" });
  node.rows = [];
  for (const action of now(card).actions || []) {
    const index = action.local_index;
    const rowId = `${id}-action-${index}`;
    const tool = (page.domain && page.domain.tools[action.tool]) || null;
    const approve = el("input", { type: "radio", name: `${rowId}-choice`, id: `${rowId}-approve`, value: "approve", checked: true });
    const skip = el("input", { type: "radio", name: `${rowId}-choice`, id: `${rowId}-skip`, value: "skip" });
    const fields = [];
    const amend = el("div", { class: "batch-amend" });
    for (const name of amendable[String(index)] || []) {
      const schema = (tool && tool.parameters) || {};
      const field = schemaField(`${rowId}-amend-${name}`, name, propertySchema(schema, name), action.args[name]);
      fields.push(field);
      amend.append(field.node);
    }
    const row = el(
      "li",
      { class: "batch-action", id: rowId, "data-index": String(index), "aria-labelledby": `${rowId}-tool` },
      el(
        "p",
        { class: "batch-call" },
        el("span", { class: "call-status", text: "◌ proposed" }),
        " ",
        el("code", { id: `${rowId}-tool`, text: action.tool }),
        " ",
        el("span", { class: "call-args", text: describe(action.args) }),
      ),
      action.predicted_output !== null && action.predicted_output !== undefined
        ? el("p", { class: "predicted", text: `would give: ${describe(action.predicted_output)}` })
        : null,
      el(
        "div",
        { class: "batch-choice", role: "radiogroup", "aria-label": `Action ${index + 1}: ${action.tool}` },
        el("label", { class: "check" }, approve, " Approve"),
        el("label", { class: "check" }, skip, " Skip"),
      ),
      fields.length ? amend : null,
    );
    const sync = () => {
      amend.hidden = skip.checked;
      row.dataset.choice = skip.checked ? "skip" : "approve";
    };
    approve.addEventListener("change", sync);
    skip.addEventListener("change", sync);
    sync();
    node.rows.push({ action, skip, fields });
    list.append(row);
  }
  return list;
}

/** The per-action choices of a batch card's rows, or null when a field is invalid. */
function batchDecision(node) {
  const actions = {};
  for (const { action, skip, fields } of node.rows || []) {
    if (skip.checked) {
      actions[action.local_index] = { approve: false };
      continue;
    }
    const amended = {};
    for (const field of fields) {
      const value = field.read();
      if (value === INVALID) {
        node.querySelector(".error").textContent = `${action.tool} ${field.label}: ${field.input.validationMessage || "not a valid value"}`;
        field.input.focus();
        return null;
      }
      if (value !== undefined && JSON.stringify(value) !== JSON.stringify(action.args[field.name])) amended[field.name] = value;
    }
    if (Object.keys(amended).length) actions[action.local_index] = { approve: true, amended_args: amended };
  }
  return Object.keys(actions).length ? { decision: "approve", actions } : { decision: "approve" };
}

function argsList(args, id) {
  const list = el("dl", { class: "args", "aria-label": "Arguments" });
  for (const [name, value] of Object.entries(args || {})) {
    list.append(el("dt", { text: name }), el("dd", { text: typeof value === "object" ? JSON.stringify(value) : String(value) }));
  }
  return list;
}

/**
 * The decision the card's form says, or null when a field is invalid (it says why). It names
 * the digest of the arguments the card showed: if another approver changed them meanwhile,
 * the server refuses it (409 arguments_changed) rather than apply it to what nobody here saw.
 */
function decisionFrom(card, fields, node) {
  const decision = formDecision(card, fields, node);
  return decision && { ...decision, digest: card.digest };
}

function formDecision(card, fields, node) {
  if (card.kind === "batch") return batchDecision(node);
  const values = {};
  for (const field of fields) {
    const value = field.read();
    if (value === INVALID || (value === undefined && field.required)) {
      const why = value === undefined ? "a value is required" : field.input.validationMessage || "not a valid value";
      node.querySelector(".error").textContent = `${field.label}: ${why}`;
      field.input.focus();
      return null;
    }
    if (value !== undefined) values[field.name] = value;
  }
  if (card.kind === "elicitation" || card.kind === "question") {
    if (fields.length === 1 && fields[0].name === "Your answer") return { decision: "answer", output: values["Your answer"] };
    return { decision: "answer", output: values };
  }
  const amended = {};
  for (const [name, value] of Object.entries(values)) {
    if (JSON.stringify(value) !== JSON.stringify(now(card)[name])) amended[name] = value;
  }
  return Object.keys(amended).length ? { decision: "approve", amended_args: amended } : { decision: "approve" };
}

async function decide(card, node, decision) {
  await resolve([{ tool_call_id: card.tool_call_id, decision }], node.querySelector(".error"), node);
}

async function resolve(items, errorBox, node) {
  const sessionId = page.sessionId;
  const buttons = (node || $("pending")).querySelectorAll("button");
  buttons.forEach((b) => (b.disabled = true));
  errorBox.textContent = "";
  try {
    const body = items.length === 1 ? items[0] : items;
    const resolution = await api("POST", `/sessions/${encodeURIComponent(sessionId)}/resolve`, body);
    if (resolution.resumed && !page.mine.has(sessionId)) {
      // Another's session, decided from the inbox: its turn resumes on the server, and
      // its stream is its owner's.
      page.session.pending = [];
      renderCards([]);
      say("Decided; the turn resumes in the background.");
      loadInbox().catch(() => {});
    } else if (resolution.resumed) {
      // Follow from the resolution's event: the transcript shows the turn as it was then.
      page.session.pending = [];
      renderCards([]);
      say("Decided; the agent goes on…");
      follow(sessionId, resolution.after);
    } else {
      await openSession(sessionId, { focus: true });
    }
  } catch (error) {
    errorBox.textContent = error.status ? `${error.message} (${error.status} ${error.type})` : error.message;
    if (error.type === "stale_resolution" || error.type === "conflict" || error.type === "arguments_changed") {
      // Decided elsewhere (another tab, another person): offer the session as it is now.
      errorBox.append(
        " ",
        el("button", { type: "button", text: "Show the session as it is now", onclick: () => openSession(sessionId, { focus: true }) }),
      );
    } else {
      buttons.forEach((b) => (b.disabled = false));
    }
    (node || $("pending")).focus();
  }
}

async function approveAll() {
  const items = [];
  for (const node of $("cards").querySelectorAll(".card.approval, .card.recovery, .card.batch")) {
    const card = page.session.pending.find((c) => c.tool_call_id === node.dataset.call);
    const decision = decisionFrom(card, node.fields || [], node);
    if (!decision) return;
    items.push({ tool_call_id: card.tool_call_id, decision });
  }
  await resolve(items, $("batch-error"), null);
}

// -- forms from JSON Schema ------------------------------------------------------------------

const INVALID = Symbol("invalid");

function deref(schema, root) {
  let s = schema || {};
  for (let i = 0; i < 10 && s.$ref; i++) {
    const name = s.$ref.split("/").pop();
    s = { ...((root.$defs || root.definitions || {})[name] || {}), ...Object.fromEntries(Object.entries(s).filter(([k]) => k !== "$ref")) };
  }
  const options = s.anyOf || s.oneOf;
  if (options) {
    const real = options.filter((o) => o.type !== "null");
    if (real.length === 1) return { ...deref(real[0], root), ...Object.fromEntries(Object.entries(s).filter(([k]) => k !== "anyOf" && k !== "oneOf")), nullable: true };
  }
  return s;
}

function propertySchema(schema, name) {
  return deref((schema.properties || {})[name] || {}, schema);
}

/** A labelled input for one value of `schema`; `read()` parses it (INVALID if it is not). */
function schemaField(id, name, schema, value) {
  const plain = (t) => String(t).toLowerCase().replace(/[\s_-]+/g, "");
  const label = schema.title && plain(schema.title) !== plain(name) ? `${name} (${schema.title})` : name;
  const help = schema.description ? el("span", { class: "help", id: `${id}-help`, text: schema.description }) : null;
  const described = help ? `${id}-help` : undefined;
  let input;
  let read;
  if (Array.isArray(schema.enum)) {
    input = el("select", { id, name, "aria-describedby": described });
    if (schema.nullable || value === undefined) input.append(el("option", { value: "", text: "—" }));
    schema.enum.forEach((option, i) => input.append(el("option", { value: String(i), text: String(option) })));
    const at = schema.enum.findIndex((o) => JSON.stringify(o) === JSON.stringify(value));
    input.value = at >= 0 ? String(at) : "";
    read = () => (input.value === "" ? (schema.nullable ? null : undefined) : schema.enum[Number(input.value)]);
  } else if (schema.type === "boolean") {
    input = el("input", { id, name, type: "checkbox", "aria-describedby": described });
    input.checked = Boolean(value);
    read = () => input.checked;
  } else if (schema.type === "number" || schema.type === "integer") {
    input = el("input", {
      id,
      name,
      type: "number",
      inputmode: schema.type === "integer" ? "numeric" : "decimal",
      step: schema.type === "integer" ? "1" : "any",
      min: schema.minimum ?? schema.exclusiveMinimum,
      max: schema.maximum ?? schema.exclusiveMaximum,
      "aria-describedby": described,
    });
    if (value !== undefined && value !== null) input.value = String(value);
    read = () => {
      if (input.validity.badInput) return INVALID; // typed, but not a number
      if (input.value.trim() === "") return schema.nullable ? null : undefined;
      if (!input.checkValidity()) return INVALID;
      const number = Number(input.value);
      if (!Number.isFinite(number) || (schema.type === "integer" && !Number.isInteger(number))) return INVALID;
      if (schema.exclusiveMinimum !== undefined && number <= schema.exclusiveMinimum) return INVALID;
      if (schema.exclusiveMaximum !== undefined && number >= schema.exclusiveMaximum) return INVALID;
      return number;
    };
  } else if (schema.type === "string" || schema.type === undefined && !schema.properties) {
    const long = (schema.maxLength || 0) > 200 || schema.format === "textarea";
    input = el(long ? "textarea" : "input", {
      id,
      name,
      type: long ? undefined : schema.format === "date" ? "date" : schema.format === "email" ? "email" : "text",
      minlength: schema.minLength,
      maxlength: schema.maxLength,
      pattern: schema.pattern,
      autocomplete: "off",
      "aria-describedby": described,
    });
    if (value !== undefined && value !== null) input.value = String(value);
    read = () => {
      if (!input.checkValidity()) return INVALID;
      return input.value === "" && schema.nullable ? null : input.value;
    };
  } else {
    input = el("textarea", { id, name, rows: 3, "aria-describedby": described, class: "json" });
    if (value !== undefined) input.value = JSON.stringify(value, null, 2);
    read = () => {
      input.setCustomValidity("");
      try {
        return input.value.trim() ? JSON.parse(input.value) : undefined;
      } catch {
        input.setCustomValidity("not valid JSON");
        return INVALID;
      }
    };
  }
  const wrap = schema.type === "boolean" ? "field check" : "field";
  const node = el("div", { class: wrap }, el("label", { for: id, text: label }), input, help);
  return { node, input, read, name, label };
}

// -- sessions --------------------------------------------------------------------------------

async function loadDomain() {
  const domain = await api("GET", "/domain");
  page.domain = {
    agents: Object.fromEntries(domain.agents.map((a) => [a.name, a])),
    tools: Object.fromEntries(domain.tools.map((t) => [t.name, t])),
  };
}

async function listSessions() {
  const { sessions } = await api("GET", "/sessions");
  page.mine = new Set(sessions.map((s) => s.id));
  const list = $("session-list");
  list.replaceChildren(
    ...sessions.map((s) => {
      const when = new Date(s.updated_at * 1000).toLocaleString([], { dateStyle: "short", timeStyle: "short" });
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
            "aria-current": current ? "true" : undefined,
            onclick: () => select(s.id),
          },
          el("span", { class: "session-id", text: s.id }),
          el("span", { class: `badge ${s.status}`, text: s.running ? "running" : s.status }),
          el("span", { class: "when", text: when }),
        ),
      );
    }),
  );
  if (!sessions.length) list.append(el("li", { class: "none", text: "No sessions yet." }));
}

/** The inbox: the cards of the organisation the caller may decide, a line each. */
async function loadInbox() {
  const { cards } = await api("GET", "/pending?limit=100");
  page.inbox = cards;
  const list = $("inbox-list");
  list.replaceChildren(
    ...cards.map((c) => {
      const title = c.kind === "batch" ? `${c.args.actions.length} actions` : c.tool;
      const when = c.created_at ? new Date(c.created_at * 1000).toLocaleString([], { dateStyle: "short", timeStyle: "short" }) : "";
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
          el("span", { class: "inbox-tool", text: title }),
          el("span", { class: "inbox-who", text: `from ${c.requester || "?"}` }),
          Object.keys(c.changes || {}).length ? el("span", { class: "badge changed", text: "changed" }) : null,
          (c.approved_by || []).length ? el("span", { class: "badge", text: `${c.approved_by.length} approved` }) : null,
          el("span", { class: "when", text: when }),
        ),
      );
    }),
  );
  if (!cards.length) list.append(el("li", { class: "none", text: "Nothing waits for you." }));
}

async function select(sessionId) {
  stopStream();
  history.replaceState(null, "", `#session=${encodeURIComponent(sessionId)}`);
  await openSession(sessionId, { focus: true, resume: true });
}

/** Show a session from the store; resume its stream if this tab was following it. */
async function openSession(sessionId, { focus = false, resume = false } = {}) {
  let session;
  try {
    session = await api("GET", `/sessions/${encodeURIComponent(sessionId)}`);
  } catch (error) {
    if (error.status === 404) {
      history.replaceState(null, "", "#");
      loadInbox().catch(() => {});
      page.sessionId = null;
      page.session = null;
      $("transcript").replaceChildren();
      renderCards([]);
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

async function newSession() {
  try {
    const session = await api("POST", "/sessions");
    await select(session.id);
  } catch (error) {
    say(error.message, true);
  }
}

async function send(event) {
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
    const turn = await api("POST", `/sessions/${encodeURIComponent(sessionId)}/turns`, { text });
    box.value = "";
    $("empty").hidden = true;
    userBubble({ id: `pending-${Date.now()}`, parts: [{ type: "text", text }] });
    say("The agent is working…");
    listSessions().catch(() => {});
    follow(sessionId, turn.after);
  } catch (error) {
    setBusy(false);
    say(`${error.message}${error.status ? ` (${error.status})` : ""}`, true);
  }
}

// -- page state ------------------------------------------------------------------------------

function setBusy(busy) {
  const waiting = Boolean(page.session && page.session.pending.length);
  $("send").disabled = busy || waiting;
  $("composer-text").setAttribute("aria-disabled", String(busy || waiting));
  $("transcript").setAttribute("aria-busy", String(busy));
}

function say(text, error = false) {
  const status = $("status");
  status.textContent = text;
  status.classList.toggle("error", error);
}

function scrollDown() {
  const last = $("transcript").lastElementChild;
  if (last && !$("pending").contains(document.activeElement)) last.scrollIntoView({ block: "nearest" });
}

function signOut(why) {
  stopStream();
  localStorage.removeItem(KEY);
  page.key = null;
  page.sessionId = null;
  showSignIn(why || "");
}

function showSignIn(error) {
  $("app").hidden = true;
  $("sign-out").hidden = true;
  $("sign-in").hidden = false;
  $("sign-in-error").textContent = error;
  $("api-key").focus();
}

async function signIn(key) {
  page.key = key;
  try {
    await listSessions();
    await loadDomain();
    await loadInbox();
  } catch (error) {
    page.key = null;
    const why = error.status === 401 ? "That API key was not accepted (401)." : error.message;
    showSignIn(why);
    return false;
  }
  localStorage.setItem(KEY, key);
  $("sign-in").hidden = true;
  $("app").hidden = false;
  $("sign-out").hidden = false;
  return true;
}

function hashParams() {
  return new URLSearchParams(location.hash.replace(/^#/, ""));
}

async function start() {
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
  const sessionId = hashParams().get("session");
  if (sessionId) await openSession(sessionId, { focus: true, resume: true });
}

start();
