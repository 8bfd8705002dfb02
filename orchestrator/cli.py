"""The `orch` command line: parses flags, calls the services, renders results. One place turns errors into messages."""

from __future__ import annotations

import functools
import os
import sys
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import click

from orchestrator import __version__
from orchestrator.errors import OrchError


@dataclass
class Invocation:
    """What every command shares: the spec file and the flags that override the spec."""

    spec_file: str | None
    flags: dict[str, Any]

    def context(self, freeze: bool = False):
        """The run's spec (stored < file < env < flags) and store; with `freeze`, the spec is
        checked against the run's frozen fields and recorded."""
        from orchestrator.context import resolve_spec

        return resolve_spec(self.spec_file, self.flags, freeze=freeze)


def common_options(func: Callable) -> Callable:
    """--run, --store, --model and -f on every command, collected into an Invocation."""

    @click.option("-f", "--file", "spec_file", type=click.Path(dir_okay=False), help="spec file (default: ./orch.yaml)")
    @click.option("--run", "run", help="run name: the run's prefix in the store")
    @click.option("--store", "store", help="store URI: a directory (default ./.orch), s3://B/P or r2://B/P")
    @click.option("--model", "model", help="model: a local path or a hub id (overrides the spec)")
    @functools.wraps(func)
    def wrapper(spec_file, run, store, model, **kwargs):
        flags = {k: v for k, v in {"run": run, "store": store, "model.name": model}.items() if v is not None}
        return func(Invocation(spec_file, flags), **kwargs)

    return wrapper


@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(__version__, prog_name="orch")
def cli() -> None:
    """Offline LLM batch inference on spot GPUs, across clouds, every row answered exactly once.

    \b
    A run: prepare -> plan -> launch -> status/watch -> collect (or all at once: orch run).
    Tracebacks: set ORCH_DEBUG=1.
    """


def _register_commands() -> None:
    """Each command group lives in its own module under orchestrator/commands/."""
    import importlib
    import pkgutil

    from orchestrator import commands

    if cli.commands:
        return
    for mod in sorted(pkgutil.iter_modules(commands.__path__), key=lambda m: m.name):
        importlib.import_module(f"orchestrator.commands.{mod.name}").register(cli)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the CLI and return its exit code (tests call this directly)."""
    _register_commands()
    try:
        result = cli.main(args=list(argv) if argv is not None else None, prog_name="orch", standalone_mode=False)
        return result if isinstance(result, int) else 0
    except click.exceptions.Abort:
        click.echo("Aborted.", err=True)
        return 130
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


def render_error(e: OrchError) -> None:
    """The one way an error reaches a user: a red ERROR line and a hint (the traceback with ORCH_DEBUG=1).
    Call it while handling the exception."""
    if os.environ.get("ORCH_DEBUG"):
        traceback.print_exc()
    click.echo(click.style("ERROR", fg="red", bold=True) + f" {e}", err=True)
    if e.hint:
        click.echo(click.style("hint", fg="yellow") + f": {e.hint}", err=True)


def entry_point() -> None:
    sys.exit(main())
