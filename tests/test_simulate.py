"""The simulator: accounting checked by hand, and proof that it drives the production protocol."""

from __future__ import annotations

import gc
import json
import random
from collections.abc import Iterator

import pytest

from orchestrator.cli import main
from orchestrator.core.layout import RunLayout
from orchestrator.core.protocol import claims as claims_module
from orchestrator.core.protocol.checkpoints import ChunkJob
from orchestrator.core.protocol.claims import ChunkClaimer
from orchestrator.core.protocol.leases import LeaseLost, acquire
from orchestrator.core.records import Lease
from orchestrator.core.store.base import ObjectInfo
from orchestrator.core.store.memory import MemoryStore
from orchestrator.planning.plan import plan_chunks
from orchestrator.planning.pricing import load_gpu_table
from orchestrator.simulate import ORCH, SKYPILOT_EXAMPLE, SimConfig, simulate, synthetic_manifest
from orchestrator.simulate import fleet as fleet_module
from orchestrator.simulate.fleet import Fleet
from orchestrator.simulate.sim_worker import LeaseReadStore, SimClock, SimLeaseKeeper, SimWorker, UnitCodec
from orchestrator.simulate.traces import Trace, poisson_trace

PRICES = load_gpu_table()


def one_l4(**kw):
    # 3,000-row chunks at 1 row/s: 100 units of 30 rows, no rounding anywhere.
    return SimConfig(workers=1, chunks=kw.pop("chunks", 2), rows_per_chunk=3000, gpus=["L4"], **kw)


def trace_file(tmp_path, text):
    path = tmp_path / "trace.yaml"
    path.write_text(text)
    return str(path)


def test_one_worker_without_preemptions_takes_work_over_speed_plus_start_up():
    result = simulate(one_l4(preemptions_per_hour=0), ORCH, seed=0)
    assert result.complete and result.markers == 2
    assert result.makespan_s == pytest.approx(2 * 3000 / 1.0 + 600)
    assert result.lower_bound_s == pytest.approx(result.makespan_s)
    assert result.lost_gpu_h == 0 and result.billed_gpu_h == pytest.approx(result.makespan_s / 3600)
    assert result.cost_usd == pytest.approx(result.billed_gpu_h * PRICES.price("L4", spot=True))


def test_one_preemption_loses_at_most_one_checkpoint_interval(tmp_path):
    config = one_l4(trace=trace_file(tmp_path, "preemptions:\n  - {t: 2000, worker: 0}\n"), checkpoint_interval_s=60)
    result = simulate(config, ORCH, seed=0)
    lost_s = result.lost_gpu_h * 3600
    assert 0 < lost_s <= 60
    # Work, two start-ups, and the lost seconds done again.
    assert result.makespan_s == pytest.approx(6000 + 2 * 600 + lost_s)


def test_the_skypilot_example_loses_the_whole_chunk_on_preemption(tmp_path):
    config = one_l4(trace=trace_file(tmp_path, "preemptions:\n  - {t: 2000, worker: 0}\n"))
    result = simulate(config, SKYPILOT_EXAMPLE, seed=0)
    assert result.lost_gpu_h * 3600 == pytest.approx(2000 - 600)  # everything since the chunk started
    assert result.makespan_s == pytest.approx(6000 + 2 * 600 + 1400)


def test_an_outage_keeps_preempted_spot_machines_away_until_capacity_returns(tmp_path):
    config = one_l4(trace=trace_file(tmp_path, "outages:\n  - {start: 1000, end: 4000, gpu: L4}\n"))
    result = simulate(config, ORCH, seed=0)
    waits = [s for s in result.segments if s.kind == "wait"]
    assert [(w.start, w.end) for w in waits] == [(1000, 4000)]
    assert result.makespan_s == pytest.approx(6000 + 600 + 3000 + 600 + result.lost_gpu_h * 3600)


def test_every_chunk_gets_exactly_one_marker_in_every_run():
    config = SimConfig(workers=6, chunks=40, rows_per_chunk=800, preemptions_per_hour=2.0)
    for policy in (ORCH, SKYPILOT_EXAMPLE):
        for seed in range(3):
            entries = synthetic_manifest(config, random.Random(seed))
            gpus = [random.Random(seed).choice(config.gpus) for _ in range(6)]
            fleet = Fleet(
                config, policy, entries, gpus, poisson_trace(gpus, 2.0, 1e6, random.Random(seed)), PRICES, seed
            )
            result = fleet.run()
            markers = [o.key for o in fleet.store.list(fleet.layout.done_prefix)]
            assert result.complete and len(markers) == len(set(markers)) == 40


def test_runs_are_deterministic_per_seed():
    config = SimConfig(workers=5, chunks=30, rows_per_chunk=1000, preemptions_per_hour=1.0)
    a, b = simulate(config, ORCH, seed=4), simulate(config, ORCH, seed=4)
    assert (a.makespan_s, a.lost_gpu_h, a.preemptions) == (b.makespan_s, b.lost_gpu_h, b.preemptions)
    assert simulate(config, ORCH, seed=5).makespan_s != a.makespan_s


def test_a_fast_gpu_rescues_a_slow_gpus_last_chunk():
    config = SimConfig(workers=2, chunks=4, rows_per_chunk=3000, gpus=["L4"], preemptions_per_hour=0)
    entries = synthetic_manifest(config, random.Random(0))
    result = Fleet(config, ORCH, entries, ["L4", "A100-80GB"], Trace(), PRICES, 0).run()
    assert result.rescues >= 1
    without = Fleet(
        config,
        ORCH.__class__("no-rescue", ORCH.plan, True, None, True),
        entries,
        ["L4", "A100-80GB"],
        Trace(),
        PRICES,
        0,
    ).run()
    assert result.makespan_s < without.makespan_s


def test_the_simulator_drives_the_production_protocol(monkeypatch):
    calls = {"next_chunk": 0, "acquire": 0, "checkpoint": 0, "complete": 0}

    def spy(name, real):
        def wrapper(*args, **kwargs):
            calls[name] += 1
            return real(*args, **kwargs)

        return wrapper

    monkeypatch.setattr(ChunkClaimer, "next_chunk", spy("next_chunk", ChunkClaimer.next_chunk))
    monkeypatch.setattr(claims_module, "acquire", spy("acquire", claims_module.acquire))
    monkeypatch.setattr(ChunkJob, "checkpoint", spy("checkpoint", ChunkJob.checkpoint))
    monkeypatch.setattr(ChunkJob, "complete", spy("complete", ChunkJob.complete))
    result = simulate(SimConfig(workers=3, chunks=9, rows_per_chunk=600), ORCH, seed=1)
    assert result.markers == 9
    assert calls["complete"] >= 9 and calls["checkpoint"] >= 9 and calls["acquire"] >= 9 and calls["next_chunk"] >= 12
    assert ORCH.plan is plan_chunks  # the planner `orch plan` uses


def test_a_lease_read_before_the_end_game_shows_every_renewal_due_by_then(monkeypatch):
    """Renewals are written when a lease is read (fleet.py): whoever reads a live holder's lease
    sees the renewal a renewal every TTL / 3 from the claim would have left last."""
    checked: list[str] = []
    real = Fleet._lease_read

    def lease_read(fleet: Fleet, key: str | None) -> None:
        real(fleet, key)
        holder = fleet.holders.get(fleet.layout.chunk_of(key, fleet.layout.leases_prefix)) if key else None
        if fleet.end_game or holder is None or holder.session is None:
            return
        renewed, due = holder.session.start, holder.session.start + fleet.config.lease_ttl_s / 3
        while due < fleet.clock.now:
            renewed, due = due, due + fleet.config.lease_ttl_s / 3
        stored = Lease.from_bytes(MemoryStore.get(fleet.store, key).data)
        assert (stored.renewed_at, stored.expires_at) == (renewed, renewed + fleet.config.lease_ttl_s)
        checked.append(holder.session.job.chunk)

    monkeypatch.setattr(Fleet, "_lease_read", lease_read)
    # Fast and slow GPUs: the fast ones take chunks from slow ones' lists, whose owners reach some
    # of them while the thief still works on them (8 such reads in these five runs).
    preempted = SimConfig(workers=8, chunks=60, rows_per_chunk=3000, preemptions_per_hour=2.0)
    spread = SimConfig(workers=16, chunks=100, rows_per_chunk=3000, preemptions_per_hour=1.0, rows_spread=3.0)
    for config, seed in [(preempted, 0), (preempted, 1), (preempted, 2), (spread, 1), (spread, 2)]:
        assert simulate(config, ORCH, seed=seed).complete
    assert len(checked) >= 5


def test_the_simulators_lease_keeper_skips_only_a_renewal_that_would_write_the_same_lease():
    """The simulator's clock stands still from a chunk's last flush to its marker: the second of
    two renewals at one instant writes nothing, unless someone changed the lease in between."""
    layout = RunLayout("sim")
    clock = SimClock()
    store = LeaseReadStore(clock, "keeper", layout.leases_prefix, lambda _key: None)
    held = acquire(store, layout, "c1", worker="1", holder="1.0", ttl=300, now=0.0)
    assert held is not None
    keeper = SimLeaseKeeper(store, layout, held, ttl=300, clock=clock)
    clock.now = 100.0
    keeper.renew()
    keeper.renew()
    assert store.requests.by_op["compare_and_swap"] == 1 and keeper.held.lease.expires_at == 400.0
    theirs = acquire(store, layout, "c1", worker="2", holder="2.0", ttl=300, now=100.0, may_take=lambda _lease: True)
    assert theirs is not None
    with pytest.raises(LeaseLost):
        keeper.renew()


def test_an_end_game_reader_of_a_lease_finds_every_checkpoint_its_holder_made(monkeypatch):
    """End-game checkpoints are written when their chunk's lease is read (fleet.py): whoever reads
    a live holder's lease (a rescuer, before it takes the chunk over) finds in the store every unit
    the holder had done by its last checkpoint, as a flush every interval would have left."""
    checked: list[str] = []
    real = Fleet._lease_read
    codec = UnitCodec()

    def lease_read(fleet: Fleet, key: str | None) -> None:
        real(fleet, key)
        holder = fleet.holders.get(fleet.layout.chunk_of(key, fleet.layout.leases_prefix)) if key else None
        if not fleet.end_game or holder is None or holder.session is None:
            return
        s, interval = holder.session, fleet.config.checkpoint_interval_s
        last = s.start + (fleet.clock.now - s.start) // interval * interval
        # A checkpoint due at this very instant may come after the read (events of one time run in turn).
        expected = {fleet._units_done(holder, b) for b in (last, last - interval) if b >= s.start}
        prefix = fleet.layout.outputs_prefix(s.job.chunk)
        mine = [o.key for o in MemoryStore.list(fleet.store, prefix) if o.key.startswith(f"{prefix}{s.job.holder}-")]
        written = sum(len(codec.decode(MemoryStore.get(fleet.store, k).data)) for k in mine)
        done_before = fleet.units[s.job.chunk] - len(s.remaining)  # by earlier holders, in their parts
        assert written in expected and written + done_before <= fleet.units[s.job.chunk]
        checked.append(s.job.chunk)

    monkeypatch.setattr(Fleet, "_lease_read", lease_read)
    rescued = 0
    for seed in range(3):  # fast GPUs rescue slow ones' last chunks: each rescue reads the lease first
        result = simulate(SimConfig(workers=12, chunks=40, rows_per_chunk=3000, rows_spread=3.0), ORCH, seed=seed)
        assert result.complete
        rescued += result.rescues
    assert rescued >= 3 and len(checked) >= rescued


def test_the_simulators_lease_keeper_defers_a_renewal_only_until_it_could_be_read():
    """Within `deferred()` (a chunk's last flush and marker) a renewal that would succeed is not
    written: the marker deletes the lease at that instant. One still there at the end of the block
    is written then, at its own time; one whose lease was taken over fails as before."""
    layout = RunLayout("sim")
    clock = SimClock()
    store = LeaseReadStore(clock, "defer", layout.leases_prefix, lambda _key: None)
    keepers = []
    for chunk in ("c1", "c2", "c3"):
        held = acquire(store, layout, chunk, worker="1", holder="1.0", ttl=300, now=0.0)
        assert held is not None
        keepers.append(SimLeaseKeeper(store, layout, held, ttl=300, clock=clock))
    clock.now = 100.0
    with keepers[0].deferred():  # the marker written: the lease deleted, nothing renewed
        keepers[0].renew()
        keepers[0].renew()
        store.delete(layout.lease("c1"))
    assert store.requests.by_op.get("compare_and_swap", 0) == 0
    with keepers[1].deferred():  # another worker's marker came first: the lease stays, renewed at 100
        keepers[1].renew()
        clock.now = 100.0
    assert store.requests.by_op["compare_and_swap"] == 1
    assert Lease.from_bytes(store.get(layout.lease("c2")).data).renewed_at == 100.0
    theirs = acquire(store, layout, "c3", worker="2", holder="2.0", ttl=300, now=100.0, may_take=lambda _lease: True)
    assert theirs is not None
    with pytest.raises(LeaseLost), keepers[2].deferred():
        keepers[2].renew()


def test_a_fleet_run_pauses_the_cyclic_collector_and_gives_it_back_even_when_it_fails(monkeypatch):
    states: list[bool] = []
    real = Fleet._claim

    def claim(fleet: Fleet, w: SimWorker) -> None:
        states.append(gc.isenabled())
        real(fleet, w)

    monkeypatch.setattr(Fleet, "_claim", claim)
    assert simulate(SimConfig(workers=2, chunks=4, rows_per_chunk=600), ORCH, seed=0).complete
    assert states and not any(states) and gc.isenabled()

    def broken(_fleet: Fleet, _w: object) -> None:
        raise RuntimeError("a bug in a handler")

    monkeypatch.setattr(Fleet, "_claim", broken)
    with pytest.raises(RuntimeError):
        simulate(SimConfig(workers=2, chunks=4, rows_per_chunk=600), ORCH, seed=0)
    assert gc.isenabled()


def test_simulate_command_compares_policies(tmp_path, capsys):
    png = tmp_path / "g.png"
    assert (
        main(
            [
                "simulate",
                "--workers",
                "4",
                "--chunks",
                "20",
                "--rows-per-chunk",
                "500",
                "--seeds",
                "2",
                "--compare",
                "--plot",
                str(png),
            ]
        )
        == 0
    )
    out = capsys.readouterr().out
    assert "orch" in out and "skypilot-example" in out and "makespan / lower bound" in out
    assert png.stat().st_size > 10_000


def test_simulate_refuses_a_bad_trace(tmp_path, capsys):
    bad = trace_file(tmp_path, "preemptions:\n  - {time: 5}\n")
    assert main(["simulate", "--workers", "1", "--chunks", "1", "--trace", bad]) == 2
    assert "not a valid preemption trace" in capsys.readouterr().err


def outage_fleet(**outages):
    """8 workers on 40 chunks of 2,000 rows, with spot outages starting within the first half hour."""
    return SimConfig(workers=8, chunks=40, rows_per_chunk=2000, outage_window_s=1800, **outages)


def test_the_deadline_policy_meets_a_deadline_spot_alone_misses_and_costs_less_than_on_demand():
    from orchestrator.simulate import deadline_study

    # Two 4-hour windows without spot capacity: spot alone runs late on this seed.
    config = outage_fleet(preemptions_per_hour=1.0, outages=2, outage_s=3 * 3600)
    runs = {market: results[0] for market, results in deadline_study(config, 1, 2.0).items()}
    od = runs["on-demand only"]
    assert od.met_deadline and od.deadline_s == 2 * od.makespan_s
    assert not runs["spot only"].met_deadline
    deadline = runs["deadline"]
    assert deadline.complete and deadline.met_deadline and deadline.on_demand_launched > 0
    assert deadline.cost_usd < od.cost_usd
    assert deadline.markers == deadline.chunks  # every chunk once, with workers added and retired


def test_deadline_policy_waits_out_an_early_spot_outage_on_fewer_on_demand_hours_than_uniform_progress():
    from orchestrator.simulate import deadline_study

    # No spot capacity at all for 1.5 h, starting within the first half hour; the deadline 3x the
    # on-demand makespan leaves the slack to wait it out.
    config = outage_fleet(outages=1, outage_s=1.5 * 3600)
    results = deadline_study(config, 5, 3.0)
    up, waits = results["uniform progress"], results["deadline"]
    assert all(r.met_deadline for r in up + waits)  # 0 misses over the seeds, for both
    assert sum(r.on_demand_gpu_h for r in waits) < 0.5 * sum(r.on_demand_gpu_h for r in up)
    waited = [d for r in waits for d in r.decisions if d.mode == "waiting"]
    assert waited and all("waiting for spot: slack" in d.reason and "> reserve" in d.reason for d in waited)


def test_deadline_policy_still_meets_the_deadline_when_the_outage_outlasts_the_slack():
    from orchestrator.simulate import deadline_study

    # 3 h without spot against a deadline of 2x the on-demand makespan: spot alone is late; waiting
    # must give up in time and pay for on-demand.
    config = outage_fleet(outages=1, outage_s=3 * 3600)
    results = deadline_study(config, 3, 2.0)
    assert not all(r.met_deadline for r in results["spot only"])
    waits = results["deadline"]
    assert all(r.met_deadline for r in waits) and all(r.on_demand_launched for r in waits)
    assert any("on-demand: slack" in d.reason and "within reserve" in d.reason for r in waits for d in r.decisions)


def test_simulate_command_runs_the_deadline_study(capsys):
    code = main(
        [
            "simulate",
            "--workers",
            "4",
            "--chunks",
            "12",
            "--rows-per-chunk",
            "500",
            "--seeds",
            "2",
            "--outages",
            "1",
            "--deadline-factor",
            "1.5",
            "--json",
        ]
    )
    assert code == 0
    doc = json.loads(capsys.readouterr().out)
    assert set(doc["markets"]) == {"on-demand only", "spot only", "greedy", "uniform progress", "deadline"}
    assert doc["markets"]["on-demand only"]["cost_vs_on_demand"] == 1.0


class _CountingStore(LeaseReadStore):
    """The simulator's store, counting the keys its listings hand out (the claimers' work per chunk)."""

    listed = 0

    def list(self, prefix: str, start_after: str | None = None) -> Iterator[ObjectInfo]:
        for info in super().list(prefix, start_after):
            _CountingStore.listed += 1
            yield info


@pytest.mark.slow  # fleets of thousands
def test_the_simulators_work_per_chunk_grows_at_most_logarithmically_with_the_fleet(monkeypatch):
    """Keys listed per chunk, at 8x the workers and 8x the chunks: independent of the machine's speed.

    Each end-game claim listing every done marker made this workers x chunks (1e8 keys at 1,000 x
    100,000): 12 keys per chunk here at 10 workers, 106 at 80. Now 3 and 10 (the rest that grows:
    each exiting worker reads every lease and heartbeat once)."""
    monkeypatch.setattr(fleet_module, "LeaseReadStore", _CountingStore)

    def listed_per_chunk(workers: int, chunks: int) -> float:
        _CountingStore.listed = 0
        config = SimConfig(workers=workers, chunks=chunks, rows_per_chunk=500, rows_spread=4.0)
        assert simulate(config, ORCH, seed=0).complete
        return _CountingStore.listed / chunks

    small, big = listed_per_chunk(10, 500), listed_per_chunk(80, 4000)
    assert big < 20 and big / small < 5, (small, big)


def test_simulate_command_says_up_front_how_long_a_large_run_takes_and_the_faster_settings(monkeypatch, capsys):
    from orchestrator.commands import simulate as command

    monkeypatch.setattr(command, "LONG_RUN_S", 0.0)
    args = ["simulate", "--workers", "3", "--chunks", "6", "--rows-per-chunk", "1000", "--seeds", "2", "--json"]
    assert main(args) == 0
    captured = capsys.readouterr()
    assert "3 workers x 6 chunks, 2 seed(s): about" in captured.err
    assert "--seeds 1: about" in captured.err and "--seeds 1 --rows-per-chunk 500: about" in captured.err
    assert json.loads(captured.out)["policies"]["orch"]["complete"] == 2  # stdout stays JSON


def test_the_estimate_grows_with_chunks_renewals_and_workers():
    from orchestrator.simulate import estimate_seconds

    issue = SimConfig(workers=1000, chunks=100_000, rows_per_chunk=500)
    assert 20 < estimate_seconds(issue, 1) < 60  # the benchmark's size, measured at 27-45 s
    default_rows = issue.model_copy(update={"rows_per_chunk": 5000})
    assert estimate_seconds(default_rows, 5) > 5 * estimate_seconds(issue, 1)


def test_shared_prefixes_save_prefill_per_cache_hit():
    """One L4, 4 chunks of 3,000 rows over 2 prefixes (prefix_fraction 0.5): orch's chunks (in prefix
    order, rows fed by prefix) prefill each prefix once per machine and halve the rest of the work;
    the example's rows come in input order and hit only as often as the cache holds their prefix."""
    config = one_l4(chunks=4, preemptions_per_hour=0, prefixes=2, cache_prefixes=1)
    entries = synthetic_manifest(config, random.Random(0))
    assert [e.edge_prefixes for e in entries] == [["p0"], ["p0"], ["p1"], ["p1"]]
    orch = simulate(config, ORCH, seed=0)
    # 12,000 rows, 2 of them misses: the rest at half the work.
    assert orch.makespan_s == pytest.approx(2 + 11_998 * 0.5 + 600, abs=30)
    assert orch.lower_bound_s == pytest.approx(orch.makespan_s, abs=30)
    example = simulate(config, SKYPILOT_EXAMPLE, seed=0)
    # Half the rows hit (1 prefix cached of 2): 0.75 of the work.
    assert example.makespan_s == pytest.approx(12_000 * 0.75 + 600, abs=30)
    # No prefixes: every row is work, as before.
    assert simulate(one_l4(chunks=4, preemptions_per_hour=0), ORCH, seed=0).makespan_s == pytest.approx(12_600)


def test_simulate_help_shows_options_not_internals(capsys):
    from orchestrator.cli import main

    assert main(["simulate", "--help"]) == 0
    shown = capsys.readouterr().out
    assert "--preemptions-per-hour" in shown and "_sim_config" not in shown and "knobs" not in shown


def test_fleet_zones_steered_by_the_launch_ranking_dodge_the_zone_that_preempts():
    """The simulator's spot zones go through the ranking and the history of real launches
    (planning/zone_steering.py, zone_history.py): listed first, the bad zone is left once seen."""
    zones = {"aws/us-east-1/us-east-1a": 2.0, "aws/us-east-1/us-east-1b": 0.05}
    totals = {}
    for order in ("ranked", "listed"):
        config = SimConfig(workers=8, chunks=80, rows_per_chunk=3000, gpus=["L4"], zones=zones, zone_order=order)
        results = [simulate(config, ORCH, seed=s) for s in range(3)]
        assert all(r.complete and r.markers == 80 for r in results)
        totals[order] = sum(r.preemptions for r in results)
    assert totals["ranked"] * 3 < totals["listed"], totals


def test_simulate_for_a_run_takes_the_start_up_it_measured_and_says_so(tmp_path, capsys):
    """`orch simulate --run R`: a machine's start-up is the run's own measurement (launch to first
    answer), not the flat default, and the output says which it used; a run no worker has answered
    yet, and no run at all, take the default and say so too."""
    import time

    from orchestrator.core.records import JobAttempt, update_jobs
    from orchestrator.core.store import open_store
    from tests.support.runs import Answer, answer_chunk, chat_request, make_run

    store_uri = str(tmp_path / "store")
    store = open_store(store_uri)
    layout = make_run(store, "measured", [[chat_request("a", "q")], [chat_request("b", "q")]], model="m")
    make_run(store, "fresh", [[chat_request("c", "q")]], model="m")

    def launched(rec):
        rec.worker(0).attempts.append(JobAttempt(job_id="1", backend="local", launched_at=time.time() - 1200))

    update_jobs(store, layout, launched)
    answer_chunk(store, layout, "part_00000", [[Answer(0, "a", "x")]])
    small = ["simulate", "--workers", "2", "--chunks", "4", "--rows-per-chunk", "50", "--seeds", "1", "--json"]
    assert main([*small, "--run", "measured", "--store", store_uri]) == 0
    out, err = capsys.readouterr()
    startup = json.loads(out)["config"]["restart_overhead_s"]
    assert 1200 <= startup < 1300  # the part was written now, the job launched 1,200 s ago
    assert f"start-up per machine: {startup:,.0f} s (measured on run 'measured'" in err
    assert main([*small, "--run", "fresh", "--store", store_uri]) == 0
    out, err = capsys.readouterr()
    assert json.loads(out)["config"]["restart_overhead_s"] == 600
    assert "start-up per machine: 600 s (default: no worker of run 'fresh' has answered yet)" in err
    assert main([*small, "--restart-overhead", "30"]) == 0
    out, err = capsys.readouterr()
    assert json.loads(out)["config"]["restart_overhead_s"] == 30 and "30 s (--restart-overhead)" in err
