"""`orch collect`: input order, exactly once, missing and failed rows reported and retryable."""

from __future__ import annotations

import json

import pytest

from orchestrator.cli import main
from orchestrator.collect import CorruptOutput, collect
from orchestrator.core.records import DoneMarker
from orchestrator.core.store import open_store
from tests.support.runs import Answer, answer_chunk, chat_request, make_run


def requests(prefix, n):
    return [chat_request(f"{prefix}{i}", f"question {prefix}{i}") for i in range(n)]


def build(store_uri, answered=(0, 1)):
    store = open_store(store_uri)
    layout = make_run(store, "c", [requests("a", 4), requests("b", 3)], model="m")
    if 0 in answered:  # rows finished out of order, over two parts
        answer_chunk(
            store,
            layout,
            "part_00000",
            [
                [Answer(2, "a2", "two"), Answer(0, "a0", "zero")],
                [Answer(3, "a3", error="context_length_exceeded"), Answer(1, "a1", "one")],
            ],
        )
    if 1 in answered:
        answer_chunk(store, layout, "part_00001", [[Answer(i, f"b{i}", f"b{i}") for i in range(3)]])
    return store, layout


def read_lines(path):
    return [json.loads(line) for line in open(path)]


def test_collect_writes_every_row_in_input_order(store_uri, tmp_path):
    store, layout = build(store_uri)
    report = collect(store, layout, tmp_path / "out.jsonl", retry_out=tmp_path / "retry.jsonl")
    assert report.complete and report.rows_written == 7 and report.errors == 1
    lines = read_lines(tmp_path / "out.jsonl")
    assert [line["custom_id"] for line in lines] == ["a0", "a1", "a2", "a3", "b0", "b1", "b2"]
    assert lines[0]["response"]["body"]["choices"][0]["message"]["content"] == "zero"
    assert lines[3]["error"]["code"] == "context_length_exceeded"
    # The failed request, as it was sent, ready for another run.
    assert [r["custom_id"] for r in read_lines(tmp_path / "retry.jsonl")] == ["a3"]


def test_collect_reports_a_chunk_without_marker_as_missing(tmp_path, capsys):
    store_uri = str(tmp_path / "s")
    build(store_uri, answered=(0,))
    code = main(
        [
            "collect",
            "--run",
            "c",
            "--store",
            store_uri,
            "--out",
            str(tmp_path / "o.jsonl"),
            "--retry-out",
            str(tmp_path / "r.jsonl"),
        ]
    )
    assert code == 7
    out, err = capsys.readouterr()
    assert "3 row(s) missing" in out and "part_00001" in out and "incomplete" in err
    assert [r["custom_id"] for r in read_lines(tmp_path / "r.jsonl")] == ["a3", "b0", "b1", "b2"]
    assert (
        main(["collect", "--run", "c", "--store", store_uri, "--out", str(tmp_path / "o.jsonl"), "--allow-partial"])
        == 0
    )


def test_collect_never_writes_a_row_twice_and_ignores_unlisted_parts(tmp_path):
    store, layout = build(str(tmp_path / "s"))
    # A buggy worker: the marker lists the same part twice, and a stray part nobody lists exists.
    key = layout.done("part_00001")
    marker = DoneMarker.model_validate_json(store.get(key).data)
    store.put(key, marker.model_copy(update={"parts": marker.parts * 2}).to_bytes())
    store.put(layout.output_part("part_00001", "zombie", 1), b'{"id": "batch_req_part_00001-0", "custom_id": "b0"}\n')
    report = collect(store, layout, tmp_path / "o.jsonl")
    assert report.duplicates == 3 and not report.complete
    assert [line["custom_id"] for line in read_lines(tmp_path / "o.jsonl")].count("b0") == 1


def test_collect_stops_on_a_part_that_does_not_match_its_marker(tmp_path):
    store, layout = build(str(tmp_path / "s"))
    part = DoneMarker.model_validate_json(store.get(layout.done("part_00000")).data).parts[0]
    store.put(part.key, store.get(part.key).data.replace(b"zero", b"ZERO"))
    with pytest.raises(CorruptOutput, match=part.key):
        collect(store, layout, tmp_path / "o.jsonl")
    assert not (tmp_path / "o.jsonl").exists()  # no half-written output


def test_collect_to_parquet_with_flattened_columns(tmp_path, capsys):
    store_uri = str(tmp_path / "s")
    build(store_uri)
    assert main(["collect", "--run", "c", "--store", store_uri, "--out", str(tmp_path / "o.parquet"), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["rows_written"] == 7
    import pyarrow.parquet as pq

    table = pq.read_table(tmp_path / "o.parquet")
    assert table.column("custom_id").to_pylist() == ["a0", "a1", "a2", "a3", "b0", "b1", "b2"]
    assert table.column("text").to_pylist()[:3] == ["zero", "one", "two"]
    assert table.column("error_code").to_pylist()[3] == "context_length_exceeded"


def test_collect_reads_parquet_parts(tmp_path):
    store = open_store(str(tmp_path / "s"))
    layout = make_run(store, "pq", [requests("p", 2)], model="m")
    answer_chunk(
        store, layout, "part_00000", [[Answer(1, "p1", "one")], [Answer(0, "p0", "zero")]], output_format="parquet"
    )
    collect(store, layout, tmp_path / "o.jsonl")
    assert [line["custom_id"] for line in read_lines(tmp_path / "o.jsonl")] == ["p0", "p1"]
