"""`python -m bench.loaders NAME=FOLDER ...`: what the loaders and the chunker make of manuals.

For each folder of HTML pages (read recursively), loads and chunks every page with the
defaults (`load`, `chunk`) and prints:

- chunks, and those whose text carries page furniture: Prev/Next/Up/Home navigation, Sphinx
  `¶` permalinks, sidebar and footer lines, asciidoc's "Last updated" footer, DocBook's
  navigation footer row ("Chapter 6 ... | | Chapter 8 ..."), "Table of Contents";
- pages whose first chunk's heading path does not start with a heading named in the page's
  `<title>` (index and download pages, whose `<title>` differs from their `<h1>`, count);
- chunks longer than all-MiniLM-L6-v2 reads (256 word pieces, its two markers included):
  the text alone, the text as `Library` embeds it today, and the text after a 32-piece
  title and heading prefix.

The patterns also match real prose now and then ("the previous ... the next ..."), so
compare numbers before and after a change rather than reading them as exact. Debian ships
manuals to try: `apt-get download git-doc python3.11-doc debian-reference-en libpam-doc`,
then `dpkg-deb -x PACKAGE.deb x` (never the project's held-out PostgreSQL manual).
"""

from __future__ import annotations

import html
import re
import sys
import time
from pathlib import Path

from handrail.documents import chunk, load
from handrail.documents._chunker import _word_pieces
from handrail.documents._library import _embedding_text

PATTERNS = {
    "prev/next/up/home": re.compile(
        r"\b(Prev|Previous|previous)\b.{0,200}?\b(Next|next|Up|Home)\b"
        r"|\b(Next|next)\b.{0,200}?\b(Prev|previous|Up|Home)\b",
        re.S,
    ),
    "pilcrow ¶": re.compile("¶"),
    "sphinx sidebar/related/footer": re.compile(
        r"Quick search|Show Source|Report a Bug|index \| modules|Navigation\b"
        r"|Python Software Foundation is a non-profit|Last updated on|Created using"
    ),
    "asciidoc footer 'Last updated'": re.compile(r"Last updated\s+\d{4}"),
    "docbook nav row (Chapter x |  | Chapter y)": re.compile(
        r"^(Chapter|Appendix|Preface|Part|\d+(\.\d+)*\.)[^\n|]*\|\s*(Home|Up)?\s*\|", re.M
    ),
    "table of contents": re.compile(r"Table of Contents"),
}
PREFIX = 32


def pieces(text: str) -> int:
    """Word pieces with the two markers, as the embedder counts them."""
    return len(_word_pieces().encode(text).ids)


def measure(name: str, folder: Path) -> None:
    began = time.perf_counter()
    total = navigation = pages = off_heading = 0
    over = {"text": 0, "embedded": 0, "with prefix": 0}
    hits = dict.fromkeys(PATTERNS, 0)
    for path in sorted(p for p in folder.rglob("*") if p.suffix in (".html", ".htm")):
        document = load(path)
        chunks = chunk(document)
        if not chunks:
            continue
        pages += 1
        found = re.search(r"<title>(.*?)</title>", path.read_text(errors="replace"), re.S | re.I)
        title = html.unescape(" ".join(found.group(1).split())) if found else ""
        first = chunks[0].headings
        if any(b.kind == "heading" for b in document.blocks) and not (
            first and (first[0].rstrip("¶") in title or title in first[0])
        ):
            off_heading += 1
        for piece in chunks:
            total += 1
            size = pieces(piece.text)
            over["text"] += size > 256
            over["embedded"] += pieces(_embedding_text(piece)) > 256
            over["with prefix"] += size + PREFIX > 256
            matched = [key for key, pattern in PATTERNS.items() if pattern.search(piece.text)]
            for key in matched:
                hits[key] += 1
            navigation += bool(matched)
    print(
        f"{name}: {pages} pages, {total} chunks, {navigation} with navigation text; "
        f"{off_heading} pages whose first chunk's heading path is not the page's heading; "
        f"{time.perf_counter() - began:.0f} s"
    )
    print("    over 256 word pieces: " + ", ".join(f"{v} ({k})" for k, v in over.items()))
    for key, count in hits.items():
        if count:
            print(f"    {key}: {count}")


def main(arguments: list[str]) -> None:
    if not arguments or any("=" not in argument for argument in arguments):
        raise SystemExit("usage: python -m bench.loaders NAME=FOLDER [NAME=FOLDER ...]")
    for argument in arguments:
        name, _, folder = argument.partition("=")
        measure(name, Path(folder))


if __name__ == "__main__":
    main(sys.argv[1:])
