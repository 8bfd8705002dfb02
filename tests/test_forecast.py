"""`orch estimate`: the guess without a probe, and a probe whose rows the run answers once and skips."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from orchestrator.cli import main
from orchestrator.core.protocol.layout import RunLayout
from orchestrator.core.records import read_marker
from orchestrator.core.store import open_store
from tests.support.datasets import write_jsonl

ROOT = Path(__file__).resolve().parents[1]
TINY = ROOT / ".cache" / "models" / "tiny-llama"


@pytest.fixture
def workdir(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "orch.yaml").write_text(
        "sampling:\n  max_tokens: 16\n  temperature: 0\nworkers:\n  heartbeat_interval: 1\n  checkpoint_interval: 1\n  lease_ttl: 20\n"
    )
    rows = [
        {"id": f"q{i}", "conversation": [{"role": "user", "content": f"Question {i}? " + "w " * (i % 7)}]}
        for i in range(140)
    ]
    write_jsonl(tmp_path / "q.jsonl", rows)
    assert (
        main(["prepare", "q.jsonl", "--run", "f", "--num-chunks", "4", "--id-column", "id", "--model", str(TINY)]) == 0
    )
    return tmp_path


@pytest.mark.usefixtures("workdir")
def test_estimate_without_a_probe_says_it_is_a_guess_with_a_wide_band(capsys):
    capsys.readouterr()
    assert main(["estimate", "--run", "f", "--model", str(TINY), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["kind"] == "guess" and "--probe" in doc["note"] and "parameters from config.json" in doc["note"]
    d = doc["candidates"][0]["duration_s"]
    assert d["p90"] >= 9 * d["p10"] > 0  # wide, and said to be a guess
    assert doc["output_tokens"] == {"p10": 224.0, "p50": 1120.0, "p90": 2240.0}


@pytest.mark.slow
def test_estimate_probe_rows_are_answered_once_and_skipped_by_the_run(workdir, capsys):
    if not (TINY / ".built").exists():
        pytest.fail("the tiny model is missing: run `make models`")
    capsys.readouterr()
    assert main(["estimate", "--run", "f", "--model", str(TINY), "--workers", "2", "--probe", "--json"]) == 0
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
