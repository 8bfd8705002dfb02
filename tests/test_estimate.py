"""Estimates before launch and while running: the table first, then the run's own measured speeds."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from orchestrator.cli import main
from orchestrator.core.records import ChunkStats, ManifestEntry
from orchestrator.core.store import open_store
from orchestrator.planning.estimate import estimate
from orchestrator.planning.pricing import load_gpu_table
from tests.support.runs import Answer, answer_chunk, chat_request, make_run

TABLE = load_gpu_table()


def entries(n=10, rows=1000, max_tokens=256):
    return [
        ManifestEntry(
            chunk=f"part_{i:05d}",
            key=f"chunks/part_{i:05d}.jsonl",
            rows=rows,
            bytes=rows * 300,
            est_prompt_tokens=rows * 60,
            max_output_tokens=rows * max_tokens,
        )
        for i in range(n)
    ]


def test_before_any_chunk_finishes_the_table_gives_the_speeds():
    est = estimate(
        TABLE,
        ["L4", "A100"],
        4,
        entries(),
        {},
        set(),
        preemptions_per_hour=0.25,
        restart_overhead_s=600,
        checkpoint_interval_s=60,
    )
    l4, a100 = est.candidates
    # 10,000 rows x 128 tokens (half of max_tokens) over 4 workers at 1,100 tok/s: 290.9 s + 600 s start-up.
    work_h = 10_000 * 128 / 4 / 1100 / 3600
    assert l4.on_demand_hours == pytest.approx(work_h + 600 / 3600, abs=1e-3)
    assert l4.on_demand_usd == pytest.approx(l4.on_demand_hours * 4 * TABLE.get("L4").on_demand_usd_h, abs=0.01)
    # Spot: each preemption costs 600 s + 30 s, 0.25 per hour -> 4.375% of the time lost.
    assert l4.spot_hours == pytest.approx(work_h / (1 - 0.25 * 630 / 3600) + 600 / 3600, abs=1e-3)
    assert a100.tokens_per_s == pytest.approx(1100 * TABLE.get("A100").relative_speed)
    assert l4.cheapest_per_hour and est.fleet is l4 and not l4.measured


def test_measured_speeds_replace_the_table_and_scale_the_gpus_not_seen():
    stats = {
        f"part_0000{i}": (
            0.0,
            ChunkStats(
                rows=1000, errors=0, tokens_in=0, tokens_out=50_000, seconds=100.0, worker="0", accelerator="NVIDIA L4"
            ),
        )
        for i in range(2)
    }
    done = set(stats)
    est = estimate(TABLE, ["L4", "A100"], 2, entries(), stats, done)
    tp = est.throughput
    assert tp.tokens_per_s["L4"] == 500.0 and tp.measured == {"L4": 2}
    assert tp.tokens_per_s["A100"] == pytest.approx(500.0 * TABLE.get("A100").relative_speed)
    assert tp.tokens_per_row == 50.0 and tp.tokens_per_row_measured
    assert est.rows_left == 8000 and est.tokens_left == 8000 * 50


def test_plan_estimate_and_estimate_give_one_quote_with_start_up_spot_and_on_demand(tmp_path, capsys):
    """`orch plan --estimate` and `orch estimate` quote the same figures for the same run (issue 50:
    they were 20x apart), start-up counted, each GPU spot and on-demand."""
    store = open_store(str(tmp_path / "store"))
    chunks = [[chat_request(f"c{c}-{i}", "q", max_tokens=100) for i in range(10)] for c in range(4)]
    make_run(store, "e", chunks, model="m", spec_flags={"backend": "skypilot", "resources.gpus": ["L4", "A100"]})
    run = ["--run", "e", "--store", str(tmp_path / "store"), "--workers", "2"]
    assert main(["plan", *run, "--estimate", "--json"]) == 0
    planned = json.loads(capsys.readouterr().out)["estimate"]
    assert main(["estimate", *run, "--json"]) == 0
    estimated = json.loads(capsys.readouterr().out)
    assert planned["candidates"] == estimated["candidates"] and planned["kind"] == estimated["kind"] == "guess"
    quoted = {(c["gpu"], c["spot"]): c for c in planned["candidates"]}
    assert set(quoted) == {("L4", True), ("L4", False), ("A100", True), ("A100", False)}
    for c in quoted.values():
        assert c["duration_s"]["p10"] >= 600 and "start-up 600 s assumed" in c["basis"]
    assert quoted["L4", True]["cost_usd"]["p50"] < quoted["L4", False]["cost_usd"]["p50"]
    assert main(["plan", *run, "--estimate"]) == 0
    out = capsys.readouterr().out
    assert "forecast (guess) for 2 workers" in out and "L4 spot" in out and "A100 on-demand" in out


def test_status_estimates_what_is_left(tmp_path, capsys):
    store = open_store(str(tmp_path / "store"))
    layout = make_run(store, "e", [[chat_request(f"c{c}-{i}", "q") for i in range(10)] for c in range(4)], model="m")
    answer_chunk(store, layout, "part_00000", [[Answer(i, f"c0-{i}", "x") for i in range(10)]], seconds=20)
    assert main(["status", "--run", "e", "--store", str(tmp_path / "store"), "--json"]) == 0
    est = json.loads(capsys.readouterr().out)["estimate"]
    assert est["gpu"] == "L4" and est["measured"]  # answer_chunk finishes on an "NVIDIA L4"
    assert 0 < est["spot_usd"] < est["on_demand_usd"] and est["spot_hours"] >= est["on_demand_hours"]


def test_status_and_plan_estimate_use_the_speed_a_cpu_run_measured_and_say_so(tmp_path, capsys):
    """A local run on CPU measured its own tok/s: status, `plan --estimate` and the deadline
    policy reckon with that, not the table's L4, and say which speed they used."""
    store_uri = str(tmp_path / "store")
    store = open_store(store_uri)
    layout = make_run(
        store, "cpu", [[chat_request(f"c{c}-{i}", "q", max_tokens=100) for i in range(10)] for c in range(4)], model="m"
    )
    run = ["--run", "cpu", "--store", store_uri]
    assert main(["status", *run]) == 0
    assert "(table 1,100 tok/s each)" in capsys.readouterr().out  # nothing measured yet
    # 10 rows of 2 tokens in 10 s on each of two chunks: 2 tok/s on cpu.
    for c in (0, 1):
        answer_chunk(
            store, layout, f"part_0000{c}", [[Answer(i, f"c{c}-{i}", "x") for i in range(10)]], accelerator="cpu"
        )
    assert main(["status", *run]) == 0
    out = capsys.readouterr().out
    assert "estimate left on 2 x cpu (measured 2 tok/s on cpu)" in out, out
    assert main(["status", *run, "--json"]) == 0
    est = json.loads(capsys.readouterr().out)["estimate"]
    assert (est["gpu"], est["measured"], est["basis"]) == ("cpu", True, "measured 2 tok/s on cpu")
    # 20 rows x 2 tokens over 2 workers at 2 tok/s, plus a start-up.
    assert est["on_demand_hours"] == pytest.approx((20 * 2 / 2 / 2 + 600) / 3600, abs=1e-3)
    assert main(["plan", *run, "--workers", "1", "--estimate", "--json"]) == 0
    (quoted,) = json.loads(capsys.readouterr().out)["estimate"]["candidates"]
    assert quoted["gpu"] == "cpu" and "measured on cpu by this run's 2 finished chunk(s)" in quoted["basis"]


def test_deadline_policy_reckons_a_new_worker_at_the_measured_speed(tmp_path):
    from orchestrator.backends.local import LocalLauncher
    from orchestrator.core.context import resolve_spec
    from orchestrator.fleet.deadline_control import DeadlineControl
    from orchestrator.planning.deadline import DeadlineSettings

    store_uri = str(tmp_path / "store")
    store = open_store(store_uri)
    layout = make_run(store, "cpu", [[chat_request(f"c{c}-{i}", "q") for i in range(10)] for c in range(4)], model="m")
    answer_chunk(store, layout, "part_00000", [[Answer(i, f"c0-{i}", "x") for i in range(10)]], accelerator="cpu")
    ctx = resolve_spec(None, {"run": "cpu", "store": store_uri, "model.name": "m"})
    control = DeadlineControl(
        ctx, LocalLauncher(tmp_path / "logs", workers=1), DeadlineSettings(deadline_s=1e9, max_on_demand=0)
    )
    decision = control.round({})
    assert decision.speed == "a new worker on cpu: measured 2 tok/s on cpu"


def test_startup_is_measured_from_each_workers_launch_to_its_first_flushed_rows(tmp_path):
    from orchestrator.core.layout import RunLayout
    from orchestrator.core.records import JobAttempt, update_jobs
    from orchestrator.planning.startup import measured_startup_s

    store, layout = open_store(str(tmp_path / "store")), RunLayout("s")
    assert measured_startup_s(store, layout) is None  # nothing launched: the flat assumption stands
    store.put(layout.output_part("part_00000", "0.aaaa", 1), b"{}\n")
    store.put(layout.output_part("part_00001", "1.bbbb", 1), b"{}\n")
    store.put(layout.output_part("part_00001", "1.cccc", 2), b"{}\n")  # a later process: not its start-up
    written = {i.key.split("/")[-1][0]: i.modified for i in store.list(layout.outputs_root)}

    def launch(rec):
        rec.worker(0).attempts.append(JobAttempt(job_id="1", backend="skypilot", launched_at=written["0"] - 100))
        rec.worker(1).attempts.append(JobAttempt(job_id="2", backend="skypilot", launched_at=written["1"] - 140))
        rec.worker(1).attempts.append(JobAttempt(job_id="3", backend="skypilot", launched_at=written["1"] + 5))

    update_jobs(store, layout, launch)
    assert measured_startup_s(store, layout) == pytest.approx(120, abs=1)


def test_a_quote_without_a_probe_uses_what_an_earlier_run_of_the_same_model_measured(tmp_path, capsys):
    """The same weights (here at another path) answered 20 rows at 2 tok/s on this machine's CPUs in an
    earlier run: the next run's quote takes that speed and its tokens per row, not the table's guess."""
    import shutil

    tiny = Path(__file__).resolve().parents[1] / ".cache" / "models" / "tiny-llama"
    copy = tmp_path / "copied-model"
    shutil.copytree(tiny, copy)
    store = open_store(str(tmp_path / "store"))
    chunks = [[chat_request(f"c{c}-{i}", "q", max_tokens=100) for i in range(10)] for c in range(4)]
    earlier = make_run(store, "week1", chunks, model=str(tiny))
    for c in (0, 1):
        answers = [Answer(i, f"c{c}-{i}", "x") for i in range(10)]
        answer_chunk(store, earlier, f"part_0000{c}", [answers], accelerator="cpu")
    make_run(store, "week2", chunks, model=str(copy))
    capsys.readouterr()
    assert main(["estimate", "--run", "week2", "--store", str(tmp_path / "store"), "--workers", "1", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    (cpu,) = doc["candidates"]
    assert "measured on cpu by run 'week1' (the same model)" in cpu["basis"]
    assert doc["output_tokens"]["p50"] == 80  # 2 tokens a row, as week1's rows made, x 40 rows
    # Measured: speed and tokens per row each within 1.5x either way (a table guess on a CPU spans 1,000x).
    assert cpu["engine_s"]["p90"] <= 1.5**4 * cpu["engine_s"]["p10"] * 1.01
