"""Generated documents for the property tests: Markdown and plain text built from parts."""

from __future__ import annotations

from hypothesis import strategies as st

from handrail.documents import Block, Chunk, Document
from handrail.documents._chunker import chunk_prefix

_WORDS = (
    "refund order customer policy within days receipt store credit card exception manager "
    "approve return item damaged shipping label warranty claim period photo invoice account "
    "request support ticket priority escalate supervisor hours weekend holiday region eu us "
    "internationalisation reimbursement"
)
VOCABULARY = _WORDS.split()


def _sentence(words: list[str]) -> str:
    return " ".join(words).capitalize() + ("?" if len(words) % 7 == 3 else ".")


sentence = st.lists(st.sampled_from(VOCABULARY), min_size=1, max_size=25).map(_sentence)
paragraph = st.lists(sentence, min_size=1, max_size=8).flatmap(
    lambda sentences: st.lists(
        st.sampled_from([" ", "\n"]), min_size=len(sentences) - 1, max_size=len(sentences) - 1
    ).map(lambda gaps: "".join(s + g for s, g in zip(sentences, [*gaps, ""], strict=True)))
)


def _table(rows: list[list[str]]) -> str:
    width = len(rows[0])
    cells = [[*row, *([""] * width)][:width] for row in rows]
    lines = ["| " + " | ".join(row) + " |" for row in cells]
    return "\n".join([lines[0], "|" + "---|" * width, *lines[1:]])


cell = st.lists(st.sampled_from(VOCABULARY), min_size=1, max_size=6).map(" ".join)
table = st.integers(1, 4).flatmap(
    lambda width: st.lists(
        st.lists(cell, min_size=width, max_size=width), min_size=2, max_size=14
    ).map(_table)
)
code_line = st.tuples(
    st.sampled_from(["", "    ", "        "]),
    st.lists(st.sampled_from([*VOCABULARY, "=", "(1)", "+", "x", "return"]), max_size=14),
).map(lambda parts: parts[0] + " ".join(parts[1]) if parts[1] else "")
code = st.lists(code_line, min_size=1, max_size=25).map(
    lambda lines: "```python\n" + "\n".join(lines) + "\n```"
)
bullets = st.lists(sentence, min_size=1, max_size=12).map(
    lambda items: "\n".join(f"- {item}" for item in items)
)
heading = st.tuples(
    st.integers(1, 3), st.lists(st.sampled_from(VOCABULARY), min_size=1, max_size=3)
)
body = st.one_of(paragraph, paragraph, table, code, bullets)
section = st.tuples(heading, st.lists(body, min_size=1, max_size=4)).map(
    lambda s: "\n\n".join(["#" * s[0][0] + " " + " ".join(s[0][1]).title(), *s[1]])
)
markdown = st.lists(section, min_size=1, max_size=6).map("\n\n".join)
plain_text = st.lists(paragraph, min_size=0, max_size=10).flatmap(
    lambda paragraphs: st.sampled_from(["\n\n", "\n \n\n", "\r\n\r\n"]).map(
        lambda gap: gap.join(paragraphs)
    )
)


def count_words(text: str) -> int:
    """A fast stand-in tokenizer: one token a whitespace-separated word."""
    return len(text.split())


def assert_blocks_index_the_text(document: Document) -> None:
    assert document.text == "\n\n".join(block.text for block in document.blocks)
    for block in document.blocks:
        assert document.text[block.start : block.end] == block.text
        assert block.text.strip()


def assert_chunk_invariants(
    document: Document, chunks: list[Chunk], *, target: int, overlap: int
) -> None:
    """Everything a chunk list must satisfy, whatever the document."""
    text = document.text
    blocks = document.blocks
    if not text.strip():
        assert chunks == []
        return
    covered = bytearray(len(text))
    for index, c in enumerate(chunks):
        assert text[c.start : c.end] == c.text
        assert c.text.strip() and c.index == index
        assert c.id == f"{chunk_prefix(document.source, document.content_hash)}:{index}"
        assert c.prev_id == (chunks[index - 1].id if index else None)
        assert c.next_id == (chunks[index + 1].id if index + 1 < len(chunks) else None)
        assert c.source == document.source and c.content_hash == document.content_hash
        covered[c.start : c.end] = b"\x01" * (c.end - c.start)
        for block in blocks:
            if block.kind in ("table", "code"):
                # a boundary inside a table or a code block falls between its lines
                if block.start < c.start < block.end:
                    assert text[c.start - 1] == "\n", (c, block)
                if block.start < c.end < block.end:
                    assert text[c.end] == "\n", (c, block)
        if index + 1 < len(chunks):
            last = _block_at(document, c.end - 1)
            assert last.kind != "heading", f"chunk {index} ends with heading {last.text!r}"
        if index:
            previous = chunks[index - 1]
            assert c.start > previous.start and c.end > previous.end
            shared = previous.end - c.start
            if shared > 0:
                assert shared <= overlap
                assert text[c.start - 1].isspace()
                inside = _block_at(document, c.start)
                if inside.kind in ("table", "code") and c.start > inside.start:
                    assert text[c.start - 1] == "\n"
                elif inside.kind not in ("table", "code"):
                    assert not text[c.start].isspace()
        if count_words(c.text) > target:
            _assert_unsplittable(document, chunks, index)
    for block in blocks:
        for position in range(block.start, block.end):
            assert covered[position] or text[position].isspace(), (block, position)


def _block_at(document: Document, position: int) -> Block:
    candidates = [b for b in document.blocks if b.start <= position < b.end]
    assert len(candidates) == 1, position
    return candidates[0]


def _assert_unsplittable(document: Document, chunks: list[Chunk], index: int) -> None:
    """An oversize chunk holds one table row or code line, after its headings at most."""
    c = chunks[index]
    if index:
        assert c.start >= chunks[index - 1].end, "an oversize chunk carries no overlap"
    inside = [b for b in document.blocks if b.start < c.end and c.start < b.end]
    content = [b for b in inside if b.kind != "heading"]
    assert len(content) == 1 and content[0].kind in ("table", "code"), c
    piece = document.text[max(c.start, content[0].start) : c.end]
    assert "\n" not in piece.strip("\n"), c
