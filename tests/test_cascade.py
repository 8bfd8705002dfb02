"""The cascade (spec `sweep.cascade`): its spec errors, its escalation conditions, stage 2's requests
made once from stage 1's answers, and each row's final answer."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from orchestrator.collect.cascade import final_answers, stage_counts
from orchestrator.core.errors import SpecError
from orchestrator.core.lines import BatchOutputLine
from orchestrator.core.spec import EscalateSpec
from orchestrator.core.spec_load import load_spec
from orchestrator.core.store.memory import MemoryStore
from orchestrator.fleet.cascade import record_stage
from orchestrator.planning.escalation import Escalated, escalation, next_stage

MODELS = {"small": "x/small", "large": "x/large"}
MODEL_DIR = Path(__file__).resolve().parents[1] / ".cache" / "models"


def answer(custom_id: str, text: str, finish: str = "stop", logprobs: list[float] | None = None) -> BatchOutputLine:
    choice: dict[str, Any] = {"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": finish}
    if logprobs is not None:
        choice["logprobs"] = {"content": [{"token": "t", "logprob": x} for x in logprobs]}
    body = {"object": "chat.completion", "model": "small", "choices": [choice]}
    return BatchOutputLine.model_validate(
        {"custom_id": custom_id, "response": {"status_code": 200, "request_id": "r", "body": body}}
    )


def request(custom_id: str, **body: Any) -> str:
    return json.dumps({"custom_id": custom_id, "method": "POST", "url": "/v1/chat/completions", "body": body})


def spec_error(sweep: dict[str, Any], models: dict[str, str] = MODELS) -> str:
    with pytest.raises(SpecError) as raised:
        load_spec(None, {"models": models, "sweep": sweep}, env={}, default_file=False)
    return str(raised.value)


def test_cascade_spec_errors_name_the_field():
    when = {"finish_reason": ["length"]}
    unknown = spec_error({"cascade": ["small", "huge"], "escalate_when": when})
    assert "sweep.cascade" in unknown and "'huge'" in unknown
    both = spec_error({"cascade": ["small", "large"], "escalate_when": when, "arms": {"a": {}}})
    assert "sweep.cascade" in both and "arms" in both
    assert "sweep.escalate_when" in spec_error({"cascade": ["small", "large"]})
    assert "regex" in spec_error({"cascade": ["small", "large"], "escalate_when": {"regex": "("}})
    spec = load_spec(
        None,
        {"models": MODELS, "sweep": {"cascade": ["small", "large"], "escalate_when": when}},
        env={},
        default_file=False,
    )
    assert spec.sweep.cascade == ["small", "large"]


def test_cascade_escalation_conditions():
    length = EscalateSpec(finish_reason=["length"])
    assert escalation(answer("a", "cut", "length"), {}, length) == "finish_reason length"
    assert escalation(answer("a", "whole"), {}, length) is None
    regex = EscalateSpec(regex=r"(?i)i don't know")
    assert escalation(answer("a", "Well, I don't know."), {}, regex) is not None
    assert escalation(answer("a", "Paris"), {}, regex) is None
    schema = {"type": "json_schema", "json_schema": {"name": "a", "schema": {"type": "object", "required": ["x"]}}}
    strict = EscalateSpec(json_schema=True)
    assert "not JSON" in (escalation(answer("a", "{oops"), {"response_format": schema}, strict) or "")
    assert "'x'" in (escalation(answer("a", '{"y": 1}'), {"response_format": schema}, strict) or "")
    assert escalation(answer("a", '{"x": 1}'), {"response_format": schema}, strict) is None
    assert escalation(answer("a", "free text"), {}, strict) is None  # no schema asked: nothing to miss
    sure = EscalateSpec(logprob_below=-1.0)
    assert escalation(answer("a", "t", logprobs=[-0.1, -0.3]), {}, sure) is None
    assert "mean logprob" in (escalation(answer("a", "t", logprobs=[-0.1, -3.0]), {}, sure) or "")
    with pytest.raises(SpecError, match="logprob_below"):
        escalation(answer("a", "t"), {}, sure)


def test_cascade_next_stage_is_made_once_across_a_restart():
    """Stage 2 holds exactly the matching rows, in input order, for the next model; recorded once, a
    second controller (after a crash) gets the same rows back, not a second set."""
    requests = [(2, request("c", model="small")), (0, request("a", model="small")), (1, request("b", model="small"))]
    answers = {"a": answer("a", "x", "length"), "b": answer("b", "fine"), "c": answer("c", "no idea")}
    when = EscalateSpec(finish_reason=["length"], regex="no idea")
    rows = next_stage(requests, answers, when, "large")
    assert [(r.position, json.loads(r.line)["body"]["model"], r.reason) for r in rows] == [
        (0, "large", "finish_reason length"),
        (2, "large", "regex 'no idea'"),
    ]
    store = MemoryStore()
    assert record_stage(store, "runs/r", 1, rows) == rows
    other = [Escalated(1, request("b"), "made again")]
    assert record_stage(store, "runs/r", 1, other) == rows  # the first record wins
    with pytest.raises(ValueError, match="not finished"):
        next_stage(requests, {"a": answers["a"]}, when, "large")


def test_cascade_final_answer_is_the_last_stage_that_answered():
    small = {"a": answer("a", "x", "length"), "b": answer("b", "fine")}
    large = {"a": answer("a", "a longer answer")}
    finals = final_answers([("small", small), ("large", large)], [{"a": "finish_reason length"}])
    assert (finals["a"].model, finals["a"].escalated, finals["a"].line.text()) == (
        "large",
        "finish_reason length",
        "a longer answer",
    )
    assert (finals["b"].model, finals["b"].escalated) == ("small", None)
    assert stage_counts(finals, ["small", "large"]) == {
        "small": {"answered": 2, "escalated": 1},
        "large": {"answered": 1, "escalated": 0},
    }


def cascade_project(tmp_path: Path, rows: int = 9) -> Path:
    """A cascade of the tiny Llama (small) and tiny-think (large) over `rows` chat lines, answered by
    the scripted engine (its answer says the question again): every third row may write 2 tokens (cut:
    finish_reason length), the others stop at "?" (finish_reason stop), and every fourth row from r1
    asks about "today", which an answer holding it escalates too (the regex)."""
    (tmp_path / "orch.yaml").write_text(
        "sampling: {max_tokens: 12, temperature: 0}\n"
        "workers: {heartbeat_interval: 1, checkpoint_interval: 1, lease_ttl: 60}\n"
        f"models: {{small: {MODEL_DIR / 'tiny-llama'}, large: {MODEL_DIR / 'tiny-think'}}}\n"
        "sweep: {cascade: [small, large], escalate_when: {finish_reason: [length], regex: today}}\n"
    )
    data = tmp_path / "in.jsonl"
    with open(data, "w") as f:
        for i in range(rows):
            limits = {"max_tokens": 2} if i % 3 == 0 else {"stop": ["?"]}
            question = f"Question {i} about today?" if i % 4 == 1 else f"Question {i}?"
            f.write(request(f"r{i}", messages=[{"role": "user", "content": question}], **limits) + "\n")
    return data


def lines_of(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def first_model_answers(tmp_path: Path, data: Path) -> dict[str, dict[str, Any]]:
    """The rows answered by the first model alone (a run of its own): what stage 0 must have answered."""
    from tests.support.cli import orch_ok

    alone = tmp_path / "alone"
    alone.mkdir()
    (alone / "orch.yaml").write_text("sampling: {max_tokens: 12, temperature: 0}\n")
    orch_ok("run", data, "--run", "alone", "--store", alone / "store", "--model", MODEL_DIR / "tiny-llama",
            "--format", "openai-batch", "--out", alone / "out.jsonl", "--workers", "1", cwd=alone)  # fmt: skip
    return {x["custom_id"]: x["response"]["body"] for x in lines_of(alone / "out.jsonl")}


@pytest.mark.slow
def test_cascade_run_escalates_on_length_and_regex_and_keeps_the_rest(tmp_path):
    """`orch run` runs stage 0 (the small model, every row), then stage 1 (the large one) on exactly
    the rows cut by max_tokens or matching the regex; the output has every row once, in input
    order: the large model's answer where escalated, the small model's, unchanged, elsewhere.
    Its subject is the escalation rule, not the models' words: the scripted engine answers."""
    from tests.support.cli import orch_ok

    data = cascade_project(tmp_path)
    out = orch_ok("run", data, "--run", "c", "--format", "openai-batch", "--rows-per-chunk", "4", "--workers", "1",
                  "--out", "out.jsonl", cwd=tmp_path)  # fmt: skip
    alone = first_model_answers(tmp_path, data)
    escalated = {
        cid: "finish_reason length" if body["choices"][0]["finish_reason"] == "length" else "regex 'today'"
        for cid, body in alone.items()
        if body["choices"][0]["finish_reason"] == "length" or "today" in body["choices"][0]["message"]["content"]
    }
    assert escalated == {
        "r0": "finish_reason length", "r3": "finish_reason length", "r6": "finish_reason length",
        "r1": "regex 'today'", "r5": "regex 'today'",
    }  # fmt: skip
    lines = lines_of(tmp_path / "out.jsonl")
    assert [x["custom_id"] for x in lines] == [f"r{i}" for i in range(9)]
    for line in lines:
        body, cid = line["response"]["body"], line["custom_id"]
        if cid in escalated:
            assert body["model"] == "large"
        else:
            assert body["model"] == "small" and body["choices"] == alone[cid]["choices"]
    assert f"small answered 9, escalated {len(escalated)}; large answered {len(escalated)}, escalated 0" in out
    stages = json.loads(orch_ok("status", "--run", "c", "--json", cwd=tmp_path))["cascade"]
    n = len(escalated)
    assert [(s["model"], s["run"], s["rows"], s["answered"], s["escalated"]) for s in stages] == [
        ("small", "c", 9, 9, n),
        ("large", "c.stage-1", n, n, 0),
    ]

    import pyarrow.parquet as pq

    orch_ok("collect", "--run", "c", "--out", "out.parquet", cwd=tmp_path)
    table = pq.read_table(tmp_path / "out.parquet").to_pylist()
    assert {row["custom_id"]: row["escalated"] for row in table} == {f"r{i}": escalated.get(f"r{i}") for i in range(9)}


@pytest.mark.slow
def test_cascade_run_killed_between_stages_does_not_double_stage_one(tmp_path):
    """`orch run` SIGKILLed once stage 1's rows are recorded, and run again: stage 1 is the recorded
    rows, prepared once (its run holds each escalated row once), and the output has every row once."""
    from orchestrator.core.layout import RunLayout
    from orchestrator.core.records import read_manifest
    from orchestrator.core.store import open_store
    from orchestrator.runview.cascade import read_stage
    from tests.support.cli import Background, orch_ok
    from tests.support.events import STORE_PACE, wait_for

    data = cascade_project(tmp_path)
    args = ("run", data, "--run", "k", "--format", "openai-batch", "--rows-per-chunk", "4", "--workers", "1")
    first = Background(*args, "--out", "out.jsonl", cwd=tmp_path)
    store = open_store(str(tmp_path / ".orch"))
    wait_for(
        "stage 1 recorded",
        lambda: read_stage(store, "runs/k", 1) is not None or first.proc.poll() is not None,
        every=STORE_PACE,
    )
    first.proc.kill()
    first.proc.wait()
    recorded = read_stage(store, "runs/k", 1)
    assert recorded, f"stage 1 was not recorded before the kill:\n{first.text[-3000:]}"
    orch_ok(*args, "--out", "out.jsonl", cwd=tmp_path)
    assert read_stage(store, "runs/k", 1) == recorded
    stage = RunLayout("k.stage-1")
    assert sum(entry.rows for entry in read_manifest(store, stage)) == len(recorded)
    lines = lines_of(tmp_path / "out.jsonl")
    assert [x["custom_id"] for x in lines] == [f"r{i}" for i in range(9)]
    answered_by = {x["custom_id"]: x["response"]["body"]["model"] for x in lines}
    assert {cid for cid, model in answered_by.items() if model == "large"} == {
        json.loads(r.line)["custom_id"] for r in recorded
    }


def test_cascade_prepare_sends_every_row_to_the_first_model_and_collect_waits_for_later_stages(tmp_path):
    """Stage 0 is the run: every row goes to the cascade's first model (a line naming another is set
    aside), and `orch collect` before the later stages are made refuses, naming the stage, rather
    than hand out the first model's answers as the cascade's."""
    from tests.support.cli import orch

    (tmp_path / "orch.yaml").write_text(
        "models: {large: x/large, small: x/small}\n"
        "sweep: {cascade: [small, large], escalate_when: {finish_reason: [length]}}\n"
    )
    data = tmp_path / "q.jsonl"
    data.write_text(request("a", messages=[]) + "\n" + request("b", model="large", messages=[]) + "\n")
    store = tmp_path / "store"
    done = orch("prepare", data, "--run", "c", "--store", store, "--format", "openai-batch", "--no-check", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    manifest = [json.loads(x) for x in (store / "runs" / "c" / "manifest.jsonl").read_text().splitlines()]
    assert [(e["model"], e["rows"]) for e in manifest] == [("small", 1)]
    errors = (store / "runs" / "c" / "prepare-errors.jsonl").read_text()
    assert '"b"' in errors and "model_not_found" in errors
    status = orch("status", "--run", "c", "--store", store, "--json", cwd=tmp_path)
    stages = [(s["model"], s["rows"], s["answered"], s["escalated"]) for s in json.loads(status.stdout)["cascade"]]
    assert stages == [("small", 1, 0, None), ("large", None, 0, 0)]
    done = orch("collect", "--run", "c", "--store", store, "--out", tmp_path / "out.jsonl", cwd=tmp_path)
    assert done.returncode != 0 and "cascade stage 1" in done.stderr and "orch run" in done.stderr
    assert not (tmp_path / "out.jsonl").exists()


def test_cascade_prepare_with_reuse_from_is_refused_naming_both(tmp_path):
    """A reused first-stage answer would never be looked at for escalation: refused, not half done."""
    from tests.support.cli import orch

    (tmp_path / "orch.yaml").write_text(
        "models: {large: x/large, small: x/small}\n"
        "sweep: {cascade: [small, large], escalate_when: {finish_reason: [length]}}\n"
    )
    data = tmp_path / "q.jsonl"
    data.write_text(request("a", messages=[]) + "\n")
    flags = ["--run", "c", "--store", tmp_path / "store", "--format", "openai-batch", "--no-check"]
    done = orch("prepare", data, *flags, "--reuse-from", "old", cwd=tmp_path)
    assert done.returncode != 0 and "--reuse-from" in done.stderr and "sweep.cascade" in done.stderr
    assert not (tmp_path / "store" / "runs" / "c" / "manifest.jsonl").exists()


def test_cascade_three_stages_answer_each_row_once_by_its_last_model(tmp_path):
    """Three models, answered through the protocol's own objects (no engine): stage n+1 gets exactly
    the rows stage n answered "unsure", in input order; run_stages started again (a controller that
    died and came back) makes no second set; collect writes each row once, in input order, with its
    last stage's answer, and counts each stage's rows answered and passed on."""
    from orchestrator.collect.collect import collect
    from orchestrator.core.context import RunContext
    from orchestrator.core.records import read_manifest
    from orchestrator.core.store import open_store
    from orchestrator.fleet.cascade import escalate, run_stages
    from orchestrator.prepare import prepare_run
    from orchestrator.runview.cascade import stage_context
    from tests.support.runs import Answer, answer_chunk

    flags = {"run": "t", "store": str(tmp_path / "store"), "input.format": "openai-batch"}
    flags |= {"chunking.rows_per_chunk": 2, "models": {"a": "x/a", "b": "x/b", "c": "x/c"}}
    flags["sweep"] = {"cascade": ["a", "b", "c"], "escalate_when": {"regex": "unsure"}}
    spec = load_spec(None, flags, env={}, default_file=False)
    store = open_store(flags["store"])
    ctx = RunContext(spec, store, spec.layout)
    unsure = {"a": {"r1", "r3", "r4"}, "b": {"r3"}, "c": set()}

    def answer_all(run: RunContext, model: str) -> None:
        for entry in read_manifest(store, run.layout):
            if store.head(run.layout.done(entry.chunk)) is not None:
                continue
            ids = [json.loads(x)["custom_id"] for x in store.get(run.layout.chunk(entry.chunk)).data.splitlines()]
            answer_chunk(store, run.layout, entry.chunk, [[reply(i, c, model) for i, c in enumerate(ids)]])

    def reply(row: int, custom_id: str, model: str) -> Answer:
        if (model, custom_id) == ("c", "r3"):
            return Answer(row, custom_id, error="boom")  # the last stage fails a row
        return Answer(row, custom_id, "unsure" if custom_id in unsure[model] else f"sure-{model}")

    data = tmp_path / "in.jsonl"
    data.write_text("".join(request(f"r{i}", messages=[{"role": "user", "content": f"q{i}"}]) + "\n" for i in range(6)))
    prepare_run(ctx, [str(data)], check=False)
    answer_all(ctx, "a")
    started: list[str] = []

    def run_stage(stage: RunContext, sources: list[str]) -> None:
        started.append(stage.layout.run)
        prepare_run(stage, sources, check=False)
        answer_all(stage, next(iter(stage.spec.models)))  # a stage's run has one model

    run_stages(ctx, run_stage, lambda _line: None)
    assert started == ["t.stage-1", "t.stage-2"]
    assert [(r.position, json.loads(r.line)["body"]["model"]) for r in escalate(ctx, 1)] == [
        (1, "b"),
        (3, "b"),
        (4, "b"),
    ]
    run_stages(ctx, run_stage, lambda _line: None)  # again: the recorded stages, each prepared once
    for stage, rows in ((1, 3), (2, 1)):
        assert sum(e.rows for e in read_manifest(store, stage_context(ctx, stage).layout)) == rows
    out = tmp_path / "out.jsonl"
    report = collect(store, ctx.layout, out, partial=False, retry_out=tmp_path / "retry.jsonl")
    lines = lines_of(out)
    said = [
        x["error"]["code"] if x["error"] else x["response"]["body"]["choices"][0]["message"]["content"] for x in lines
    ]
    assert [x["custom_id"] for x in lines] == [f"r{i}" for i in range(6)]
    assert said == ["sure-a", "sure-b", "sure-a", "boom", "sure-b", "sure-a"]
    # The last stage's failed row: an error row, and its request (for model c) in the retry file.
    assert report.errors == 1 and [
        (x["custom_id"], x["body"]["model"]) for x in lines_of(tmp_path / "retry.jsonl")
    ] == [("r3", "c")]
    assert report.complete and report.cascade == {
        "a": {"answered": 6, "escalated": 3},
        "b": {"answered": 3, "escalated": 1},
        "c": {"answered": 1, "escalated": 0},
    }
    assert report.tokens.generated_tokens == 2 * (6 + 3)  # every stage's tokens (the error row has none)
    # Every stage's answers are in the run's index, each under its own model's keys: a plain run of
    # model b over the same rows reuses the three that stage 1 answered (issue 50 item 3: a cascade
    # stage and a plain run of the same model reuse each other's answers); the rows sample, so reuse.sampled.
    plain = {"run": "plain-b", "store": flags["store"], "input.format": "openai-batch", "model.name": "x/b"}
    plain |= {"reuse.runs": ["t"], "reuse.sampled": True, "chunking.rows_per_chunk": 2}
    plain_spec = load_spec(None, plain, env={}, default_file=False)
    reused = prepare_run(RunContext(plain_spec, store, plain_spec.layout), [str(data)], check=False)
    assert reused.record.reused == 3 and reused.record.rows == 3


def test_cascade_serve_is_refused_naming_the_field(tmp_path):
    """`orch serve` would run a batch's first stage alone (the later ones live in `orch run`): refused at start."""
    from tests.support.cli import orch

    (tmp_path / "orch.yaml").write_text(
        "models: {small: x/small, large: x/large}\n"
        "sweep: {cascade: [small, large], escalate_when: {finish_reason: [length]}}\n"
    )
    done = orch("serve", "--store", tmp_path / "store", "--port", "0", cwd=tmp_path)
    assert done.returncode != 0 and "sweep.cascade" in done.stderr and "orch run" in done.stderr
