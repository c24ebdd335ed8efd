"""KeywordIndex: BM25 with English stemming and stopwords."""

from __future__ import annotations

import threading

import pytest

from handrail.documents._keyword import KeywordIndex
from handrail.documents._types import Chunk


def chunk(index: int, text: str) -> Chunk:
    return Chunk(id=f"c{index}", source="faq.md", text=text, index=index, start=0, end=len(text))


CORPUS = [
    chunk(0, "Orders are refunded within 14 days of the return arriving."),
    chunk(1, "The office cat is named Tom."),
    chunk(2, "Refund requests need the order number. Refund requests are answered by email."),
    chunk(3, "Shipping to Canada takes 5-7 business days."),
    chunk(4, "of the and to is"),  # stopwords only
    chunk(5, "Error SKU-4471 means the warehouse has no stock."),
]


@pytest.fixture(scope="module")
def keywords() -> KeywordIndex:
    return KeywordIndex.build(CORPUS)


def ids(hits: list[tuple[str, float]]) -> list[str]:
    return [chunk_id for chunk_id, _ in hits]


def test_a_word_finds_its_other_forms(keywords: KeywordIndex) -> None:
    hits = keywords.search("refunds", k=10)

    assert ids(hits) == ["c2", "c0"]  # c2 says "refund" twice
    assert hits[0][1] > hits[1][1] > 0


def test_stemming_works_from_either_side(keywords: KeywordIndex) -> None:
    assert sorted(ids(keywords.search("refunding orders", k=10))) == ["c0", "c2"]
    assert "c1" in ids(keywords.search("cats", k=10))


def test_a_query_of_stopwords_only_finds_nothing(keywords: KeywordIndex) -> None:
    assert keywords.search("the and of to is", k=5) == []
    assert keywords.search("", k=5) == []
    assert keywords.search("?! -- ...", k=5) == []


def test_words_no_chunk_has_find_nothing(keywords: KeywordIndex) -> None:
    assert keywords.search("zebra giraffe", k=5) == []


def test_unknown_words_do_not_hide_known_ones(keywords: KeywordIndex) -> None:
    assert ids(keywords.search("zebra shipping", k=5)) == ["c3"]


def test_codes_and_numbers_are_words(keywords: KeywordIndex) -> None:
    assert ids(keywords.search("4471", k=5)) == ["c5"]
    assert ids(keywords.search("sku", k=5)) == ["c5"]


def test_search_returns_at_most_k_best_first(keywords: KeywordIndex) -> None:
    everything = keywords.search("refund order cat shipping stock", k=10)
    top_two = keywords.search("refund order cat shipping stock", k=2)

    assert top_two == everything[:2]
    scores = [score for _, score in everything]
    assert scores == sorted(scores, reverse=True)
    assert keywords.search("refund", k=0) == []


def test_equal_scores_keep_build_order() -> None:
    same = KeywordIndex.build([chunk(i, "identical refund text") for i in range(5)])

    assert ids(same.search("refund", k=3)) == ["c0", "c1", "c2"]


def test_an_empty_corpus_finds_nothing() -> None:
    empty = KeywordIndex.build([])

    assert len(empty) == 0
    assert empty.search("refund", k=5) == []


def test_a_corpus_of_stopwords_only_finds_nothing() -> None:
    stop = KeywordIndex.build([chunk(0, "the and of"), chunk(1, "")])

    assert len(stop) == 2
    assert stop.search("the", k=5) == []
    assert stop.search("refund", k=5) == []


def test_search_is_safe_from_several_threads(keywords: KeywordIndex) -> None:
    expected = keywords.search("refunds orders", k=5)
    results: list[list[tuple[str, float]]] = []

    def search() -> None:
        for _ in range(200):
            results.append(keywords.search("refunds orders", k=5))

    threads = [threading.Thread(target=search) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()

    assert len(results) == 800
    assert all(result == expected for result in results)
