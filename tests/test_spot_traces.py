"""Spot traces scorer: the replay's accounting and the exact optimum on hand-made traces, the policies' deadline
guarantee on the published traces, and `orch simulate --traces`."""

from __future__ import annotations

import itertools
import json
import math
import os
import random
import statistics
import tarfile
from pathlib import Path

import pytest

from orchestrator.cli import main
from orchestrator.planning.spot_zones import RESTARTS_FACTOR, draw_restarts_factor
from orchestrator.simulate import spot_traces as st
from orchestrator.simulate.spot_adversary import against
from orchestrator.simulate.spot_optimum import optimum_costs
from orchestrator.simulate.spot_policies import POLICIES, RANDOMIZED, zone_aware_randomized
from orchestrator.simulate.spot_replay import Choice, View, replay, tick_work
from orchestrator.simulate.spot_traces import Job, Trace

ARCHIVES = Path(os.environ.get("ORCH_SPOT_TRACES", Path(__file__).resolve().parents[2] / "shared/data/spot-traces"))


def trace(*zones: str, gap: float = 100.0) -> Trace:
    """Zones as strings of '1' (capacity) and '0' (none), one character a tick."""
    return Trace(
        "hand", tuple(f"z{i}" for i in range(len(zones))), gap, tuple(tuple(c == "1" for c in z) for z in zones)
    )


class Script:
    """Plays a fixed list of choices, then nothing."""

    def __init__(self, choices: list[Choice]) -> None:
        self.choices = choices

    def choose(self, view: View) -> Choice:
        return self.choices[view.tick] if view.tick < len(self.choices) else Choice("none")


class SpotWhenUp:
    """Spot in the first zone with capacity (staying where it runs), nothing otherwise."""

    def choose(self, view: View) -> Choice:
        if view.market == "spot" and view.up[view.zone]:
            return Choice("spot", view.zone)
        return Choice("spot", view.up.index(True)) if any(view.up) else Choice("none")


#: Every policy the guarantee must hold for, the randomized one under a few of its draws.
SAFE = {**POLICIES, **{f"{RANDOMIZED}#{i}": (lambda seed, i=i: zone_aware_randomized(f"{seed}{i}")) for i in range(4)}}

SPOT_100S = 0.9701 * 100 / 3600
OD_100S = 3.06 * 100 / 3600


# -- the replay's accounting, by hand ------------------------------------------------------------
def test_tick_work_takes_the_overhead_off_the_first_ticks():
    assert [tick_work(i, 100, 150) for i in range(4)] == [0, 50, 100, 100]
    assert [tick_work(i, 100, 0) for i in range(2)] == [100, 100]


def test_replay_counts_a_preemption_restart_and_whole_ticks():
    # 300 s of work, 50 s restarts. Tick 0: start (50 done); 1: 150; 2: preempted, no capacity;
    # 3: restart (200); 4: 300, done at the end of tick 4. Four spot ticks billed, 100 s of them overhead.
    out = replay(Job(300, 1000, 50), trace("1101111111"), SpotWhenUp())
    assert out.met and out.finished_tick == 5
    assert (out.launches, out.preemptions, out.zone_switches) == (2, 1, 0)
    assert out.spot_ticks == 4 and out.on_demand_ticks == 0
    assert out.overhead_s == 100
    assert out.cost_usd == pytest.approx(4 * SPOT_100S)


def test_replay_counts_a_zone_switch_as_a_restart():
    # Zone 0 loses capacity at tick 1: the job moves to zone 1 and pays the overhead again
    # (50 in tick 0, 50 in tick 1, 100 in tick 2: done at its end).
    out = replay(Job(200, 1000, 50), trace("1000000000", "1111111111"), SpotWhenUp())
    assert (out.launches, out.preemptions, out.zone_switches) == (2, 1, 1)
    assert out.finished_tick == 3 and out.overhead_s == 100
    assert out.cost_usd == pytest.approx(3 * SPOT_100S)


def test_replay_moving_between_spot_and_on_demand_restarts_the_machine():
    choices = [Choice("on-demand"), Choice("on-demand"), Choice("spot"), Choice("spot"), Choice("spot")]
    out = replay(Job(250, 1000, 50), trace("1111111111"), Script(choices))
    # On-demand: 50 + 100; spot from tick 2: 50 + 100 -> 300 >= 250 at the end of tick 3.
    assert out.finished_tick == 4 and out.launches == 2
    assert out.cost_usd == pytest.approx(2 * OD_100S + 2 * SPOT_100S)


def test_replay_finishes_a_missed_job_on_on_demand_for_its_cost():
    out = replay(Job(300, 500, 50), trace("0000000000"), Script([]))
    assert not out.met and out.finished_tick is None
    assert out.cost_usd == pytest.approx((300 + 50) / 3600 * 3.06)


def test_replay_refuses_spot_where_there_is_no_capacity():
    with pytest.raises(ValueError, match="no capacity"):
        replay(Job(300, 500, 50), trace("0111111111"), Script([Choice("spot")]))


# -- the optimum against brute force -------------------------------------------------------------
def brute_force(job: Job, tr: Trace) -> float:
    """Every schedule the trace allows, replayed: the cheapest on time (inf if none)."""
    ticks = int(job.deadline_s // tr.gap_s)
    options = [
        [Choice("none"), Choice("on-demand"), *(Choice("spot", z) for z in range(len(tr.up)) if tr.up[z][t])]
        for t in range(ticks)
    ]
    best = float("inf")
    for plan in itertools.product(*options):
        out = replay(job, tr, Script(list(plan)))
        if out.met:
            best = min(best, out.cost_usd)
    return best


@pytest.mark.parametrize("seed", range(6))
def test_optimum_equals_brute_force_on_small_traces(seed):
    rng = random.Random(seed)
    tr = trace(*("".join(rng.choice("01") for _ in range(7)) for _ in range(2)))
    job = Job(300, 700, rng.choice((0, 50, 150)))
    assert optimum_costs(job, [tr])[0] == pytest.approx(brute_force(job, tr))


def test_optimum_of_a_hand_made_trace_and_of_an_impossible_deadline():
    # Zone 0 has a gap at tick 2, zone 1 none after tick 0: start in zone 1 at tick 1 and stay
    # (50 + 100 + 100 + 100 by the end of tick 4): four spot ticks, one restart.
    tr = trace("1101111", "0111111")
    assert optimum_costs(Job(300, 700, 50), [tr])[0] == pytest.approx(4 * SPOT_100S)
    # With a deadline shorter than the work, nothing is on time.
    assert optimum_costs(Job(300, 200, 50), [tr]) == [float("inf")]


def test_optimum_handles_traces_side_by_side():
    rng = random.Random(7)
    traces = [trace("".join(rng.choice("01") for _ in range(6))) for _ in range(3)]
    job = Job(250, 600, 50)
    assert optimum_costs(job, traces) == pytest.approx([optimum_costs(job, [t])[0] for t in traces])


# -- the deadline guarantee ------------------------------------------------------------------------
def test_policies_meet_the_deadline_when_spot_flickers_every_tick():
    # The worst case for restarts: capacity one tick in two, a restart longer than a tick.
    tr = trace("10" * 160, gap=600)
    job = Job(48 * 3600, 52 * 3600, 0.2 * 3600)
    for name, make in SAFE.items():
        assert replay(job, tr, make("flicker")).met, name


@pytest.fixture(scope="module")
def published(tmp_path_factory):
    """Two scenarios' zones of the published multi-zone traces, unpacked from the shared archive."""
    archive = ARCHIVES / "multi-region-v100.tar.gz"
    if not archive.is_file():
        pytest.skip(f"{archive} not found (set ORCH_SPOT_TRACES to the folder of the published traces)")
    root = tmp_path_factory.mktemp("spot-traces")
    wanted = {
        f"{st.MULTI_DIR}/{z}_v100_1/{k}.json" for z in ("us-west-2a", "us-east-2a", "us-east-1a") for k in range(8)
    }
    with tarfile.open(archive) as tar:
        tar.extractall(root, members=[m for m in tar.getmembers() if m.name in wanted], filter="data")
    return root


@pytest.mark.parametrize("zones", [("us-west-2a", "us-east-2a"), ("us-east-1a",)])
def test_policies_meet_every_deadline_on_published_traces(published, zones):
    # us-east-1a alone has capacity in about a fifth of its ticks: the guarantee must hold there too.
    job = Job(24 * 3600, 36 * 3600, 0.2 * 3600)
    for k in range(8):
        tr = st.multi_zone_trace(published, zones, k)
        for name, make in SAFE.items():
            assert replay(job, tr, make(tr.name)).met, (name, k)


# -- orch simulate --traces -------------------------------------------------------------------------
def synthetic_layout(root: Path) -> None:
    """The published layout, with random hour-long ticks: small enough to score in seconds."""
    rng = random.Random(1)

    def write(path: Path, ticks: int) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        data = [int(rng.random() < 0.3) for _ in range(ticks)]
        path.write_text(json.dumps({"metadata": {"gap_seconds": 3600}, "data": data}))

    for zone in {z for s in st.SCENARIOS for z in s.zones}:
        for k in st.MULTI_TRACES:
            write(root / st.MULTI_DIR / f"{zone}_v100_1" / f"{k}.json", 60)
    for env in st.SINGLE_ENVS:
        for k in range(6):
            write(
                root / st.SINGLE_DIR / "ddl=search+task=48+overhead=0.02/real" / env / f"traces/random_start/{k}.json",
                80,
            )


@pytest.mark.slow  # every policy over the published traces
def test_simulate_traces_scores_every_variant_as_json(tmp_path, capsys):
    synthetic_layout(tmp_path)
    assert main(["simulate", "--traces", str(tmp_path), "--quick", "--randomize", "--seeds", "2", "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert RANDOMIZED in result["multi-zone"]["total"]["policies"]
    variants = result["multi-zone"]["variants"]
    assert set(variants) == {"high/36h/0.05h", "low/36h/0.05h", "high/48h/0.05h", "low/48h/0.05h"}
    for block in [*variants.values(), result["multi-zone"]["total"], result["single-zone"]["total"]]:
        for m in block["policies"].values():
            assert {"missed_deadlines", "cost_vs_on_demand", "saving_vs_up", "gap_to_optimum"} <= set(m)
            assert m["missed_deadlines"] == 0 and m["gap_to_optimum"] >= -1e-9
    assert result["scenarios"]["high-1"]["availability"] == pytest.approx(0.7, abs=0.1)


def test_simulate_traces_says_what_is_missing(tmp_path, capsys):
    assert main(["simulate", "--traces", str(tmp_path)]) == 2
    assert "unpack both archives" in capsys.readouterr().err


def test_zone_aware_commits_to_on_demand_when_the_slack_is_one_restart_and_one_tick():
    # Tick 10 of 13 (600 s each): 1,800 s left for 1,000 s of work, 720 s restarts: slack 800 s <= 1,320 s.
    # Spot runs and has capacity, yet only on-demand is sure to finish.
    job = Job(10_000, 13 * 600, 720)
    view = View(10, 600.0, job, 13, 9000.0, "spot", 0, 5, (True,))
    assert POLICIES["zone-aware"]("").choose(view) == Choice("on-demand")
    assert POLICIES["uniform-progress"]("").choose(view) == Choice("on-demand")
    for i in range(8):  # the commit is never drawn
        assert zone_aware_randomized(str(i)).choose(view) == Choice("on-demand")


# -- randomization (ROSS) ---------------------------------------------------------------------------
def test_draw_restarts_factor_is_reproducible_and_averages_the_tuned_value():
    draws = [draw_restarts_factor(f"run-{i}") for i in range(4000)]
    assert draws[:5] == [draw_restarts_factor(f"run-{i}") for i in range(5)]
    assert min(draws) >= 0 and max(draws) <= RESTARTS_FACTOR * (math.e - 1) / (math.e - 2) + 1e-9
    assert statistics.fmean(draws) == pytest.approx(RESTARTS_FACTOR, rel=0.05)
    # The ski-rental density puts most of its mass on long waits: small multipliers.
    assert statistics.median(draws) < RESTARTS_FACTOR


def test_adversarial_trace_costs_the_deterministic_policy_and_not_the_randomized_one():
    # Spot comes back the tick after the deterministic policy paid for on-demand, and vanishes the
    # tick after it returns: it ends on on-demand at about K (3.15) times the optimum. The same trace
    # costs the randomized policy, whose threshold the trace could not know, far less on average.
    job = Job(12 * 3600, 18 * 3600, 0.2 * 3600)
    tr = against(POLICIES["zone-aware"], job, 600.0)
    best = optimum_costs(job, [tr])[0]
    deterministic = replay(job, tr, POLICIES["zone-aware"]("any")).cost_usd / best
    outcomes = [replay(job, tr, zone_aware_randomized(f"draw-{i}")) for i in range(24)]
    randomized = statistics.fmean(o.cost_usd for o in outcomes) / best
    assert all(o.met for o in outcomes)
    assert deterministic > 2.5
    assert randomized < 0.7 * deterministic
