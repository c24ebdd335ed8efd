"""Every ```python block of the README and docs/ runs, in order, one namespace per page."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
BLOCK = re.compile(r"^```python\n(.*?)^```", re.S | re.M)


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_examples_run(page: Path) -> None:
    namespace: dict[str, object] = {"__name__": f"docs_{page.stem}"}
    for number, match in enumerate(BLOCK.finditer(page.read_text()), 1):
        line = page.read_text()[: match.start()].count("\n") + 2
        code = compile(
            match.group(1), f"{page.name}:{line} (block {number})", "exec", dont_inherit=True
        )
        exec(code, namespace)
