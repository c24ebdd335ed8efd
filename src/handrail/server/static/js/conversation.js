// The conversation: a session's messages as the store has them, each tool call a line, the
// decisions made on its cards, and what applying a batch did.
import { api, path } from "./api.js";
import { renderCards } from "./cards.js";
import { decisionWords, statusAfter } from "./decisions.js";
import { $, describe, el, joined, webLink } from "./dom.js";
import { page, say, scrollDown } from "./state.js";

const SHOWN = 100; // messages drawn when a session opens; earlier ones a page at a time
const EARLIER = 50;

export const isScratch = (agent) => Boolean(page.domain && page.domain.agents[agent] && page.domain.agents[agent].scratch);
export const isSupervisor = (agent) => Boolean(page.domain && page.domain.agents[agent] && page.domain.agents[agent].supervisor);

export const textOf = (message) =>
  message.parts.filter((p) => p.type === "text").map((p) => p.text).join("");

/**
 * Who wrote a session's user messages, as the viewer reads it: "You" on their own session,
 * else its owner's name (a colleague who opens a card from "To decide" reads the requester's).
 */
export function author(session = page.session) {
  const owner = session && session.user_id;
  if (!owner || (page.me && owner === page.me.user_id)) return "You";
  return owner;
}

export function bubbleFor(messageId, agent) {
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

export function userBubble(message, who = author()) {
  $("transcript").append(
    el(
      "article",
      { class: `bubble user${who === "You" ? "" : " other"}`, "data-message": message.id },
      el("p", { class: "who", text: who }),
      el("p", { class: "text", text: textOf(message) }),
    ),
  );
}

export function note(text, kind = "") {
  $("transcript").append(el("p", { class: `line ${kind}`, text }));
}

export function routeLine(id, output) {
  const text = `Route: ${output.route}${output.reason ? ` (${output.reason})` : ""}`;
  $("transcript").append(el("p", { class: "line route", "data-route": id, text }));
}

export const STATUS = {
  pending: ["○", "pending"],
  running: ["↻", "running"],
  waiting: ["⚑", "waiting for a decision"],
  decided: ["↻", "decided; runs when the turn resumes"], // decided, the turn not resumed yet
  expired: ["⊘", "expired"],
  proposed: ["◌", "proposed"], // captured with nobody present: nothing ran
  applied: ["✓", "applied"],
  skipped: ["⊘", "skipped"],
  completed: ["✓", "done"],
  failed: ["✗", "failed"],
  rejected: ["⊘", "rejected"],
  declined: ["⊘", "declined"], // a question's or an elicitation's, rejected: "Decline"
  not_run_again: ["⊘", "not run again"], // a recovery card's, rejected: "Skip" (it may have run)
  interrupted: ["■", "interrupted"],
};

/** A tool call's compact line (created, or updated with what is known now). */
export function callLine(call) {
  let line = document.querySelector(`#transcript .call[data-call="${CSS.escape(call.id)}"]`);
  const known = line ? JSON.parse(line.dataset.live) : {};
  const merged = { ...known, ...Object.fromEntries(Object.entries(call).filter(([, v]) => v !== undefined)) };
  const [icon, word] = STATUS[merged.status] || ["•", merged.status];
  const parts = [
    el("span", { class: "call-status", text: `${icon} ${word}` }),
    " ",
    el("code", { class: "call-name", text: merged.name }),
  ];
  const args = argsText(merged.args, merged.changes || {});
  if (args) parts.push(" ", args);
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

/**
 * A call's arguments in a few words, `key: value · key: value`; one an approver changed reads
 * as it runs, then what the model proposed: "amount: 450 (was 500)".
 */
function argsText(args, changes) {
  const entries = Object.entries(args || {});
  if (!entries.length) return null;
  const text = (v) => (typeof v === "object" && v !== null ? JSON.stringify(v) : String(v));
  const span = el("span", { class: "call-args" });
  entries.forEach(([name, value], i) => {
    if (i) span.append(" · ");
    const change = changes[name];
    if (change) {
      span.append(
        el("span", { class: "changed-arg" }, `${name}: `, el("ins", { text: text(value) }), " (was ", el("del", { text: text(change.proposed) }), ")"),
      );
    } else {
      span.append(`${name}: ${text(value)}`);
    }
  });
  return span;
}

/** The arguments a card's call runs with: the proposal, or as approvers amended it. */
export function currentArgs(card) {
  if (card.current_args) return card.current_args;
  if (card.decision) return card.amended_args || card.args;
  const last = (card.approvals || []).at(-1);
  return (last && last.amended_args) || card.args;
}

/** What `args` change from the card's proposal, by name ({proposed, now}). */
export function argChanges(card, args = currentArgs(card)) {
  const changes = {};
  for (const name of new Set([...Object.keys(card.args || {}), ...Object.keys(args || {})])) {
    const proposed = (card.args || {})[name];
    if (JSON.stringify(proposed) !== JSON.stringify(args[name])) changes[name] = { proposed, now: args[name] };
  }
  return changes;
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
  const cards = new Map(message.parts.filter((p) => p.type === "approval").map((p) => [p.tool_call_id, p]));
  // A waiting card as the server reads it now: its arguments as approvers amended them.
  for (const p of (page.session && page.session.pending) || []) if (cards.has(p.tool_call_id)) cards.set(p.tool_call_id, p);
  for (const part of message.parts) {
    if (part.type === "tool-call") {
      const card = cards.get(part.id);
      if (card && card.decision) note(decidedText(card), `decided ${card.decision}`);
      if (part.captured !== null && part.captured !== undefined) {
        capturedLine(part);
        continue;
      }
      const state = callState(part, card);
      callLine({
        id: part.id,
        name: part.name,
        ...state,
        digest: part.status === "completed" ? part.digest : undefined,
        // "waiting for a person to approve it" no longer, once a person decided
        summary: state.status === statusAfter(card && card.kind, part.status) && part.result ? part.result.summary : undefined,
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

/**
 * Where a call stands, by its card: the arguments it runs (or ran) with, those an approver
 * changed marked, and its status; a decided call the turn has not run yet says so, never
 * "waiting for a decision".
 */
export function callState(part, card) {
  if (!card || card.kind === "batch") return { args: part.args, status: part.status };
  const unrun = part.status === "waiting" || part.status === "pending";
  const args = unrun ? currentArgs(card) : part.args;
  let status = part.status;
  // A call nobody decided in time never ran: the tool's error says so, the status too.
  if (card.decision === "expire") status = "expired";
  else if (unrun && card.decision) status = { reject: "rejected", expire: "expired", skip: "skipped" }[card.decision] || "decided";
  return { args, changes: argChanges(card, args), status: statusAfter(card.kind, status) };
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

/**
 * Who decided a card: every approver of the arguments that ran when several approved (the
 * approvals of arguments changed after them do not count), else the one who decided.
 */
export function deciders(card) {
  const approvals = (card.approvals || []).filter(
    (a) => a.by && (!card.args_digest || !a.args_digest || a.args_digest === card.args_digest),
  );
  if (card.decision === "approve" && approvals.length) return [...new Set(approvals.map((a) => a.by))];
  return card.decided_by ? [card.decided_by] : [];
}

export function decidedText(card) {
  const names = deciders(card);
  const who = names.length ? ` by ${joined(names)}` : "";
  const verb = decisionWords(card.kind, card.decision);
  if (card.kind === "batch") {
    // What was approved, out of what was proposed, and what was skipped (by name): the
    // report of what was applied is drawn under it.
    const plan = (card.output && card.output.actions) || (card.amended_args && card.amended_args.actions) || card.args.actions || [];
    const count = plan.length;
    const skipped = card.decision === "approve" ? plan.filter((a) => a.status === "skipped") : [];
    const of = card.decision === "approve" && skipped.length ? `${count - skipped.length} of ` : "";
    let text = `${verb}${who}: ${of}${count} action${count === 1 ? "" : "s"}`;
    if (skipped.length) text += `; skipped: ${skipped.map((a) => a.tool).join(", ")}`;
    return text + (card.reason ? `: “${card.reason}”` : "");
  }
  let text = `${verb}${who}: ${card.tool_name}`;
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

const opensTurn = (m) => m.role === "user" && !m.parts.every((p) => p.type === "text" && p.synthetic);

/** Draw a session as the store has it: its latest messages, a waiting turn's scratch, its cards. */
export function renderSession(session) {
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
    older = await api("GET", `${path`/sessions/${sessionId}`}/messages?before=${before}&limit=${EARLIER}`);
  } catch (error) {
    say(error.message, true);
    return;
  }
  if (page.sessionId !== sessionId || page.history.first !== before) return; // moved on meanwhile
  page.history = { first: older.first, messages: [...older.messages, ...page.history.messages] };
  drawHistory(page.session);
  $("transcript").firstElementChild.scrollIntoView({ block: "start" });
}
