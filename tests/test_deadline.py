"""The deadline policy: decisions on hand-computed timelines, and `orch watch --deadline` acting through a launcher."""

from __future__ import annotations

import math
import time

import pytest

from orchestrator.backends.skypilot import SkyPilotLauncher
from orchestrator.commands.console import to_text
from orchestrator.commands.views import status_view
from orchestrator.controller.deadline import DeadlineSettings, FleetState, OnDemandWorker, decide, parse_duration
from orchestrator.controller.launch import launch_workers
from orchestrator.controller.pricing import load_gpu_table
from orchestrator.controller.reconcile import Reconciler
from orchestrator.controller.status import status_of
from orchestrator.core.context import RunContext
from orchestrator.core.errors import SpecError
from orchestrator.core.protocol.heartbeats import HeartbeatPublisher
from orchestrator.core.protocol.layout import RunLayout
from orchestrator.core.records import Heartbeat, read_jobs
from orchestrator.core.spec import load_spec
from orchestrator.core.store import open_store
from tests.support.fake_sky import ScriptedSky
from tests.support.runs import Answer, answer_chunk, chat_request, make_run

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


def beat(ctx, worker, rows_per_s, *, up_h=1.0):
    now = time.time()
    HeartbeatPublisher(
        ctx.store,
        ctx.layout,
        Heartbeat(
            worker=str(worker),
            holder=f"{worker}.h",
            state="running",
            accelerator="NVIDIA L4",
            spot=True,
            started_at=now - up_h * H,
            updated_at=now,
            chunk=None,
            rows_per_s=rows_per_s,
        ),
    ).publish()


def launched_spot_choices(sky):
    return {name: {r.use_spot for r in task.resources} for _, task, name in sky.launched}


def test_watch_behind_schedule_launches_on_demand_through_the_launcher_and_logs_why(tmp_path):
    ctx = make_ctx(tmp_path)
    sky = ScriptedSky()
    launcher = SkyPilotLauncher(ctx.spec, sdk=sky)
    launch_workers(ctx, launcher, [0, 1], clock=lambda: time.time() - 5 * H)  # the run started 5 h ago
    for w in (0, 1):
        beat(ctx, w, rows_per_s=1e-4)
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
        beat(ctx, w, rows_per_s=1.0)
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
    beat(ctx, 1, rows_per_s=1e-4, up_h=5.0)  # 5 h of an L4 spot: about $1.40 so far
    settings = DeadlineSettings(deadline_s=6 * H, restart_overhead_s=600, max_on_demand=2, budget_usd=1.0)
    events = []
    report = Reconciler(ctx, launcher, deadline=settings, on_event=events.append).tick()

    assert report.decision.action == "budget" and not report.relaunched
    assert len(sky.launched) == 2
    assert any("budget $1.00 reached" in e and "no new launches" in e for e in events)
