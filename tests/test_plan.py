"""`orch plan`: every chunk exactly once, balanced by work, deterministic, the SkyPilot example's shape."""

from __future__ import annotations

import json
import random

import pytest

from orchestrator.cli import main
from orchestrator.core.layout import RunLayout, chunk_id
from orchestrator.core.records import ManifestEntry
from orchestrator.core.store import open_store
from orchestrator.planning.plan import contiguous_split, plan_chunks, skypilot_example_split
from tests.support.datasets import write_lmsys_parquet


def entries(sizes):
    return [
        ManifestEntry(
            chunk=chunk_id(i, len(sizes)),
            key=f"chunks/{chunk_id(i, len(sizes))}.jsonl",
            rows=s,
            bytes=s,
            est_prompt_tokens=s,
            max_output_tokens=0,
        )
        for i, s in enumerate(sizes)
    ]


def test_plan_assigns_every_chunk_exactly_once():
    sizes = [random.Random(1).randint(1, 10) for _ in range(503)]
    plan = plan_chunks(entries(sizes), 16)
    assigned = [c for a in plan.workers for c in a.chunks]
    assert sorted(assigned) == sorted(e.chunk for e in entries(sizes))
    assert all(a.chunks == sorted(a.chunks) for a in plan.workers)


def test_plan_balances_by_work_not_chunk_count():
    # One huge chunk and many small ones: counting chunks would give a 2x imbalance.
    plan = plan_chunks(entries([100] + [10] * 20), 2)
    loads = sorted(a.est_tokens for a in plan.workers)
    assert loads == [150, 150]
    assert sorted(len(a.chunks) for a in plan.workers) == [6, 15]


def test_plan_of_skewed_chunks_is_within_five_percent_of_the_mean():
    rng = random.Random(7)
    plan = plan_chunks(entries([rng.randint(1000, 10000) for _ in range(20000)]), 200)
    loads = [a.est_tokens for a in plan.workers]
    assert max(loads) / (sum(loads) / len(loads)) <= 1.05


def test_plan_is_deterministic():
    sizes = [random.Random(3).randint(1, 100) for _ in range(300)]
    assert plan_chunks(entries(sizes), 7).workers == plan_chunks(entries(sizes), 7).workers


def test_plan_with_fewer_chunks_than_workers_leaves_some_empty():
    plan = plan_chunks(entries([5, 5, 5]), 5)
    assert sorted(len(a.chunks) for a in plan.workers) == [0, 0, 1, 1, 1]


def test_skypilot_example_split_drops_chunks_and_ours_does_not():
    chunks = [chunk_id(i, 200) for i in range(200)]
    assert sum(len(x) for x in skypilot_example_split(chunks, 16)) == 192  # 8 of 200 dropped
    assert sum(len(x) for x in contiguous_split(chunks, 16)) == 200


@pytest.fixture
def prepared(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    write_lmsys_parquet(tmp_path / "d", 400, files=2)
    store = str(tmp_path / "store")
    assert main(["prepare", str(tmp_path / "d"), "--run", "p", "--store", store, "--num-chunks", "20"]) == 0
    return store


def test_plan_command_writes_worker_lists_and_prints_a_table(prepared, capsys):
    assert main(["plan", "--run", "p", "--store", prepared, "--workers", "4"]) == 0
    out = capsys.readouterr().out
    assert "worker  chunks" in out and "20 chunks, 400 rows over 4 workers" in out
    store, layout = open_store(prepared), RunLayout("p")
    listed = []
    for w in range(4):
        lines = store.get(layout.worker_list(str(w))).data.decode().splitlines()
        assert all(line.startswith("chunks/part_") and line.endswith(".jsonl") for line in lines)
        listed += lines
    assert sorted(listed) == sorted(store.get(layout.metadata).data.decode().splitlines())


def test_plan_command_json_and_replanning_removes_old_lists(prepared, capsys):
    assert main(["plan", "--run", "p", "--store", prepared, "--workers", "6"]) == 0
    capsys.readouterr()
    assert main(["plan", "--run", "p", "--store", prepared, "--workers", "3", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert [w["worker"] for w in doc["workers"]] == [0, 1, 2]
    assert sum(len(w["chunks"]) for w in doc["workers"]) == 20 and sum(w["rows"] for w in doc["workers"]) == 400
    keys = [o.key for o in open_store(prepared).list("runs/p/workers/")]
    assert sorted(keys) == [f"runs/p/workers/{w}.txt" for w in range(3)]


def test_plan_says_when_workers_outnumber_chunks(prepared, capsys):
    assert main(["plan", "--run", "p", "--store", prepared, "--workers", "25"]) == 0
    assert "5 worker(s) have no chunk of their own" in capsys.readouterr().out


def test_plan_of_an_unprepared_run_says_what_to_do(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert main(["plan", "--run", "nothing", "--store", str(tmp_path / "s"), "--workers", "2"]) == 5
    err = capsys.readouterr().err
    assert "no manifest" in err and "orch prepare" in err


def test_plan_of_prefix_grouped_chunks_keeps_each_prefix_on_few_workers_and_balances():
    """24 chunks in prefix order, 8 prompt prefixes of 3 chunks each, 4 workers: every prefix on at
    most 2 workers (the spread greedy balancing gives them is wider), loads within one chunk."""
    chunks = []
    for i in range(24):
        edges = [f"p{i // 3}"] if i % 3 else [f"p{(i - 1) // 3}", f"p{i // 3}"] if i else ["p0"]
        chunks.append(
            ManifestEntry(
                chunk=chunk_id(i, 24),
                key="k",
                rows=10,
                bytes=1,
                est_prompt_tokens=100 + (i % 5) * 10,
                max_output_tokens=50,
                edge_prefixes=edges,
            )
        )
    plan = plan_chunks(chunks, 4)
    assert sorted(c for a in plan.workers for c in a.chunks) == [e.chunk for e in chunks]
    workers_of: dict[str, set[int]] = {}
    for a in plan.workers:
        for c in a.chunks:
            for p in chunks[int(c.split("_")[1])].edge_prefixes:
                workers_of.setdefault(p, set()).add(a.worker)
    assert max(len(w) for w in workers_of.values()) <= 2
    loads = [a.est_tokens for a in plan.workers]
    assert max(loads) - min(loads) <= max(e.est_tokens for e in chunks)
    greedy = plan_chunks([e.model_copy(update={"edge_prefixes": []}) for e in chunks], 4)
    spread = {
        p: {a.worker for a in greedy.workers for c in a.chunks if f"p{int(c.split('_')[1]) // 3}" == p}
        for p in workers_of
    }
    assert sum(map(len, spread.values())) > sum(map(len, workers_of.values()))
