"""A forecast with bands: the run's engine work from the probe (bootstrapped), and each candidate fleet's
duration and cost p10/p50/p90 from the simulator run over seeds with the measured speed.

Work is counted in engine seconds of one worker over the rows the run has left (the probe's own rows are
done): each row costs its generated tokens at the probe's seconds per unit, its uncached prompt
tokens at PREFILL_WEIGHT of a unit (one probe chunk measures one engine time, so the split between
prefill and decode is an assumption, said in the record's note). A unit is a generated token of a
full engine batch: the probe's own decode is counted in slot-steps (probe_work.py), since its few
batches run part-empty where the run's stay full. The probe runs two full engine batches by
default: the rate is taken past the first (the engine's warm-up, added once per worker); which share
of the first batch's excess was warm-up is not measured, so each draw takes a rate log-uniform
between that and the probe's whole rate (the band holds the split's doubt). Output lengths: per
stratum, the probe's generated / max_tokens ratios, resampled with replacement (a bootstrap of the
stratum's mean) and applied to the stratum's max_tokens in the run; strata the probe missed draw
from all its rows. Prompt tokens: the run's bytes / 4, corrected by the probe's measured ratio;
cached share from the probe's hits and the run's prefix groups (probe_work.py). The rate itself
varies from one engine to the next (RATE_SIGMA, measured by bench/forecast_bench.py), and more when the
probe measured it over few seconds (WINDOW_SIGMA): each draw scales it by a log-normal factor, so the
band holds these spreads too.

A local fleet: the busiest worker of the plan over the rows left, at the probe's rate shared by
the workers this machine's cores hold at once, at an efficiency of sharing drawn in its measured range.

Without a probe (`kind: guess`): the price table's speed scaled by the model's size (config.json:
12 x layers x hidden^2 parameters against the table's 8B), outputs between 10% and 100% of
max_tokens: a wide band, and the note says `--probe` narrows it.
"""

from __future__ import annotations

import json
import math
import os
import random
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from orchestrator.core.context import RunContext
from orchestrator.core.records import ManifestEntry
from orchestrator.core.records.forecast import (
    Band,
    CandidateForecast,
    ForecastRecord,
    ProbeRecord,
    RowSample,
    StratumCount,
)
from orchestrator.core.static_batches import POOL_BATCHES
from orchestrator.planning.measured import Measured
from orchestrator.planning.pricing import GpuTable, load_gpu_table
from orchestrator.planning.probe_work import StaticRow, run_cached_share, static_units, units_until

#: Cost of an uncached prompt token against a generated one in a saturated batch (an assumption).
PREFILL_WEIGHT = 0.05
#: The share of an engine step's cost that does not grow with the rows running (probe_work.py): not
#: measured, so each draw takes one in this range. Mostly fixed where weights are read once a step
#: (a GPU's decode) or the engine's own overhead dominates (a small model on a CPU).
FIXED_STEP_SHARE = (0.5, 1.0)
BOOTSTRAP = 400
#: A static-batch engine's run is replayed over this many pools of its rows per draw (work_seconds).
STATIC_RUN_POOLS = 8
SEEDS = 5
#: The price table's speeds are for a 7-8B model.
TABLE_PARAMS = 8e9
#: Without a probe: a generated share of max_tokens from 10% to 100%, and speed within 3x of the table's.
GUESS_SPEED_SPREAD = 3.0
#: A CPU has no row in the price table: its guess is an L4's speed / 20, within 10x either way.
CPU_GUESS_SPEED_SPREAD = 10.0
#: A speed (and tokens per row) that finished chunks of this model measured on the same kind of
#: machine: another run's rows and another moment of a shared machine, within 1.5x either way.
MEASURED_SPEED_SPREAD = 1.5
#: A local worker's start-up before its first answer when nothing measured it: importing vLLM and
#: loading a small model, 10-30 s on this 2-core machine (the probe's load_s), up to a minute loaded.
LOCAL_STARTUP_S = 30.0
#: Workers sharing one machine's cores do not add up, and by how much depends on the workload and on
#: what else the machine runs: two single-thread workers on this 2-vCPU machine each ran at 0.74-0.85
#: of one alone on steady workloads and at 0.98 on short outputs (bench/forecast_bench.py, runs 4-7;
#: the probe runs alone). Not measured by a probe: each draw takes one in this range.
SHARED_CORE_EFFICIENCY = (0.74, 1.0)
#: More worker threads than cores cost more again, up to as much again as this range: 4 single-thread
#: workers on 2 vCPUs spent 1.58x the probe's CPU seconds a token where 2 spent 1.17x (run 4: 0.74);
#: runs 6-7 replayed with the engine's feed order (probe_units) fall inside the range.
OVERSUBSCRIBED_EFFICIENCY = (0.74, 1.0)
#: Spread (log-normal sigma) of one worker's engine rate against another's on the same workload:
#: what a probe's one measured rate cannot see (bench/forecast_bench.py, docs/BENCHMARKS.md).
RATE_SIGMA = 0.1
#: A machine's speed wanders at the scale of a second (neighbours, a shared VM's steal), so a rate
#: taken over T seconds of engine time is off by this much / sqrt(T) more: 0.1 is 10% for a probe
#: that measured 1 s, 1.3% for one of a minute. Fitted on calibration runs 8-9 (probes of 0.3-0.8 s
#: off by up to 39% in CPU seconds a row) and checked on later runs (docs/BENCHMARKS.md).
WINDOW_SIGMA = 0.1


@dataclass(frozen=True)
class SimulatedFleet:
    """A candidate fleet as the forecast hands it to the simulator: its machines and their speed."""

    workers: int
    gpu: str
    spot: bool
    base_rows_per_s: float
    restart_overhead_s: float
    checkpoint_interval_s: float


class FleetSimulator(Protocol):
    """One simulated run of the rows left on a fleet (orchestrator/simulate's fleet_outcome): its
    makespan and cost. Handed in by the caller, so planning never imports the simulator above it."""

    def __call__(
        self, fleet: SimulatedFleet, seed: int, entries: Sequence[ManifestEntry], prices: GpuTable
    ) -> tuple[float, float]: ...


def band(values: Sequence[float]) -> Band:
    q = statistics.quantiles(values, n=10, method="inclusive") if len(values) > 1 else [values[0]] * 9
    return Band(p10=round(q[0], 3), p50=round(statistics.median(values), 3), p90=round(q[8], 3))


def model_params(model: str | None) -> float | None:
    """12 x layers x hidden^2 + vocab x hidden, from a local model's config.json (None if unreadable)."""
    if not model or not (Path(model) / "config.json").is_file():
        return None
    try:
        cfg = json.loads((Path(model) / "config.json").read_text())
        hidden, layers = int(cfg["hidden_size"]), int(cfg["num_hidden_layers"])
        return 12.0 * layers * hidden * hidden + int(cfg.get("vocab_size", 0)) * hidden
    except (ValueError, KeyError, TypeError):
        return None


def left_strata(probe: ProbeRecord, done: Sequence[RowSample] | None = None) -> dict[str, StratumCount]:
    """The run's strata less the rows probes answered (`done`; by default this probe's): what the
    run's workers still have to answer."""
    left = {name: count.model_copy() for name, count in probe.strata.items()}
    for x in probe.samples if done is None else done:
        c = left.get(x.stratum)
        if c is not None:
            c.rows, c.max_tokens = c.rows - 1, c.max_tokens - x.max_tokens
            c.est_prompt_tokens -= x.est_prompt_tokens
    return {name: c for name, c in left.items() if c.rows > 0}


def warm_up_split(probe: ProbeRecord) -> bool:
    """Whether the probe's heartbeat kept its figures at a first batch that left rows after it: when
    every probe row came back in one drain of the engine (a short probe, outputs of one length), the
    rate cannot be told from the engine's warm-up and is an upper bound (bench/forecast_bench.py)."""
    fb = probe.first_batch
    return fb is not None and len(fb) >= 6 and fb[2] < len(probe.samples)


def probe_units(probe: ProbeRecord, fixed: float = 1.0, rows_done: int | None = None) -> float:
    """Engine units of the probe's rows, all of them or (`rows_done`) up to its first batch: decode in
    slot-steps where the probe knows its engine batch (probe_work.py; `fixed` the step's fixed share),
    else in generated tokens, and prefill at PREFILL_WEIGHT per uncached prompt token."""
    s, fb = probe.samples, probe.first_batch
    if rows_done is not None and fb is not None:
        prefill, tokens = fb[3] - fb[5], fb[4]
    else:
        prefill, tokens = sum(x.prompt_tokens - x.cached_tokens for x in s), sum(x.completion_tokens for x in s)
    if probe.engine_batch and probe.static_batches:
        tokens = static_units([StaticRow.of(x) for x in fed(s)], probe.engine_batch, fixed, rows_done)
    elif probe.engine_batch:
        tokens = units_until([x.completion_tokens for x in fed(s)], probe.engine_batch, fixed, rows_done)
    return tokens + PREFILL_WEIGHT * prefill


def fed(samples: Sequence[RowSample]) -> list[RowSample]:
    """The probe's rows in the order its worker sent them to the engine (by prefix: worker/chunks.py),
    as recorded at carving; as written where a record predates that."""
    return sorted(samples, key=lambda x: x.feed_rank if x.feed_rank is not None else -1)


def probe_rate(probe: ProbeRecord, fixed: float = 1.0) -> tuple[float, float]:
    """(engine seconds per work unit, warm-up seconds): the rate past the first engine batch when the
    probe ran more than one (its heartbeat's `first_batch`), the first batch's excess as the warm-up."""
    busy = probe.busy_s or 0.0
    units = probe_units(probe, fixed)
    fb = probe.first_batch
    if fb is not None and warm_up_split(probe):
        first_units = probe_units(probe, fixed, rows_done=int(fb[2]))
        if busy > fb[0] and units > first_units:
            rate = (busy - fb[0]) / (units - first_units)
            return rate, max(0.0, fb[0] - first_units * rate)
    return (busy / units if units else 0.0), 0.0


def rate_draw(probe: ProbeRecord, rng: random.Random) -> float:
    """One draw of the probe's seconds per work unit, log-uniform between the rate past its first
    batch and its whole rate (warm-up in): which share of the first batch's excess was warm-up is
    not measured, and the two batches of a probe differ by up to 1.8x in CPU seconds a row
    (bench/forecast_bench.py's short-output store: 12.7 and 7.1 ms), so the band holds both. The
    step's fixed share (probe_work.py) is drawn too: it matters only where the probe's batches ran
    part-empty."""
    fixed = rng.uniform(*FIXED_STEP_SHARE)
    past_first = probe_rate(probe, fixed)[0]
    units = probe_units(probe, fixed)
    whole = (probe.busy_s or 0.0) / units if units else past_first
    if past_first <= 0 or whole <= past_first:
        return past_first
    return float(past_first * (whole / past_first) ** rng.random())


def measured_s(probe: ProbeRecord) -> float:
    """The engine seconds the probe's rate was taken over: past its first batch where it split there."""
    busy, fb = probe.busy_s or 0.0, probe.first_batch
    return busy - fb[0] if fb is not None and warm_up_split(probe) and busy > fb[0] else busy


def window_sigma(probe: ProbeRecord) -> float:
    """The spread of a rate measured over the probe's few seconds alone (WINDOW_SIGMA / sqrt(T))."""
    return WINDOW_SIGMA / math.sqrt(max(measured_s(probe), 0.01))


def rate_sigma(probe: ProbeRecord) -> float:
    """The log-normal spread of the run's rate around the probe's: RATE_SIGMA and the window's."""
    return math.hypot(RATE_SIGMA, window_sigma(probe))


def work_seconds(
    probe: ProbeRecord, rng: random.Random, workers: int = 1, done: Sequence[RowSample] | None = None
) -> tuple[float, float, float]:
    """One bootstrap draw: (engine seconds of one worker, generated tokens, prompt tokens) for the rows
    left (all but `done`, by default this probe's), by `workers` workers (each meets a prefix group's
    first row once: a cache miss)."""
    s = probe.samples
    sec_per_unit = rate_draw(probe, rng)
    est = sum(x.est_prompt_tokens for x in s)
    prompt_ratio = sum(x.prompt_tokens for x in s) / est if est else 1.0
    cached = run_cached_share(s, probe.strata, workers)
    by_stratum: dict[str, list[RowSample]] = {}
    for x in s:
        by_stratum.setdefault(x.stratum, []).append(x)
    out_total = prompt_total = 0.0
    rows: list[tuple[RowSample, float]] = []  # (a drawn row, how many of the run's rows it stands for)
    for name, count in left_strata(probe, done).items():
        pool = by_stratum.get(name) or s
        draw = [rng.choice(pool) for _ in pool]
        ratio = statistics.fmean(x.completion_tokens / max(1, x.max_tokens) for x in draw)
        out_total += ratio * count.max_tokens
        prompt_total += count.est_prompt_tokens * prompt_ratio
        rows += [(x, count.rows / len(draw)) for x in draw]
    decode = out_total  # a continuous engine's full batches: one unit per generated token
    if probe.static_batches and probe.engine_batch and rows:
        decode = static_run_units(rows, probe.engine_batch, rng)
    units_total = decode + PREFILL_WEIGHT * prompt_total * (1 - cached)
    rate_noise = rng.lognormvariate(0.0, rate_sigma(probe))
    return units_total * sec_per_unit * rate_noise, out_total, prompt_total


def static_run_units(rows: Sequence[tuple[RowSample, float]], slots: int, rng: random.Random) -> float:
    """Decode units of the run's rows on a static-batch engine: a replay of its batches over a sample of
    STATIC_RUN_POOLS pools of the run's rows (drawn by the rows each stands for), scaled to all of them."""
    weights = [w for _, w in rows]
    total = sum(weights)
    size = min(max(1, round(total)), STATIC_RUN_POOLS * POOL_BATCHES * slots)
    sample = [StaticRow.of(x) for x, _ in rng.choices(rows, weights=weights, k=size)]
    return static_units(sample, slots, 1.0) * total / size


def on_cpus(ctx: RunContext) -> bool:
    """The run's workers answer on CPUs: this machine's (local), or a cluster's (SkyPilot, no GPU type)."""
    return ctx.spec.backend == "local" or not ctx.spec.resources.gpus


def local_parallelism(workers: int, threads: int | None, draw: tuple[float, float] = (0.5, 0.5)) -> float:
    """Workers on this machine share its cores: N workers of `threads` each go min(N, cores/threads) times as
    fast, less what sharing a machine costs (SHARED_CORE_EFFICIENCY), and more where they want more
    threads than it has (OVERSUBSCRIBED_EFFICIENCY). `draw` places each efficiency in its range
    (0: its low end, 1: its high end; a forecast draws them, a single figure takes the middle)."""
    cores = os.cpu_count() or 1
    want = float(workers * max(1, threads or 1))
    par = min(float(workers), max(1.0, cores / max(1, threads or 1)))
    if par <= 1:
        return par
    shared = _within(SHARED_CORE_EFFICIENCY, draw[0])
    return par * shared * (_within(OVERSUBSCRIBED_EFFICIENCY, draw[1]) if want > cores else 1.0)


def _within(span: tuple[float, float], at: float) -> float:
    return span[0] + (span[1] - span[0]) * at


def forecast_from_probes(
    ctx: RunContext,
    probes: Sequence[ProbeRecord],
    manifest: Sequence[ManifestEntry],
    workers: int,
    at: float,
    simulator: FleetSimulator,
) -> ForecastRecord:
    """The forecast from the measured probes (the first measured one for the run's tokens and a local
    fleet; on SkyPilot each candidate from its own probe where it has one, else scaled by the table)."""
    measured = [p for p in probes if p.busy_s is not None]
    first = measured[0]
    done = [x for p in measured for x in p.samples]
    draws = _draws(first, workers, done)
    work = band([d[0] for d in draws])
    out = band([d[1] for d in draws])
    left = [e for e in manifest if e.chunk not in {p.chunk for p in measured}]
    startup = first.load_s or 0.0
    candidates: list[CandidateForecast] = []
    if on_cpus(ctx):
        shared = ctx.spec.backend == "local"  # else a cluster of CPUs: an allocation per worker
        candidates.append(_cpu_candidate(first, left, workers, [d[0] for d in draws], startup, shared))
    else:
        prices = load_gpu_table().per_machine(ctx.spec.resources.gpus_per_worker)
        for g in ctx.spec.resources.gpus:
            own = next((p for p in measured if prices.find(p.accelerator) is prices.get(g)), None)
            if own is not None:
                mine = work if own is first else band([d[0] for d in _draws(own, workers, done)])
                scaled, basis = [mine.p10, mine.p50, mine.p90], f"measured on {g} ({own.rows} probe rows)"
            else:
                speed = _speed_against(prices, g, first, ctx.spec.model.name)
                scaled = [w / speed for w in (work.p10, work.p50, work.p90)]
                basis = f"scaled from the probe on {first.accelerator or 'cpu'} by the table ({speed:.2g}x)"
            for spot in (True, False):
                candidates.append(_simulated(ctx, prices, g, spot, workers, left, scaled, basis, simulator))
    unmeasured = [p for p in probes if p.busy_s is None]
    return ForecastRecord(
        at=at,
        kind="probe",
        workers=workers,
        output_tokens=out,
        prompt_tokens=round(statistics.fmean(d[2] for d in draws)),
        candidates=candidates,
        fleet=candidates[0].key,
        note=f"engine time from {first.rows} probe rows"
        + "".join(f"; the probe on {p.gpu} measured nothing ({p.stopped or 'it did not finish'})" for p in unmeasured)
        + f"; prefill weighed {PREFILL_WEIGHT} of a generated token (assumed)"
        + (
            "; its engine runs each batch to its longest row: its batches replayed as it picks them"
            if first.static_batches
            else ""
        )
        + _below_batch(ctx, first)
        + warm_up_note(first)
        + short_probe_note(first),
    )


def _draws(probe: ProbeRecord, workers: int, done: Sequence[RowSample]) -> list[tuple[float, float, float]]:
    rng = random.Random(0)
    return [work_seconds(probe, rng, workers, done) for _ in range(BOOTSTRAP)]


def _speed_against(prices: GpuTable, gpu: str, probe: ProbeRecord, model: str | None) -> float:
    """How much faster `gpu` answers than the probe's accelerator: the table's ratio where the probe
    ran on a GPU it lists, else the table's speed for the model's size against the probe's tokens/s."""
    measured_on = prices.find(probe.accelerator)
    if measured_on is not None:
        return prices.get(gpu).relative_speed / measured_on.relative_speed
    gen_tok_s = sum(x.completion_tokens for x in probe.samples) / (probe.busy_s or 1.0)
    return _table_speed(prices, gpu, model) / max(gen_tok_s, 1e-9)


def warm_up_note(probe: ProbeRecord) -> str:
    if warm_up_split(probe) or not probe.samples:
        return ""
    return (
        f"; all {len(probe.samples)} probe rows came back in one drain of the engine, so its warm-up is in "
        "the rate: the forecast is high (measured +44% on a 16-row probe); a larger --probe-share splits it"
    )


def short_probe_note(probe: ProbeRecord) -> str:
    window = window_sigma(probe)
    if window <= RATE_SIGMA:
        return ""
    return (
        f"; the probe's rate was measured over {measured_s(probe):.2g} engine seconds, which alone may be off "
        f"by {window:.0%} (one sigma): the band holds that, and a larger --probe-share narrows it"
    )


def _below_batch(ctx: RunContext, probe: ProbeRecord) -> str:
    from orchestrator.planning.probe_work import BATCH_ARG, engine_batch

    batch = engine_batch(ctx)
    if probe.rows >= batch:
        return ""
    return (
        f"; the probe ran {probe.rows} rows, less than one engine batch "
        f"({batch}, {BATCH_ARG.get(ctx.spec.model.engine, 'max_num_seqs')}): "
        "a run's fuller batches go faster per row than it measured"
    )


def busiest_share(left: Sequence[ManifestEntry], workers: int) -> float:
    """The share of the work the plan gives its busiest worker (by the plan's own estimate of tokens)."""
    from orchestrator.planning.plan import plan_chunks

    if not left:
        return 0.0
    plan = plan_chunks(left, workers)
    total = sum(a.est_tokens for a in plan.workers)
    return max(a.est_tokens for a in plan.workers) / total if total else 1.0 / workers


def _cpu_candidate(
    probe: ProbeRecord,
    left: Sequence[ManifestEntry],
    workers: int,
    work: Sequence[float],
    startup: float,
    shared: bool,
) -> CandidateForecast:
    """CPUs: the busiest worker's work at the probe's rate. On this machine (`shared`) the workers
    share its cores, at a sharing efficiency drawn for each of the work's draws (the band holds its
    doubt); on a cluster each worker has its allocation. No price: the machines are one's own."""
    acc = probe.accelerator or "cpu"
    rng = random.Random(1)
    busiest, warm_alone = busiest_share(left, workers), probe_rate(probe)[1]
    engine = []
    for w in work:
        # N workers sharing the cores each go par/N of the probe's speed; the busiest ends last, and
        # each worker warms its engine up once.
        par = local_parallelism(workers, probe.threads, (rng.random(), rng.random())) if shared else workers
        slowdown = workers / par
        engine.append(w * busiest * slowdown + warm_alone * slowdown)
    eng = band(engine)
    fleet = f"{workers} worker{'s' if workers != 1 else ''}"
    where = f"{fleet} sharing {os.cpu_count()} cores" if shared else f"{fleet}, one allocation each"
    return CandidateForecast(
        gpu=acc,
        spot=False,
        workers=workers,
        engine_s=eng,
        duration_s=Band(
            p10=round(eng.p10 + startup, 2), p50=round(eng.p50 + startup, 2), p90=round(eng.p90 + startup, 2)
        ),
        cost_usd=Band(p10=0.0, p50=0.0, p90=0.0),
        basis=f"measured on {acc} ({probe.rows} rows, {where})",
    )


def _table_speed(prices: GpuTable, gpu: str, model: str | None) -> float:
    params = model_params(model)
    scale = TABLE_PARAMS / params if params else 1.0
    return prices.reference_output_tokens_per_s * prices.get(gpu).relative_speed * min(max(scale, 0.05), 50.0)


def _simulated(
    ctx: RunContext,
    prices: GpuTable,
    gpu: str,
    spot: bool,
    workers: int,
    left: Sequence[ManifestEntry],
    work_s: Sequence[float],
    basis: str,
    simulator: FleetSimulator,
) -> CandidateForecast:
    """The simulator over SEEDS seeds at each of the work's p10/p50/p90: preemptions, start-up, the tail."""
    from orchestrator.planning.estimate import RESTART_OVERHEAD_S

    rows = sum(e.rows for e in left) or 1
    durations, costs, engines = [], [], []
    for w in work_s:
        fleet = SimulatedFleet(
            workers=workers,
            gpu=gpu,
            spot=spot,
            base_rows_per_s=max(rows / max(w, 1e-6) / prices.get(gpu).relative_speed, 1e-6),
            restart_overhead_s=RESTART_OVERHEAD_S,
            checkpoint_interval_s=ctx.spec.workers.checkpoint_interval,
        )
        for seed in range(SEEDS):
            makespan_s, cost_usd = simulator(fleet, seed, left, prices)
            durations.append(makespan_s)
            costs.append(cost_usd)
            engines.append(makespan_s - RESTART_OVERHEAD_S)
    return CandidateForecast(
        gpu=gpu,
        spot=spot,
        workers=workers,
        duration_s=band(durations),
        cost_usd=band(costs),
        engine_s=band(engines),
        basis=basis,
    )


def guess(
    ctx: RunContext,
    manifest: Sequence[ManifestEntry],
    workers: int,
    at: float,
    measured: Measured | None = None,
) -> ForecastRecord:
    """No probe: the quote from what is known before paying, as a band, for every candidate the spec
    allows (each GPU spot and on-demand, or the CPUs), start-up included.

    1. Speed: what finished chunks measured on that machine kind (`measured`: this run's, else an
       earlier run's of the same model; within MEASURED_SPEED_SPREAD), else the price table's scaled
       by the model's size (within 3x on a GPU, 10x on a CPU).
    2. Output tokens: per row as measured, else 10-100% of max_tokens.
    3. Start-up: the measured launch-to-first-answer, else RESTART_OVERHEAD_S on a cloud or cluster
       and LOCAL_STARTUP_S on this machine; a spot worker also loses what PREEMPTIONS_PER_HOUR cost
       (a restart and half a checkpoint interval each).
    """
    from orchestrator.planning.estimate import PREEMPTIONS_PER_HOUR, RESTART_OVERHEAD_S

    spec = ctx.spec
    prices = load_gpu_table().per_machine(spec.resources.gpus_per_worker)
    out = _guessed_output(manifest, measured.tokens_per_row if measured is not None else None)
    prompt = sum(e.est_prompt_tokens for e in manifest)
    local = spec.backend == "local"
    startup = measured.startup_s if measured is not None and measured.startup_s is not None else None
    said = f"; start-up {startup:.0f} s measured" if startup is not None else ""
    if startup is None:
        startup = LOCAL_STARTUP_S if local else RESTART_OVERHEAD_S
        said = f"; start-up {startup:.0f} s assumed"
    lost_share = min(PREEMPTIONS_PER_HOUR * (startup + spec.workers.checkpoint_interval / 2) / 3600, 0.9)
    par = local_parallelism(workers, None) if local else float(workers)
    units = [t + PREFILL_WEIGHT * prompt for t in (out.p10, out.p50, out.p90)]
    candidates = []
    for g in ["cpu"] if on_cpus(ctx) else spec.resources.gpus:
        speed, spread, basis = _guessed_speed(prices, g, spec.model.name, measured)
        eng = Band(
            p10=round(units[0] / speed / spread / par, 2),
            p50=round(units[1] / speed / par, 2),
            p90=round(units[2] / speed * spread / par, 2),
        )
        allowed = (
            [False]
            if g == "cpu"
            else [x for x, ok in ((True, spec.resources.spot), (False, spec.resources.on_demand)) if ok]
        )
        for spot in allowed:
            slow = 1 / (1 - lost_share) if spot else 1.0
            duration = Band(
                p10=round(startup + eng.p10 * slow, 2),
                p50=round(startup + eng.p50 * slow, 2),
                p90=round(startup + eng.p90 * slow, 2),
            )
            hourly = 0.0 if g == "cpu" else prices.get(g).spot_usd_h if spot else prices.get(g).on_demand_usd_h
            usd_s = hourly * workers / 3600
            cost = Band(
                p10=round(duration.p10 * usd_s, 2),
                p50=round(duration.p50 * usd_s, 2),
                p90=round(duration.p90 * usd_s, 2),
            )
            candidates.append(
                CandidateForecast(
                    gpu=g,
                    spot=spot,
                    workers=workers,
                    engine_s=eng,
                    duration_s=duration,
                    cost_usd=cost,
                    basis=basis + said,
                )
            )
    params = model_params(spec.model.name)
    size = f"{params / 1e9:.3g}B parameters from config.json" if params else "size unknown: taken as 8B"
    what = (
        f"speed and tokens per row measured by {measured.source}"
        if measured is not None and measured.tokens_per_s
        else f"{size}; outputs 10-100% of max_tokens"
    )
    return ForecastRecord(
        at=at,
        kind="guess",
        workers=workers,
        output_tokens=out,
        prompt_tokens=prompt,
        candidates=candidates,
        fleet=candidates[0].key,
        note=f"a guess ({what}): `orch estimate --probe` narrows it, measured on about 1% of the rows",
    )


def _guessed_output(manifest: Sequence[ManifestEntry], per_row: float | None) -> Band:
    """The run's generated tokens: per row as measured (within MEASURED_SPEED_SPREAD, never past
    max_tokens), else 10-100% of max_tokens."""
    max_out = float(sum(e.max_output_tokens for e in manifest))
    if not per_row:
        return Band(p10=round(0.1 * max_out), p50=round(0.5 * max_out), p90=max_out)
    mid = per_row * sum(e.rows for e in manifest)
    mid = min(mid, max_out) if max_out else mid
    top = min(mid * MEASURED_SPEED_SPREAD, max_out) if max_out else mid * MEASURED_SPEED_SPREAD
    return Band(p10=round(mid / MEASURED_SPEED_SPREAD), p50=round(mid), p90=round(top))


def _guessed_speed(
    prices: GpuTable, gpu: str, model: str | None, measured: Measured | None
) -> tuple[float, float, str]:
    """One worker's generated tokens/s on `gpu` (or `cpu`), how far either way it may be off, and why."""
    speed = measured.speed(gpu) if measured is not None else None
    if speed and measured is not None:
        return speed, MEASURED_SPEED_SPREAD, f"measured on {gpu} by {measured.source}"
    if gpu == "cpu":  # a CPU against an L4: a guess, and said to be one
        return _table_speed(prices, "L4", model) / 20, CPU_GUESS_SPEED_SPREAD, "a guess: an L4's table speed / 20"
    return _table_speed(prices, gpu, model), GUESS_SPEED_SPREAD, "a guess: the table's speed scaled by the model's size"
