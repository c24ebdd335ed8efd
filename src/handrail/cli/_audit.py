"""`handrail audit`: list, export (JSON lines), anchor and verify an organisation's trail."""

from __future__ import annotations

import json
import sys
from collections.abc import AsyncIterator
from typing import Annotated, Any

import typer
from rich.table import Table

from ..audit import (
    AUDIT_KEY_ENV,
    AUDIT_OLD_KEYS_ENV,
    AuditAnchor,
    AuditEntry,
    AuditKey,
    AuditKind,
    AuditVerifier,
    entry_hash,
    keyring_from_env,
)
from ..store import SessionStore
from ._common import CliError, one_line_errors, out, run, when
from ._open import opened, with_store
from ._options import STORE_FILE, AsJson, Db, Dsn, Schema

__all__ = [
    "anchor_audit",
    "audit",
    "audit_all",
    "export_audit",
    "keygen_audit",
    "list_audit",
    "verify_audit",
]

audit = typer.Typer(
    help="List, export (JSON lines), anchor and verify an organisation's audit trail.",
    no_args_is_help=True,
)

Org = Annotated[
    str,
    typer.Option(help="The organisation whose trail it is ('': sessions without one)."),
]
After = Annotated[int, typer.Option(min=0, help="Only entries after this one.")]
_PAGE = 1000


async def _audit_pages(
    store: SessionStore, org_id: str | None, *, after: int = 0, **filters: Any
) -> AsyncIterator[list[AuditEntry]]:
    """The organisation's entries after `after`, a page at a time (one page in memory)."""
    while page := await store.audit(org_id, after=after, limit=_PAGE, **filters):
        yield page
        if len(page) < _PAGE:
            return
        after = page[-1].seq


async def audit_all(
    store: SessionStore,
    org_id: str | None,
    *,
    after: int = 0,
    limit: int | None = None,
    **filters: Any,
) -> list[AuditEntry]:
    """The organisation's entries after `after` (at most `limit`), read in pages."""
    found: list[AuditEntry] = []
    while limit is None or len(found) < limit:
        size = _PAGE if limit is None else min(_PAGE, limit - len(found))
        page = await store.audit(org_id, after=after, limit=size, **filters)
        found += page
        if len(page) < size:
            break
        after = page[-1].seq
    return found


async def _last_entry(store: SessionStore, org_id: str | None) -> AuditEntry | None:
    """The trail's last entry, found in a few reads (doubling, then halving `after`)."""
    if not await store.audit(org_id, limit=1):
        return None
    low, high = 0, 1  # an entry lies after `low`; find a `high` with none after it
    while await store.audit(org_id, after=high, limit=1):
        low, high = high, high * 2
    while high - low > 1:
        middle = (low + high) // 2
        if await store.audit(org_id, after=middle, limit=1):
            low = middle
        else:
            high = middle
    (last,) = await store.audit(org_id, after=low, limit=1)
    return last


def _keyring() -> dict[str, bytes]:
    """The keyring of HANDRAIL_AUDIT_KEY and HANDRAIL_AUDIT_OLD_KEYS (never the command line)."""
    keys = keyring_from_env()
    if not keys:
        typer.echo(
            f"Note: {AUDIT_KEY_ENV} is not set: keyed entries cannot be checked, and an unkeyed "
            f"trail proves nothing against someone who can write the store (docs/audit.md).",
            err=True,
        )
    return keys


@audit.command("list")
@one_line_errors
def list_audit(
    org: Org,
    db: Db = STORE_FILE,
    dsn: Dsn = None,
    schema: Schema = "public",
    session: Annotated[str | None, typer.Option(help="Only this session's entries.")] = None,
    tool: Annotated[str | None, typer.Option(help="Only this tool's entries.")] = None,
    kind: Annotated[AuditKind | None, typer.Option(help="Only decisions, or only calls.")] = None,
    after: After = 0,
    limit: Annotated[int, typer.Option(min=1, help="At most this many.")] = 50,
    as_json: AsJson = False,
) -> None:
    """An organisation's audit entries, oldest first."""
    found = with_store(
        db,
        dsn,
        schema,
        lambda store: audit_all(
            store, org or None, after=after, limit=limit, session_id=session, tool=tool,
            kind=kind,
        ),
    )  # fmt: skip
    if as_json:
        typer.echo(json.dumps([e.to_json() for e in found], indent=2))
        return
    table = Table("seq", "when (UTC)", "kind", "session", "tool", "who", "what")
    for e in found:
        what = e.decision if e.kind == "decision" else e.outcome
        if e.card is not None and e.card != "approval":
            what = f"{what} ({e.card} card)"  # a reject on a recovery card: its retry skipped
        if e.amended_after:
            what = f"{what} (amended {', '.join(e.amended_after)})"
        table.add_row(str(e.seq), when(e.at), e.kind, e.session_id, e.tool, e.who or "", what or "")
    out.print(table if found else "No audit entries.")


@audit.command("export")
@one_line_errors
def export_audit(
    org: Org,
    db: Db = STORE_FILE,
    dsn: Dsn = None,
    schema: Schema = "public",
    after: After = 0,
) -> None:
    """An organisation's whole audit trail as JSON lines (one entry a line), oldest first.

    Written a page at a time as it is read: a trail of any length in the memory of a page.
    """

    async def export(store: SessionStore) -> None:
        out = sys.stdout
        async for page in _audit_pages(store, org or None, after=after):
            out.write("".join(json.dumps(e.to_json(), ensure_ascii=False) + "\n" for e in page))
        out.flush()

    run(opened(db, dsn, schema, export))


@audit.command("anchor")
@one_line_errors
def anchor_audit(
    org: Org,
    db: Db = STORE_FILE,
    dsn: Dsn = None,
    schema: Schema = "public",
) -> None:
    """Print the trail's last entry as SEQ:HASH: an anchor, to keep away from the store.

    `handrail audit verify --anchor SEQ:HASH` then finds the entries up to it deleted or
    rewritten. With the entry's key in HANDRAIL_AUDIT_KEY (or _OLD_KEYS), the entry is
    checked first: a forged last entry is never anchored.
    """
    last = with_store(db, dsn, schema, lambda store: _last_entry(store, org or None))
    if last is not None:
        keys = keyring_from_env()
        secret = keys.get(last.key_id) if last.key_id is not None else None
        if last.key_id is None:
            typer.echo(
                f"Note: entry {last.seq} is unkeyed: its anchor finds deleted entries, but not "
                f"a trail rewritten by someone who can write the store ({AUDIT_KEY_ENV}).",
                err=True,
            )
        elif secret is None:
            typer.echo(
                f"Note: entry {last.seq} was made with key {last.key_id!r}, which is not in "
                f"{AUDIT_KEY_ENV} or {AUDIT_OLD_KEYS_ENV}: it was not checked.",
                err=True,
            )
        elif entry_hash(last, secret) != last.hash:
            raise CliError(
                f"The last entry of {org!r} ({last.seq}) does not authenticate under key "
                f"{last.key_id!r}: it is not anchored. Run `handrail audit verify --org {org}`."
            )
    typer.echo(str(AuditAnchor.of(last)))


@audit.command("verify")
@one_line_errors
def verify_audit(
    org: Org,
    db: Db = STORE_FILE,
    dsn: Dsn = None,
    schema: Schema = "public",
    anchor: Annotated[
        str | None,
        typer.Option(
            help="SEQ:HASH from `handrail audit anchor`, kept away from the store: the entries "
            "up to it must be there, unchanged (finds a deleted tail)."
        ),
    ] = None,
    strict: Annotated[
        bool,
        typer.Option("--strict", help="Fail on unkeyed entries too (a trail keyed throughout)."),
    ] = False,
) -> None:
    """Check the organisation's trail: exit 1 naming the first broken entry, if any.

    The keys come from HANDRAIL_AUDIT_KEY and HANDRAIL_AUDIT_OLD_KEYS (never the command
    line). Unkeyed entries (written before the store had a key) are reported, and pass
    unless --strict.
    """
    pinned = AuditAnchor.parse(anchor) if anchor is not None else None
    verifier = AuditVerifier(keys=_keyring(), anchor=pinned)

    async def check(store: SessionStore) -> None:
        async for page in _audit_pages(store, org or None):
            verifier.feed(page)

    with_store(db, dsn, schema, check)
    problems = verifier.problems()
    errors = [p for p in problems if strict or p.severity == "error"]
    for problem in problems:
        label = problem.kind if problem in errors else f"{problem.kind} (warning)"
        typer.echo(f"entry {problem.seq}: {label}: {problem.message}", err=True)
    if errors:
        raise CliError(
            f"The audit trail of {org!r} is broken at entry {errors[0].seq} "
            f"({errors[0].kind}); {len(errors)} problem(s)."
        )
    unkeyed = verifier.count - verifier.keyed
    typer.echo(
        f"{verifier.count} entries verified ({verifier.keyed} keyed, {unkeyed} unkeyed)"
        f"{f', up to the anchor {pinned.seq}' if pinned is not None and pinned.seq else ''}; "
        f"the last is {verifier.last} (an anchor: keep it away from the store)."
    )


@audit.command("keygen")
@one_line_errors
def keygen_audit(
    key_id: Annotated[
        str, typer.Option("--id", help="The key's id, recorded in every entry (2026-11, say).")
    ],
) -> None:
    """Print a new audit key as ID:SECRET, for HANDRAIL_AUDIT_KEY (keep it secret)."""
    typer.echo(AuditKey.generate(key_id).spec())
