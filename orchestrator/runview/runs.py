"""The runs a store holds, and where their workers' logs are: what `orch runs` and `orch logs` read.

1. `run_names` (core/records/run.py) finds the runs, one listing request per run.
2. `list_runs` gives each run's status (runview/status.py: the same derivation `orch status`
   shows, each one's model and input with it), read from the store alone: no backend is asked, so
   a job that is queued without a heartbeat yet reads as stopped until it beats.
3. `delete_run`: every object under the run's prefix, through the store (a directory or S3 alike),
   and the local backend's logs of it.
4. `log_files` and `follow_logs`: the local backend's worker logs, `<store>/logs/<run>/` for a
   directory store and ORCH_HOME/logs/<run>/ on this machine for an s3:// or r2:// one.
   `is_orch_line` tells orch's own lines in them from the engine's (vLLM's warnings, progress
   bars, torch's notes), which outnumber them many times: `orch logs` shows orch's first.
"""

from __future__ import annotations

import re
import shutil
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import TypeVar

from orchestrator.core.context import RunContext
from orchestrator.core.errors import OrchError, RunNotFound
from orchestrator.core.frozen_spec import read_stored_spec
from orchestrator.core.layout import RunLayout
from orchestrator.core.records.run import run_names
from orchestrator.core.spec import RunSpec
from orchestrator.core.store import ObjectInfo, Store
from orchestrator.planning.pricing import GpuTable
from orchestrator.runview.status import RunStatus, status_of

T = TypeVar("T")


def list_runs(store: Store, prices: GpuTable, now: float | None = None) -> list[RunStatus | tuple[str, str]]:
    """Each run's status, or (name, what is wrong) for a run whose records cannot be read."""
    now = time.time() if now is None else now
    return statuses_of(run_names(store), lambda name: status_of(store, RunLayout(name), None, now=now, prices=prices))


def statuses_of(names: Iterable[str], read: Callable[[str], T]) -> list[T | tuple[str, str]]:
    """`read(name)` of each run (its status, or a reading of it), or (name, what is wrong) where it
    fails: a run that was never prepared, or a record that does not parse."""
    out: list[T | tuple[str, str]] = []
    for name in names:
        try:
            out.append(read(name))
        except OrchError as e:
            out.append((name, e.message))
    return out


def context_in_store(ctx: RunContext, run: str) -> RunContext:
    """Another run of `ctx`'s store, with the spec frozen into it (`ctx` itself for its own run):
    what a page of any run in the store needs to find its logs."""
    if run == ctx.layout.run:
        return ctx
    layout = RunLayout(run)
    stored = read_stored_spec(ctx.store, layout)
    if stored is None:
        raise RunNotFound(f"no run {run!r} in {ctx.spec.store}", hint="orch runs lists the store's runs")
    return RunContext(RunSpec.model_validate({**stored[0], "store": ctx.spec.store}), ctx.store, layout)


def run_objects(store: Store, layout: RunLayout) -> list[ObjectInfo]:
    """Every object under the run's prefix (what `orch delete` removes)."""
    return list(store.list(layout.root))


def delete_run(store: Store, spec: RunSpec, objects: list[ObjectInfo]) -> None:
    """Delete the run's objects and the local backend's logs of it. The manifest and prepare record
    go first: a deletion cut short leaves a run that reads as unprepared, never as an intact one
    with outputs missing, and `orch delete` again finishes it."""
    from orchestrator.backends.local import local_log_dir

    first = {spec.layout.manifest, spec.layout.prepare_record}
    for info in sorted(objects, key=lambda info: info.key not in first):
        store.delete(info.key)
    shutil.rmtree(local_log_dir(spec, store), ignore_errors=True)


_LOG_NAME = re.compile(r"^worker-(?P<worker>.+)-(?P<ms>\d+)\.log$")

#: How orch's own lines in a worker's log begin: the worker's progress notes (worker/progress.PREFIX),
#: its `orch.*` loggers as worker/__main__.py formats them, orch's ERROR lines (`ERROR worker 0:
#: ...`, what status quotes as a failure's reason) and the worker's summary. Every other line is
#: the engine's, or a library's.
_ORCH_LINE = re.compile(r"^(\[orch worker\]|(DEBUG|INFO|WARNING|ERROR|CRITICAL) orch[.:]|ERROR |\{\"status\": )")


def is_orch_line(line: str) -> bool:
    """Whether a worker log's line is orch's own (see _ORCH_LINE), not the engine's."""
    return _ORCH_LINE.match(line) is not None


def orch_lines_first(text: str) -> tuple[list[str], list[str]]:
    """A log's lines split in two, each in its order: orch's own, and the engine's."""
    orch: list[str] = []
    engine: list[str] = []
    for line in text.splitlines():
        (orch if is_orch_line(line) else engine).append(line)
    return orch, engine


def log_files(ctx: RunContext, worker: str | None = None) -> list[Path]:
    """The run's worker logs on this machine, oldest first (by launch time), of one worker or all."""
    from orchestrator.backends.local import local_log_dir

    found = []
    folder = local_log_dir(ctx.spec, ctx.store)
    for path in folder.glob("worker-*.log") if folder.is_dir() else ():
        m = _LOG_NAME.match(path.name)
        if m and (worker is None or m["worker"] == worker):
            found.append((int(m["ms"]), path))
    return [path for _, path in sorted(found)]


def latest_logs(files: list[Path]) -> dict[str, Path]:
    """Each worker's newest log among `files` (oldest first, as `log_files` gives them), by worker."""
    latest: dict[str, Path] = {}
    for path in files:
        m = _LOG_NAME.match(path.name)
        if m:
            latest[m["worker"]] = path  # a later attempt of the same worker wins
    return latest


def follow_logs(
    ctx: RunContext, worker: str | None, ended: Callable[[], bool], *, interval: float = 1.0
) -> Iterator[tuple[Path, str]]:
    """(log, line) as workers write them, from each log's current end, new logs included, until
    `ended()` says the run is over (then what is left is read once more)."""
    offsets = {path: path.stat().st_size for path in log_files(ctx, worker)}
    while True:
        over = ended()
        for path in log_files(ctx, worker):
            start = offsets.get(path, 0)
            with open(path, "rb") as f:
                f.seek(start)
                data = f.read()
            complete = data[: data.rfind(b"\n") + 1] if not over else data
            offsets[path] = start + len(complete)
            for line in complete.decode("utf-8", "replace").splitlines():
                yield path, line
        if over:
            return
        time.sleep(interval)
