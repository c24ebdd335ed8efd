// Drives handrail's UI message stream endpoint with the AI SDK's own chat (the `ai` package's
// AbstractChat over DefaultChatTransport, with a plain state holder, as useChat does).
// argv[2]: JSON {url, key, chatId, nodeModules, messages?, steps: [...]}; a step is
//   {message: "text", handrail?: {...}}    a new user message (sendMessage)
//   {approve: true|false, reason?, edits?, auto?}
//                                          addToolApprovalResponse on the pending approval,
//                                          edits ({field: value}) merged into its input and
//                                          sent as handrail.edits, then sendMessage(); with
//                                          auto, the chat sends by itself (useChat's
//                                          sendAutomaticallyWhen:
//                                          lastAssistantMessageIsCompleteWithApprovalResponses)
//   {output: value} | {errorText: "..."}   addToolOutput on the call waiting for the client
//                                          (a client tool, or a person's question), then send
//   {retry: true, edits?, card?}           after a refused answer (the part stays
//                                          approval-responded): sendMessage() again, with
//                                          edits merged into the part's input (card: into the
//                                          data-handrail-card's current args, naming its digest)
//   {resume: true}                         resumeStream() (GET {api}/{chatId}/stream)
// Prints a JSON line per step ({step, chunks, error, status, message}), then
// {final: {messages}}, to go on in another process.
import { createRequire } from "node:module";
import { pathToFileURL } from "node:url";

const spec = JSON.parse(process.argv[2]);
const require = createRequire(pathToFileURL(spec.nodeModules + "/"));
const {
  AbstractChat,
  DefaultChatTransport,
  isToolUIPart,
  lastAssistantMessageIsCompleteWithApprovalResponses,
} = await import(
  pathToFileURL(require.resolve("ai")).href
);

class State {
  constructor(messages) {
    this.messages = messages;
    this.status = "ready";
    this.error = undefined;
  }
  pushMessage(message) { this.messages = this.messages.concat([message]); }
  popMessage() { this.messages = this.messages.slice(0, -1); }
  replaceMessage(index, message) {
    this.messages = [...this.messages.slice(0, index), message, ...this.messages.slice(index + 1)];
  }
  snapshot(thing) { return structuredClone(thing); }
}

class Chat extends AbstractChat {
  constructor({ messages, ...init }) {
    super({ ...init, state: new State(messages) });
  }
}

let chunks = [];
let extension = {};
let automatic = false;

class RecordingTransport extends DefaultChatTransport {
  processResponseStream(stream) {
    return super.processResponseStream(stream).pipeThrough(
      new TransformStream({
        transform(chunk, controller) {
          chunks.push(chunk);
          controller.enqueue(chunk);
        },
      }),
    );
  }
}

const chat = new Chat({
  id: spec.chatId,
  messages: spec.messages ?? [],
  sendAutomaticallyWhen: (options) =>
    automatic && lastAssistantMessageIsCompleteWithApprovalResponses(options),
  transport: new RecordingTransport({
    api: `${spec.url}/chat`,
    headers: { Authorization: `Bearer ${spec.key}` },
    body: () => ({ handrail: extension }),
  }),
});

function waiting(state) {
  const last = chat.lastMessage;
  const part = last?.parts.find((p) => isToolUIPart(p) && p.state === state);
  if (part === undefined) throw new Error(`no tool part in state ${state}`);
  return part;
}

let n = 0;
for (const step of spec.steps) {
  n += 1;
  chunks = [];
  extension = { ...(spec.handrail ?? {}), ...(step.handrail ?? {}) };
  let error = null;
  try {
    if (step.message !== undefined) {
      await chat.sendMessage({ text: step.message });
    } else if (step.approve !== undefined) {
      const part = waiting("approval-requested");
      if (step.edits !== undefined) {
        extension.edits = { [part.toolCallId]: { ...part.input, ...step.edits } };
      }
      automatic = step.auto === true;
      await chat.addToolApprovalResponse({
        id: part.approval.id, approved: step.approve, reason: step.reason,
      });
      if (automatic) {
        // The chat sent the request itself (not awaited by addToolApprovalResponse).
        const ended = () => chunks.some((c) => c.type === "finish" || c.type === "error");
        for (let i = 0; i < 3000 && !(ended() && chat.status !== "streaming"); i++) {
          await new Promise((r) => setTimeout(r, 10));
        }
        automatic = false;
      } else {
        await chat.sendMessage();
      }
    } else if (step.output !== undefined || step.errorText !== undefined) {
      const part = waiting("input-available");
      const tool = part.type === "dynamic-tool" ? part.toolName : part.type.slice(5);
      await chat.addToolOutput(step.errorText !== undefined
        ? { state: "output-error", tool, toolCallId: part.toolCallId, errorText: step.errorText }
        : { tool, toolCallId: part.toolCallId, output: step.output });
      await chat.sendMessage();
    } else if (step.retry) {
      const part = waiting("approval-responded");
      const id = part.toolCallId;
      const card = chat.lastMessage.parts.find(
        (p) => p.type === "data-handrail-card" && p.id === id,
      )?.data;
      const base = step.card ? card.args : part.input;
      if (step.edits !== undefined || step.card) {
        extension.edits = { [id]: { ...base, ...(step.edits ?? {}) } };
      }
      if (step.card) extension.digests = { [id]: card.digest };
      await chat.sendMessage();
    } else if (step.resume) {
      await chat.resumeStream();
    }
  } catch (e) {
    error = String(e && e.message ? e.message : e);
  }
  if (chat.error !== undefined) error = chat.error.message;
  console.log(JSON.stringify({
    step: n, chunks, error, status: chat.status, message: chat.lastMessage ?? null,
  }));
}
console.log(JSON.stringify({ final: { messages: chat.messages } }));
