"""/v1/embeddings, /v1/score and /v1/rerank lines on vLLM's pooling runner: OpenAI's (and vLLM's)
response shapes, per-line options, error rows, and the same answers as vLLM's own run_batch."""

from __future__ import annotations

import base64
import json
import struct

import pytest
from openai.types import CreateEmbeddingResponse

from orchestrator.core.lines import BatchOutputLine
from tests.support.engines import requests, run

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
    ("body", "param", "url"),
    [
        ({"input": "Hello", "dimensions": 33}, "dimensions", URL),  # not one of the model's Matryoshka sizes
        ({"input": ""}, "input", URL),
        ({"input": ["ok", 3]}, "input", URL),
        ({"input": [[5, 10**9]]}, "input", URL),  # outside the vocabulary
        ({"input": "Hello", "encoding_format": "int8"}, "encoding_format", URL),
        ({"input": "Hello", "truncate": 3}, "truncate", URL),
        ({"queries": ["a", "b"], "documents": ["c", "d", "e"]}, "input", "/v1/score"),  # not 1:1, 1:N or N:N
        ({"queries": "a", "documents": []}, "input", "/v1/score"),
        ({"queries": "a"}, "queries", "/v1/score"),
        ({"text_1": "a", "text_2": {"content": [{"type": "text", "text": "b"}]}}, "text_2", "/v1/score"),
        ({"queries": "a", "documents": "b", "max_tokens_per_doc": 4}, "max_tokens_per_doc", "/v1/score"),
        ({"documents": ["a"]}, "query", "/v1/rerank"),
        ({"query": "a", "documents": ["b"], "top_n": -1}, "top_n", "/v1/rerank"),
    ],
)
def test_pooling_bad_line_is_an_error_row_naming_the_field(embed_engine, body, param, url):
    line = json.dumps({"custom_id": "bad", "method": "POST", "url": url, "body": body})
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


def test_pooling_worker_matches_vllm_run_batch(tiny_embed_model, tmp_path):
    """The same embeddings, score and rerank lines through orch's worker process (real store,
    checkpoints, markers) and through vLLM's own batch runner: every vector and score equal within
    float tolerance, the same ranking and usage, every line the SDK's type (embeddings) or vLLM's
    own response model (score, rerank)."""
    from vllm.entrypoints.pooling.scoring.protocol import RerankResponse, ScoreResponse

    from orchestrator.core.store import open_store
    from tests.support.runs import make_run
    from tests.support.worker_process import WorkerProcess, answered_lines

    texts = ["Hello", "What is the capital of France?", "Write a haiku about the ocean", "1 2 3"]
    bodies = [
        *((URL, {"input": t}) for t in texts),
        (URL, {"input": texts}),
        (URL, {"input": [[5, 6, 7, 8]]}),
        (URL, {"input": texts[1], "dimensions": 64}),
        (URL, {"input": texts[2], "encoding_format": "base64"}),
        ("/v1/score", {"queries": texts[1], "documents": texts}),  # 1:N
        ("/v1/score", {"text_1": texts[:2], "text_2": texts[2:]}),  # N:N
        ("/v1/score", {"data_1": "Paris", "data_2": "France"}),  # 1:1
        ("/v1/rerank", {"query": texts[1], "documents": texts}),
        ("/v1/rerank", {"query": "ocean", "documents": texts, "top_n": 2}),
    ]
    lines = [
        {"custom_id": f"e{i}", "method": "POST", "url": url, "body": {"model": tiny_embed_model, **body}}
        for i, (url, body) in enumerate(bodies)
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
    urls = {line["custom_id"]: line["url"] for line in lines}
    for custom_id, line in ours.items():
        body = line.response.body
        if urls[custom_id] == "/v1/score":
            ScoreResponse.model_validate(body)
        elif urls[custom_id] == "/v1/rerank":
            RerankResponse.model_validate(body)
        else:  # base64 vectors as the SDK gives them to its caller: decoded
            data = [{**d, "embedding": v} for d, v in zip(body["data"], line.embeddings(), strict=True)]
            CreateEmbeddingResponse.model_validate({**body, "data": data})

    theirs = vllm_run_batch(lines, tiny_embed_model, tmp_path)
    check_same_answers({cid: line.response.body for cid, line in ours.items()}, theirs, urls)
    for custom_id, line in theirs.items():
        if urls[custom_id] == URL:
            assert ours[custom_id].usage().prompt_tokens == line.usage().prompt_tokens, custom_id
            for vector, vllm_vector in zip(ours[custom_id].embeddings(), line.embeddings(), strict=True):
                assert vector == pytest.approx(vllm_vector, abs=1e-5), custom_id


def test_cross_encoder_scores_and_reranks_as_vllm_run_batch(tiny_reranker_model, tmp_path, keep_alive):
    """A one-label classifier (a reranker): each (query, document) pair rendered by vLLM's own
    cross-encoder and classified; the same scores, ranking and usage as vLLM's run_batch, every line
    valid as vLLM's response model; an embeddings line is an error row."""
    from vllm.entrypoints.pooling.scoring.protocol import RerankResponse, ScoreResponse

    from orchestrator.core.spec import ModelSpec, SamplingSpec
    from worker.engine import load_engine
    from worker.requests import parse_request

    texts = ["Hello", "What is the capital of France?", "Write a haiku about the ocean", "1 2 3"]
    bodies = [
        ("/v1/score", {"queries": texts[1], "documents": texts}),
        ("/v1/score", {"text_1": texts[:2], "text_2": texts[2:]}),
        ("/v1/rerank", {"query": texts[1], "documents": texts, "top_n": 3}),
        ("/v1/rerank", {"query": "ocean", "documents": texts}),
    ]
    lines = [
        {"custom_id": f"x{i}", "method": "POST", "url": url, "body": {"model": tiny_reranker_model, **body}}
        for i, (url, body) in enumerate(bodies)
    ]
    urls = {line["custom_id"]: line["url"] for line in lines}
    engine = load_engine(ModelSpec(name=tiny_reranker_model, runner="pooling", max_model_len=1024))
    keep_alive(engine)
    try:
        parsed = [parse_request(json.dumps(line), i, SamplingSpec()) for i, line in enumerate(lines)]
        ours = {cid: row.line.response.body for cid, row in run(engine, parsed).items()}
        refused = embed(engine, {"input": "Hello"})["r0"]
    finally:
        engine.close()
    assert refused.error and refused.line.error.code == "unsupported_url" and "classifies" in refused.line.error.message
    for custom_id, body in ours.items():
        (ScoreResponse if urls[custom_id] == "/v1/score" else RerankResponse).model_validate(body)
    assert len(ours["x2"]["results"]) == 3
    # A random score head near 0: probabilities spread around 0.5, so a wrong pairing or prompt shows.
    assert len({round(d["score"], 4) for d in ours["x0"]["data"]}) == 4
    check_same_answers(ours, vllm_run_batch(lines, tiny_reranker_model, tmp_path), urls)


def vllm_run_batch(lines: list[dict], model: str, tmp_path) -> dict[str, BatchOutputLine]:
    """The lines through vLLM's own batch runner, on the pooling runner with the worker's settings."""
    import subprocess
    import sys

    from tests.support.models import REPO

    batch_in, batch_out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    batch_in.write_text("".join(json.dumps(line) + "\n" for line in lines))
    subprocess.run(
        [
            sys.executable, "-m", "vllm.entrypoints.openai.run_batch", "-i", str(batch_in), "-o", str(batch_out),
            "--model", model, "--runner", "pooling", "--dtype", "float32", "--enforce-eager",
            "--max-model-len", "1024", "--kv-cache-memory-bytes", str(64 * 2**20),
        ],
        cwd=REPO, check=True, capture_output=True, timeout=600,
    )  # fmt: skip
    theirs = {
        line.custom_id: line for line in map(BatchOutputLine.model_validate_json, batch_out.read_text().splitlines())
    }
    assert len(theirs) == len(lines)
    return theirs


def check_same_answers(ours: dict[str, dict], theirs: dict[str, BatchOutputLine], urls: dict[str, str]) -> None:
    """Score and rerank bodies equal to vLLM's within float tolerance: scores, order, documents,
    usage, and the same fields; embeddings bodies the same fields (their vectors are compared apart)."""
    assert set(theirs) == set(ours)
    for custom_id, line in theirs.items():
        assert line.error is None, (custom_id, line.response.body)
        mine, vllm_body = ours[custom_id], line.response.body
        assert set(mine) == set(vllm_body), custom_id  # the same fields, no more, no fewer
        if urls[custom_id] == "/v1/score":
            assert [d["score"] for d in mine["data"]] == pytest.approx(
                [d["score"] for d in vllm_body["data"]], abs=1e-5
            )
            assert mine["usage"] == vllm_body["usage"], custom_id
        elif urls[custom_id] == "/v1/rerank":
            assert [r["index"] for r in mine["results"]] == [r["index"] for r in vllm_body["results"]], custom_id
            assert [r["document"] for r in mine["results"]] == [r["document"] for r in vllm_body["results"]]
            scores = [r["relevance_score"] for r in vllm_body["results"]]
            assert [r["relevance_score"] for r in mine["results"]] == pytest.approx(scores, rel=1e-4, abs=1e-7)
            assert mine["usage"] == vllm_body["usage"], custom_id
