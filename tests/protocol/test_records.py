"""The run's documents: one reader that names a corrupt object, one read-change-write that no race loses."""

from __future__ import annotations

import threading

import pytest

from orchestrator.cli import main
from orchestrator.core.records import JobsRecord, cas_update, read_record
from orchestrator.core.store import open_store
from tests.support.runs import chat_request, make_run
from tests.support.s3servers import make_store_uri


@pytest.mark.parametrize("kind", ["local", *(pytest.param(k, marks=pytest.mark.slow) for k in ("moto", "seaweedfs"))])
def test_cas_update_loses_no_update_when_writers_race(kind, request, tmp_path):
    """Eight threads each bump a counter in one document ten times: every bump lands exactly once."""
    store = open_store(make_store_uri(kind, request, tmp_path))

    def bump(record: JobsRecord | None) -> JobsRecord:
        record = record or JobsRecord()
        record.worker(0).relaunches += 1
        return record

    failures: list[Exception] = []

    def writer() -> None:
        try:
            for _ in range(10):
                cas_update(store, "doc.json", JobsRecord, bump)
        except Exception as e:  # reported below: a thread's exception would otherwise vanish
            failures.append(e)

    threads = [threading.Thread(target=writer) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert failures == []
    found = read_record(store, "doc.json", JobsRecord)
    assert found is not None and found[0].worker(0).relaunches == 80


@pytest.mark.parametrize("kind", ["local", pytest.param("moto", marks=pytest.mark.slow)])
def test_cas_update_applies_two_identical_changes_twice(kind, request, tmp_path):
    """Two writers make the same change from the same version: the second must not mistake the first's
    bytes for its own (an S3 store counts identical bytes after a 412 as its own retried write)."""
    store = open_store(make_store_uri(kind, request, tmp_path))
    cas_update(store, "doc.json", JobsRecord, lambda _: JobsRecord())
    interleaved = []

    def bump(record: JobsRecord | None) -> JobsRecord:
        assert record is not None
        if not interleaved:  # the other writer reads the same version and writes first
            interleaved.append(True)
            cas_update(store, "doc.json", JobsRecord, bump)
        record.worker(0).relaunches += 1
        return record

    cas_update(store, "doc.json", JobsRecord, bump)
    found = read_record(store, "doc.json", JobsRecord)
    assert found is not None and found[0].worker(0).relaunches == 2


def test_cas_update_writes_nothing_when_the_change_says_so(tmp_path):
    store = open_store(tmp_path / "s")
    assert cas_update(store, "doc.json", JobsRecord, lambda _current: None) == (None, None)
    assert read_record(store, "doc.json", JobsRecord) is None


@pytest.mark.parametrize(
    ("document", "command"),
    [
        ("plan.json", ["status"]),
        ("jobs.json", ["status"]),
        ("manifest.jsonl", ["status"]),
        ("spec.yaml", ["status"]),
        ("plan.json", ["launch", "--workers", "1"]),
    ],
)
def test_corrupt_document_gives_one_error_line_naming_its_key(document, command, tmp_path, capsys, monkeypatch):
    """Every reader of every document says which object is broken; none dies with a traceback."""
    monkeypatch.chdir(tmp_path)
    store_uri = str(tmp_path / "store")
    store = open_store(store_uri)
    layout = make_run(store, "r", [[chat_request("a", "q")]], model="m")
    store.put(layout.jobs, b'{"workers": {}}')
    store.put(f"{layout.root}{document}", b"{not what orch wrote")
    code = main([*command, "--run", "r", "--store", store_uri])
    err = capsys.readouterr().err
    assert code != 0
    assert err.startswith("ERROR ") and f"runs/r/{document}" in err and "Traceback" not in err
    assert "hint:" in err
