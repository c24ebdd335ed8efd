"""One app contract for every entry point: what `MODULE:NAME` may name, and how it is opened.

`handrail serve`, `handrail worker`, `handrail run`, `handrail chat`, `handrail eval`,
`app_from_env` and `create_app(lifespan=...)` all open an application the same way, with
`open_app`, inside the event loop that will run it. `MODULE:NAME` may name:

- an `Engine`;
- a function returning one (`def app() -> Engine`);
- a coroutine function returning one (`async def app() -> Engine`), for an app that must
  await something to be built;
- an async context-manager function, for an app that owns async resources (an MCP session,
  a connection pool, a vector-store client): its body runs before the first request, and
  its exit on shutdown (SIGTERM or SIGINT for a server or a worker; after the last scenario
  for an eval):

```python
@asynccontextmanager
async def app() -> AsyncIterator[Engine]:
    async with MCPToolset(command="python", args=["-m", "my_fs_server"], prefix="fs") as fs:
        yield Engine(Agent("ops", tools=[*await fs.tools(), restart]), store=store)
```

A function may also return an async context manager (or an awaitable of an `Engine`). Anything
else is a `UserError` naming what was found and what is accepted.
"""

from __future__ import annotations

import contextlib
import importlib
import inspect
import os
import sys
import sysconfig
import traceback
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, TypeAlias

from .engine import Engine
from .exceptions import UserError

__all__ = ["AppTarget", "import_app", "open_app"]

AppTarget: TypeAlias = (
    "Engine | Callable[[], Engine] | Callable[[], Awaitable[Engine]] "
    "| Callable[[], contextlib.AbstractAsyncContextManager[Engine]]"
)
"""What `MODULE:NAME` may name (see the module's docstring)."""

_ACCEPTED = (
    "an Engine, a function or coroutine function returning one, or an async context-manager "
    "function yielding one (@asynccontextmanager async def app(): ... yield Engine(...))"
)


def import_app(target: str) -> Any:
    """The object `MODULE:NAME` names, imported as `python -m` would (the cwd on the path).

    `NAME` may be dotted (`myapp:apps.support`).

    Raises:
        UserError: the name is not `MODULE:NAME`, the module cannot be imported (its error
            is told in one line, with the line of the application's code that raised it; the
            traceback is the error's `__cause__`), or it has no such attribute.
    """
    module_name, _, attribute = target.partition(":")
    if not module_name or not attribute:
        raise UserError(f"{target!r} is not MODULE:NAME (e.g. myapp:engine or myapp:app).")
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as error:
        if error.name and module_name.startswith(error.name):
            raise UserError(
                f"Cannot import {module_name!r}: no such module (run from the folder that "
                f"holds it, or install it)."
            ) from None
        raise UserError(f"Importing {module_name!r} failed: {_told(error)}") from error
    except Exception as error:  # the app's own module failed as it was imported
        raise UserError(f"Importing {module_name!r} failed: {_told(error)}") from error
    found: Any = module
    for part in attribute.split("."):
        found = getattr(found, part, _MISSING)
        if found is _MISSING:
            raise UserError(f"Module {module_name!r} has no attribute {attribute!r}.")
    return found


_MISSING = object()


@contextlib.asynccontextmanager
async def open_app(target: str | Any) -> AsyncIterator[Engine]:
    """Open the app `target` names (or is), in the running event loop; close it on exit.

    Args:
        target: `MODULE:NAME`, or the object itself (see the module's docstring).

    Yields:
        The engine. When `target` is an async context manager (function), its exit runs
        when this context exits, with the exception that ended it, if any.

    Raises:
        UserError: the target cannot be imported, or is (or returns) something else than
            what is accepted; the message names what was found.
    """
    where = target if isinstance(target, str) else repr(target)
    found = import_app(target) if isinstance(target, str) else target
    if isinstance(found, Engine):
        yield found
        return
    if not callable(found):
        raise UserError(f"{where} is a {type(found).__name__}; it must be {_ACCEPTED}.")
    if inspect.isasyncgenfunction(found):  # an @asynccontextmanager forgotten: the same body
        found = contextlib.asynccontextmanager(found)
    try:
        made = found()
        if inspect.isawaitable(made):
            made = await made
    except UserError:
        raise  # handrail's own errors name what to fix (and an app opened within an app)
    except Exception as error:
        raise _failed(where, error) from error
    if isinstance(made, contextlib.AbstractAsyncContextManager) or (
        hasattr(made, "__aenter__") and hasattr(made, "__aexit__")
    ):
        async with _entered(made, where) as engine:
            _check(engine, where, "yielded")
            yield engine
        return
    _check(made, where, "returned")
    yield made


@contextlib.asynccontextmanager
async def _entered(manager: Any, where: str) -> AsyncIterator[Any]:
    """`async with manager`, a failure to enter it told as the app's (`_failed`)."""
    try:
        engine = await manager.__aenter__()
    except UserError:
        raise
    except Exception as error:
        raise _failed(where, error) from error
    try:
        yield engine
    except BaseException as error:
        if not await manager.__aexit__(type(error), error, error.__traceback__):
            raise
    else:
        await manager.__aexit__(None, None, None)


def _failed(where: str, error: Exception) -> UserError:
    """The error of an app whose factory (or the body before its `yield`) raised `error`.

    One line a terminal can print: what was raised and the line of the application's code
    that raised it (the whole traceback stays on the error's `__cause__`, for a log).
    """
    told = _told(error)
    if isinstance(error, RuntimeError) and "running event loop" in str(error):
        told += (
            ". An application is opened inside the entry point's event loop: make its factory "
            "`async def` (or an @asynccontextmanager) and await what it needs, instead of "
            "asyncio.run"
        )
    return UserError(f"{where} could not be opened: {told}")


def _told(error: BaseException) -> str:
    """`Type: message (file, line N)`: the error and the line of the app that raised it."""
    message = f"{type(error).__name__}: {error}" if str(error) else type(error).__name__
    if isinstance(error, SyntaxError) and error.filename:
        return f"{type(error).__name__}: {error.msg} ({error.filename}, line {error.lineno})"
    place = _place(error)
    return f"{message} ({place})" if place else message


_OURS = os.path.dirname(os.path.abspath(__file__))
_LIBRARIES = tuple(
    os.path.abspath(p)
    for p in {sysconfig.get_paths()[k] for k in ("stdlib", "platstdlib", "purelib", "platlib")}
)


def _place(error: BaseException) -> str | None:
    """Where `error` was raised in the application's code, as `file, line N`.

    Its deepest frame outside handrail, the standard library and installed packages (else its
    deepest frame).
    """
    frames = traceback.extract_tb(error.__traceback__)
    for frame in reversed(frames):
        path = os.path.abspath(frame.filename)
        if frame.filename.startswith("<") or path.startswith(_OURS):
            continue
        if not path.startswith(_LIBRARIES):
            return f"{frame.filename}, line {frame.lineno}"
    for frame in reversed(frames):
        if not frame.filename.startswith("<"):
            return f"{frame.filename}, line {frame.lineno}"
    return None


def _check(engine: object, where: str, verb: str) -> None:
    if not isinstance(engine, Engine):
        raise UserError(
            f"{where} {verb} a {type(engine).__name__}, not a handrail Engine; it must be "
            f"{_ACCEPTED}."
        )
