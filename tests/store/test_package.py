"""`handrail.store`'s public surface: sorted, complete, and the plug-ins loaded lazily."""

from __future__ import annotations

import subprocess
import sys

import handrail.store
from handrail import MemoryStore, SessionRecord, SessionStore


def isort_order(
    name: str,
) -> tuple[int, str]:  # ruff's RUF022 order, as tests/test_exported_members
    return (0 if name.isupper() else 1 if name[:1].isupper() else 2), name


def test_all_is_sorted_and_lists_every_public_name() -> None:
    for name in handrail.store.__all__:
        getattr(handrail.store, name)  # loads SqliteStore and PostgresStore
    public = [
        name
        for name, value in vars(handrail.store).items()
        if not name.startswith("_")
        and getattr(value, "__module__", "").startswith("handrail.")
        and name not in ("annotations",)
    ]
    assert handrail.store.__all__ == sorted(set(handrail.store.__all__), key=isort_order)
    assert set(public) <= set(handrail.store.__all__)


def test_the_root_package_exports_the_same_objects() -> None:
    assert handrail.store.MemoryStore is MemoryStore
    assert handrail.store.SessionRecord is SessionRecord
    assert handrail.store.SessionStore is SessionStore


def test_importing_handrail_does_not_import_psycopg() -> None:
    code = "import sys, handrail, handrail.store; print('psycopg' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_the_stores_are_exported_from_the_root_lazily() -> None:
    code = (
        "import sys, handrail\n"
        "lazy = {'PostgresStore', 'SqliteStore'}\n"
        "assert lazy <= set(handrail.__all__) and lazy <= set(dir(handrail))\n"
        "assert 'psycopg' not in sys.modules and 'handrail.store.sqlite' not in sys.modules\n"
        "from handrail import PostgresStore, SqliteStore\n"
        "import handrail.store\n"
        "assert PostgresStore is handrail.store.PostgresStore\n"
        "assert SqliteStore is handrail.store.SqliteStore\n"
        "print('psycopg' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "True"  # loaded when asked for, not before


def test_postgres_store_without_psycopg_names_the_extra() -> None:
    code = (
        "import sys\n"
        "sys.modules['psycopg'] = None  # as if handrail[postgres] were not installed\n"
        "from handrail import *  # every exported name resolves all the same\n"
        "from handrail import ConfigError, MissingExtraError, PostgresStore\n"
        "try:\n"
        "    PostgresStore('postgresql://localhost/db')\n"
        "except MissingExtraError as error:\n"
        "    assert isinstance(error, ConfigError) and isinstance(error, ImportError)\n"
        "    assert error.extra == 'postgres'\n"
        "    print(error)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == (
        'PostgresStore needs psycopg and psycopg-pool: pip install "handrail[postgres]"'
    )
