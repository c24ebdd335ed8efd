"""Test doubles that ship with handrail, so users test their agents the way we test ours.

```python
from handrail.testing import ScriptedModel, call

model = ScriptedModel([call("orders.lookup", order_id="A1"), "It shipped."])
result = await agent.run("Where is A1?", model=model)
model.assert_complete()
```
"""

from __future__ import annotations

from .models.function import FunctionModel, Step, call, call_raw, reasoning
from .models.scripted import ScriptedModel
from .runtime import sequential_ids
from .tools import hosted_call

__all__ = [
    "FunctionModel",
    "ScriptedModel",
    "Step",
    "call",
    "call_raw",
    "hosted_call",
    "reasoning",
    "sequential_ids",
]
