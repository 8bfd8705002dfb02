"""The published spot-availability traces ("Can't Be Late", NSDI'24) and the benchmark settings scored on them.

Each trace file is `{"metadata": {"gap_seconds": G, ...}, "data": [0, 1, ...]}`, one entry per tick
of G seconds; the multi-zone files also carry `"prices": [...]`, the zone's spot price (USD/h) per
tick (us-east-1 zones $1.11-1.85, the others $0.92-1.09 over the 100 traces; the single-zone files
list none). The published simulator bills a zone at the first of them (`CostModel`).

The meaning of the data is the one of the simulator that ships with them (`sky_spot/env.py`) and
that every published score uses: **1 means spot capacity is NOT available in that tick**, 0 means it
is. Read that way, the east zones are the scarce ones although the benchmark's README calls its east
scenarios "high availability"; the scorer prints each scenario's measured availability beside its name.

Two layouts, as unpacked from the archives in `shared/data/spot-traces/`:
- multi-zone: `converted_multi_region_aligned/<zone>_v100_1/<k>.json`, trace k of every zone over
  the same period (195 s ticks, about 60 h);
- single zone: `real/ddl=search+task=48+overhead=<h>/real/<zone>_<gpu>_<n>/traces/random_start/<k>.json`
  (600 s ticks, about 92 h); the overhead folders hold the same traces.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from orchestrator.core.errors import SpecError

H = 3600.0
#: The benchmark's prices (an AWS V100): spot about 0.32x on-demand. orch's cost model bills them
#: flat; a share of on-demand depends only on their ratio.
ON_DEMAND_USD_H = 3.06
SPOT_USD_H = 0.9701
#: The spot price the published simulator bills where a trace lists none (`sky_spot/utils.py`:
#: on-demand over its price ratio K = 3.06 / 0.9731).
BENCHMARK_SPOT_USD_H = 0.9731

MULTI_DIR = "converted_multi_region_aligned"
SINGLE_DIR = "real"


@dataclass(frozen=True)
class Trace:
    """One period's availability: `up[z][t]` is True when zone z has spot capacity in tick t."""

    name: str
    zones: tuple[str, ...]
    gap_s: float
    up: tuple[tuple[bool, ...], ...]
    #: Per zone, the spot price (USD/h) the trace file lists for its first tick, where it lists
    #: prices (the multi-zone files do, the single-zone ones do not): what the published
    #: multi-region simulator bills (`TraceEnv.get_constant_cost_map`).
    prices: tuple[float, ...] | None = None

    @property
    def ticks(self) -> int:
        return min(len(u) for u in self.up)

    def availability(self) -> float:
        """Share of (zone, tick) pairs with spot capacity."""
        return sum(sum(u) for u in self.up) / max(sum(len(u) for u in self.up), 1)


@dataclass(frozen=True)
class Job:
    """One job of the benchmark: `work_s` of computing, due `deadline_s` after it starts; a new machine
    (a start, a restart after a preemption, a switch between spot and on-demand or between zones)
    computes nothing for its first `overhead_s`."""

    work_s: float
    deadline_s: float
    overhead_s: float


@dataclass(frozen=True)
class CostModel:
    """How a replay is billed. orch's model is what a real fleet pays; the benchmark's is what the
    published simulator (Frontier-CS `cant_be_late_multi`, `sky_spot/env.py` and `strategy.py`)
    bills, so that a figure can be set beside the published ones."""

    name: str
    on_demand_usd_h: float
    spot_usd_h: float  # a spot tick's price where the trace lists none (or the model ignores them)
    #: Every spot tick billed at the listed price of the zone the job ends in (the simulator's
    #: `accumulated_cost` prices its whole history with the current region's cost map).
    final_zone_prices: bool
    #: A spot machine moved to another zone with capacity keeps running without a restart (the
    #: simulator restarts only when the market changes, and a region switch is not a change).
    free_spot_moves: bool

    def spot_price(self, trace: Trace, zone: int) -> float:
        if self.final_zone_prices and trace.prices is not None:
            return trace.prices[zone]
        return self.spot_usd_h


#: orch's model: one flat spot price, every new machine (a zone move included) a restart.
ORCH_COSTS = CostModel("orch", ON_DEMAND_USD_H, SPOT_USD_H, final_zone_prices=False, free_spot_moves=False)
#: The published benchmark's: per-zone prices from the traces, billed at the final zone's; free
#: spot-to-spot moves.
BENCHMARK_COSTS = CostModel(
    "benchmark", ON_DEMAND_USD_H, BENCHMARK_SPOT_USD_H, final_zone_prices=True, free_spot_moves=True
)
COST_MODELS = {m.name: m for m in (ORCH_COSTS, BENCHMARK_COSTS)}


@dataclass(frozen=True)
class Scenario:
    name: str
    availability: str  # the benchmark's label, "high" or "low"
    zones: tuple[str, ...]


#: The multi-zone benchmark's scenarios (zones per scenario; traces 0..7 of each).
SCENARIOS = tuple(
    Scenario(f"{label}-{i}", label, tuple(zones.split()))
    for label, groups in (
        (
            "high",
            (
                "us-east-1a us-east-1c",
                "us-east-2a us-west-2a",
                "us-east-1a us-east-2b us-west-2c",
                "us-east-1a us-east-1c us-east-1d",
                "us-east-1a us-east-1f us-west-2a us-west-2b us-east-2b",
                "us-east-1a us-east-1c us-east-1d us-east-1f us-east-2a us-east-2b us-west-2a us-west-2b us-west-2c",
            ),
        ),
        (
            "low",
            (
                "us-west-2a us-west-2b",
                "us-west-2a us-west-2b us-west-2c",
                "us-west-2a us-east-2a",
                "us-west-2a us-west-2b us-west-2c us-east-2a us-east-2b",
            ),
        ),
    )
    for i, zones in enumerate(groups, start=1)
)
MULTI_TRACES = range(8)
#: 24 h jobs, deadline 36 h or 48 h, restart 0.05 h or 0.20 h: the 8 variants (x the scenarios' availability).
MULTI_DEADLINES_H = (36.0, 48.0)
MULTI_OVERHEADS_H = (0.05, 0.20)
MULTI_WORK_H = 24.0

#: The single-zone grid as ADRS scored it: 48 h jobs in six (zone, machine) traces, deadline 52 h or
#: 70 h; the overheads are the ones the archive's folders carry.
SINGLE_ENVS = (
    "us-west-2a_k80_8",
    "us-west-2b_k80_1",
    "us-west-2b_k80_8",
    "us-west-2a_v100_1",
    "us-west-2a_v100_8",
    "us-west-2b_v100_1",
)
SINGLE_WORK_H = 48.0
SINGLE_DEADLINES_H = (52.0, 70.0)
SINGLE_OVERHEADS_H = (0.02, 0.20)
#: Traces per environment, evenly spaced over those long enough for the deadline (ADRS took 30).
SINGLE_TRACES = 30


def _read(path: Path) -> tuple[float, tuple[bool, ...], float | None]:
    """The tick, each tick's capacity, and the spot price listed for the first tick (None if none)."""
    try:
        doc = json.loads(path.read_text())
        gap = float(doc["metadata"]["gap_seconds"])
        prices = doc.get("prices")
        price = float(prices[0]) if prices else None
        return gap, tuple(int(v) == 0 for v in doc["data"]), price  # 1 = NOT available (sky_spot's meaning)
    except (OSError, ValueError, KeyError, TypeError, IndexError) as e:
        raise SpecError(
            f"not a spot-availability trace ({e})",
            where=str(path),
            hint='expected {"metadata": {"gap_seconds": G}, "data": [0, 1, ...]}',
        ) from None


def multi_zone_trace(root: Path, zones: tuple[str, ...], k: int) -> Trace:
    """Trace k of each zone (aligned: the same period in every zone)."""
    gaps, ups, prices = set(), [], []
    for zone in zones:
        gap, up, price = _read(root / MULTI_DIR / f"{zone}_v100_1" / f"{k}.json")
        gaps.add(gap)
        ups.append(up)
        prices.append(price)
    if len(gaps) != 1:
        raise SpecError(f"trace {k} of {', '.join(zones)}: ticks of different lengths {sorted(gaps)}", where=str(root))
    listed = tuple(p for p in prices if p is not None)
    return Trace(f"{'+'.join(zones)}/{k}", zones, gaps.pop(), tuple(ups), listed if len(listed) == len(zones) else None)


def single_zone_traces(root: Path, env: str, min_hours: float, count: int = SINGLE_TRACES) -> list[Trace]:
    """`count` traces of one environment, evenly spaced over those covering `min_hours`."""
    folder = root / SINGLE_DIR / f"ddl=search+task=48+overhead={SINGLE_OVERHEADS_H[0]:.2f}" / "real" / env
    files = sorted((folder / "traces" / "random_start").glob("*.json"), key=lambda p: int(p.stem))
    if not files:
        raise SpecError("no traces found", where=str(folder), hint=f"unpack the single-zone archive into {root}")
    traces = []
    for f in files:
        gap, up, _ = _read(f)  # these files list no prices
        if len(up) * gap >= min_hours * H:
            traces.append(Trace(f"{env}/{f.stem}", (env,), gap, (up,)))
    if len(traces) > count:
        step = (len(traces) - 1) / (count - 1)
        traces = [traces[round(i * step)] for i in range(count)]
    return traces


def check_layout(root: Path) -> None:
    """Say what is missing, and how to get it, before any scoring starts."""
    if not (root / MULTI_DIR).is_dir() or not (root / SINGLE_DIR).is_dir():
        raise SpecError(
            f"expected {MULTI_DIR}/ and {SINGLE_DIR}/ in the traces folder",
            where=str(root),
            hint="unpack both archives there: tar xzf FILE --warning=no-unknown-keyword --exclude='._*'",
        )
