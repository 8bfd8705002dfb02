"""The worker as a test runs it: `python -m worker` in its own process (kill -9, signals, races), or its
loop in the test's own process on an engine the test holds; and what the done markers of a run list."""

from __future__ import annotations

import collections
import json
import os
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from orchestrator.core.layout import RunLayout
from orchestrator.core.protocol.parts import iter_part_lines
from orchestrator.core.records import DoneMarker
from orchestrator.core.store import Store
from orchestrator.core.worker_ids import planned_list
from tests.support.models import REPO
from tests.support.runs import chat_request


class WorkerProcess:
    """`python -m worker` for worker `worker` of run `run`, its stderr in a file. `python`: the
    interpreter and its options (this test's interpreter by default)."""

    def __init__(
        self,
        store_uri: str,
        run: str,
        worker: str,
        tmp_path: Path,
        *args: str,
        env: dict | None = None,
        python: Sequence[str] = (sys.executable,),
    ):
        self.stderr_path = tmp_path / f"worker-{worker}-{time.monotonic_ns()}.err"
        cmd = [*python, "-m", "worker", "--run", run, "--store", store_uri, "--worker", worker, *args]
        with open(self.stderr_path, "wb") as err:
            self.proc = subprocess.Popen(
                cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=err, text=True, env={**os.environ, **(env or {})}
            )

    def finish(self, timeout: float = 1000) -> tuple[int, dict]:
        # A hang guard only: under load a worker spends minutes loading its engine (300 s ran out at load 8).
        out, _ = self.proc.communicate(timeout=timeout)
        lines = [line for line in out.splitlines() if line.strip()]
        summary = json.loads(lines[-1]) if lines else {}
        return self.proc.returncode, summary

    @property
    def stderr(self) -> str:
        return self.stderr_path.read_text(errors="replace")


def run_in_process(store, run: str, engine) -> dict:
    """Worker 0 of the run in this process, on the session's engine: what `python -m worker --worker 0`
    runs (the spec frozen in the run), without loading vLLM again."""
    from worker.__main__ import spec_from_run
    from worker.heartbeat import WorkerIdentity
    from worker.runner import Worker

    spec = spec_from_run(store, run, checkpoint_interval=None, lease_ttl=None)
    return Worker(store, spec, WorkerIdentity.new("0", planned_list("0")), lambda: engine).run()


def answered_lines(store, layout: RunLayout) -> list:
    """The output lines in the parts that done markers list (what collect reads)."""
    lines = []
    for info in store.list(layout.done_prefix):
        marker = DoneMarker.model_validate_json(store.get(info.key).data)
        for part in marker.parts:
            lines.extend(iter_part_lines(store.get(part.key).data, marker.output_format))
    return lines


def chunk_of(prefix: str, rows: int, max_tokens: int = 8) -> list[dict[str, Any]]:
    """`rows` chat requests `<prefix>-<i>`, each answered to exactly `max_tokens` tokens."""
    return [
        chat_request(f"{prefix}-{i}", f"Tell me about item {i}", max_tokens=max_tokens, ignore_eos=True)
        for i in range(rows)
    ]


def answered(store: Store, layout: RunLayout) -> collections.Counter[str]:
    """custom_id -> how often it appears in the parts that done markers list."""
    return collections.Counter(line.custom_id for line in answered_lines(store, layout))


def wait_for_parts(store: Store, layout: RunLayout, chunk: str, count: int, timeout: float = 1000) -> list[Any]:
    """The chunk's output parts once there are `count` of them (`timeout`: a hang guard, the worker
    loads its engine first: 180 s ran out at load 30)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        parts = list(store.list(layout.outputs_prefix(chunk)))
        if len(parts) >= count:
            return parts
        time.sleep(0.05)
    raise AssertionError(f"fewer than {count} parts of {chunk} after {timeout}s")
