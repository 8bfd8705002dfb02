"""`orch prepare --group-by-prefix`: chunks hold few prompt prefixes, collect still writes input order."""

from __future__ import annotations

import json
import random
import subprocess
import sys

import pytest

from orchestrator.cli import main
from orchestrator.core.layout import RunLayout
from orchestrator.core.records import read_manifest
from orchestrator.core.records import write_jsonl as records_jsonl
from orchestrator.core.store import open_store
from orchestrator.prepare.formats import Request
from orchestrator.prepare.grouping import PrefixSorter
from tests.support.datasets import write_jsonl
from tests.support.runs import Answer, answer_chunk

TEMPLATES = [f"Template {t}: " + f"you label texts of kind {t}. " * 60 for t in range(12)]


def shared_prefix_rows(n: int, seed: int = 1) -> list[dict]:
    rng = random.Random(seed)
    rows = [
        {
            "id": f"r{i}",
            "messages": [{"role": "system", "content": TEMPLATES[i % 12]}, {"role": "user", "content": f"q{i}"}],
        }
        for i in range(n)
    ]
    rng.shuffle(rows)
    return rows


#: How the test rows (an id and a conversation with its system message) become requests.
CHATS = ["--id-column", "id", "--conversation-column", "messages", "--turns", "all"]


@pytest.fixture
def store_dir(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    return str(tmp_path / "store")


def chunk_ids(store, layout, entry):
    return [json.loads(line)["custom_id"] for line in store.get(layout.chunk(entry.chunk)).data.splitlines()]


def test_grouped_chunks_hold_few_prefixes_and_collect_keeps_input_order(store_dir, tmp_path):
    rows = shared_prefix_rows(240)
    lines = [*rows[:100], b"{not json", *rows[100:]]  # a bad row: set aside, answered in its place
    write_jsonl(tmp_path / "in.jsonl", lines)
    args = ["prepare", str(tmp_path / "in.jsonl"), "--run", "g", "--store", store_dir]
    assert main([*args, *CHATS, "--num-chunks", "12", "--group-by-prefix"]) == 0
    store, layout = open_store(store_dir), RunLayout("g")
    entries = read_manifest(store, layout)
    assert len(entries) == 12 and sum(e.rows for e in entries) == 240
    system_of = {r["id"]: r["messages"][0]["content"] for r in rows}
    for entry in entries:
        ids = chunk_ids(store, layout, entry)
        prefixes = [system_of[i] for i in ids]
        # 20 rows of each template, 20 rows a chunk: one prefix per chunk, rows in input order within it.
        assert len(set(prefixes)) == 1 and entry.prefix_groups == 1
        assert entry.est_shared_tokens > 19 * 200 and entry.first is None and len(entry.edge_prefixes) == 1
        positions = [int(p) for p in store.get(layout.chunk_positions(entry.chunk)).data.split()]
        assert positions == sorted(positions) and len(positions) == entry.rows
    assert len({e.edge_prefixes[0] for e in entries}) == 12
    # Every chunk answered by the protocol's own objects, in its (prefix) order; collect restores input order.
    for entry in entries:
        ids = chunk_ids(store, layout, entry)
        answer_chunk(store, layout, entry.chunk, [[Answer(i, cid, f"a {cid}") for i, cid in enumerate(ids)]])
    assert main(["collect", "--run", "g", "--store", store_dir, "--out", str(tmp_path / "o.jsonl")]) == 0
    written = [json.loads(line) for line in (tmp_path / "o.jsonl").read_text().split("\n") if line]
    expected = [r["id"] for r in rows[:100]] + ["line-101"] + [r["id"] for r in rows[100:]]
    assert [line["custom_id"] for line in written] == expected
    assert written[101]["response"]["body"]["choices"][0]["message"]["content"] == f"a {rows[100]['id']}"
    # The same input again: already prepared; ungrouped, the same rows give input-order chunks.
    assert main([*args, *CHATS, "--num-chunks", "12", "--group-by-prefix"]) == 0
    plain = ["prepare", str(tmp_path / "in.jsonl"), "--run", "p", "--store", store_dir, *CHATS]
    assert main([*plain, "--num-chunks", "12"]) == 0
    first = read_manifest(store, RunLayout("p"))[0]
    assert first.positions is None and chunk_ids(store, RunLayout("p"), first) == [r["id"] for r in rows[:20]]


def answered_grouped_run(tmp_path, store_dir, run: str):
    """A grouped run of 60 rows in 3 chunks (one bad row set aside), every chunk answered."""
    rows = shared_prefix_rows(60)
    write_jsonl(tmp_path / "in.jsonl", [*rows[:30], b"{not json", *rows[30:]])
    args = ["prepare", str(tmp_path / "in.jsonl"), "--run", run, "--store", store_dir, *CHATS]
    assert main([*args, "--num-chunks", "3", "--group-by-prefix"]) == 0
    store, layout = open_store(store_dir), RunLayout(run)
    for entry in read_manifest(store, layout):
        ids = chunk_ids(store, layout, entry)
        answer_chunk(store, layout, entry.chunk, [[Answer(i, cid, f"a {cid}") for i, cid in enumerate(ids)]])
    return store, layout


#: Ways a positions file gets damaged (its data, the first chunk's): each leaves a file collect could still parse.
DAMAGES = {
    "cut in half": lambda data, _first: data[: len(data) // 2],
    "rewritten as zeros": lambda data, _first: b"0\n" * data.count(b"\n"),
    "two lines swapped": lambda data, _first: b"\n".join([*reversed(data.split(b"\n")[:2]), *data.split(b"\n")[2:]]),
    "a row of another chunk": lambda data, first: first.split(b"\n")[0] + data[data.index(b"\n") :],
    "the place of a set-aside row": lambda data, _first: b"30" + data[data.index(b"\n") :],
}


@pytest.mark.parametrize("damage", DAMAGES)
@pytest.mark.parametrize("recorded", [True, False], ids=["checksum", "prepared-before-checksums"])
def test_collect_refuses_a_damaged_positions_file(store_dir, tmp_path, capsys, damage, recorded):
    """A positions file cut short, zeroed or reordered: exit 8 naming the file, no output written.
    Runs prepared before the manifest recorded a checksum still get the permutation check (a
    reordering within the file is then all that can pass, as it could not be told from the input)."""
    store, layout = answered_grouped_run(tmp_path, store_dir, "d")
    entries = read_manifest(store, layout)
    assert all(e.positions_sha256 for e in entries)
    if not recorded:
        store.put(layout.manifest, records_jsonl([e.model_copy(update={"positions_sha256": None}) for e in entries]))
    key = layout.chunk_positions(entries[1].chunk)
    first = store.get(layout.chunk_positions(entries[0].chunk)).data
    store.put(key, DAMAGES[damage](store.get(key).data, first))
    out = tmp_path / "o.jsonl"
    code = main(
        ["collect", "--run", "d", "--store", store_dir, "--out", str(out), "--retry-out", str(tmp_path / "r.jsonl")]
    )
    if damage == "two lines swapped" and not recorded:
        assert code == 0  # a permutation still: without a checksum nothing tells it from the original
        return
    err = capsys.readouterr().err
    assert code == 8, err
    assert key in err and "positions file of" in err and "input order" in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.jsonl", "store"]  # no output, no temp left


def test_collect_of_a_grouped_run_prepared_before_checksums_keeps_input_order(store_dir, tmp_path):
    store, layout = answered_grouped_run(tmp_path, store_dir, "old")
    entries = read_manifest(store, layout)
    store.put(layout.manifest, records_jsonl([e.model_copy(update={"positions_sha256": None}) for e in entries]))
    assert main(["collect", "--run", "old", "--store", store_dir, "--out", str(tmp_path / "o.jsonl")]) == 0
    written = [json.loads(line)["custom_id"] for line in (tmp_path / "o.jsonl").read_text().splitlines()]
    rows = shared_prefix_rows(60)
    assert written == [r["id"] for r in rows[:30]] + ["line-31"] + [r["id"] for r in rows[30:]]


@pytest.mark.parametrize("fan_in", [128, 4])
def test_the_external_sort_spills_runs_and_merges_them_in_order(fan_in):
    """Runs spilled as memory fills, merged in order; more runs than the fan-in (open files at
    once) are merged in rounds first."""
    sorter = PrefixSorter(prefix_chars=64, run_bytes=4096, fan_in=fan_in)
    rng = random.Random(3)
    expected = []
    for position in range(2000):
        template = rng.randrange(30)
        line = f'{{"custom_id":"c{position}","method":"POST","url":"/v1/chat/completions","body":{{"p":"{template:03d}"}}}}\n'
        sorter.add(Request(f"c{position}", line.encode(), 5, 7), position)
        expected.append((template, position))
    try:
        assert len(sorter.runs) > 10  # spilled: memory bounded by run_bytes
        got = [(int(json.loads(line)["body"]["p"]), pos) for _head, pos, line, *_ in sorter.sorted_rows()]
        assert got == sorted(expected)
    finally:
        sorter.discard()


@pytest.mark.slow  # a large input
def test_grouped_prepare_of_a_large_input_stays_within_bounded_memory(tmp_path):
    """200,000 rows (over 300 MiB of input) through a separate process: its peak RSS stays well
    below what holding the rows would take (runs of 64 MiB spilled, then merged)."""
    data = tmp_path / "big.jsonl"
    with open(data, "w") as f:
        for i in range(200_000):
            system = TEMPLATES[i % 12] + "x" * 200
            f.write(
                json.dumps(
                    {
                        "id": f"r{i}",
                        "messages": [{"role": "system", "content": system}, {"role": "user", "content": f"q{i}"}],
                    }
                )
                + "\n"
            )
    # The peak is this process image's VmHWM: getrusage's ru_maxrss also keeps the high-water mark of
    # the image before exec, i.e. of the forked test process (460 MiB late in a full suite).
    script = (
        "import sys\nfrom orchestrator.cli import main\n"
        "code = main(sys.argv[1:])\n"
        "print(next(l.split()[1] for l in open('/proc/self/status') if l.startswith('VmHWM:')))\n"
        "sys.exit(code)\n"
    )
    args = ["prepare", str(data), "--run", "b", "--store", str(tmp_path / "s"), *CHATS]
    done = subprocess.run(
        [sys.executable, "-c", script, *args, "--num-chunks", "40", "--group-by-prefix"],
        capture_output=True,
        text=True,
        check=True,
        cwd=tmp_path,
    )
    peak_mib = int(done.stdout.split()[-1]) / 1024
    assert data.stat().st_size > 300 * 2**20
    assert peak_mib < 400, done.stdout
    entries = read_manifest(open_store(str(tmp_path / "s")), RunLayout("b"))
    assert sum(e.rows for e in entries) == 200_000 and max(e.prefix_groups or 0 for e in entries) <= 2
