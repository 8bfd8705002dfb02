"""Web pages as their users see them: a headless Chromium (Debian's package), and `orch status --web`
serving a run's page from its own process."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.models import REPO


def chromium() -> str:
    """The chromium binary; the test is skipped where it is not installed."""
    path = shutil.which("chromium")
    if path is None:
        pytest.skip("no chromium: run scripts/system-deps (it installs Debian's chromium)")
    return path


@contextlib.contextmanager
def status_web(run: str, workdir: Path, *args: str) -> Iterator[str]:
    """`orch status --web --port 0` (and `args`) in its own process; yields the page's address."""
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "orchestrator",
            "status",
            "--run",
            run,
            "--web",
            "--port",
            "0",
            "--interval",
            "0.5",
            *args,
        ],
        cwd=workdir,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()  # it says where once it listens
        assert "http://127.0.0.1:" in line, line + proc.stdout.read()
        yield next(word for word in line.split() if word.startswith("http://"))
    finally:
        proc.terminate()
        proc.wait(timeout=30)
