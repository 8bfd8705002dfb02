"""Table sources and sinks through the real libraries: Iceberg (SQL catalog on SQLite), Delta Lake, Lance, Hugging Face datasets."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from orchestrator.cli import main
from orchestrator.core.layout import RunLayout
from orchestrator.core.records import read_manifest
from orchestrator.core.store import open_store
from orchestrator.prepare.sources import resolve_sources
from orchestrator.prepare.table_sources.tables import appended_since
from tests.support.tables import Tables, answer_all, answer_by_question, answered_run, chunk_lines, prepare_table, rows

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning", "ignore::UserWarning")
KINDS = ["iceberg", "delta", "lance", "hf"]


@pytest.fixture
def tables(tmp_path: Path) -> Tables:
    return Tables(tmp_path)


@pytest.mark.parametrize("kind", KINDS)
def test_prepare_table_gives_the_parquet_files_requests(kind, tables, tmp_path, capsys):
    data = rows(0, 30)
    tables.write(kind, data)
    pq.write_table(data, tmp_path / "same.parquet")
    store = str(tmp_path / "store")
    assert prepare_table(store, "p", str(tmp_path / "same.parquet")) == 0
    assert prepare_table(store, "t", tables.uri(kind), "--rows-per-chunk", "7") == 0, capsys.readouterr().err
    assert chunk_lines(store, "t") == chunk_lines(store, "p")
    capsys.readouterr()
    assert prepare_table(store, "t", tables.uri(kind), "--rows-per-chunk", "7") == 0
    assert "already prepared" in capsys.readouterr().out


@pytest.mark.parametrize("kind", ["iceberg", "delta", "lance"])
def test_prepare_table_new_snapshot_is_new_input_and_at_reads_the_old_one(kind, tables, tmp_path, capsys):
    first = tables.write(kind, rows(0, 5))
    store = str(tmp_path / "store")
    assert prepare_table(store, "a", tables.uri(kind)) == 0
    latest = tables.write(kind, rows(5, 3))
    capsys.readouterr()
    assert prepare_table(store, "a", tables.uri(kind)) == 4
    err = capsys.readouterr().err
    word = "snapshot" if kind == "iceberg" else "version"
    assert f"{word} {latest} (8 rows) now, {word} {first} (5 rows) when prepared" in err
    assert prepare_table(store, "a", tables.uri(kind, first)) == 0  # time travel: the prepared snapshot, a no-op
    assert "already prepared" in capsys.readouterr().out
    assert prepare_table(store, "b", tables.uri(kind)) == 0
    assert [line["custom_id"] for line in chunk_lines(store, "b")] == [f"r{i}" for i in range(8)]


def test_prepare_delta_names_a_schema_change_between_versions(tables, tmp_path, capsys):
    tables.write("delta", rows(0, 4))
    store = str(tmp_path / "store")
    assert prepare_table(store, "a", tables.uri("delta")) == 0
    tables.write("delta", rows(4, 2).append_column("lang", pa.array(["en", "fr"])), schema_mode="merge")
    assert prepare_table(store, "a", tables.uri("delta")) == 4
    assert "the schema changed between them: added lang: string" in capsys.readouterr().err


def test_prepare_delta_partitioned_reads_the_partition_values(tables, tmp_path):
    data = rows(0, 6)
    tables.write("delta", data, partition_by=["question"])  # the question is in the file paths, not the files
    pq.write_table(data, tmp_path / "same.parquet")
    store = str(tmp_path / "store")
    assert prepare_table(store, "p", str(tmp_path / "same.parquet")) == 0
    assert prepare_table(store, "t", tables.uri("delta")) == 0

    def by_id(lines: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return sorted(lines, key=lambda line: str(line["custom_id"]))

    assert by_id(chunk_lines(store, "t")) == by_id(chunk_lines(store, "p"))


@pytest.mark.parametrize("kind", ["iceberg", "delta", "lance"])
def test_prepare_table_version_that_does_not_exist_lists_the_latest(kind, tables, tmp_path, capsys):
    first = tables.write(kind, rows(0, 2))
    tables.write(kind, rows(2, 2))
    assert prepare_table(str(tmp_path / "store"), "a", tables.uri(kind, 987654)) == 4
    err = capsys.readouterr().err
    assert "987654 in the table (the latest: " in err and f"{first} (" in err


def test_prepare_iceberg_table_that_does_not_exist_lists_the_namespace(tables, tmp_path, capsys):
    tables.write("iceberg", rows(0, 2))
    assert prepare_table(str(tmp_path / "store"), "a", tables.uri("iceberg").replace("db.q", "db.qq")) == 4
    assert "no table 'db.qq' in Iceberg catalog 'local' (namespace db has: db.q; did you mean 'db.q'?)" in (
        capsys.readouterr().err
    )
    assert prepare_table(str(tmp_path / "store"), "a", f"delta:{tmp_path}/nothing") == 4
    assert f"no Delta table at {tmp_path}/nothing" in capsys.readouterr().err


@pytest.mark.parametrize("kind", KINDS)
def test_prepare_table_missing_column_suggests_the_closest(kind, tables, tmp_path, capsys):
    tables.write(kind, rows(0, 2))
    flags = ["--format", "chat", "--conversation-column", "questions", "--model", "m"]
    assert main(["prepare", "--run", "a", "--store", str(tmp_path / "s"), *flags, tables.uri(kind)]) == 4
    assert "column(s) questions not in the table (it has: id, question, n; did you mean 'question'?)" in (
        capsys.readouterr().err
    )


def test_prepare_hf_dataset_dict_needs_a_split(tmp_path, capsys):
    import datasets

    datasets.DatasetDict({"train": datasets.Dataset(rows(0, 3)), "test": datasets.Dataset(rows(3, 2))}).save_to_disk(
        str(tmp_path / "dd")
    )
    store = str(tmp_path / "store")
    assert prepare_table(store, "a", f"hf:{tmp_path}/dd") == 4
    assert "holds the splits train, test: name one" in capsys.readouterr().err
    assert prepare_table(store, "a", f"hf:{tmp_path}/dd#test") == 0
    assert [line["custom_id"] for line in chunk_lines(store, "a")] == ["r3", "r4"]


@pytest.mark.parametrize("kind", ["iceberg", "delta"])
def test_appended_since_reads_only_the_new_rows(kind, tables):
    first = tables.write(kind, rows(0, 5))
    tables.write(kind, rows(5, 3))
    tables.write(kind, rows(8, 2))
    (source,) = resolve_sources([tables.uri(kind)])
    new = pa.Table.from_batches(list(appended_since(source, first, ["id"])))
    assert sorted(new.column("id").to_pylist(), key=lambda s: int(s[1:])) == [f"r{i}" for i in range(5, 10)]
    assert (
        pa.Table.from_batches(list(appended_since(source, source.version or "", ["id"])), schema=new.schema).num_rows
        == 0
    )


def test_appended_since_refuses_a_delete_in_between(tables):
    from deltalake import DeltaTable

    first = tables.write("delta", rows(0, 5))
    tables.write("delta", rows(5, 3))
    DeltaTable(str(tables.root / "delta_q")).delete("n = 1")
    (source,) = resolve_sources([tables.uri("delta")])
    with pytest.raises(Exception, match="rows changed, not only appended"):
        list(appended_since(source, first))


# -- sinks -------------------------------------------------------------------------------------
def read_sink(kind: str, tables: Tables) -> pa.Table:
    if kind == "iceberg":
        return tables.catalog().load_table("db.answers").scan().to_arrow()
    if kind == "delta":
        from deltalake import DeltaTable

        return DeltaTable(str(tables.root / "delta_answers")).to_pyarrow_table()
    import lance

    return lance.dataset(str(tables.root / "answers.lance")).to_table()


SINKS = {
    "iceberg": lambda t: f"iceberg://local/db.answers?{t.query}",
    "delta": lambda t: f"delta:{t.root}/delta_answers",
    "lance": lambda t: f"{t.root}/answers.lance",
}


@pytest.mark.parametrize("kind", list(SINKS))
def test_collect_into_table_appends_a_run_once(kind, tables, tmp_path, capsys):
    store = answered_run(tmp_path, "c", 12)
    out = SINKS[kind](tables)
    assert main(["collect", "--run", "c", "--store", store, "--out", out]) == 0, capsys.readouterr().err
    said = capsys.readouterr().out
    assert f"appended to {out} at " in said and "orch.run=c" in said
    written = read_sink(kind, tables).to_pydict()
    assert written["id"] == [f"r{i}" for i in range(12)]
    assert written["text"] == [f"answer r{i}" for i in range(12)]
    assert set(written) >= {"finish_reason", "prompt_tokens", "completion_tokens", "error_code", "model"}
    assert main(["collect", "--run", "c", "--store", store, "--out", out]) == 0
    assert f"already in {out} at " in capsys.readouterr().out
    assert read_sink(kind, tables).num_rows == 12  # collecting twice never writes the rows twice
    other = answered_run(tmp_path, "d", 3)
    assert main(["collect", "--run", "d", "--store", other, "--out", out]) == 0
    assert read_sink(kind, tables).num_rows == 15


def sink_commits(kind: str, tables: Tables) -> int:
    """How many commits the sink table has had (snapshots, versions)."""
    if kind == "iceberg":
        return len(tables.catalog().load_table("db.answers").snapshots())
    if kind == "delta":
        from deltalake import DeltaTable

        return DeltaTable(str(tables.root / "delta_answers")).version() + 1
    import lance

    return int(lance.dataset(str(tables.root / "answers.lance")).version)


@pytest.mark.parametrize("kind", list(SINKS))
def test_collect_into_table_refuses_other_columns_the_same_way_in_every_kind(kind, tables, tmp_path, capsys):
    """A run collected without the --keep-columns the table was made with (or with others) is
    refused, naming the columns, by Iceberg and Lance as by Delta; nothing is written."""
    pq.write_table(rows(0, 4), tmp_path / "in.parquet")
    store = str(tmp_path / "store")
    for run in ("kept", "plain"):
        assert prepare_table(store, run, str(tmp_path / "in.parquet")) == 0
        answer_all(store, run)
    out = SINKS[kind](tables)
    assert main(["collect", "--run", "kept", "--store", store, "--out", out, "--keep-columns", "n"]) == 0
    commits = sink_commits(kind, tables)
    capsys.readouterr()
    assert main(["collect", "--run", "plain", "--store", store, "--out", out]) == 1
    err = capsys.readouterr().err
    assert f"cannot append to {out}: the run's columns are not the table's: the table has n, the run does not" in err
    assert "--keep-columns" in err and sink_commits(kind, tables) == commits
    assert read_sink(kind, tables).num_rows == 4
    # The other way round: a column the table lacks; and one of another type.
    other = tmp_path / "other"
    other.mkdir()
    pq.write_table(rows(0, 4).set_column(2, "n", pa.array(["a", "b", "c", "d"])), other / "in.parquet")
    assert prepare_table(store, "typed", str(other / "in.parquet")) == 0
    answer_all(store, "typed")
    capsys.readouterr()
    assert main(["collect", "--run", "typed", "--store", store, "--out", out, "--keep-columns", "n,question"]) == 1
    err = capsys.readouterr().err
    assert "the run has question, the table does not; n is int64 in the table and string in the run" in err
    assert sink_commits(kind, tables) == commits


@pytest.mark.parametrize("kind", list(SINKS))
@pytest.mark.usefixtures("greedy")
def test_collect_merge_on_keeps_one_row_per_id_with_the_latest_answers(kind, tables, tmp_path, capsys):
    """Week 1's rows, then week 2 (its own run, reusing week 1's unchanged answers: new rows, edited
    rows and unchanged ones) merged on the id: one row per id, the edited ones with week 2's answers,
    the same columns both weeks; a second collect of week 2 commits nothing."""
    store, out = str(tmp_path / "store"), SINKS[kind](tables)
    pq.write_table(rows(0, 8), tmp_path / "week1.parquet")
    week2 = rows(0, 11).to_pylist()
    for edited in (2, 5):
        week2[edited]["question"] = f"question {edited}, edited"
    pq.write_table(pa.Table.from_pylist(week2), tmp_path / "week2.parquet")
    assert prepare_table(store, "w1", str(tmp_path / "week1.parquet")) == 0
    answer_by_question(store, "w1")
    assert main(["collect", "--run", "w1", "--store", store, "--out", out, "--merge-on", "id"]) == 0
    assert f"appended to {out} at " in capsys.readouterr().out  # a new table: made by the first run's rows
    assert prepare_table(store, "w2", str(tmp_path / "week2.parquet"), "--reuse-from", "w1") == 0
    assert sum(e.rows for e in read_manifest(open_store(store), RunLayout("w2"))) == 5  # 3 new, 2 edited
    answer_by_question(store, "w2")
    capsys.readouterr()
    assert main(["collect", "--run", "w2", "--store", store, "--out", out, "--merge-on", "id"]) == 0
    said = capsys.readouterr().out
    assert f"merged into {out} on id at " in said and "3 row(s) inserted" in said and "orch.run=w2" in said
    table = sorted(read_sink(kind, tables).to_pylist(), key=lambda row: int(row["id"][1:]))
    assert [row["id"] for row in table] == [f"r{i}" for i in range(11)]  # one row per id
    assert [row["text"] for row in table] == [f"answer to {row['question']}" for row in week2]
    assert [row["reused"] for row in table] == [i not in (2, 5, 8, 9, 10) for i in range(11)]
    commits = sink_commits(kind, tables)
    assert main(["collect", "--run", "w2", "--store", store, "--out", out, "--merge-on", "id"]) == 0
    assert f"already in {out} at " in capsys.readouterr().out and sink_commits(kind, tables) == commits
    assert read_sink(kind, tables).num_rows == 11


def test_collect_into_a_table_an_older_orch_made_says_which_columns_to_add(tables, tmp_path, capsys):
    """A table made before `reused` and `escalated` were in every table: refused, saying what to add."""
    from deltalake import write_deltalake

    store = answered_run(tmp_path, "old", 3)
    assert main(["collect", "--run", "old", "--store", store, "--out", str(tmp_path / "old.parquet")]) == 0
    write_deltalake(
        str(tables.root / "delta_answers"), pq.read_table(tmp_path / "old.parquet").drop(["reused", "escalated"])
    )
    other = answered_run(tmp_path, "new", 2)
    capsys.readouterr()
    assert main(["collect", "--run", "new", "--store", other, "--out", SINKS["delta"](tables)]) == 1
    err = capsys.readouterr().err
    assert "the run has reused, escalated, the table does not" in err
    assert "add reused (boolean) and escalated (string) to the table" in err


def test_collect_merge_on_refuses_a_column_the_run_lacks_or_a_file_output(tables, tmp_path, capsys):
    store = answered_run(tmp_path, "c", 3)
    out = SINKS["delta"](tables)
    assert main(["collect", "--run", "c", "--store", store, "--out", out, "--merge-on", "idd"]) == 1
    err = capsys.readouterr().err
    assert "--merge-on idd: the run's table has no such column (its columns: id, text," in err
    assert "did you mean 'id'?" in err and not (tables.root / "delta_answers").exists()
    assert (
        main(["collect", "--run", "c", "--store", store, "--out", str(tmp_path / "o.parquet"), "--merge-on", "id"]) == 1
    )
    assert "only a table is merged into" in capsys.readouterr().err


def test_collect_into_table_leaves_an_incomplete_run_out(tables, tmp_path, capsys):
    pq.write_table(rows(0, 4), tmp_path / "in.parquet")
    store = str(tmp_path / "store")
    assert prepare_table(store, "c", str(tmp_path / "in.parquet")) == 0
    out = SINKS["delta"](tables)
    assert main(["collect", "--run", "c", "--store", store, "--out", out, "--allow-partial"]) == 0
    assert "a table gets a run's rows once, and 4 are missing" in capsys.readouterr().out
    assert not (tables.root / "delta_answers").exists()


# -- grown tables and reuse ----------------------------------------------------------------------
@pytest.fixture
def greedy(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Greedy sampling (orch.yaml in the working folder), so answered rows may be reused."""
    (tmp_path / "orch.yaml").write_text("sampling:\n  temperature: 0\n")
    monkeypatch.chdir(tmp_path)


@pytest.mark.parametrize("kind", ["iceberg", "delta"])
@pytest.mark.usefixtures("greedy")
def test_prepare_reuse_from_a_grown_table_says_it_only_grew(kind, tables, tmp_path, capsys):
    first = tables.write(kind, rows(0, 5))
    store = str(tmp_path / "store")
    assert prepare_table(store, "a", tables.uri(kind)) == 0
    answer_all(store, "a")
    assert main(["collect", "--run", "a", "--store", store, "--out", str(tmp_path / "a.jsonl")]) == 0
    tables.write(kind, rows(5, 3))
    capsys.readouterr()
    assert prepare_table(store, "b", tables.uri(kind), "--reuse-from", "a", "--rows-per-chunk", "2") == 0
    said = capsys.readouterr()
    word = "snapshot" if kind == "iceberg" else "version"
    assert f"grew by 3 rows (appends only) since run a read {word} {first}" in said.out + said.err
    assert "keyed 3 appended rows; 5 older rows keyed by a" in said.err
    assert "5 of 8 rows answered by a" in said.err
    assert [line["custom_id"] for line in chunk_lines(store, "b")] == ["r5", "r6", "r7"]
    answer_all(store, "b")
    capsys.readouterr()
    assert main(["collect", "--run", "b", "--store", store, "--out", str(tmp_path / "b.jsonl"), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["complete"] and report["reused"] == 5 and report["rows_run"] == 3 and report["rows_total"] == 8
    out = [json.loads(line) for line in (tmp_path / "b.jsonl").read_text().splitlines()]
    # Every row of the new snapshot once, in table order, the older ones with run a's answers.
    assert [line["custom_id"] for line in out] == [f"r{i}" for i in range(8)]
    assert [line["response"]["body"]["choices"][0]["message"]["content"] for line in out] == [
        f"answer r{i}" for i in range(8)
    ]


@pytest.mark.parametrize("kind", ["iceberg", "delta"])
@pytest.mark.usefixtures("greedy")
def test_prepare_reuse_from_a_table_changed_by_a_delete_says_it_reads_the_whole_table(kind, tables, tmp_path, capsys):
    from deltalake import DeltaTable

    tables.write(kind, rows(0, 5))
    store = str(tmp_path / "store")
    assert prepare_table(store, "a", tables.uri(kind)) == 0
    answer_all(store, "a")
    assert main(["collect", "--run", "a", "--store", store, "--out", str(tmp_path / "a.jsonl")]) == 0
    tables.write(kind, rows(5, 3))
    if kind == "iceberg":
        tables.catalog().load_table("db.q").delete("n = 1")
    else:
        DeltaTable(str(tables.root / "delta_q")).delete("n = 1")
    capsys.readouterr()
    assert prepare_table(store, "b", tables.uri(kind), "--reuse-from", "a") == 0
    said = capsys.readouterr()
    assert "the whole table is read and keyed again" in said.out + said.err
    assert "not only appended" in said.err and "appended rows" not in said.err
    # Every row of the new version once: the four old ones left reused, the three new ones to run.
    assert "4 of 7 rows answered by a" in said.err
    assert [line["custom_id"] for line in chunk_lines(store, "b")] == ["r5", "r6", "r7"]
    answer_all(store, "b")
    assert main(["collect", "--run", "b", "--store", store, "--out", str(tmp_path / "b.jsonl")]) == 0
    out = [json.loads(line)["custom_id"] for line in (tmp_path / "b.jsonl").read_text().splitlines()]
    assert sorted(out) == sorted(f"r{i}" for i in range(8) if i != 1)


def test_iceberg_rows_follow_field_ids_through_renames_and_a_dropped_and_added_column(tables):
    """Data files read as plain Parquet where they hold the columns as the table names them now
    (table_lake._plain_iceberg_file); a renamed column, or one dropped and added again under its old
    name (a new field id: the old files' values are not its values), goes through pyiceberg."""
    from pyiceberg.types import StringType

    from orchestrator.prepare.table_sources.tables import table_batches

    tables.write("iceberg", rows(0, 3))
    iceberg = tables.catalog().load_table("db.q")
    with iceberg.update_schema() as update:
        update.rename_column("question", "text")
    iceberg = tables.catalog().load_table("db.q")
    iceberg.append(pa.table({"id": ["r3"], "text": ["question 3"], "n": [3]}))
    with iceberg.update_schema() as update:
        update.delete_column("n")
    with iceberg.update_schema() as update:
        update.add_column("n", StringType())
    iceberg = tables.catalog().load_table("db.q")
    iceberg.append(pa.table({"id": ["r4"], "text": ["question 4"], "n": ["new"]}))
    (source,) = resolve_sources([tables.uri("iceberg")])
    # Each file's batches as its reader types them (a plain file's string, pyiceberg's large_string).
    read = [row for batch in table_batches(source, ["id", "text", "n"]) for row in batch.to_pylist()]
    assert [row["id"] for row in read] == ["r0", "r1", "r2", "r3", "r4"]
    assert [row["text"] for row in read] == [f"question {i}" for i in range(5)]
    assert [row["n"] for row in read] == [None, None, None, None, "new"]
