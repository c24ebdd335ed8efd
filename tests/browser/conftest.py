"""The web page in Debian's chromium (Playwright): real uvicorn servers on free ports.

Each server runs in a thread with its own event loop; the engines use the scripted support
desk (and a small clerk domain for batches and questions), so every run is the same. When
chromium or Playwright is missing, every browser test is skipped and the run ends with a
line that says so.
"""

from __future__ import annotations

import asyncio
import os
import re
import shutil
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import uvicorn

from handrail import Engine
from handrail.server import ApiKeyAuthenticator, Caller, create_app

CHROMIUM = shutil.which("chromium")
ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
ROOT = Path(__file__).resolve().parents[2]
ARTIFACTS = Path(os.environ.get("HANDRAIL_SCREENSHOTS") or ROOT / "test-artifacts" / "browser")
"""Where the screenshots go: `HANDRAIL_SCREENSHOTS`, else test-artifacts/browser/."""
AXE = ROOT / "js" / "node_modules" / "axe-core" / "axe.min.js"
"""axe-core, pinned in js/package.json (`npm ci --prefix js`)."""
KEYS = {
    "key-ana": Caller("acme", "ana"),
    "key-bob": Caller("globex", "bob"),
    "key-bo": Caller("acme", "bo", frozenset({"it-admin"})),
    "key-cy": Caller("acme", "cy", frozenset({"it-admin"})),
    "key-di": Caller("acme", "di", frozenset({"auditor"})),
}

try:
    from playwright.sync_api import Browser, Page, expect, sync_playwright
except ImportError:  # pragma: no cover - the dev extra installs it
    sync_playwright = None
else:
    # Waits, not assertions on time: generous, for a loaded CI machine.
    expect.set_options(timeout=15_000)

MISSING = (
    "chromium is not installed (apt-get install -y chromium)"
    if CHROMIUM is None
    else "playwright is not installed (pip install -e '.[dev]')"
    if sync_playwright is None
    else None
)
_skipped: list[str] = []


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark every test here `browser`, and skip them all (loudly) without a browser."""
    here = Path(__file__).parent
    for item in items:
        if here in Path(str(item.path)).parents:
            item.add_marker(pytest.mark.browser)
            if MISSING is not None:
                item.add_marker(pytest.mark.skip(reason=f"BROWSER TESTS SKIPPED: {MISSING}"))
                _skipped.append(item.nodeid)


def pytest_terminal_summary(terminalreporter: Any) -> None:
    """Say it in capitals when the browser tests did not run."""
    if _skipped:
        terminalreporter.write_sep(
            "!", f"{len(_skipped)} BROWSER TESTS SKIPPED: {MISSING}", red=True, bold=True
        )


@dataclass
class Served:
    """A running server: its base URL and its engine."""

    url: str
    engine: Engine


class _Thread:
    """uvicorn serving `app` in a thread, on 127.0.0.1 at a free port."""

    def __init__(self, app: Any) -> None:
        config = uvicorn.Config(
            app, host="127.0.0.1", port=0, log_level="warning", lifespan="on", ws="none"
        )
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=lambda: asyncio.run(self.server.serve()))

    def __enter__(self) -> str:
        self.thread.start()
        while not self.server.started:  # uvicorn offers nothing to wait on
            if not self.thread.is_alive():
                raise RuntimeError("uvicorn did not start")
            self.thread.join(0.01)
        (port,) = {s.getsockname()[1] for srv in self.server.servers for s in srv.sockets}
        return f"http://127.0.0.1:{port}"

    def __exit__(self, *exc: object) -> None:
        self.server.should_exit = True
        self.thread.join(10)


@pytest.fixture
def serve() -> Iterator[Callable[[Engine], Served]]:
    """Start a server for an engine (stopped after the test)."""
    running: list[_Thread] = []

    def start(engine: Engine) -> Served:
        app = create_app(
            engine,
            authenticator=ApiKeyAuthenticator(KEYS),
            poll_interval=0.2,
            ping_interval=5.0,
            shutdown_grace=1.0,
        )
        thread = _Thread(app)
        running.append(thread)
        return Served(thread.__enter__(), engine)

    yield start
    for thread in running:
        thread.__exit__()


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    """One headless chromium a module.

    Not one a session: Playwright's sync API keeps an event loop running in this thread
    while it is open, and the async tests of other modules need the thread to have none.
    """
    assert sync_playwright is not None and CHROMIUM is not None
    with sync_playwright() as playwright:
        launched = playwright.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        yield launched
        launched.close()


@pytest.fixture
def new_page(browser: Browser) -> Iterator[Callable[..., Page]]:
    """Open a page in a fresh context (its own storage: another person's browser)."""
    contexts = []

    def open_page(**options: Any) -> Page:
        context = browser.new_context(**options)
        context.set_default_timeout(15_000)
        contexts.append(context)
        return context.new_page()

    yield open_page
    for context in contexts:
        context.close()


@pytest.fixture
def shoot(request: pytest.FixtureRequest) -> Callable[[Page, str], Path]:
    """Save a screenshot of `page` as test-artifacts/browser/<test>-<state>.png."""
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    test = re.sub(r"[^A-Za-z0-9_-]+", "-", request.node.name).removeprefix("test_")

    def take(page: Page, state: str) -> Path:
        path = ARTIFACTS / f"{test}-{state}.png"
        page.screenshot(path=str(path), full_page=True)
        return path

    return take


@pytest.fixture
def axe() -> Callable[[Page], list[str]]:
    """Run axe-core on a page: its serious and critical violations, one line each.

    axe is evaluated in the page through the DevTools protocol (the page's CSP allows no
    script but its own).
    """
    if not AXE.is_file():
        pytest.skip(f"AXE-CORE IS NOT INSTALLED ({AXE}): npm ci --prefix js")
    source = AXE.read_text()

    def check(page: Page) -> list[str]:
        if not page.evaluate("() => typeof window.axe === 'object'"):
            page.evaluate(source)
        violations = page.evaluate(
            """async () => (await axe.run(document, {resultTypes: ["violations"]})).violations
                .filter((v) => v.impact === "serious" || v.impact === "critical")
                .map((v) => `${v.impact} ${v.id}: ${v.help} `
                     + `(${v.nodes.map((n) => n.target.join(" ")).join(", ")})`)"""
        )
        return list(violations)

    return check
