"""The scripted engine (worker/engine/scripted.py): what it answers, how fast, what it refuses to load,
that only the environment chooses it, and that the real worker process runs it without vLLM."""

from __future__ import annotations

import signal
import time
from pathlib import Path

import pydantic
import pytest

from orchestrator.core.errors import EngineLoadError
from orchestrator.core.layout import RunLayout
from orchestrator.core.protocol.leases import read_lease
from orchestrator.core.protocol.parts import part_codec
from orchestrator.core.spec import ModelSpec
from orchestrator.core.store import open_store
from tests.support.cli import WORKER_PYTHON
from tests.support.engines import body_of, requests, run
from tests.support.models import TINY, built, scripted_engine
from tests.support.runs import chat_request, make_run
from tests.support.worker_process import WorkerProcess, answered_lines
from worker.engine import load_engine
from worker.engine.scripted import LOAD_ENV, STEP_ENV, TEST_ENGINE_ENV, ScriptedEngine


@pytest.fixture
def engine() -> ScriptedEngine:
    return ScriptedEngine(ModelSpec(name=built(TINY)), step_s=0.0)


def text_of(body: dict) -> str:
    choice = body["choices"][0]
    return choice["message"]["content"] if "message" in choice else choice["text"]


def test_scripted_engine_answers_the_last_user_message_up_to_max_tokens_or_a_stop(engine):
    """As the tiny random model the tests ran on: an answer that never ends before max_tokens."""
    rows = run(
        engine,
        requests(
            {
                "messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Is it on?"}],
                "max_tokens": 6,
            },
            {"messages": [{"role": "user", "content": "one two three four five"}], "max_tokens": 5},
            {"messages": [{"role": "user", "content": "Is it on?"}], "stop": ["it"], "max_tokens": 20},
            {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 9, "n": 2, "temperature": 1},
        ),
    )
    bodies = {cid: body_of(row) for cid, row in rows.items()}
    assert text_of(bodies["r0"]) == "Scripted answer to: Is it on?"
    assert bodies["r0"]["choices"][0]["finish_reason"] == "length" and bodies["r0"]["model"] == "tiny-llama"
    # Usage counts words: the whole conversation in, the answer out.
    assert bodies["r0"]["usage"]["prompt_tokens"] == 5 and bodies["r0"]["usage"]["completion_tokens"] == 6
    assert (rows["r0"].tokens_in, rows["r0"].tokens_out) == (5, 6)
    assert text_of(bodies["r1"]) == "Scripted answer to: one two"
    assert bodies["r1"]["choices"][0]["finish_reason"] == "length"
    assert text_of(bodies["r2"]) == "Scripted answer to: Is" and bodies["r2"]["choices"][0]["finish_reason"] == "stop"
    # Said again up to max_tokens; n: as many choices, alike.
    said = "Scripted answer to: Hi Scripted answer to: Hi Scripted"
    assert [c["message"]["content"] for c in bodies["r3"]["choices"]] == [said, said]
    assert bodies["r3"]["usage"]["completion_tokens"] == 18 and rows["r3"].tokens_out == 18


def test_scripted_engine_answers_completions_and_refuses_what_it_cannot_answer(engine):
    rows = run(
        engine,
        requests(
            {"prompt": "Once upon a time", "max_tokens": 4, "echo": True},
            {"prompt": "word " * 2000, "max_tokens": 16},
            url="/v1/completions",
        ),
    )
    first = body_of(rows["r0"])
    assert (
        first["object"] == "text_completion"
        and first["choices"][0]["text"] == "Once upon a timeScripted answer to: Once"
    )
    # A prompt and its answer past the model's context (the tiny Llama's 1,024 positions), as the engines refuse it.
    too_long = rows["r1"].line.error
    assert rows["r1"].error and too_long is not None and too_long.code == "context_length_exceeded"
    assert "maximum context length is 1024 tokens" in too_long.message
    # It answers no pooling runner's lines.
    embedding = run(engine, requests({"input": "Hi"}, url="/v1/embeddings"))["r0"].line.error
    assert embedding is not None and embedding.code == "unsupported_url"


def test_scripted_engine_at_a_pace_runs_its_capacity_side_by_side_one_word_a_step():
    """Two rows at once (max_num_seqs 2), 10 ms a step: the short rows finish first, each row after as
    many steps as it has words, and the third row waits for a place."""
    spec = ModelSpec(name=built(TINY), engine_args={"max_num_seqs": 2})
    engine = ScriptedEngine(spec, step_s=0.01)
    lengths = [6, 3, 4]
    reqs = requests(
        *({"messages": [{"role": "user", "content": "q"}], "max_tokens": n, "ignore_eos": True} for n in lengths)
    )
    finished_at: dict[str, int] = {}
    started = time.monotonic()
    for step, rows in enumerate(engine.run(iter(reqs)), start=1):
        for row in rows:
            finished_at[row.custom_id] = step
    assert finished_at == {"r1": 3, "r0": 6, "r2": 7}  # r2 starts once r1 is done, at step 4
    assert time.monotonic() - started >= 7 * 0.01
    assert engine.capacity == engine.batch_rows == 2


def test_scripted_engine_abort_drops_the_rows_of_one_chunk_or_all():
    engine = ScriptedEngine(ModelSpec(name=built(TINY)), step_s=0.001)
    reqs = requests(
        *({"messages": [{"role": "user", "content": "q"}], "max_tokens": 50, "ignore_eos": True} for _ in range(4))
    )
    for i, request in enumerate(reqs):
        request.chunk = "a" if i < 2 else "b"
    steps = engine.run(iter(reqs))
    assert next(steps) == []  # one word of each row written
    engine.abort("a")
    done = [row for rows in steps for row in rows]
    assert sorted(row.custom_id for row in done) == ["r2", "r3"]
    steps = engine.run(iter(requests({"messages": [{"role": "user", "content": "q"}], "max_tokens": 50})))
    next(steps)
    engine.abort()
    assert list(steps) == []


@pytest.mark.parametrize(
    ("config", "said"),
    [(None, "No such file"), ("{not json", "config.json: Expecting property name"), ("{}", "names no model_type")],
)
def test_scripted_engine_refuses_a_model_no_engine_could_load(tmp_path, config, said):
    model = tmp_path / "model"
    model.mkdir()
    if config is not None:
        (model / "config.json").write_text(config)
    with pytest.raises(EngineLoadError, match=said) as refused:
        ScriptedEngine(ModelSpec(name=str(model)))
    assert str(model) in str(refused.value)
    with pytest.raises(EngineLoadError, match="local model directories only"):
        ScriptedEngine(ModelSpec(name="org/some-model"))


def test_load_engine_gives_the_scripted_engine_only_when_the_environment_asks(monkeypatch):
    """ORCH_TEST_ENGINE chooses it; a spec cannot (model.engine knows vllm and transformers only).
    Its pace comes from the environment too: seconds a step, seconds to load."""
    monkeypatch.setenv(TEST_ENGINE_ENV, "scripted")
    monkeypatch.setenv(STEP_ENV, "0.25")
    monkeypatch.setenv(LOAD_ENV, "0.3")
    started = time.monotonic()
    engine = load_engine(ModelSpec(name=built(TINY)))
    assert time.monotonic() - started >= 0.3
    assert isinstance(engine, ScriptedEngine) and engine.step_s == 0.25 and engine.sampling_defaults == {}
    monkeypatch.setenv(LOAD_ENV, "")
    monkeypatch.setenv(TEST_ENGINE_ENV, "fast")
    with pytest.raises(EngineLoadError, match="the one test engine is 'scripted'"):
        load_engine(ModelSpec(name=built(TINY)))
    monkeypatch.setenv(TEST_ENGINE_ENV, "scripted")
    monkeypatch.setenv(STEP_ENV, "soon")
    with pytest.raises(EngineLoadError, match="expected seconds"):
        load_engine(ModelSpec(name=built(TINY)))
    with pytest.raises(pydantic.ValidationError):
        ModelSpec(name=built(TINY), engine="scripted")


def worker_run(tmp_path: Path, rows: int, chunks: int = 2, **flags: float) -> tuple[str, RunLayout]:
    store_uri = str(tmp_path / "store")
    requests_ = [
        [chat_request(f"c{c}-{i}", f"Question {c} {i}?", max_tokens=8) for i in range(rows)] for c in range(chunks)
    ]
    spec_flags = {f"workers.{k}": v for k, v in flags.items()}
    return store_uri, make_run(open_store(store_uri), "s", requests_, model=built(TINY), spec_flags=spec_flags)


def test_the_real_worker_process_runs_the_scripted_engine_without_vllm_or_torch(tmp_path, monkeypatch):
    """`python -m worker` (the worker's environment) with ORCH_TEST_ENGINE=scripted: every row answered
    once by the scripted engine, and neither vLLM nor torch imported (`-X importtime` lists every import)."""
    for name, value in scripted_engine().items():
        monkeypatch.setenv(name, value)
    store_uri, layout = worker_run(tmp_path, 5)
    worker = WorkerProcess(store_uri, "s", "0", tmp_path, python=(WORKER_PYTHON, "-X", "importtime"))
    code, summary = worker.finish(timeout=300)
    assert code == 0 and summary["status"] == "SUCCESS" and summary["requests"] == 10, worker.stderr[-3000:]
    lines = answered_lines(open_store(store_uri), layout)
    assert sorted(line.custom_id for line in lines) == sorted(f"c{c}-{i}" for c in range(2) for i in range(5))
    answers = {line.custom_id: line.response.body["choices"][0]["message"]["content"] for line in lines}
    assert answers["c1-3"] == "Scripted answer to: Question 1 3? Scripted answer"  # max_tokens 8
    imported = {
        line.split("|")[-1].strip().split(".")[0] for line in worker.stderr.splitlines() if "import time:" in line
    }
    assert "worker" in imported and not imported & {"vllm", "torch", "transformers"}


def test_the_scripted_engine_at_a_pace_lets_a_sigterm_land_mid_chunk_after_a_checkpoint(tmp_path, monkeypatch):
    """At 50 ms a step a chunk of 40 rows of 8 words, two at a time, lasts 8 s: the worker checkpoints
    every half second, takes SIGTERM mid-chunk, flushes what it finished and gives the lease back."""
    for name, value in scripted_engine(0.05).items():
        monkeypatch.setenv(name, value)
    store_uri, layout = worker_run(tmp_path, 40, chunks=1, checkpoint_interval=0.5, max_in_flight=2)
    store = open_store(store_uri)
    worker = WorkerProcess(store_uri, "s", "0", tmp_path, python=(WORKER_PYTHON,))
    deadline = time.monotonic() + 300  # a hang guard
    while not list(store.list(layout.outputs_prefix("part_00000"))):
        assert time.monotonic() < deadline and worker.proc.poll() is None, worker.stderr[-3000:]
        time.sleep(0.05)
    worker.proc.send_signal(signal.SIGTERM)
    code, summary = worker.finish(timeout=120)
    assert code == 143 and summary["status"] == "INTERRUPTED", worker.stderr[-3000:]
    codec = part_codec("jsonl", "part_00000")
    flushed = sum(len(codec.decode(store.get(p.key).data)) for p in store.list(layout.outputs_prefix("part_00000")))
    assert 0 < flushed == summary["requests"] < 40
    lease, _ = read_lease(store, layout, "part_00000")
    assert lease.released
