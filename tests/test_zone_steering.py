"""Zone steering of real launches: zones.json kept from SkyPilot's job records, ranked by ZoneModel, rendered as
the order of the task's candidates (checked by SkyPilot's own loader), fed to relaunches and to the next run."""

from __future__ import annotations

import pytest

from orchestrator.backends.base import LaunchRequest
from orchestrator.backends.skypilot import SkyPilotLauncher
from orchestrator.backends.skypilot_render import load_task, load_template, render_worker_task, to_yaml
from orchestrator.core.context import RunContext
from orchestrator.core.errors import SpecError
from orchestrator.core.layout import RunLayout
from orchestrator.core.records import ZoneHistory, ZoneTally, ZoneWatch, read_zone_history
from orchestrator.core.spec_load import load_spec
from orchestrator.core.store import open_store
from orchestrator.fleet.launch import launch_workers
from orchestrator.fleet.reconcile import Reconciler
from orchestrator.planning.spot_zones import ZoneModel
from orchestrator.planning.zone_steering import rank_zones
from tests.support.fake_sky import ScriptedSky
from tests.support.runs import chat_request, make_run
from tests.support.s3servers import make_store_uri

A, B, C = "aws/us-east-1/us-east-1a", "aws/us-east-1/us-east-1b", "aws/us-west-2/us-west-2a"


@pytest.fixture(autouse=True)
def sky_home(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path_factory.mktemp("home")))
    monkeypatch.setenv("SKYPILOT_DISABLE_USAGE_COLLECTION", "1")


def spec_with_zones(zones, **flags):
    return load_spec(
        None, {"run": "z", "resources.gpus": ["L4"], "resources.zones": zones, **flags}, env={}, default_file=False
    )


def test_rank_zones_puts_the_zone_preempted_often_last_and_an_untried_one_between():
    history = ZoneHistory(
        zones={
            A: ZoneTally(up_s=3600, preemptions=3, waits=3, wait_s=300),
            B: ZoneTally(up_s=5 * 3600, preemptions=0, ended=1, waits=1, wait_s=60),
        }
    )
    order = rank_zones([A, C, B], history, [], now=0.0, model=ZoneModel())
    assert [z.place for z in order] == [B, C, A]
    assert "0 preemption(s) in 5.0 h up" in order[0].why() and "nothing seen yet" in order[1].why()


def test_rank_zones_counts_a_running_spell_and_a_region_learns_from_its_zones():
    running = ZoneHistory(jobs={"7": ZoneWatch(worker=0, place=B, up_since=0.0, waiting_since=0.0)})
    # 10 h up in us-east-1b right now: the region aws/us-east-1 covers it and goes first.
    order = rank_zones(["aws/us-west-2", "aws/us-east-1"], running, [], now=36000.0, model=ZoneModel())
    assert order[0].place == "aws/us-east-1" and order[0].expected_up_s >= 36000


def test_rank_zones_earlier_runs_count_at_a_discount():
    earlier = ZoneHistory(zones={A: ZoneTally(up_s=600, preemptions=4)})
    now_seen = ZoneHistory(zones={B: ZoneTally(up_s=600, preemptions=1)})
    order = rank_zones([A, B], now_seen, [earlier], now=0.0, model=ZoneModel())
    assert [z.place for z in order] == [B, A] and order[1].preemptions == 2.0


def test_spec_zones_refuse_on_prem_and_places_given_twice():
    with pytest.raises(SpecError, match="zones"):
        spec_with_zones(["slurm/mycluster"])
    with pytest.raises(SpecError, match="zones"):
        spec_with_zones([A], **{"resources.cloud": "aws"})


def test_rendered_zones_are_skypilots_ordered_candidates_spot_first_in_ranked_order():
    spec = spec_with_zones([A, B])
    envs = {"ORCH_RUN": "z", "ORCH_STORE": "s3://b/z", "ORCH_WORKER": "0", "ORCH_WORKER_LIST": "workers/0.txt"}
    request = LaunchRequest(worker=0, name="orch-z-w0", envs=envs, zones=[B, A])
    task = load_task(to_yaml(render_worker_task(load_template(), spec, request)))
    got = [(r.zone, r.use_spot) for r in task.resources]  # SkyPilot keeps `ordered` as a list
    assert got == [("us-east-1b", True), ("us-east-1a", True), ("us-east-1b", False), ("us-east-1a", False)]
    on_demand = LaunchRequest(worker=1, name="orch-z-w1", envs=envs, zones=[B, A], use_spot=False)
    task = load_task(to_yaml(render_worker_task(load_template(), spec, on_demand)))
    assert [(r.zone, r.use_spot) for r in task.resources] == [("us-east-1b", False), ("us-east-1a", False)]


def placed(status, zone, recoveries=0, **more):
    return {
        "status": status,
        "cloud": "AWS",
        "region": "us-east-1",
        "zone": zone,
        "recovery_count": recoveries,
        "cluster_resources": "1x AWS([Spot]g6.xlarge, {'L4': 1})",
        **more,
    }


def first_zone(task):
    return task.resources[0].zone


def test_preemptions_seen_by_watch_steer_the_relaunch_and_the_next_run(request, tmp_path):
    uri = make_store_uri("moto", request, tmp_path)
    store = open_store(uri)
    flags = {"store": uri, "backend": "skypilot", "resources.gpus": ["L4"], "resources.zones": [A, B]}

    def ctx_for(run):
        make_run(store, run, [[chat_request(f"{run}-{i}", "q") for i in range(2)]], model="m", workers=1)
        spec = load_spec(None, {"run": run, **flags}, env={}, default_file=False)
        return RunContext(spec, store, RunLayout(run))

    ctx, sky, now = ctx_for("first"), ScriptedSky(), [0.0]
    launcher = SkyPilotLauncher(ctx.spec, sdk=sky)
    launch_workers(ctx, launcher, [0], clock=lambda: now[0])
    assert first_zone(sky.launched[0][1]) == "us-east-1a"  # nothing known yet: as listed
    events: list[str] = []
    loop = Reconciler(ctx, launcher, clock=lambda: now[0], on_event=events.append)
    # Up in us-east-1a after 2 min, preempted after 3 min there, recovered into us-east-1b, then failed.
    script = [
        placed("RUNNING", "us-east-1a"),
        placed("RECOVERING", "us-east-1a"),
        placed("RUNNING", "us-east-1b", recoveries=1),
        placed("FAILED", "us-east-1b", recoveries=1, end_at=4000.0),
    ]
    sky.script_job(1, script)
    for t in (120.0, 300.0, 400.0, 4000.0):
        now[0] = t
        loop.tick()
    assert f"worker 0: preempted in {A} after 3 min up" in events
    assert f"worker 0: capacity in {B} after 2 min" in events
    relaunch = next(e for e in events if "relaunch after FAILED -> job 2" in e)
    assert f"zone {B}: up spell" in relaunch and f"then {A}" in relaunch
    assert first_zone(sky.launched[1][1]) == "us-east-1b"
    history = read_zone_history(store, ctx.layout)
    assert (history.zones[A].preemptions, history.zones[A].up_s) == (1, 180.0)
    assert (history.zones[B].preemptions, history.zones[B].up_s, history.zones[B].ended) == (0, 3600.0, 1)
    # A new run in the same store starts where the first one learned to go.
    second = ctx_for("second")
    launch_workers(second, SkyPilotLauncher(second.spec, sdk=sky), [0], clock=lambda: now[0])
    assert first_zone(sky.launched[2][1]) == "us-east-1b"
