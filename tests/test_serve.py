"""`orch serve` through a client nobody here wrote: the official openai SDK against the real server.

The server runs as `python -m orchestrator serve` (uvicorn on 127.0.0.1, a free port), its batches on
real local workers with the tiny model, its state in real stores (a directory and SeaweedFS). The
tests talk to it only through `openai.OpenAI(base_url=..., api_key=...)`, and parse every object it
returns with the SDK's own types (`Batch`, `FileObject`, `ChatCompletion`). What they read from the
store directly is what must (not) be there: no run for a batch that failed validation, no key in
clear, one launch per worker.
"""

from __future__ import annotations

import contextlib
import http.client
import itertools
import json
import signal
import subprocess
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import openai
import pytest
from openai.types import Batch, CreateEmbeddingResponse, FileObject
from openai.types.chat import ChatCompletion
from openai.types.responses import Response

from orchestrator.cli import main
from orchestrator.core.layout import RunLayout
from orchestrator.core.records import read_jobs, read_plan
from orchestrator.core.store import open_store
from tests.support import raw_http
from tests.support.models import REAL_ENGINE, TINY, scripted_engine
from tests.support.raw_http import MiB
from tests.support.serving import (
    ALIAS,
    CHAT,
    KEY,
    MAX_FILE_BYTES,
    MAX_REQUESTS,
    OTHER_KEY,
    RESPONSES,
    SERVED,
    SHORT_WINDOWS,
    SPEC,
    Server,
    chat_line,
    create,
    final,
    lines_of,
    retrieve,
    running_server,
    start_server,
    upload,
    wait_for,
    write_requests,
)

pytestmark = [
    pytest.mark.slow,
    pytest.mark.xdist_group("serve"),
]  # one xdist worker: its tests share the module's server


@pytest.fixture(scope="module")
def local_server(tmp_path_factory) -> Iterator[Server]:
    """The server most tests share, its workers on vLLM: what the SDK's batches are answered by."""
    workdir = tmp_path_factory.mktemp("serve-local")
    with running_server(workdir, str(workdir / "store"), env=REAL_ENGINE) as server:
        yield server


@pytest.fixture(scope="module")
def seaweedfs_server_for_serve(tmp_path_factory, seaweedfs_server, seaweedfs_bucket) -> Iterator[Server]:
    workdir = tmp_path_factory.mktemp("serve-seaweedfs")
    store_uri = seaweedfs_server.store_uri(seaweedfs_bucket, "serve")
    with running_server(workdir, store_uri, env=scripted_engine()) as server:
        yield server


def mixed_requests(n: int) -> list[dict[str, Any]]:
    """Every third asks for more tokens than the tiny model's context holds: an error row, not a failed batch."""
    return [chat_line(f"q{i}", f"Question {i}?", **({"max_tokens": 5000} if i % 3 == 2 else {})) for i in range(n)]


def check_split(output: list[dict[str, Any]], errors: list[dict[str, Any]], ids: list[str]) -> None:
    """Every custom_id exactly once across the two files; successes are chat completions of `tiny`."""
    answered = [line["custom_id"] for line in output + errors]
    assert sorted(answered) == sorted(ids)
    for line in output:
        assert line["error"] is None and line["response"]["status_code"] == 200
        completion = ChatCompletion.model_validate(line["response"]["body"])
        assert completion.model == "tiny"
    for line in errors:
        assert line["error"]["code"]


# -- the tests ----------------------------------------------------------------------------------
# The local server's workers run vLLM (the openai SDK's batch end to end); the SeaweedFS server's the
# scripted engine: there the store is what the test is about.
@pytest.mark.parametrize("kind", [pytest.param("local", marks=pytest.mark.real_engine), "seaweedfs"])
def test_serve_mixed_batch_splits_good_rows_into_output_and_bad_into_errors(kind, request, tmp_path):
    server: Server = request.getfixturevalue("local_server" if kind == "local" else "seaweedfs_server_for_serve")
    client = server.client()
    requests = mixed_requests(12)
    source = upload(client, write_requests(tmp_path / "mixed.jsonl", requests))
    assert source.purpose == "batch" and source.filename == "mixed.jsonl"
    created = create(client, source.id, metadata={"job": "mixed"})
    assert (created.status, created.metadata, created.endpoint) == ("validating", {"job": "mixed"}, CHAT)

    batch, seen = wait_for(client, created.id, final)

    assert batch.status == "completed", batch
    assert {b.status for b in seen} <= {"validating", "in_progress", "finalizing", "completed"}
    assert all(b.request_counts.total == 12 for b in seen if b.status == "in_progress")
    assert batch.created_at <= batch.in_progress_at <= batch.finalizing_at <= batch.completed_at
    assert batch.expires_at == batch.created_at + 24 * 3600
    assert batch.model == "tiny" and batch.errors is None
    assert (batch.request_counts.total, batch.request_counts.completed, batch.request_counts.failed) == (12, 8, 4)
    output, errors = lines_of(client, batch.output_file_id), lines_of(client, batch.error_file_id)
    check_split(output, errors, [r["custom_id"] for r in requests])
    assert {line["custom_id"] for line in errors} == {f"q{i}" for i in (2, 5, 8, 11)}
    assert {line["error"]["code"] for line in errors} == {"context_length_exceeded"}
    assert batch.usage is not None
    assert batch.usage.output_tokens == sum(line["response"]["body"]["usage"]["completion_tokens"] for line in output)
    assert batch.usage.total_tokens == batch.usage.input_tokens + batch.usage.output_tokens > 0
    assert batch.usage.input_tokens_details.cached_tokens == sum(
        line["response"]["body"]["usage"]["prompt_tokens_details"]["cached_tokens"] for line in output
    )
    with pytest.raises(openai.ConflictError, match="completed"):
        client.batches.cancel(batch.id)
    # Listed for its key, through the SDK's own pagination (`after` cursors, one batch a page).
    assert created.id in [b.id for b in client.batches.list(limit=1)]
    listed = json.loads(client.files.with_raw_response.list().text)["data"]
    assert {source.id, batch.output_file_id, batch.error_file_id} <= {FileObject.model_validate(f).id for f in listed}

    # The batch is an orch run: status and collect work on it by its id.
    assert main(["status", "--run", batch.id, "--store", server.store_uri]) == 0
    collect = ["collect", "--run", batch.id, "--store", server.store_uri, "--out", str(tmp_path / "all.jsonl")]
    assert main(collect) == 9  # a third of the rows are errors: above the default --max-error-rate
    assert main([*collect, "--max-error-rate", "1.0"]) == 0
    collected = [json.loads(line)["custom_id"] for line in (tmp_path / "all.jsonl").read_text().split("\n") if line]
    assert collected == [r["custom_id"] for r in requests]


@pytest.mark.real_engine  # orch serve driven by the openai SDK, answered by vLLM
def test_serve_answers_a_model_alias_under_the_name_the_client_asked_for(local_server, tmp_path):
    """`--model-alias gpt-4o-mini=tiny`: the SDK's batch naming gpt-4o-mini runs on tiny, and every
    answer names gpt-4o-mini; the server said at start-up which base_url to give the SDK."""
    log = (local_server.workdir / "server.log").read_text()
    assert f"orch serve: listening on http://127.0.0.1:{local_server.port}/v1 (the SDK's base_url)" in log
    client = local_server.client()
    source = upload(
        client, write_requests(tmp_path / "alias.jsonl", [chat_line(f"a{i}", "Hi?", ALIAS) for i in range(2)])
    )
    batch, _ = wait_for(client, create(client, source.id).id, final)
    assert (batch.status, batch.model) == ("completed", ALIAS), batch
    output = lines_of(client, batch.output_file_id)
    assert [ChatCompletion.model_validate(line["response"]["body"]).model for line in output] == [ALIAS, ALIAS]


def pooling_line(custom_id: str, url: str, **body: Any) -> dict[str, Any]:
    return {"custom_id": custom_id, "method": "POST", "url": url, "body": {"model": "tiny-embed", **body}}


@pytest.mark.real_engine  # vLLM's pooling runner answers
def test_serve_embeddings_and_score_batches_run_on_pooling_workers(local_server, tmp_path):
    """An embeddings batch and a score batch, each through the SDK and the embedding model's own
    (pooling) workers: every output line an SDK CreateEmbeddingResponse (embeddings) or vLLM's score
    shape, a bad line in the error file, the counts and usage of both batches."""
    client = local_server.client()
    texts = ["Hello", "What is the capital of France?", "Write a haiku about the ocean"]
    embeddings = [
        *(pooling_line(f"e{i}", "/v1/embeddings", input=t) for i, t in enumerate(texts)),
        pooling_line("e3", "/v1/embeddings", input=texts, dimensions=32),
        pooling_line("e4", "/v1/embeddings", input="Hello", dimensions=33),  # not a Matryoshka size: an error row
    ]
    scores = [
        pooling_line("s0", "/v1/score", queries=texts[1], documents=texts),
        pooling_line("s1", "/v1/score", text_1=texts[:2], text_2=texts[1:]),
    ]
    batches = [
        create(client, upload(client, write_requests(tmp_path / f"{name}.jsonl", lines)).id, endpoint=url)
        for name, lines, url in (("embed", embeddings, "/v1/embeddings"), ("score", scores, "/v1/score"))
    ]
    embed_batch, _ = wait_for(client, batches[0].id, final)
    score_batch, _ = wait_for(client, batches[1].id, final)

    assert embed_batch.status == "completed" and embed_batch.model == "tiny-embed", embed_batch
    counts = embed_batch.request_counts
    assert counts is not None and (counts.total, counts.completed, counts.failed) == (5, 4, 1)
    output = {line["custom_id"]: line for line in lines_of(client, embed_batch.output_file_id)}
    assert sorted(output) == ["e0", "e1", "e2", "e3"]
    vectors = {}
    for custom_id, line in output.items():
        response = CreateEmbeddingResponse.model_validate(line["response"]["body"])
        assert response.model == "tiny-embed" and response.usage.prompt_tokens > 0
        vectors[custom_id] = [d.embedding for d in response.data]
    assert [len(v) for v in vectors["e3"]] == [32, 32, 32] and len(vectors["e0"][0]) == 128
    assert vectors["e0"][0] != vectors["e1"][0]
    [error] = lines_of(client, embed_batch.error_file_id)
    assert error["custom_id"] == "e4" and error["response"]["body"]["error"]["param"] == "dimensions"
    assert embed_batch.usage is not None and embed_batch.usage.output_tokens == 0
    assert embed_batch.usage.input_tokens == sum(
        line["response"]["body"]["usage"]["prompt_tokens"] for line in output.values()
    )

    assert score_batch.status == "completed" and score_batch.error_file_id is None, score_batch
    scored = {line["custom_id"]: line["response"]["body"] for line in lines_of(client, score_batch.output_file_id)}
    # vLLM's ScoreResponse (tests/worker/test_embeddings.py checks it against vLLM's own model and run_batch).
    assert set(scored["s0"]) == {"id", "object", "created", "model", "data", "usage"}
    assert [d["index"] for d in scored["s0"]["data"]] == [0, 1, 2] and len(scored["s1"]["data"]) == 2
    assert scored["s0"]["data"][1]["score"] == pytest.approx(1.0, abs=1e-5)  # a text against itself
    # A cosine, within float32's rounding of [-1, 1].
    assert all(abs(d["score"]) <= 1 + 1e-5 and d["object"] == "score" for body in scored.values() for d in body["data"])
    assert {body["model"] for body in scored.values()} == {"tiny-embed"}


VALIDATION_CASES = {
    "not-jsonl": (["custom_id,content", "q0,hello"], CHAT, {("invalid_json_line", 1), ("invalid_json_line", 2)}),
    # Python's json reads and writes NaN; JSON, the Batch API and prepare do not.
    "nan-parameter": (
        [json.dumps(chat_line("q0", "a")), json.dumps({**chat_line("q1", "b"), "body": {"temperature": float("nan")}})],
        CHAT,
        {("invalid_json_line", 2)},
    ),
    "no-custom-id": (
        [
            json.dumps(chat_line("q0", "hi")),
            json.dumps({k: v for k, v in chat_line("q1", "hi").items() if k != "custom_id"}),
        ],
        CHAT,
        {("missing_required_parameter", 2)},
    ),
    "duplicate-custom-id": (
        [json.dumps(chat_line("q0", "a")), json.dumps(chat_line("q1", "b")), json.dumps(chat_line("q0", "c"))],
        CHAT,
        {("duplicate_custom_id", 3)},
    ),
    "endpoint-mismatch": (
        [json.dumps(chat_line("q0", "a")), json.dumps(chat_line("q1", "b"))],
        "/v1/completions",
        {("invalid_url", 1), ("invalid_url", 2)},
    ),
    "unknown-model": (
        [json.dumps(chat_line("q0", "a")), json.dumps(chat_line("q1", "b", model="gpt-5-nano"))],
        CHAT,
        {("model_not_found", 2)},
    ),
    "model-not-for-the-endpoint": (
        [json.dumps(chat_line("q0", "a")), json.dumps(chat_line("q1", "b", model="tiny-embed"))],
        CHAT,
        {("model_not_supported", 2)},
    ),
    "too-many-lines": (
        [json.dumps(chat_line(f"q{i}", "a")) for i in range(MAX_REQUESTS + 1)],
        CHAT,
        {("too_many_tasks", None)},
    ),
    "too-large": ([json.dumps(chat_line("q0", "x" * MAX_FILE_BYTES))], CHAT, {("file_too_large", None)}),
    "responses-without-input": (
        [json.dumps({"custom_id": "q0", "method": "POST", "url": RESPONSES, "body": {"model": "tiny"}})],
        RESPONSES,
        {("invalid_request", 1)},
    ),
}


@pytest.mark.parametrize("case", list(VALIDATION_CASES))
def test_serve_validation_fails_the_batch_with_openai_errors_and_launches_nothing(case, local_server, tmp_path):
    lines, endpoint, expected = VALIDATION_CASES[case]
    client = local_server.client()
    path = tmp_path / "input.jsonl"
    path.write_text("\n".join(lines) + "\n")
    created = create(client, upload(client, path).id, endpoint=endpoint)

    batch, _ = wait_for(client, created.id, final)

    assert batch.status == "failed" and batch.failed_at is not None
    assert batch.errors is not None and batch.errors.object == "list" and batch.errors.data
    assert {(e.code, e.line) for e in batch.errors.data} == expected
    assert all(e.message for e in batch.errors.data)
    if case == "unknown-model":
        assert "tiny" in (batch.errors.data[0].message or "")  # the served names
    if case == "model-not-for-the-endpoint":  # the model, the endpoint, and the models that answer it
        assert "'tiny-embed' does not support /v1/chat/completions" in (batch.errors.data[0].message or "")
        assert "Served models for /v1/chat/completions: gpt-4o-mini, tiny." in (batch.errors.data[0].message or "")
    assert batch.output_file_id is None and batch.error_file_id is None
    # Nothing was prepared or launched: the batch has no run at all.
    assert list(open_store(local_server.store_uri).list(RunLayout(batch.id).root)) == []


def test_serve_an_empty_batch_completes_with_0_requests_and_launches_nothing(local_server, tmp_path):
    client = local_server.client()
    path = tmp_path / "empty.jsonl"
    path.write_text("")
    created = create(client, upload(client, path).id)

    batch, _ = wait_for(client, created.id, final)

    assert batch.status == "completed" and batch.completed_at is not None and batch.errors is None
    assert batch.request_counts is not None and batch.request_counts.total == 0
    assert batch.request_counts.completed == batch.request_counts.failed == 0
    assert batch.output_file_id is None and batch.error_file_id is None
    assert list(open_store(local_server.store_uri).list(RunLayout(batch.id).root)) == []


def test_serve_create_refuses_bad_requests_as_openai_does(local_server, tmp_path):
    client = local_server.client()
    source = upload(client, write_requests(tmp_path / "ok.jsonl", [chat_line("q0", "hi")]))
    with pytest.raises(openai.BadRequestError, match="endpoint"):
        create(client, source.id, endpoint="/v1/moderations")
    with pytest.raises(openai.BadRequestError, match="completion_window"):
        create(client, source.id, window="1h")
    with pytest.raises(openai.NotFoundError):
        create(client, "file-doesnotexist")
    with pytest.raises(openai.BadRequestError, match="purpose"), open(tmp_path / "ok.jsonl", "rb") as f:
        client.files.create(file=f, purpose="fine-tune")


@pytest.mark.real_engine  # Response objects of vLLM's answers
def test_serve_responses_batch_answers_each_line_with_a_response(local_server, tmp_path):
    """A /v1/responses batch as openai-python's examples/responses/batch.py writes it."""
    client = local_server.client()
    bodies = [
        {"input": "Hello", "max_output_tokens": 4, "temperature": 0},
        {"instructions": "Be brief.", "input": [{"role": "user", "content": "Hi"}], "metadata": {"k": "v"}},
    ]
    requests = [
        {"custom_id": f"r{i}", "method": "POST", "url": RESPONSES, "body": {"model": "tiny", **body}}
        for i, body in enumerate(bodies)
    ]
    created = create(client, upload(client, write_requests(tmp_path / "r.jsonl", requests)).id, endpoint=RESPONSES)
    assert created.endpoint == RESPONSES

    batch, _ = wait_for(client, created.id, final)

    assert batch.status == "completed" and batch.error_file_id is None, batch
    output = {line["custom_id"]: line for line in lines_of(client, batch.output_file_id)}
    answers = {cid: Response.model_validate(line["response"]["body"]) for cid, line in output.items()}
    assert sorted(answers) == ["r0", "r1"]
    # max_output_tokens 4 cuts the answer; the spec's max_tokens (8) does the same for the other.
    assert all(r.status == "incomplete" and r.incomplete_details for r in answers.values())
    assert answers["r0"].incomplete_details.reason == "max_output_tokens"  # type: ignore[union-attr]
    assert answers["r0"].usage is not None and answers["r0"].usage.output_tokens == 4
    assert answers["r1"].instructions == "Be brief." and answers["r1"].metadata == {"k": "v"}
    assert all(r.model == "tiny" and r.output_text for r in answers.values())
    assert batch.usage is not None
    assert batch.usage.output_tokens == sum(r.usage.output_tokens for r in answers.values() if r.usage)


def test_serve_a_key_sees_only_its_own_files_and_batches(local_server, tmp_path):
    first, second = local_server.client(KEY), local_server.client(OTHER_KEY)
    # A batch that fails validation (an unknown model) costs no worker.
    source = upload(first, write_requests(tmp_path / "mine.jsonl", [chat_line("q0", "hi", model="nope")]))
    batch, _ = wait_for(first, create(first, source.id).id, final)

    for call in (
        lambda: second.batches.retrieve(batch.id),
        lambda: second.batches.cancel(batch.id),
        lambda: second.files.retrieve(source.id),
        lambda: second.files.content(source.id),
        lambda: second.files.delete(source.id),
        lambda: second.batches.create(input_file_id=source.id, endpoint=CHAT, completion_window="24h"),
    ):
        with pytest.raises(openai.NotFoundError):
            call()
    assert batch.id not in [b.id for b in second.batches.list()]
    assert source.id not in [f.id for f in second.files.list()]
    assert retrieve(first, batch.id).id == batch.id
    with pytest.raises(openai.AuthenticationError):
        local_server.client("sk-not-a-key").batches.list()
    # The store knows the keys only by their hashes.
    store = open_store(local_server.store_uri)
    for info in store.list("serve/"):
        data = store.get(info.key).data
        assert KEY.encode() not in data and OTHER_KEY.encode() not in data and KEY not in info.key
    # Deleting is the owner's: then the file is gone for it too.
    deleted = first.files.delete(source.id)
    assert deleted.deleted and deleted.id == source.id
    with pytest.raises(openai.NotFoundError):
        first.files.retrieve(source.id)


def test_serve_create_batch_with_an_idempotency_key_makes_one_batch_however_often_it_is_sent(local_server, tmp_path):
    """The retries of a client that timed out, some racing the first request: one batch, returned to
    each as it is now. The key is the owner's: another request under it is refused, and another API
    key sending it gets nothing of the first's. (OTHER_KEY uploads nothing: the files list test's.)"""
    client, other = local_server.client(KEY), local_server.client(OTHER_KEY)
    # An unknown model: the batch fails validation at once and costs no worker.
    lines = [chat_line("q0", "hi", model="nope")]
    source = upload(client, write_requests(tmp_path / "once.jsonl", lines))
    job = {"job": f"once-{uuid.uuid4().hex[:8]}"}
    key = {"Idempotency-Key": f"retry-{uuid.uuid4()}"}

    with ThreadPoolExecutor(4) as pool:
        racing = list(pool.map(lambda _: create(client, source.id, metadata=job, extra_headers=key), range(4)))
    first = racing[0]
    assert {b.id for b in racing} == {first.id}
    ended, _ = wait_for(client, first.id, final)
    again = create(client, source.id, metadata=job, extra_headers=key)
    assert (again.id, again.created_at) == (first.id, first.created_at)
    assert again.status == ended.status == "failed"  # the batch as it is now
    assert [b.id for b in client.batches.list() if b.metadata == job] == [first.id]

    with pytest.raises(openai.BadRequestError, match="Idempotency-Key was already used") as refused:
        create(client, source.id, metadata={**job, "changed": "yes"}, extra_headers=key)
    assert refused.value.code == "idempotency_key_reused"
    with pytest.raises(openai.NotFoundError):  # not the first key's batch: its input file, another key's, is absent
        create(other, source.id, metadata=job, extra_headers=key)
    # Without the header every request is a batch of its own, as with OpenAI.
    assert create(client, source.id, metadata=job).id != create(client, source.id, metadata=job).id
    # The store names a key by its hash only.
    claims = [info.key for info in open_store(local_server.store_uri).list("serve/idempotency/")]
    assert claims and not any(key["Idempotency-Key"] in k for k in claims)


def test_serve_files_list_pages_orders_and_filters(local_server, tmp_path):
    client = local_server.client(OTHER_KEY)  # a key no other test uploads with: its list is this test's
    uploaded = [upload(client, write_requests(tmp_path / f"f{i}.jsonl", [chat_line("q0", "hi")])) for i in range(3)]
    newest_first = [f.id for f in client.files.list(limit=1)]  # three pages, through `after` cursors
    assert newest_first == [f.id for f in reversed(uploaded)]
    assert [f.id for f in client.files.list(order="asc", limit=2)] == [f.id for f in uploaded]
    assert list(client.files.list(purpose="batch_output")) == []
    client.files.delete(uploaded[1].id)
    assert [f.id for f in client.files.list()] == [uploaded[2].id, uploaded[0].id]
    assert [m.id for m in client.models.list()] == ["gpt-4o-mini", "tiny", "tiny-embed"]  # the alias too


def test_serve_refuses_to_start_without_keys_off_loopback(monkeypatch, capsys):
    monkeypatch.delenv("ORCH_API_KEYS", raising=False)
    code = main(["serve", "--host", "0.0.0.0", "--port", "1", "--model", f"tiny={TINY}", "--store", "unused"])
    assert code == 2
    assert "refusing to serve on 0.0.0.0" in capsys.readouterr().err


def test_serve_refuses_a_bad_configuration_saying_where(tmp_path, capsys):
    spec = tmp_path / "orch.yaml"
    spec.write_text(f"serve:\n  models: {{tiny: {TINY}}}\n  max_request: 10\n")
    assert main(["serve", "-f", str(spec), "--store", str(tmp_path / "store")]) == 2
    err = capsys.readouterr().err
    assert f"{spec}:3" in err and "serve.max_request: unknown field" in err
    assert main(["serve", "--model", "tiny", "--store", str(tmp_path / "store")]) == 2
    assert "is not NAME=PATH_OR_HUB_ID" in capsys.readouterr().err
    alias = ["serve", "--model", f"tiny={TINY}", "--store", str(tmp_path / "store"), "--model-alias"]
    assert main([*alias, "gpt-4o-mini=tiyn"]) == 2
    err = capsys.readouterr().err
    assert "no served model 'tiyn' (served: tiny)" in err and "did you mean gpt-4o-mini=tiny?" in err


@pytest.mark.scripted_engine(step_s=0.2)  # the worker still at work when the first server is killed
def test_serve_killed_mid_batch_and_restarted_completes_every_row_exactly_once(tmp_path):
    store_uri = str(tmp_path / "store")
    requests = mixed_requests(16)
    server = start_server(tmp_path / "first", store_uri)
    try:
        client = server.client()
        created = create(client, upload(client, write_requests(tmp_path / "in.jsonl", requests)).id)
        running, _ = wait_for(client, created.id, lambda b: b.status != "validating")
        assert running.status == "in_progress"
    finally:
        server.stop(signal.SIGKILL)  # mid-batch: its workers run on, and of the server only the store is left

    with running_server(tmp_path / "second", store_uri) as again:
        client = again.client()
        batch, _ = wait_for(client, created.id, final)
        assert batch.status == "completed", batch
        assert (batch.request_counts.completed, batch.request_counts.failed) == (11, 5)
        output, errors = lines_of(client, batch.output_file_id), lines_of(client, batch.error_file_id)
        check_split(output, errors, [r["custom_id"] for r in requests])
    # The restarted server took over the live worker instead of launching a second one.
    jobs, _ = read_jobs(open_store(store_uri), RunLayout(batch.id))
    assert [len(w.attempts) for w in jobs.workers.values()] == [1]


@pytest.mark.scripted_engine(step_s=0.05)  # a slow row takes 50 s: the batch is surely under way at the end
def test_serve_cancel_and_expiry_return_the_finished_rows(tmp_path):
    """The first chunk is quick, the rest would take many minutes. One batch is cancelled once its
    first chunk is done; the next one reaches the end of its completion window. That window is
    chosen from the time the first batch took to finish its first chunk (a worker's start-up, which
    a loaded machine stretches to a minute or more), so the second's first chunk is done by then."""
    with running_server(tmp_path / "serve", str(tmp_path / "store")) as server:
        client = server.client()
        quick = [chat_line(f"quick{i}", "Hi", max_tokens=4) for i in range(4)]
        slow = [chat_line(f"slow{i}", "Hi", max_tokens=1000, ignore_eos=True) for i in range(120)]
        source = upload(client, write_requests(tmp_path / "in.jsonl", quick + slow)).id
        started = time.time()
        cancelled = create(client, source)
        wait_for(client, cancelled.id, lambda b: b.request_counts is not None and b.request_counts.completed >= 4)
        first_chunk_s = time.time() - started
        cancelling = Batch.model_validate(json.loads(client.batches.with_raw_response.cancel(cancelled.id).text))
        assert cancelling.status == "cancelling" and cancelling.cancelling_at is not None
        ended, _ = wait_for(client, cancelled.id, final)
        assert ended.status == "cancelled" and ended.cancelled_at is not None
        assert client.batches.cancel(cancelled.id).status == "cancelled"  # again: nothing changes

        # The worker of the batch cancelled is gone: the next starts on a machine no busier than the first did.
        window = next((w for w, s in SHORT_WINDOWS.items() if s >= 1.5 * first_chunk_s + 15), "360s")
        expiring = create(client, source, window=window)
        assert expiring.expires_at == expiring.created_at + SHORT_WINDOWS[window]
        expired, _ = wait_for(client, expiring.id, final, timeout=SHORT_WINDOWS[window] + 120)
        assert expired.status == "expired" and expired.expired_at is not None
        assert expired.expired_at >= expired.expires_at

        ids = [r["custom_id"] for r in quick + slow]
        for batch, code in ((ended, "batch_cancelled"), (expired, "batch_expired")):
            output, errors = lines_of(client, batch.output_file_id), lines_of(client, batch.error_file_id)
            check_split(output, errors, ids)
            done = {line["custom_id"] for line in output}
            assert {r["custom_id"] for r in quick} <= done, f"the rows finished before the end are returned ({window})"
            assert len(done) < len(ids)
            assert {line["error"]["code"] for line in errors} == {code}
            assert batch.request_counts is not None
            assert (batch.request_counts.completed, batch.request_counts.failed) == (len(done), len(ids) - len(done))


# -- request bodies: read only after the key is checked, bounded in size and time -------------------
#: The upload limit of the guarded server: small, so that passing it is cheap.
UPLOAD_LIMIT = 8 * MiB
#: Serves the generating model only: a batch for an endpoint no served model answers is refused.
GUARDED_SPEC = (
    SPEC.replace(SERVED, f"{{tiny: {TINY}}}") + f"  max_upload_bytes: {UPLOAD_LIMIT}\n  upload_idle_timeout: 2\n"
)
BOUNDARY = "orch-test-boundary"


def spool_of(server: Server) -> Path:
    """The server's TMPDIR: where an upload is spooled, and nothing else is written."""
    return server.workdir / "tmp"


def start_spooling_server(workdir: Path, spec: str = SPEC) -> Server:
    (workdir / "tmp").mkdir(parents=True)
    return start_server(workdir, str(workdir / "store"), spec, {"TMPDIR": str(workdir / "tmp")})


@pytest.fixture(scope="module")
def guarded_server(tmp_path_factory) -> Iterator[Server]:
    server = start_spooling_server(tmp_path_factory.mktemp("serve-guarded"), GUARDED_SPEC)
    try:
        yield server
    finally:
        server.stop()


def test_serve_refuses_a_batch_for_an_endpoint_no_served_model_answers(guarded_server, tmp_path):
    """The guarded server serves a generating model only: an embeddings batch is a 400 naming the
    runner it needs and what is served, before any file is read."""
    client = guarded_server.client()
    source = upload(client, write_requests(tmp_path / "e.jsonl", [pooling_line("e0", "/v1/embeddings", input="hi")]))
    with pytest.raises(openai.BadRequestError, match="No model served here supports '/v1/rerank'") as refused:
        create(client, source.id, endpoint="/v1/rerank")
    assert "model.runner pooling" in str(refused.value) and "tiny (generate)" in str(refused.value)


@pytest.mark.parametrize("authorization", [None, "Bearer sk-not-a-key"])
def test_serve_upload_without_a_known_key_is_refused_before_its_body_is_read(authorization, guarded_server):
    """600 MB announced, 64 MiB offered: the 401 comes at once, and nothing reaches the disk."""
    head, _ = raw_http.multipart(BOUNDARY, "big.jsonl")
    headers = {"Content-Type": f"multipart/form-data; boundary={BOUNDARY}", "Content-Length": str(600 * 10**6)}
    if authorization:
        headers["Authorization"] = authorization
    with raw_http.FolderPeak(spool_of(guarded_server)) as peak:
        answer = raw_http.post(
            guarded_server.port, "/v1/files", headers, [head, *raw_http.pieces(64 * MiB, MiB)], chunked=False
        )
    assert answer.status == 401, answer
    assert ("API key" in answer.message) and (KEY not in answer.message)
    assert peak.bytes < MiB, f"{peak.bytes:,} bytes spooled for a request without a known key"


def test_serve_upload_over_the_limit_is_refused_as_it_passes_the_limit(guarded_server, tmp_path):
    """Declared too large: refused before a byte is read. Sent chunked (no size given): counted as it
    comes, spooled up to the limit and no further, then refused and removed."""
    spool, port = spool_of(guarded_server), guarded_server.port
    auth = {"Authorization": f"Bearer {KEY}", "Content-Type": f"multipart/form-data; boundary={BOUNDARY}"}
    head, tail = raw_http.multipart(BOUNDARY, "big.jsonl")
    size = 8 * UPLOAD_LIMIT

    with raw_http.FolderPeak(spool) as declared_peak:
        declared = raw_http.post(
            port,
            "/v1/files",
            {**auth, "Content-Length": str(len(head) + size + len(tail))},
            [head, *raw_http.pieces(size, MiB), tail],
            chunked=False,
        )
    with raw_http.FolderPeak(spool) as streamed_peak:
        # A quarter MiB every 5 ms: the watcher sees the spooled file grow.
        body = [head, *raw_http.pieces(size, MiB // 4, every=0.005), tail]
        streamed = raw_http.post(port, "/v1/files", auth, body, chunked=True)

    for answer in (declared, streamed):
        assert answer.status == 400, answer
        assert answer.body["error"]["param"] == "file" and "too large" in answer.message
        assert f"{UPLOAD_LIMIT:,}" in answer.message
    assert declared_peak.bytes < MiB
    assert UPLOAD_LIMIT // 2 <= streamed_peak.bytes < UPLOAD_LIMIT + MiB, f"{streamed_peak.bytes:,} bytes spooled"
    assert streamed.sent < size, "answered only after the whole body"
    assert raw_http.folder_bytes(spool) == 0, "the refused upload's bytes were left behind"
    # Right at the limit is still taken, and its bytes kept whole.
    exact = tmp_path / "exact.jsonl"
    exact.write_bytes(b"".join(raw_http.pieces(UPLOAD_LIMIT, MiB)))
    stored = upload(guarded_server.client(), exact)
    assert stored.bytes == UPLOAD_LIMIT
    assert guarded_server.client().files.content(stored.id).content == exact.read_bytes()


def test_serve_upload_that_stalls_is_dropped_after_the_idle_timeout(guarded_server):
    head, _ = raw_http.multipart(BOUNDARY, "stalled.jsonl")
    headers = {
        "Authorization": f"Bearer {KEY}",
        "Content-Type": f"multipart/form-data; boundary={BOUNDARY}",
        "Content-Length": str(len(head) + 4 * MiB),
    }
    started = time.monotonic()
    answer = raw_http.post(guarded_server.port, "/v1/files", headers, [head, *raw_http.pieces(MiB, MiB)], chunked=False)
    waited = time.monotonic() - started
    assert answer.status == 408 and "sent nothing" in answer.message, answer
    assert 2 <= waited < 15
    assert raw_http.folder_bytes(spool_of(guarded_server)) == 0


def test_serve_create_batch_reads_its_body_only_after_the_key_and_bounds_it(guarded_server):
    headers = {"Content-Type": "application/json", "Content-Length": str(600 * 10**6)}
    refused = raw_http.post(guarded_server.port, "/v1/batches", headers, raw_http.pieces(64 * MiB, MiB), chunked=False)
    assert refused.status == 401, refused
    too_large = raw_http.post(
        guarded_server.port,
        "/v1/batches",
        {"Authorization": f"Bearer {KEY}", "Content-Type": "application/json"},
        raw_http.pieces(4 * MiB, MiB // 4),
        chunked=True,
    )
    assert too_large.status == 400 and "too large" in too_large.message, too_large
    with pytest.raises(openai.BadRequestError, match="Missing required parameter: 'completion_window'"):
        guarded_server.client().post("/batches", body={"input_file_id": "file-x", "endpoint": CHAT}, cast_to=Batch)


def start_slow_upload(server: Server, stop_sending: threading.Event, spooled: Callable[[], bool]) -> threading.Thread:
    """An upload trickling in at 64 KB/s, from a thread; returns once `spooled()` says its first
    bytes reached the server's temp folder."""
    head, tail = raw_http.multipart(BOUNDARY, "slow.jsonl")
    headers = {"Authorization": f"Bearer {KEY}", "Content-Type": f"multipart/form-data; boundary={BOUNDARY}"}
    body = itertools.chain([head], raw_http.pieces(64 * MiB, 8 * 1024, every=0.125, stop=stop_sending), [tail])

    def trickle() -> None:
        with contextlib.suppress(OSError, http.client.HTTPException):
            raw_http.post(server.port, "/v1/files", headers, body, chunked=True, timeout=120)

    sender = threading.Thread(target=trickle, daemon=True)
    sender.start()
    deadline = time.monotonic() + 300  # a hang guard
    while not spooled():
        assert time.monotonic() < deadline, "the slow upload never reached the server's temp folder"
        time.sleep(0.05)
    return sender


def test_serve_sigterm_stops_the_server_during_a_slow_upload(tmp_path):
    """An upload trickling in at 64 KB/s does not hold the server up: SIGTERM stops it within the
    grace period (serve.shutdown_timeout, 5 s), and the part spooled is removed."""
    server = start_spooling_server(tmp_path / "server")
    spool, stop_sending = spool_of(server), threading.Event()
    sender = None
    try:
        sender = start_slow_upload(server, stop_sending, lambda: raw_http.folder_bytes(spool) > 0)
        sent_at = time.monotonic()
        server.proc.send_signal(signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            server.proc.wait(timeout=60)
        stopped_s = time.monotonic() - sent_at
        assert server.proc.poll() is not None, "still serving 60 s after SIGTERM"
        assert stopped_s < 10, f"stopped {stopped_s:.1f} s after SIGTERM"
        assert raw_http.folder_bytes(spool) == 0, "the cut-off upload's bytes were left behind"
    finally:
        stop_sending.set()
        server.stop(signal.SIGKILL)
        if sender is not None:
            sender.join(timeout=30)


def test_serve_restart_removes_the_upload_a_killed_server_left(tmp_path):
    """SIGKILL during a slow upload leaves its spooled part behind (nothing runs to remove it); the
    next server started with the same TMPDIR removes it, and leaves alone the upload another server,
    still serving, is spooling there."""
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    env, store = {"TMPDIR": str(tmp)}, str(tmp_path / "store")
    stop_live, stop_killed = threading.Event(), threading.Event()
    servers: list[Server] = []
    senders: list[threading.Thread] = []

    def files() -> set[Path]:
        return {path for path in tmp.rglob("*") if path.is_file()}

    def uploads(paths: set[Path]) -> bool:
        return any(path.name.startswith("orch-upload-") and path.stat().st_size for path in paths)

    try:
        live = start_server(tmp_path / "live", store, SPEC, env)
        servers.append(live)
        senders.append(start_slow_upload(live, stop_live, lambda: uploads(files())))
        live_files = files()
        killed = start_server(tmp_path / "killed", store, SPEC, env)
        servers.append(killed)
        senders.append(start_slow_upload(killed, stop_killed, lambda: uploads(files() - live_files)))
        killed.proc.kill()
        killed.proc.wait()
        left = files() - live_files

        restarted = start_server(tmp_path / "restarted", store, SPEC, env)
        servers.append(restarted)
        assert restarted.client().files.list().data == []  # serving
        assert not left & files(), f"left by the killed server, still there: {sorted(map(str, left & files()))}"
        assert live_files <= files(), "the live server's upload in flight was removed"
        assert senders[0].is_alive(), "the live server's upload was cut off"
    finally:
        stop_live.set()
        stop_killed.set()
        for server in servers:
            server.stop(signal.SIGKILL)
        for sender in senders:
            sender.join(timeout=30)


@pytest.mark.real_engine  # several models behind one batch, on vLLM
def test_serve_batch_naming_two_models_answers_each_line_with_its_own(tmp_path):
    """`serve.several_models`: one batch whose lines name `tiny` and its alias `gpt-4o-mini` runs as
    a run of two models (a pool each); every line is answered once, under the name it asked for."""
    spec = SPEC.replace("  rows_per_chunk: 4\n", "  rows_per_chunk: 4\n  several_models: true\n")
    with running_server(tmp_path / "serve", str(tmp_path / "store"), spec) as server:
        client = server.client()
        lines = [chat_line(f"m{i}", f"Hi {i}?", "tiny" if i % 3 else ALIAS) for i in range(9)]
        source = upload(client, write_requests(tmp_path / "two.jsonl", lines))
        batch, _ = wait_for(client, create(client, source.id).id, final)
        assert batch.status == "completed", batch
        output = lines_of(client, batch.output_file_id)
        assert sorted(x["custom_id"] for x in output) == sorted(f"m{i}" for i in range(9))
        asked = {x["custom_id"]: x["body"]["model"] for x in lines}
        assert all(x["response"]["body"]["model"] == asked[x["custom_id"]] for x in output)
        plan = read_plan(open_store(server.store_uri), RunLayout(batch.id))
        assert plan is not None and sorted(a.model or "" for a in plan.workers) == [ALIAS, "tiny"]
