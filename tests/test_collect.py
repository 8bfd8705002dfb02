"""`orch collect`: input order, exactly once, missing and failed rows reported and retryable."""

from __future__ import annotations

import json

import pytest

from orchestrator.cli import main
from orchestrator.collect.collect import collect
from orchestrator.core.errors import CorruptOutput, OutputError
from orchestrator.core.layout import RunLayout
from orchestrator.core.records import DoneMarker, PrepareError, read_manifest
from orchestrator.core.store import open_store
from tests.support.datasets import write_jsonl
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
    # One error row in seven is more than the default --max-error-rate: accepted here on purpose.
    partial = ["--allow-partial", "--max-error-rate", "1"]
    assert main(["collect", "--run", "c", "--store", store_uri, "--out", str(tmp_path / "o.jsonl"), *partial]) == 0


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
    out = ["--out", str(tmp_path / "o.parquet"), "--json", "--max-error-rate", "1"]
    assert main(["collect", "--run", "c", "--store", store_uri, *out]) == 0
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


def test_collect_answers_rows_set_aside_at_prepare_in_their_place(tmp_path, capsys, monkeypatch):
    """Lines prepare set aside are in the output, as error lines naming file:line, in input order,
    and in the retry file; they count in the totals and the error rate."""
    monkeypatch.chdir(tmp_path)
    store_uri = str(tmp_path / "s")
    good = [chat_request(f"g{i}", f"question {i}") for i in range(6)]
    lines = [
        good[0],
        {**good[1], "url": "/v1/embeddings"},  # an unknown url
        good[2],
        good[3],
        {"custom_id": "nomsg", "method": "POST", "url": "/v1/chat/completions", "body": {}},  # no messages
        good[4],
        good[5],
        b"{not json",
    ]
    write_jsonl(tmp_path / "in.jsonl", lines)
    assert (
        main(
            [
                "prepare",
                str(tmp_path / "in.jsonl"),
                "--run",
                "c",
                "--store",
                store_uri,
                "--format",
                "openai-batch",
                "--num-chunks",
                "2",
            ]
        )
        == 0
    )
    store = open_store(store_uri)
    layout = RunLayout("c")
    for entry in read_manifest(store, layout):
        ids = [json.loads(line)["custom_id"] for line in store.get(layout.chunk(entry.chunk)).data.splitlines()]
        answer_chunk(store, layout, entry.chunk, [[Answer(i, cid, f"answer {cid}") for i, cid in enumerate(ids)]])
    out = ["--out", str(tmp_path / "o.jsonl"), "--retry-out", str(tmp_path / "r.jsonl")]
    code = main(["collect", "--run", "c", "--store", store_uri, *out])
    stdout, err = capsys.readouterr()
    assert code == 9, err  # 3 errors of 8 rows: more than the default --max-error-rate
    assert "wrote 8 of 8 rows" in stdout and "3 error row(s) (3 set aside at prepare)" in stdout
    assert "3 of 8 rows are errors (37.5%" in err and "--max-error-rate 1.0" in err
    written = read_lines(tmp_path / "o.jsonl")
    # A line that is not JSON has no custom_id: it is answered under a stand-in naming its line.
    assert [line["custom_id"] for line in written] == ["g0", "g1", "g2", "g3", "nomsg", "g4", "g5", "line-8"]
    errors = {i: line["error"] for i, line in enumerate(written) if line["error"]}
    assert set(errors) == {1, 4, 7} and all(e["code"] == "invalid_request" for e in errors.values())
    assert errors[1]["message"].startswith(f"{tmp_path / 'in.jsonl'}:2: url '/v1/embeddings'")
    assert "in.jsonl:5: a chat request needs body.messages" in errors[4]["message"]
    assert "in.jsonl:8: not valid JSON" in errors[7]["message"]
    # The retry file has the lines as they were read, ready to be fixed and prepared again.
    assert (tmp_path / "r.jsonl").read_text().splitlines()[2] == "{not json"
    assert [json.loads(x)["custom_id"] for x in (tmp_path / "r.jsonl").read_text().splitlines()[:2]] == ["g1", "nomsg"]
    # The same output is accepted with a higher bar.
    assert main(["collect", "--run", "c", "--store", store_uri, *out, "--max-error-rate", "0.5"]) == 0
    capsys.readouterr()
    # status counts them too.
    assert main(["status", "--run", "c", "--store", store_uri, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["rows"]["set_aside"] == 3
    assert main(["status", "--run", "c", "--store", store_uri]) == 0
    assert "set aside at prepare 3" in capsys.readouterr().out


def test_collect_refuses_outputs_it_cannot_write_with_one_error_line(tmp_path, capsys):
    """An unknown ending is refused (never JSONL under a .csv name); a directory that refuses the
    file is an ERROR line with a hint, never a traceback; and nothing is written."""
    store_uri = str(tmp_path / "s")
    build(store_uri)
    base = ["collect", "--run", "c", "--store", store_uri, "--max-error-rate", "1"]
    assert main([*base, "--out", str(tmp_path / "x.csv")]) == 1
    err = capsys.readouterr().err
    assert "x.csv: orch writes .jsonl, .ndjson, .parquet files, not .csv" in err and "hint:" in err
    assert not (tmp_path / "x.csv").exists()
    (tmp_path / "a-file").write_text("")
    for out in (tmp_path / "a-file" / "o.jsonl", "/sys/o.jsonl"):  # not a directory; refused even to root
        assert main([*base, "--out", str(out)]) == 1
        err = capsys.readouterr().err
        assert err.startswith(f"ERROR cannot write {out}:") and "Traceback" not in err and "hint:" in err
    assert main([*base, "--out", str(tmp_path / "ok.jsonl"), "--retry-out", "/sys/retry.jsonl"]) == 1
    assert "cannot write /sys/retry.jsonl" in capsys.readouterr().err and not (tmp_path / "ok.jsonl").exists()
    assert main([*base, "--out", str(tmp_path / "x.csv"), "--format", "jsonl"]) == 0  # said explicitly: fine


def test_collect_embeddings_to_parquet_as_a_list_column(tmp_path):
    from worker.outputs import embedding_body

    store = open_store(str(tmp_path / "s"))
    lines = [
        {"custom_id": f"e{i}", "method": "POST", "url": "/v1/embeddings", "body": {"input": "x"}} for i in range(3)
    ]
    layout = make_run(store, "e", [lines], model="m", spec_flags={"model.runner": "pooling"})
    answers = [Answer(i, f"e{i}") for i in range(3)]
    vectors = [[[0.5, -0.25]], [[1.0, 0.0], [0.0, 1.0]], [[0.125, 0.75]]]
    for answer, vecs, encoding in zip(answers, vectors, ["float", "float", "base64"], strict=True):
        answer.line.response.body = embedding_body(vecs, encoding, 3, "m")
    answer_chunk(store, layout, "part_00000", [answers])
    collect(store, layout, tmp_path / "o.parquet")
    import pyarrow.parquet as pq

    table = pq.read_table(tmp_path / "o.parquet")
    assert table.column("embeddings").to_pylist() == vectors  # base64 vectors decoded
    assert table.column("prompt_tokens").to_pylist() == [3, 3, 3]


@pytest.mark.parametrize("name", ["o.jsonl", "o.parquet"])
def test_collect_failed_leaves_no_output_and_keeps_the_previous_one(tmp_path, capsys, name):
    """A collect that fails (rows missing: exit 7; a part changed under the run: exit 8) writes no
    output, leaves no temporary file, and a good output already at that path stays as it was."""
    store_uri = str(tmp_path / "s")
    store, layout = build(store_uri, answered=(0,))
    out = tmp_path / "out" / name
    base = ["collect", "--run", "c", "--store", store_uri, "--out", str(out), "--max-error-rate", "1"]
    assert main(base) == 7
    assert not out.exists() and list(out.parent.iterdir()) == []
    assert f"{out} was not written" in capsys.readouterr().err
    out.write_bytes(b"the good output of an earlier collect\n")
    retry = tmp_path / "out" / "retry.jsonl"
    retry.write_bytes(b"an earlier retry file\n")
    assert main(base) == 7
    assert out.read_bytes() == b"the good output of an earlier collect\n"
    assert sorted(p.name for p in out.parent.iterdir()) == sorted([name, "retry.jsonl"])
    # A part that no longer matches its marker stops collect half way: output and retry file kept.
    part = DoneMarker.model_validate_json(store.get(layout.done("part_00000")).data).parts[0]
    store.put(part.key, store.get(part.key).data.replace(b"zero", b"ZERO"))
    assert main([*base, "--allow-partial", "--retry-out", str(retry)]) == 8
    assert out.read_bytes() == b"the good output of an earlier collect\n"
    assert retry.read_bytes() == b"an earlier retry file\n"
    assert sorted(p.name for p in out.parent.iterdir()) == sorted([name, "retry.jsonl"])


LABEL_SCHEMA = {
    "type": "object",
    "properties": {
        "label": {"enum": ["billing", "account", "other"]},
        "urgent": {"type": "boolean"},
        "score": {"type": "integer"},
        "topics": {"type": "array", "items": {"type": "string"}},
        "text": {"type": "string"},  # a field named as a fixed column: answer_text
    },
    "required": ["label", "urgent"],
}
TICKETS = [
    {"ticket": f"T{i}", "subject": f"Subject {i}", "body": f"Body {i}", "priority": i, "tags": ["a", str(i)]}
    for i in range(6)
]
TICKETS[2] = {"ticket": "T2", "body": "no subject", "priority": 2, "tags": []}  # set aside: the template needs it
ANSWERS = {
    "T0": '{"label": "billing", "urgent": true, "score": 3, "topics": ["refund"], "text": "t"}',
    "T1": '{"label": "acc',  # cut at max_tokens
    "T3": '{"label": "spam", "urgent": false}',  # not one of the enum
    "T5": '{"label": "other", "urgent": false}',
}


@pytest.mark.parametrize("grouped", [False, True], ids=["input-order", "grouped-by-prefix"])
def test_collect_writes_a_typed_table_of_a_json_schema_run(tmp_path, capsys, monkeypatch, grouped):
    """The labelling job's table: one row per ticket in input order, the ticket id once, the kept
    input columns, the schema's fields typed, parse_error where the answer does not parse or hold
    to the schema, usage, the failed row's error, and the served name instead of a path."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    monkeypatch.chdir(tmp_path)
    store_uri = str(tmp_path / "s")
    write_jsonl(tmp_path / "tickets.jsonl", TICKETS)
    (tmp_path / "label.json").write_text(json.dumps(LABEL_SCHEMA))
    prepare = ["prepare", "tickets.jsonl", "--run", "t", "--store", store_uri, "--format", "text"]
    prepare += [
        "--template",
        "Subject: {subject}\nBody: {body}",
        "--id-column",
        "ticket",
        "--json-schema",
        "label.json",
    ]
    prepare += ["--num-chunks", "2", *(["--group-by-prefix"] if grouped else [])]
    assert main(prepare) == 0, capsys.readouterr().err
    store, layout = open_store(store_uri), RunLayout("t")
    for entry in read_manifest(store, layout):
        ids = [json.loads(line)["custom_id"] for line in store.get(layout.chunk(entry.chunk)).data.splitlines()]
        answers = [
            Answer(i, cid, ANSWERS.get(cid), error=None if cid in ANSWERS else "server_error")
            for i, cid in enumerate(ids)
        ]
        for answer in answers:
            if answer.line.response.body:  # as an older worker wrote it: the weights' path
                answer.line.response.body["model"] = "/models/SmolLM2-135M-Instruct"
        answer_chunk(store, layout, entry.chunk, [answers])
    base = ["collect", "--run", "t", "--store", store_uri, "--max-error-rate", "1"]
    assert main([*base, "--out", "t.parquet", "--keep-columns", "subject,priority,tags,ticket"]) == 0
    assert "(parquet table)" in capsys.readouterr().out
    table = pq.read_table("t.parquet")
    assert table.schema.names == [
        "ticket", "subject", "priority", "tags", "text", "label", "urgent", "score", "topics", "answer_text",
        "parse_error", "finish_reason", "prompt_tokens", "completion_tokens", "error_code", "error_message", "model",
        "reused", "escalated",
    ]  # fmt: skip
    types = {f.name: f.type for f in table.schema}
    assert types["priority"] == pa.int64() and types["urgent"] == pa.bool_() and types["score"] == pa.int64()
    assert types["topics"] == pa.list_(pa.string()) and types["tags"] == pa.string()  # an array column: JSON text
    rows = table.to_pylist()
    assert [r["ticket"] for r in rows] == ["T0", "T1", "T2", "T3", "T4", "T5"]
    assert [r["subject"] for r in rows] == ["Subject 0", "Subject 1", None, "Subject 3", "Subject 4", "Subject 5"]
    assert [r["priority"] for r in rows] == [0, 1, 2, 3, 4, 5] and rows[0]["tags"] == '["a", "0"]'
    assert {k: rows[0][k] for k in ("label", "urgent", "score", "topics", "answer_text", "parse_error")} == {
        "label": "billing",
        "urgent": True,
        "score": 3,
        "topics": ["refund"],
        "answer_text": "t",
        "parse_error": None,
    }
    assert rows[0]["prompt_tokens"] == 3 and rows[0]["completion_tokens"] == 2 and rows[0]["finish_reason"] == "stop"
    assert rows[0]["model"] == "SmolLM2-135M-Instruct"
    assert rows[1]["label"] is None and rows[1]["parse_error"].startswith("not JSON")
    assert rows[2]["error_code"] == "invalid_request" and "names column(s) 'subject'" in rows[2]["error_message"]
    assert rows[3]["label"] is None and "does not hold to the schema at label" in rows[3]["parse_error"]
    assert rows[4]["error_code"] == "server_error" and rows[4]["text"] is None and rows[4]["parse_error"] is None
    assert (rows[5]["label"], rows[5]["urgent"], rows[5]["score"]) == ("other", False, None)
    # The wire format stays: OpenAI Batch lines, custom_id and all.
    assert main([*base, "--out", "wire.parquet.jsonl", "--format", "openai"]) == 0
    wire = read_lines(tmp_path / "wire.parquet.jsonl")
    assert [line["custom_id"] for line in wire] == ["T0", "T1", "T2", "T3", "T4", "T5"] and "response" in wire[0]
    # The table as JSON lines, when asked for.
    assert main([*base, "--out", "t.jsonl", "--format", "table", "--keep-columns", "tags"]) == 0
    lines = read_lines(tmp_path / "t.jsonl")
    assert lines[0]["tags"] == ["a", "0"] and lines[0]["topics"] == ["refund"] and "custom_id" not in lines[0]


def test_collect_refuses_a_kept_column_the_input_does_not_have(tmp_path, capsys, monkeypatch):
    """Named before anything is written, with the columns there are; and the input must be the one
    prepared."""
    monkeypatch.chdir(tmp_path)
    store_uri = str(tmp_path / "s")
    write_jsonl(tmp_path / "tickets.jsonl", TICKETS)
    prepare = ["prepare", "tickets.jsonl", "--run", "t", "--store", store_uri, "--format", "text"]
    assert main([*prepare, "--text-column", "body", "--id-column", "ticket"]) == 0
    store, layout = open_store(store_uri), RunLayout("t")
    answer_chunk(store, layout, "part_00000", [[Answer(i, f"T{i}", "x") for i in range(6)]])
    capsys.readouterr()
    base = ["collect", "--run", "t", "--store", store_uri, "--out", "t.parquet"]
    assert main([*base, "--keep-columns", "subjet"]) == 1
    err = capsys.readouterr().err
    assert "no column 'subjet' in the run's input (tickets.jsonl)" in err
    assert "body, priority, subject, tags, ticket" in err and not (tmp_path / "t.parquet").exists()
    (tmp_path / "tickets.jsonl").write_text((tmp_path / "tickets.jsonl").read_text().replace("Body 1", "Body 9"))
    assert main([*base, "--keep-columns", "subject"]) == 1
    assert "changed since prepare" in capsys.readouterr().err and not (tmp_path / "t.parquet").exists()
    # Without kept columns the input is not read: the table is written from the run alone.
    assert main(base) == 0
    import pyarrow.parquet as pq

    table = pq.read_table(tmp_path / "t.parquet")
    assert "embeddings" not in table.schema.names and "parse_error" not in table.schema.names


def test_served_name_is_never_a_path():
    from orchestrator.core.model_source import served_name

    assert served_name("/data/models/Llama-3.1-8B/", {}) == "Llama-3.1-8B"
    assert served_name("./q/SmolLM2.Q4_1.gguf", {}) == "SmolLM2.Q4_1"
    assert served_name("meta-llama/Llama-3.1-8B", {}) == "meta-llama/Llama-3.1-8B"
    assert served_name("/data/m", {"served_model_name": ["llama", "alias"]}) == "llama"


def test_run_refuses_a_kept_column_before_any_worker_is_launched(tmp_path, capsys, monkeypatch):
    """`orch run --keep-columns` checks the columns right after prepare: a misspelt one costs no
    worker (the run stays prepared, and the same command with the right name goes on)."""
    from pathlib import Path

    model = Path(__file__).resolve().parents[1] / ".cache/models/tiny-llama"
    monkeypatch.chdir(tmp_path)
    store_uri = str(tmp_path / "s")
    write_jsonl(tmp_path / "tickets.jsonl", TICKETS)
    run = ["run", "tickets.jsonl", "--run", "t", "--store", store_uri, "--model", str(model), "--format", "text"]
    code = main([*run, "--text-column", "body", "--out", "t.parquet", "--keep-columns", "subjet"])
    assert code == 1
    err = capsys.readouterr().err
    assert "no column 'subjet' in the run's input (tickets.jsonl)" in err
    store, layout = open_store(store_uri), RunLayout("t")
    assert read_manifest(store, layout)  # prepared, and kept
    assert store.head(layout.jobs) is None  # no worker launched
    assert not (tmp_path / "t.parquet").exists()


def test_collect_never_writes_two_lines_with_one_id(tmp_path, capsys):
    """A run prepared before prepare refused repeated ids: the repeat was set aside at prepare, and
    collect wrote it beside the first row's answer (`wrote 403 of 403`, exit 0). Now no output,
    a non-zero exit, and the id named with both places."""
    store_uri = str(tmp_path / "s")
    store, layout = build(store_uri)
    repeat = PrepareError(
        source="in.jsonl", line=9, error="duplicate custom_id 'a1' (first at in.jsonl:2)", position=7, custom_id="a1"
    )
    store.put(layout.prepare_errors, repeat.to_bytes() + b"\n")
    out = tmp_path / "out.jsonl"
    assert main(["collect", "--run", "c", "--store", store_uri, "--out", str(out)]) == OutputError.exit_code
    err = capsys.readouterr().err
    assert "1 custom_id(s) would be written on two lines" in err
    assert "'a1': chunk part_00000 line 2, set aside at prepare (in.jsonl:9: duplicate custom_id" in err
    assert not out.exists()
    store.delete(layout.prepare_errors)
    assert main(["collect", "--run", "c", "--store", store_uri, "--out", str(out), "--max-error-rate", "1"]) == 0
    assert len(read_lines(out)) == 7
