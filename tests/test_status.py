"""`orch status`: one view of a run from listings, its JSON shape, and what it costs in requests."""

from __future__ import annotations

import json
import time

import pytest

from orchestrator.backends.base import JobState, JobStatus
from orchestrator.cli import main
from orchestrator.commands.console import to_text
from orchestrator.commands.views import status_view
from orchestrator.core.protocol.checkpoints import ChunkJob
from orchestrator.core.protocol.heartbeats import HeartbeatPublisher
from orchestrator.core.protocol.leases import LeaseKeeper, acquire
from orchestrator.core.protocol.parts import part_codec
from orchestrator.core.records import Heartbeat, JobAttempt
from orchestrator.core.store import open_store
from orchestrator.planning.pricing import load_gpu_table
from orchestrator.runview.states import RunState, WorkerActivity
from orchestrator.runview.status import derive_status, gather
from tests.support.run_states import run_under_way, two_hours_on_an_a100
from tests.support.runs import Answer, answer_chunk, chat_request, make_run


class Backend:
    """A backend that knows two jobs (what the SkyPilot SDK would say)."""

    name = "skypilot"

    def statuses(self, _job_ids):
        return {
            "11": JobStatus("11", JobState.RECOVERING, recovery_count=2, cloud="gcp", region="us-central1", spot=True),
            "12": JobStatus("12", JobState.RUNNING, spot=False),
        }


def test_status_from_listings_counts_chunks_rows_errors_and_costs(tmp_path):
    store, layout = run_under_way(str(tmp_path / "store"))
    # Worker 0 checkpointed one row of its chunk (its heartbeat: 1 saved, 3 more in memory).
    held = acquire(store, layout, "part_00002", worker="0", holder="0.old", ttl=600, now=time.time() - 1200)
    keeper = LeaseKeeper(store, layout, held, ttl=600, clock=lambda: time.time() - 1200)
    job = ChunkJob(store, layout, keeper, part_codec("jsonl", "part_00002"), time.time, chunk_rows=10)
    job.checkpoint([Answer(0, "c2-0", "x")])
    facts = gather(store, layout, Backend())
    status = derive_status(facts, now=time.time(), prices=load_gpu_table())
    assert status.chunks.model_dump() == {"total": 4, "done": 1}
    assert status.rows.model_dump() == {
        "total": 40,
        "done": 11,
        "finished": 10,
        "checkpointed": 1,
        "in_progress": 3,
        "errors": 1,
        "set_aside": 0,
        "reused": 0,
    }
    assert status.throughput.rows_per_s == 0.5 and status.eta_s == (40 - 10 - 4) / 0.5
    w0 = status.workers[0]
    assert (w0.worker, w0.state, w0.recovery_count, w0.chunk, w0.spot) == ("0", "RECOVERING", 2, "part_00001", True)
    assert w0.accelerator == "NVIDIA A100-SXM4-80GB" and w0.cloud == "gcp"
    assert status.workers[1].chunks_finished == 1
    # Two hours of an A100-80GB on GCP spot.
    assert abs(status.cost.so_far_usd - 2 * load_gpu_table().price("A100-80GB", True, "gcp")) < 0.05
    # The backend recovers worker 0 while it beats: a spurious recovery (its check failed, not its machine).
    assert w0.recovery == "spurious"
    assert "RECOVERING (recovered 2x, spurious)" in to_text(status_view(status))
    assert "worker 0: spurious recovery: the worker beats on while its job recovers" in to_text(status_view(status))
    # The finished chunk: 10 rows in an hour (answer_chunk's clock), 2 tokens each.
    assert status.overall is not None
    assert status.overall.model_dump() == {"wall_s": 3600.0, "rows_per_s": round(10 / 3600, 3), "tokens_per_s": 0.0}
    assert "throughput 0.50 rows/s" in to_text(status_view(status))


def test_a_machine_of_several_gpus_is_paid_for_each_and_its_replicas_share_them(tmp_path):
    """Worker 0 on a machine of 2 A100-80GBs (`resources.gpus_per_worker: 2`, frozen into the run)
    for two hours costs two GPUs' four hours; worker 1's machine runs one engine per GPU (replicas
    1r0 and 1r1, each its own heartbeat): each replica pays for one GPU, not for the machine."""
    store = open_store(str(tmp_path / "store"))
    chunks = [[chat_request(f"c{c}-{i}", "q") for i in range(4)] for c in range(4)]
    layout = make_run(store, "g", chunks, model="m", workers=2, spec_flags={"resources.gpus_per_worker": 2})
    now = time.time()
    for worker in ("0", "1r0", "1r1"):
        HeartbeatPublisher(store, layout, two_hours_on_an_a100(worker, now)).publish(updated_at=now)
    status = derive_status(gather(store, layout, None), now=now, prices=load_gpu_table())
    gpu_hour = load_gpu_table().price("A100-80GB", True, "gcp")
    by_worker = {w.worker: w.uptime_s for w in status.workers}
    assert by_worker == {
        "0": pytest.approx(7200, abs=5),
        "1": 0.0,
        "1r0": pytest.approx(7200, abs=5),
        "1r1": pytest.approx(7200, abs=5),
    }
    # Worker 0: 2 h x 2 GPUs; worker 1's replicas: 2 h x 1 GPU each.
    assert status.cost.so_far_usd == pytest.approx(8 * gpu_hour, abs=0.05)


def test_status_of_a_complete_run_shows_the_runs_own_pace(tmp_path):
    store, layout = run_under_way(str(tmp_path / "store"))
    for c in (1, 2, 3):
        answer_chunk(store, layout, f"part_0000{c}", [[Answer(i, f"c{c}-{i}", "x") for i in range(10)]], seconds=100)
    status = derive_status(gather(store, layout, None), now=time.time(), prices=load_gpu_table())
    assert (
        status.complete
        and status.overall
        and status.overall.wall_s == 3600.0
        and status.overall.rows_per_s == round(40 / 3600, 3)
    )
    assert "finished in 60m: 0.01 rows/s, 0 tok/s over the run" in to_text(status_view(status))


def test_status_counts_cached_tokens_and_the_realised_price_per_million_spot_and_on_demand(tmp_path):
    store, layout = run_under_way(str(tmp_path / "store"))
    # Worker 0 (two hours of an A100-80GB on GCP spot) finishes a chunk whose prompts were partly cached;
    # worker 1 (on demand, says the backend; no heartbeat, so no machine time) finished part_00000.
    answer_chunk(store, layout, "part_00002", [[Answer(i, f"c2-{i}", "x", cached=2) for i in range(10)]], worker="0")
    status = derive_status(gather(store, layout, Backend()), now=time.time(), prices=load_gpu_table())
    assert status.tokens.model_dump() == {"prompt_tokens": 60, "cached_tokens": 20, "generated_tokens": 40}
    usd = 2 * load_gpu_table().price("A100-80GB", True, "gcp")
    spot, on_demand, every = (getattr(status.cost_per_m_tokens, k) for k in ("spot", "on_demand", "all"))
    assert (spot.prompt_tokens, spot.cached_tokens, spot.generated_tokens) == (30, 20, 20)
    assert spot.usd == pytest.approx(usd, abs=0.01)
    assert spot.usd_per_m_tokens == pytest.approx(usd / 50 * 1e6, rel=1e-3)
    assert spot.usd_per_m_generated == pytest.approx(usd / 20 * 1e6, rel=1e-3)
    assert on_demand.usd == 0.0 and on_demand.usd_per_m_tokens == 0.0 and on_demand.prompt_tokens == 30
    assert every.usd_per_m_tokens == pytest.approx(usd / 100 * 1e6, rel=1e-3)
    assert status.cost.spot_usd == pytest.approx(usd, abs=0.01) and status.cost.on_demand_usd == 0.0
    text = to_text(status_view(status))
    assert "tokens 60 prompt (20 cached, 33%) + 40 generated" in text
    assert f"spot ${spot.usd_per_m_tokens:,.4f}/M tokens" in text


def test_status_json_shape_is_stable(tmp_path, capsys):
    run_under_way(str(tmp_path / "store"))
    assert main(["status", "--run", "s", "--store", str(tmp_path / "store"), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert set(doc) >= {"chunks", "rows", "workers", "throughput", "eta_s", "cost", "complete", "overall"}
    assert set(doc["tokens"]) == {"prompt_tokens", "cached_tokens", "generated_tokens"}
    assert set(doc["cost_per_m_tokens"]) == {"all", "spot", "on_demand"}
    assert set(doc["cost_per_m_tokens"]["spot"]) >= {"usd", "usd_per_m_tokens", "usd_per_m_generated"}
    assert set(doc["chunks"]) == {"total", "done"} and set(doc["rows"]) >= {"total", "done", "errors"}
    assert {"worker", "state", "accelerator", "chunk", "heartbeat_age_s", "tokens_per_s"} <= set(doc["workers"][0])


def test_status_reads_markers_with_list_calls_not_one_request_per_chunk(store_uri):
    store, layout = run_under_way(store_uri)
    for c in (2, 3):
        answer_chunk(store, layout, f"part_0000{c}", [[Answer(i, f"c{c}-{i}", "x") for i in range(10)]])
    store.requests.reset()
    status = derive_status(gather(store, layout, None), now=time.time(), prices=load_gpu_table())
    assert status.chunks.done == 3
    # manifest, plan, jobs, prepare record, forecast; and the spec (its workers ran on priced GPUs:
    # how many a machine has)
    assert store.requests.by_op.get("get", 0) == 6
    # done/, stats/, heartbeats/, leases/, decisions/, and outputs/ (checkpointed rows of unfinished chunks)
    assert store.requests.by_op.get("list", 0) == 6


def test_status_survives_a_backend_that_cannot_be_asked(tmp_path):
    store, layout = run_under_way(str(tmp_path / "store"))

    class Down:
        name = "skypilot"

        def statuses(self, _job_ids):
            raise ConnectionError("API server not reachable")

    status = derive_status(gather(store, layout, Down()), now=time.time(), prices=load_gpu_table())
    assert "API server not reachable" in status.backend_note
    assert status.workers[0].state == "UNKNOWN"


def test_status_says_what_each_worker_does_and_how_long_it_has_loaded(tmp_path, capsys):
    """A worker loading its model for 2m10s reads `loading 2m10s`, not just RUNNING and 0 rows/s;
    a job still queued reads `queued`, and every word is one status (and the page) can explain."""
    store, layout = run_under_way(str(tmp_path / "store"))
    now = time.time()
    HeartbeatPublisher(
        store, layout, Heartbeat(worker="1", holder="1.new", state="loading", started_at=now - 130, updated_at=now)
    ).publish()
    status = derive_status(gather(store, layout, Backend()), now=now, prices=load_gpu_table())
    (w0, w1) = status.workers
    assert (w0.activity, w0.activity_s) == ("working", None)
    assert (w1.activity, w1.activity_s) == ("loading", 130.0)
    shown = to_text(status_view(status))
    assert "workers: 1 working, 1 loading (2m10s)" in shown and "loading 2m10s" in shown
    # Silent past two intervals, still within the liveness window: said, with for how long.
    later = derive_status(gather(store, layout, Backend()), now=now + 45, prices=load_gpu_table())
    assert [w.activity for w in later.workers] == ["silent", "silent"]
    assert all(45 <= w.activity_s < 50 for w in later.workers)  # run_under_way() beat a moment before `now`
    assert {w.activity for w in status.workers} <= set(WorkerActivity)
    assert main(["status", "--run", "s", "--store", str(tmp_path / "store"), "--json"]) == 0
    assert [w["activity"] for w in json.loads(capsys.readouterr().out)["workers"]][1] in ("loading", "silent")


def test_every_job_state_and_heartbeat_reads_as_a_word_status_can_explain():
    """Whatever a worker's job and heartbeat say, its activity is one of WorkerActivity's words."""
    from orchestrator.core.records import HeartbeatSummary
    from orchestrator.runview.activity import run_state, worker_activity

    now = time.time()
    beats = [None] + [
        HeartbeatSummary(holder="h", state=s, chunk=chunk, started_at=now - 100, updated_at=now - age)
        for s in ("starting", "loading", "running", "idle", "stopping", "exited")
        for age in (1, 30, 3600)
        for chunk in (None, "part_00001")
    ]
    attempt = JobAttempt(job_id="1", backend="local", launched_at=now)
    seen = set()
    for state in [None, *JobState]:
        status = JobStatus("1", state) if state is not None else None
        for hb in beats:
            live = hb if hb is not None and hb.state != "exited" and now - hb.updated_at < 60 else None
            for cancelled in (False, True):
                word, _ = worker_activity(hb, live, status, attempt, now=now, interval=10, cancelled=cancelled)
                seen.add(word)
    assert all(isinstance(word, WorkerActivity) for word in seen)
    assert {"queued", "provisioning", "recovering", "loading", "working", "draining", "silent", "failed"} <= seen
    loading, failed = [WorkerActivity.LOADING], [WorkerActivity.FAILED]
    assert run_state(complete=False, damaged=False, cancelled=False, activities=loading, launched=True) == "running"
    assert (
        run_state(complete=False, damaged=False, cancelled=False, activities=failed, launched=True) is RunState.STOPPED
    )


def test_status_trusts_a_job_that_ended_over_a_fresh_heartbeat_and_shows_final_states(tmp_path):
    """A worker whose job the backend says failed is not `working` however fresh its last beat; one
    whose heartbeat said it exited 0 reads SUCCEEDED while its process winds down; under a complete
    run no job reads RUNNING."""
    store, layout = run_under_way(str(tmp_path / "store"))
    now = time.time()

    class Ended:
        name = "local"

        def statuses(self, _job_ids):
            return {
                "11": JobStatus("11", JobState.FAILED),
                "12": JobStatus("12", JobState.RUNNING, started_at=now - 60),
            }

    HeartbeatPublisher(
        store, layout, Heartbeat(worker="1", holder="1.done", state="running", started_at=now - 50, updated_at=now)
    ).publish(state="exited", exit_code=0, updated_at=now)
    w0, w1 = derive_status(gather(store, layout, Ended()), now=now, prices=load_gpu_table()).workers
    assert (w0.state, w0.activity, w0.chunk, w0.tokens_per_s) == ("FAILED", "failed", None, 0.0)
    assert (w1.state, w1.activity) == ("SUCCEEDED", "finished")
    for c in (1, 2, 3):
        answer_chunk(store, layout, f"part_0000{c}", [[Answer(i, f"c{c}-{i}", "x") for i in range(10)]])

    class Running:
        name = "local"

        def statuses(self, _job_ids):
            return {j: JobStatus(j, JobState.RUNNING, started_at=now - 60) for j in ("11", "12")}

    HeartbeatPublisher(
        store, layout, Heartbeat(worker="1", holder="1.late", state="running", started_at=now - 50, updated_at=now)
    ).publish()
    status = derive_status(gather(store, layout, Running()), now=now, prices=load_gpu_table())
    assert status.complete and [w.state for w in status.workers] == ["WINDING_DOWN", "WINDING_DOWN"]


def test_run_time_leaves_out_the_time_the_run_sat_cancelled():
    from orchestrator.core.records import JobsRecord
    from orchestrator.runview.pace import run_time_s

    jobs = JobsRecord()
    jobs.worker(0).attempts.append(JobAttempt(job_id="1", backend="local", launched_at=1000.0))
    jobs.pauses.append((1100.0, 1400.0))  # cancelled for 300 s, then resumed
    assert run_time_s(jobs, now=1500.0, finished_at=None) == 200.0
    assert run_time_s(jobs, now=9999.0, finished_at=1450.0) == 150.0
    jobs.cancelled_at = 1480.0  # cancelled again, not resumed: the clock stops there
    assert run_time_s(jobs, now=2000.0, finished_at=None) == 180.0


# -- the typed read model: its documented shape, its words and moves, its narrow reads -------------
def test_status_json_docs_are_the_table_the_types_generate():
    """docs/operations.md's table of `orch status --json` is generated from the read model's types:
    a field added, renamed or described anew without regenerating it fails here."""
    from pathlib import Path

    from orchestrator.runview.schema_doc import markdown, section_of

    docs = (Path(__file__).resolve().parents[1] / "docs" / "operations.md").read_text()
    assert section_of(docs) == markdown(), "run: python -m orchestrator.runview.schema_doc --write docs/operations.md"
    assert "| `workers[].activity` |" in markdown() and "| `between chunks` |" in markdown()


def test_status_json_holds_exactly_the_documented_fields(tmp_path, capsys):
    """What `orch status --json` prints parses back into the documented types, no field beyond them
    (every section forbids unknown keys), and gives the same JSON again."""
    from orchestrator.runview.sections import RunStatus
    from orchestrator.runview.status import to_json

    store, layout = run_under_way(str(tmp_path / "store"))
    answer_chunk(store, layout, "part_00002", [[Answer(i, f"c2-{i}", "x", cached=1) for i in range(10)]], worker="0")
    assert main(["status", "--run", "s", "--store", str(tmp_path / "store"), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert to_json(RunStatus.model_validate(doc)) == doc
    assert doc["state"] == "running" and doc["workers"][0]["activity"] == "working"
    assert doc["model"] == "m" and doc["backend"] == "skypilot"  # the frozen model; the backend of its launches
    assert set(doc["rows"]) == {
        "total",
        "done",
        "in_progress",
        "finished",
        "checkpointed",
        "errors",
        "set_aside",
        "reused",
    }


def test_status_words_each_have_a_meaning_and_a_colour_and_every_move_is_reachable():
    """Every run state and worker activity means something in words and has a colour; the table of
    moves leads from a run's start to each of them, and back to running from every terminal state."""
    from orchestrator.runview.states import (
        ACTIVITY_COLOURS,
        MOVES,
        RUN_STATE_COLOURS,
        RUN_TERMINAL,
        Recovery,
        reachable,
    )

    for words, colours, start in (
        (RunState, RUN_STATE_COLOURS, RunState.PREPARED),
        (WorkerActivity, ACTIVITY_COLOURS, WorkerActivity.NOT_LAUNCHED),
    ):
        for word in words:
            assert word.meaning and word in colours, word
            assert reachable(start, word), f"no move leads from {start} to {word}"
    assert all(reachable(state, RunState.RUNNING) for state in RUN_TERMINAL)
    assert all(why for why in MOVES.values()) and all(r.meaning for r in Recovery)
    assert not reachable(RunState.COMPLETE, RunState.PREPARED)  # a run once launched is never unlaunched
    assert f"{RunState.RUNNING}" == "running" and str(WorkerActivity.BETWEEN_CHUNKS) == "between chunks"


def test_recovery_is_spurious_while_the_worker_beats_and_lost_when_it_stopped_without_draining():
    from orchestrator.core.records import HeartbeatSummary
    from orchestrator.runview.activity import recovery_of
    from orchestrator.runview.states import Recovery

    now = 10_000.0

    def beat(state: str, age: float, started: float = now - 3600) -> HeartbeatSummary:
        return HeartbeatSummary(holder="h", state=state, started_at=started, updated_at=now - age)

    recovering = JobStatus("7", JobState.RECOVERING, recovery_count=0, running_since=now - 3600)
    # The backend recovers a worker that beat 5 s ago: its check failed, not the machine.
    assert recovery_of(recovering, beat("running", 5), now=now, interval=10) is Recovery.SPURIOUS
    # It stopped beating 3 minutes ago, mid-chunk, and never drained: the machine went away.
    assert recovery_of(recovering, beat("running", 180), now=now, interval=10) is Recovery.LOST
    # It drained first (a preemption notice, or the recovery's own teardown): no evidence either way.
    assert recovery_of(recovering, beat("stopping", 180), now=now, interval=10) is None
    # Recovered (RUNNING again since 60 s ago), and the process beating now started before that: it
    # outlived the recovery. A process started after it is the new machine's: no verdict.
    recovered = JobStatus("7", JobState.RUNNING, recovery_count=1, running_since=now - 60)
    assert recovery_of(recovered, beat("running", 3), now=now, interval=10) is Recovery.SPURIOUS
    assert recovery_of(recovered, beat("running", 3, started=now - 30), now=now, interval=10) is None
    assert recovery_of(JobStatus("7", JobState.RUNNING), beat("running", 3), now=now, interval=10) is None


def test_narrow_reads_give_the_numbers_the_status_gives(tmp_path):
    """collect's cost, serve's batch counts and collect's pace read less than the whole status, and
    give its numbers: one derivation each. A stats entry without a done marker counts for none."""
    from orchestrator.runview.status import answered_so_far, cost_so_far, pace_so_far

    store, layout = run_under_way(str(tmp_path / "store"))
    answer_chunk(store, layout, "part_00002", [[Answer(i, f"c2-{i}", "x", cached=2) for i in range(10)]], worker="0")
    # A stray stats entry for a chunk without a marker (stats are a cache of the markers).
    store.put(layout.stats("part_00003", ["9", "9", "90", "90", "1.0", "1", "x", "0"], 5_000.0), b"")
    now = time.time()
    status = derive_status(gather(store, layout, None), now=now, prices=load_gpu_table())
    store.requests.reset()
    cost, bought = cost_so_far(store, layout, prices=load_gpu_table(), now=now)
    assert (cost, bought) == (status.cost, status.cost_per_m_tokens) and cost.so_far_usd > 0
    # done/, stats/ and heartbeats/ listed; the manifest, prepare record, plan, jobs and spec read: no
    # leases, decisions, outputs or markers (the whole status reads those too)
    assert (store.requests.by_op.get("list", 0), store.requests.by_op.get("get", 0)) == (3, 5)
    answered = answered_so_far(store, layout)
    assert (answered.rows, answered.errors) == (status.rows.finished, status.rows.errors) == (20, 1)
    assert answered.tokens == status.tokens
    assert pace_so_far(store, layout) == status.overall
