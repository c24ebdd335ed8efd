"""ToolResult: what the model reads and what the UI shows."""

from __future__ import annotations

from handrail import ToolResult


def test_the_model_reads_markdown_when_there_is_some():
    result = ToolResult(data={"id": "A1"}, markdown="**A1** shipped", summary="A1: shipped")
    assert result.model_text() == "**A1** shipped"


def test_otherwise_the_model_reads_compact_json_of_the_data():
    assert (
        ToolResult(data={"id": "A1", "items": [1, 2]}).model_text() == '{"id":"A1","items":[1,2]}'
    )
    assert ToolResult(data=None).model_text() == "null"


def test_text_data_is_read_as_is():
    assert ToolResult(data="30 days").model_text() == "30 days"


def test_a_failure_reads_as_an_error_and_shows_as_its_summary():
    failed = ToolResult.failure("order A9 not found")
    assert (failed.ok, failed.error, failed.summary) == (False, "order A9 not found", failed.error)
    assert failed.model_text() == "Error: order A9 not found"
