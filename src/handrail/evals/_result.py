"""What running a suite found: a result per scenario, in the suite's order."""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["Failure", "ScenarioResult", "SuiteResult"]


@dataclass(kw_only=True, slots=True)
class Failure:
    """One assertion that did not hold."""

    assertion: str
    """Which (`route`, `called`, `text_contains`, `judge`, `run`, ...)."""
    reason: str
    """What was found instead, for a person."""


@dataclass(kw_only=True, slots=True)
class ScenarioResult:
    """How one scenario went."""

    name: str
    """The scenario."""
    failures: list[Failure] = field(default_factory=list)
    """The assertions that did not hold, in the order they are checked (empty: it passed)."""
    outcome: str | None = None
    """How its last turn ended (`completed`, `suspended`, `failed`, ...; None: never ran)."""
    routes: list[str | None] = field(default_factory=list)
    """The route each turn took."""
    model_calls: int = 0
    """Calls to the scenario's models (the judge's not counted)."""
    tokens: int | None = None
    """Tokens the models reported (input + output), or None when they report none."""
    latency: float = 0.0
    """Wall-clock seconds the scenario took (kept out of reports unless asked for)."""
    judge: str | None = None
    """The judge's reason, when a judge was asked."""

    @property
    def passed(self) -> bool:
        """Whether every assertion held."""
        return not self.failures

    @property
    def reason(self) -> str:
        """The first failure as one line, or the judge's reason, or ''."""
        if self.failures:
            first = self.failures[0]
            more = len(self.failures) - 1
            return f"{first.assertion}: {first.reason}" + (f" (+{more} more)" if more else "")
        return self.judge or ""


@dataclass(kw_only=True, slots=True)
class SuiteResult:
    """The results of one suite run, in scenario order."""

    suite: str
    """The suite's name."""
    scenarios: list[ScenarioResult]
    """One result a scenario, in the suite's order (not the order they finished)."""
    config: str | None = None
    """The agent configuration it ran with (`--compare`), if any."""

    @property
    def passed(self) -> bool:
        """Whether every scenario passed."""
        return all(s.passed for s in self.scenarios)

    @property
    def failed(self) -> list[ScenarioResult]:
        """The scenarios that failed."""
        return [s for s in self.scenarios if not s.passed]
