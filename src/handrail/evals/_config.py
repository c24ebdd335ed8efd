"""Agent configurations: the same suite run on a draft and a pinned agent (`--compare`).

A configuration file names the domain and the model, and may override agents' instructions
and models, by agent name (the supervisor included):

```yaml
name: draft                                      # default: the file's stem
domain: handrail.demo.support_desk:support_domain  # default: the suite's
model: openai:gpt-4o-mini                        # default: the suite's model
agents:
  responder:
    instructions: Write the reply to the customer in two sentences at most.
    model: anthropic:claude-sonnet-4-6
```

Models resolve from the most specific: an agent's override, then the scenario's own model,
then the configuration's `model`, then the suite's.
"""

from __future__ import annotations

import copy
import dataclasses
from pathlib import Path
from typing import Any

from pydantic import Field, field_validator

from .._agent_spec import AgentSpec
from ..engine import Domain
from ._load import SuiteError, import_target, read_yaml, validate
from ._suite import _TARGET, ModelSpec, _Strict

__all__ = ["AgentConfig", "AgentOverride", "configure", "load_config"]


class AgentOverride(_Strict):
    """What a configuration changes in one agent."""

    instructions: str | None = None
    """Its system prompt, instead of the domain's."""
    model: ModelSpec | None = None
    """Its model, over the scenario's and the suite's."""


class AgentConfig(_Strict):
    """A configuration of the agents a suite runs on."""

    name: str | None = None
    """Its name in the side-by-side table (default: the file's stem)."""
    domain: Any = None
    """`module:attr` of the Domain or Agent (default: the suite's)."""
    model: ModelSpec | None = None
    """The default model, over the suite's (a scenario's own model still wins)."""
    agents: dict[str, AgentOverride] = Field(default_factory=dict)
    """Agent name -> what to change in it."""

    @field_validator("domain")
    @classmethod
    def _target(cls, value: Any) -> Any:
        if isinstance(value, str) and not _TARGET.match(value):
            raise ValueError(f"{value!r} is not module:attr")
        return value


def load_config(path: str | Path) -> AgentConfig:
    """The agent configuration in a YAML file, its domain imported.

    Raises:
        SuiteError: the file is missing or malformed, or its domain does not import.
    """
    path = Path(path)
    if not path.exists():
        raise SuiteError(f"{path}: no such configuration file.")
    config = validate(AgentConfig, read_yaml(path), str(path))
    if config.name is None:
        config.name = path.stem
    config.domain = import_target(config.domain, f"{path}: domain")
    return config


def configure(domain: Domain, config: AgentConfig, where: str) -> Domain:
    """`domain` with the configuration's instructions (models are built per scenario).

    Raises:
        SuiteError: the configuration names an agent the domain does not have.
    """
    supervisor = domain.supervisor
    names = [*domain.by_name, *([supervisor.name] if supervisor else [])]
    unknown = sorted(set(config.agents) - set(names))
    if unknown:
        raise SuiteError(
            f"{where}: agents: no agent {', '.join(map(repr, unknown))} in the domain "
            f"(agents: {', '.join(names)})."
        )

    def changed(agent: AgentSpec[Any]) -> AgentSpec[Any]:
        override = config.agents.get(agent.name)
        if override is None or override.instructions is None:
            return agent
        clone = copy.copy(agent)
        clone.instructions = override.instructions
        return clone

    return dataclasses.replace(
        domain,
        agents=[changed(a) for a in domain.agents],
        supervisor=changed(supervisor) if supervisor is not None else None,
    )
