// The audit view, for callers with an audit role: the organisation's trail (GET /audit), a
// page at a time with filters, and whether it holds together (GET /audit/verify).
import { api } from "./api.js";
import { decisionWords } from "./decisions.js";
import { $, describe, el, when } from "./dom.js";
import { page, say } from "./state.js";

const PAGE = 100;
let next = null; // the `after` of the next page (null: the last page is shown)

export function hideAudit() {
  $("audit-view").hidden = true;
  $("conversation").hidden = false;
  $("show-audit").setAttribute("aria-pressed", "false");
}

export async function showAudit() {
  $("conversation").hidden = true;
  $("audit-view").hidden = false;
  $("show-audit").setAttribute("aria-pressed", "true");
  history.replaceState(null, "", "#audit");
  $("audit-heading").focus();
  await Promise.all([verifyTrail(), readTrail(false)]);
}

function filters() {
  const query = new URLSearchParams({ limit: String(PAGE) });
  for (const name of ["session_id", "tool", "kind"]) {
    const value = $(`audit-${name}`).value.trim();
    if (value) query.set(name, value);
  }
  return query;
}

/** A page of the trail: the first (replacing what is shown), or the next one. */
async function readTrail(more) {
  const query = filters();
  if (more && next !== null) query.set("after", String(next));
  let found;
  try {
    found = await api("GET", `/audit?${query}`);
  } catch (error) {
    $("audit-error").textContent = error.message;
    return;
  }
  $("audit-error").textContent = "";
  const rows = $("audit-rows");
  if (!more) rows.replaceChildren();
  rows.append(...found.entries.map(row));
  next = found.after;
  $("audit-more").hidden = next === null;
  const count = rows.children.length;
  $("audit-count").textContent = count ? `${count} entr${count === 1 ? "y" : "ies"} shown, oldest first.` : "No entries.";
}

function row(e) {
  // A decision in its card's words ("Skipped"), and, where those are not the plain ones, what
  // the trail records ("recorded as reject (recovery card)").
  const what = e.kind === "decision" ? decisionWords(e.card, e.decision) || "" : e.outcome || "";
  const details = [];
  if (e.kind === "decision" && e.card && what !== decisionWords(null, e.decision)) details.push(`recorded as ${e.decision} (${e.card} card)`);
  if (e.amended_before || e.amended_after) {
    const names = Object.keys({ ...(e.amended_before || {}), ...(e.amended_after || {}) });
    details.push(`amended: ${names.map((n) => `${n} ${describe((e.amended_before || {})[n])} → ${describe((e.amended_after || {})[n])}`).join(", ")}`);
  }
  if (e.reason) details.push(`reason: “${e.reason}”`);
  if (e.via) details.push(`via ${e.via}`);
  if (e.latency_ms !== null && e.latency_ms !== undefined) details.push(`${Math.round(e.latency_ms)} ms`);
  return el(
    "tr",
    { "data-seq": String(e.seq), class: `audit-${e.kind}` },
    el("td", { text: String(e.seq) }),
    el("td", { text: when(e.at) }),
    el("td", { text: e.kind }),
    el("td", { class: "audit-session", text: e.session_id }),
    el("td", {}, el("code", { text: e.tool })),
    el("td", { text: e.who || "" }),
    el("td", { class: "audit-what", text: what }),
    el("td", { text: details.join("; ") }),
  );
}

/** Whether the trail holds together, as `handrail audit verify` checks it, on the server. */
async function verifyTrail() {
  const box = $("audit-verify");
  box.className = "verify";
  box.replaceChildren(el("p", { text: "Verifying the trail…" }));
  let result;
  try {
    result = await api("GET", "/audit/verify");
  } catch (error) {
    box.replaceChildren(el("p", { class: "error", text: `The trail could not be verified: ${error.message}` }));
    return;
  }
  const errors = result.problems.filter((p) => p.severity === "error");
  const counted = `${result.count} entr${result.count === 1 ? "y" : "ies"} (${result.keyed} keyed, ${result.count - result.keyed} unkeyed)`;
  const headline = errors.length
    ? `✗ The trail is broken at entry ${errors[0].seq} (${errors[0].kind}): ${errors.length} problem${errors.length === 1 ? "" : "s"} in ${counted}.`
    : `✓ The trail holds: ${counted} verified; the last is ${result.last}.`;
  box.classList.add(errors.length ? "broken" : "holds");
  const list = el("ul", { class: "problems", "aria-label": "Problems" });
  for (const p of result.problems) {
    list.append(el("li", { class: p.severity, text: `entry ${p.seq}: ${p.kind}${p.severity === "warning" ? " (warning)" : ""}: ${p.message}` }));
  }
  box.replaceChildren(el("p", { class: "verify-result", text: headline }), result.problems.length ? list : "");
}

export function setUpAudit() {
  $("show-audit").hidden = !(page.me && page.me.audit);
  $("show-audit").addEventListener("click", () => showAudit().catch((error) => say(error.message, true)));
  $("audit-close").addEventListener("click", () => {
    hideAudit();
    history.replaceState(null, "", page.sessionId ? `#session=${encodeURIComponent(page.sessionId)}` : "#");
    $("composer-text").focus();
  });
  $("audit-filters").addEventListener("submit", (e) => {
    e.preventDefault();
    readTrail(false);
  });
  $("audit-more").addEventListener("click", () => readTrail(true));
}
