"""GPU offerings from SkyPilot's catalog: what `orch prices --refresh` builds its table from.

The catalog is read with SkyPilot's own loader, which fetches SkyPilot's hosted catalog (the
schema version this SkyPilot reads) into ~/.sky/catalogs and falls back to the copy there when
the network is not reachable. A catalog edited by hand is read as it is, never overwritten.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from typing import Any

from orchestrator.backends.base import Offering


def catalog_offerings(gpus: Sequence[str], clouds: Sequence[str]) -> tuple[list[Offering], dict[str, str]]:
    """Offerings of the named GPUs on each cloud, and, per cloud whose catalog could not be read,
    why not. Only machine types are counted (GCP also lists GPUs to attach, without a machine)."""
    wanted = {g.upper() for g in gpus}
    offerings: list[Offering] = []
    problems: dict[str, str] = {}
    for cloud in clouds:
        try:
            rows = _vms(cloud)
        except Exception as e:  # unreachable, no cached copy, a cloud SkyPilot does not know
            problems[cloud] = _first_line(e)
            continue
        for row in rows:
            name = row.get("AcceleratorName")
            if not isinstance(name, str) or name.upper() not in wanted or not _known(row.get("InstanceType")):
                continue
            count, price, spot = row.get("AcceleratorCount"), row.get("Price"), row.get("SpotPrice")
            if count is None or price is None or not (_known(count) and _known(price)):
                continue
            offerings.append(
                Offering(
                    gpu=name,
                    cloud=cloud,
                    region=str(row.get("Region")),
                    gpus=int(count),
                    on_demand=float(price),
                    spot=float(spot) if spot is not None and _known(spot) else None,
                )
            )
    return offerings, problems


def _vms(cloud: str) -> list[dict[str, Any]]:
    from sky import sky_logging
    from sky.catalog import common

    # pull_frequency_hours=0: fetch a newer catalog now if one is reachable. Silenced: SkyPilot's
    # progress spinner is meant for its API server's clients and prints as raw `<sky-payload>`
    # markup here; what went wrong is raised, and said once by the caller.
    # The frame is lazy: it is fetched at its first use, inside the silenced block too.
    with sky_logging.silent():
        logging.getLogger("sky").setLevel(logging.CRITICAL)  # its "check your connection" too (restored on exit)
        frame = common.read_catalog(f"{cloud.lower()}/vms.csv", pull_frequency_hours=0)
        columns = ["InstanceType", "AcceleratorName", "AcceleratorCount", "Price", "SpotPrice", "Region"]
        present = [c for c in columns if c in frame.columns]
        records: list[dict[str, Any]] = frame[present].to_dict("records")
        return records


def _known(value: Any) -> bool:
    if value is None:
        return False
    if isinstance(value, float):
        return not math.isnan(value)
    return str(value).strip() != ""


def _first_line(e: Exception) -> str:
    import requests

    if isinstance(e, requests.ConnectionError):
        host = getattr(getattr(e.request, "url", None), "split", lambda _sep: ["", "", "its host"])("/")[2]
        return f"cannot reach {host} (no network?) and no copy is cached in ~/.sky/catalogs"
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0][:300]}" if text else type(e).__name__
