"""Cached prompt tokens: vLLM's own count per request in each line's usage, then in the worker's
summary, its heartbeat, the done markers, status and collect's report."""

from __future__ import annotations

import json
import uuid

import pytest
from openai.types.chat import ChatCompletion

from orchestrator.core.layout import RunLayout
from orchestrator.core.records import DoneMarker, Heartbeat
from orchestrator.core.spec import SamplingSpec
from orchestrator.core.store import open_store
from tests.support.engines import run
from tests.support.runs import make_run
from tests.support.worker_process import answered_lines, run_in_process
from worker.requests import parse_request
from worker.wire import EngineRequest

pytestmark = pytest.mark.slow


def system_prompt() -> str:
    """A system prompt no other test sends (so nothing of it is cached yet), well over a 128-token block."""
    return f"[{uuid.uuid4().hex}] " + " ".join(f"rule {i}: answer briefly and politely." for i in range(20))


def chat(custom_id: str, system: str, question: str) -> dict:
    messages = [{"role": "system", "content": system}, {"role": "user", "content": question}]
    body = {"messages": messages, "max_tokens": 4, "ignore_eos": True}
    return {"custom_id": custom_id, "method": "POST", "url": "/v1/chat/completions", "body": body}


def parsed(lines: list[dict]) -> list[EngineRequest]:
    out = []
    for i, line in enumerate(lines):
        request = parse_request(json.dumps(line).encode(), i, SamplingSpec())
        assert isinstance(request, EngineRequest)
        out.append(request)
    return out


def test_each_line_carries_vllms_own_cached_token_count(tiny_engine, monkeypatch):
    seen: dict[str, int | None] = {}  # vLLM's request id -> its RequestOutput.num_cached_tokens
    step = tiny_engine._engine.step

    def recording_step():
        outputs = step()
        seen.update({o.request_id: o.num_cached_tokens for o in outputs if o.finished})
        return outputs

    monkeypatch.setattr(tiny_engine._engine, "step", recording_step)
    system = system_prompt()
    first_id = tiny_engine._next_id
    first = run(tiny_engine, parsed([chat("a", system, "What is one plus one?")]))["a"]
    rest = run(tiny_engine, parsed([chat(c, system, f"Question {c}: name a colour.") for c in "bcd"]))
    rows = {"a": first, **rest}
    for offset, custom_id in enumerate("abcd"):
        row = rows[custom_id]
        body = row.line.response.body
        cached = ChatCompletion.model_validate(body).usage.prompt_tokens_details.cached_tokens
        # The line, the row's count and vLLM's own number for that request agree.
        assert cached == row.tokens_cached == seen[str(first_id + offset)], custom_id
    assert rows["a"].tokens_cached == 0  # nothing of this prompt was cached before it
    for custom_id in "bcd":  # the shared system prompt's whole 128-token blocks came from the cache
        row = rows[custom_id]
        assert 128 <= row.tokens_cached < row.tokens_in and row.tokens_cached % 128 == 0, custom_id


def test_a_run_reports_cached_tokens_in_summary_heartbeat_markers_status_and_collect(tiny_engine, tiny_model, tmp_path):
    from orchestrator.collect.collect import collect
    from orchestrator.planning.pricing import load_gpu_table
    from orchestrator.runview.status import status_of

    store = open_store(str(tmp_path / "store"))
    system = system_prompt()
    chunks = [[chat(f"c{c}-{i}", system, f"Item {c}.{i}: one word?") for i in range(6)] for c in range(2)]
    layout: RunLayout = make_run(store, "cached", chunks, model=tiny_model)
    summary = run_in_process(store, "cached", tiny_engine)
    lines = answered_lines(store, layout)
    cached = sum(line.usage().cached_tokens for line in lines)
    prompt = sum(line.usage().prompt_tokens for line in lines)
    generated = sum(line.usage().completion_tokens for line in lines)
    assert len(lines) == 12 and 0 < cached < prompt
    assert (summary["tokens_in"], summary["tokens_cached"], summary["tokens_out"]) == (prompt, cached, generated)
    markers = [DoneMarker.model_validate_json(store.get(i.key).data) for i in store.list(layout.done_prefix)]
    assert sum(m.tokens_cached for m in markers) == cached
    beats = sorted(store.list(layout.heartbeats_prefix), key=lambda i: i.modified)
    assert Heartbeat.model_validate_json(store.get(beats[-1].key).data).tokens_cached == cached

    status = status_of(store, layout, None, now=0.0, prices=load_gpu_table())
    assert status.tokens.model_dump() == {
        "prompt_tokens": prompt,
        "cached_tokens": cached,
        "generated_tokens": generated,
    }
    report = collect(store, layout, tmp_path / "out.jsonl", prices=load_gpu_table())
    assert report.tokens.to_dict() == status.tokens.model_dump()
    # A CPU is not in the price table: the run cost nothing, and says so per million tokens.
    assert report.cost_per_m_tokens is not None and report.cost_per_m_tokens["all"]["usd_per_m_tokens"] == 0.0
