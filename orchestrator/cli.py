"""The `orch` command line: the command group, and the one place errors become messages and exit codes.

Each command (or group of related commands) lives in its own module under orchestrator/commands/;
they share options and helpers through orchestrator/commands/shared.py, never through each other.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

import click

from orchestrator import __version__
from orchestrator.commands import (
    collect,
    estimate,
    lifecycle,
    prepare,
    prices,
    redo,
    run,
    runs,
    serve,
    simulate,
    status,
)
from orchestrator.core.errors import OrchError, render_error


@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(__version__, prog_name="orch")
def cli() -> None:
    """Offline LLM batch inference on spot GPUs, across clouds, every row answered exactly once.

    \b
    A run: prepare -> plan -> launch -> status/watch -> collect (or all at once: orch run).
    The OpenAI Batch API over runs: orch serve.
    Tracebacks: set ORCH_DEBUG=1.
    """


for _module in (collect, estimate, lifecycle, prepare, prices, redo, run, runs, serve, simulate, status):
    _module.register(cli)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the CLI and return its exit code (tests call this directly)."""
    try:
        result = cli.main(args=list(argv) if argv is not None else None, prog_name="orch", standalone_mode=False)
        return result if isinstance(result, int) else 0
    except click.exceptions.Abort:
        click.echo("Aborted.", err=True)
        return 130
    except click.UsageError as e:  # a flag's value, a missing argument: the same ERROR line as the rest
        command = e.ctx.command_path if e.ctx is not None else "orch"
        render_error(OrchError(e.format_message(), hint=f"`{command} --help` lists what it takes"))
        return e.exit_code
    except click.ClickException as e:
        e.show()
        return e.exit_code
    except click.exceptions.Exit as e:
        return e.exit_code
    except OrchError as e:
        render_error(e)
        return e.exit_code
    except KeyboardInterrupt:
        click.echo("Interrupted.", err=True)
        return 130


def entry_point() -> None:
    sys.exit(main())
