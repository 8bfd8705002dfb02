"""Backends that run workers: `local` processes on this machine, or SkyPilot managed jobs.

`backend_for` is the one place a backend is chosen; heavy SDKs load only once one is.
"""

from __future__ import annotations

from orchestrator.backends.base import Launcher
from orchestrator.core.context import RunContext
from orchestrator.core.errors import SpecError


def backend_for(ctx: RunContext, backend: str | None = None) -> Launcher:
    """The launcher for the run's backend (or the one named)."""
    spec = ctx.spec
    name = backend or spec.backend
    if name == "local":
        from orchestrator.backends.local import LocalLauncher, local_log_dir

        return LocalLauncher(local_log_dir(spec, ctx.store), workers=spec.workers.count)
    if name == "skypilot":
        if not ctx.store.shared:
            raise SpecError(
                f"the skypilot backend needs a store its cloud machines can reach, not the local path {spec.store!r}",
                hint="use --store s3://BUCKET/PREFIX or r2://BUCKET/PREFIX",
            )
        from orchestrator.backends.skypilot import SkyPilotLauncher

        return SkyPilotLauncher(spec=spec)
    raise SpecError(f"unknown backend {name!r}", hint="local or skypilot")
