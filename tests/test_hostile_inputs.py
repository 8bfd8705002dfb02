"""`orch prepare` on inputs built to break a reader: each one a bad row with its file and line, or one
ERROR line with exit 4, never a traceback, and a line too long to hold never held."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from orchestrator.cli import main
from orchestrator.core.layout import RunLayout
from orchestrator.core.records import read_manifest
from orchestrator.core.store import open_store
from tests.support.datasets import write_jsonl
from tests.support.runs import Answer, answer_chunk, chat_request

pytestmark = pytest.mark.xdist_group("hostile_inputs")  # one xdist worker: its tests share the module's servers

BATCH = ["--format", "openai-batch", "--num-chunks", "1"]
#: Deep enough to exhaust Python's recursion (1,000 frames) while json reads it.
DEEP = 5000


@pytest.fixture
def project(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    return tmp_path


def prepare(project: Path, *args: object) -> int:
    return main(["prepare", *map(str, args), "--run", "r", "--store", str(project / "s")])


def set_aside(project: Path) -> list[dict]:
    data = open_store(str(project / "s")).get(RunLayout("r").prepare_errors).data
    return [json.loads(line) for line in data.splitlines()]


def prepared_ids(project: Path) -> list[str]:
    store, layout = open_store(str(project / "s")), RunLayout("r")
    lines = [line for e in read_manifest(store, layout) for line in store.get(layout.chunk(e.chunk)).data.splitlines()]
    return [json.loads(line)["custom_id"] for line in lines]


def nested_line(depth: int) -> bytes:
    """A request whose body holds arrays `depth` levels deep, written as text (json.dumps of such a
    value would itself run out of recursion)."""
    request = chat_request("deep", "hi")
    request["body"]["metadata"] = {"x": "@"}
    return json.dumps(request).replace('"@"', "[" * depth + "]" * depth).encode()


def test_prepare_sets_aside_json_nested_too_deep_with_file_and_line(project, capsys):
    write_jsonl(project / "in.jsonl", [chat_request("ok", "hi"), nested_line(DEEP), nested_line(150)])
    assert prepare(project, project / "in.jsonl", *BATCH) == 0
    out, err = capsys.readouterr()
    assert "Traceback" not in err
    assert "in.jsonl:2: not valid JSON: arrays and objects nested more than 200 levels deep" in out
    assert prepared_ids(project) == ["ok", "deep"]  # 150 levels (and the wrapping) are within the limit
    assert [(e["line"], e["custom_id"]) for e in set_aside(project)] == [(2, "line-2")]


@pytest.mark.parametrize(
    "line",
    [
        pytest.param(json.dumps(chat_request("s", "a\ud800b")), id="content"),
        pytest.param(json.dumps(chat_request("\udc00", "hi")), id="custom_id"),
        pytest.param(json.dumps(chat_request("k", "hi")).replace('"content"', '"\\ud83d"'), id="key"),
    ],
)
def test_prepare_sets_aside_a_lone_surrogate_escape_with_file_and_line(line, project, capsys):
    """json.dumps writes a lone surrogate as the escape `\\udXXX`: valid JSON grammar, no UTF-8 text."""
    assert "\\ud" in line
    write_jsonl(project / "in.jsonl", [chat_request("ok", "hi"), line.encode(), chat_request("pair", "\U0001f600")])
    assert prepare(project, project / "in.jsonl", *BATCH) == 0
    out, err = capsys.readouterr()
    assert "Traceback" not in err
    assert "in.jsonl:2: not valid JSON: a lone surrogate escape" in out
    assert prepared_ids(project) == ["ok", "pair"]  # a surrogate pair is one character, and fine
    assert [(e["line"], e["custom_id"]) for e in set_aside(project)] == [(2, "line-2")]


def test_prepare_rows_without_an_id_are_answered_under_a_line_stand_in(project, capsys):
    """Not JSON, or no custom_id: the error line carries `line-<n>` (OpenAI batch consumers expect a
    string), after the file's name when the input has several files."""
    no_id = {k: v for k, v in chat_request("x", "hi").items() if k != "custom_id"}
    (project / "d").mkdir()
    write_jsonl(project / "d" / "a.jsonl", [chat_request("a0", "hi"), b"{broken", no_id])
    write_jsonl(project / "d" / "b.jsonl", [b"[1,", chat_request("b1", "hi")])
    assert prepare(project, project / "d" / "a.jsonl", *BATCH) == 0
    assert [e["custom_id"] for e in set_aside(project)] == ["line-2", "line-3"]
    assert main(["prepare", str(project / "d"), "--run", "r2", "--store", str(project / "s"), *BATCH]) == 0
    errors = open_store(str(project / "s")).get(RunLayout("r2").prepare_errors).data.splitlines()
    assert [json.loads(e)["custom_id"] for e in errors] == ["a.jsonl:line-2", "a.jsonl:line-3", "b.jsonl:line-1"]
    # ...and collect answers them under it.
    store, layout = open_store(str(project / "s")), RunLayout("r")
    (entry,) = read_manifest(store, layout)
    answer_chunk(store, layout, entry.chunk, [[Answer(0, "a0", "answer")]])
    out = project / "o.jsonl"
    assert (
        main(["collect", "--run", "r", "--store", str(project / "s"), "--out", str(out), "--max-error-rate", "1"]) == 0
    )
    assert [json.loads(line)["custom_id"] for line in out.read_text().splitlines()] == ["a0", "line-2", "line-3"]
    capsys.readouterr()


def test_prepare_sets_aside_a_line_over_the_size_limit_with_its_size(project, capsys):
    big = json.dumps(chat_request("big", "x" * (3 * 2**20))).encode()
    write_jsonl(project / "in.jsonl", [chat_request("a", "hi"), big, chat_request("b", "hi")])
    args = [project / "in.jsonl", *BATCH, "--max-line-bytes", 2**20]
    assert prepare(project, *args) == 0
    out, err = capsys.readouterr()
    assert "Traceback" not in err
    assert f"in.jsonl:2: the line is {len(big):,} bytes, over the 1,048,576-byte limit (input.max_line_bytes)" in out
    assert prepared_ids(project) == ["a", "b"]
    (error,) = set_aside(project)
    assert (error["line"], error["line_bytes"], error["custom_id"]) == (2, len(big), "line-2")
    assert "text" not in error and error["excerpt"].startswith('{"custom_id": "big"')  # its start, to find it by
    # Collect answers it in its place; the retry file cannot hold a line that was never read.
    store, layout = open_store(str(project / "s")), RunLayout("r")
    (entry,) = read_manifest(store, layout)
    answer_chunk(store, layout, entry.chunk, [[Answer(0, "a", "one"), Answer(1, "b", "two")]])
    out_args = ["--out", str(project / "o.jsonl"), "--retry-out", str(project / "r.jsonl"), "--max-error-rate", "1"]
    assert main(["collect", "--run", "r", "--store", str(project / "s"), *out_args]) == 0
    written = [json.loads(line) for line in (project / "o.jsonl").read_text().splitlines()]
    assert [line["custom_id"] for line in written] == ["a", "line-2", "b"]
    assert "input.max_line_bytes" in written[1]["error"]["message"]
    assert (project / "r.jsonl").read_text() == ""
    capsys.readouterr()


def test_prepare_max_line_bytes_is_a_spec_setting_and_refuses_a_silly_value(project, capsys):
    write_jsonl(project / "in.jsonl", [chat_request("a", "hi"), chat_request("b", "y" * 5000)])
    (project / "orch.yaml").write_text("input: {max_line_bytes: 4096}\n")
    assert prepare(project, project / "in.jsonl", *BATCH) == 0
    assert "over the 4,096-byte limit" in capsys.readouterr().out
    assert main(["prepare", str(project / "in.jsonl"), "--run", "r3", *BATCH, "--max-line-bytes", "10"]) == 2
    assert "--max-line-bytes" in capsys.readouterr().err


def test_prepare_memory_stays_bounded_by_the_line_limit_not_the_line(project):
    """A 48 MiB line under a 1 MiB limit, through a separate process: its peak RSS (VmHWM) grows by
    far less than the line over a run without that line. Read whole, the line (bytes, text and
    parsed) took three times its size."""
    line = json.dumps(chat_request("big", "x" * (48 * 2**20))).encode()
    small = write_jsonl(project / "small.jsonl", [chat_request(f"r{i}", "hi") for i in range(3)])
    large = write_jsonl(project / "large.jsonl", [chat_request(f"r{i}", "hi") for i in range(3)] + [line])
    script = (
        "import sys\nfrom orchestrator.cli import main\n"
        "code = main(sys.argv[1:])\n"
        "print(next(l.split()[1] for l in open('/proc/self/status') if l.startswith('VmHWM:')))\n"
        "sys.exit(code)\n"
    )

    def peak_mib(data: Path, run: str) -> float:
        args = [
            "prepare",
            str(data),
            "--run",
            run,
            "--store",
            str(project / "s"),
            *BATCH,
            "--max-line-bytes",
            "1048576",
        ]
        done = subprocess.run([sys.executable, "-c", script, *args], capture_output=True, text=True, cwd=project)
        assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr
        return int(done.stdout.split()[-1]) / 1024

    baseline, with_line = peak_mib(small, "small"), peak_mib(large, "large")
    assert with_line - baseline < 12, (baseline, with_line)


def write_parquet(path: Path, conversation: list) -> Path:
    pq.write_table(pa.table({"conversation": conversation}), path)
    return path


@pytest.mark.parametrize("turns", ["first", "all"])
def test_prepare_parquet_conversation_of_strings_is_exit_4_naming_file_and_column(turns, project, capsys):
    data = write_parquet(project / "strs.parquet", ["hello", "world"])
    assert prepare(project, data, "--turns", turns, "--num-chunks", "1") == 4
    err = capsys.readouterr().err
    assert "Traceback" not in err
    assert f"ERROR {data}:0: column 'conversation' is not a list of turns (a str)" in err


def test_prepare_unreadable_parquet_is_exit_4_naming_the_file(project, capsys):
    (project / "junk.parquet").write_bytes(b"PAR1" + b"not parquet at all" * 100)
    assert prepare(project, project / "junk.parquet", "--num-chunks", "1") == 4
    err = capsys.readouterr().err
    assert "Traceback" not in err
    assert f"ERROR {project / 'junk.parquet'}: cannot read the file as Parquet: Parquet magic bytes not found" in err


@pytest.mark.parametrize("turns", ["first", "all"])
def test_prepare_parquet_damaged_midway_is_exit_4_saying_how_far_it_read(turns, project, capsys):
    """A data page of the third row group overwritten: the first rows read, then one ERROR line."""
    rows = [[{"role": "user", "content": f"q{i} " + "x" * 200}] for i in range(30_000)]
    whole = project / "whole.parquet"
    pq.write_table(pa.table({"conversation": rows}), whole, row_group_size=10_000, compression="none")
    damaged = bytearray(whole.read_bytes())
    page = pq.ParquetFile(whole).metadata.row_group(2).column(0).data_page_offset
    damaged[page : page + 64] = bytes(64)
    (project / "damaged.parquet").write_bytes(bytes(damaged))
    assert prepare(project, project / "damaged.parquet", "--turns", turns, "--num-chunks", "1") == 4
    err = capsys.readouterr().err
    assert "Traceback" not in err
    assert f"ERROR {project / 'damaged.parquet'}: cannot read the file as Parquet after its first " in err
    assert open_store(str(project / "s")).head(RunLayout("r").manifest) is None


# -- orch serve: the same inputs fail their batch once, in one round, with the line ------------------
@pytest.fixture(scope="module")
def limited_server(tmp_path_factory):
    """A real `orch serve` reading lines of at most 1 MiB, taking files of up to 64 MiB."""
    from tests.support.serving import MAX_FILE_BYTES, SPEC, running_server

    spec = SPEC.replace(f"max_file_bytes: {MAX_FILE_BYTES}", f"max_file_bytes: {64 * 2**20}")
    workdir = tmp_path_factory.mktemp("serve-hostile")
    with running_server(workdir, str(workdir / "store"), spec + "input: {max_line_bytes: 1048576}\n") as server:
        yield server


def served_line(custom_id: str, content: str) -> str:
    from tests.support.serving import chat_line

    return json.dumps(chat_line(custom_id, content))


SERVED_CASES = {
    "nested-too-deep": (served_line("deep", "@").replace('"@"', "[" * DEEP + "]" * DEEP), "invalid_json_line"),
    "lone-surrogate-in-content": (served_line("s", "a\ud800b"), "invalid_json_line"),
    "lone-surrogate-in-custom-id": (served_line("\udc00", "hi"), "invalid_json_line"),
    "line-over-the-limit": (served_line("big", "x" * (3 * 2**20)), "line_too_large"),
}


def peak_kib(pid: int) -> int:
    return int(next(line.split()[1] for line in open(f"/proc/{pid}/status") if line.startswith("VmHWM:")))


def fail_in_one_round(server, path: Path):
    """Upload and create a batch of the file; returns it once final, and the server's log lines about it."""
    from tests.support.serving import create, final, upload, wait_for

    client = server.client()
    created = create(client, upload(client, path).id)
    batch, _ = wait_for(client, created.id, final)
    deadline = time.monotonic() + 300  # a hang guard: the server logs its verdict just after recording it
    while True:
        log = (server.workdir / "server.log").read_text()
        about = [line for line in log.splitlines() if created.id in line]
        if any("failed validation" in line for line in about) or time.monotonic() > deadline:
            return batch, about, log
        time.sleep(0.1)


@pytest.mark.slow
@pytest.mark.parametrize("case", list(SERVED_CASES))
def test_serve_hostile_line_fails_its_batch_once_naming_the_line(case, limited_server, tmp_path):
    line, code = SERVED_CASES[case]
    path = tmp_path / "input.jsonl"
    path.write_text(served_line("ok", "hi") + "\n" + line + "\n")

    batch, about, log = fail_in_one_round(limited_server, path)

    assert batch.status == "failed" and batch.errors is not None
    assert [(e.code, e.line) for e in batch.errors.data] == [(code, 2)]
    message = batch.errors.data[0].message or ""
    assert ("lone surrogate" in message) if "surrogate" in case else True
    assert ("nested more than 200 levels" in message) if "deep" in case else True
    assert (f"{len(line):,} bytes" in message) if "limit" in case else True
    # Checked once: one verdict in the log, no traceback, no "trying again"; nothing launched.
    assert sum("failed validation" in entry for entry in about) == 1, about
    assert "Traceback" not in log and not any("trying again" in entry for entry in about), about
    assert list(open_store(limited_server.store_uri).list(RunLayout(batch.id).root)) == []


@pytest.mark.slow
def test_serve_validation_memory_stays_bounded_by_the_line_limit(limited_server, tmp_path):
    """A 48 MiB line under the 1 MiB limit: the server's peak RSS grows by far less than the line
    (read whole, it grew by 223 MiB)."""
    warm_up = tmp_path / "warm-up.jsonl"  # the first batch imports the code that every batch runs
    warm_up.write_text(served_line("ok", "hi") + "\n" + served_line("big", "x" * 2**21) + "\n")
    fail_in_one_round(limited_server, warm_up)
    path = tmp_path / "input.jsonl"
    path.write_text(served_line("ok", "hi") + "\n" + served_line("big", "x" * (48 * 2**20)) + "\n")
    before = peak_kib(limited_server.proc.pid)

    batch, _, _ = fail_in_one_round(limited_server, path)

    assert batch.errors is not None and [(e.code, e.line) for e in batch.errors.data] == [("line_too_large", 2)]
    grown_mib = (peak_kib(limited_server.proc.pid) - before) / 1024
    print(f"server peak RSS grew {grown_mib:.1f} MiB")
    assert grown_mib < 12, grown_mib
