"""The SkyPilot launcher and the reconcile loop, with only the API server scripted (it reaches the clouds)."""

from __future__ import annotations

import time

import pytest

from orchestrator.backends.base import JobState, JobStatus, orphaned
from orchestrator.backends.skypilot import SkyPilotLauncher
from orchestrator.core.context import RunContext
from orchestrator.core.errors import BackendError, LaunchFailed
from orchestrator.core.layout import RunLayout
from orchestrator.core.protocol.heartbeats import HeartbeatPublisher
from orchestrator.core.protocol.leases import acquire
from orchestrator.core.records import Heartbeat, read_jobs, update_jobs
from orchestrator.core.spec_load import load_spec
from orchestrator.core.store import open_store
from orchestrator.fleet import launch
from orchestrator.fleet.launch import cancel_workers, launch_workers
from orchestrator.fleet.reconcile import Reconciler, watch
from orchestrator.runview.status import current_status
from tests.support.fake_sky import ScriptedSky
from tests.support.runs import Answer, answer_chunk, chat_request, make_run
from tests.support.s3servers import make_store_uri


@pytest.fixture(autouse=True)
def sky_home(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path_factory.mktemp("home")))
    monkeypatch.setenv("SKYPILOT_DISABLE_USAGE_COLLECTION", "1")
    monkeypatch.setenv("HF_TOKEN", "hf-secret-value")


@pytest.fixture
def make_ctx(request, tmp_path):
    """A run in a real S3 store (moto): what SkyPilot workers need, a store the cloud can reach."""
    uri = make_store_uri("moto", request, tmp_path)

    def make(chunks=2, **flags):
        store = open_store(uri)
        make_run(
            store,
            "sky",
            [[chat_request(f"c{c}-{i}", "q") for i in range(2)] for c in range(chunks)],
            model="m",
            workers=chunks,
        )
        spec = load_spec(
            None,
            {"run": "sky", "store": uri, "backend": "skypilot", "workers.retries": 2, **flags},
            env={},
            default_file=False,
        )
        return RunContext(spec, store, RunLayout("sky"))

    return make


def job_ids(ctx, workers):
    """Each worker's current job id: launches run side by side, so which got job 1 is theirs to decide."""
    jobs = read_jobs(ctx.store, ctx.layout)[0].current_jobs()
    return [jobs[w].job_id for w in range(workers)]


def finish(ctx, chunk):
    index = int(chunk.rsplit("_", 1)[1])
    answer_chunk(ctx.store, ctx.layout, chunk, [[Answer(i, f"c{index}-{i}", "a") for i in range(2)]])


def test_launch_submits_all_workers_concurrently_with_secrets_in_memory(make_ctx):
    ctx = make_ctx(chunks=16)
    sky = ScriptedSky(latency=0.3)
    import sky as _warm_up  # noqa: F401  (importing SkyPilot takes seconds, once per process)

    launched = launch_workers(ctx, SkyPilotLauncher(ctx.spec, sdk=sky), range(16))
    # Concurrency seen by the scripted server itself (submissions in flight at once), not by a
    # wall-clock bound that a loaded machine breaks: one after another never overlaps.
    assert sorted(launched) == list(range(16)) and sky.max_concurrent > 8
    task = sky.launched[0][1]
    assert task.secrets["HF_TOKEN"].get_secret_value() == "hf-secret-value"
    assert {"ORCH_RUN", "ORCH_STORE", "ORCH_WORKER", "ORCH_WORKER_LIST"} <= set(task.envs)
    assert b"hf-secret-value" not in ctx.store.get(ctx.layout.jobs).data
    record, _ = read_jobs(ctx.store, ctx.layout)
    assert {w: a.job_id for w, a in record.current_jobs().items()} == launched


class ProgressSayingSky(ScriptedSky):
    """Says its progress while it launches as SkyPilot's SDK does: a `print`, and a line through
    SkyPilot's own logging ("Uploading files to API server"), whose handler holds the stdout of
    the moment SkyPilot set it up."""

    def launch(self, task, name):
        from sky import sky_logging

        print(f"Printed while launching {name}")
        sky_logging.init_logger("sky.client.common").info(f"Uploading files to API server for {name}")
        return super().launch(task, name)


def test_launch_keeps_skypilots_progress_off_stdout(make_ctx, capsys):
    """stdout is orch's answer to a program (`orch estimate --probe --json` launches its probe):
    SkyPilot's progress lines go to stderr, its logging's as well as its prints (the Slurm probe's
    JSON once began with "Uploading files to API server")."""
    from sky import sky_logging

    sky_logging.reload_logger()  # its handler made now, on the stdout this test captures
    ctx = make_ctx(chunks=2)
    launched = launch_workers(ctx, SkyPilotLauncher(ctx.spec, sdk=ProgressSayingSky()), [0, 1])
    said = capsys.readouterr()
    assert sorted(launched) == [0, 1] and said.out == "", said.out
    assert "Uploading files to API server for orch-sky-w0" in said.err, said.err
    assert "Printed while launching orch-sky-w1" in said.err, said.err
    sky_logging.init_logger("sky.client.common").info("after the launch")
    assert "after the launch" in capsys.readouterr().out  # SkyPilot's handler is given back as it was
    with capsys.disabled():
        sky_logging.reload_logger()  # on the stdout of the session again, for the tests after this one


def test_progress_to_stderr_overlapping_in_threads_gives_stdout_back():
    """Status calls overlap (the web page reads runs in threads): the last to leave puts stdout back."""
    import sys
    import threading

    from orchestrator.backends.skypilot import progress_to_stderr

    before, second_in, first_out = sys.stdout, threading.Event(), threading.Event()

    def second() -> None:
        with progress_to_stderr():
            second_in.set()
            first_out.wait(30)

    with progress_to_stderr():
        thread = threading.Thread(target=second)
        thread.start()
        assert second_in.wait(30)
    first_out.set()
    thread.join(30)
    assert sys.stdout is before


def test_launch_reports_workers_without_capacity_and_keeps_the_others(make_ctx):
    ctx = make_ctx(chunks=3)
    sky = ScriptedSky(fail_workers=["1"])
    with pytest.raises(LaunchFailed) as failed:
        launch_workers(ctx, SkyPilotLauncher(ctx.spec, sdk=sky), [0, 1, 2])
    assert sorted(failed.value.launched) == [0, 2]
    assert "no capacity for any of L4, L40S, A10G, A100, A100-80GB (spot or on-demand)" in failed.value.failures[1]
    assert "widen --gpus" in failed.value.hint
    # The launched ones are recorded; the one that was not, as FAILED with why (watch relaunches it).
    jobs = read_jobs(ctx.store, ctx.layout)[0].current_jobs()
    assert sorted(w for w, a in jobs.items() if a.ended_state is None) == [0, 2]
    assert jobs[1].ended_state == "FAILED" and "no capacity" in (jobs[1].failure_reason or "")


def test_launch_a_task_skypilots_loader_refuses_ends_its_reservations_at_once(make_ctx):
    """A template SkyPilot's own loader rejects: nothing is submitted, the reserved attempts are
    recorded FAILED with the loader's message (not left pending for 15 minutes), and a corrected
    launch goes ahead at once instead of saying "already running"."""
    from orchestrator.backends.skypilot_render import load_template

    ctx = make_ctx(chunks=2)
    sky = ScriptedSky()
    bad = {**load_template(), "resourcez": {"cpus": 4}}  # a misspelled key
    with pytest.raises(BackendError, match="resourcez"):
        launch_workers(ctx, SkyPilotLauncher(ctx.spec, sdk=sky, template=bad), [0, 1])
    assert sky.launched == []
    jobs = read_jobs(ctx.store, ctx.layout)[0].current_jobs()
    assert sorted(jobs) == [0, 1]
    assert all(a.ended_state == "FAILED" for a in jobs.values()), jobs
    assert all("resourcez" in (a.failure_reason or "") for a in jobs.values())
    launched = launch_workers(ctx, SkyPilotLauncher(ctx.spec, sdk=sky), [0, 1])
    assert sorted(launched) == [0, 1] and len(sky.launched) == 2


def test_statuses_map_skypilot_records(make_ctx):
    ctx = make_ctx()
    sky = ScriptedSky()
    sky.script_job(
        7,
        [
            {
                "status": "RECOVERING",
                "recovery_count": 2,
                "cloud": "GCP",
                "region": "us-east4",
                "cluster_resources": "1x GCP([Spot]g2-standard-4, {'L4': 1})",
                "accelerators": {"L4": 1},
            }
        ],
    )
    status = SkyPilotLauncher(ctx.spec, sdk=sky).statuses(["7", "8"])
    assert (status["7"].state, status["7"].recovery_count, status["7"].accelerator, status["7"].spot) == (
        JobState.RECOVERING,
        2,
        "L4",
        True,
    )
    assert status["8"].state is JobState.UNKNOWN  # not in SkyPilot's queue
    # What SkyPilot reports for a job that never got a machine: placeholders and a coloured hint.
    sky.script_job(
        9,
        [
            {
                "status": "FAILED_PRECHECKS",
                "cloud": "-",
                "region": "-",
                "cluster_resources": "-",
                "failure_reason": "[NoCloudAccessError] Cloud access is not set up. Run: \x1b[1msky check\x1b[0m",
            }
        ],
    )
    failed = SkyPilotLauncher(ctx.spec, sdk=sky).statuses(["9"])["9"]
    assert (failed.state, failed.cloud, failed.region, failed.spot) == (JobState.FAILED_PRECHECKS, None, None, None)
    assert failed.failure_reason == "[NoCloudAccessError] Cloud access is not set up. Run: sky check"
    sky.down = True
    with pytest.raises(BackendError, match="cannot get job states"):
        SkyPilotLauncher(ctx.spec, sdk=sky).statuses(["7"])


def ticks(reconciler, n):
    return [reconciler.tick() for _ in range(n)]


def test_loop_leaves_skypilots_own_recovery_alone(make_ctx):
    ctx = make_ctx(chunks=1)
    sky = ScriptedSky(script=["STARTING", "RUNNING", "RECOVERING", "RUNNING", "RUNNING"])
    launch_workers(ctx, SkyPilotLauncher(ctx.spec, sdk=sky), [0])
    loop = Reconciler(ctx, SkyPilotLauncher(ctx.spec, sdk=sky))
    reports = ticks(loop, 4)
    assert [r.statuses["1"].state.value for r in reports] == ["STARTING", "RUNNING", "RECOVERING", "RUNNING"]
    assert not any(r.relaunched for r in reports) and len(sky.launched) == 1
    finish(ctx, "part_00000")
    sky.script_job(1, ["SUCCEEDED"])
    assert loop.tick().complete


def test_watch_asks_less_often_while_nothing_changes_and_least_when_skypilot_cannot_answer(make_ctx):
    """`orch watch --interval 2`: 2 s after a change, then 3, 4.5, ... up to 12 s (6x) while the jobs'
    states stay; back to 2 s when one changes; a backend that cannot be asked is asked less, not more."""
    ctx = make_ctx(chunks=1)
    sky = ScriptedSky(script=["STARTING"] * 6 + ["RUNNING"] * 3)
    launch_workers(ctx, SkyPilotLauncher(ctx.spec, sdk=sky), [0])
    waits: list[float] = []
    loop = Reconciler(ctx, SkyPilotLauncher(ctx.spec, sdk=sky))
    watch(loop, interval=2, sleep=waits.append, max_ticks=10)
    assert waits == [2, 3, 4.5, 6.75, 10.125, 12, 2, 3, 4.5]
    sky.down = True
    waits.clear()
    report = watch(loop, interval=2, sleep=waits.append, max_ticks=4)
    assert report.unreachable and waits == [3, 4.5, 6.75]


def test_loop_relaunches_after_no_resource_and_failures_until_the_budget_is_spent(make_ctx):
    ctx = make_ctx(chunks=1)
    sky = ScriptedSky(script=["FAILED_NO_RESOURCE"])
    launch_workers(ctx, SkyPilotLauncher(ctx.spec, sdk=sky), [0])
    events = []
    loop = Reconciler(ctx, SkyPilotLauncher(ctx.spec, sdk=sky), on_event=events.append)
    first = loop.tick()
    assert first.relaunched == {0: "relaunch after FAILED_NO_RESOURCE"}
    sky.script_job(2, ["FAILED"])  # the second attempt fails with its chunk unfinished
    assert loop.tick().relaunched == {0: "relaunch after FAILED"}
    report = watch(loop, interval=0, max_ticks=5)
    assert report.stuck and "2 relaunches spent" in report.exhausted[0]
    assert len(sky.launched) == 3
    assert any("ended FAILED_NO_RESOURCE" in e for e in events)


def test_loop_relaunches_jobs_cancelled_by_someone_else_but_not_by_orch_cancel(make_ctx):
    ctx = make_ctx(chunks=1)
    sky = ScriptedSky(script=["CANCELLED"])
    launch_workers(ctx, SkyPilotLauncher(ctx.spec, sdk=sky), [0])
    loop = Reconciler(ctx, SkyPilotLauncher(ctx.spec, sdk=sky))
    assert loop.tick().relaunched == {0: "relaunch after CANCELLED (not by orch cancel)"}
    update_jobs(ctx.store, ctx.layout, lambda rec: setattr(rec, "cancelled", True))
    sky.script_job(2, ["CANCELLED"])
    report = loop.tick()
    assert report.cancelled and not report.relaunched


def test_loop_relaunches_a_succeeded_worker_only_for_chunks_nobody_holds(make_ctx):
    ctx = make_ctx(chunks=2)
    sky = ScriptedSky(script=["SUCCEEDED"])
    launch_workers(ctx, SkyPilotLauncher(ctx.spec, sdk=sky), [0, 1])
    finish(ctx, "part_00000")
    # part_00001 is held by a live lease of a worker that is still running somewhere.
    acquire(ctx.store, ctx.layout, "part_00001", worker="9", holder="9.live", ttl=600, now=time.time())
    loop = Reconciler(ctx, SkyPilotLauncher(ctx.spec, sdk=sky))
    report = loop.tick()
    assert not report.relaunched and report.pending_leases == 1 and not report.stuck
    # The lease expires (its holder died): now the chunk is nobody's, and one worker comes back.
    ctx.store.delete(ctx.layout.lease("part_00001"))
    report = loop.tick()
    assert len(report.relaunched) == 1


def test_loop_does_nothing_while_skypilot_cannot_be_asked(make_ctx):
    ctx = make_ctx(chunks=1)
    sky = ScriptedSky(script=["FAILED"])
    launch_workers(ctx, SkyPilotLauncher(ctx.spec, sdk=sky), [0])
    sky.down = True
    report = Reconciler(ctx, SkyPilotLauncher(ctx.spec, sdk=sky)).tick()
    assert report.unreachable and not report.relaunched and not report.stuck
    assert len(sky.launched) == 1


def test_launch_request_names_and_envs_per_worker(make_ctx):
    ctx = make_ctx(chunks=2)
    sky = ScriptedSky()
    launch_workers(ctx, SkyPilotLauncher(ctx.spec, sdk=sky), [1])
    _, task, name = sky.launched[0]
    assert name == "orch-sky-w1" and task.envs["ORCH_WORKER_LIST"] == "workers/1.txt"
    assert task.envs["ORCH_STORE"] == ctx.spec.store  # the URI the cloud machines open, endpoint included


def test_cancel_and_status_see_an_orphaned_record_and_do_not_wait_on_it(make_ctx, monkeypatch):
    """SkyPilot's API server restarted under a managed job: its record stays RUNNING for good and
    `sky jobs cancel` does not clear it. RUNNING for an hour with a worker that stopped beating
    55 minutes ago is said to be orphaned and left out of the cancel; a live worker is cancelled."""
    ctx = make_ctx(chunks=2)
    sky = ScriptedSky()
    launcher = SkyPilotLauncher(ctx.spec, sdk=sky)
    launch_workers(ctx, launcher, [0, 1])
    j0, j1 = job_ids(ctx, 2)
    # Half a minute past each whole minute: the status reads the store's clock, which may stand a
    # moment behind time.time() or pass it while the test runs, and durations print in whole minutes.
    now = time.time()
    sky.script_job(int(j0), [{"status": "RUNNING", "start_at": now - 3630, "last_recovered_at": -1}])
    sky.script_job(int(j1), [{"status": "RUNNING", "start_at": now - 3630, "last_recovered_at": now - 1230}])
    for worker, beat in ((0, now - 3330), (1, now)):
        HeartbeatPublisher(
            ctx.store,
            ctx.layout,
            Heartbeat(worker=str(worker), holder=f"{worker}.a", state="running", started_at=beat, updated_at=beat),
        ).publish()
    w0, w1 = current_status(ctx, launcher=launcher).workers
    assert (
        w0.failure_reason
        and f"job {j0}'s record is orphaned: RUNNING for 60m, no heartbeat for 55m" in w0.failure_reason
    )
    assert w1.failure_reason is None  # RUNNING again since its recovery, and beating
    monkeypatch.setattr(launch, "backend_for", lambda _ctx, _name=None: launcher)
    cancelled = cancel_workers(ctx)
    assert (cancelled.live, cancelled.orphaned, sky.cancelled) == ([j1], [j0], [int(j1)])


def test_a_job_still_in_its_set_up_or_beating_is_not_orphaned():
    now = 10_000.0
    running = JobStatus("1", JobState.RUNNING, started_at=now - 3600, running_since=now - 60)
    assert not orphaned(running, None, now=now)  # recovered a minute ago: its set-up may still run
    long_running = JobStatus("1", JobState.RUNNING, started_at=now - 3600)
    assert not orphaned(long_running, now - 30, now=now)
    assert orphaned(long_running, now - 1000, now=now) and orphaned(long_running, None, now=now)
    assert not orphaned(JobStatus("1", JobState.RECOVERING, started_at=now - 3600), None, now=now)


def test_loop_relaunches_a_worker_whose_record_is_orphaned_and_not_one_that_beats(make_ctx):
    """An orphaned RUNNING record would keep `orch watch` waiting for good: it reads as gone."""
    ctx = make_ctx(chunks=2)
    sky = ScriptedSky()
    launch_workers(ctx, SkyPilotLauncher(ctx.spec, sdk=sky), [0, 1])
    now = time.time()
    for job_id in (1, 2):
        sky.script_job(job_id, [{"status": "RUNNING", "start_at": now - 3600, "last_recovered_at": -1}])
    HeartbeatPublisher(
        ctx.store, ctx.layout, Heartbeat(worker="1", holder="1.a", state="running", started_at=now, updated_at=now)
    ).publish()
    job_of_0, _ = job_ids(ctx, 2)
    report = Reconciler(ctx, SkyPilotLauncher(ctx.spec, sdk=sky)).tick()
    assert report.relaunched == {0: "relaunch after UNKNOWN"}
    assert "orphaned record" in str(report.statuses[job_of_0].failure_reason) and report.live == 1
