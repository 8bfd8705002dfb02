"""orch: offline LLM batch inference on spot GPUs across clouds, every row answered exactly once."""

import os
from pathlib import Path

__version__ = "0.1.0"


def orch_home() -> Path:
    """orch's own files on this machine (local workers' logs, a refreshed price table):
    ORCH_HOME, default ./.orch."""
    return Path(os.environ.get("ORCH_HOME", ".orch"))
