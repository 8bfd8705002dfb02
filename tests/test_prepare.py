"""`orch prepare` from the user's side: every format and source kind, bad rows, idempotent reruns."""

from __future__ import annotations

import hashlib
import json
import os

import pytest

from orchestrator.cli import main
from orchestrator.core.layout import RunLayout
from orchestrator.core.records import ManifestEntry, read_jsonl
from orchestrator.core.store import open_store
from tests.support.datasets import write_jsonl, write_lmsys_parquet


def prepare(store_uri, *args, run="r"):
    return main(["prepare", *map(str, args), "--run", run, "--store", store_uri])


def manifest(store_uri, run="r"):
    store = open_store(store_uri)
    return read_jsonl(ManifestEntry, store.get(RunLayout(run).manifest).data, "manifest")


def chunk_lines(store_uri, run="r"):
    store, layout = open_store(store_uri), RunLayout(run)
    lines = []
    for entry in manifest(store_uri, run):
        lines += [json.loads(line) for line in store.get(layout.chunk(entry.chunk)).data.splitlines()]
    return lines


@pytest.fixture
def store_dir(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # no stray orch.yaml from elsewhere
    return str(tmp_path / "store")


def test_prepare_lmsys_parquet_directory_first_user_turn(store_dir, tmp_path, capsys):
    write_lmsys_parquet(tmp_path / "lmsys", 600, files=3, turns=(2,))
    assert prepare(store_dir, tmp_path / "lmsys", "--num-chunks", "7", "--id-column", "conversation_id") == 0
    entries = manifest(store_dir)
    assert len(entries) == 7 and sum(e.rows for e in entries) == 600
    assert max(e.rows for e in entries) - min(e.rows for e in entries) <= 1
    lines = chunk_lines(store_dir)
    assert len({line["custom_id"] for line in lines}) == 600
    first = lines[0]
    assert first["url"] == "/v1/chat/completions" and first["method"] == "POST"
    assert [m["role"] for m in first["body"]["messages"]] == ["user"]
    assert "prepared run 'r': 7 chunks, 600 rows" in capsys.readouterr().out
    store = open_store(store_dir)
    assert store.get(RunLayout("r").metadata).data.decode().splitlines() == [e.key for e in entries]


def test_prepare_chat_all_turns_up_to_last_user_turn_with_system_prompt(store_dir, tmp_path):
    conv = [
        {"role": "user", "content": "a"},
        {"role": "assistant", "content": "b"},
        {"role": "user", "content": "c"},
        {"role": "assistant", "content": "d"},
    ]
    write_jsonl(tmp_path / "c.jsonl", [{"conversation": conv}])
    assert (
        prepare(
            store_dir, tmp_path / "c.jsonl", "--turns", "all", "--system-prompt", "Be brief.", "--rows-per-chunk", "10"
        )
        == 0
    )
    messages = chunk_lines(store_dir)[0]["body"]["messages"]
    assert [m["content"] for m in messages] == ["Be brief.", "a", "b", "c"]


def test_prepare_openai_batch_keeps_per_request_parameters(store_dir, tmp_path):
    rows = [
        {
            "custom_id": f"id-{i}",
            "method": "POST",
            "url": "/v1/chat/completions",
            "body": {"messages": [{"role": "user", "content": f"q{i}"}], "temperature": 0.1 * i, "max_tokens": 5 + i},
        }
        for i in range(5)
    ]
    write_jsonl(tmp_path / "b.jsonl", rows)
    assert prepare(store_dir, tmp_path / "b.jsonl", "--format", "openai-batch", "--num-chunks", "2") == 0
    lines = chunk_lines(store_dir)
    assert [line["custom_id"] for line in lines] == [f"id-{i}" for i in range(5)]
    assert [line["body"]["max_tokens"] for line in lines] == [5, 6, 7, 8, 9]
    assert sum(e.max_output_tokens for e in manifest(store_dir)) == 35


def test_prepare_takes_responses_lines_with_their_max_output_tokens(store_dir, tmp_path, capsys):
    def line(custom_id: str, body: dict) -> dict:
        return {"custom_id": custom_id, "method": "POST", "url": "/v1/responses", "body": body}

    rows = [line("r0", {"input": "Hello", "max_output_tokens": 7}), line("r1", {"instructions": "Be brief."})]
    write_jsonl(tmp_path / "b.jsonl", rows)
    assert prepare(store_dir, tmp_path / "b.jsonl", "--format", "openai-batch", "--num-chunks", "1") == 0
    assert [row["custom_id"] for row in chunk_lines(store_dir)] == ["r0"]
    assert manifest(store_dir)[0].max_output_tokens == 7
    assert "a responses request needs body.input" in capsys.readouterr().out


def test_prepare_completion_objects_like_the_fm_runner(store_dir, tmp_path):
    row = {
        "best_of": 1,
        "echo": False,
        "engine": "gpt-j-6b",
        "logprobs": 1,
        "max_tokens": 2,
        "n": 1,
        "prompt": "Passage: ...\\nAnswer:",
        "stop": ["\\n"],
        "temperature": 0.0,
        "top_p": 1,
    }
    write_jsonl(tmp_path / "fm.jsonl.gz", [row, row], gz=True)
    assert prepare(store_dir, tmp_path / "fm.jsonl.gz", "--format", "completion", "--num-chunks", "1") == 0
    lines = chunk_lines(store_dir)
    assert [line["custom_id"] for line in lines] == ["fm.jsonl.gz:1", "fm.jsonl.gz:2"]
    body = lines[0]["body"]
    assert lines[0]["url"] == "/v1/completions" and "engine" not in body
    assert body["logprobs"] == 1 and body["stop"] == ["\\n"] and body["prompt"].startswith("Passage")


def test_prepare_text_through_a_template(store_dir, tmp_path):
    """Columns by name; `{text:.7}` cuts a long column to its first 7 characters."""
    write_jsonl(tmp_path / "t.jsonl", [{"text": "the sea, and every wave of it", "lang": "French"}])
    assert (
        prepare(
            store_dir,
            tmp_path / "t.jsonl",
            "--format",
            "text",
            "--template",
            "Translate {text:.7} into {lang}.",
            "--num-chunks",
            "1",
        )
        == 0
    )
    assert chunk_lines(store_dir)[0]["body"]["messages"] == [
        {"role": "user", "content": "Translate the sea into French."}
    ]


def test_prepare_sets_bad_rows_aside_with_file_and_line(store_dir, tmp_path, capsys):
    good = {"conversation": [{"role": "user", "content": "hi"}]}
    write_jsonl(
        tmp_path / "mixed.jsonl",
        [good, b"{broken", {"conversation": []}, good, {"conversation": [{"role": "assistant", "content": "x"}]}],
    )
    assert prepare(store_dir, tmp_path / "mixed.jsonl", "--num-chunks", "2") == 0
    assert sum(e.rows for e in manifest(store_dir)) == 2
    out = capsys.readouterr().out
    assert "3 bad row(s) set aside" in out
    # The first bad rows are shown where the user looks, with file and line.
    shown = [line.strip() for line in out.splitlines() if "mixed.jsonl:" in line]
    assert [line.split(": ", 1)[0].rsplit(":", 1)[1] for line in shown] == ["2", "3", "5"]
    assert "not valid JSON" in shown[0]
    errors = [json.loads(line) for line in open_store(store_dir).get(RunLayout("r").prepare_errors).data.splitlines()]
    assert [(e["line"], e["source"].endswith("mixed.jsonl")) for e in errors] == [(2, True), (3, True), (5, True)]
    assert "not valid JSON" in errors[0]["error"] and "no user turn" in errors[2]["error"]


def test_prepare_refuses_nan_and_infinity_which_json_has_not(store_dir, tmp_path):
    """Python's json reads them; written out again a NaN became null, so the row would have run
    with the parameter's default instead of failing."""
    line = '{"custom_id":"%s","method":"POST","url":"/v1/chat/completions","body":{"messages":[{"role":"user","content":"hi"}],"temperature":%s}}'
    rows = [(line % ("ok", "0.5")).encode(), (line % ("nan", "NaN")).encode(), (line % ("inf", "-Infinity")).encode()]
    write_jsonl(tmp_path / "in.jsonl", rows)
    assert prepare(store_dir, tmp_path / "in.jsonl", "--format", "openai-batch", "--num-chunks", "1") == 0
    assert [r["custom_id"] for r in chunk_lines(store_dir)] == ["ok"]
    errors = [json.loads(e) for e in open_store(store_dir).get(RunLayout("r").prepare_errors).data.splitlines()]
    assert [e["line"] for e in errors] == [2, 3]
    assert "not valid JSON: NaN is not a JSON value" in errors[0]["error"]
    assert "-Infinity is not a JSON value" in errors[1]["error"]


def test_prepare_strict_stops_at_the_first_bad_row(store_dir, tmp_path, capsys):
    write_jsonl(tmp_path / "bad.jsonl", [{"conversation": [{"role": "user", "content": "hi"}]}, b"[1, 2]"])
    assert prepare(store_dir, tmp_path / "bad.jsonl", "--num-chunks", "1", "--strict") == 4
    err = capsys.readouterr().err
    assert "bad.jsonl:2" in err and "JSON object" in err
    assert open_store(store_dir).head(RunLayout("r").manifest) is None


@pytest.mark.parametrize("grouping", [[], ["--group-by-prefix"]])
def test_prepare_refuses_a_repeated_custom_id_naming_both_lines(store_dir, tmp_path, capsys, grouping):
    """Two rows with one id would be two output lines for it (the answer and an error row, before):
    prepare lists each repeat with both places, across files too, and writes nothing; the same
    rows without --id-column (ids file:line) prepare."""
    turn = [{"role": "user", "content": "x"}]
    (tmp_path / "d").mkdir()
    write_jsonl(tmp_path / "d" / "a.jsonl", [{"id": i, "conversation": turn} for i in ("a", "b", "a", "c")])
    write_jsonl(tmp_path / "d" / "b.jsonl", [{"id": i, "conversation": turn} for i in ("c", "d")])
    args = [tmp_path / "d", "--num-chunks", "2", *grouping]
    for check in ([], ["--check"]):
        assert prepare(store_dir, *args, "--id-column", "id", *check) == 4
        err = capsys.readouterr().err
        assert "2 row(s) repeat a custom_id of an earlier row" in err
        assert f"'a': {tmp_path / 'd' / 'a.jsonl'}:1 and {tmp_path / 'd' / 'a.jsonl'}:3" in err
        assert f"'c': {tmp_path / 'd' / 'a.jsonl'}:4 and {tmp_path / 'd' / 'b.jsonl'}:1" in err
        assert not os.path.exists(store_dir)
    assert prepare(store_dir, *args) == 0
    assert len(chunk_lines(store_dir)) == 6


def test_prepare_rerun_is_idempotent(store_dir, tmp_path, capsys):
    write_lmsys_parquet(tmp_path / "d", 100, files=2)
    assert prepare(store_dir, tmp_path / "d", "--num-chunks", "4") == 0
    store = open_store(store_dir)
    before = {
        o.key: store.get(o.key).data for o in store.list("runs/r/") if "/chunks/" in o.key or o.key.endswith(".txt")
    }
    assert prepare(store_dir, tmp_path / "d", "--num-chunks", "4") == 0
    assert "already prepared" in capsys.readouterr().out
    after = {
        o.key: store.get(o.key).data for o in store.list("runs/r/") if "/chunks/" in o.key or o.key.endswith(".txt")
    }
    assert after == before
    assert store.get(RunLayout("r").metadata).data.decode().count("\n") == 4


def test_prepare_refuses_a_changed_format_or_other_data_on_the_same_run(store_dir, tmp_path, capsys):
    write_jsonl(tmp_path / "a.jsonl", [{"text": "x"}])
    write_jsonl(tmp_path / "b.jsonl", [{"text": "y"}])
    assert prepare(store_dir, tmp_path / "a.jsonl", "--format", "text", "--num-chunks", "1") == 0
    assert prepare(store_dir, tmp_path / "a.jsonl", "--format", "completion", "--num-chunks", "1") == 3
    assert 'input.format: "text" (frozen) != "completion" (now)' in capsys.readouterr().err
    assert prepare(store_dir, tmp_path / "b.jsonl", "--format", "text", "--num-chunks", "1") == 4
    assert "prepared from other inputs" in capsys.readouterr().err


def test_prepare_missing_inputs_and_columns_are_clear_errors(store_dir, tmp_path, capsys):
    assert prepare(store_dir, tmp_path / "nope.jsonl", "--num-chunks", "1") == 4
    assert "does not exist" in capsys.readouterr().err
    write_lmsys_parquet(tmp_path / "d", 10, files=1)
    assert prepare(store_dir, tmp_path / "d", "--num-chunks", "1", "--id-column", "nope") == 4
    assert "column(s) nope not in the file" in capsys.readouterr().err


@pytest.mark.slow
def test_prepare_from_s3_into_s3(seaweedfs_server, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    bucket = seaweedfs_server.new_bucket()
    client = seaweedfs_server.client()
    for path in write_lmsys_parquet(tmp_path / "lmsys", 300, files=3):
        client.upload_file(str(path), bucket, f"datasets/lmsys/{path.name}")
    client.upload_file(str(write_jsonl(tmp_path / "x.jsonl", [{"text": "t"}])), bucket, "datasets/other/x.jsonl")
    source = f"s3://{bucket}/datasets/lmsys?endpoint={seaweedfs_server.endpoint}"
    store_uri = seaweedfs_server.store_uri(bucket, "orch")
    assert (
        main(
            [
                "prepare",
                source,
                "--run",
                "s3run",
                "--store",
                store_uri,
                "--num-chunks",
                "5",
                "--id-column",
                "conversation_id",
            ]
        )
        == 0
    )
    entries = manifest(store_uri, "s3run")
    assert len(entries) == 5 and sum(e.rows for e in entries) == 300
    assert len({line["custom_id"] for line in chunk_lines(store_uri, "s3run")}) == 300


def test_prepare_fails_when_no_row_survives_and_locks_nothing(store_dir, tmp_path, capsys):
    """A template typo sets every row aside: prepare fails, says why and where, and the corrected
    command then succeeds on the same run."""
    write_jsonl(tmp_path / "t.jsonl", [{"text": f"row {i}"} for i in range(5)])
    args = ["--format", "text", "--num-chunks", "2"]
    assert prepare(store_dir, tmp_path / "t.jsonl", *args, "--template", "Summarise: {txt}") == 4
    err = capsys.readouterr().err
    assert "no row of the input became a request: all 5 row(s) were set aside" in err
    assert "t.jsonl:1" in err and "'txt'" in err
    layout = RunLayout("r")
    store = open_store(store_dir)
    assert store.head(layout.prepare_record) is None and store.head(layout.spec) is None
    assert not list(store.list(f"{layout.root}chunks/"))
    assert prepare(store_dir, tmp_path / "t.jsonl", *args, "--template", "Summarise: {text}") == 0
    assert chunk_lines(store_dir)[0]["body"]["messages"][0]["content"] == "Summarise: row 0"


def test_prepare_failed_on_a_missing_file_leaves_the_spec_free(store_dir, tmp_path):
    assert prepare(store_dir, tmp_path / "typo.jsonl", "--format", "text", "--num-chunks", "1") == 4
    write_jsonl(tmp_path / "c.jsonl", [{"conversation": [{"role": "user", "content": "hi"}]}])
    # Another format and chunking this time: nothing was made with the first ones.
    assert prepare(store_dir, tmp_path / "c.jsonl", "--format", "chat", "--rows-per-chunk", "5") == 0
    assert len(chunk_lines(store_dir)) == 1


def test_prepare_completion_id_column_is_not_left_in_the_body(store_dir, tmp_path):
    write_jsonl(tmp_path / "c.jsonl", [{"id": "q1", "prompt": "Once upon", "max_tokens": 3}])
    assert (
        prepare(store_dir, tmp_path / "c.jsonl", "--format", "completion", "--id-column", "id", "--num-chunks", "1")
        == 0
    )
    line = chunk_lines(store_dir)[0]
    assert line["custom_id"] == "q1" and "id" not in line["body"]
    assert line["body"] == {"prompt": "Once upon", "max_tokens": 3}


def test_prepare_reports_lines_that_name_another_model(store_dir, tmp_path, capsys):
    def request(i, model):
        body = {"model": model, "messages": [{"role": "user", "content": f"q{i}"}]}
        return {"custom_id": f"c{i}", "method": "POST", "url": "/v1/chat/completions", "body": body}

    write_jsonl(tmp_path / "b.jsonl", [request(i, "gpt-4o-mini" if i % 3 else "gpt-4o") for i in range(6)])
    args = ["--format", "openai-batch", "--num-chunks", "1", "--model", "my/model"]
    assert prepare(store_dir, tmp_path / "b.jsonl", *args) == 0
    out = capsys.readouterr().out
    assert "6 line(s) name another model: 'gpt-4o-mini' (4), 'gpt-4o' (2)" in out
    assert "answered by the run's model, my/model" in out


def test_prepare_counts_bytes_that_are_not_utf8_or_sets_the_row_aside_with_strict(store_dir, tmp_path, capsys):
    good = json.dumps({"conversation": [{"role": "user", "content": "caf"}]}).encode()
    latin1 = good.replace(b"caf", b"caf\xe9 cr\xe8me")  # Latin-1 bytes, not UTF-8
    write_jsonl(tmp_path / "l.jsonl", [good, latin1, good])
    assert prepare(store_dir, tmp_path / "l.jsonl", "--num-chunks", "1") == 0
    out = capsys.readouterr().out
    assert "1 row(s) have bytes that are not UTF-8 (2 bytes, read as U+FFFD" in out and "l.jsonl:2" in out
    assert chunk_lines(store_dir)[1]["body"]["messages"][0]["content"] == "caf\ufffd cr\ufffdme"
    assert (
        main(
            ["prepare", str(tmp_path / "l.jsonl"), "--run", "s", "--store", store_dir, "--num-chunks", "1", "--strict"]
        )
        == 4
    )
    err = capsys.readouterr().err
    assert "l.jsonl:2" in err and "2 byte(s) of the line are not UTF-8" in err


def test_prepare_rerun_finds_the_same_input_from_anywhere(store_dir, tmp_path, monkeypatch, capsys):
    """The same data from another directory, by an absolute path, after `touch`, or copied
    elsewhere: the same input. Changed data: refused, saying which file, its size, the first row."""
    rows = [{"id": f"q{i}", "conversation": [{"role": "user", "content": f"question {i}"}]} for i in range(20)]
    (tmp_path / "data").mkdir()
    data = write_jsonl(tmp_path / "data" / "q.jsonl", rows)
    monkeypatch.chdir(tmp_path / "data")
    args = ["--num-chunks", "2", "--id-column", "id"]
    assert prepare(store_dir, "q.jsonl", *args) == 0
    assert prepare(store_dir, str(data), *args) == 0  # absolute path
    os.utime(data, (1, 1))  # touch: another mtime, the same bytes
    monkeypatch.chdir(tmp_path)
    assert prepare(store_dir, "data/q.jsonl", *args) == 0
    copy = tmp_path / "elsewhere" / "q.jsonl"
    copy.parent.mkdir()
    copy.write_bytes(data.read_bytes())
    assert prepare(store_dir, copy, *args) == 0
    assert capsys.readouterr().out.count("already prepared") == 3
    rows[12]["conversation"][0]["content"] = "question 12?"  # one byte more
    write_jsonl(copy, rows)
    assert prepare(store_dir, copy, *args) == 4
    err = capsys.readouterr().err
    assert f"{copy}: {copy.stat().st_size:,} bytes, {data.stat().st_size:,} when prepared (as q.jsonl)" in err
    assert f"first differing row: {copy}:13 (custom_id 'q12'" in err
    rows[12]["conversation"][0]["content"] = "question 1?"  # same size, other content
    write_jsonl(copy, rows)
    assert prepare(store_dir, copy, *args) == 4
    assert "same size" in capsys.readouterr().err


def embeddings_line(i, **body):
    return {"custom_id": f"e{i}", "method": "POST", "url": "/v1/embeddings", "body": {"input": f"text {i}", **body}}


def test_prepare_embeddings_score_and_rerank_lines_need_a_pooling_run(store_dir, tmp_path, capsys):
    messages = [{"role": "user", "content": "hi"}]
    chat = {"custom_id": "c", "method": "POST", "url": "/v1/chat/completions", "body": {"messages": messages}}
    score = {"custom_id": "s", "method": "POST", "url": "/v1/score", "body": {"queries": "a", "documents": ["b"]}}
    rerank = {"custom_id": "r", "method": "POST", "url": "/v1/rerank", "body": {"query": "a", "documents": ["b"]}}
    no_pair = {"custom_id": "x", "method": "POST", "url": "/v1/score", "body": {"queries": "a", "text_2": "b"}}
    lines = [embeddings_line(0), embeddings_line(1, dimensions=32), score, rerank, chat, no_pair]
    write_jsonl(tmp_path / "b.jsonl", lines)
    (tmp_path / "orch.yaml").write_text("model: {name: m, runner: pooling}\n")
    assert prepare(store_dir, tmp_path / "b.jsonl", "--format", "openai-batch", "--num-chunks", "1") == 0
    assert [line["custom_id"] for line in chunk_lines(store_dir)] == ["e0", "e1", "s", "r"]
    out = capsys.readouterr().out
    assert "needs a run with model.runner: generate" in out and "a score request needs one of" in out
    assert manifest(store_dir)[0].max_output_tokens == 0  # pooling generates nothing
    # A generating run sets pooling lines aside and says why.
    (tmp_path / "orch.yaml").write_text("model: {name: m}\n")
    assert prepare(store_dir, tmp_path / "b.jsonl", "--format", "openai-batch", "--num-chunks", "1", run="g") == 0
    out = capsys.readouterr().out
    assert "5 bad row(s) set aside" in out and "needs a run with model.runner: pooling" in out


def test_prepare_text_becomes_embeddings_lines_in_a_pooling_run(store_dir, tmp_path):
    write_jsonl(tmp_path / "t.jsonl", [{"text": "the sea"}, {"text": "the sky"}])
    (tmp_path / "orch.yaml").write_text("model: {name: m, runner: pooling}\n")
    assert prepare(store_dir, tmp_path / "t.jsonl", "--format", "text", "--num-chunks", "1") == 0
    lines = chunk_lines(store_dir)
    assert [(line["url"], line["body"]["input"]) for line in lines] == [
        ("/v1/embeddings", "the sea"),
        ("/v1/embeddings", "the sky"),
    ]


def test_prepare_lines_naming_an_adapter_are_not_another_model(store_dir, tmp_path, capsys):
    def request(i, model):
        body = {"model": model, "messages": [{"role": "user", "content": f"q{i}"}]}
        return {"custom_id": f"c{i}", "method": "POST", "url": "/v1/chat/completions", "body": body}

    write_jsonl(tmp_path / "b.jsonl", [request(0, "m"), request(1, "french"), request(2, "frnech")])
    (tmp_path / "orch.yaml").write_text("model: {name: m, lora: {french: /adapters/french}}\n")
    # The request check stops at the typo before anything is written; without it, prepare says so.
    assert prepare(store_dir, tmp_path / "b.jsonl", "--format", "openai-batch", "--num-chunks", "1") == 10
    assert "model 'frnech' is neither the run's model 'm'" in capsys.readouterr().err
    assert prepare(store_dir, tmp_path / "b.jsonl", "--format", "openai-batch", "--num-chunks", "1", "--no-check") == 0
    out = capsys.readouterr().out
    assert "1 line(s) name neither the model nor one of its adapters" in out and "error rows" in out


@pytest.mark.parametrize(
    "body",
    [
        {"messages": [{"role": "user", "content": 'é 𝄞 \u2028 \x7f \x00 \x1f " \\ / tab\there'}], "max_tokens": 9},
        {"prompt": "p", "temperature": 0.7, "top_p": 1, "seed": 2**63 - 1, "logit_bias": {"50256": -100}},
        {"prompt": "a number orjson cannot hold", "seed": 2**70},
    ],
)
def test_canonical_lines_are_compact_utf8_json_as_the_standard_library_writes_them(body):
    """Lines are written by orjson (the prepare bench's biggest cost was json's encoder), byte for
    byte what json.dumps(ensure_ascii=False, separators=(",", ":")) wrote, the standard library
    taking over where orjson cannot (an int beyond 64 bits)."""
    from orchestrator.prepare.formats import encode_line

    record = {"custom_id": "c", "method": "POST", "url": "/v1/completions", "body": body}
    line = encode_line(record)
    assert line == (json.dumps(record, ensure_ascii=False, separators=(",", ":")) + "\n").encode()
    assert json.loads(line) == record


def test_a_canonical_line_holds_no_more_memory_than_its_length():
    """A grouped prepare holds a run of lines in memory, counted by their length: orjson's own bytes
    keep the whole buffer it wrote into (a 500-byte line held about 4 KiB), so lines are copied."""
    import tracemalloc

    from orchestrator.prepare.formats import encode_line

    record = {"custom_id": "c", "method": "POST", "url": "/v1/completions", "body": {"prompt": "p" * 400}}
    tracemalloc.start()
    try:
        lines = [encode_line(record) for _ in range(1000)]
        held, _ = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert held < 1000 * (len(lines[0]) + 100), held


TICKETS = [
    {"ticket": "T1", "subject": "Refund", "body": "I was charged twice", "priority": "high"},
    {"ticket": "T2", "subject": "Login", "body": "Cannot log in", "priority": "low"},
    {"ticket": "T3", "subject": "Hello", "body": "no priority here"},
]
LABEL_SCHEMA = {
    "type": "object",
    "properties": {"category": {"enum": ["billing", "account", "other"]}, "urgent": {"type": "boolean"}},
    "required": ["category", "urgent"],
    "additionalProperties": False,
}


@pytest.mark.parametrize("fmt", ["text", "chat"])
def test_prepare_template_over_any_columns_with_a_json_schema(store_dir, tmp_path, capsys, fmt):
    """Tickets to labelling requests: the template names any columns (no text or conversation column
    needed), the schema file becomes OpenAI's response_format on every line (the schema stored once
    in the run, each line naming it by digest), and a row without a column the template names is
    set aside with its file, line and columns."""
    write_jsonl(tmp_path / "tickets.jsonl", TICKETS)
    (tmp_path / "ticket-label.json").write_text(json.dumps(LABEL_SCHEMA))
    template = "Subject: {subject}\nBody: {body}\nPriority: {priority}"
    args = ["--format", fmt, "--template", template, "--json-schema", tmp_path / "ticket-label.json"]
    args += ["--system-prompt", "Label the ticket.", "--id-column", "ticket", "--num-chunks", "1"]
    assert prepare(store_dir, tmp_path / "tickets.jsonl", *args) == 0
    assert (
        "tickets.jsonl:3: the template names column(s) 'priority', which the row lacks (the row has ticket, subject, body)"
        in capsys.readouterr().out
    )
    lines = chunk_lines(store_dir)
    assert [line["custom_id"] for line in lines] == ["T1", "T2"]
    assert lines[0]["url"] == "/v1/chat/completions"
    assert lines[0]["body"]["messages"] == [
        {"role": "system", "content": "Label the ticket."},
        {"role": "user", "content": "Subject: Refund\nBody: I was charged twice\nPriority: high"},
    ]
    store, layout = open_store(store_dir), RunLayout("r")
    [stored] = list(store.list(f"{layout.root}schemas/"))
    assert json.loads(store.get(stored.key).data) == LABEL_SCHEMA
    digest = stored.key.rsplit("/", 1)[1].removesuffix(".json")
    assert digest == hashlib.sha256(store.get(stored.key).data).hexdigest()
    reference = {"$ref": f"urn:orch:schema:sha256:{digest}"}
    expected = {"name": "ticket-label", "schema": reference, "strict": True}
    assert all(line["body"]["response_format"] == {"type": "json_schema", "json_schema": expected} for line in lines)


@pytest.mark.parametrize("source", ["jsonl", "parquet"])
def test_prepare_template_writes_structs_and_lists_as_json_and_null_as_nothing(store_dir, tmp_path, source):
    """A struct column was filled in as Python's repr (`{'a': 0}`), a list as `['t0']`: now JSON,
    members reachable by index, true/false, a null as nothing, a number formatted as asked
    (docs/labelling.md, "What a template writes")."""
    rows = [
        {"id": "r0", "meta": {"a": 0, "b": "é"}, "tags": ["t0", "t1"], "note": None, "ok": True, "price": 1.5},
        {"id": "r1", "meta": {"a": 1, "b": None}, "tags": [], "note": "n", "ok": False, "price": 2.0},
    ]
    if source == "jsonl":
        path = write_jsonl(tmp_path / "rows.jsonl", rows)
    else:
        import pyarrow as pa
        import pyarrow.parquet as pq

        path = tmp_path / "rows.parquet"
        pq.write_table(pa.Table.from_pylist(rows), path)
    template = "meta={meta} a={meta[a]} tags={tags} note=[{note}] ok={ok} price={price:.2f}"
    assert (
        prepare(store_dir, path, "--format", "text", "--template", template, "--id-column", "id", "--num-chunks", "1")
        == 0
    )
    texts = [line["body"]["messages"][0]["content"] for line in chunk_lines(store_dir)]
    assert texts == [
        'meta={"a": 0, "b": "é"} a=0 tags=["t0", "t1"] note=[] ok=true price=1.50',
        'meta={"a": 1, "b": null} a=1 tags=[] note=[n] ok=false price=2.00',
    ]


def test_prepare_response_format_from_the_spec_file(store_dir, tmp_path):
    write_jsonl(tmp_path / "tickets.jsonl", TICKETS[:2])
    (tmp_path / "orch.yaml").write_text(
        "input:\n  format: text\n  template: 'About {subject}: {body}'\n  response_format: {type: json_object}\n"
    )
    assert prepare(store_dir, tmp_path / "tickets.jsonl", "--num-chunks", "1") == 0
    body = chunk_lines(store_dir)[0]["body"]
    assert body["messages"] == [{"role": "user", "content": "About Refund: I was charged twice"}]
    assert body["response_format"] == {"type": "json_object"}


def test_prepare_refuses_a_bad_schema_or_template_before_reading_a_row(store_dir, tmp_path, capsys):
    write_jsonl(tmp_path / "tickets.jsonl", TICKETS)
    (tmp_path / "wrong.json").write_text('{"type": "object",\n "properties": {"a": {"type": "strin"}}}\n')
    (tmp_path / "broken.json").write_text('{"type": "object",\n "properties": }\n')
    base = [tmp_path / "tickets.jsonl", "--format", "text", "--num-chunks", "1"]
    assert prepare(store_dir, *base, "--template", "{subject}", "--json-schema", tmp_path / "wrong.json") == 2
    assert "wrong.json: at #/properties/a/type: not a valid JSON Schema:" in capsys.readouterr().err
    assert prepare(store_dir, *base, "--template", "{subject}", "--json-schema", tmp_path / "broken.json") == 2
    assert "broken.json:2: not valid JSON" in capsys.readouterr().err
    assert prepare(store_dir, *base, "--template", "{subject} {0}") == 2
    assert "the template's field {0} names no column" in capsys.readouterr().err
    assert prepare(store_dir, *base, "--response-format", "json_schema") == 2
    assert "needs its schema" in capsys.readouterr().err
    openai_batch = [tmp_path / "tickets.jsonl", "--format", "openai-batch", "--num-chunks", "1"]
    assert prepare(store_dir, *openai_batch, "--response-format", "json_object") == 2
    assert "response_format applies to format text or chat, not openai-batch" in capsys.readouterr().err
    assert not os.path.exists(store_dir)


def test_prepare_missing_id_column_names_the_row_columns(store_dir, tmp_path, capsys):
    write_jsonl(tmp_path / "tickets.jsonl", TICKETS)
    args = ["--format", "text", "--template", "{subject}", "--id-column", "priority", "--strict", "--num-chunks", "1"]
    assert prepare(store_dir, tmp_path / "tickets.jsonl", *args) == 4
    assert "tickets.jsonl:3: no id column 'priority' (the row has ticket, subject, body)" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("flags", "expected"),
    [
        (
            ["--id-column", "tikcet"],
            "no id column 'tikcet' (the row has ticket, subject, body, priority; did you mean 'ticket'?)",
        ),
        (
            ["--template", "{Subject}: {bodi}"],
            "the template names column(s) 'Subject', 'bodi', which the row lacks (the row has ticket, subject, body, "
            "priority; did you mean 'subject' for 'Subject', 'body' for 'bodi'?)",
        ),
        (
            ["--template", "{zzz}"],
            "the template names column(s) 'zzz', which the row lacks (the row has ticket, subject, body, priority)",
        ),
    ],
)
def test_prepare_missing_column_suggests_the_closest_of_the_rows(store_dir, tmp_path, capsys, flags, expected):
    """A mistyped column name is answered with the row's columns and, when one is close, which it meant."""
    write_jsonl(tmp_path / "tickets.jsonl", TICKETS[:1])
    args = ["--format", "text", "--template", "{subject}", *flags, "--num-chunks", "1"]
    assert prepare(store_dir, tmp_path / "tickets.jsonl", *args) == 4
    assert f"tickets.jsonl:1: {expected}" in capsys.readouterr().err


def test_prepare_chat_rows_under_another_column_name_it(store_dir, tmp_path, capsys):
    """OpenAI's and most chat datasets' rows keep their turns in `messages`, not LMSys's `conversation`
    (the default): the error names the column that holds turns and the flag that reads it."""
    write_jsonl(tmp_path / "chats.jsonl", [{"id": 1, "messages": [{"role": "user", "content": "hi"}], "tags": ["a"]}])
    assert prepare(store_dir, tmp_path / "chats.jsonl", "--num-chunks", "1") == 4
    expected = "chats.jsonl:1: no column 'conversation' (the row has id, messages, tags); 'messages' holds chat turns"
    assert f"{expected}: --conversation-column messages" in capsys.readouterr().err
    assert prepare(store_dir, tmp_path / "chats.jsonl", "--num-chunks", "1", "--conversation-column", "messages") == 0


def test_prepare_parquet_missing_column_suggests_the_closest(store_dir, tmp_path, capsys):
    write_lmsys_parquet(tmp_path / "chats", 2, files=1)
    assert prepare(store_dir, tmp_path / "chats", "--format", "chat", "--conversation-column", "conversaton") == 4
    assert "did you mean 'conversation'?" in capsys.readouterr().err


def test_prepare_without_chunking_flags_takes_the_default_size(store_dir, tmp_path, capsys):
    write_jsonl(tmp_path / "t.jsonl", [{"text": f"row {i}"} for i in range(3)])
    assert prepare(store_dir, tmp_path / "t.jsonl", "--format", "text") == 0
    assert "no chunking given: chunks of 1,000 rows" in capsys.readouterr().err
    assert [e.rows for e in manifest(store_dir)] == [3]
    # Recorded with the run: later commands chunk alike, and the same command again changes nothing.
    assert prepare(store_dir, tmp_path / "t.jsonl", "--format", "text") == 0
    assert "already prepared" in capsys.readouterr().out
