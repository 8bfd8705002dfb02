"""What `orch launch --dry-run` can check before a real SkyPilot launch: each prerequisite, and what is missing.

Each check says what it found and, when something is missing, what to do. Nothing here starts
anything: SkyPilot's enabled infra is asked of an API server that already answers (starting one
takes a minute and would be a side effect of a dry run); otherwise the check says how to ask.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import parse_qs, urlparse

from orchestrator.core.model_source import MODEL_MOUNT, is_bucket_url, is_local_path
from orchestrator.core.spec import RunSpec, SlurmSpec, is_on_prem

SLURM_CONFIG = "~/.slurm/config"


@dataclass(frozen=True)
class Check:
    """One prerequisite: met or not, and what was found (or what to do)."""

    name: str
    ok: bool
    detail: str


def prerequisites(spec: RunSpec, env: Mapping[str, str]) -> list[Check]:
    """Every check that can run here, in the order a first real run meets them."""
    places = list(spec.resources.infra) or ([spec.resources.cloud] if spec.resources.cloud else [])
    checks = [_store_credentials(spec.store, env), _store_reachable(spec.store, places, spec.resources.slurm)]
    checks += [_slurm_login(place) for place in places if place.lower().startswith("slurm")]
    checks.append(_enabled_infra(places))
    if is_bucket_url(spec.model.name or ""):
        detail = f"{spec.model.name} mounted at {MODEL_MOUNT} (MOUNT_CACHED): read from the bucket, not the hub"
        checks.append(Check("model weights", True, detail))
    elif not is_local_path(spec.model.name or ""):
        has_token = bool(env.get("HF_TOKEN"))
        detail = (
            "HF_TOKEN set: passed to the workers as a secret"
            if has_token
            else "HF_TOKEN not set: fine for an open model; a gated one (meta-llama/...) fails to download on "
            "every worker. Set HF_TOKEN (a token that has accepted the model's licence)"
        )
        checks.append(Check("hub token", has_token, detail))
    return checks


def _store_credentials(store: str, env: Mapping[str, str]) -> Check:
    scheme = urlparse(store).scheme
    needed = {
        "s3": ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"),
        "r2": ("R2_ACCOUNT_ID", "R2_ACCESS_KEY_ID", "R2_SECRET_ACCESS_KEY"),
    }.get(scheme)
    if needed is None:
        return Check("store credentials", False, f"{store} is not s3:// or r2://: no worker elsewhere can reach it")
    missing = [name for name in needed if not env.get(name)]
    if missing:
        return Check("store credentials", False, f"{', '.join(missing)} not set: workers could not open {store}")
    return Check("store credentials", True, f"{', '.join(needed)} set: passed to the workers as secrets")


def _store_reachable(store: str, places: list[str], slurm: SlurmSpec) -> Check:
    """The store was just read from here; a loopback endpoint is reachable only from this machine,
    so only by workers on it: a Slurm cluster whose only compute node is this login host, as the
    spec says (`resources.slurm.single_machine`). Any other cluster's node is another machine, on
    which 127.0.0.1 is that node itself."""
    endpoint = (parse_qs(urlparse(store).query).get("endpoint") or [os.environ.get("ORCH_S3_ENDPOINT_URL", "")])[0]
    host = urlparse(endpoint).hostname or ""
    loopback = host in ("localhost", "::1") or host.startswith("127.")
    here = bool(places) and slurm.single_machine and all(p.lower().startswith("slurm") for p in places)
    if loopback and not here:
        nodes = ", ".join(places) if places and all(is_on_prem(p) for p in places) else "a cloud"
        hint = " (resources.slurm.single_machine: true if the login host is its only node)" if "slurm" in nodes else ""
        return Check(
            "store reachable",
            False,
            f"{endpoint} is this machine's loopback: a worker on {nodes}'s machines cannot reach it{hint}",
        )
    return Check("store reachable", True, f"read from here{f' ({endpoint})' if endpoint else ''}")


def _slurm_login(place: str) -> Check:
    """SkyPilot reaches a Slurm cluster's login node through an SSH-config entry named after it."""
    cluster = place.split("/", 1)[1] if "/" in place else None
    path = os.path.expanduser(SLURM_CONFIG)
    try:
        lines = Path(path).read_text().splitlines()
    except OSError:
        return Check(
            "slurm login", False, f"no {SLURM_CONFIG}: SkyPilot finds Slurm clusters there (Host, HostName, User)"
        )
    hosts = {word for line in lines if line.strip().lower().startswith("host ") for word in line.split()[1:]}
    if cluster and cluster not in hosts:
        return Check(
            "slurm login", False, f"{SLURM_CONFIG} has no `Host {cluster}` (it has {', '.join(sorted(hosts))})"
        )
    return Check("slurm login", True, f"{SLURM_CONFIG} names {cluster or ', '.join(sorted(hosts))}")


def _enabled_infra(places: list[str]) -> Check:
    """`sky check`'s result, from an API server that already answers (never started from here)."""
    try:
        from sky.server import common

        if common.get_api_server_status().status.value != "healthy":
            raise ConnectionError
        import sky
        from sky.client import sdk

        enabled = {str(c).lower() for c in sky.get(sdk.enabled_clouds())}
    except Exception:  # no server, or one that cannot answer: say how to find out
        return Check("sky check", False, "no SkyPilot API server answers: `sky check` says which infra is enabled")
    kinds = {p.split("/", 1)[0].lower().replace("k8s", "kubernetes") for p in places}
    missing = sorted(k for k in kinds if k not in enabled)
    if not enabled or missing:
        wanted = ", ".join(missing) if missing else "any"
        return Check(
            "sky check",
            False,
            f"not enabled: {wanted} (enabled: {', '.join(sorted(enabled)) or 'none'}); run `sky check`",
        )
    return Check("sky check", True, f"enabled: {', '.join(sorted(enabled))}")
