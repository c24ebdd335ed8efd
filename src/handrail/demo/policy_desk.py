"""The support desk's policy questions, answered from the shop's own documents.

The shop's policies ship with the demo (`policies/`: refunds in Markdown, shipping in a PDF).
A `librarian` agent answers from them with `documents.answer`: retrieval, an answer with a
verified citation, and a confidence. A question the documents cannot answer goes to a person
(`AskPerson`: the turn suspends on a `question` card); the person's answer is the reply, and
is kept as a note that the next, similar question finds.

```python
desk = await build_policy_desk(tmp_path)
result = await desk.submit("How much does express shipping cost?").finish()
```
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from handrail import Agent, AgentRun, Decision, Engine, MemoryStore, Resolution, Runtime
from handrail.documents import Answerer, Library, document_tools
from handrail.documents.testing import extractive_model
from handrail.models import ModelRequest
from handrail.store import SessionStore
from handrail.testing import FunctionModel, Step, call, sequential_ids

__all__ = [
    "POLICIES",
    "POLICY_QUESTIONS",
    "PRICE_MATCH_ANSWER",
    "PolicyDesk",
    "build_policy_desk",
    "librarian_script",
    "policy_engine",
]

POLICIES = Path(__file__).parent / "policies"
"""The shop's policy documents: `refunds.md` and `shipping.pdf`."""

POLICY_QUESTIONS = (
    "How much does express shipping cost?",
    "Do you price-match other shops?",
    "Will you match a lower price I found in another shop?",
)
"""A question the documents answer, one they cannot, and the second asked again."""

PRICE_MATCH_ANSWER = (
    "Yes: we match the price of any shop in the EU for the same item. Send us the link and "
    "we refund the difference."
)
"""What a colleague answers to the question the documents cannot (when nobody types one)."""


def librarian_script(request: ModelRequest) -> Step:
    """The librarian's scripted model: ask the documents, then pass on what they said."""
    customer = next(m for m in reversed(request.messages) if m.role == "user")
    turn = request.messages[request.messages.index(customer) :]
    asked = [p for m in turn for p in m.tool_calls if p.name == "documents.answer"]
    if not asked:
        return call("documents.answer", question=customer.text)
    result = asked[-1].result
    if result is None or not result.ok:
        return "I'm sorry: I could not find that out. A colleague will get back to you."
    return reply_text(result.data)


def reply_text(answer: dict[str, Any]) -> str:
    """A reply that passes on a `DocumentAnswer` with where it comes from."""
    text = answer["answer"]
    if answer.get("answered_by"):
        return f"{text}\n\n(My colleague {answer['answered_by']} answered this.)"
    sources = []
    for citation in answer["citations"]:
        where = citation["source"]
        if citation.get("page"):
            where += f", page {citation['page']}"
        if citation["source"].startswith("note:"):
            where = f"a note from {citation['source'].removeprefix('note:')}"
        sources.append(where)
    return f"{text}\n\n(Source: {'; '.join(sources)}.)" if sources else text


@dataclass(kw_only=True, slots=True)
class PolicyDesk:
    """The librarian, its documents and its session, ready to take questions."""

    engine: Engine
    library: Library
    session_id: str = "policies-1"

    def submit(self, text: str) -> AgentRun[Any]:
        """Ask a question; iterate the run for events, then read `.result`."""
        return self.engine.submit(self.session_id, text)

    async def resolve(self, decision: Decision) -> Resolution:
        """Decide the pending question (the only pending call)."""
        state = await self.engine.session(self.session_id)
        (call_id,) = state.pending
        return await self.engine.resolve(self.session_id, call_id, decision)

    def resume(self) -> AgentRun[Any]:
        """Go on with the suspended turn once the question is answered."""
        return self.engine.resume(self.session_id)

    async def close(self) -> None:
        """Close the documents' index."""
        await self.library.close()


def policy_engine(library: Library, *, store: SessionStore | None = None) -> Engine:
    """The librarian on `library` (already ingested), on a scripted model (offline).

    The model is scripted (`librarian_script`) and the documents answer with the offline
    extractive model: no network, no API key. The embedder and the index are the real ones.
    """
    answerer = Answerer(library, extractive_model())
    librarian: Agent[str] = Agent(
        "librarian",
        instructions="Answer the customer's policy questions from the shop's documents only.",
        tools=document_tools(answerer),
    )
    runtime: Runtime[None] = Runtime(
        model=FunctionModel(librarian_script, name="scripted"), ids=sequential_ids()
    )
    return Engine(librarian, store=store or MemoryStore(), runtime=runtime)


async def build_policy_desk(
    index: str | os.PathLike[str],
    *,
    store: SessionStore | None = None,
    session_id: str = "policies-1",
) -> PolicyDesk:
    """Ingest the shop's policies into an index at `index`, and build the librarian on them."""
    library = Library.open(index)
    await library.ingest(POLICIES)
    engine = policy_engine(library, store=store)
    return PolicyDesk(engine=engine, library=library, session_id=session_id)
