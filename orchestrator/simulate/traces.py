"""Preemption traces: when spot machines are taken away, and when spot capacity is gone altogether.

A trace file (YAML or JSON), times in seconds from the start of the run:

    preemptions:                      # a machine is taken away (spot only)
      - {t: 3600, worker: 3}          # worker 3's machine
      - {t: 7200, gpu: L4}            # every spot L4 running then
    outages:                          # no spot capacity: machines of that kind are taken away at
      - {start: 7200, end: 14400, gpu: A100}   # `start` and none comes back before `end`

`gpu` may be omitted (all types). The same trace replays for every policy compared.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass, field
from pathlib import Path

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from orchestrator.core.errors import SpecError


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Preemption(_Strict):
    t: float = Field(ge=0)
    worker: int | None = None
    gpu: str | None = None


class Outage(_Strict):
    start: float = Field(ge=0)
    end: float = Field(ge=0)
    gpu: str | None = None


class TraceFile(_Strict):
    preemptions: list[Preemption] = Field(default_factory=list)
    outages: list[Outage] = Field(default_factory=list)


@dataclass
class Trace:
    """Preemption times per worker (absolute seconds), and spot outages."""

    preemptions: dict[int, list[float]] = field(default_factory=dict)
    outages: list[Outage] = field(default_factory=list)

    def available_at(self, gpu: str, t: float) -> float:
        """When spot capacity of this GPU is back, if it is out at t (else t)."""
        for outage in sorted(self.outages, key=lambda o: o.start):
            if (outage.gpu in (None, gpu)) and outage.start <= t < outage.end:
                t = outage.end
        return t


def poisson_trace(gpus: list[str], rate_per_hour: float, horizon_s: float, rng: random.Random) -> Trace:
    trace = Trace()
    for worker in range(len(gpus)):
        times, t = [], 0.0
        while rate_per_hour > 0:
            t += rng.expovariate(rate_per_hour / 3600)
            if t > horizon_s:
                break
            times.append(t)
        trace.preemptions[worker] = times
    return trace


def load_trace(path: str | Path, gpus: list[str]) -> Trace:
    """A trace file, resolved for a fleet whose worker i runs `gpus[i]`."""
    try:
        text = Path(path).read_text()
        doc = json.loads(text) if str(path).endswith(".json") else yaml.safe_load(text)
        parsed = TraceFile.model_validate(doc or {})
    except OSError as e:
        raise SpecError(f"cannot read the trace: {e}", where=str(path)) from None
    except (ValueError, ValidationError) as e:
        raise SpecError(
            f"not a valid preemption trace: {e}",
            where=str(path),
            hint="see orchestrator/simulate/traces.py for the format",
        ) from None
    trace = Trace(preemptions={w: [] for w in range(len(gpus))}, outages=parsed.outages)
    for p in parsed.preemptions:
        for worker, gpu in enumerate(gpus):
            if (p.worker is None or p.worker == worker) and (p.gpu is None or p.gpu == gpu):
                trace.preemptions[worker].append(p.t)
    for outage in parsed.outages:
        for worker, gpu in enumerate(gpus):
            if outage.gpu in (None, gpu):
                trace.preemptions[worker].append(outage.start)
    for times in trace.preemptions.values():
        times.sort()
    return trace


def bursty_trace(
    gpus: list[str],
    rate_per_hour: float,
    horizon_s: float,
    rng: random.Random,
    *,
    outages: int = 1,
    outage_s: float = 7200.0,
    within_s: float = 6 * 3600.0,
) -> Trace:
    """Poisson preemptions plus `outages` windows, starting within `within_s`, with no spot capacity
    at all for `outage_s`: every spot machine is taken away and none comes back until the end."""
    trace = poisson_trace(gpus, rate_per_hour, horizon_s, rng)
    for _ in range(outages):
        start = rng.uniform(0, within_s)
        trace.outages.append(Outage(start=start, end=start + outage_s))
        for worker in range(len(gpus)):
            trace.preemptions[worker] = sorted([*trace.preemptions[worker], start])
    return trace
