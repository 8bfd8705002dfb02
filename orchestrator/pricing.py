"""GPU types: relative speed and hourly prices from a dated table (orchestrator/data/gpus.yaml), overridable."""

from __future__ import annotations

import os
from functools import lru_cache
from pathlib import Path

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from orchestrator.errors import SpecError

DEFAULT_TABLE = Path(__file__).parent / "data" / "gpus.yaml"


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
            raise SpecError(f"unknown GPU type {name!r}", hint=f"known: {', '.join(self.gpus)} (or add it with --prices FILE)")
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


def load_gpu_table(path: str | os.PathLike | None = None) -> GpuTable:
    """The built-in table, or the file given (or named by ORCH_PRICES)."""
    path = path or os.environ.get("ORCH_PRICES") or None
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
        raise SpecError(f"{field}: {err['msg']}", where=path, hint="see orchestrator/data/gpus.yaml for the format") from None
