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
from orchestrator.simulate.spot_plan import SPELL_PRIOR, SpellFit, SpellWatch, plan
from orchestrator.simulate.spot_policies import POLICIES, RANDOMIZED, Planned, wait_for_spot_randomized
from orchestrator.simulate.spot_replay import Choice, View, replay, tick_work
from orchestrator.simulate.spot_traces import BENCHMARK_COSTS, CostModel, Job, Trace

ARCHIVES = Path(os.environ.get("ORCH_SPOT_TRACES", Path(__file__).resolve().parents[2] / "shared/data/spot-traces"))


def trace(*zones: str, gap: float = 100.0, prices: tuple[float, ...] | None = None) -> Trace:
    """Zones as strings of '1' (capacity) and '0' (none), one character a tick."""
    return Trace(
        "hand",
        tuple(f"z{i}" for i in range(len(zones))),
        gap,
        tuple(tuple(c == "1" for c in z) for z in zones),
        prices,
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
SAFE = {
    **POLICIES,
    **{f"{RANDOMIZED}#{i}": (lambda seed, i=i: wait_for_spot_randomized(f"{seed}{i}")) for i in range(4)},
}

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


def test_replay_under_the_benchmarks_costs_moves_spot_for_free_and_bills_the_final_zones_price():
    # Zone 0 lists $1.60/h, zone 1 $0.90/h. Spot in zone 0 for two ticks, then moved to zone 1 while
    # zone 0 still has capacity: no restart (50 + 100 + 100 = 250 s of work in three ticks). Every
    # spot tick is billed at zone 1's price, where the job ends.
    tr = trace("1111", "1111", prices=(1.6, 0.9))
    choices = [Choice("spot", 0), Choice("spot", 0), Choice("spot", 1)]
    out = replay(Job(250, 400, 50), tr, Script(choices), BENCHMARK_COSTS)
    assert out.met and out.finished_tick == 3 and out.launches == 1 and out.zone_switches == 1
    assert out.cost_usd == pytest.approx(3 * 0.9 * 100 / 3600)
    # orch's model: the move is a restart (50 s lost again), one more tick at the flat price.
    out = replay(Job(250, 400, 50), tr, Script([*choices, Choice("spot", 1)]))
    assert out.finished_tick == 4 and out.launches == 2
    assert out.cost_usd == pytest.approx(4 * SPOT_100S)


def test_replay_moves_nothing_and_on_demand_to_the_zone_they_name():
    # Waiting in zone 1 (no capacity there), then on-demand while pointing at zone 0: the policy sees
    # its zone's capacity through View.has_spot, and on-demand keeps running across a move.
    seen: list[tuple[int, bool]] = []

    class Mover:
        def choose(self, view: View) -> Choice:
            seen.append((view.zone, view.has_spot))
            return [Choice("none", 1), Choice("on-demand", 1), Choice("on-demand", 0)][min(view.tick, 2)]

    out = replay(Job(250, 700, 50), trace("1111111", "0000000"), Mover())
    assert seen == [(0, True), (1, False), (1, False), (0, True)]
    assert out.launches == 1 and out.finished_tick == 4


def test_trace_reads_each_zones_listed_price_of_its_first_tick(tmp_path):
    for zone, prices in (("us-east-1a", [1.55, 1.7]), ("us-west-2a", [1.0, 0.95])):
        path = tmp_path / st.MULTI_DIR / f"{zone}_v100_1" / "0.json"
        path.parent.mkdir(parents=True)
        path.write_text(json.dumps({"metadata": {"gap_seconds": 195}, "data": [0, 1], "prices": prices}))
    tr = st.multi_zone_trace(tmp_path, ("us-east-1a", "us-west-2a"), 0)
    assert tr.prices == (1.55, 1.0) and tr.up == ((True, False), (True, False))
    assert BENCHMARK_COSTS.spot_price(tr, 0) == 1.55 and st.ORCH_COSTS.spot_price(tr, 0) == st.SPOT_USD_H


class Recorded:
    """A policy of POLICIES whose every view and choice is noted in `seen`."""

    def __init__(self, name: str, seen: list[tuple[View, Choice]]) -> None:
        self.policy, self.seen = POLICIES[name](""), seen

    def choose(self, view: View) -> Choice:
        choice = self.policy.choose(view)
        self.seen.append((view, choice))
        return choice


# -- the published baselines, by hand --------------------------------------------------------------
def test_uniform_progress_follows_the_papers_rule_tick_by_tick():
    # 600 s of work due in 1,000 s, 100 s ticks, 50 s restarts: the line asks for 0.6 t.
    # t0-1 spot (50, 150 done). t2 preempted, 150 >= line 120: wait. t3 150 < 180: behind, on-demand
    # (200). t4 no spot: stay (300). t5-6 spot is back but 300 <= line(t + 2 x 50) = 360, 400 <= 420:
    # stay (400, 500). t7 500 > 480: spot (550). t8 spot (650): done at the end of tick 8.
    seen: list[tuple[View, Choice]] = []
    out = replay(Job(600, 1000, 50), trace("1100011111"), Recorded("uniform-progress", seen))
    assert [choice.market for _, choice in seen] == [
        "spot",
        "spot",
        "none",
        "on-demand",
        "on-demand",
        "on-demand",
        "on-demand",
        "spot",
        "spot",
    ]
    assert out.met and out.finished_tick == 9


def test_uniform_progress_round_robin_moves_on_when_it_would_wait_and_sees_the_next_zone_a_tick_later():
    # Zone 0 has no capacity; zone 1 has. Ahead of the line, the rule would wait: it moves to zone 1
    # (nothing runs in tick 0) and starts spot there in tick 1. With failover it starts at once.
    tr = trace("0000000000", "1111111111")
    job = Job(300, 1000, 50)
    round_robin = replay(job, tr, POLICIES["uniform-progress-round-robin"](""))
    failover = replay(job, tr, POLICIES["uniform-progress"](""))
    assert round_robin.finished_tick == failover.finished_tick + 1 == 5
    assert round_robin.spot_ticks == failover.spot_ticks == 4 and round_robin.on_demand_ticks == 0


def test_own_zone_reads_only_its_zone_and_zone_aware_reads_every_zone():
    # Zone 0 (where the job is) has no capacity, zone 1 has, with plenty of slack (11 h: with 19 h, a
    # 1.5-tick slack bin shows that waiting a tick for zone 1's new spell to prove itself costs nothing).
    job = Job(3600, 12 * 3600, 180)
    view = View(0, 600.0, job, 72, 0.0, "none", 0, 0, (False, True))
    assert POLICIES["zone-aware"]("").choose(view) == Choice("spot", 1)
    own = POLICIES["own-zone"]("").choose(view)
    assert own.market != "spot" and own.zone == 1  # it moves there and looks the next tick


def test_own_zone_looks_next_in_a_zone_not_seen_down_lately_not_back_where_it_just_was():
    # Zone 0 runs the job's spot for 10 ticks, then loses capacity, and so does zone 1; zone 2 (never
    # looked in) has capacity from then on. Looks go to zone 1 (next listed), then zone 2: zone 0's
    # ten good looks do not pull the job back to a zone seen down a tick ago.
    seen: list[tuple[View, Choice]] = []
    zones = trace("1" * 10 + "0" * 110, "0" * 120, "0" * 10 + "1" * 110, gap=195.0)
    out = replay(Job(3600, 6 * 3600, 180), zones, Recorded("own-zone", seen))
    looked = [view.zone for view, _ in seen]
    assert looked[:12] == [0] * 11 + [1] and looked[12] == 2
    assert out.met and out.zone_switches == 1 and set(looked[12:]) == {2}


def test_own_zone_takes_a_spell_found_up_on_a_look_elsewhere_as_already_lasting():
    # 195 s ticks: a spell found up in another zone is 780 s = 4 ticks old, and the down spell left
    # behind in zone 0 (never seen to end) is fitted as nothing.
    job = Job(3600, 2 * 3600, 180)
    policy = POLICIES["own-zone"]("")
    assert isinstance(policy, Planned)
    assert policy.choose(View(0, 195.0, job, 36, 0.0, "none", 0, 0, (False, True))).zone == 1
    policy.choose(View(1, 195.0, job, 36, 0.0, "none", 1, 0, (False, True)))
    assert policy.memory is not None
    watch = policy.memory.watch
    assert (watch.up, watch.age) == (True, 4) and all(fit.scale == 1.0 for fit in watch.fits.values())
    assert (
        watch.fits.get(False) is None
        or watch.fits[False].log_likelihood == SpellFit(SPELL_PRIOR, False, 195.0).log_likelihood
    )
    policy.choose(View(2, 195.0, job, 36, 0.0, "spot", 1, 1, (False, True)))
    assert (watch.up, watch.age) == (True, 5)  # watched in the same zone, it ages tick by tick


# -- the planner --------------------------------------------------------------------------------
def test_spell_fit_scales_the_hazard_up_for_short_spells_and_down_for_long_ones():
    short, long = SpellFit(SPELL_PRIOR, True, 600.0), SpellFit(SPELL_PRIOR, True, 600.0)
    assert short.scale == long.scale == 1.0
    for _ in range(12):
        short.end(1)
        long.end(60)
    assert short.scale > 1.0 > long.scale


def test_plan_waits_out_an_outage_with_slack_to_spare_and_not_without():
    # 10 h of work due in 20 h (600 s ticks, 0.05 h restarts), spot down for one tick, nothing running.
    watch = SpellWatch(SPELL_PRIOR, 600.0)
    watch.see(False)
    table = plan(watch, 120, 10 * 3600.0, 180.0)
    assert table.market(0, False, 1, "none", 0, 10 * 3600.0) == "none"
    assert table.market(100, False, 1, "none", 0, 0.3 * 3600.0) == "on-demand"
    assert table.market(0, True, 1, "none", 0, 10 * 3600.0) == "spot"


# -- the optimum against brute force -------------------------------------------------------------
def brute_force(job: Job, tr: Trace, costs: CostModel = st.ORCH_COSTS) -> float:
    """Every schedule the trace allows, replayed: the cheapest on time (inf if none). Where prices are
    per zone, nothing and on-demand may also move the job to any zone (a move costs nothing)."""
    ticks = int(job.deadline_s // tr.gap_s)
    zones = range(len(tr.up)) if costs.final_zone_prices else [None]
    options = [
        [
            *(Choice(m, z) for m in ("none", "on-demand") for z in zones),
            *(Choice("spot", z) for z in range(len(tr.up)) if tr.up[z][t]),
        ]
        for t in range(ticks)
    ]
    best = float("inf")
    for schedule in itertools.product(*options):
        out = replay(job, tr, Script(list(schedule)), costs)
        if out.met:
            best = min(best, out.cost_usd)
    return best


@pytest.mark.parametrize("seed", range(6))
def test_optimum_equals_brute_force_on_small_traces(seed):
    rng = random.Random(seed)
    tr = trace(*("".join(rng.choice("01") for _ in range(7)) for _ in range(2)))
    job = Job(300, 700, rng.choice((0, 50, 150)))
    assert optimum_costs(job, [tr])[0] == pytest.approx(brute_force(job, tr))


@pytest.mark.parametrize("seed", range(4))
def test_optimum_equals_brute_force_under_the_benchmarks_costs(seed):
    # Per-zone prices billed at the final zone's, free spot moves: the program runs once per final zone.
    rng = random.Random(100 + seed)
    tr = trace(*("".join(rng.choice("01") for _ in range(6)) for _ in range(2)), prices=(1.6, 0.9))
    job = Job(300, 600, rng.choice((50, 150)))
    assert optimum_costs(job, [tr], BENCHMARK_COSTS)[0] == pytest.approx(brute_force(job, tr, BENCHMARK_COSTS))


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
@pytest.mark.parametrize("costs", ["orch", "benchmark"])
def test_simulate_traces_scores_every_variant_as_json(tmp_path, capsys, costs):
    synthetic_layout(tmp_path)
    args = ["simulate", "--traces", str(tmp_path), "--quick", "--randomize", "--seeds", "2", "--costs", costs]
    assert main([*args, "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["cost_model"] == costs
    assert RANDOMIZED in result["multi-zone"]["total"]["policies"]
    variants = result["multi-zone"]["variants"]
    assert set(variants) == {"high/36h/0.05h", "low/36h/0.05h", "high/48h/0.05h", "low/48h/0.05h"}
    blocks = [*variants.values(), *(result[s]["total"] for s in ("multi-zone", "single-zone", "adrs-multi-zone"))]
    for block in blocks:
        for name, m in block["policies"].items():
            assert {"missed_deadlines", "cost_vs_on_demand", "saving_vs_up", "gap_to_optimum", "halves"} <= set(m)
            assert {"saving_vs_up_round_robin", "saving_vs_up_one_zone"} <= set(m)
            assert m["missed_deadlines"] == 0 and m["gap_to_optimum"] >= -1e-9, name
    assert result["scenarios"]["high-1"]["availability"] == pytest.approx(0.7, abs=0.1)


def test_simulate_traces_smoke_scores_every_setting_policy_and_half_on_fewer_runs(tmp_path, capsys):
    synthetic_layout(tmp_path)
    assert main(["simulate", "--traces", str(tmp_path), "--smoke", "--json"]) == 0
    smoke = json.loads(capsys.readouterr().out)
    for setting in ("multi-zone", "single-zone", "adrs-multi-zone"):
        for name, m in smoke[setting]["total"]["policies"].items():
            assert set(m["halves"]) == {"tune", "held-out"}, (setting, name)
            assert m["halves"]["tune"]["runs"] == m["halves"]["held-out"]["runs"], (setting, name)
    assert set(smoke["multi-zone"]["total"]["policies"]) == set(POLICIES)
    assert set(smoke["multi-zone"]["variants"]) == {"high/36h/0.05h", "low/36h/0.05h"}
    assert smoke["multi-zone"]["total"]["policies"]["zone-aware"]["runs"] == 4  # 2 scenarios x 2 traces


def test_simulate_traces_says_what_is_missing(tmp_path, capsys):
    assert main(["simulate", "--traces", str(tmp_path)]) == 2
    assert "unpack both archives" in capsys.readouterr().err


def test_orchs_policies_commit_to_on_demand_when_the_slack_is_one_restart_and_one_tick():
    # Tick 10 of 13 (600 s each): 1,800 s left for 1,000 s of work, 720 s restarts: slack 800 s <= 1,320 s.
    # Spot runs and has capacity, yet only on-demand is sure to finish.
    job = Job(10_000, 13 * 600, 720)
    view = View(10, 600.0, job, 13, 9000.0, "spot", 0, 5, (True,))
    for name in ("zone-aware", "own-zone", "wait-for-spot"):
        assert POLICIES[name]("").choose(view) == Choice("on-demand"), name
    for i in range(8):  # the commit is never drawn
        assert wait_for_spot_randomized(str(i)).choose(view) == Choice("on-demand")


def test_uniform_progress_keeps_a_started_spot_machine_at_the_deadline_and_commits_otherwise():
    # The same tick under the paper's rule: work left plus a restart no longer fits, so a spot machine
    # past its start-up is kept to the end (the fastest way there); one still starting is not.
    job = Job(10_000, 13 * 600, 720)
    up_for_a_while = View(10, 600.0, job, 13, 9000.0, "spot", 0, 5, (True,))
    just_started = View(10, 600.0, job, 13, 9000.0, "spot", 0, 1, (True,))
    waiting = View(10, 600.0, job, 13, 9000.0, "none", 0, 0, (True,))
    policy = POLICIES["uniform-progress"]("")
    assert policy.choose(up_for_a_while) == Choice("spot", 0)
    assert policy.choose(just_started) == Choice("on-demand")
    assert policy.choose(waiting) == Choice("on-demand")


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
    tr = against(POLICIES["wait-for-spot"], job, 600.0)
    best = optimum_costs(job, [tr])[0]
    deterministic = replay(job, tr, POLICIES["wait-for-spot"]("any")).cost_usd / best
    outcomes = [replay(job, tr, wait_for_spot_randomized(f"draw-{i}")) for i in range(24)]
    randomized = statistics.fmean(o.cost_usd for o in outcomes) / best
    assert all(o.met for o in outcomes)
    assert deterministic > 2.5
    assert randomized < 0.7 * deterministic
