"""Development corpora nobody on the project wrote: product manuals Debian ships as HTML.

`python -m bench.corpora fetch [NAME ...]` brings each corpus into a cache folder and prints
where; `corpus_path(name)` does the same from code (the documents bench and the eval suites
under evals/documents/<name>/ use it). The manuals come from Debian's own archive (a package
registry, the only network this project uses), pinned by package version and SHA-256, and
a fixed list of pages is taken from each, so every run and every machine reads the same text.

- `git`: the Git manual (git-doc): its user manual, its concept pages (gittutorial,
  gitglossary, gitrevisions...) and the man pages of the everyday commands. AsciiDoc HTML.
  GPL-2.0 (the package's copyright file is kept beside the pages). Tuning corpus.
- `python`: the Python 3.11 documentation (python3.11-doc): the tutorial, the HOWTOs, the
  FAQ, "Python setup and usage" and the pages of forty everyday library modules. Sphinx HTML.
  PSF licence. Reporting corpus: nothing is fitted to it.

The PostgreSQL manual is deliberately not here: it is the project's held-out check.

The cache is `$HANDRAIL_CORPORA` or `~/.cache/handrail/corpora`; a corpus is fetched once.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
QUESTIONS = ROOT / "evals" / "documents"


@dataclass(frozen=True)
class Corpus:
    name: str
    package: str
    version: str
    sha256: str
    root: str  # the folder inside the package that the pages are relative to
    pages: tuple[str, ...]
    licence: str  # the copyright file inside the package, copied beside the pages

    @property
    def questions(self) -> Path:
        return QUESTIONS / self.name / "questions.yaml"


_GIT_CONCEPTS = [
    "user-manual",
    "gitattributes",
    "gitcli",
    "gitcore-tutorial",
    "gitcredentials",
    "giteveryday",
    "gitfaq",
    "gitglossary",
    "githooks",
    "gitignore",
    "gitmailmap",
    "gitmodules",
    "gitnamespaces",
    "gitrepository-layout",
    "gitrevisions",
    "gitsubmodules",
    "gittutorial",
    "gittutorial-2",
    "gitworkflows",
    "gitcvs-migration",
    "gitdiffcore",
    "gitremote-helpers",
]
_GIT_COMMANDS = [
    "add",
    "am",
    "apply",
    "archive",
    "bisect",
    "blame",
    "branch",
    "bundle",
    "checkout",
    "cherry-pick",
    "clean",
    "clone",
    "commit",
    "config",
    "describe",
    "diff",
    "fetch",
    "format-patch",
    "gc",
    "grep",
    "init",
    "log",
    "maintenance",
    "merge",
    "mv",
    "notes",
    "pull",
    "push",
    "range-diff",
    "rebase",
    "reflog",
    "remote",
    "reset",
    "restore",
    "revert",
    "rm",
    "shortlog",
    "show",
    "sparse-checkout",
    "stash",
    "status",
    "submodule",
    "switch",
    "tag",
    "worktree",
]

_PY = "tutorial howto faq using"
_PY_LIBRARY = [
    "pathlib",
    "os",
    "os.path",
    "shutil",
    "tempfile",
    "glob",
    "json",
    "csv",
    "sqlite3",
    "datetime",
    "time",
    "zoneinfo",
    "re",
    "string",
    "logging",
    "argparse",
    "subprocess",
    "asyncio-task",
    "asyncio-subprocess",
    "collections",
    "itertools",
    "functools",
    "typing",
    "dataclasses",
    "enum",
    "contextlib",
    "unittest",
    "venv",
    "zipfile",
    "tarfile",
    "pickle",
    "urllib.request",
    "http.server",
    "threading",
    "concurrent.futures",
    "multiprocessing",
    "random",
    "statistics",
    "decimal",
]

CORPORA: dict[str, Corpus] = {
    "git": Corpus(
        name="git",
        package="git-doc",
        version="1:2.39.5-0+deb12u3",
        sha256="3c89668a11053a6bafade3de1f611f4613db31e082af63f43d8c5b69ad8795ec",
        root="usr/share/doc/git-doc",
        pages=tuple(
            [f"{page}.html" for page in _GIT_CONCEPTS]
            + [f"git-{command}.html" for command in _GIT_COMMANDS]
        ),
        licence="usr/share/doc/git-doc/copyright",
    ),
    "python": Corpus(
        name="python",
        package="python3.11-doc",
        version="3.11.2-6+deb12u9",
        sha256="5b3594189d6ef9a6963ce0347fd307a1cc67620ad697e144db366070e2e146be",
        root="usr/share/doc/python3.11/html",
        pages=tuple(
            [f"{folder}/*.html" for folder in _PY.split()]
            + [f"library/{module}.html" for module in _PY_LIBRARY]
        ),
        licence="usr/share/doc/python3.11-doc/copyright",
    ),
}


def cache_root() -> Path:
    return Path(os.environ.get("HANDRAIL_CORPORA") or Path.home() / ".cache/handrail/corpora")


def corpus_path(name: str) -> Path:
    """The folder holding corpus `name`'s pages, fetched from Debian's archive if need be."""
    corpus = CORPORA[name]
    target = cache_root() / f"{name}-{corpus.version.replace(':', '_')}"
    if (target / ".complete").exists():
        return target
    with tempfile.TemporaryDirectory() as scratch:
        work = Path(scratch)
        deb = _download(corpus, work)
        subprocess.run(["dpkg-deb", "-x", str(deb), str(work / "x")], check=True)
        source = work / "x" / corpus.root
        if target.exists():
            shutil.rmtree(target)
        target.mkdir(parents=True)
        for pattern in corpus.pages:
            matches = sorted(source.glob(pattern))
            if not matches:
                raise SystemExit(f"{corpus.package}: no page matches {pattern!r}")
            for page in matches:
                out = target / page.relative_to(source)
                out.parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(page, out)
        shutil.copyfile(work / "x" / corpus.licence, target / ".COPYRIGHT")
        (target / ".complete").write_text(f"{corpus.package} {corpus.version}\n")
    return target


def _download(corpus: Corpus, work: Path) -> Path:
    spec = f"{corpus.package}={corpus.version}"
    try:
        subprocess.run(
            ["apt-get", "download", "-q", spec],
            cwd=work,
            check=True,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
    except (OSError, subprocess.CalledProcessError) as error:
        detail = getattr(error, "stderr", "") or str(error)
        raise SystemExit(
            f"could not fetch {spec} from Debian's archive ({detail.strip()}); run "
            f"`apt-get update` and try again"
        ) from None
    (deb,) = work.glob(f"{corpus.package}_*.deb")
    digest = hashlib.sha256(deb.read_bytes()).hexdigest()
    if digest != corpus.sha256:
        raise SystemExit(f"{deb.name}: SHA-256 {digest}, expected {corpus.sha256}")
    return deb


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.corpora", description=__doc__)
    parser.add_argument("command", choices=["fetch"])
    parser.add_argument("names", nargs="*", metavar="NAME", help=", ".join(sorted(CORPORA)))
    args = parser.parse_args(argv)
    for name in args.names or sorted(CORPORA):
        if name not in CORPORA:
            parser.error(f"no corpus {name!r}; there are: {', '.join(sorted(CORPORA))}")
        path = corpus_path(name)
        pages = sum(1 for p in path.rglob("*.html"))
        print(f"{name}: {pages} pages in {path}")


if __name__ == "__main__":
    main(sys.argv[1:])
