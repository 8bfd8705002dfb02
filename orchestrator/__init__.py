"""orch: offline LLM batch inference on spot GPUs across clouds, every row answered exactly once.

From Python (docs/python.md):

    >>> import orchestrator
    >>> run = orchestrator.run(df, model="org/model", template="Classify: {body}", json_schema=schema)
    >>> labels = run.wait().to_pandas()

`import orchestrator` stays cheap (no engine, no cloud SDK, not even pydantic): the API below is
imported on first use (PEP 562).
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

if TYPE_CHECKING:
    from orchestrator.api.estimate import Forecast
    from orchestrator.api.runs import Run, attach, estimate, run
    from orchestrator.core.errors import OrchError
    from orchestrator.core.home import orch_home

__all__ = ["Forecast", "OrchError", "Run", "attach", "estimate", "orch_home", "run"]

#: The public names, and the module each one is imported from when first used.
_LAZY = {
    "run": "orchestrator.api.runs",
    "attach": "orchestrator.api.runs",
    "estimate": "orchestrator.api.runs",
    "Run": "orchestrator.api.runs",
    "Forecast": "orchestrator.api.estimate",
    "OrchError": "orchestrator.core.errors",
    "orch_home": "orchestrator.core.home",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'orchestrator' has no attribute {name!r}")
    value = getattr(import_module(module), name)
    globals()[name] = value  # the next use is a plain attribute
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
