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
        """The run's context from the spec file and the flags (api/context.open_run: `freeze`, `check`
        and `model` mean what they mean there); a frozen field that changes because nothing was
        produced with it yet is said on stderr."""
        from orchestrator.api.context import Spelling, open_run

        ctx = open_run(
            self.spec_file,
            self.flags,
            freeze=freeze,
            check=check,
            model=model,
            spelling=Spelling(model="--model", rename=as_flag_error),
            warn=warn,
        )
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
    "resources.task_template": "--task-template",
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


def input_flags(**input_args: Any) -> dict[str, Any]:
    """The spec flags the input options give (dotted paths): api/context.input_flags, which the
    Python API's keywords go through too."""
    from orchestrator.api.context import input_flags as flags_of

    return flags_of(**input_args)


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
