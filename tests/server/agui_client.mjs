// Drives handrail's AG-UI endpoint with @ag-ui/client's HttpAgent, as an AG-UI app would.
// argv[2]: JSON {url, key, threadId, messages?, pendingInterrupts?, steps: [...]}; a step is
// {message: "text"} (a new user message, then a run) or {resume: [{status, payload}, ...]}
// (the answers to the pending interrupts, in order); either may carry `tools` (the client's
// tools, sent with the run: the client can run client tools). Prints a JSON line per step, then a
// {final: {messages, pendingInterrupts}} line, to go on in another process.
import { createRequire } from "node:module";
import { pathToFileURL } from "node:url";

const spec = JSON.parse(process.argv[2]);
const require = createRequire(pathToFileURL(spec.nodeModules + "/"));
const { HttpAgent } = await import(pathToFileURL(require.resolve("@ag-ui/client")).href);

const agent = new HttpAgent({
  url: spec.url,
  headers: { Authorization: `Bearer ${spec.key}` },
  threadId: spec.threadId,
  initialMessages: spec.messages ?? [],
});
agent.pendingInterrupts = spec.pendingInterrupts ?? [];

let n = 0;
for (const step of spec.steps) {
  n += 1;
  const events = [];
  const params = { runId: `run-${n}-${Date.now()}` };
  if (step.tools !== undefined) params.tools = step.tools;
  if (step.message !== undefined) {
    agent.addMessage({ id: `user-${n}-${Date.now()}`, role: "user", content: step.message });
  }
  if (step.resume !== undefined) {
    params.resume = agent.pendingInterrupts.map((interrupt, i) => ({
      interruptId: interrupt.id,
      ...step.resume[i],
    }));
  }
  let error = null;
  try {
    await agent.runAgent(params, { onEvent: ({ event }) => { events.push(event); } });
  } catch (e) {
    error = String(e && e.message ? e.message : e);
  }
  console.log(JSON.stringify({ step: n, events, error, pendingInterrupts: agent.pendingInterrupts }));
}
console.log(JSON.stringify({ final: { messages: agent.messages, pendingInterrupts: agent.pendingInterrupts } }));
