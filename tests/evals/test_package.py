"""handrail.evals' public surface, and what it says when pyyaml is missing."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

import handrail.evals
from handrail.evals import SuiteError, load_suite


def isort_order(name: str) -> tuple[int, str]:
    return (0 if name.isupper() else 1 if name[:1].isupper() else 2), name


def test_all_is_sorted_importable_and_complete() -> None:
    names = handrail.evals.__all__
    assert names == sorted(set(names), key=isort_order)
    for name in names:
        assert getattr(handrail.evals, name) is not None
    public = [
        name
        for name, value in vars(handrail.evals).items()
        if not name.startswith("_")
        and getattr(value, "__module__", "").startswith("handrail.evals")
    ]
    assert sorted(public, key=isort_order) == names


def test_a_yaml_suite_without_pyyaml_names_the_extra(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    suite = tmp_path / "s.yaml"
    suite.write_text("scenarios: []\n")
    monkeypatch.setitem(sys.modules, "yaml", None)
    with pytest.raises(SuiteError) as raised:
        load_suite(suite)
    assert str(raised.value) == (
        f'{suite}: reading YAML needs pyyaml: pip install "handrail[evals]"'
    )
