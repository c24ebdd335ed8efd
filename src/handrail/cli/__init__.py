"""The `handrail` command: serve an engine over HTTP, and look after stored sessions.

```
HANDRAIL_API_KEYS="acme:ana:$KEY" handrail serve myapp:engine --port 8000
handrail config myapp:engine --json      # the settings in effect, with their sources
handrail worker myapp:app --dsn postgresql://... --worker-id "$HOSTNAME"
handrail run myapp:app "Reorder what runs low" --org acme --user cron --headless --propose
handrail sessions list --db handrail.db --json
handrail sessions show SESSION_ID
handrail sessions export SESSION_ID > session.json
handrail sessions import session.json --overwrite
handrail sessions delete SESSION_ID --yes
handrail audit verify --org acme --anchor 41:9f2c...
```

It needs the `server` extra (`pip install "handrail[server]"`). An error prints one line and
exits with status 1 (`handrail run` has more exit codes: docs/scheduling.md).

A module a command (or group): `_serve`, `_config`, `_chat` (with `_chat_view`), `_worker`,
`_run`, `_sessions`, `_audit`; `handrail eval` and `handrail docs` live with what they run
(`handrail.evals._cli`, `handrail.documents._cli`). What they share is written once: the
options (`_options`), opening the app and the store (`_open`), one-line errors, the consoles
and the help's look (`_common`). This module puts them together, in the help's order.
"""

from __future__ import annotations

from ..exceptions import MissingExtraError

try:
    import rich  # noqa: F401
    import typer
except ImportError as error:  # pragma: no cover - exercised only without the extra
    raise MissingExtraError(
        "The handrail command", needs="typer and rich", extra="server"
    ) from error

from ..documents._cli import docs_app
from ..evals._cli import eval_command
from ._audit import audit
from ._chat import chat
from ._common import Group
from ._config import config_command
from ._run import run_turn
from ._serve import serve
from ._sessions import sessions
from ._worker import worker

__all__ = ["app"]

app = typer.Typer(
    name="handrail",
    help="Serve a handrail engine over HTTP, and look after its stored sessions.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    cls=Group,
)
app.add_typer(sessions, name="sessions")
app.add_typer(audit, name="audit")
app.add_typer(docs_app, name="docs")
app.command("eval")(eval_command)
app.command()(serve)
app.command("config")(config_command)
app.command()(chat)
app.command()(worker)
app.command("run")(run_turn)
