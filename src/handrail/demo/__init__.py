"""The offline support-desk demo: `python -m handrail.demo` (or `make demo`).

The scenario (`build_scenario`) is plain handrail and needs nothing extra; the terminal
rendering in `__main__` needs `rich` (`pip install "handrail[demo]"`).
"""

from __future__ import annotations

from .support_desk import CUSTOMER_MESSAGE, Desk, Scenario, build_scenario

__all__ = ["CUSTOMER_MESSAGE", "Desk", "Scenario", "build_scenario"]
