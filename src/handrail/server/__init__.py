"""The HTTP API: sessions, turns streamed as Server-Sent Events, decisions, auth.

```python
from handrail.server import ApiKeyAuthenticator, Caller, create_app

app = create_app(engine, authenticator=ApiKeyAuthenticator({key: Caller("acme", "ana")}))
serve(app, port=8000)  # or run `app` with any ASGI server
```

It needs the `server` extra: `pip install "handrail[server]"`. See docs/server.md.
"""

from __future__ import annotations

try:
    import starlette  # noqa: F401
    import uvicorn  # noqa: F401
except ImportError as error:  # pragma: no cover - exercised only without the extra
    from ..exceptions import MissingExtraError  # (here: not a member of this package)

    raise MissingExtraError(
        "handrail.server", needs="starlette and uvicorn", extra="server"
    ) from error

from ._app import create_app
from ._auth import (
    ApiKeyAuthenticator,
    ApiKeyFileAuthenticator,
    ApiKeySpec,
    Authenticator,
    Caller,
    reload_key_files,
)
from ._factory import (
    app_from_env,
    authenticator_from,
    configured_app,
    load_engine,
    name_worker,
    settings_authenticator,
)
from ._jwt import JwtAuthenticator
from ._limits import Limits
from ._serve import AppFactory, escape_logs, serve, serve_workers, server_config, tune_gc

__all__ = [
    "ApiKeyAuthenticator",
    "ApiKeyFileAuthenticator",
    "ApiKeySpec",
    "AppFactory",
    "Authenticator",
    "Caller",
    "JwtAuthenticator",
    "Limits",
    "app_from_env",
    "authenticator_from",
    "configured_app",
    "create_app",
    "escape_logs",
    "load_engine",
    "name_worker",
    "reload_key_files",
    "serve",
    "serve_workers",
    "server_config",
    "settings_authenticator",
    "tune_gc",
]
