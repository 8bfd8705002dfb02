"""GPU types: relative speed and hourly prices from a dated table (orchestrator/data/gpus.yaml), overridable."""

from __future__ import annotations

import os
from collections import defaultdict
from collections.abc import Iterable
from functools import lru_cache
from pathlib import Path

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from orchestrator.backends.base import Offering
from orchestrator.core.errors import SpecError
from orchestrator.core.home import orch_home
from orchestrator.core.tempfiles import AtomicFile

DEFAULT_TABLE = Path(__file__).parents[1] / "data" / "gpus.yaml"


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Price(_Strict):
    on_demand: float = Field(gt=0, description="USD per GPU-hour")
    spot: float = Field(gt=0, description="USD per GPU-hour")


class GpuType(_Strict):
    name: str = ""
    relative_speed: float = Field(gt=0, description="throughput relative to an L4")
    memory_gb: float = Field(gt=0)
    prices: dict[str, Price] = Field(description="per cloud")

    def price(self, spot: bool, cloud: str | None = None) -> float:
        """USD per GPU-hour: the named cloud's, else the cheapest cloud's (what SkyPilot would pick)."""
        if cloud and cloud.lower() in self.prices:
            p = self.prices[cloud.lower()]
            return p.spot if spot else p.on_demand
        return min(p.spot if spot else p.on_demand for p in self.prices.values())

    @property
    def on_demand_usd_h(self) -> float:
        return self.price(spot=False)

    @property
    def spot_usd_h(self) -> float:
        return self.price(spot=True)


class GpuTable(_Strict):
    date: str
    source: str
    reference_output_tokens_per_s: float = Field(1100.0, gt=0, description="an L4's, for a 7-8B model")
    gpus: dict[str, GpuType]

    @field_validator("gpus")
    @classmethod
    def _named(cls, gpus: dict[str, GpuType]) -> dict[str, GpuType]:
        return {name: gpu.model_copy(update={"name": name}) for name, gpu in gpus.items()}

    def get(self, name: str) -> GpuType:
        gpu = self.find(name)
        if gpu is None:
            raise SpecError(
                f"unknown GPU type {name!r}", hint=f"known: {', '.join(self.gpus)} (or add it with --prices FILE)"
            )
        return gpu

    def find(self, name: str | None) -> GpuType | None:
        """Also matches the names machines report ("NVIDIA L4", "NVIDIA A100-SXM4-80GB")."""
        if not name:
            return None
        if name in self.gpus:
            return self.gpus[name]
        text = name.upper().replace("NVIDIA", "").replace("TESLA", "").strip()
        if "A100" in text:
            return self.gpus.get("A100-80GB" if "80G" in text else "A100")
        for known in sorted(self.gpus, key=len, reverse=True):
            if known.upper() in text.split("-")[0].split() or text.startswith(known.upper()):
                return self.gpus[known]
        return None

    def price(self, gpu: str, spot: bool, cloud: str | None = None) -> float:
        return self.get(gpu).price(spot, cloud)

    def per_machine(self, gpus_per_worker: int) -> GpuTable:
        """The table priced per worker machine of `gpus_per_worker` GPUs (a machine is paid for all
        its GPUs); speeds as they are."""
        if gpus_per_worker == 1:
            return self
        priced = {
            name: gpu.model_copy(
                update={
                    "prices": {
                        cloud: Price(on_demand=p.on_demand * gpus_per_worker, spot=p.spot * gpus_per_worker)
                        for cloud, p in gpu.prices.items()
                    }
                }
            )
            for name, gpu in self.gpus.items()
        }
        return self.model_copy(update={"gpus": priced})


def refreshed_table_path() -> Path:
    """Where `orch prices --refresh` writes the table it builds from SkyPilot's catalog."""
    return orch_home() / "prices.yaml"


def load_gpu_table(path: str | os.PathLike[str] | None = None) -> GpuTable:
    """The file given (or named by ORCH_PRICES), else the table `orch prices --refresh` wrote,
    else the built-in one."""
    path = path or os.environ.get("ORCH_PRICES") or None
    if path is None and refreshed_table_path().is_file():
        path = refreshed_table_path()
    return _load(str(Path(path).absolute()) if path else str(DEFAULT_TABLE))


@lru_cache(maxsize=8)
def _load(path: str) -> GpuTable:
    try:
        doc = yaml.safe_load(Path(path).read_text())
    except OSError as e:
        raise SpecError(f"cannot read the price table: {e}", where=path) from None
    try:
        return GpuTable.model_validate(doc)
    except ValidationError as e:
        err = e.errors()[0]
        field = ".".join(str(p) for p in err["loc"])
        raise SpecError(
            f"{field}: {err['msg']}", where=path, hint="see orchestrator/data/gpus.yaml for the format"
        ) from None


# -- refreshing the prices from a cloud catalog ------------------------------------------------
def table_from_offerings(base: GpuTable, offerings: Iterable[Offering], *, date: str, source: str) -> GpuTable:
    """`base` with the prices the offerings give: per GPU and cloud, the cheapest GPU-hour over the
    regions (what SkyPilot's any_of picks when capacity allows), on the machines with the fewest
    GPUs of that type. GPUs and clouds without offerings keep their earlier prices; speeds stay."""
    names = {name.upper(): name for name in base.gpus}
    by_gpu_cloud: dict[tuple[str, str], list[Offering]] = defaultdict(list)
    for o in offerings:
        if o.gpu.upper() in names and o.gpus >= 1 and o.on_demand > 0:
            by_gpu_cloud[(names[o.gpu.upper()], o.cloud.lower())].append(o)
    gpus = {name: dict(gpu.prices) for name, gpu in base.gpus.items()}
    for (name, cloud), found in by_gpu_cloud.items():
        fewest = min(o.gpus for o in found)
        smallest = [o for o in found if o.gpus == fewest]
        on_demand = min(o.on_demand for o in smallest) / fewest
        spots = [o.spot for o in smallest if o.spot is not None and o.spot > 0]
        old = gpus[name].get(cloud)
        # No spot price listed: keep the earlier one, else assume on-demand's.
        spot = min(spots) / fewest if spots else (old.spot if old else on_demand)
        gpus[name][cloud] = Price(on_demand=round(on_demand, 4), spot=round(spot, 4))
    return base.model_copy(
        update={
            "date": date,
            "source": source,
            "gpus": {name: gpu.model_copy(update={"prices": gpus[name]}) for name, gpu in base.gpus.items()},
        }
    )


def write_gpu_table(prices: GpuTable, path: str | os.PathLike[str]) -> None:
    doc = {
        "date": prices.date,
        "source": prices.source,
        "reference_output_tokens_per_s": prices.reference_output_tokens_per_s,
        "gpus": {name: g.model_dump(exclude={"name"}) for name, g in prices.gpus.items()},
    }
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    with AtomicFile(path) as out:  # a failed refresh keeps the table that was there
        out.file.write(yaml.safe_dump(doc, sort_keys=False).encode())
    _load.cache_clear()
