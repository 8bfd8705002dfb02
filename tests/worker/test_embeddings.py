"""/v1/embeddings lines on vLLM's pooling runner: OpenAI's response shape, per-line options, error rows."""

from __future__ import annotations

import base64
import json
import struct

import pytest
from openai.types import CreateEmbeddingResponse

from orchestrator.core.lines import BatchOutputLine
from tests.worker.test_vllm_engine import requests, run

pytestmark = pytest.mark.slow

URL = "/v1/embeddings"


def embed(engine, *bodies):
    return run(engine, requests(*bodies, url=URL))


def test_embeddings_lines_are_openai_embedding_responses(embed_engine):
    out = embed(
        embed_engine,
        {"model": "m", "input": "What is the capital of France?"},
        {"input": ["Hello", "What is the capital of France?"]},
        {"input": [5, 6, 7]},
        {"input": [[5, 6, 7], [8, 9]]},
    )
    responses = {cid: CreateEmbeddingResponse.model_validate(row.line.response.body) for cid, row in out.items()}
    assert [len(responses[f"r{i}"].data) for i in range(4)] == [1, 2, 1, 2]
    for response in responses.values():
        assert response.object == "list" and [d.index for d in response.data] == list(range(len(response.data)))
        assert all(len(d.embedding) == 128 for d in response.data)
        assert response.usage.prompt_tokens == response.usage.total_tokens > 0
    # The same text gives the same vector, alone or in a list; token ids are embedded as given.
    assert responses["r1"].data[1].embedding == responses["r0"].data[0].embedding
    assert responses["r3"].data[0].embedding == responses["r2"].data[0].embedding
    assert responses["r1"].data[0].embedding != responses["r1"].data[1].embedding
    assert out["r3"].tokens_in == 5 and out["r3"].tokens_out == 0


def test_embeddings_dimensions_and_base64(embed_engine):
    out = embed(
        embed_engine,
        {"input": "Hello"},
        {"input": "Hello", "dimensions": 32},
        {"input": "Hello", "encoding_format": "base64"},
    )
    full = out["r0"].line.response.body["data"][0]["embedding"]
    short = out["r1"].line.response.body["data"][0]["embedding"]
    # Matryoshka: the first 32 dimensions, normalised again.
    assert len(short) == 32
    norm = sum(x * x for x in full[:32]) ** 0.5
    assert short == pytest.approx([x / norm for x in full[:32]], abs=1e-5)
    encoded = out["r2"].line.response.body["data"][0]["embedding"]
    decoded = struct.unpack(f"<{len(full)}f", base64.b64decode(encoded))  # OpenAI's encoding
    assert list(decoded) == pytest.approx(full, abs=1e-7)


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"input": "Hello", "dimensions": 33}, "dimensions"),  # not one of the model's Matryoshka sizes
        ({"input": ""}, "input"),
        ({"input": ["ok", 3]}, "input"),
        ({"input": [[5, 10**9]]}, "input"),  # outside the vocabulary
        ({"input": "Hello", "encoding_format": "int8"}, "encoding_format"),
        ({"input": "Hello", "truncate": 3}, "truncate"),
    ],
)
def test_embeddings_bad_line_is_an_error_row_naming_the_field(embed_engine, body, param):
    line = json.dumps({"custom_id": "bad", "method": "POST", "url": URL, "body": body})
    from orchestrator.core.spec import SamplingSpec
    from worker.requests import parse_request
    from worker.wire import EngineRequest

    parsed = parse_request(line, 0, SamplingSpec())
    row = run(embed_engine, [parsed])["bad"] if isinstance(parsed, EngineRequest) else parsed
    assert row.error and row.line.response.status_code == 400
    assert row.line.response.body["error"]["param"] == param, row.line.error


def test_embeddings_run_refuses_chat_lines_and_a_chat_run_refuses_embeddings(embed_engine, tiny_engine):
    chat = run(embed_engine, requests({"messages": [{"role": "user", "content": "hi"}]}))["r0"]
    assert chat.error and chat.line.error.code == "unsupported_url" and "pooling" in chat.line.error.message
    lines = embed(tiny_engine, {"input": "hi"})["r0"]
    assert (
        lines.error
        and lines.line.error.code == "unsupported_url"
        and "model.runner: pooling" in lines.line.error.message
    )


def test_embeddings_worker_matches_vllm_run_batch(tiny_embed_model, tmp_path):
    """The same lines through orch's worker process (real store, checkpoints, markers) and through
    vLLM's own batch runner: every vector equal within float tolerance, every line the SDK's type."""
    import subprocess
    import sys

    from orchestrator.core.store import open_store
    from tests.support.runs import make_run
    from tests.worker.test_worker_process import ROOT, WorkerProcess, answered_lines

    texts = ["Hello", "What is the capital of France?", "Write a haiku about the ocean", "1 2 3"]
    lines = [
        {"custom_id": f"e{i}", "method": "POST", "url": URL, "body": {"model": tiny_embed_model, **body}}
        for i, body in enumerate(
            [
                *({"input": t} for t in texts),
                {"input": texts},
                {"input": [[5, 6, 7, 8]]},
                {"input": texts[1], "dimensions": 64},
                {"input": texts[2], "encoding_format": "base64"},
            ]
        )
    ]
    store_uri = str(tmp_path / "store")
    store = open_store(store_uri)
    layout = make_run(
        store,
        "emb",
        [lines[:4], lines[4:]],
        model=tiny_embed_model,
        spec_flags={"model.runner": "pooling", "workers.output_format": "parquet"},
    )
    code, summary = WorkerProcess(store_uri, "emb", "0", tmp_path).finish()
    assert code == 0 and summary["requests"] == len(lines) and summary["errors"] == 0, summary
    ours = {line.custom_id: line for line in answered_lines(store, layout)}
    for line in ours.values():  # base64 vectors as the SDK gives them to its caller: decoded
        body = line.response.body
        data = [{**d, "embedding": v} for d, v in zip(body["data"], line.embeddings(), strict=True)]
        CreateEmbeddingResponse.model_validate({**body, "data": data})

    batch_in, batch_out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    batch_in.write_text("".join(json.dumps(line) + "\n" for line in lines))
    subprocess.run(
        [
            sys.executable, "-m", "vllm.entrypoints.openai.run_batch", "-i", str(batch_in), "-o", str(batch_out),
            "--model", tiny_embed_model, "--runner", "pooling", "--dtype", "float32", "--enforce-eager",
            "--max-model-len", "1024", "--kv-cache-memory-bytes", str(64 * 2**20),
        ],
        cwd=ROOT, check=True, capture_output=True, timeout=600,
    )  # fmt: skip
    theirs = {
        line.custom_id: line for line in map(BatchOutputLine.model_validate_json, batch_out.read_text().splitlines())
    }
    assert set(theirs) == set(ours)
    for custom_id, line in theirs.items():
        assert line.usage().prompt_tokens == ours[custom_id].usage().prompt_tokens, custom_id
        for mine, vllm_vector in zip(ours[custom_id].embeddings(), line.embeddings(), strict=True):
            assert mine == pytest.approx(vllm_vector, abs=1e-5), custom_id
