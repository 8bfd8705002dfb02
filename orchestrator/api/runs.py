"""orch from Python: a run over a DataFrame (or anything `orch prepare` reads), followed, read back as a table.

    >>> import orchestrator
    >>> run = orchestrator.run(tickets, model="org/model", template="Classify: {body}", json_schema=schema)
    >>> labels = run.wait().to_pandas()

The calls go through the library the CLI's commands call (api/context, api/lifecycle,
api/estimate), never a second composition of the steps: `run` is `orch run` up to its launch,
`Run.wait` follows the run as `orch run` does, `Run.to_pandas` reads the table `orch collect --out
x.parquet` writes, `attach` then `wait` is `orch resume --follow`. The run lives in the store, not
in the Python process: a killed kernel loses nothing, and `attach` (or the same `run(...)` call
again) goes on from what the store holds, no row answered twice.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import os
import re
import tempfile
import threading
import warnings
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from orchestrator.api import lifecycle
from orchestrator.api.context import Spelling, input_flags, open_run
from orchestrator.api.estimate import Forecast, forecast_run
from orchestrator.api.inputs import handed_input, source_paths, store_input
from orchestrator.api.progress import ProgressBar
from orchestrator.core.context import RunContext
from orchestrator.core.errors import IncompleteRun, RunNotFound, SpecError
from orchestrator.core.frozen_spec import read_stored_spec
from orchestrator.core.probe_limits import PROBE_BUDGET_USD, PROBE_SHARE
from orchestrator.core.spec import DEFAULT_SPEC_FILE, SamplingSpec
from orchestrator.runview.status import current_status

if TYPE_CHECKING:
    import pandas
    import polars
    import pyarrow as pa

    from orchestrator.backends.base import Launcher
    from orchestrator.collect.report import CollectReport
    from orchestrator.fleet.launch import Cancelled
    from orchestrator.fleet.reconcile import TickReport
    from orchestrator.prepare import PrepareReport
    from orchestrator.runview.status import RunStatus

log = logging.getLogger("orchestrator")

#: Seconds between two looks at a followed run (`orch run --interval`).
WAIT_INTERVAL_S = 2.0

#: The keyword that sets each spec field, to name it as the caller wrote it.
_KEYWORD_OF_FIELD = {
    "run": "run",
    "store": "store",
    "backend": "backend",
    "model.name": "model",
    "models": "model",
    "input.format": "format",
    "input.id_column": "id_column",
    "input.template": "template",
    "input.system_prompt": "system_prompt",
    "input.response_format": "json_schema",
    "chunking.num_chunks": "num_chunks",
    "chunking.rows_per_chunk": "rows_per_chunk",
    "workers.count": "workers",
}
#: Spec fields that say where and how fast a run goes, not what it answers: left out of its default name.
_NOT_IN_NAME = ("run", "store", "backend", "workers.count")


def _as_keyword_error(error: SpecError) -> SpecError:
    """A bad value that came from a keyword, named by the keyword (`workers=`), not the spec field it
    sets (`workers.count`); other errors as they are."""
    field = error.field or ""
    keyword = _KEYWORD_OF_FIELD.get(field) or (
        field.removeprefix("sampling.") if field.startswith("sampling.") else None
    )
    if error.where != "command line" or keyword is None:
        return error
    renamed = SpecError(error.message.removeprefix(f"{field}: "), where=f"{keyword}=", hint=error.hint)
    renamed.field = error.field
    return renamed


PYTHON = Spelling(model="model=", rename=_as_keyword_error)


class _Stopped(Exception):
    """A wait_async whose task was cancelled: its follow thread ends at the next tick."""


class Run:
    """A run in a store, seen from Python: made by `orchestrator.run` (started) or
    `orchestrator.attach` (found). Everything it knows is read from the store, so two objects for
    the same run, in two processes, agree."""

    def __init__(self, ctx: RunContext, launcher: Launcher | None = None):
        self._ctx = ctx
        #: The backend that launched this process's workers; None after `attach`, until `wait`
        #: launches the workers the run still needs.
        self._launcher = launcher
        #: What the last collect (`to_pandas`, `collect`, ...) reported: rows, errors, tokens.
        self.report: CollectReport | None = None

    @property
    def name(self) -> str:
        """The run's name: its prefix in the store (`--run`)."""
        return self._ctx.layout.run

    @property
    def store(self) -> str:
        """The store the run lives in (`--store`)."""
        return self._ctx.spec.store

    def __repr__(self) -> str:
        return f"Run({self.name!r}, store={self.store!r})"

    def wait(self, progress: bool = True, *, interval: float = WAIT_INTERVAL_S) -> Run:
        """Follow the run to its end: workers whose jobs end with work left are relaunched, a
        cascade's later stages run; with `progress`, a bar shows rows, rate, time left, errors and
        cost (a widget in Jupyter). Returns the run; IncompleteRun when it stops short (a worker's
        retries spent, the run cancelled), saying why.

        After `attach`, the workers the unfinished chunks need are launched first (never a second
        copy of a live one). Interrupted (Ctrl-C, a kernel interrupt), the run goes on without
        this process: `wait()` again, or `attach` from another, takes it up.

            >>> orchestrator.attach("labels").wait().to_pandas()   # orch resume --follow; orch collect

        CLI: `orch watch` (`orch resume --follow` after an attach)."""
        self._follow(progress, interval, stop=None)
        return self

    async def wait_async(self, progress: bool = True, *, interval: float = WAIT_INTERVAL_S) -> Run:
        """`wait` without blocking the event loop: the run is followed in a thread of its own,
        which ends with the wait (cancelling the awaiting task ends it at its next look).

            >>> run = await orchestrator.run(rows, model=MODEL).wait_async()"""
        loop = asyncio.get_running_loop()
        finished: asyncio.Future[None] = loop.create_future()
        stop = threading.Event()

        def settle(error: BaseException | None) -> None:
            if finished.done():
                return
            if error is None:
                finished.set_result(None)
            else:
                finished.set_exception(error)

        def follow() -> None:
            try:
                self._follow(progress, interval, stop)
            except BaseException as e:  # raised in the awaiting task
                loop.call_soon_threadsafe(settle, e)
            else:
                loop.call_soon_threadsafe(settle, None)

        thread = threading.Thread(target=follow, name=f"orch-wait-{self.name}", daemon=True)
        thread.start()
        try:
            await asyncio.shield(finished)
        except asyncio.CancelledError:
            stop.set()
            with contextlib.suppress(Exception):  # _Stopped, or what the follow met meanwhile
                await finished
            raise
        finally:
            thread.join()  # it settled `finished` as its last act: ended, or about to
        return self

    def _follow(self, progress: bool, interval: float, stop: threading.Event | None) -> None:
        launcher = self._launcher
        if launcher is None:
            resumed = lifecycle.resume(self._ctx)
            launcher = self._launcher = resumed.launcher
            if resumed.launched:
                log.info("launched %d worker(s) on the %s backend", len(resumed.launched), launcher.name)
        bar = ProgressBar(progress)

        def tick(run: RunContext, running: Launcher, _report: TickReport) -> None:
            if stop is not None and stop.is_set():
                raise _Stopped(run.layout.run)
            if progress:
                bar.show(current_status(run, launcher=running))

        hear = lifecycle.Callbacks(progress=log.info, tick=tick, event=bar.say, say=bar.say)
        try:
            lifecycle.follow_to_end(self._ctx, launcher, interval=interval, later_stages=True, hear=hear)
        except KeyboardInterrupt:
            log.warning("interrupted: run %r goes on without this process; wait() again to follow it", self.name)
            raise
        finally:
            bar.close()

    def status(self) -> RunStatus:
        """The run as `orch status` sees it: chunks, rows, workers, pace, cost (runview/status.py)."""
        return current_status(self._ctx, launcher=self._launcher)

    def cancel(self) -> Cancelled:
        """Stop every worker of the run (each flushes its finished rows first); `attach(...).wait()`
        goes on later. CLI: `orch cancel`."""
        from orchestrator.fleet.launch import cancel_workers

        return cancel_workers(self._ctx)

    def collect(
        self,
        out: str | os.PathLike[str],
        *,
        fmt: str | None = None,
        retry_out: str | os.PathLike[str] | None = None,
        partial: bool = False,
        keep_columns: list[str] | None = None,
    ) -> CollectReport:
        """The run's answers into `out` (a .jsonl or .parquet file, or a table URI), in input order,
        every row once; IncompleteRun while rows are missing unless `partial`. CLI: `orch collect`."""
        target = os.fspath(out)
        collected = lifecycle.collect_output(
            self._ctx,
            target,
            fmt=fmt,
            retry_out=os.fspath(retry_out) if retry_out is not None else None,
            partial=partial,
            keep_columns=keep_columns,
        )
        self.report = report = collected.report
        if collected.forecast is not None:
            log.info(lifecycle.describe_actual(collected.forecast))
        if not report.complete and not partial:
            raise IncompleteRun(
                f"run {self.name!r}: {report.missing:,} row(s) missing; {target} was not written",
                hint="run.wait() finishes it (or orchestrator.attach(...).wait() from another process); "
                "partial=True gives what is there",
            )
        return report

    def to_arrow(self, *, keep_columns: list[str] | None = None, partial: bool = False) -> pa.Table:
        """The answers as a table, a row per input row in input order, with the columns `orch
        collect --out x.parquet` writes: the id, the answer's text, a JSON schema's fields as typed
        columns and `parse_error`, finish reason, tokens, errors, model (docs/labelling.md), and
        `keep_columns` of the input beside them."""
        import pyarrow.parquet as pq

        with tempfile.TemporaryDirectory(prefix="orch-table-") as folder:
            out = Path(folder) / f"{self.name}.parquet"
            self.collect(out, partial=partial, keep_columns=keep_columns)
            return pq.read_table(out)

    def to_pandas(self, *, keep_columns: list[str] | None = None, partial: bool = False) -> pandas.DataFrame:
        """`to_arrow` as a pandas DataFrame."""
        return self.to_arrow(keep_columns=keep_columns, partial=partial).to_pandas()

    def to_polars(self, *, keep_columns: list[str] | None = None, partial: bool = False) -> polars.DataFrame:
        """`to_arrow` as a polars DataFrame."""
        import polars

        frame = polars.from_arrow(self.to_arrow(keep_columns=keep_columns, partial=partial))
        assert isinstance(frame, polars.DataFrame)  # a table gives a frame (a chunked array, a series)
        return frame


def run(
    data: Any,
    *,
    model: str | Mapping[str, str] | None = None,
    template: str | None = None,
    json_schema: str | os.PathLike[str] | Mapping[str, Any] | None = None,
    id_column: str | None = None,
    workers: int | None = None,
    backend: str | None = None,
    store: str | os.PathLike[str] | None = None,
    run: str | None = None,
    spec: str | os.PathLike[str] | None = None,
    format: str | None = None,
    system_prompt: str | None = None,
    num_chunks: int | None = None,
    rows_per_chunk: int | None = None,
    **sampling: Any,
) -> Run:
    """Start a run over `data` (or go on with the run named) and return at once; `Run.wait`
    follows it, `Run.to_pandas` reads its answers.

    `data`: a pandas or polars DataFrame, a pyarrow Table, a Hugging Face Dataset or an iterable of
    dicts (written into the run's place in the store, so the run outlives this process), or what
    `orch prepare` reads: a path, a table URI, or a list of them.

    The keywords are `orch run`'s flags: `model` (--model: a path or hub id; a dict NAME -> model
    for several), `template` (--template: a str.format template over the columns; the rows are then
    read as text unless `format` says otherwise), `json_schema` (--json-schema: a schema, or its
    file), `id_column`, `workers` (default: the run's own, else the spec's when `spec` names a
    file, else 1), `backend` (local, skypilot), `store` (default ./.orch), `run` (default: a name
    made from the data and the options, so the same call names the same run), `spec` (an
    orch.yaml), `format`, `system_prompt`, `num_chunks` / `rows_per_chunk`, and sampling
    parameters (`max_tokens=64`, `temperature=0`, ...). An error is an OrchError, saying what and
    where, with a hint.

        >>> run = orchestrator.run(df, model=".cache/models/smollm2-135m-instruct",
        ...                        template="Classify: {body}", json_schema=schema, temperature=0)
        >>> run.wait().to_pandas()

    CLI: `orch run DATA --model ... --template ... --json-schema FILE --out x.parquet`."""
    opened = _open(
        data,
        _flags(model, template, json_schema, id_column, backend, store, spec, format, system_prompt, sampling),
        run=run,
        spec=spec,
        workers=workers,
        chunking=(num_chunks, rows_per_chunk),
        model_check="required",
    )
    hear = lifecycle.Callbacks(progress=log.info, prepared=_said_prepared, say=log.info)
    started = lifecycle.start(opened.ctx, opened.sources, hear=hear)
    if started.launched:
        log.info("run %r: launched %d worker(s)", opened.ctx.layout.run, len(started.launched))
    return Run(opened.ctx, started.launcher)


def attach(run: str, *, store: str | os.PathLike[str] | None = None, spec: str | os.PathLike[str] | None = None) -> Run:
    """The run named, in `store` (default ./.orch), started anywhere: by `orch run`, another
    kernel, another machine. Nothing is launched until `Run.wait`.

        >>> orchestrator.attach("labels", store="s3://bucket/orch").wait().to_pandas()

    CLI: `orch status --run NAME` (then `orch resume --follow`)."""
    flags: dict[str, Any] = {"run": run}
    if store is not None:
        flags["store"] = os.fspath(store)
    ctx = open_run(_spec_file(spec), flags, spelling=PYTHON, warn=_warn)
    if read_stored_spec(ctx.store, ctx.layout) is None:
        raise RunNotFound(
            f"no run {run!r} in the store {ctx.spec.store}",
            where="run=",
            hint="check the name and store= (`orch runs --store STORE` lists its runs); orchestrator.run(...) "
            "starts one",
        )
    return Run(ctx)


def estimate(
    data: Any = None,
    *,
    model: str | Mapping[str, str] | None = None,
    template: str | None = None,
    json_schema: str | os.PathLike[str] | Mapping[str, Any] | None = None,
    id_column: str | None = None,
    workers: int | None = None,
    backend: str | None = None,
    store: str | os.PathLike[str] | None = None,
    run: str | None = None,
    spec: str | os.PathLike[str] | None = None,
    format: str | None = None,
    system_prompt: str | None = None,
    num_chunks: int | None = None,
    rows_per_chunk: int | None = None,
    probe: bool = False,
    probe_share: float = PROBE_SHARE,
    probe_rows: int | None = None,
    probe_budget: float = PROBE_BUDGET_USD,
    **sampling: Any,
) -> Forecast:
    """How long and how much, p10/p50/p90 per candidate GPU (spot and on-demand), before paying for
    the run: the forecast `orch estimate` prints, kept in the run for collect to hold against what
    happened. With `data` (and the keywords of `run`), the run is prepared first, not launched; the
    same `run(...)` call then starts it. Without, `run` names a prepared run. With `probe`, a
    sample of the rows is answered on a real worker first and the forecast made from it.

        >>> forecast = orchestrator.estimate(df, model=MODEL, template="Classify: {body}", probe=True)
        >>> forecast.to_dict()["candidates"][0]["cost_usd"]["p50"]

    CLI: `orch estimate --run NAME [--probe] --json`."""
    flags = _flags(model, template, json_schema, id_column, backend, store, spec, format, system_prompt, sampling)
    chunking = (num_chunks, rows_per_chunk)
    if data is None:
        if run is None:
            raise SpecError("nothing to estimate", where="run=", hint="give the data, or run= naming a prepared run")
        flags = _chunked({**flags, "run": run}, chunking)
        if workers is not None:
            flags["workers.count"] = workers
        ctx = open_run(_spec_file(spec), flags, freeze=True, spelling=PYTHON, warn=_warn)
    else:
        opened = _open(data, flags, run=run, spec=spec, workers=workers, chunking=chunking, model_check="checked")
        ctx = opened.ctx
        lifecycle.prepare(ctx, opened.sources, hear=lifecycle.Callbacks(progress=log.info, prepared=_said_prepared))
    return forecast_run(
        ctx, probe=probe, probe_share=probe_share, probe_rows=probe_rows, probe_budget=probe_budget, echo=log.info
    )


# -- from keywords to a run's context ----------------------------------------------------------


@dataclass
class _Opened:
    ctx: RunContext
    #: What prepare reads: the caller's paths, or the data written into the run's store.
    sources: list[str]


def _flags(
    model: str | Mapping[str, str] | None,
    template: str | None,
    json_schema: str | os.PathLike[str] | Mapping[str, Any] | None,
    id_column: str | None,
    backend: str | None,
    store: str | os.PathLike[str] | None,
    spec: str | os.PathLike[str] | None,
    fmt: str | None,
    system_prompt: str | None,
    sampling: Mapping[str, Any],
) -> dict[str, Any]:
    """The spec flags (dotted paths) the keywords give, as the CLI's flags give them."""
    from orchestrator.core.pools import model_flags

    flags: dict[str, Any] = {}
    if model is not None:
        named = [model] if isinstance(model, str) else [f"{name}={target}" for name, target in model.items()]
        try:
            flags.update(model_flags(named))
        except SpecError as e:
            raise SpecError(e.message.replace("--model", "model="), where="model=", hint=e.hint) from None
    if fmt is None and template is not None and spec is None:
        fmt = "text"  # a template over a table's columns: the rows are text, not chat turns
    schema = json_schema if isinstance(json_schema, Mapping) or json_schema is None else os.fspath(json_schema)
    flags.update(
        input_flags(fmt=fmt, id_column=id_column, template=template, json_schema=schema, system_prompt=system_prompt)
    )
    if backend is not None:
        flags["backend"] = backend
    if store is not None:
        flags["store"] = os.fspath(store)
    unknown = sorted(set(sampling) - set(SamplingSpec.model_fields))
    if unknown:
        raise SpecError(
            f"{', '.join(f'{k}=' for k in unknown)}: not a keyword of orchestrator.run, nor a sampling parameter",
            where=f"{unknown[0]}=",
            hint=f"sampling parameters: {', '.join(SamplingSpec.model_fields)}; the rest of the spec goes in spec=",
        )
    flags.update({f"sampling.{name}": value for name, value in sampling.items()})
    return flags


def _chunked(flags: dict[str, Any], chunking: tuple[int | None, int | None]) -> dict[str, Any]:
    num_chunks, rows_per_chunk = chunking
    return {**flags, **input_flags(num_chunks=num_chunks, rows_per_chunk=rows_per_chunk)}


def _open(
    data: Any,
    flags: dict[str, Any],
    *,
    run: str | None,
    spec: str | os.PathLike[str] | None,
    workers: int | None,
    chunking: tuple[int | None, int | None],
    model_check: str,
) -> _Opened:
    """1. The data: paths as they are; in-memory data as an input file's bytes.
    2. The run's name: the one given, else one made from the data's content and the options.
    3. The run's context from the flags (checked, not recorded: prepare records it).
    4. In-memory data written into the run's input folder, for prepare to read."""
    paths = source_paths(data)
    handed = handed_input(data) if paths is None else None
    flags = _chunked(flags, chunking)
    spec_file = _spec_file(spec)
    if run is None:
        digests = [handed.digest] if handed is not None else _content_digests(paths or [])
        run = _run_name(paths[0] if paths else "data", digests, flags, spec_file)
    flags["run"] = run
    if workers is not None:
        flags["workers.count"] = workers
    ctx = open_run(spec_file, flags, check=True, model=model_check, spelling=PYTHON, warn=_warn)
    if workers is None and spec_file is None and read_stored_spec(ctx.store, ctx.layout) is None:
        # A new run without a spec: one worker, the laptop's or the notebook's machine (the spec's
        # default, 2, is for a fleet).
        ctx = open_run(spec_file, {**flags, "workers.count": 1}, check=True, spelling=PYTHON, warn=_warn)
    for note in ctx.notes:
        log.warning("changed %s (nothing was produced with the old value yet)", note)
    ctx.notes.clear()
    sources = paths if paths is not None else [store_input(ctx, handed)] if handed is not None else []
    return _Opened(ctx, sources)


def _spec_file(spec: str | os.PathLike[str] | None) -> str | None:
    """The spec file given, else ./orch.yaml when there is one (as the CLI reads it)."""
    if spec is not None:
        return os.fspath(spec)
    return DEFAULT_SPEC_FILE if Path(DEFAULT_SPEC_FILE).is_file() else None


def _content_digests(paths: list[str]) -> list[str]:
    """What identifies each input file or table by content (prepare's own digest)."""
    from orchestrator.prepare.sources import content_digest, resolve_sources

    return [content_digest(source) for source in resolve_sources(paths)]


def _run_name(first_source: str, digests: list[str], flags: Mapping[str, Any], spec_file: str | None) -> str:
    """A run named after its data and what is asked of it (`tickets-3f2a9c0b1d4e`): the same call
    names the same run, which then goes on instead of starting again; other data or options name
    another."""
    import orjson

    asked = {k: v for k, v in flags.items() if k not in _NOT_IN_NAME}
    spec_text = Path(spec_file).read_text() if spec_file is not None else None
    whole = orjson.dumps({"data": digests, "asked": asked, "spec": spec_text}, option=orjson.OPT_SORT_KEYS)
    stem = re.sub(r"[^A-Za-z0-9._-]+", "-", Path(first_source.split("?")[0].rstrip("/")).stem).strip("-._")
    return f"{stem[:60] or 'data'}-{hashlib.sha256(whole).hexdigest()[:12]}"


def _said_prepared(ctx: RunContext, report: PrepareReport) -> None:
    record = report.record
    done = "already prepared" if report.already_prepared else "prepared"
    log.info("run %r %s: %d chunks, %s rows", report.run, done, record.chunks, f"{record.rows:,}")
    if record.errors:
        first = "; ".join(record.first_errors[:3])
        _warn(
            f"run {report.run!r}: {record.errors:,} input row(s) set aside, answered with error rows "
            f"(the errors file: {ctx.store.uri}/{record.errors_key}): {first}"
        )


def _warn(message: str) -> None:
    """Something that works, but likely not as meant: a Python warning, shown once where it was called."""
    warnings.warn(message, UserWarning, stacklevel=4)
