"""The deadline policy: decisions on hand-computed timelines, and `orch watch --deadline` acting through a launcher."""

from __future__ import annotations

import dataclasses
import math
import time

import pytest

from orchestrator.backends.skypilot import SkyPilotLauncher
from orchestrator.commands.console import to_text
from orchestrator.commands.views import status_view
from orchestrator.core.context import RunContext
from orchestrator.core.errors import SpecError
from orchestrator.core.layout import RunLayout
from orchestrator.core.records import ZoneTally, read_jobs, read_record, update_zone_history
from orchestrator.core.records.run import DecisionRecord
from orchestrator.core.spec_load import load_spec
from orchestrator.core.store import open_store
from orchestrator.fleet.launch import launch_workers
from orchestrator.fleet.reconcile import Reconciler
from orchestrator.planning.deadline import DeadlineSettings, FleetState, OnDemandWorker, decide, parse_duration
from orchestrator.planning.pricing import load_gpu_table
from orchestrator.runview.status import status_of
from tests.support.fake_sky import ScriptedSky
from tests.support.run_states import running_beat
from tests.support.runs import Answer, answer_chunk, chat_request, make_run
from tests.support.s3servers import make_store_uri

H = 3600.0
EIGHT_HOURS = DeadlineSettings(deadline_s=8 * H, restart_overhead_s=600, max_on_demand=4)


def state(elapsed_h, done, spot_rate, on_demand=(), total=1000.0, new_rate=0.02, cost=0.0):
    return FleetState(
        elapsed_s=elapsed_h * H,
        total_rows=total,
        done_rows=done,
        spot_rate=spot_rate,
        on_demand=list(on_demand),
        new_worker_rate=new_rate,
        new_worker_usd_h=1.0,
        cost_so_far_usd=cost,
    )


# -- decisions on hand timelines -----------------------------------------------------------------
def test_ahead_of_the_line_stays_on_spot():
    # Line at 2 h of 8 h (after a 10-minute start-up): (7200 - 600) / (28800 - 600) = 23.4%; 40% done.
    d = decide(state(2, 400, spot_rate=0.05), EIGHT_HOURS)
    assert d.action == "hold" and d.mode == "ahead" and d.launch == 0
    assert d.line == pytest.approx(6600 / 28200)


def test_behind_the_line_adds_on_demand_workers():
    # 4 h in, 30% done, line 48.9%: behind. need = 700 / (14400 - 600) = 0.050725 rows/s; have 0.02;
    # aim for need x 1.15 -> deficit 0.038333 -> 2 workers of 0.02 rows/s. (Not critical: on-demand at
    # the cap, 4 x 0.02 rows/s, would take 700 x 1.15 / 0.08 = 10,062 s of the 14,400 left.)
    d = decide(state(4, 300, spot_rate=0.02), EIGHT_HOURS)
    assert d.action == "launch" and d.mode == "behind"
    assert d.launch == math.ceil((700 / 13800 * 1.15 - 0.02) / 0.02) == 2
    assert d.need_rows_per_s == pytest.approx(700 / 13800)


def test_behind_but_covered_by_workers_starting_holds():
    d = decide(state(4, 300, spot_rate=0.02, on_demand=[OnDemandWorker(9, 0.04, up=False)]), EIGHT_HOURS)
    assert d.action == "hold" and d.mode == "behind" and "starting cover it" in d.reason


def test_slack_within_the_restart_overhead_commits_to_on_demand_even_with_spot_running():
    # 7 h in, 250 rows left. On-demand at the cap: 4 x 0.02 = 0.08 rows/s -> 250 x 1.15 / 0.08 = 3594 s
    # of the 3600 s left: slack 6 s < 600 s. Spot (however fast now) is not counted: need x 1.15 =
    # 0.0958 rows/s -> 5 workers, capped at 4.
    d = decide(state(7, 750, spot_rate=1.0), EIGHT_HOURS)
    assert d.mode == "critical" and d.action == "launch" and d.launch == 4
    assert "committing to on-demand" in d.reason


def test_comfortably_ahead_retires_on_demand_workers_slowest_first():
    od = [OnDemandWorker(5, 0.02, up=True), OnDemandWorker(6, 0.01, up=True)]
    # 3 h in, 80% done (line 36%): spot alone (0.05) covers need 200 / 17400 x 1.15.
    d = decide(state(3, 800, spot_rate=0.05, on_demand=od), EIGHT_HOURS)
    assert d.action == "retire" and d.retire == [6, 5]


def test_ahead_keeps_the_on_demand_that_spot_cannot_replace():
    od = [OnDemandWorker(5, 0.02, up=True)]
    # need = 200 / 17400 = 0.0115; with margin 0.0132: spot 0.005 alone is not enough.
    d = decide(state(3, 800, spot_rate=0.005, on_demand=od), EIGHT_HOURS)
    assert d.action == "hold" and d.retire == []


def test_budget_reached_stops_launches_and_says_so():
    settings = DeadlineSettings(deadline_s=8 * H, restart_overhead_s=600, max_on_demand=4, budget_usd=50)
    d = decide(state(4, 300, spot_rate=0.02, cost=50.0), settings)
    assert d.action == "budget" and d.launch == 0 and "budget $50.00 reached" in d.reason


def test_budget_limits_how_many_are_launched():
    # 4 h left at $1/h: $4 per worker; $5.50 left -> 1 of the 2 wanted.
    settings = DeadlineSettings(deadline_s=8 * H, restart_overhead_s=600, max_on_demand=4, budget_usd=6)
    d = decide(state(4, 300, spot_rate=0.02, cost=0.5), settings)
    assert d.action == "launch" and d.launch == 1 and "budget allows 1 of 2" in d.reason


def test_greedy_waits_on_spot_until_the_slack_is_gone():
    greedy = DeadlineSettings(deadline_s=8 * H, restart_overhead_s=600, max_on_demand=4, greedy=True)
    assert decide(state(4, 300, spot_rate=0.02), greedy).action == "hold"
    assert decide(state(7, 750, spot_rate=1.0), greedy).action == "launch"


def test_behind_with_spot_waiting_for_capacity_waits_while_the_slack_exceeds_the_reserve():
    # 1 h into 8 h, nothing done, both spot workers waiting for capacity: 5.4 h of slack at their pace.
    waiting = dataclasses.replace(state(1, 0, 0.0, new_rate=0.1), spot_waiting=2, spot_pace=0.2)
    d = decide(waiting, EIGHT_HOURS)
    assert (d.action, d.mode) == ("hold", "waiting")
    assert "waiting for spot: slack 5.4 h > reserve 1.5 h" in d.reason  # 960 s + 0.75 x 7 restarts x 600 s + 1,320 s
    up = decide(waiting, dataclasses.replace(EIGHT_HOURS, spot_wait=False))  # Uniform Progress pays at once
    assert (up.action, up.mode) == ("launch", "behind")
    # 3 h before the deadline: still worth waiting with hour-long spells, not with 20-minute ones.
    later = dataclasses.replace(waiting, elapsed_s=5 * H)
    assert "waiting for spot: slack 87 min > reserve" in decide(later, EIGHT_HOURS).reason
    short = decide(dataclasses.replace(later, mean_up_s=1200.0), EIGHT_HOURS)
    assert short.action == "launch" and "on-demand: slack 87 min within reserve 1.8 h" in short.reason


def test_behind_with_spot_waiting_uses_the_reserve_multiplier_drawn_for_the_run():
    # 3 h before the deadline, 87 min of slack (the test above). With 20-minute spells the tuned
    # multiplier pays for on-demand; a run that drew a small one (orch watch --randomize) still waits.
    # With hour-long spells the tuned one waits; a run that drew a large one pays.
    later = dataclasses.replace(state(1, 0, 0.0, new_rate=0.1), spot_waiting=2, spot_pace=0.2, elapsed_s=5 * H)
    short = dataclasses.replace(later, mean_up_s=1200.0)
    assert decide(short, dataclasses.replace(EIGHT_HOURS, restarts_factor=0.1)).mode == "waiting"
    assert decide(later, dataclasses.replace(EIGHT_HOURS, restarts_factor=1.7)).action == "launch"


def test_durations():
    assert parse_duration("8h") == 8 * H and parse_duration("2h30m") == 2.5 * H
    assert parse_duration("1.5d") == 36 * H and parse_duration("90") == 90
    with pytest.raises(SpecError, match="'8 hours' is not a duration"):
        parse_duration("8 hours")


# -- `orch watch --deadline`: the reconcile loop acting through the SkyPilot launcher ---------------
@pytest.fixture(autouse=True)
def sky_home(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path_factory.mktemp("home")))
    monkeypatch.setenv("SKYPILOT_DISABLE_USAGE_COLLECTION", "1")


def make_ctx(tmp_path, chunks=4):
    store = open_store(tmp_path / "store")
    make_run(
        store, "dl", [[chat_request(f"c{c}-{i}", "q") for i in range(2)] for c in range(chunks)], model="m", workers=2
    )
    spec = load_spec(
        None, {"run": "dl", "store": "r2://bucket/orch", "backend": "skypilot"}, env={}, default_file=False
    )
    return RunContext(spec, store, RunLayout("dl"))


def launched_spot_choices(sky):
    return {name: {r.use_spot for r in task.resources} for _, task, name in sky.launched}


def test_watch_behind_schedule_launches_on_demand_through_the_launcher_and_logs_why(tmp_path):
    ctx = make_ctx(tmp_path)
    sky = ScriptedSky()
    launcher = SkyPilotLauncher(ctx.spec, sdk=sky)
    launch_workers(ctx, launcher, [0, 1], clock=lambda: time.time() - 5 * H)  # the run started 5 h ago
    for w in (0, 1):
        running_beat(ctx, w, rows_per_s=1e-4)
    settings = DeadlineSettings(deadline_s=6 * H, restart_overhead_s=600, max_on_demand=2)
    events = []
    report = Reconciler(ctx, launcher, deadline=settings, on_event=events.append).tick()

    assert report.decision.action == "launch" and report.decision.mode == "behind"
    assert launched_spot_choices(sky)["orch-dl-w2"] == {False}  # a new worker, on demand
    record, _ = read_jobs(ctx.store, ctx.layout)
    assert record.worker(2).current.use_spot is False and record.worker(2).current.reason == "deadline: behind"
    assert any("on-demand job" in e for e in events)
    logged = list(ctx.store.list(ctx.layout.decisions_prefix))
    assert len(logged) == 1
    view = to_text(
        status_view(
            status_of(
                ctx.store,
                ctx.layout,
                launcher,
                now=time.time(),
                prices=load_gpu_table(),
                gpus=ctx.spec.resources.gpus,
                workers_planned=2,
            )
        )
    )
    assert "deadline 6h" in view and "[behind]" in view and "behind the uniform line" in view


def test_watch_ahead_retires_on_demand_workers_and_never_relaunches_them(tmp_path):
    ctx = make_ctx(tmp_path)
    sky = ScriptedSky()
    launcher = SkyPilotLauncher(ctx.spec, sdk=sky)
    launch_workers(ctx, launcher, [0, 1], clock=lambda: time.time() - 2 * H)
    extra = launch_workers(
        ctx, launcher, [2], use_spot=False, reason="deadline: behind", clock=lambda: time.time() - H
    )[2]
    for c in range(3):  # 75% done at 2 h of 8 h: far ahead of the line
        answer_chunk(ctx.store, ctx.layout, f"part_0000{c}", [[Answer(i, f"c{c}-{i}", "a") for i in range(2)]])
    for w in (0, 1):
        running_beat(ctx, w, rows_per_s=1.0)
    settings = DeadlineSettings(deadline_s=8 * H, restart_overhead_s=600, max_on_demand=2)
    reconciler = Reconciler(ctx, launcher, deadline=settings)
    report = reconciler.tick()

    assert report.decision.action == "retire" and report.decision.retire == [2]
    assert int(extra) in sky.cancelled
    record, _ = read_jobs(ctx.store, ctx.layout)
    assert record.worker(2).current.retired
    launches = len(sky.launched)
    reconciler.tick()  # its job now reports CANCELLED: ours, not a reason to relaunch
    assert len(sky.launched) == launches


def test_watch_with_the_budget_spent_launches_nothing_not_even_relaunches(tmp_path):
    ctx = make_ctx(tmp_path)
    sky = ScriptedSky()
    launcher = SkyPilotLauncher(ctx.spec, sdk=sky)
    launch_workers(ctx, launcher, [0, 1], clock=lambda: time.time() - 5 * H)
    sky.script_job(1, ["FAILED"])  # worker 0's job fails: normally relaunched
    running_beat(ctx, 1, rows_per_s=1e-4, up_h=5.0)  # 5 h of an L4 spot: about $1.40 so far
    settings = DeadlineSettings(deadline_s=6 * H, restart_overhead_s=600, max_on_demand=2, budget_usd=1.0)
    events = []
    report = Reconciler(ctx, launcher, deadline=settings, on_event=events.append).tick()

    assert report.decision.action == "budget" and not report.relaunched
    assert len(sky.launched) == 2
    assert any("budget $1.00 reached" in e and "no new launches" in e for e in events)


def test_watch_waits_for_spot_while_the_slack_allows_then_launches_on_demand(tmp_path):
    ctx = make_ctx(tmp_path)
    sky = ScriptedSky(script=("PENDING",))  # no spot capacity anywhere: every job waits for some
    launcher = SkyPilotLauncher(ctx.spec, sdk=sky)
    now = [0.0]
    launch_workers(ctx, launcher, [0, 1], clock=lambda: now[0])
    settings = DeadlineSettings(deadline_s=10 * H, restart_overhead_s=600, max_on_demand=2)
    events: list[str] = []
    loop = Reconciler(ctx, launcher, deadline=settings, clock=lambda: now[0], on_event=events.append)

    now[0] = 1 * H  # behind the line (nothing done), 8.8 h of slack against a reserve of 1.8 h
    report = loop.tick()
    assert (report.decision.action, report.decision.mode) == ("hold", "waiting") and len(sky.launched) == 2
    assert any(e.startswith("deadline [waiting] hold: behind the uniform line") for e in events)
    assert "waiting for spot: slack 8.8 h > reserve 1.8 h" in events[-1]
    (key,) = [o.key for o in ctx.store.list(ctx.layout.decisions_prefix)]
    logged, _ = read_record(ctx.store, key, DecisionRecord)
    assert logged is not None and logged.mode == "waiting" and "waiting for spot" in logged.reason

    now[0] = 9.2 * H  # 48 min left: the slack (38 min) is within the reserve (44 min)
    report = loop.tick()
    assert (report.decision.action, report.decision.mode) == ("launch", "behind")
    assert "on-demand: slack 38 min within reserve 44 min" in report.decision.reason
    assert launched_spot_choices(sky)["orch-dl-w2"] == {False}


def test_watch_deadline_decisions_name_the_zone_and_reserve_for_the_spells_learned_there(request, tmp_path):
    a, b = "aws/us-east-1/us-east-1a", "aws/us-east-1/us-east-1b"
    uri = make_store_uri("moto", request, tmp_path)
    store = open_store(uri)
    make_run(store, "dz", [[chat_request(f"c{c}-{i}", "q") for i in range(2)] for c in range(4)], model="m", workers=2)
    flags = {"run": "dz", "store": uri, "backend": "skypilot", "resources.gpus": ["L4"], "resources.zones": [a, b]}
    ctx = RunContext(load_spec(None, flags, env={}, default_file=False), store, RunLayout("dz"))

    def seen(history):  # an hour up in each zone: us-east-1a preempted 9 times, us-east-1b 5 times
        history.zones.update({a: ZoneTally(up_s=H, preemptions=9), b: ZoneTally(up_s=H, preemptions=5)})
        return True

    update_zone_history(store, ctx.layout, seen)
    sky = ScriptedSky(script=("PENDING",))
    launcher = SkyPilotLauncher(ctx.spec, sdk=sky)
    now = [0.0]
    launch_workers(ctx, launcher, [0, 1], clock=lambda: now[0])
    events: list[str] = []
    settings = DeadlineSettings(deadline_s=10 * H, restart_overhead_s=600, max_on_demand=2)
    loop = Reconciler(ctx, launcher, deadline=settings, clock=lambda: now[0], on_event=events.append)

    now[0] = 1 * H  # the best zone's spells last 20 min: 27 restarts expected, a reserve of 4 h (1.8 h unlearned)
    assert loop.tick().decision.mode == "waiting"
    assert "waiting for spot: slack 8.8 h > reserve 4.0 h" in events[-1]
    assert f"(zone {b}: up spell" in events[-1] and f"then {a})" in events[-1]

    now[0] = 9.2 * H
    decision = loop.tick().decision
    assert decision.action == "launch" and "on-demand: slack 38 min within reserve 56 min" in decision.reason
    line = next(e for e in events if e.startswith("deadline [behind] launch"))
    assert f"(zone {b}: up spell" in line
    (task,) = [task for _, task, name in sky.launched if name == "orch-dz-w2"]
    assert [(r.zone, r.use_spot) for r in task.resources] == [("us-east-1b", False), ("us-east-1a", False)]
