from __future__ import annotations

from itertools import pairwise

import pytest
from fpdf import FPDF
from hypothesis import given, settings
from hypothesis import strategies as st

from handrail.documents import Document
from handrail.documents._chunker import (
    EMBEDDER_WORD_PIECES,
    EMBEDDING_PREFIX_WORD_PIECES,
    MAX_CHUNK_WORD_PIECES,
    chunk,
    chunk_prefix,
    count_word_pieces,
)
from handrail.documents._loaders import load_bytes
from handrail.exceptions import ConfigError

from ._corpus import (
    assert_chunk_invariants,
    count_words,
    markdown,
    plain_text,
    sentence,
)


def md(source: str) -> Document:
    return load_bytes(source.encode(), source="doc.md")


def prose(sentences: int, start: int = 0) -> str:
    return " ".join(f"Sentence {i} has five words." for i in range(start, start + sentences))


# --- properties -----------------------------------------------------------------------------


@settings(max_examples=250, deadline=None)
@given(markdown, st.integers(8, 80), st.integers(0, 120))
def test_markdown_chunks_are_exact_slices_that_cover_and_respect_structure(
    source: str, target: int, overlap: int
):
    overlap = min(overlap, target * 4 - 1)
    document = md(source)
    chunks = chunk(document, target_tokens=target, overlap=overlap, count_tokens=count_words)
    assert_chunk_invariants(document, chunks, target=target, overlap=overlap)
    again = chunk(document, target_tokens=target, overlap=overlap, count_tokens=count_words)
    assert again == chunks  # ids, offsets and neighbours are stable across runs


@settings(max_examples=150, deadline=None)
@given(plain_text, st.integers(4, 60), st.integers(0, 80))
def test_text_chunks_are_exact_slices_within_the_target(source: str, target: int, overlap: int):
    overlap = min(overlap, target * 4 - 1)
    document = load_bytes(source.encode(), source="doc.txt")
    chunks = chunk(document, target_tokens=target, overlap=overlap, count_tokens=count_words)
    assert_chunk_invariants(document, chunks, target=target, overlap=overlap)
    assert all(count_words(c.text) <= target for c in chunks)  # prose always splits
    assert all(c.page is None and c.headings == () for c in chunks)


@settings(max_examples=100, deadline=None)
@given(st.lists(sentence, min_size=3, max_size=30), st.integers(10, 40))
def test_prose_chunks_overlap_by_whole_words(sentences: list[str], target: int):
    document = md(" ".join(sentences))
    chunks = chunk(document, target_tokens=target, overlap=30, count_tokens=count_words)
    assert_chunk_invariants(document, chunks, target=target, overlap=30)
    for previous, current in pairwise(chunks):
        tail = document.text[current.start : previous.end]
        # an overlap of up to 30 characters fits in whenever the previous chunk's last word
        # does (every vocabulary word is shorter than 30 characters)
        last_word = previous.text.split()[-1]
        if count_words(last_word + " " + current.text[len(tail) :]) <= target:
            assert tail.endswith(last_word)


# --- examples -------------------------------------------------------------------------------


def test_small_blocks_are_packed_whole_and_linked():
    document = md("# A\n\nOne two three.\n\nFour five six.\n\nSeven eight nine.")
    chunks = chunk(document, target_tokens=8, overlap=0, count_tokens=count_words)
    assert [c.text for c in chunks] == [
        "# A\n\nOne two three.\n\nFour five six.",
        "Seven eight nine.",
    ]
    first, second = chunks
    assert (first.index, first.prev_id, first.next_id) == (0, None, second.id)
    assert (second.index, second.prev_id, second.next_id) == (1, first.id, None)
    assert first.id == f"{chunk_prefix(document.source, document.content_hash)}:0"
    assert first.headings == ("A",) and second.headings == ("A",)


def test_a_heading_moves_to_the_chunk_of_the_text_it_heads():
    document = md("Intro one two three four.\n\n## Next\n\nBody one two three four five.")
    chunks = chunk(document, target_tokens=9, overlap=0, count_tokens=count_words)
    assert [c.text for c in chunks] == [
        "Intro one two three four.",
        "## Next\n\nBody one two three four five.",
    ]
    assert chunks[1].headings == ("Next",)  # a chunk starting with a heading includes it


def test_a_block_too_big_after_its_heading_is_split_rather_than_leaving_the_heading_alone():
    document = md("## Title\n\n" + prose(2))
    chunks = chunk(document, target_tokens=8, overlap=0, count_tokens=count_words)
    assert [c.text for c in chunks] == [
        "## Title\n\nSentence 0 has five words.",
        "Sentence 1 has five words.",
    ]


def test_a_long_paragraph_splits_at_sentences_then_words():
    document = md(prose(3) + " " + " ".join(["word"] * 12) + ".")
    chunks = chunk(document, target_tokens=6, overlap=0, count_tokens=count_words)
    assert [c.text for c in chunks] == [
        "Sentence 0 has five words.",
        "Sentence 1 has five words.",
        "Sentence 2 has five words.",
        "word word word word word word",
        "word word word word word word.",
    ]


def test_overlap_repeats_the_end_of_the_previous_chunk_at_a_word_boundary():
    document = md(prose(6))
    chunks = chunk(document, target_tokens=12, overlap=14, count_tokens=count_words)
    assert [c.text for c in chunks] == [
        "Sentence 0 has five words. Sentence 1 has five words.",
        "five words. Sentence 2 has five words. Sentence 3 has five words.",
        "five words. Sentence 4 has five words. Sentence 5 has five words.",
    ]
    assert chunks[1].start == chunks[0].end - len("five words.")


def test_a_table_splits_between_rows_and_continuations_carry_its_header():
    rows = "\n".join(f"| item {i} | refund {i} |" for i in range(6))
    document = md(f"| Item | Refund |\n|---|---|\n{rows}")
    chunks = chunk(document, target_tokens=20, overlap=0, count_tokens=count_words)
    assert [c.text.split("\n") for c in chunks] == [
        ["| Item | Refund |", "|---|---|", "| item 0 | refund 0 |", "| item 1 | refund 1 |"],
        ["| item 2 | refund 2 |", "| item 3 | refund 3 |"],  # 7 words a row
        ["| item 4 | refund 4 |", "| item 5 | refund 5 |"],
    ]
    assert chunks[0].metadata == {}
    assert chunks[1].metadata == {"table_header": "| Item | Refund |\n|---|---|"}


def test_overlap_into_a_table_takes_whole_rows_only():
    rows = "\n".join(f"| item {i} | refund {i} |" for i in range(6))
    document = md(f"| Item | Refund |\n|---|---|\n{rows}")
    chunks = chunk(document, target_tokens=20, overlap=30, count_tokens=count_words)
    for previous, current in pairwise(chunks):
        assert current.start < previous.end  # there is an overlap, and it is whole rows
        assert current.text.startswith("| item ")
        assert document.text[current.start - 1] == "\n"
    assert_chunk_invariants(document, chunks, target=20, overlap=30)


def test_a_code_line_longer_than_the_target_stays_whole_and_alone():
    long_line = "x = " + " + ".join(["value"] * 20)
    document = md(f"Before it.\n\n```\nshort = 1\n{long_line}\nafter = 2\n```")
    chunks = chunk(document, target_tokens=8, overlap=20, count_tokens=count_words)
    assert [c.text for c in chunks] == [
        "Before it.",
        "it.\n\n```\nshort = 1",  # overlap from prose into code is fine
        long_line,  # no overlap: it would only make an oversize chunk bigger
        "after = 2\n```",  # no overlap: the tail before is part of a code line
    ]
    assert_chunk_invariants(document, chunks, target=8, overlap=20)


def test_chunks_know_the_pages_they_start_and_end_on():
    pdf = FPDF()
    pdf.set_font("Helvetica", size=12)
    for page in range(3):
        pdf.add_page()
        pdf.multi_cell(0, 6, prose(3, start=page * 3))
    document = load_bytes(bytes(pdf.output()), source="p.pdf")
    chunks = chunk(document, target_tokens=40, overlap=12, count_tokens=count_words)
    # A chunk keeps to its page, with no overlap reaching back into the page before.
    assert [(c.page, c.end_page) for c in chunks] == [(1, 1), (2, 2), (3, 3)]
    for c in chunks:
        assert {b.page for b in document.blocks if c.start <= b.start < c.end} == {c.page}
    assert chunks[1].text.startswith("Sentence 3")


def test_the_default_counter_keeps_chunks_within_222_word_pieces():
    sections = [
        f"## Section {i}\n\n{prose(5 + i * 4, start=i * 100)}\n\n"
        + "| Col | Value |\n|---|---|\n"
        + "\n".join(f"| row {i}.{j} | refund approved |" for j in range(i * 6))
        for i in range(1, 9)
    ]
    document = md("# Handbook\n\n" + "\n\n".join(sections))
    chunks = chunk(document)
    assert len(chunks) > 5
    assert max(count_word_pieces(c.text) for c in chunks) <= 222
    assert_chunk_invariants(document, chunks, target=10**9, overlap=200)
    assert any(c.start < p.end for p, c in pairwise(chunks))


# --- what the embedder reads --------------------------------------------------------------


def test_the_word_piece_budget_leaves_room_for_the_title_and_headings():
    assert MAX_CHUNK_WORD_PIECES + EMBEDDING_PREFIX_WORD_PIECES + 2 == EMBEDDER_WORD_PIECES
    assert count_word_pieces("Refunds take 14 days.") == 6  # ref ##unds take 14 days .


def test_no_chunk_exceeds_what_the_embedder_reads_whatever_its_lines():
    """A code line, a table row, a heading and a word each longer than the embedder reads."""
    long_line = "result = " + " + ".join(f"value_{i}" for i in range(150))
    row = "| " + " | ".join(f"cell {i} refund" for i in range(120)) + " |"
    blob = "QUJD" * 400  # base64: one 1,600-character word
    heading = "## " + " ".join(["Refund"] * 300)
    document = md(
        f"# Handbook\n\n```\nshort = 1\n{long_line}\n```\n\n| A | B |\n|---|---|\n{row}\n\n"
        f"Key: {blob}\n\n{heading}\n\nLast words."
    )
    chunks = chunk(document)
    assert max(count_word_pieces(c.text) for c in chunks) <= MAX_CHUNK_WORD_PIECES
    assert all(document.text[c.start : c.end] == c.text for c in chunks)
    covered = "".join(document.text[c.start : c.end] for c in chunks)
    for part in (long_line, row, blob, "Last words."):  # split, not truncated
        assert all(word in covered for word in part.split())
    assert any("short = 1" in c.text for c in chunks)


@settings(max_examples=100, deadline=None)
@given(
    markdown,
    st.lists(st.sampled_from(["value", "+", "=", "refund", "|", "x"]), min_size=1, max_size=90),
    st.integers(6, 30),
    st.integers(0, 20),
    st.integers(0, 60),
)
def test_max_tokens_is_never_exceeded_and_what_is_split_stays_covered(
    source: str, words: list[str], target: int, slack: int, overlap: int
):
    overlap = min(overlap, target * 4 - 1)
    line = " ".join(words)
    document = md(f"{source}\n\n```\n{line}\n{line}\n```\n\n| {line} |\n|---|\n| {line} |")
    limit = target + slack
    chunks = chunk(
        document,
        target_tokens=target,
        overlap=overlap,
        count_tokens=count_words,
        max_tokens=limit,
    )
    assert all(count_words(c.text) <= limit for c in chunks)
    text, covered = document.text, bytearray(len(document.text))
    for index, c in enumerate(chunks):
        assert text[c.start : c.end] == c.text and c.index == index
        assert index == 0 or (c.start > chunks[index - 1].start and c.end > chunks[index - 1].end)
        covered[c.start : c.end] = b"\x01" * (c.end - c.start)
    assert all(covered[i] or text[i].isspace() for i in range(len(text)))


def test_a_target_over_the_embedders_limit_is_a_config_error():
    with pytest.raises(ConfigError, match=r"target_tokens=300, max_tokens=222.*256 word pieces"):
        chunk(md("text"), target_tokens=300)
    with pytest.raises(ConfigError, match=r"target_tokens=50, max_tokens=40\)"):
        chunk(md("text"), target_tokens=50, count_tokens=count_words, max_tokens=40)
    assert chunk(md("text"), target_tokens=300, count_tokens=count_words)  # no limit: yours


def test_every_chunk_carries_its_documents_title():
    document = md("# Refund handbook\n\n" + "\n\n".join(prose(4, i * 4) for i in range(6)))
    chunks = chunk(document, target_tokens=30, overlap=0, count_tokens=count_words)
    assert len(chunks) > 2
    assert {c.metadata["title"] for c in chunks} == {"Refund handbook"}
    untitled = chunk(load_bytes(b"No title here.", source="n.txt"))
    assert "title" not in untitled[0].metadata


def test_an_empty_document_has_no_chunks():
    assert chunk(load_bytes(b"  \n\n ", source="e.txt")) == []


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        ({"target_tokens": 0}, r"target_tokens=0\): it must be at least 1"),
        ({"overlap": -1}, r"overlap=-1\): it must be 0"),
        ({"target_tokens": 50, "overlap": 200}, r"overlap=200\).*well under 200"),
    ],
)
def test_arguments_out_of_range_are_config_errors(arguments: dict[str, int], message: str):
    with pytest.raises(ConfigError, match=message):
        chunk(md("text"), **arguments)


def test_the_same_file_at_two_paths_gets_ids_of_its_own() -> None:
    data = b"# Returns\n\nItems can be returned within 30 days."
    here, there = load_bytes(data, source="a.md"), load_bytes(data, source="copies/a.md")
    assert here.content_hash == there.content_hash
    ours, theirs = chunk(here), chunk(there)
    assert {c.id for c in ours}.isdisjoint({c.id for c in theirs})
    assert [c.id for c in chunk(here)] == [c.id for c in ours]  # and stable
