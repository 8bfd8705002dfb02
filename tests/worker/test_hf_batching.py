"""The transformers engine keeps the device full: large length-sorted batches, limits from the spec, rows exact."""

from __future__ import annotations

import json

import pytest

from orchestrator.core.errors import SpecError
from orchestrator.core.spec import ModelSpec, SamplingSpec
from worker.requests import parse_request
from worker.wire import EngineRequest

#: Greedy unless a line says otherwise: the tests compare answers (OpenAI's default would sample).
GREEDY = SamplingSpec(temperature=0)

pytestmark = pytest.mark.slow


def requests(*bodies: dict, chunk: str | None = None) -> list[EngineRequest]:
    out = []
    for i, body in enumerate(bodies):
        line = json.dumps({"custom_id": f"r{i}", "url": "/v1/chat/completions", "body": body})
        parsed = parse_request(line, i, GREEDY)
        assert isinstance(parsed, EngineRequest)
        parsed.chunk = chunk
        out.append(parsed)
    return out


def msg(text: str, **params) -> dict:
    return {"messages": [{"role": "user", "content": text}], **params}


def steps(engine, reqs) -> list[list]:
    return [step for step in engine.run(iter(reqs))]


@pytest.fixture(scope="module")
def engine(tiny_model):
    from worker.engine.hf_engine import TransformersEngine

    spec = ModelSpec(name=tiny_model, engine="transformers", engine_args={"max_batch_size": 16})
    return TransformersEngine(spec)


def test_hf_batching_fills_batches_up_to_the_spec_limit(engine):
    # Prompts of many lengths, each answer its own length: 40 requests in 3 generate calls.
    reqs = requests(*[msg("word " * (i % 9), max_tokens=2 + i % 5, ignore_eos=True) for i in range(40)])
    done = steps(engine, reqs)
    assert [len(s) for s in done] == [16, 16, 8]
    rows = {row.custom_id: row for s in done for row in s}
    assert all(rows[f"r{i}"].tokens_out == 2 + i % 5 for i in range(40))
    assert engine.capacity == 32  # the pool: two batches to pick similar lengths from
    assert engine.batch_rows == 16  # what one batch holds: a probe's first batch ends there


def test_hf_batching_the_forecasts_replay_runs_the_batches_the_engine_ran(engine):
    # The forecast prices a probe of this engine by replaying its batches (planning/probe_work.py):
    # prompts of several lengths, heavy-tailed answers, sent in this order; the engine's batches
    # (rows, longest answer) and the replay's must be the same.
    from orchestrator.planning.probe_work import StaticRow, static_batches

    lengths = [2, 3, 40, 2, 5, 2, 24, 3, 2, 9, 2, 2, 31, 4, 2, 3] * 3
    reqs = requests(*[msg("word " * (i % 11), max_tokens=n, ignore_eos=True) for i, n in enumerate(lengths)])
    done = steps(engine, reqs)
    ran = [(len(s), max(row.tokens_out for row in s)) for s in done]
    rows = {row.custom_id: row for s in done for row in s}
    replay = [StaticRow(rows[f"r{i}"].tokens_in, n, rows[f"r{i}"].tokens_out) for i, n in enumerate(lengths)]
    assert static_batches(replay, 16) == ran
    assert ran != [(16, max(lengths[i : i + 16])) for i in range(0, 48, 16)]  # not batches in send order


def test_hf_batching_batches_are_sorted_by_length(engine):
    # Short and long prompts interleaved: each batch holds one kind, so little is padding.
    reqs = requests(*[msg("word " * (1 if i % 2 else 60), max_tokens=2, ignore_eos=True) for i in range(32)])
    for step in steps(engine, reqs):
        assert len({row.tokens_in for row in step}) == 1


def test_hf_batching_seeded_sample_does_not_depend_on_its_batch(engine):
    seeded = msg("seeded", max_tokens=8, n=2, temperature=1.0, seed=11, ignore_eos=True)
    others = [msg(f"other {i}", max_tokens=8, n=2, temperature=1.0, ignore_eos=True) for i in range(5)]
    alone = steps(engine, requests(seeded))[0][0]
    crowded = {row.custom_id: row for s in steps(engine, requests(*others, seeded)) for row in s}["r5"]
    texts = [[c["message"]["content"] for c in row.line.response.body["choices"]] for row in (alone, crowded)]
    assert texts[0] == texts[1] and texts[0][0] != texts[0][1]


def test_hf_batching_abort_drops_the_chunks_queued_rows(engine):
    reqs = requests(*[msg(f"q{i}", max_tokens=2, ignore_eos=True) for i in range(20)], chunk="c1")
    reqs += requests(*[msg(f"p{i}", max_tokens=2, ignore_eos=True) for i in range(20)], chunk="c2")
    run = engine.run(iter(reqs))
    first = next(run)
    engine.abort("c1")
    rest = [row for step in run for row in step]
    assert len(first) == 16
    assert {row.chunk for row in rest} == {"c2"}
    assert sum(row.chunk == "c2" for row in first + rest) == 20


def test_hf_batching_bad_limit_in_the_spec_is_refused(tiny_model):
    from worker.engine.hf_engine import TransformersEngine

    spec = ModelSpec(name=tiny_model, engine="transformers", engine_args={"max_batch_tokens": "lots"})
    with pytest.raises(SpecError, match=r"model\.engine_args\.max_batch_tokens: expected a positive integer"):
        TransformersEngine(spec)
