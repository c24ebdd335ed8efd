"""`handrail docs`: the ingest command, through typer's test runner (real embedder and index)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from handrail.documents._cli import DEFAULT_INDEX, docs_app
from handrail.documents._library import Library

from .test_library import SUPPORTED, write_folder


def lines(text: str) -> list[str]:
    """The table's rows as (label, value) words, borders aside."""
    return [" ".join(line.strip(" │┃|").replace("│", " ").split()) for line in text.splitlines()]


def test_ingest_prints_a_summary_with_counts_and_skipped_reasons(tmp_path: Path):
    docs = write_folder(tmp_path / "docs")
    index = tmp_path / "index"
    result = CliRunner().invoke(docs_app, ["ingest", str(docs), "--index", str(index)])

    assert result.exit_code == 0, result.output
    rows = lines(result.stdout)
    assert "files 6" in rows
    assert "ingested 4" in rows
    assert "unchanged 0" in rows
    assert "deleted 0" in rows
    assert "skipped 2" in rows
    assert any(row.startswith("chunks written ") for row in rows)
    assert any(row.startswith("time ") and row.endswith(" s") for row in rows)
    assert "skipped broken.pdf: is not a readable PDF" in result.stdout
    assert "skipped prices.xlsx: unsupported suffix '.xlsx'" in result.stdout

    async def sources() -> list[str]:
        async with Library.open(index) as library:
            return list(await library.index.sources())

    assert asyncio.run(sources()) == SUPPORTED

    again = CliRunner().invoke(docs_app, ["ingest", str(docs), "--index", str(index)])
    assert again.exit_code == 0, again.output
    assert "unchanged 4" in lines(again.stdout)
    assert "chunks written 0" in lines(again.stdout)


def test_ingest_uses_the_default_index_under_the_working_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "faq.md").write_text("# FAQ\n\nOpening hours are nine to five.", encoding="utf-8")
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(docs_app, ["ingest", "docs", "--collection", "faq"])

    assert result.exit_code == 0, result.output
    assert "ingested 1" in lines(result.stdout)
    assert (tmp_path / DEFAULT_INDEX).is_dir()


def test_ingest_of_a_missing_folder_fails_in_one_line(tmp_path: Path):
    missing = tmp_path / "nowhere"
    result = CliRunner().invoke(docs_app, ["ingest", str(missing), "--index", str(tmp_path)])

    assert result.exit_code == 1
    assert result.stdout == ""
    assert (
        result.stderr
        == f"error: {missing} does not exist: pass the folder that holds the documents.\n"
    )


def test_ingest_of_a_file_instead_of_a_folder_fails(tmp_path: Path):
    path = tmp_path / "notes.md"
    path.write_text("# Notes", encoding="utf-8")
    result = CliRunner().invoke(docs_app, ["ingest", str(path), "--index", str(tmp_path / "i")])

    assert result.exit_code == 1
    assert "is not a folder" in result.stderr


def test_docs_is_a_group_of_commands():
    result = CliRunner().invoke(docs_app, ["--help"])
    assert result.exit_code == 0
    assert "ingest" in result.stdout


POLICIES = Path(__file__).parents[2] / "src" / "handrail" / "demo" / "policies"


def test_ask_prints_the_answer_its_citations_and_confidence_or_why_it_escalates(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    monkeypatch.delenv("HANDRAIL_MODEL", raising=False)
    index = ["--index", str(tmp_path / "index")]
    assert CliRunner().invoke(docs_app, ["ingest", str(POLICIES), *index]).exit_code == 0

    answered = CliRunner().invoke(docs_app, ["ask", "How much is express shipping?", *index])
    assert answered.exit_code == 0, answered.output
    assert "costs 12.50 euros" in answered.stdout
    assert "[1] shipping.pdf, page 1 (relevance " in answered.stdout
    assert "confidence " in answered.stdout

    escalated = CliRunner().invoke(docs_app, ["ask", "Do you price-match other shops?", *index])
    assert escalated.exit_code == 0, escalated.output
    assert "Escalate to a person: " in escalated.stdout

    as_json = CliRunner().invoke(
        docs_app, ["ask", "What happens if my parcel is lost?", "--json", *index]
    )
    assert as_json.exit_code == 0, as_json.output
    reply = json.loads(as_json.stdout)
    assert reply["escalated"] is False
    assert (reply["citations"][0]["source"], reply["citations"][0]["page"]) == ("shipping.pdf", 3)

    # Without --model it says, every time, that the answer is the offline model's.
    assert "offline extractive model" in answered.stderr
    assert "--model" in answered.stderr
    assert (reply["model"], reply["offline_model"]) == ("extractive (offline)", True)

    # A collection nobody ingested into is refused, not answered from nothing.
    other = CliRunner().invoke(docs_app, ["ask", "Refunds?", *index, "--collection", "typo"])
    assert other.exit_code == 1
    assert other.stdout == ""
    assert "holds no documents in collection 'typo'" in other.stderr
    assert "handrail docs ingest" in other.stderr


def test_ask_names_a_model_that_cannot_be_used(tmp_path: Path):
    result = CliRunner().invoke(
        docs_app, ["ask", "Anything?", "--index", str(tmp_path / "i"), "--model", "nope:x"]
    )
    assert result.exit_code == 1
    assert result.stderr.startswith("error: ")


def test_ask_with_a_mistyped_index_refuses_and_creates_nothing(tmp_path: Path):
    typo = tmp_path / "idnex"
    result = CliRunner().invoke(
        docs_app, ["ask", "How long do refunds take?", "--index", str(typo)]
    )

    assert result.exit_code == 1
    assert result.stdout == ""
    assert result.stderr == (
        f"error: no index at {typo} (the folder does not exist): check --index, or run "
        f"`handrail docs ingest FOLDER --index {typo}` first.\n"
    )
    assert not typo.exists()


def test_ask_in_a_folder_that_is_no_index_refuses_and_leaves_it_alone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(docs_app, ["ask", "Anything?"])  # the default index
    assert result.exit_code == 1
    assert f"no index at {DEFAULT_INDEX}" in result.stderr
    assert "run `handrail docs ingest FOLDER` first" in result.stderr
    assert not (tmp_path / DEFAULT_INDEX).exists()

    folder = tmp_path / "notes"
    folder.mkdir()
    result = CliRunner().invoke(docs_app, ["ask", "Anything?", "--index", str(folder)])
    assert result.exit_code == 1
    assert f"{folder} holds no index (no chroma.sqlite3 in it)" in result.stderr
    assert list(folder.iterdir()) == []
