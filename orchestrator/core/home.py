"""orch's own folder on this machine (local workers' logs, a refreshed price table)."""

from __future__ import annotations

import os
from pathlib import Path


def orch_home() -> Path:
    """orch's own files on this machine (local workers' logs, a refreshed price table):
    ORCH_HOME, default ./.orch."""
    return Path(os.environ.get("ORCH_HOME", ".orch"))
