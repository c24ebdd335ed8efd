// The cards: a call waiting for a decision, drawn with what it needs, who approved it so far,
// what approvers changed, and the form to decide it; then, for a colleague's session, what
// came of the decision.
import { api, path } from "./api.js";
import { author, callLine, STATUS } from "./conversation.js";
import { decidedNow } from "./decided.js";
import { buttonLabel, decisionWords, statusAfter } from "./decisions.js";
import { $, describe, el, joined, sleep } from "./dom.js";
import { deref, INVALID, propertySchema, schemaField } from "./forms.js";
import { loadInbox } from "./inbox.js";
import { openSession } from "./sessions.js";
import { announce, page, say } from "./state.js";
import { follow } from "./stream.js";

const TITLES = {
  approval: (card) => `Approve ${card.tool_name}?`,
  elicitation: (card) => `${card.tool_name} asks you`,
  question: (card) => `${card.tool_name} asks you`,
  client_exec: (card) => `${card.tool_name} runs in the client app`,
  recovery: (card) => `${card.tool_name} may have run before a crash`,
  batch: () => "Approve these actions?",
};
const title = (card) => (TITLES[card.kind] || ((c) => c.tool_name))(card);
const APPROVABLE = ["approval", "recovery", "batch"];
let shown = new Set(); // the ids of the cards drawn: a card not among them is new

export function renderCards(pending) {
  const cards = $("cards");
  cards.replaceChildren(...pending.map(cardFor));
  $("pending").hidden = pending.length === 0;
  $("batch-error").textContent = "";
  // Only the cards the viewer can still decide: one they approved waits for others.
  const approvable = pending.filter((c) => APPROVABLE.includes(c.kind) && !approvedByMe(c));
  const all = $("approve-all");
  all.hidden = approvable.length < 2;
  all.textContent = `Approve all (${approvable.length})`;
  const fresh = pending.filter((c) => !shown.has(c.tool_call_id));
  if (fresh.length && shown.size) {
    announce(fresh.length === 1 ? `A new card: ${title(fresh[0])}` : `${fresh.length} new cards wait for a decision.`);
  }
  shown = new Set(pending.map((c) => c.tool_call_id));
}

/** The viewer approved this card's current arguments already: it waits for someone else. */
export const approvedByMe = (card) =>
  Boolean(page.me) && card.kind !== "batch" && (card.approved_by || []).includes(page.me.user_id);

const policyOf = (card) => {
  const tool = page.domain && page.domain.tools[card.tool_name];
  return (tool && tool.decision_policy) || null;
};

const NUMBERS = ["no one", "one person", "two people", "three people", "four people", "five people"];
const people = (n) => NUMBERS[n] || `${n} people`;
const roleWords = (roles) => (roles.length ? `the role ${roles.join(" or ")}` : "");

/** What a card needs before its call runs, in words ("two people with the role sre"). */
function needs(card, policy, id) {
  if (!policy || card.kind === "client_exec") return null;
  const n = policy.approvals || 1;
  const verb = card.kind === "elicitation" || card.kind === "question" ? "an answer from" : `the approval of`;
  let text = `Needs ${verb} ${people(n)}`;
  if (policy.roles.length) text += ` with ${roleWords(policy.roles)}`;
  const owner = page.session && page.session.user_id;
  if (policy.four_eyes) text += owner ? `, other than ${owner === (page.me && page.me.user_id) ? "you (you asked)" : `${owner}, who asked`}` : ", other than the requester";
  return el("p", { class: "needs", id: `${id}-needs`, text: `${text}.` });
}

function cardFor(card) {
  const id = `card-${card.tool_call_id}`;
  const tool = (page.domain && page.domain.tools[card.tool_name]) || null;
  const policy = policyOf(card);
  const form = el("form", { class: "card-form", novalidate: true, "aria-labelledby": `${id}-title` });
  const mine = approvedByMe(card);
  const node = el(
    "section",
    {
      class: `card ${card.kind}${mine ? " approved-by-me" : ""}`,
      id,
      tabindex: "-1",
      "aria-labelledby": `${id}-title`,
      "aria-describedby": `${id}-needs`,
      "data-call": card.tool_call_id,
    },
    el("h4", { id: `${id}-title`, text: title(card) }),
    el("p", { class: "requester", text: `Asked by ${author() === "You" ? "you" : author()}` }),
    card.prompt ? el("p", { class: "prompt", text: card.prompt }) : null,
    card.kind === "batch" ? null : argsList(now(card), id, card.changes || {}),
    needs(card, policy, id),
    standing(card, id),
    mine ? waitingForOthers(card, policy, id) : form,
    el("p", { class: "error", role: "alert", id: `${id}-error` }),
  );
  if (!node.querySelector(".needs")) node.removeAttribute("aria-describedby");
  if (mine) return node;
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
  const rejectLabel = buttonLabel(card.kind, "reject") || "Reject";
  const approveLabel = buttonLabel(card.kind, asks ? "answer" : "approve");
  const buttons = el("div", { class: "buttons" });
  // Each button says which card it decides to a screen reader (several cards: several Approve).
  const about = `${id}-title`;
  if (approveLabel) {
    buttons.append(el("button", { type: "submit", class: "primary", text: approveLabel, "aria-describedby": about }));
  } else {
    form.append(el("p", { class: "hint", text: "The client app posts its result; you can only cancel the call here." }));
  }
  const reject = el("button", { type: "button", class: "reject", text: rejectLabel, "aria-describedby": about, onclick: () => decide(card, node, { decision: "reject", reason: reason.value.trim() || null, digest: card.digest }) });
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

/** A card the viewer approved: who else it waits for, and no buttons (a second approval of
 * theirs would be refused). */
function waitingForOthers(card, policy, id) {
  const needed = (policy && policy.approvals) || 1;
  const more = Math.max(needed - (card.approved_by || []).length, 1);
  const roles = policy && policy.roles.length ? ` (${policy.roles.length === 1 ? "role" : "roles"} ${policy.roles.join(" or ")})` : "";
  return el("p", { class: "waiting-for-others", id: `${id}-waiting`, text: `You approved; waiting for ${more} more${roles}.` });
}

/** The arguments a card's call runs with if it is approved now (as approvers amended them). */
export function now(card) {
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
  const policy = policyOf(card);
  const needed = (policy && policy.approvals) || 1;
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

/** The arguments, a row each; one an approver changed shows what it was ("999 (was 500)"). */
function argsList(args, id, changes) {
  const list = el("dl", { class: "args", "aria-label": "Arguments" });
  const text = (value) => (typeof value === "object" && value !== null ? JSON.stringify(value) : String(value));
  for (const [name, value] of Object.entries(args || {})) {
    const change = changes[name];
    const dd = change
      ? el("dd", { class: "changed-arg" }, el("ins", { text: text(value) }), " ", el("span", { class: "was" }, "(was ", el("del", { text: text(change.proposed) }), ")"))
      : el("dd", { text: text(value) });
    list.append(el("dt", { text: name }), dd);
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
    const resolution = await api("POST", `${path`/sessions/${sessionId}`}/resolve`, body);
    decidedNow();
    if (resolution.resumed && !page.mine.has(sessionId)) {
      // Another's session, decided from the inbox: its turn resumes on the server, and
      // its stream is its owner's. What came of it is read back, call by call.
      const decided = page.session.pending.filter((c) => resolution.decided.includes(c.tool_call_id));
      page.session.pending = [];
      renderCards([]);
      for (const card of decided) if (card.kind !== "batch") callLine({ id: card.tool_call_id, status: "decided", summary: null });
      say("Decided; the turn resumes in the background.");
      loadInbox().catch(() => {});
      showOutcomes(sessionId, decided);
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

export async function approveAll() {
  const items = [];
  for (const node of $("cards").querySelectorAll(".card.approval, .card.recovery, .card.batch")) {
    if (node.classList.contains("approved-by-me")) continue;
    const card = page.session.pending.find((c) => c.tool_call_id === node.dataset.call);
    const decision = decisionFrom(card, node.fields || [], node);
    if (!decision) return;
    items.push({ tool_call_id: card.tool_call_id, decision });
  }
  await resolve(items, $("batch-error"), null);
}

// -- what came of a decision -----------------------------------------------------------------

const POLLS = 120; // reads of a call's outcome, at most, before the page stops asking
const FINAL = new Set(["completed", "failed", "rejected", "interrupted"]);

export function clearOutcomes() {
  page.outcomes = (page.outcomes || 0) + 1; // stops the reads of the ones shown
  $("outcome-list").replaceChildren();
  $("outcomes").hidden = true;
}

/**
 * For each card decided on a colleague's session, a panel that says what came of it: the
 * call's result (or failure), once the resumed turn has run it (`GET .../calls/{id}`).
 */
export async function showOutcomes(sessionId, cards) {
  const round = page.outcomes || 0;
  $("outcomes").hidden = false;
  const panels = cards.map((card) => {
    const id = `outcome-${card.tool_call_id}`;
    const status = el("p", { class: "outcome-status", id: `${id}-status`, text: "The turn goes on on the server…" });
    const panel = el(
      "section",
      { class: "outcome", id, tabindex: "-1", "aria-labelledby": `${id}-title`, "data-call": card.tool_call_id, "aria-busy": "true" },
      el("h4", { id: `${id}-title`, text: card.kind === "batch" ? "The actions you decided" : `${card.tool_name}, which you decided` }),
      status,
    );
    $("outcome-list").append(panel);
    return { card, panel, status };
  });
  if (panels.length) panels[0].panel.focus();
  for (const { card, panel, status } of panels) {
    let outcome = null;
    for (let i = 0; i < POLLS && (page.outcomes || 0) === round; i++) {
      try {
        outcome = await api("GET", path`/sessions/${sessionId}/calls/${card.tool_call_id}`);
      } catch (error) {
        status.textContent = `What came of it cannot be read: ${error.message}`;
        break;
      }
      lineFrom(sessionId, outcome);
      if (outcome.done) break;
      await sleep(Math.min(250 * (i + 1), 2000));
    }
    if ((page.outcomes || 0) !== round) return;
    panel.removeAttribute("aria-busy");
    if (outcome && outcome.done) {
      status.textContent = outcomeText(outcome);
      status.dataset.status = statusAfter(card.kind, outcome.status) || outcome.session_status;
      announce(`${card.tool_name}: ${status.textContent}`);
    } else if (outcome) {
      status.textContent = "The turn has not run it yet; look again later (Refresh).";
    }
  }
}

/** The call's line in the conversation, as the outcome says it stands now. */
export function lineFrom(sessionId, outcome) {
  const drawn = document.querySelector(`#transcript .call[data-call="${CSS.escape(outcome.tool_call_id)}"]`);
  if (outcome.kind === "batch" || page.sessionId !== sessionId || !drawn) return;
  const unrun = outcome.status === "waiting" || outcome.status === "pending" || outcome.status === null;
  const after = { reject: "rejected", expire: "expired", skip: "skipped" }[outcome.decision] || "decided";
  callLine({
    id: outcome.tool_call_id,
    name: outcome.tool_name,
    args: outcome.args || undefined,
    changes: outcome.changes,
    status: statusAfter(outcome.kind, unrun ? (outcome.decision ? after : "waiting") : outcome.status),
    digest: outcome.status === "completed" ? outcome.digest : null,
    summary: unrun ? null : outcome.summary,
    error: outcome.error,
  });
}

/** What came of a decided call, in words: what it did, or why it did not. */
export function outcomeText(outcome) {
  if (!outcome.decision) {
    const so = outcome.approved_by.length ? `approved by ${joined(outcome.approved_by)} so far` : "no approvals yet";
    return `Waiting for more approvals: ${so}.`;
  }
  const who = outcome.decided_by.length ? ` by ${joined(outcome.decided_by)}` : "";
  const decided = `${decisionWords(outcome.kind, outcome.decision)}${who}`;
  if (outcome.kind === "batch") {
    const actions = (outcome.output && outcome.output.actions) || [];
    const applied = actions.filter((a) => a.status === "applied").length;
    return actions.length ? `${decided}; applied ${applied} of ${actions.length}.` : `${decided}.`;
  }
  const status = statusAfter(outcome.kind, outcome.status);
  const [icon, word] = STATUS[status] || ["•", status || outcome.session_status];
  let text = `${decided}; ${icon} ${word}`;
  if (outcome.error) text += `: ${outcome.error}`;
  else if (outcome.summary) text += `: ${outcome.summary}`;
  else if (outcome.digest !== null && outcome.digest !== undefined) text += `: ${describe(outcome.digest)}`;
  if (outcome.session_status === "failed" && !FINAL.has(outcome.status)) text += " (the turn failed before it ran)";
  return `${text}.`;
}
