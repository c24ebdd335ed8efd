from __future__ import annotations

from itertools import pairwise

import pytest
from fpdf import FPDF
from hypothesis import given, settings
from hypothesis import strategies as st

from handrail.documents import Document
from handrail.documents._chunker import chunk, chunk_prefix
from handrail.documents._loaders import load_bytes
from handrail.exceptions import ConfigError
from handrail.tokens import count_text

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


def test_the_default_tokenizer_keeps_chunks_within_200_tokens():
    sections = [
        f"## Section {i}\n\n{prose(5 + i * 4, start=i * 100)}\n\n"
        + "| Col | Value |\n|---|---|\n"
        + "\n".join(f"| row {i}.{j} | refund approved |" for j in range(i * 6))
        for i in range(1, 9)
    ]
    document = md("# Handbook\n\n" + "\n\n".join(sections))
    chunks = chunk(document)
    assert len(chunks) > 5
    assert max(count_text(c.text, "openai:gpt-4o") for c in chunks) <= 200
    assert_chunk_invariants(document, chunks, target=10**9, overlap=200)
    assert any(c.start < p.end for p, c in pairwise(chunks))


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
