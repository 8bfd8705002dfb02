"""The controller: launching workers, reconciling them until the run is complete, cancelling them."""

from __future__ import annotations

from pathlib import Path

from orchestrator import orch_home
from orchestrator.backends.base import Launcher
from orchestrator.errors import SpecError
from orchestrator.spec import RunSpec


def backend_for(spec: RunSpec, backend: str | None = None) -> Launcher:
    """The launcher for the spec's backend (or the one named). Heavy SDKs load only here."""
    name = backend or spec.backend
    if name == "local":
        from orchestrator.backends.local import LocalLauncher

        return LocalLauncher(local_log_dir(spec), workers=spec.workers.count)
    if name == "skypilot":
        store = spec.store
        if "://" not in store or store.startswith("file://"):
            raise SpecError(
                f"the skypilot backend needs a store its cloud machines can reach, not the local path {store!r}",
                hint="use --store s3://BUCKET/PREFIX or r2://BUCKET/PREFIX",
            )
        from orchestrator.backends.skypilot import SkyPilotLauncher

        return SkyPilotLauncher(spec=spec)
    raise SpecError(f"unknown backend {name!r}", hint="local or skypilot")


def local_log_dir(spec: RunSpec) -> Path:
    """Worker logs of the local backend: ORCH_HOME (default ./.orch) / logs / <run>."""
    return orch_home() / "logs" / spec.layout.run
