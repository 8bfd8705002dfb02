"""`orch estimate`: the guess without a probe, and a probe whose rows the run answers once and skips."""

from __future__ import annotations

import json
import os
import random
import re
import signal
import statistics
import subprocess
from pathlib import Path

import pytest

from orchestrator.backends import backend_for
from orchestrator.cli import main
from orchestrator.commands.views import forecast_error, forecast_line
from orchestrator.core.context import resolve_spec
from orchestrator.core.layout import RunLayout
from orchestrator.core.records import read_marker
from orchestrator.core.records.forecast import (
    Band,
    CandidateForecast,
    ForecastRecord,
    ProbeRecord,
    RowSample,
    StratumCount,
)
from orchestrator.core.store import open_store
from orchestrator.planning.forecast import (
    band,
    left_strata,
    probe_rate,
    short_probe_note,
    warm_up_note,
    warm_up_split,
    work_seconds,
)
from orchestrator.runview.forecast_check import forecast_beside_pace
from tests.support.datasets import write_jsonl
from tests.support.models import TINY
from tests.support.runs import orch_process

#: The project directory the probe tests run in: quick heartbeats and checkpoints, 16 tokens an answer.
pytestmark = pytest.mark.orch_yaml(
    "sampling:\n  max_tokens: 16\n  temperature: 0\nworkers:\n  heartbeat_interval: 1\n  checkpoint_interval: 1\n  lease_ttl: 20\n"
)


@pytest.fixture
def questions_prepared(workdir: Path) -> None:
    """Run "f": 140 questions of a few lengths, prepared in four chunks for the tiny model."""
    rows = [
        {"id": f"q{i}", "conversation": [{"role": "user", "content": f"Question {i}? " + "w " * (i % 7)}]}
        for i in range(140)
    ]
    write_jsonl(workdir / "q.jsonl", rows)
    assert (
        main(["prepare", "q.jsonl", "--run", "f", "--num-chunks", "4", "--id-column", "id", "--model", str(TINY)]) == 0
    )


def _read_until(proc: subprocess.Popen, text: str) -> str:
    """The process's stderr up to the line holding `text` (bounded by the process: it fails if it ends first)."""
    seen = ""
    while text not in seen:
        line = proc.stderr.readline()
        assert line, f"{text!r} never came: {seen}{proc.communicate()}"
        seen += line
    return seen


@pytest.mark.slow
@pytest.mark.usefixtures("questions_prepared")
def test_ctrl_c_on_estimate_probe_leaves_one_probe_worker_that_the_next_estimate_waits_for(workdir):
    """A real SIGINT while the probe runs: the probe worker goes on and orch says so; the same
    command again waits for that worker instead of launching a second one on the same chunk. The
    worker is held still (SIGSTOP) across the interrupt, so it is surely still running then."""
    probe = ["estimate", "--run", "f", "--model", str(TINY), "--workers", "2", "--probe", "--probe-rows", "32"]
    proc = orch_process(workdir, *probe)
    pid = int(re.search(r"launched \(local-(\d+)-", _read_until(proc, "launched"))[1])
    os.killpg(pid, signal.SIGSTOP)
    try:
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=120)
        assert proc.returncode == 130, err
        assert "the probe goes on without it on the local backend: job local-" in err and "Traceback" not in err
        assert "--probe    waits for it again" in err
        again = orch_process(workdir, *probe, "--json")
        assert "still runs: waiting for" in _read_until(again, "still runs")
    finally:
        os.killpg(pid, signal.SIGCONT)
    out, err = again.communicate(timeout=900)
    assert again.returncode == 0, err
    doc = json.loads(out)
    assert doc["kind"] == "probe" and doc["probe"]["rows"] == 32
    assert len(list((workdir / ".orch" / "logs" / "f").glob("worker-0-*.log"))) == 1  # one probe worker, not two


@pytest.mark.slow
@pytest.mark.usefixtures("questions_prepared")
def test_a_second_ctrl_c_stops_the_probe_and_the_next_estimate_resumes_its_chunk(workdir, capsys):
    probe = ["estimate", "--run", "f", "--model", str(TINY), "--workers", "2", "--probe", "--probe-rows", "32"]
    proc = orch_process(workdir, *probe)
    job = re.search(r"launched \((local-[\d-]+)\)", _read_until(proc, "launched"))[1]
    proc.send_signal(signal.SIGINT)
    _read_until(proc, "Ctrl-C again")
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130 and "stopped the probe (1 worker(s))" in err, err
    ctx = resolve_spec(None, {"run": "f"})
    assert not backend_for(ctx).statuses([job])[job].state.is_live()
    capsys.readouterr()
    assert main([*probe, "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    marker = read_marker(open_store(str(workdir / ".orch")), RunLayout("f"), doc["probe"]["chunk"])
    assert doc["probe"]["rows"] == 32 and marker is not None and marker.rows == 32


@pytest.mark.usefixtures("questions_prepared")
def test_estimate_without_a_probe_says_it_is_a_guess_with_a_wide_band(capsys):
    capsys.readouterr()
    assert main(["estimate", "--run", "f", "--model", str(TINY), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["kind"] == "guess" and "--probe" in doc["note"] and "parameters from config.json" in doc["note"]
    (cpu,) = doc["candidates"]
    e, d = cpu["engine_s"], cpu["duration_s"]
    assert e["p90"] >= 9 * e["p10"] > 0  # wide, and said to be a guess
    # Start-up counted: a local worker's, assumed when nothing measured one.
    assert d["p10"] == pytest.approx(e["p10"] + 30, abs=0.02) and "start-up 30 s assumed" in cpu["basis"]
    assert doc["output_tokens"] == {"p10": 224.0, "p50": 1120.0, "p90": 2240.0}


@pytest.mark.slow
@pytest.mark.usefixtures("questions_prepared")
@pytest.mark.real_engine  # a probe forecast measured on vLLM
def test_estimate_probe_rows_are_answered_once_and_skipped_by_the_run(workdir, capsys):
    if not (TINY / ".built").exists():
        pytest.fail("the tiny model is missing: run `make models`")
    capsys.readouterr()
    assert (
        main(
            [
                "estimate",
                "--run",
                "f",
                "--model",
                str(TINY),
                "--workers",
                "2",
                "--probe",
                "--probe-rows",
                "32",
                "--json",
            ]
        )
        == 0
    )
    doc = json.loads(capsys.readouterr().out)
    assert doc["kind"] == "probe" and doc["probe"]["rows"] == 32 and doc["probe"]["hit_max_tokens"] == 32
    band = doc["candidates"][0]["duration_s"]
    assert 0 < band["p10"] <= band["p50"] <= band["p90"]
    store = open_store(str(workdir / ".orch"))
    layout = RunLayout("f")
    probe_marker = read_marker(store, layout, doc["probe"]["chunk"])
    assert probe_marker is not None and probe_marker.rows == 32
    assert (
        main(
            [
                "run",
                "q.jsonl",
                "--run",
                "f",
                "--model",
                str(TINY),
                "--num-chunks",
                "4",
                "--id-column",
                "id",
                "--workers",
                "2",
                "--out",
                "out.jsonl",
                "--interval",
                "1",
            ]
        )
        == 0
    )
    # The run took the probe's chunk as done: its marker is the probe's, its parts are the probe's only.
    assert read_marker(store, layout, doc["probe"]["chunk"]) == probe_marker
    assert {p.key for p in probe_marker.parts} == {
        i.key for i in store.list(layout.outputs_prefix(doc["probe"]["chunk"]))
    }
    ids = [json.loads(x)["custom_id"] for x in (workdir / "out.jsonl").read_text().splitlines()]
    assert ids == [f"q{i}" for i in range(140)]
    markers = [read_marker(store, layout, f"part_0000{i}") for i in range(5)]
    assert sum(m.rows for m in markers if m is not None) == 140


def _probe(samples: int, run_rows: int, *, busy_s: float = 10.0) -> ProbeRecord:
    """A measured probe of `samples` rows out of a run of `run_rows`, all in one stratum, each 100 tokens out."""
    row = RowSample(
        stratum="s",
        est_prompt_tokens=10,
        prompt_tokens=10,
        cached_tokens=0,
        completion_tokens=100,
        max_tokens=100,
        hit_max=True,
    )
    return ProbeRecord(
        chunk="part_00009",
        rows=samples,
        share=samples / run_rows,
        strata={"s": StratumCount(rows=run_rows, max_tokens=100 * run_rows, est_prompt_tokens=10 * run_rows)},
        created_at=0.0,
        busy_s=busy_s,
        samples=[row] * samples,
    )


def test_work_seconds_counts_only_the_rows_the_probe_left():
    # 20 probe rows took 10 s; the run has 100 rows, 80 of them left: 40 s of work, not 50.
    draws = [work_seconds(_probe(20, 100), random.Random(seed))[0] for seed in range(200)]
    assert 30 < statistics.median(draws) < 50
    assert abs(statistics.median(draws) - 40) < 2
    assert left_strata(_probe(20, 100))["s"].rows == 80


def test_work_seconds_band_holds_the_rate_spread_when_every_row_is_alike():
    # Identical rows leave the bootstrap nothing to resample: the band still has the rate's spread.
    draws = [work_seconds(_probe(20, 100), random.Random(seed))[0] for seed in range(400)]
    b = band(draws)
    assert b.p10 < 40 * 0.95 and b.p90 > 40 * 1.05


def test_a_probe_measured_over_a_fraction_of_a_second_gets_a_wider_band_and_says_so():
    # The same rate (0.1 s a row) measured over 0.1 s and over 30 s of engine time: calibration run
    # 9's 0.3 s probe was 39% slower a row than its run. The short probe's band must hold that.
    def spread(rows: int, busy_s: float) -> tuple[float, float]:
        b = band([work_seconds(_probe(rows, 100 * rows, busy_s=busy_s), random.Random(s))[0] for s in range(400)])
        return b.p10 / b.p50, b.p90 / b.p50

    short, long = spread(1, 0.1), spread(300, 30.0)
    assert short[0] < 0.72 and short[1] > 1.4
    assert 0.8 < long[0] < 0.93 and 1.07 < long[1] < 1.2
    assert "measured over 0.1 engine seconds" in short_probe_note(_probe(1, 100, busy_s=0.1))
    assert short_probe_note(_probe(300, 30000, busy_s=30.0)) == ""


def test_forecast_beside_pace_places_the_projected_finish_in_the_band():
    fleet = CandidateForecast(
        gpu="cpu",
        spot=False,
        workers=2,
        duration_s=Band(p10=90, p50=100, p90=110),
        cost_usd=Band(p10=0, p50=0, p90=0),
        engine_s=Band(p10=20, p50=25, p90=30),
        basis="measured",
    )
    record = ForecastRecord(
        at=0,
        kind="probe",
        workers=2,
        output_tokens=Band(p10=1, p50=1, p90=1),
        prompt_tokens=1,
        candidates=[fleet],
        fleet="cpu/on-demand",
    )
    seen = forecast_beside_pace(record, launched_at=1000.0, eta_s=75.0, now=1050.0, complete=False)
    assert seen is not None and seen.projected_s == 125.0 and seen.projected_in_band == "above p90"
    assert forecast_line(seen).endswith(": above p90")
    # A band under two hours is said to the second: rounded to minutes, 2m10s-2m50s read "2m-2m".
    wide = record.model_copy(
        update={"candidates": [fleet.model_copy(update={"duration_s": Band(p10=130, p50=150, p90=170)})]}
    )
    seen = forecast_beside_pace(wide, launched_at=1000.0, eta_s=135.0, now=1050.0, complete=False)
    assert seen is not None
    assert forecast_line(seen) == "forecast (probe) 2m30s (2m10s-2m50s); at this pace 3m05s: above p90"
    seen = forecast_beside_pace(record, launched_at=1000.0, eta_s=45.0, now=1050.0, complete=False)
    assert seen is not None and seen.projected_in_band == "inside"
    assert forecast_error(seen) == "(probe)"
    done = record.model_copy(update={"actual": {"engine_error": -0.08, "inside_band": 1.0}})
    seen = forecast_beside_pace(done, launched_at=1000.0, eta_s=0.0, now=1200.0, complete=True)
    assert seen is not None and seen.projected_s is None and forecast_error(seen) == "-8%"
    assert forecast_error(None) == "-"


def test_work_seconds_band_runs_from_the_rate_past_the_first_batch_to_the_whole_probe_rate():
    # 20 rows: the first 10 took 8 s (the engine's warm-up in them), the next 10 took 2 s. Rows cost
    # 0.2 s each past the warm-up, which is 6 s: 80 rows left are 16 s of work, not 40 s.
    probe = _probe(20, 100).model_copy(update={"first_batch": [8.0, 0.0, 10, 100, 1000, 0]})
    draws = [work_seconds(probe, random.Random(seed))[0] for seed in range(400)]
    assert probe_rate(probe) == pytest.approx((2.0 / 1005, 6.0))
    # Which share of the first batch's excess was warm-up is not measured: the band runs from the
    # rate past the first batch (16 s) to the probe's whole rate (80 rows at 10 s / 20 rows: 40 s).
    spread = band(draws)
    assert spread.p10 < 19 and spread.p90 > 34
    assert abs(statistics.median(draws) - (16 * 40) ** 0.5) < 3


def test_warm_up_note_says_the_rate_is_high_when_every_probe_row_came_back_in_one_drain():
    # The store of bench/forecast_bench.py's short-output workload: 16 rows, the heartbeat's first
    # batch kept at 16 rows (the whole probe), so the rate carries the engine's warm-up.
    whole = _probe(16, 440).model_copy(update={"first_batch": [0.117, 0.181, 16, 1059, 256, 0]})
    assert not warm_up_split(whole)
    assert "warm-up is in the rate" in warm_up_note(whole)
    assert probe_rate(whole)[1] == 0.0
    split = _probe(20, 100).model_copy(update={"first_batch": [8.0, 0.0, 10, 100, 1000, 0]})
    assert warm_up_split(split)
    assert warm_up_note(split) == ""


def test_a_worker_of_two_gpus_is_forecast_at_twice_one_gpus_price(tmp_path):
    """`resources.gpus_per_worker: 2`: the same work in the same time, each machine paid for both GPUs."""
    from orchestrator.core.context import RunContext
    from orchestrator.core.records import read_manifest
    from orchestrator.core.spec_load import load_spec
    from orchestrator.planning.forecast import guess
    from tests.support.runs import chat_request, make_run

    store = open_store(str(tmp_path / "store"))
    chunks = [[chat_request(f"c{c}-{i}", "q", max_tokens=8192) for i in range(1000)] for c in range(4)]
    layout = make_run(store, "g", chunks, model="m")
    manifest = read_manifest(store, layout)
    fleets = {}
    for gpus in (1, 2):
        flags = {"run": "g", "store": store.uri, "backend": "skypilot", "resources.gpus": ["L4"]}
        spec = load_spec(None, {**flags, "resources.gpus_per_worker": gpus}, env={}, default_file=False)
        fleets[gpus] = guess(RunContext(spec, store, layout), manifest, 2, 0.0).fleet_candidate()
    one, two = fleets[1], fleets[2]
    assert one is not None and two is not None and one.cost_usd.p50 > 0
    assert two.duration_s == one.duration_s
    assert two.cost_usd.p50 == pytest.approx(2 * one.cost_usd.p50, rel=0.01)
