"""The public surface: every `__all__` is importable, sorted and complete (as httpx's test)."""

from __future__ import annotations

import functools
import importlib
import pkgutil
import sys
import types
from typing import Any

import pytest

import handrail
import handrail.documents
import handrail.evals
import handrail.mcp
import handrail.server
import handrail.testing
import handrail.tools

PACKAGES = [
    handrail,
    handrail.documents,
    handrail.evals,
    handrail.mcp,
    handrail.server,
    handrail.testing,
    handrail.tools,
]


def isort_order(name: str) -> tuple[int, str]:
    """The order of ruff's RUF022 (which the project's lint enforces): CONSTANTS, Classes, rest.

    Plain `sorted()` would put `Agent` before `EVENT`, and ruff would then reject the list.
    """
    if name.isupper():
        return 0, name
    if name[:1].isupper():
        return 1, name
    return 2, name


@functools.cache
def handrail_exports() -> list[tuple[str, Any]]:
    """Every `(name, object)` that some handrail module lists in its `__all__`."""
    for info in pkgutil.walk_packages(handrail.__path__, "handrail."):
        if info.name not in sys.modules:
            try:
                importlib.import_module(info.name)
            except ImportError:  # a plug-in whose optional dependency is not installed
                continue
    exports = []
    for name, module in list(sys.modules.items()):
        if name == "handrail" or name.startswith("handrail."):
            exports += [(n, getattr(module, n)) for n in getattr(module, "__all__", ())]
    return exports


def defined_in_handrail(name: str, value: Any) -> bool:
    """Whether `value` is handrail's own, not something a module imported from elsewhere.

    Classes and functions say where they were defined; instances and type aliases
    (`MESSAGES`, `Part`, `Approval`) count when a handrail module exports them.
    """
    module = getattr(value, "__module__", None)
    if isinstance(module, str) and (module == "handrail" or module.startswith("handrail.")):
        return True
    return any(n == name and v is value for n, v in handrail_exports())


def public_members(package: types.ModuleType) -> list[str]:
    # `dir`, not `vars`: a name loaded lazily (a module `__getattr__`) counts before its load.
    members = {name: getattr(package, name) for name in dir(package)}
    return sorted(
        (
            name
            for name, value in members.items()
            if not name.startswith("_")
            and not isinstance(value, types.ModuleType)
            and defined_in_handrail(name, value)
        ),
        key=isort_order,
    )


@pytest.mark.parametrize("package", PACKAGES, ids=lambda p: p.__name__)
def test_every_exported_name_is_importable(package: types.ModuleType):
    for name in package.__all__:
        namespace: dict[str, Any] = {}
        exec(f"from {package.__name__} import {name}", namespace)
        assert namespace[name] is getattr(package, name)


@pytest.mark.parametrize("package", PACKAGES, ids=lambda p: p.__name__)
def test_all_is_sorted_without_duplicates(package: types.ModuleType):
    assert package.__all__ == sorted(set(package.__all__), key=isort_order)


@pytest.mark.parametrize("package", PACKAGES, ids=lambda p: p.__name__)
def test_all_lists_every_public_member(package: types.ModuleType):
    listed = [name for name in package.__all__ if not name.startswith("_")]
    assert listed == public_members(package)


def test_the_version_is_exported():
    assert "__version__" in handrail.__all__
    assert isinstance(handrail.__version__, str)
