"""Meeting a deadline at the least cost: when to add on-demand workers to a spot fleet, and when to retire them.

After "Can't Be Late" (Wu et al., NSDI 2024), whose Uniform Progress policy met every deadline
while saving 27-84% against on-demand: stay on cheap spot capacity while the run is on or above
the uniform line, pay for on-demand only to get back to it, and commit to on-demand when the slack
left is within one restart. orch applies it to a fleet: SkyPilot keeps the spot workers coming back
after preemptions; this policy adds on-demand workers on top (they claim chunks like any worker)
and retires them first when the run is comfortably ahead.

Work is counted in rows; rates in rows per second. Each control round:
    T     = time left to the deadline;  W = rows left
    line  = total x (elapsed - overhead) / (deadline - overhead)   (the uniform line; a fleet
            cannot progress during its first start-up)
    need  = W / (T - overhead)      the rate that finishes on time, counting one start-up
    have  = rate of the spot workers up (or coming up) + rate of the on-demand workers (up or starting)
    slack = T - (time on-demand at the cap would take: W / capacity, and no less than the largest
            chunk left on one worker; with a margin for the rate estimates)
            = time to spare before only on-demand can still make it (the paper's slack, for a fleet)
1. critical: slack within the restart overhead plus the commit margin (the lease TTL, for chunks
   held by preempted workers to be taken over, and one control interval): commit. On-demand
   capacity alone must cover `need`: spot workers may be gone at any moment.
2. behind: progress below the line: add on-demand workers until have >= need x (1 + margin).
   Unless spot workers wait for capacity (pending, recovering) and the slack at the fleet's pace
   with spot is beyond the reserve (planning/spot_zones.py's `wait_for_spot`, the rule scored on
   the published traces; its mean up spell learned from the zones' history): then wait for spot,
   as the trace policy does. Rule 1 still commits in time, so the guarantee holds.
3. ahead by `ahead_band` of the work, with slack beyond twice (overhead + commit margin): retire
   on-demand workers (the slowest first) while what stays still covers need x (1 + margin). The
   band and the doubled slack keep it from retiring what it must relaunch minutes later.
4. Otherwise hold. A budget cap stops every launch once the cost so far, plus what a launch
   would cost until the deadline, passes it; the decision says so.

`greedy` is the baseline the paper compares against: only rule 1 (stay on spot until the slack
is gone, then commit), never rules 2 and 3. With `spot_wait` off, rule 2 never waits: the paper's
Uniform Progress, the baseline the trace scorer compares against.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

from orchestrator.core.errors import SpecError
from orchestrator.planning.estimate import RESTART_OVERHEAD_S
from orchestrator.planning.spot_zones import PRIOR_UP_S, RESTARTS_FACTOR, SpotWait, wait_for_spot

Mode = Literal["complete", "critical", "behind", "waiting", "on-line", "ahead"]
Action = Literal["hold", "launch", "retire", "budget"]


@dataclass(frozen=True)
class DeadlineSettings:
    deadline_s: float  # seconds from the start of the run
    restart_overhead_s: float = RESTART_OVERHEAD_S  # provision + setup + model load of a new machine
    budget_usd: float | None = None
    margin: float = 0.15  # capacity aimed for beyond what is needed, and the error allowed in rate estimates
    ahead_band: float = 0.05  # of the total work, above the line before on-demand is retired
    max_on_demand: int = 16  # extra on-demand workers at most
    commit_margin_s: float = 360.0  # the lease TTL + one control interval
    greedy: bool = False
    spot_wait: bool = True  # behind with spot workers waiting for capacity: wait while the slack allows (rule 2)
    #: The reserve's multiplier in rule 2's wait: the tuned value, or one drawn per run (spot_zones rule 6).
    restarts_factor: float = RESTARTS_FACTOR


@dataclass(frozen=True)
class OnDemandWorker:
    worker: int
    rate: float  # rows/s (measured, or the estimate while it starts)
    up: bool


@dataclass(frozen=True)
class FleetState:
    elapsed_s: float  # since the run started
    total_rows: float
    done_rows: float
    spot_rate: float  # rows/s of the spot workers up now
    on_demand: Sequence[OnDemandWorker]
    new_worker_rate: float  # rows/s expected of a new on-demand worker
    new_worker_usd_h: float  # its on-demand price
    cost_so_far_usd: float = 0.0
    largest_chunk_rows: float = 0.0  # the largest unfinished chunk: one worker's, whatever the fleet
    #: Unfinished chunks no live worker is on: more new workers than this would find nothing to do.
    open_chunks: int | None = None
    #: Which speed new_worker_rate comes from, in words (estimate.Throughput.basis).
    new_worker_speed: str = ""
    #: Spot workers waiting for capacity (pending past a start-up, recovering after a preemption).
    spot_waiting: int = 0
    #: rows/s of every live spot worker, up or waiting: the fleet's pace once spot is back.
    spot_pace: float = 0.0
    #: Expected up spell of the best zone, learned from its history (the zones' prior when none).
    mean_up_s: float = PRIOR_UP_S


@dataclass
class Decision:
    action: Action
    mode: Mode
    reason: str
    launch: int = 0
    retire: list[int] = field(default_factory=list)
    # The numbers behind it, for the log and `orch status`.
    elapsed_s: float = 0.0
    progress: float = 0.0  # fraction of rows done
    line: float = 0.0  # fraction the uniform line asks for now
    need_rows_per_s: float = 0.0
    have_rows_per_s: float = 0.0
    slack_s: float | None = None
    speed: str = ""  # which speed a new worker was reckoned at (measured or the table's)
    zone: str = ""  # with resources.zones: the zone order new workers try, and why the first
    pool: str | None = None  # a run of several models: the pool (model) decided for

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def parse_duration(text: str, *, where: str = "--deadline") -> float:
    """'8h', '90m', '2h30m', '3600' (seconds), '1.5d' -> seconds."""
    units = {"d": 86400.0, "h": 3600.0, "m": 60.0, "s": 1.0}
    s, total, number = text.strip().lower(), 0.0, ""
    try:
        if s and s.replace(".", "", 1).isdigit():
            return float(s)
        for ch in s:
            if ch.isdigit() or ch == ".":
                number += ch
            elif ch in units and number:
                total += float(number) * units[ch]
                number = ""
            else:
                raise ValueError(ch)
        if number or total <= 0:
            raise ValueError(s)
    except ValueError:
        raise SpecError(f"{text!r} is not a duration", where=where, hint="write e.g. 8h, 90m, 2h30m or 1.5d") from None
    return total


def decide(state: FleetState, settings: DeadlineSettings) -> Decision:
    overhead = settings.restart_overhead_s
    T = settings.deadline_s - state.elapsed_s
    W = max(state.total_rows - state.done_rows, 0.0)
    total = max(state.total_rows, 1e-9)
    line = min(max((state.elapsed_s - overhead) / max(settings.deadline_s - overhead, 1e-9), 0.0), 1.0)
    od_rate = sum(w.rate for w in state.on_demand)
    have = state.spot_rate + od_rate
    need = W / (T - overhead) if overhead < T else math.inf
    slack = _on_demand_slack(state, settings, T, W, od_rate)
    commit_at = overhead + settings.commit_margin_s
    numbers: dict[str, Any] = dict(
        elapsed_s=state.elapsed_s,
        progress=state.done_rows / total,
        line=line,
        need_rows_per_s=need if need != math.inf else -1.0,
        have_rows_per_s=have,
        slack_s=slack if slack != -math.inf else None,
    )
    if W <= 0:
        return Decision("hold", "complete", "every row is done", **numbers)
    if settings.budget_usd is not None and state.cost_so_far_usd >= settings.budget_usd:
        mode: Mode = "behind" if state.done_rows < line * total else "on-line"
        return Decision(
            "budget",
            mode,
            f"budget ${settings.budget_usd:,.2f} reached (${state.cost_so_far_usd:,.2f} spent): no new launches",
            **numbers,
        )

    if slack <= commit_at:
        # Commit: what on-demand runs (or is starting) must finish alone.
        target = (need if overhead < T else W / max(T, 1.0)) * (1 + settings.margin)
        why = f"slack {max(slack, 0) / 60:.0f} min is within a restart and a takeover ({commit_at / 60:.0f} min)"
        return _launch(state, settings, "critical", target - od_rate, f"{why}: committing to on-demand", numbers)
    if not settings.greedy and state.done_rows < line * total:
        why = f"behind the uniform line ({state.done_rows / total:.1%} done, line {line:.1%})"
        if settings.spot_wait and state.spot_waiting:
            wait = _spot_wait(state, settings, T, W, od_rate)
            if wait.wait:
                return Decision("hold", "waiting", f"{why}; {wait.reason}", **numbers)
            why += f"; {wait.reason}"
        return _launch(state, settings, "behind", need * (1 + settings.margin) - have, why, numbers)
    ahead = state.done_rows >= (line + settings.ahead_band) * total
    if not settings.greedy and ahead and slack > 2 * commit_at:
        retire = _spare_on_demand(state, settings, have, need, T, W)
        if retire:
            return Decision(
                "retire",
                "ahead",
                f"ahead of the line ({state.done_rows / total:.1%} done, line {line:.1%}): spot capacity suffices",
                retire=retire,
                **numbers,
            )
    return Decision(
        "hold", "ahead" if ahead else "on-line", f"{state.done_rows / total:.1%} done, line {line:.1%}", **numbers
    )


def _on_demand_slack(state: FleetState, settings: DeadlineSettings, T: float, W: float, od_rate: float) -> float:
    """Time to spare if on-demand workers (those running, and as many more as allowed) had to finish
    the W rows left alone, the largest chunk included, with the margin; -inf when none may run."""
    od_cap = od_rate + max(settings.max_on_demand - len(state.on_demand), 0) * state.new_worker_rate
    if od_cap <= 0:
        return -math.inf
    od_time = max(W / od_cap, state.largest_chunk_rows / max(state.new_worker_rate, 1e-9)) * (1 + settings.margin)
    return T - od_time


def _spot_wait(state: FleetState, settings: DeadlineSettings, T: float, W: float, od_rate: float) -> SpotWait:
    """`wait_for_spot` for the fleet: the slack at its pace with spot back (one start-up counted), the
    control round's commit margin as the tick."""
    pace = max(state.spot_pace, state.spot_rate) + od_rate
    slack = T - W / pace - settings.restart_overhead_s if pace > 0 else -math.inf
    return wait_for_spot(
        slack_s=slack,
        time_left_s=T,
        overhead_s=settings.restart_overhead_s,
        tick_s=settings.commit_margin_s,
        mean_up_s=state.mean_up_s,
        restarts_factor=settings.restarts_factor,
    )


def _spare_on_demand(
    state: FleetState,
    settings: DeadlineSettings,
    have: float,
    need: float,
    T: float,
    W: float,
) -> list[int]:
    """On-demand workers the run can do without, slowest first: the rest still beat the need with
    the margin, and finish well inside the time left."""
    keep, retire = have, []
    for w in sorted(state.on_demand, key=lambda w: (w.rate, -w.worker)):
        if (
            keep - w.rate >= need * (1 + settings.margin)
            and T - W / max(keep - w.rate, 1e-9) > 2 * settings.restart_overhead_s
        ):
            keep -= w.rate
            retire.append(w.worker)
    return retire


def _launch(
    state: FleetState, settings: DeadlineSettings, mode: Mode, deficit: float, why: str, numbers: dict[str, Any]
) -> Decision:
    if deficit <= 0:
        return Decision("hold", mode, f"{why}; the on-demand workers starting cover it", **numbers)
    room = settings.max_on_demand - len(state.on_demand)
    count = min(math.ceil(deficit / max(state.new_worker_rate, 1e-9)), room)
    if count <= 0:
        return Decision(
            "hold", mode, f"{why}; already at the cap of {settings.max_on_demand} on-demand workers", **numbers
        )
    if state.open_chunks is not None and count > state.open_chunks:
        if state.open_chunks <= 0:
            return Decision("hold", mode, f"{why}; every unfinished chunk is being worked on", **numbers)
        count = state.open_chunks
    if settings.budget_usd is not None:
        hours = max(settings.deadline_s - state.elapsed_s, 0.0) / 3600
        affordable = math.floor(
            (settings.budget_usd - state.cost_so_far_usd) / max(state.new_worker_usd_h * hours, 1e-9)
        )
        if affordable < count:
            if affordable <= 0:
                return Decision(
                    "budget",
                    mode,
                    f"{why}; budget ${settings.budget_usd:,.2f} reached "
                    f"(${state.cost_so_far_usd:,.2f} spent): no new launches",
                    **numbers,
                )
            why += f"; the budget allows {affordable} of {count}"
            count = affordable
    return Decision("launch", mode, f"{why}: {count} on-demand worker(s)", launch=count, **numbers)
