// What a person can decide on each kind of card, in the words of its buttons, and what the
// decision is called afterwards (the conversation, the outcomes, "Decided by you", the audit
// view): the same words, so a recovery card's "Skip" reads "Skipped", never "Rejected",
// though the server records it as a `reject`.

/** Per card kind and decision: [the button's label (null: no button here), the words after]. */
const WORDS = {
  approval: { approve: ["Approve", "Approved"], reject: ["Reject", "Rejected"] },
  elicitation: { answer: ["Send answer", "Answered"], reject: ["Decline", "Declined"] },
  question: { answer: ["Send answer", "Answered"], reject: ["Decline", "Declined"] },
  // The client app posts its result; the page can only cancel the call.
  client_exec: { client_result: [null, "Ran in the client"], reject: ["Reject", "Rejected"] },
  // A call that may have run before a crash: retried, skipped, or (over the API) answered
  // with what it returned, as someone checked.
  recovery: { approve: ["Run it again", "Run again"], reject: ["Skip", "Skipped"], answer: [null, "Answered"] },
  batch: { approve: ["Approve", "Approved"], reject: ["Reject", "Rejected"] },
};
/** A decision no button makes, or on a card kind this page does not know. */
const AFTER = { approve: "Approved", reject: "Rejected", answer: "Answered", client_result: "Ran in the client", skip: "Skipped", expire: "Expired" };

/** The label of the button that makes `decision` on a `kind` card (null: none here). */
export const buttonLabel = (kind, decision) => ((WORDS[kind] || {})[decision] || [])[0] || null;

/** What `decision` on a `kind` card is called afterwards ("Skipped"); `kind` may be unknown. */
export const decisionWords = (kind, decision) =>
  ((WORDS[kind] || {})[decision] || [])[1] || AFTER[decision] || decision;

/** A call its card's decision kept from running, by kind: its status in the card's words. */
const UNRUN = { elicitation: "declined", question: "declined", recovery: "not_run_again" };

/** A call's status as a person reads it, after a decision on its `kind` card. */
export const statusAfter = (kind, status) => (status === "rejected" && UNRUN[kind]) || status;
