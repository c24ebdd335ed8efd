"""Reading suites and agent configurations from files, with errors that say where.

A YAML file is parsed with pyyaml (the `evals` extra) and validated as a `Suite`; a `.py`
file is imported and its `suite` attribute (a `Suite`, or a function returning one) used.
Whatever is wrong comes back as ONE `SuiteError` naming the file, the scenario and the field
of every problem: one line for one problem (`suite.yaml: scenario 'refund':
expect.max_model_calls: Input should be a valid integer`), a line a problem under
`suite.yaml: 3 problems:` for several.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

from ..agent import Agent
from ..apps import import_app
from ..engine import Domain
from ..exceptions import ConfigError, UserError
from ._suite import Suite

__all__ = [
    "SuiteError",
    "check_suite",
    "import_application",
    "import_target",
    "load_suite",
    "read_yaml",
    "suite_kind",
    "validate",
]

M = TypeVar("M", bound=BaseModel)


class SuiteError(ConfigError):
    """A suite (or an agent configuration) that cannot be used: the message says where."""


def read_yaml(path: Path) -> Any:
    """The data of a YAML file.

    Raises:
        SuiteError: pyyaml is missing, the file cannot be read, or it is not YAML.
    """
    try:
        import yaml
    except ImportError:
        raise SuiteError(
            f'{path}: reading YAML needs pyyaml: pip install "handrail[evals]"'
        ) from None
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise SuiteError(f"{path}: cannot read it ({exc.strerror or exc}).") from None
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" (line {mark.line + 1}, column {mark.column + 1})" if mark is not None else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise SuiteError(f"{path}: not valid YAML{where}: {problem}.") from None


def validate(model: type[M], data: Any, where: str) -> M:
    """`data` as a `model`, or a `SuiteError` naming every problem's scenario and field."""
    if not isinstance(data, Mapping):
        raise SuiteError(f"{where}: expected a mapping of settings, got {_kind(data)}.")
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise SuiteError(_message(exc, data, where)) from None


def load_suite(path: str | Path) -> Suite:
    """The suite in a YAML file or a Python module (its `suite`), validated and checked.

    The domain (and deps) named as `module:attr` are imported, with the suite's folder and
    the current directory on `sys.path`.

    Raises:
        SuiteError: the file is missing or malformed, a target does not import, or a scenario
            names tools or routes the domain does not have.
    """
    path = Path(path)
    if not path.exists():
        raise SuiteError(f"{path}: no such suite file.")
    if path.suffix == ".py":
        suite = _python_suite(path)
    else:
        data = read_yaml(path)
        if _kind_of(data, path) == "documents":
            raise SuiteError(
                f"{path}: a documents suite (kind: documents): run it with `handrail eval "
                f"{path}`, or load it with handrail.evals.load_documents_suite."
            )
        suite = validate(Suite, data, str(path))
        if suite.name is None:
            suite = suite.model_copy(update={"name": path.stem})
    with _importable(path.parent):
        if suite.app is not None:  # imported now (its errors said here), opened by run_suite
            import_application(suite.app, f"{path}: app")
        else:
            suite.domain = import_target(suite.domain, f"{path}: domain")
        if isinstance(suite.deps, str):
            suite.deps = import_target(suite.deps, f"{path}: deps")
    if suite.app is None:  # an application's domain is checked once it is open (run_suite)
        check_suite(suite, str(path))
    return suite


def suite_kind(path: str | Path) -> str:
    """`documents` for a YAML suite with `kind: documents`, else `agents` (the scenarios).

    Raises:
        SuiteError: the file is not YAML, or names another kind.
    """
    path = Path(path)
    if path.suffix == ".py" or not path.exists():
        return "agents"  # load_suite says what is wrong with a missing file
    return _kind_of(read_yaml(path), path)


def _kind_of(data: Any, path: Path) -> str:
    kind = data.get("kind", "agents") if isinstance(data, Mapping) else "agents"
    if kind not in ("agents", "documents"):
        raise SuiteError(
            f"{path}: kind: {kind!r} is not a kind of suite: write `kind: documents` for a "
            f"documents suite, or leave it out for scenarios."
        )
    return str(kind)


def _python_suite(path: Path) -> Suite:
    name = f"_handrail_suite_{abs(hash(path.resolve()))}"
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:  # pragma: no cover - a .py path always has one
        raise SuiteError(f"{path}: cannot import it.")
    module = importlib.util.module_from_spec(spec)
    with _importable(path.parent):
        try:
            spec.loader.exec_module(module)
        except ValidationError as exc:
            raise SuiteError(_message(exc, {}, f"{path}: {exc.title}")) from None
        except Exception as exc:
            raise SuiteError(f"{path}: importing it failed: {type(exc).__name__}: {exc}") from None
    found = getattr(module, "suite", None)
    if callable(found) and not isinstance(found, Suite):
        found = found()
    if not isinstance(found, Suite):
        raise SuiteError(
            f"{path}: define `suite`, a handrail.evals.Suite (or a function returning one)."
        )
    return found if found.name else found.model_copy(update={"name": path.stem})


def import_application(target: Any, where: str) -> Any:
    """The application `MODULE:NAME` names (`handrail.apps.import_app`), not yet opened.

    Anything else is returned as it is; `open_app` opens either in the eval's loop.

    Raises:
        SuiteError: the module cannot be imported (its error told in one line, with the line
            of the application's code that raised it), or has no such attribute.
    """
    if not isinstance(target, str):
        return target
    try:
        return import_app(target)
    except UserError as exc:
        raise SuiteError(f"{where}: {exc}") from exc


def import_target(target: Any, where: str) -> Any:
    """The object `module:attr` names (anything else is returned as it is)."""
    if not isinstance(target, str):
        return target
    module_name, _, attribute = target.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise SuiteError(f"{where}: cannot import {module_name!r} ({exc}).") from None
    found: Any = module
    for part in attribute.split("."):
        found = getattr(found, part, _MISSING)
        if found is _MISSING:
            raise SuiteError(f"{where}: module {module_name!r} has no attribute {attribute!r}.")
    return found


_MISSING = object()


@contextmanager
def _importable(folder: Path) -> Iterator[None]:
    added = [p for p in (str(folder.resolve()), str(Path.cwd())) if p not in sys.path]
    sys.path[:0] = added
    try:
        yield
    finally:
        for entry in added:
            sys.path.remove(entry)


def check_suite(suite: Suite, where: str, domain: Domain | None = None) -> None:
    """Check the scenarios against the domain: the tools and routes they name must exist.

    `domain` is the suite's (an application's, once open); default: `suite.domain`.

    Mocks, decisions that name a tool, `called`, `not_called` and `proposed` name tools;
    turns and `expect.route` name routes.

    Raises:
        SuiteError: the domain is not a `Domain` or `Agent`, or scenarios name unknown tools
            or routes (every one of them, each with its place).
    """
    if domain is None:
        domain = as_domain(suite.domain, f"{where}: domain")
    everyone = [*domain.agents, *([domain.supervisor] if domain.supervisor else [])]
    tools = sorted({name for agent in everyone for name in agent.tools})
    routes = list(domain.routes)
    problems: list[str] = []
    for scenario in suite.scenarios:
        at = f"scenario {scenario.name!r}"

        def tool(name: str, field: str, at: str = at) -> None:
            if name not in tools:
                problems.append(
                    f"{at}: {field}: no agent has a tool {name!r} (tools: {_names(tools)})."
                )

        def route(name: str, field: str, at: str = at) -> None:
            if name not in routes:
                problems.append(f"{at}: {field}: no route {name!r} (routes: {_names(routes)}).")

        for name in scenario.mocks:
            tool(name, "mocks")
        for number, turn in enumerate(scenario.turns):
            if turn.route is not None:
                route(turn.route, f"turns[{number}].route")
            for index, decision in enumerate(turn.decisions or []):
                if isinstance(decision.target, str):
                    tool(decision.target, f"turns[{number}].decisions[{index}].{decision.kind}")
        expect = scenario.expect
        for key in ("called", "not_called", "proposed"):
            for index, call in enumerate(getattr(expect, key)):
                tool(call.tool, f"expect.{key}[{index}]")
        expected = expect.route
        if isinstance(expected, str):
            route(expected, "expect.route")
        for index, name in enumerate(expected if isinstance(expected, list) else []):
            route(name, f"expect.route[{index}]")
    if problems:
        raise SuiteError(_listed(where, problems))


def as_domain(found: Any, where: str) -> Domain:
    """`found` as a `Domain` (a lone agent is a domain of one; a factory is called)."""
    if callable(found) and not isinstance(found, Domain | Agent):
        found = found()
    if isinstance(found, Agent):
        return Domain(agents=[found])
    if not isinstance(found, Domain):
        raise SuiteError(f"{where}: expected a handrail Domain or Agent, got {_kind(found)}.")
    return found


def _names(names: Sequence[str]) -> str:
    return ", ".join(names) or "none"


def _kind(value: Any) -> str:
    return "nothing" if value is None else f"a {type(value).__name__}"


def _message(exc: ValidationError, data: Mapping[str, Any], where: str) -> str:
    places: dict[str, list[str]] = {}
    problems: list[str] = []
    for error in exc.errors(include_url=False):
        loc = list(error["loc"])
        prefix = ""
        if len(loc) >= 2 and loc[0] == "scenarios" and isinstance(loc[1], int):
            scenarios = data.get("scenarios")
            name = None
            if isinstance(scenarios, list) and loc[1] < len(scenarios):
                item = scenarios[loc[1]]
                name = item.get("name") if isinstance(item, Mapping) else None
            prefix = f"scenario {name!r}" if name else f"scenarios[{loc[1]}]"
            loc = loc[2:]
        field = _path(loc)
        message = error["msg"]
        if message.startswith("Value error, "):
            message = message[len("Value error, ") :]
        place = ": ".join(p for p in (prefix, field) if p)
        said = places.setdefault(place, [])
        if message not in said:  # each member of a union says why it does not fit
            said.append(message)
    for place, said in places.items():
        message = _either(said)
        problems.append(f"{place}: {message}" if place else message)
    return _listed(where, problems)


def _either(messages: list[str]) -> str:
    """The reasons of a union's members as one: `Input should be a valid string or ...`."""
    lead = "Input should be "
    if len(messages) > 1 and all(m.startswith(lead) for m in messages):
        return lead + " or ".join(m[len(lead) :] for m in messages)
    return "; or ".join(messages)


def _listed(where: str, problems: list[str]) -> str:
    """One line for one problem; for several, a count, then one indented line each."""
    if len(problems) == 1:
        return f"{where}: {problems[0]}"
    return f"{where}: {len(problems)} problems:" + "".join(f"\n  {p}" for p in problems)


def _path(loc: Sequence[int | str]) -> str:
    text = ""
    for item in loc:
        if isinstance(item, int):
            text += f"[{item}]"
        elif item in _UNION_TAGS:
            continue  # pydantic's name for a member of a union, not a field
        else:
            text += f".{item}" if text else item
    return text


_UNION_TAGS = frozenset({"str", "int", "float", "bool", "list[str]"})
