// A session's event stream, read with fetch (EventSource cannot send the Authorization
// header), and the live turn it shows. The number of the last event seen is kept per session
// in sessionStorage, so a reload mid-stream resumes with ?after= and misses nothing.
import { ApiError, path } from "./api.js";
import { bubbleFor, callLine, isSupervisor, note, routeLine } from "./conversation.js";
import { $, sleep } from "./dom.js";
import { openSession } from "./sessions.js";
import { page, say, scrollDown, setBusy } from "./state.js";

const TERMINAL = new Set(["run-completed", "run-suspended", "run-failed"]);

export const afterKey = (sessionId) => `handrail:after:${sessionId}`;
export const liveKey = (sessionId) => `handrail:live:${sessionId}`;

/** Read the session's events after `after` until the turn ends (or suspends). */
export async function follow(sessionId, after) {
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
  const response = await fetch(`${path`/sessions/${sessionId}`}/events?after=${after}`, {
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

export function stopStream() {
  if (page.stream) page.stream.abort();
  page.stream = null;
  clearTimeout(page.poll);
}

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

export function restoreLive(sessionId) {
  const shown = sessionStorage.getItem(liveKey(sessionId));
  if (shown !== null) $("transcript").innerHTML = shown; // the page's own markup, saved above
}
