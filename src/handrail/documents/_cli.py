"""`handrail docs`: the documents from the command line.

```
handrail docs ingest policies/                        # into .handrail/documents
handrail docs ingest policies/ --index /srv/index --collection support
handrail docs ask "How long do refunds take?" --model openai:gpt-4o-mini
handrail docs ask "How long do refunds take?" --json   # for scripts
```

`ask` prints the answer, its citations (source, page, quote, relevance) and its confidence,
or that it escalates and why; `--json` prints the whole `DocumentAnswer`, with `model` (the
model's name) and `offline_model` (true for the extractive model) beside its fields. Without
`--model` (or `HANDRAIL_MODEL`) it answers with the offline extractive model
(`handrail.documents.testing.extractive_model`): it quotes the best-matching sentence, so
it shows what retrieval finds, not what a real model would write; a line on stderr says so.
`ask` never creates an index: a missing `--index` folder, one that holds no index, or an
empty collection is an `error: ...` naming the path and `handrail docs ingest`.

`ingest` shows a progress bar on stderr (bytes of the folder's files, moving as a big file's
chunks are embedded, and the files handled), then a summary table: files seen, ingested,
unchanged, deleted, chunks written and in the index, skipped files, and the time taken; then
one `skipped SOURCE: REASON` line for each skipped file. Skipped files do not fail the
command (they are reported); a folder that does not exist, or an index that cannot be used,
is one `error: ...` line on stderr and exit status 1.

Importing this module needs only typer and rich: the documents extra (numpy, the embedder,
Chroma) is imported when a command runs, and a missing one is reported as a one-line error
naming `pip install "handrail[documents]"`. A command goes in as a function of `docs_app`,
opening its library with `_open_library` and reporting failures with `_fail`.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, NoReturn

import typer
from rich.console import Console
from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn
from rich.table import Table

from ..exceptions import DocumentIndexError, HandrailError

if TYPE_CHECKING:
    from ._answer import DocumentAnswer
    from ._library import IngestProgress, IngestReport, Library

__all__ = ["DEFAULT_INDEX", "docs_app"]

DEFAULT_INDEX = Path(".handrail") / "documents"
"""Where the index lives unless `--index` says otherwise (relative to the working folder)."""
OFFLINE_MODEL = "extractive (offline)"
"""The name `ask --json` gives the offline extractive model, used without `--model`."""
_CHROMA_FILE = "chroma.sqlite3"
"""The file an embedded Chroma keeps in its folder: without it, a folder is no index."""

docs_app = typer.Typer(
    name="docs",
    help="Ingest documents and ask questions of them.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

IndexPath = Annotated[
    Path | None,
    typer.Option(
        "--index",
        help="The index's folder (ingest creates it if missing). Default: .handrail/documents "
        "in the working folder.",
        show_default=False,
    ),
]
Collection = Annotated[
    str, typer.Option(help="The collection in the index, to keep several libraries apart.")
]


@docs_app.callback()
def _docs() -> None:
    """Ingest documents and ask questions of them."""  # a group, even with one command


def _open_library(index: Path | None, collection: str) -> Library:
    """The library at `index` (or the default folder), for a command.

    Raises:
        ImportError: the documents extra is missing (the message names it).
    """
    # Here, so `handrail --help` needs neither numpy nor Chroma; through the package, whose
    # lazy import names the extra when it is missing.
    from . import Library

    return Library.open(index if index is not None else DEFAULT_INDEX, collection=collection)


def _fail(message: object) -> NoReturn:
    """Report a failure in one line on stderr and exit with status 1."""
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(1)


@docs_app.command()
def ingest(
    folder: Annotated[Path, typer.Argument(help="The folder of documents (read recursively).")],
    index: IndexPath = None,
    collection: Collection = "handrail",
) -> None:
    """Bring the index in line with a folder: embed new and changed files, drop removed ones."""
    if not folder.is_dir():
        what = "is not a folder" if folder.exists() else "does not exist"
        _fail(f"{folder} {what}: pass the folder that holds the documents.")
    try:
        report = asyncio.run(_ingest(folder, index, collection))
    except (HandrailError, ImportError, OSError) as error:
        _fail(error)
    out = Console(highlight=False)
    out.print(_summary(report))
    for source, reason in report.skipped:
        out.print(f"skipped {source}: {reason}", markup=False, soft_wrap=True)


async def _ingest(folder: Path, index: Path | None, collection: str) -> IngestReport:
    with Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        DownloadColumn(),
        TextColumn("{task.fields[files]}"),
        TextColumn("{task.fields[source]}", style="dim"),
        console=Console(stderr=True),
        transient=True,
    ) as bar:
        task = bar.add_task("ingest", total=None, source="", files="")

        def advance(step: IngestProgress) -> None:
            bar.update(
                task,
                total=step.bytes_total or None,
                completed=step.bytes_done,
                files=f"{step.done}/{step.total} files",
                source=step.source,
            )

        async with _open_library(index, collection) as library:
            return await library.ingest(folder, progress=advance)


def _summary(report: IngestReport) -> Table:
    table = Table(title="handrail docs ingest", title_justify="left", show_header=False)
    table.add_column("what")
    table.add_column("count", justify="right")
    table.add_row("files", str(report.files))
    table.add_row("ingested", str(report.ingested))
    table.add_row("unchanged", str(report.unchanged))
    table.add_row("deleted", str(report.deleted))
    table.add_row("chunks written", str(report.chunks_written))
    table.add_row("chunks in the index", str(report.chunks_total))
    table.add_row("skipped", str(len(report.skipped)), style="yellow" if report.skipped else "")
    table.add_row("time", f"{report.seconds:.1f} s")
    return table


@docs_app.command()
def ask(
    question: Annotated[str, typer.Argument(help="The question.")],
    index: IndexPath = None,
    collection: Collection = "handrail",
    model: Annotated[
        str | None,
        typer.Option(
            help="The model that answers (e.g. openai:gpt-4o-mini). Default: HANDRAIL_MODEL, "
            "else the offline extractive model.",
            envvar="HANDRAIL_MODEL",
            show_default=False,
        ),
    ] = None,
    top_k: Annotated[int, typer.Option(help="Excerpts given to the model, at most.", min=1)] = 5,
    min_relevance: Annotated[
        float, typer.Option(help="Excerpts below this relevance (0-1) are not used.", min=0, max=1)
    ] = 0.5,
    escalate_below: Annotated[
        float, typer.Option(help="Escalate below this confidence (0-1).", min=0, max=1)
    ] = 0.3,
    as_json: Annotated[bool, typer.Option("--json", help="Print the answer as JSON.")] = False,
) -> None:
    """Answer a question from the indexed documents, with citations and a confidence."""
    folder = index if index is not None else DEFAULT_INDEX
    _check_index(folder, given=index is not None)
    try:
        reply = asyncio.run(
            _ask(question, folder, collection, model, top_k, min_relevance, escalate_below)
        )
    except (HandrailError, ImportError, OSError) as error:
        _fail(error)
    if as_json:
        fields = {
            **reply.model_dump(mode="json"),
            "model": model if model is not None else OFFLINE_MODEL,
            "offline_model": model is None,
        }
        typer.echo(json.dumps(fields, indent=2, ensure_ascii=False))
        return
    out = Console(highlight=False)
    if model is None:
        Console(stderr=True, highlight=False).print(
            "Answered by the offline extractive model, which quotes the best-matching "
            "sentence: pass --model (or set HANDRAIL_MODEL) for a real model's answer.",
            style="yellow",
            soft_wrap=True,
        )
    if reply.escalated:
        out.print(f"[yellow]Escalate to a person:[/yellow] {reply.escalation_reason}")
        if reply.answer:
            out.print(f"(the model's draft: {reply.answer})", markup=False, soft_wrap=True)
    else:
        out.print(reply.answer, markup=False, soft_wrap=True)
    for number, citation in enumerate(reply.citations, 1):
        where = citation.source + (f", page {citation.page}" if citation.page else "")
        out.print(
            f'  [{number}] {where} (relevance {citation.relevance:.2f}): "{citation.quote}"',
            markup=False,
            soft_wrap=True,
        )
    out.print(f"confidence {reply.confidence:.2f}", style="dim")


def _check_index(where: Path, *, given: bool) -> None:
    """Fail unless `where` holds an index: asking must never create an empty one."""
    option = f" --index {where}" if given else ""
    fix = f"run `handrail docs ingest FOLDER{option}` first"
    if not where.exists():
        flag = "check --index, or " if given else ""
        _fail(f"no index at {where} (the folder does not exist): {flag}{fix}.")
    if not (where / _CHROMA_FILE).is_file():
        _fail(f"{where} holds no index (no {_CHROMA_FILE} in it): check the path, or {fix}.")


async def _ask(
    question: str,
    index: Path,
    collection: str,
    model: str | None,
    top_k: int,
    min_relevance: float,
    escalate_below: float,
) -> DocumentAnswer:
    from ._answer import Answerer
    from .testing import extractive_model

    async with _open_library(index, collection) as library:
        if not await library.index.count():
            raise DocumentIndexError(
                f"the index at {index} holds no documents in collection {collection!r}: check "
                f"--collection, or run `handrail docs ingest FOLDER --index {index} "
                f"--collection {collection}` first."
            )
        answerer = Answerer(
            library,
            model if model is not None else extractive_model(),
            top_k=top_k,
            min_relevance=min_relevance,
            escalate_below=escalate_below,
        )
        return await answerer.answer(question)
