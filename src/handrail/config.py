"""One configuration for every entry point: `Settings`, from flags, the environment, defaults.

`handrail serve`, `handrail worker`, `handrail run`, `handrail chat`, `handrail config` and
`app_from_env` read the same settings the same way: a command-line flag wins, then the
environment variable, then the default. Each value remembers where it came from, so
`handrail config` can say it, with the secrets masked (API keys, a DSN's password, the audit
key).

```python
settings = Settings.resolve({"sweep_interval": 0.5})  # flags given; None: not given
settings.sweep_interval, settings.source("sweep_interval")  # (0.5, "--sweep-interval")
```

The settings, their flags and variables are listed in docs/deploying.md ("One
configuration"); `handrail config` prints them. For an entry point of your own:

```python
settings = Settings.resolve({"worker_id": given_on_the_command_line})
store = settings.apply(engine)  # the store and worker id they name; None: the app's own
```

A malformed value raises `ConfigError` naming the flag or the variable and what it takes.
"""

from __future__ import annotations

import dataclasses
import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ._logs import LogFormat
from .exceptions import ConfigError
from .worker import name_worker

if TYPE_CHECKING:
    from .engine import Engine
    from .store import SessionStore

__all__ = ["DEFAULT", "LogFormat", "Setting", "Settings", "flag_help"]


DEFAULT = "default"
"""The source of a value nobody set."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Setting:
    """One setting as `handrail config` shows it."""

    name: str
    """Its name (a `Settings` field)."""
    value: Any
    """Its value, as the entry points use it (a secret one included: do not print it)."""
    source: str
    """Where it came from: the flag (`--db`), the environment variable, or `default`."""
    shown: str
    """The value as it may be printed: secrets masked."""
    flag: str | None
    """The command-line flag that sets it, if any."""
    env: str
    """The environment variable that sets it."""
    help: str
    """What it does, in one line."""


# -- parsing ----------------------------------------------------------------------------------


def _text(raw: str) -> str:
    return raw


def _path(raw: str) -> Path:
    if not raw.strip():
        raise ValueError("a file path")
    return Path(raw)


def _number(minimum: float, what: str) -> Callable[[str], float]:
    def parse(raw: str) -> float:
        value = float(raw)
        if not value >= minimum or value != value or value == float("inf"):
            raise ValueError(what)
        return value

    return parse


def _whole(minimum: int, what: str) -> Callable[[str], int]:
    def parse(raw: str) -> int:
        value = int(raw.strip())
        if value < minimum:
            raise ValueError(what)
        return value

    return parse


def _specs(raw: str) -> tuple[str, ...]:
    return tuple(raw.split())


def _roles(raw: str) -> frozenset[str] | None:
    if raw.strip() == "*":
        return None
    roles = frozenset(r.strip() for r in raw.split(",") if r.strip())
    if not roles:
        raise ValueError("roles")
    return roles


def _log_format(raw: str) -> str:
    if raw.strip().lower() not in ("text", "json"):
        raise ValueError("format")
    return raw.strip().lower()


def _log_level(raw: str) -> str:
    level = raw.strip().lower()
    if level not in ("critical", "error", "warning", "info", "debug", "trace"):
        raise ValueError("level")
    return level


@dataclass(frozen=True, slots=True)
class _Spec:
    """How one setting is read: its flag, its variable, how its text parses."""

    flag: str | None
    env: str
    parse: Callable[[str], Any]
    takes: str
    """What a valid value looks like, for the error."""
    help: str
    secret: bool = False


_SPECS: dict[str, _Spec] = {
    "db": _Spec("--db", "HANDRAIL_DB", _path, "a SQLite file's path",
                "The sessions' SQLite store (over the app's own)."),
    "dsn": _Spec("--dsn", "HANDRAIL_DSN", _text, "a PostgreSQL connection string",
                 "A PostgreSQL store's connection string (over the app's own; wins over db).",
                 secret=True),
    "schema": _Spec("--schema", "HANDRAIL_SCHEMA", _text, "a schema name",
                    "The PostgreSQL store's schema."),
    "api_keys": _Spec(None, "HANDRAIL_API_KEYS", _specs, "space-separated key specs",
                      "API key specs (ORG:USER:KEY, or id=...,org=...,user=...,roles=...,key=...); "
                      "never a flag, where every user of the machine reads it.", secret=True),
    "api_keys_file": _Spec("--api-keys-file", "HANDRAIL_API_KEYS_FILE", _path,
                           "a file of key specs, one a line",
                           "A file of API key specs, one a line, read again when it changes."),
    "worker_id": _Spec("--worker-id", "HANDRAIL_WORKER_ID", _text, "a name",
                       "This deployment's worker name in session leases (stable across "
                       "restarts); several processes each add their own -N."),
    "sweep_interval": _Spec("--sweep-interval", "HANDRAIL_SWEEP_INTERVAL",
                            _number(0, "seconds"), "seconds, 0 or more (0: no sweeps)",
                            "Seconds between sweeps: expired cards, turns whose worker died, "
                            "decided turns nobody resumed (0: none)."),
    "retention_days": _Spec("--retention-days", "HANDRAIL_RETENTION_DAYS",
                            _number(0, "days"), "days, 0 or more",
                            "Delete finished sessions nobody touched for this many days "
                            "(default: keep)."),
    "rate": _Spec("--rate", "HANDRAIL_RATE", _number(0, "rate"), "requests a second, 0 or more",
                  "Requests a second per key, on average (0: no limit)."),
    "burst": _Spec("--burst", "HANDRAIL_BURST", _whole(1, "burst"), "a whole number, 1 or more",
                   "Requests per key at once."),
    "streams": _Spec("--streams", "HANDRAIL_STREAMS", _whole(0, "streams"),
                     "a whole number, 0 or more", "Open event streams per organisation (0: no "
                     "limit)."),
    "turns": _Spec("--turns", "HANDRAIL_TURNS", _whole(0, "turns"), "a whole number, 0 or more",
                   "Running turns per organisation (0: no limit)."),
    "stream_bytes": _Spec("--stream-bytes", "HANDRAIL_STREAM_BYTES", _number(0, "bytes"),
                          "bytes a second, 0 or more",
                          "Bytes a second an organisation's event streams may send (0: no "
                          "limit)."),
    "max_body_size": _Spec("--max-body-size", "HANDRAIL_MAX_BODY_SIZE", _whole(1, "bytes"),
                           "bytes, 1 or more", "Bytes a request body may have."),
    "shutdown_grace": _Spec("--shutdown-grace", "HANDRAIL_SHUTDOWN_GRACE",
                            _number(0, "seconds"), "seconds, 0 or more",
                            "At shutdown, seconds running turns get to stop."),
    "poll_interval": _Spec("--poll-interval", "HANDRAIL_POLL_INTERVAL",
                           _number(0.01, "seconds"), "seconds, 0.01 or more",
                           "Seconds of quiet after which an event stream reads the log again "
                           "(default: 60 on PostgreSQL, 1 otherwise)."),
    "audit_roles": _Spec("--audit-roles", "HANDRAIL_AUDIT_ROLES", _roles,
                         "a role or more, comma-separated (auditor,compliance), or '*'",
                         "The roles that may read the audit trail over HTTP ('*': everyone "
                         "in the organisation)."),
    "log_format": _Spec("--log-format", "HANDRAIL_LOG_FORMAT", _log_format, "text or json",
                        "How log lines are written: text, or json (one object a line)."),
    "log_level": _Spec("--log-level", "HANDRAIL_LOG_LEVEL", _log_level,
                       "critical, error, warning, info, debug or trace", "The log level."),
}  # fmt: skip

_AUDIT_KEY_ENV = "HANDRAIL_AUDIT_KEY"  # the stores read it; shown here, never parsed twice


@dataclass(frozen=True, kw_only=True, slots=True)
class Settings:
    """The settings every entry point reads: `Settings.resolve(flags)`.

    Each field is the value in use; `source(name)` says where it came from. Picklable (sent
    to each process of `handrail serve --workers`).
    """

    db: Path | None = None
    """The SQLite store's file, over the app's own store (None: the app's)."""
    dsn: str | None = None
    """A PostgreSQL store's connection string, over the app's own (wins over `db`)."""
    schema: str = "public"
    """The PostgreSQL store's schema."""
    api_keys: tuple[str, ...] = ()
    """API key specs (`HANDRAIL_API_KEYS`, space-separated)."""
    api_keys_file: Path | None = None
    """A file of API key specs, one a line."""
    worker_id: str | None = None
    """The deployment's worker name (None: the host name); `worker_name` adds a suffix."""
    sweep_interval: float = 1.0
    """Seconds between sweeps (0: none)."""
    retention_days: float | None = None
    """Finished sessions untouched this many days are deleted by the sweeps (None: kept)."""
    rate: float = 50.0
    """Requests a second per key (0: no limit)."""
    burst: int = 100
    """Requests per key at once."""
    streams: int = 100
    """Open event streams per organisation (0: no limit)."""
    turns: int = 100
    """Running turns per organisation (0: no limit)."""
    stream_bytes: float = 4_000_000.0
    """Bytes a second an organisation's streams may send (0: no limit)."""
    max_body_size: int = 1_000_000
    """Bytes a request body may have."""
    shutdown_grace: float = 5.0
    """Seconds running turns get to stop at shutdown."""
    poll_interval: float | None = None
    """Seconds of quiet before a stream reads the log again (None: by store)."""
    audit_roles: frozenset[str] | None = frozenset({"auditor"})
    """The roles that may read the audit trail over HTTP (None: every member)."""
    log_format: LogFormat = "text"
    """How log lines are written."""
    log_level: str = "info"
    """The log level (uvicorn's names)."""
    sources: Mapping[str, str] = field(default_factory=dict)
    """Where each value came from (the flag, the variable); absent: the default."""

    @classmethod
    def resolve(
        cls, flags: Mapping[str, Any] | None = None, environ: Mapping[str, str] | None = None
    ) -> Settings:
        """The settings from `flags` (those given: None is not given), then `environ`.

        Args:
            flags: values from the command line, by field name (`{"sweep_interval": 0.5}`),
                already typed; None, or absent, means not given.
            environ: the environment (default: `os.environ`). An empty variable is unset.

        Raises:
            ConfigError: a value is malformed; the message names the flag or the variable
                and what it takes.
        """
        environ = os.environ if environ is None else environ
        flags = flags or {}
        unknown = sorted(set(flags) - set(_SPECS))
        if unknown:
            raise ConfigError(f"Settings.resolve: no setting {', '.join(unknown)}.")
        values: dict[str, Any] = {}
        sources: dict[str, str] = {}
        for name, spec in _SPECS.items():
            given = flags.get(name)
            if given is not None:
                value, source = _check_flag(name, spec, given), spec.flag or name
            elif raw := environ.get(spec.env, "").strip():
                try:
                    value = spec.parse(raw)
                except ValueError:
                    shown = "***" if spec.secret else repr(raw)
                    raise ConfigError(
                        f"{spec.env}={shown} is not valid: it takes {spec.takes} "
                        f"(unset it for the default)."
                    ) from None
                source = spec.env
            else:
                continue
            values[name], sources[name] = value, source
        return cls(**values, sources=sources)

    def source(self, name: str) -> str:
        """Where the value of `name` came from: its flag, its variable, or `default`."""
        if name not in _SPECS:
            raise KeyError(name)
        return self.sources.get(name, DEFAULT)

    # -- what the entry points make of them -------------------------------------------------

    @property
    def has_key_source(self) -> bool:
        """Whether API keys are configured (a variable or a file), keys in them or not."""
        return bool(self.api_keys) or self.api_keys_file is not None

    @property
    def retention(self) -> float | None:
        """`retention_days` in seconds (None: kept)."""
        return self.retention_days * 86_400 if self.retention_days else None

    def worker_name(self, suffix: str | int | None = None) -> str:
        """This process's worker id: `worker_id` (default: the host name), then `-suffix`."""
        import socket

        base = self.worker_id or socket.gethostname()
        return base if suffix is None else f"{base}-{suffix}"

    def store(self) -> SessionStore | None:
        """A store of `dsn` (PostgreSQL) or `db` (SQLite), not yet opened; None: neither set.

        The caller owns it (and closes it); without one, the app's own store is used.
        """
        if self.dsn:
            from .store import PostgresStore

            return PostgresStore(self.dsn, schema=self.schema)
        if self.db is not None:
            from .store import SqliteStore

            return SqliteStore(self.db)
        return None

    def apply(self, engine: Engine, *, suffix: str | int | None = None) -> SessionStore | None:
        """Give `engine` what these settings say: the store (if set), the worker id (if set).

        Returns:
            The store it was given, which the caller closes when done; None: its own kept.
        """
        store = self.store()
        if store is not None:
            engine.store = store
        if self.worker_id is not None or suffix is not None:
            name_worker(engine, self.worker_name(suffix))
        return store

    # -- showing them -----------------------------------------------------------------------

    def describe(self) -> list[Setting]:
        """Every setting with its source and its printable value (secrets masked)."""
        shown = [
            Setting(
                name=name,
                value=getattr(self, name),
                source=self.source(name),
                shown=_show(name, getattr(self, name)),
                flag=spec.flag,
                env=spec.env,
                help=spec.help,
            )
            for name, spec in _SPECS.items()
        ]
        audit = os.environ.get(_AUDIT_KEY_ENV, "").strip()
        shown.append(
            Setting(
                name="audit_key",
                value=audit or None,
                source=_AUDIT_KEY_ENV if audit else DEFAULT,
                shown=f"{audit.partition(':')[0]}:***" if audit else "none (an unkeyed trail)",
                flag=None,
                env=_AUDIT_KEY_ENV,
                help="The key that chains the audit trail (ID:SECRET; read by the stores).",
            )
        )
        return shown

    def to_json(self) -> dict[str, dict[str, Any]]:
        """`describe` as JSON: name -> {value (masked), source, flag, env}."""
        return {
            s.name: {"value": s.shown, "source": s.source, "flag": s.flag, "env": s.env}
            for s in self.describe()
        }

    def replace(self, **changes: Any) -> Settings:
        """A copy with `changes` (their sources kept as they were)."""
        return dataclasses.replace(self, **changes)


def flag_help(name: str) -> tuple[str | None, str]:
    """The flag of the setting `name`, and a help line naming its variable and default."""
    spec = _SPECS[name]
    default = _show(name, getattr(Settings(), name))
    return spec.flag, f"{spec.help} (env {spec.env}; default: {default})"


def _check_flag(name: str, spec: _Spec, given: Any) -> Any:
    """A flag's value, already typed by the command line, checked as a variable's would be."""
    if not isinstance(given, (str, int, float)) or isinstance(given, bool):
        return given  # a path, a set: typed and checked by the command line
    try:
        return spec.parse(str(given))
    except ValueError:
        raise ConfigError(
            f"{spec.flag or name} {given!r} is not valid: it takes {spec.takes}."
        ) from None


_PASSWORD = re.compile(r"(://[^:/@\s]*:)[^@\s]*(@)")
_DSN_PASSWORD = re.compile(r"(password\s*=\s*)(\S+)", re.IGNORECASE)


def _show(name: str, value: Any) -> str:
    """A value as it may be printed: keys as their ids and users, a DSN's password masked."""
    if value is None:
        return {
            "db": "the app's own store",
            "dsn": "the app's own store",
            "api_keys_file": "none",
            "worker_id": "the app's own (the host name-N for several processes)",
            "retention_days": "keep",
            "poll_interval": "60 on PostgreSQL, 1 otherwise",
            "audit_roles": "*",
        }.get(name, "none")
    if name == "dsn":
        return _DSN_PASSWORD.sub(r"\1***", _PASSWORD.sub(r"\1***\2", value))
    if name == "api_keys":
        return ", ".join(_key_label(spec) for spec in value) if value else "none"
    if isinstance(value, frozenset):
        return ",".join(sorted(value))
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


def _key_label(spec: str) -> str:
    """A key spec without its secret: `id=ID` or `ORG:USER:***`."""
    if "=" in spec:
        fields = dict(part.partition("=")[::2] for part in spec.split(","))
        label = ",".join(f"{k}={v}" for k, v in fields.items() if k in ("id", "org", "user"))
        return f"{label},key=***"
    org, _, rest = spec.partition(":")
    user = rest.partition(":")[0]
    return f"{org}:{user}:***"
