"""`serve: {reuse: true}`: a batch reuses its own API key's earlier answers, never another key's.

Driven as test_serve.py drives the server: `orch serve` in its own process, the official openai SDK
as the client, the tiny model on real local workers. What reached the engine is read from the
batch's run in the store (its manifest: the rows put into chunks; reuse.json: the rows answered
from earlier batches).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import openai
import pytest

from orchestrator.core.layout import RunLayout
from orchestrator.core.records import BatchDocument, BatchStatus, ReuseRecord, read_manifest, read_record
from orchestrator.core.store import Store, open_store
from orchestrator.prepare.answers.answer_index import record_dtype, write_index
from orchestrator.serve.batch_states import LAYOUT
from orchestrator.serve.reuse import earlier_runs
from tests.support.serving import (
    ALIAS,
    KEY,
    OTHER_KEY,
    SPEC,
    Server,
    chat_line,
    create,
    final,
    lines_of,
    running_server,
    upload,
    wait_for,
    write_requests,
)

REUSE_SPEC = SPEC + "  reuse: true\n"


def questions(prefix: str, numbers: range) -> list[dict[str, Any]]:
    """Greedy chats (rows that sample are not reused by default), question i under custom_id prefix+i."""
    return [chat_line(f"{prefix}{i}", f"Question {i}?", temperature=0) for i in numbers]


def run_batch(server: Server, key: str, path: Path) -> tuple[Any, list[str]]:
    """A batch of the file under `key`, to its end; returns it and its output file's raw lines."""
    client = server.client(key)
    batch, _ = wait_for(client, create(client, upload(client, path).id).id, final)
    assert batch.status == "completed", batch
    return batch, raw_lines(client, batch.output_file_id)


def raw_lines(client: openai.OpenAI, file_id: str | None) -> list[str]:
    assert file_id is not None
    return [line for line in client.files.content(file_id).text.split("\n") if line]


def engine_rows(server: Server, batch_id: str) -> tuple[int, int]:
    """(rows put into the run's chunks, rows answered from earlier batches)."""
    store = open_store(server.store_uri)
    layout = RunLayout(batch_id)
    found = read_record(store, layout.reuse_record, ReuseRecord)
    return sum(e.rows for e in read_manifest(store, layout)), found[0].rows if found is not None else 0


def stored_batch(store: Store, owner: str, batch_id: str, created_ms: int, status: BatchStatus, index: bool) -> None:
    """A batch document in the owner's listing, its run with an (empty) answer index or none."""
    import numpy as np

    doc = BatchDocument(
        id=batch_id,
        owner=owner,
        endpoint="/v1/chat/completions",
        input_file_id="file-1",
        completion_window="24h",
        status=status,
        created_at=created_ms // 1000,
        created_ms=created_ms,
        expires_at=10**10,
    )
    store.put(LAYOUT.batch(batch_id), doc.to_bytes())
    store.put(LAYOUT.owned(owner, "batches", created_ms, batch_id), b"")
    if index:
        write_index(store, RunLayout(batch_id), np.zeros(0, dtype=record_dtype()), [batch_id], "0" * 32, 0)


def test_serve_reuse_sources_are_the_owners_finished_batches_with_an_index_newest_first(tmp_path):
    store = open_store(str(tmp_path / "store"))
    stored_batch(store, "a", "batch_a1", 1000, "completed", index=True)
    stored_batch(store, "b", "batch_b1", 1500, "completed", index=True)  # another key's: never
    stored_batch(store, "a", "batch_a2", 2000, "failed", index=False)  # failed validation: no run
    stored_batch(store, "a", "batch_a3", 3000, "expired", index=True)
    stored_batch(store, "a", "batch_a4", 4000, "cancelled", index=True)
    store.put(RunLayout("batch_a4").answer_index, b"{not json")  # damaged: passed over, no error
    stored_batch(store, "a", "batch_a5", 5000, "in_progress", index=True)  # not finished
    stored_batch(store, "a", "batch_a6", 6000, "validating", index=False)  # the new batch itself
    assert earlier_runs(store, "a", "batch_a6") == ["batch_a3", "batch_a1"]
    assert earlier_runs(store, "a", "batch_a6", limit=1) == ["batch_a3"]
    assert earlier_runs(store, "b", "batch_b2") == ["batch_b1"]


@pytest.mark.slow
def test_serve_reuse_runs_only_a_grown_batchs_new_rows_and_never_crosses_keys(tmp_path):
    """Key A's first batch, then the same requests (new custom_ids) plus two new ones: only the two
    reach the engine, the six old answers come back byte for byte under their new ids, marked
    reused. Key B's same grown batch runs every row. A's first file again runs nothing at all."""
    first = write_requests(tmp_path / "first.jsonl", questions("a", range(6)))
    grown = write_requests(tmp_path / "grown.jsonl", questions("b", range(8)))
    with running_server(tmp_path / "server", str(tmp_path / "store"), REUSE_SPEC) as server:
        _, old = run_batch(server, KEY, first)
        batch, new = run_batch(server, KEY, grown)
        assert engine_rows(server, batch.id) == (2, 6)
        assert batch.request_counts is not None
        assert (batch.request_counts.total, batch.request_counts.completed, batch.request_counts.failed) == (8, 8, 0)
        for i in range(6):
            # The earlier line, byte for byte, under this batch's custom_id and an id of its own, the mark last.
            expected = old[i].replace(f'"custom_id":"a{i}"', f'"custom_id":"b{i}"')[:-1] + ',"reused":true}'
            earlier_id, own_id = json.loads(old[i])["id"], json.loads(new[i])["id"]
            assert new[i] == expected.replace(f'"id":"{earlier_id}"', f'"id":"{own_id}"')
        assert len({json.loads(line)["id"] for line in new}) == 8 and all(
            batch.id in json.loads(x)["id"] for x in new[:6]
        )
        assert [json.loads(line).get("reused") for line in new[6:]] == [None, None]
        # The batch's usage is the engine's work: the two new rows' tokens only.
        ran = [json.loads(line)["response"]["body"]["usage"] for line in new[6:]]
        assert batch.usage is not None
        assert batch.usage.input_tokens == sum(u["prompt_tokens"] for u in ran)
        assert batch.usage.output_tokens == sum(u["completion_tokens"] for u in ran)

        other, others = run_batch(server, OTHER_KEY, grown)
        assert engine_rows(server, other.id) == (8, 0)
        assert all("reused" not in json.loads(line) for line in others)

        again, lines = run_batch(server, KEY, first)
        assert engine_rows(server, again.id) == (0, 6)
        assert again.request_counts is not None and again.request_counts.completed == 6
        assert [json.loads(line)["custom_id"] for line in lines] == [f"a{i}" for i in range(6)]
        assert all(json.loads(line)["reused"] is True for line in lines)

    # Reuse off (the default), on the same store with the same key's batches in it: every row runs.
    with running_server(tmp_path / "off", str(tmp_path / "store")) as server:
        batch, lines = run_batch(server, KEY, grown)
        assert engine_rows(server, batch.id) == (8, 0)
        assert all("reused" not in json.loads(line) for line in lines)
        assert lines_of(server.client(KEY), batch.error_file_id) == []


@pytest.mark.slow
def test_serve_reuse_in_batches_naming_two_models_runs_each_models_new_rows_only(tmp_path):
    """`serve.several_models` with reuse: a grown batch of lines naming `tiny` and its alias runs
    only its two new rows, one per model; the old rows keep their answers under the name they asked for."""
    spec = REUSE_SPEC.replace("  rows_per_chunk: 4\n", "  rows_per_chunk: 4\n  several_models: true\n")

    def lines(prefix: str, n: int) -> list[dict[str, Any]]:
        return [
            chat_line(f"{prefix}{i}", f"Question {i}?", "tiny" if i % 2 else ALIAS, temperature=0) for i in range(n)
        ]

    with running_server(tmp_path / "server", str(tmp_path / "store"), spec) as server:
        _, old = run_batch(server, KEY, write_requests(tmp_path / "first.jsonl", lines("a", 4)))
        batch, new = run_batch(server, KEY, write_requests(tmp_path / "grown.jsonl", lines("b", 6)))
        assert engine_rows(server, batch.id) == (2, 4)
        bodies = [json.loads(line)["response"]["body"] for line in new]
        assert [b["model"] for b in bodies] == ["tiny" if i % 2 else ALIAS for i in range(6)]
        assert [b["choices"] for b in bodies[:4]] == [json.loads(line)["response"]["body"]["choices"] for line in old]
        assert [json.loads(line).get("reused") for line in new] == [True] * 4 + [None] * 2
