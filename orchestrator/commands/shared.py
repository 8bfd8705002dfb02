"""What several commands share: the common options, the follow loop's live view, the printed reports.

Command modules import from here, never from each other (an import-linter contract).
"""

from __future__ import annotations

import functools
import shlex
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NoReturn

import click

from orchestrator.collect.error_rate import DEFAULT_MAX_ERROR_RATE

if TYPE_CHECKING:
    from orchestrator.backends.base import Launcher
    from orchestrator.core.context import RunContext
    from orchestrator.core.errors import SpecError
    from orchestrator.fleet.reconcile import TickReport
    from orchestrator.fleet.start import StartedRun
    from orchestrator.planning.deadline import DeadlineSettings


@dataclass
class Invocation:
    """What every command shares: the spec file and the flags that override the spec."""

    spec_file: str | None
    flags: dict[str, Any]

    def context(self, freeze: bool = False, check: bool = False, model: str | None = None) -> RunContext:
        """The run's spec (stored < file < env < flags) and store; with `freeze`, the spec is
        checked against the run's frozen fields and recorded (`check`: checked only). A frozen
        field that changes because nothing was produced with it yet is said on stderr.

        `model="required"` (a command that starts workers) refuses a run without a model, and
        `"checked"` (prepare) a local model path that holds no model, before anything is recorded."""
        from orchestrator.core.context import resolve_spec
        from orchestrator.core.errors import SpecError

        try:
            ctx = resolve_spec(self.spec_file, self.flags)
        except SpecError as e:
            raise as_flag_error(e) from None
        if model is not None:
            from_flag = "model.name" in self.flags or "models" in self.flags
            check_model(ctx, from_flag=from_flag, required=model == "required")
        if freeze or check:
            ctx.freeze(write=freeze)
        say_spec_changes(ctx)
        return ctx

    def with_flags(self, **more: Any) -> Invocation:
        """The same invocation with more flags (dotted spec paths); None values are left out."""
        return Invocation(self.spec_file, {**self.flags, **{k: v for k, v in more.items() if v is not None}})


#: The flag that sets each spec field, to name it as the user wrote it.
FLAG_OF_FIELD = {
    "run": "--run",
    "store": "--store",
    "backend": "--backend",
    "model.name": "--model",
    "input.format": "--format",
    "input.id_column": "--id-column",
    "input.turns": "--turns",
    "input.conversation_column": "--conversation-column",
    "input.text_column": "--text-column",
    "input.template": "--template",
    "input.system_prompt": "--system-prompt",
    "input.max_line_bytes": "--max-line-bytes",
    "chunking.num_chunks": "--num-chunks",
    "chunking.rows_per_chunk": "--rows-per-chunk",
    "workers.count": "--workers",
    "resources.gpus": "--gpus",
    "resources.infra": "--infra",
}


def as_flag_error(error: SpecError) -> SpecError:
    """A bad value that came from a flag, named by the flag (`--num-chunks`), not the spec field
    it sets (`chunking.num_chunks`); other errors as they are."""
    from orchestrator.core.errors import SpecError

    flag = FLAG_OF_FIELD.get(error.field or "")
    if error.where != "command line" or flag is None or error.field is None:
        return error
    message = error.message.removeprefix(f"{error.field}: ")
    command = click.get_current_context(silent=True)
    path = command.command_path if command is not None else "orch COMMAND"
    return SpecError(message, where=flag, hint=f"`{path} --help` says what {flag} takes")


def say_spec_changes(ctx: RunContext) -> None:
    """Frozen fields the last freeze let change (nothing was produced with their old values)."""
    for note in ctx.notes:
        click.echo(
            click.style("changed", fg="yellow") + f" {note} (nothing was produced with the old value yet)", err=True
        )
    ctx.notes.clear()


def common_options(func: Callable[..., Any]) -> Callable[..., Any]:
    """--run, --store, --model and -f on every command, collected into an Invocation."""

    @click.option("-f", "--file", "spec_file", type=click.Path(dir_okay=False), help="spec file (default: ./orch.yaml)")
    @click.option("--run", "run", help="run name: the run's prefix in the store")
    @click.option("--store", "store", help="store URI: a directory (default ./.orch), s3://B/P or r2://B/P")
    @click.option(
        "--model",
        "models",
        multiple=True,
        help="model: a local path or a hub id (overrides the spec); NAME=PATH_OR_HUB_ID, repeatable, for a run "
        "of several models (lines pick theirs by body.model)",
    )
    @functools.wraps(func)
    def wrapper(
        spec_file: str | None, run: str | None, store: str | None, models: tuple[str, ...], **kwargs: Any
    ) -> Any:
        from orchestrator.core.pools import model_flags  # --model PATH, or NAME=PATH repeated

        flags: dict[str, Any] = {k: v for k, v in {"run": run, "store": store}.items() if v is not None}
        flags.update(model_flags(models))
        return func(Invocation(spec_file, flags), **kwargs)

    return wrapper


def backend_option(func: Callable[..., Any]) -> Callable[..., Any]:
    return click.option(
        "--backend",
        type=click.Choice(["local", "skypilot"]),
        default=None,
        help="where workers run (default: the spec's backend, local)",
    )(func)


def input_options(func: Callable[..., Any]) -> Callable[..., Any]:
    """How input rows become requests: the flags `orch prepare` and `orch run` share."""
    for option in reversed(
        [
            click.option(
                "--format",
                "fmt",
                type=click.Choice(["openai-batch", "completion", "chat", "text"]),
                default=None,
                help="how rows become requests (default: the spec's, chat)",
            ),
            click.option("--num-chunks", type=int, default=None, help="split into this many chunks"),
            click.option("--rows-per-chunk", type=int, default=None, help="...or into chunks of this many rows"),
            click.option(
                "--group-by-prefix/--no-group-by-prefix",
                default=None,
                help="order rows by shared prompt prefix across chunks (prefix-cache hits; collect keeps input order)",
            ),
            click.option("--id-column", default=None, help="column with a stable id, used as custom_id"),
            click.option(
                "--turns",
                type=click.Choice(["first", "all"]),
                default=None,
                help="chat: the first user turn, or everything up to the last user turn",
            ),
            click.option("--conversation-column", default=None, help="chat: the column of role/content turns"),
            click.option("--text-column", default=None, help="text: the column sent when there is no --template"),
            click.option(
                "--template",
                default=None,
                help="text/chat: the user message, a str.format template over any columns, "
                "e.g. 'Subject: {subject}\\nBody: {body}'",
            ),
            click.option(
                "--response-format",
                type=click.Choice(["text", "json_object", "json_schema"]),
                default=None,
                help="text/chat: OpenAI's response_format for every request (json_schema: give --json-schema)",
            ),
            click.option(
                "--json-schema",
                type=click.Path(dir_okay=False),
                default=None,
                help="text/chat: answers hold to this JSON Schema file (response_format json_schema, strict)",
            ),
            click.option("--system-prompt", default=None, help="chat/text: a system message put first"),
            click.option(
                "--max-line-bytes",
                type=int,
                default=None,
                help="the longest JSONL line read (default 64 MiB): a longer one is set aside unread",
            ),
            click.option("--max-tokens", type=click.IntRange(min=1), default=None, help="sampling: the output budget"),
            click.option(
                "--temperature",
                type=click.FloatRange(min=0.0),
                default=None,
                help="sampling: 0 is greedy (a redone chunk answers the same); default: the model's, else 1.0",
            ),
            click.option("--top-p", type=click.FloatRange(0.0, 1.0, min_open=True), default=None, help="sampling"),
            click.option("--seed", type=int, default=None, help="sampling: a seed makes sampled answers repeatable"),
            click.option(
                "--limit",
                type=click.IntRange(min=1),
                default=None,
                metavar="N",
                help="a pilot run: a stratified sample of N rows (a later run of the whole input with "
                "--reuse-from it pays only for the rest)",
            ),
            click.option(
                "--reuse-from",
                "reuse_from",
                multiple=True,
                metavar="RUN",
                help="answer rows whose request another run answered from that run (repeatable; "
                "docs/runs-that-grow.md)",
            ),
            click.option(
                "--reuse-sampled/--no-reuse-sampled",
                default=None,
                help="with --reuse-from: reuse rows that sample too (temperature > 0, no seed)",
            ),
        ]
    ):
        func = option(func)
    return func


def input_flags(
    fmt: str | None,
    num_chunks: int | None,
    rows_per_chunk: int | None,
    group_by_prefix: bool | None,
    id_column: str | None,
    turns: str | None,
    conversation_column: str | None,
    text_column: str | None,
    template: str | None,
    response_format: str | None,
    json_schema: str | None,
    system_prompt: str | None,
    max_line_bytes: int | None,
    max_tokens: int | None = None,
    temperature: float | None = None,
    top_p: float | None = None,
    seed: int | None = None,
    limit: int | None = None,
    reuse_from: tuple[str, ...] = (),
    reuse_sampled: bool | None = None,
) -> dict[str, Any]:
    """The spec flags the input and sampling options give (dotted paths)."""
    from orchestrator.core.request_format import response_format_of

    flags: dict[str, Any] = {
        "input.response_format": response_format_of(response_format, json_schema),
        "input.format": fmt,
        "input.id_column": id_column,
        "input.turns": turns,
        "input.conversation_column": conversation_column,
        "input.text_column": text_column,
        "input.template": template,
        "input.system_prompt": system_prompt,
        "input.max_line_bytes": max_line_bytes,
        "input.limit": limit,
        "sampling.max_tokens": max_tokens,
        "sampling.temperature": temperature,
        "sampling.top_p": top_p,
        "sampling.seed": seed,
        "reuse.from": list(reuse_from) or None,
        "reuse.sampled": reuse_sampled,
    }
    flags = {k: v for k, v in flags.items() if v is not None}
    if num_chunks is not None and rows_per_chunk is not None:
        raise click.UsageError("--num-chunks and --rows-per-chunk: choose one")
    if num_chunks is not None:
        flags.update({"chunking.num_chunks": num_chunks, "chunking.rows_per_chunk": None})
    if rows_per_chunk is not None:
        flags.update({"chunking.rows_per_chunk": rows_per_chunk, "chunking.num_chunks": None})
    if group_by_prefix is not None:
        flags["chunking.group_by_prefix"] = group_by_prefix
    return flags


def check_model(ctx: RunContext, *, from_flag: bool, required: bool = True) -> None:
    """The run has a model (when `required`), and a local path names one: a directory with a
    config.json or a .gguf file (core/model_source.py). Named as the user gave it: `--model` or
    `model.name`. On the skypilot backend a local path is only warned about: the worker's image
    may hold it, though this machine's disk is out of the cloud machines' reach."""
    from orchestrator.core.errors import SpecError
    from orchestrator.core.pools import run_models

    for pool, model in run_models(ctx.spec).items():  # a run of several models: each one's
        _check_model_source(ctx, model.name or "", model.lora if required else {}, f"models.{pool}.name")
    if ctx.spec.models:
        return
    name = ctx.spec.model.name
    if not name:
        if required:
            raise SpecError(
                "no model", hint="pass --model PATH_OR_HUB_ID, or set model.name in orch.yaml", where="model.name"
            )
        return
    where = "--model" if from_flag else "model.name"
    _check_model_source(ctx, name, ctx.spec.model.lora if required else {}, where)


def _check_model_source(ctx: RunContext, name: str, lora: Mapping[str, str], where: str) -> None:
    """One model's path (and its adapters' shipped at launch) can be read by the run's workers."""
    from orchestrator.core.errors import SpecError
    from orchestrator.core.model_source import is_bucket_url, is_local_path, local_adapter_problem, local_model_problem

    if is_bucket_url(name) and ctx.spec.backend != "skypilot":
        raise SpecError(
            f"{name} is a bucket: SkyPilot workers mount it, {ctx.spec.backend} workers cannot read it",
            hint="use --backend skypilot, or give a local copy of the model (or its hub id)",
            where=where,
        )
    if ctx.spec.backend == "skypilot":
        if is_local_path(name):
            warn(
                f"{where} {name} is a path: a cloud machine reads it from its own disk, not this machine's "
                "(use a hub id, or a path baked into the worker's image)"
            )
        return
    problem = local_model_problem(name)
    if problem is not None:
        raise SpecError(
            problem,
            hint="give the directory that holds the model's config.json (or a .gguf file), or a hub id such as "
            "org/name",
            where=where,
        )
    for adapter, source in lora.items():  # shipped at launch, not prepare
        problem = local_adapter_problem(source)
        if problem is not None:
            raise SpecError(problem, hint="give the adapter's directory, or its hub id", where=f"model.lora.{adapter}")


def warn(message: str) -> None:
    """A yellow `warning:` line on stderr: something that works, but likely not as the user meant."""
    click.echo(click.style("warning", fg="yellow") + f": {message}", err=True)


def workers_line(launched: Mapping[int, str], running: Sequence[int], backend: str, *, attach: bool = True) -> str:
    """What a (re-)run or resume did with the workers: `launched 2 worker(s)`, and for workers that
    were running already (a re-run after Ctrl-C) `re-attached to 2 running worker(s) (0, 1)` when
    the command follows them, else `2 worker(s) already running (0, 1)`."""
    said = [f"launched {len(launched)} worker(s)"] if launched or not running else []
    ids = ", ".join(map(str, running))
    if running and attach:
        said.append(f"re-attached to {len(running)} running worker(s) ({ids})")
    elif running:
        said.append(f"{len(running)} worker(s) already running ({ids})")
    return f"{' and '.join(said)} on the {backend} backend"


def follow_run(
    ctx: RunContext,
    launcher: Launcher,
    interval: float,
    retries: int | None = None,
    deadline: DeadlineSettings | None = None,
    *,
    later_stages: bool = False,
    check: bool = True,
) -> int:
    """Follow the run until complete (api/lifecycle.follow_to_end; with `later_stages`, a cascade's
    next stages too). On a terminal the run's status is redrawn in place each tick; otherwise (logs,
    CI) one line per tick. Relaunch events are printed either way."""
    from orchestrator.api.lifecycle import Callbacks, follow_to_end
    from orchestrator.commands.console import Group, LiveView, Text, console
    from orchestrator.commands.reports import print_prepare_report
    from orchestrator.commands.views import status_view
    from orchestrator.commands.views import workers_line as busy_workers
    from orchestrator.runview.status import current_status

    live = LiveView(console())
    events: list[str] = []

    def event(message: str) -> None:
        events.append(f"{time.strftime('%H:%M:%S')} {message}")
        if not live.active:
            click.echo(events[-1])

    def tick(run: RunContext, running: Launcher, report: TickReport) -> None:
        status = current_status(run, launcher=running)
        if live.active:
            recent = [Text(""), Text("events:", style="bold"), *map(Text, events[-8:])] if events else []
            live.show(Group(status_view(status), *recent))
        else:
            click.echo(
                f"{time.strftime('%H:%M:%S')} chunks {report.chunks_done}/{report.chunks_total} done, "
                f"rows {status.rows.done + status.rows.in_progress:,}/{status.rows.total:,}; "
                f"workers: {busy_workers(status)}"
            )

    def started(_stage: RunContext, run: StartedRun) -> None:
        if run.remaining:
            click.echo(workers_line(run.launched, run.running, run.launcher.name))

    hear = Callbacks(
        progress=lambda line: click.echo(line, err=True),
        prepared=print_prepare_report,
        started=started,
        tick=tick,
        event=event,
        say=click.echo,
    )
    try:
        with live.running():
            report = follow_to_end(
                ctx,
                launcher,
                interval=interval,
                check=check,
                retries=retries,
                deadline=deadline,
                later_stages=later_stages,
                hear=hear,
            )
    except KeyboardInterrupt:
        interrupted(ctx, launcher)
    click.echo(f"run {ctx.layout.run!r} complete: {report.chunks_total} chunks done")
    if ctx.spec.sweep.cascade and not later_stages:  # the later stages live in `orch run` alone
        click.echo("that was a cascade's first stage: `orch run` runs the next ones (launch, resume, watch stop here)")
    return 0


#: After a first Ctrl-C, how long a second one has to stop the local workers.
SECOND_INTERRUPT_S = 5.0


def interrupted(ctx: RunContext, launcher: Launcher) -> NoReturn:
    """Ctrl-C while following a run: say what goes on without a controller and what to run next;
    on the local backend, a second Ctrl-C within SECOND_INTERRUPT_S stops those workers. Exits 130."""
    from orchestrator.fleet.follow import live_jobs

    live = live_jobs(ctx, launcher)
    flags = run_flags(ctx)
    lines = [f"interrupted: the controller stops here; the run {ctx.layout.run!r} goes on without it"]
    if live:
        lines.append(
            f"still running on the {launcher.name} backend: "
            + ", ".join(f"worker {w} (job {job})" for w, job in sorted(live.items()))
        )
        lines.append(f"  orch cancel {flags}    stops them (each flushes its finished rows first)")
    lines.append(f"  re-run the same command (or `orch watch {flags}`) to re-attach and finish the run")
    click.echo("\n".join(lines), err=True)
    if live and launcher.name == "local":
        try:  # entered before the prompt: a second Ctrl-C may come the moment it is shown
            click.echo(f"Ctrl-C again within {SECOND_INTERRUPT_S:g}s stops the local workers now.", err=True)
            time.sleep(SECOND_INTERRUPT_S)
        except KeyboardInterrupt:
            from orchestrator.fleet.launch import cancel_workers

            cancelled = cancel_workers(ctx)
            stopped = len(cancelled.live) + len(cancelled.strays)
            click.echo(f"stopped {stopped} local worker(s); `orch resume {flags} --follow` continues the run", err=True)
    raise click.exceptions.Exit(130)


def run_flags(ctx: RunContext) -> str:
    """--run (and --store, when not the default) naming this run on a command line."""
    from orchestrator.core.spec import DEFAULT_STORE

    store = f" --store {shlex.quote(ctx.spec.store)}" if ctx.spec.store != DEFAULT_STORE else ""
    return f"--run {shlex.quote(ctx.layout.run)}{store}"


def max_error_rate_option(func: Callable[..., Any]) -> Callable[..., Any]:
    return click.option(
        "--max-error-rate",
        type=click.FloatRange(0.0, 1.0),
        default=DEFAULT_MAX_ERROR_RATE,
        show_default=True,
        help="exit 9 (the output is still written) when a larger share of rows are errors; 1.0 never does",
    )(func)


def keep_columns_option(func: Callable[..., Any]) -> Callable[..., Any]:
    """`--keep-columns a,b`: input columns a table output carries beside the answers."""
    return click.option(
        "--keep-columns",
        callback=lambda _ctx, _param, value: [c.strip() for c in value.split(",") if c.strip()] if value else None,
        default=None,
        metavar="A,B",
        help="input columns to carry into a table output (read again from the run's input), beside the answers",
    )(func)


def merge_on_option(func: Callable[..., Any]) -> Callable[..., Any]:
    """`--merge-on COL`: a table output keeps one row per value of COL (orch collect, orch run)."""
    return click.option(
        "--merge-on",
        default=None,
        metavar="COLUMN",
        help="a table --out: upsert the run's rows by this column (the id, say) instead of appending them: "
        "a row whose key the table has replaces it (Delta MERGE, Iceberg upsert, Lance merge_insert)",
    )(func)
