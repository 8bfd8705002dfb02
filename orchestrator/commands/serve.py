"""`orch serve`: the OpenAI Batch API over this store, every batch an orch run on the configured backend."""

from __future__ import annotations

import logging
import os

import click

from orchestrator.commands.shared import backend_option


@click.command("serve")
@click.option("-f", "--file", "spec_file", type=click.Path(dir_okay=False), help="spec file (default: ./orch.yaml)")
@click.option("--store", "store", help="store URI: a directory (default ./.orch), s3://B/P or r2://B/P")
@backend_option
@click.option("--host", default="127.0.0.1", show_default=True, help="address to listen on")
@click.option("--port", type=int, default=8000, show_default=True)
@click.option(
    "--model",
    "models",
    multiple=True,
    metavar="NAME=PATH_OR_HUB_ID",
    help="serve this model under NAME (repeatable; next to serve.models in the spec)",
)
@click.option(
    "--model-alias",
    "aliases",
    multiple=True,
    metavar="ALIAS=NAME",
    help="also answer batches naming ALIAS with the served model NAME, e.g. gpt-4o-mini=smol (repeatable)",
)
@click.option(
    "--api-keys-file",
    type=click.Path(dir_okay=False),
    default=None,
    help="API keys, one per line (with ORCH_API_KEYS=K1,K2); without keys, loopback only",
)
@click.option(
    "--allowed-host",
    "allowed_hosts",
    multiple=True,
    metavar="NAME",
    help="a name clients reach the server by, besides localhost and --host: orch.example.com, .example.com "
    "(and names under it), 10.0.0.5 (repeatable; with ORCH_SERVE_ALLOWED_HOSTS=N1,N2)",
)
@click.option(
    "--reuse/--no-reuse",
    default=None,
    help="a batch reuses the answers of its own key's earlier batches, running only new rows (serve.reuse)",
)
def serve_command(
    spec_file: str | None,
    store: str | None,
    backend: str | None,
    host: str,
    port: int,
    models: tuple[str, ...],
    aliases: tuple[str, ...],
    api_keys_file: str | None,
    allowed_hosts: tuple[str, ...],
    reuse: bool | None,
) -> int:
    """Serve OpenAI's Batch API: code written for OpenAI's Files and Batches endpoints runs
    unchanged against this server, changing only base_url (and the key).

    Each batch is an orch run named by the batch id: prepared, planned and launched on the
    backend, kept going as `orch watch` does, and its output and error files written from the done
    markers. Everything lives in the store: stop or kill the server, start it again, and every
    batch carries on (`orch status --run BATCH_ID` shows one).
    """
    from orchestrator.core.errors import SpecError
    from orchestrator.core.spec_load import load_spec
    from orchestrator.serve.app import serve
    from orchestrator.serve.settings import EVERY_INTERFACE, load_settings

    flags = {k: v for k, v in {"store": store, "backend": backend, "serve.reuse": reuse}.items() if v is not None}
    spec = load_spec(spec_file, flags)
    if spec.sweep.cascade:  # a batch would be its first stage alone: the later ones live in `orch run`
        raise SpecError(
            "orch serve does not run a cascade",
            hint="serve without sweep.cascade; run the cascade with orch run (docs/models.md)",
            where="sweep.cascade",
        )
    # Read once, then out of the environment: the workers started from here never inherit the keys.
    api_keys = os.environ.pop("ORCH_API_KEYS", None)
    hosts = [*os.environ.get("ORCH_SERVE_ALLOWED_HOSTS", "").split(","), *allowed_hosts]
    settings = load_settings(
        spec, models, host=host, api_keys=api_keys, api_keys_file=api_keys_file, allowed_hosts=hosts, aliases=aliases
    )
    _log_to_stderr()
    keys = f"{len(settings.keys.owners)} API key(s)" if not settings.keys.open else "no API keys (open, loopback only)"
    click.echo(
        f"orch serve: {', '.join(sorted(settings.models))} on the {spec.backend} backend, store {spec.store}, {keys}; "
        f"answers to Host {settings.allowed_hosts.describe()}"
        + ("; batches reuse their own key's earlier answers" if spec.serve.reuse else ""),
        err=True,
    )
    if not settings.allowed_hosts.names and host in EVERY_INTERFACE:
        click.echo(
            f"orch serve: listening on every interface ({host or '*'}), but other machines reach it only by a "
            "name given with --allowed-host NAME (or ORCH_SERVE_ALLOWED_HOSTS): requests naming others are refused",
            err=True,
        )
    serve(
        settings,
        host,
        port,
        announce=lambda url: click.echo(f"orch serve: listening on {url} (the SDK's base_url)", err=True),
    )
    return 0


def _log_to_stderr() -> None:
    """The server's events (a batch validated, launched, finished...), timestamped, next to uvicorn's lines."""
    logger = logging.getLogger("orch.serve")
    handler = logging.StreamHandler()
    handler.setFormatter(logging.Formatter("%(asctime)s orch.serve %(levelname)s %(message)s"))
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)


def register(cli: click.Group) -> None:
    cli.add_command(serve_command)
