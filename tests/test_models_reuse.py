"""Answer reuse (`--reuse-from`) in runs of several models and in sweeps: a key per row x model or arm."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from orchestrator.cli import main
from orchestrator.core.layout import RunLayout
from orchestrator.core.records import read_manifest
from orchestrator.core.store import open_store
from tests.support.datasets import batch_lines, text_questions
from tests.support.models import MODELS
from tests.support.run_states import collect_json, reused_rows
from tests.support.runs import Answer, answer_chunk
from tests.support.tables import Tables, answer_all, chunk_lines, prepare_table, rows

TWO_MODELS = ["--model", f"tiny={MODELS / 'tiny-llama'}", "--model", f"think={MODELS / 'tiny-think'}"]
BATCH = ["--format", "openai-batch"]
pytestmark = pytest.mark.orch_yaml("sampling:\n  max_tokens: 16\n  temperature: 0\n")


def prepare(store: str, run: str, data: Path, *args: str) -> None:
    flags = ["--run", run, "--store", store, "--rows-per-chunk", "5"]
    assert main(["prepare", str(data), *flags, *args]) == 0


def finish(store: str, run: str) -> dict[str | None, list[str]]:
    """Every chunk answered through the worker protocol's own objects, each answer naming its
    model and request; returns the custom_ids each model pool was asked (what reached its engine)."""
    s, layout = open_store(store), RunLayout(run)
    asked: dict[str | None, list[str]] = {}
    for entry in read_manifest(s, layout):
        requests = [json.loads(line) for line in s.get(layout.chunk(entry.chunk)).data.splitlines()]
        answers = []
        for i, r in enumerate(requests):
            said = " / ".join(m["content"] for m in r["body"]["messages"])
            answers.append(Answer(i, r["custom_id"], f"{entry.model} to {said} ({r['body'].get('max_tokens')})"))
            asked.setdefault(entry.model, []).append(r["custom_id"])
        answer_chunk(s, layout, entry.chunk, [answers])
    return {model: sorted(ids, key=_order) for model, ids in asked.items()}


def _order(custom_id: str) -> tuple[int, str]:
    row, _, arm = custom_id.partition("#")
    return int(row[1:]), arm


def status_rows(store: str, run: str, capsys) -> dict[str, int]:
    capsys.readouterr()
    assert main(["status", "--run", run, "--store", store, "--json"]) == 0
    rows: dict[str, int] = json.loads(capsys.readouterr().out)["rows"]
    return {k: rows[k] for k in ("total", "reused", "errors")}


def test_models_reuse_grown_two_model_input_runs_only_the_new_rows_of_each_model(workdir, capsys):
    """Two models, lines naming each in turn: 40 rows answered, then the same lines and 4 new ones
    prepared with --reuse-from. Only the new rows reach each model's chunks; every old answer comes
    back byte for byte, every row once, in input order."""
    store = str(workdir / "store")
    prepare(store, "first", batch_lines(workdir / "q.jsonl", ["tiny", "think"], rows=40), *TWO_MODELS, *BATCH)
    finish(store, "first")
    first = collect_json(store, "first", workdir / "first.jsonl", capsys)
    assert first["complete"] and first["rows_written"] == 40

    prepare(store, "second", batch_lines(workdir / "grown.jsonl", ["tiny", "think"], rows=44), *TWO_MODELS, *BATCH,
            "--reuse-from", "first")  # fmt: skip
    assert reused_rows(store, "second") == 40
    assert status_rows(store, "second", capsys) == {"total": 4, "reused": 40, "errors": 0}
    assert finish(store, "second") == {"tiny": ["r40", "r42"], "think": ["r41", "r43"]}
    second = collect_json(store, "second", workdir / "second.jsonl", capsys)
    assert second["complete"] and second["rows_total"] == 44 and second["reused"] == 40 and second["rows_run"] == 4
    assert second["missing"] == 0 and second["duplicates"] == 0
    capsys.readouterr()
    assert main(["status", "--run", "second", "--store", store, "--json"]) == 0
    models = json.loads(capsys.readouterr().out)["models"]
    assert {name: m["rows"]["total"] for name, m in models.items()} == {"tiny": 2, "think": 2}  # run, not reused
    old = (workdir / "first.jsonl").read_bytes().splitlines()
    new = (workdir / "second.jsonl").read_bytes().splitlines()
    assert new[:40] == old
    assert [json.loads(line)["custom_id"] for line in new] == [f"r{i}" for i in range(44)]
    assert "think to Question 43?" in new[43].decode()

    # Its index holds both runs' answers: a third run of the same lines reuses every one.
    prepare(store, "third", workdir / "grown.jsonl", *TWO_MODELS, *BATCH, "--reuse-from", "second")
    assert reused_rows(store, "third") == 44 and read_manifest(open_store(store), RunLayout("third")) == []
    third = collect_json(store, "third", workdir / "third.jsonl", capsys)
    assert third["complete"] and (workdir / "third.jsonl").read_bytes() == (workdir / "second.jsonl").read_bytes()


SWEEP = """
sampling: {max_tokens: 16, temperature: 0}
sweep:
  arms:
    plain: {}
    terse: {system_prompt: "Answer in one word.", sampling: {max_tokens: 3}}
"""


def test_models_reuse_grown_sweep_runs_only_the_new_rows_of_each_arm(workdir, capsys):
    """One model x two prompt arms over 20 rows, then 22: each arm of each old row is reused (its
    own key: the arm's system prompt and max_tokens are in its request), the new rows run per arm.
    The arm that changes nothing asks what a run of the model alone asked: it reuses that run's."""
    store, text = str(workdir / "store"), ["--format", "text", "--text-column", "question", "--id-column", "id"]
    model = ["--model", str(MODELS / "tiny-llama")]
    prepare(store, "single", text_questions(workdir / "q.jsonl", 20), *model, *text)
    finish(store, "single")
    single = collect_json(store, "single", workdir / "single.jsonl", capsys)

    (workdir / "orch.yaml").write_text(SWEEP)
    prepare(store, "first", workdir / "q.jsonl", *model, *text, "--reuse-from", "single")
    assert reused_rows(store, "first") == 20
    assert finish(store, "first") == {None: [f"q{i}#terse" for i in range(20)]}
    first = collect_json(store, "first", workdir / "first.jsonl", capsys)
    assert first["complete"] and first["rows_written"] == 40 and first["reused"] == single["rows_written"]
    plain = [json.loads(line) for line in (workdir / "first.jsonl").read_bytes().splitlines()[0::2]]
    alone = [json.loads(line) for line in (workdir / "single.jsonl").read_bytes().splitlines()]
    assert [(x["custom_id"], x["response"]) for x in plain] == [
        (f"{x['custom_id']}#plain", x["response"]) for x in alone
    ]
    assert main(["collect", "--run", "first", "--store", store, "--out", str(workdir / "first.parquet")]) == 0
    table = pq.read_table(workdir / "first.parquet").to_pydict()
    assert table["reused_plain"] == [True] * 20 and table["reused_terse"] == [False] * 20  # each arm's own mark
    assert table["text_plain"] == [x["response"]["body"]["choices"][0]["message"]["content"] for x in alone]

    prepare(store, "second", text_questions(workdir / "grown.jsonl", 22), *model, *text, "--reuse-from", "first")
    assert reused_rows(store, "second") == 40
    assert finish(store, "second") == {None: ["q20#plain", "q20#terse", "q21#plain", "q21#terse"]}
    second = collect_json(store, "second", workdir / "second.jsonl", capsys)
    assert second["complete"] and second["rows_total"] == 44 and second["reused"] == 40 and second["rows_run"] == 4
    old = (workdir / "first.jsonl").read_bytes().splitlines()
    new = (workdir / "second.jsonl").read_bytes().splitlines()
    assert new[:40] == old
    assert [json.loads(line)["custom_id"] for line in new] == [
        f"q{i}#{a}" for i in range(22) for a in ("plain", "terse")
    ]
    assert "Answer in one word. / Question 21? (3)" in new[43].decode()

    # Another system prompt for one arm: that arm's rows run again, the other arm's are reused.
    (workdir / "orch.yaml").write_text(SWEEP.replace("Answer in one word.", "Be brief."))
    prepare(store, "third", workdir / "grown.jsonl", *model, *text, "--reuse-from", "second")
    assert reused_rows(store, "third") == 22
    assert finish(store, "third") == {None: [f"q{i}#terse" for i in range(22)]}


def test_models_reuse_a_changed_second_model_runs_its_rows_again_only(workdir, tmp_path, capsys):
    """The second model's weights change (same name, same kind of directory): its rows run again,
    the first model's are reused; nothing is reused across the two models."""
    store = str(workdir / "store")
    data = batch_lines(workdir / "q.jsonl", ["tiny", "think"], rows=20)
    prepare(store, "first", data, *TWO_MODELS, *BATCH)
    finish(store, "first")
    collect_json(store, "first", workdir / "first.jsonl", capsys)

    retrained = tmp_path / "think-retrained"
    shutil.copytree(MODELS / "tiny-think", retrained)
    weights = retrained / "model.safetensors"
    data_bytes = bytearray(weights.read_bytes())
    data_bytes[-1] ^= 0xFF  # one weight differs
    weights.write_bytes(bytes(data_bytes))
    models = ["--model", f"tiny={MODELS / 'tiny-llama'}", "--model", f"think={retrained}"]
    prepare(store, "second", data, *models, *BATCH, "--reuse-from", "first")
    assert reused_rows(store, "second") == 10
    assert finish(store, "second") == {"think": [f"r{i}" for i in range(1, 20, 2)]}
    second = collect_json(store, "second", workdir / "second.jsonl", capsys)
    assert second["complete"] and second["reused"] == 10 and second["rows_run"] == 10
    old = (workdir / "first.jsonl").read_bytes().splitlines()
    new = (workdir / "second.jsonl").read_bytes().splitlines()
    assert new[0::2] == old[0::2]  # the first model's answers, reused
    assert [json.loads(line)["custom_id"] for line in new] == [f"r{i}" for i in range(20)]


def test_models_reuse_rows_set_aside_keep_their_places_among_reused_and_run_rows(workdir):
    """Rows set aside at prepare (a model no entry serves; a line that is not JSON, once per arm)
    are answered in their input places between the reused rows and the rows run."""

    def lines(run: str) -> list[dict[str, object]]:
        out = workdir / f"{run}.jsonl"
        assert main(["collect", "--run", run, "--store", store, "--out", str(out), "--max-error-rate", "1"]) == 0
        return [json.loads(line) for line in out.read_text().splitlines()]

    store = str(workdir / "store")
    three = ["tiny", "think", "nope"]
    prepare(store, "a", batch_lines(workdir / "a.jsonl", three, rows=9), *TWO_MODELS, *BATCH)
    finish(store, "a")
    a = lines("a")
    prepare(store, "b", batch_lines(workdir / "b.jsonl", three, rows=12), *TWO_MODELS, *BATCH, "--reuse-from", "a")
    assert finish(store, "b") == {"tiny": ["r9"], "think": ["r10"]}
    b = lines("b")
    assert [x["custom_id"] for x in b] == [f"r{i}" for i in range(12)]
    assert [x["error"] is not None for x in b] == [i % 3 == 2 for i in range(12)]
    assert [x for x in b[:9] if x["error"] is None] == [x for x in a if x["error"] is None]

    (workdir / "orch.yaml").write_text(SWEEP)
    text = ["--format", "text", "--text-column", "question", "--id-column", "id", "--model", str(MODELS / "tiny-llama")]
    data = text_questions(workdir / "q.jsonl", 4)
    data.write_text(data.read_text() + "not json\n")
    prepare(store, "s1", data, *text)
    finish(store, "s1")
    s1 = lines("s1")
    data.write_text(data.read_text() + json.dumps({"id": "q9", "question": "New?"}) + "\n")
    prepare(store, "s2", data, *text, "--reuse-from", "s1")
    assert finish(store, "s2") == {None: ["q9#plain", "q9#terse"]}
    s2 = lines("s2")
    arms = ("plain", "terse")
    assert [x["custom_id"] for x in s2] == [
        f"{row}#{a}" for row in ["q0", "q1", "q2", "q3", "line-5", "q9"] for a in arms
    ]
    assert s2[:8] == s1[:8] and [x["error"] is not None for x in s2] == [False] * 8 + [True] * 2 + [False] * 2


@pytest.mark.slow
def test_models_reuse_orch_run_of_a_sweep_gives_the_engine_only_the_new_rows(workdir, capsys):
    """The whole path with a real worker and engine: a sweep of the tiny model x two prompt arms over
    6 rows, then over 7 with --reuse-from. The second run's done markers hold the new row's two arms
    alone, and its output starts with the first run's, byte for byte."""
    from orchestrator.core.records import DoneMarker, parse_record

    (workdir / "orch.yaml").write_text(
        SWEEP + "workers:\n  count: 1\n  heartbeat_interval: 1\n  checkpoint_interval: 1\n"
    )
    flags = ["--model", str(MODELS / "tiny-llama"), "--format", "text", "--text-column", "question"]
    flags += ["--id-column", "id", "--rows-per-chunk", "4", "--interval", "1"]
    first, grown = text_questions(workdir / "q.jsonl", 6), text_questions(workdir / "grown.jsonl", 7)
    assert main(["run", str(first), "--run", "one", *flags, "--out", str(workdir / "one.jsonl")]) == 0
    capsys.readouterr()
    args = ["run", str(grown), "--run", "two", *flags, "--reuse-from", "one", "--out", str(workdir / "two.jsonl")]
    assert main(args) == 0
    assert "reused 12 row(s) from earlier runs, ran 2, 14 in all" in capsys.readouterr().out
    store, layout = open_store(str(workdir / ".orch")), RunLayout("two")
    markers = [
        parse_record(DoneMarker, store.get(layout.done(e.chunk)).data, layout.done(e.chunk))
        for e in read_manifest(store, layout)
    ]
    assert sum(m.rows for m in markers) == 2
    old = (workdir / "one.jsonl").read_bytes().splitlines()
    new = (workdir / "two.jsonl").read_bytes().splitlines()
    assert new[:12] == old
    assert [json.loads(line)["custom_id"] for line in new] == [
        f"q{i}#{a}" for i in range(7) for a in ("plain", "terse")
    ]


def test_models_reuse_a_grown_table_read_against_a_sweep_is_read_whole_and_reuses_its_unchanged_arm(
    tmp_path, workdir, capsys
):
    """A Delta table swept (two arms), then grown and prepared for one model with --reuse-from the
    sweep: the sweep's chunks are not its rows in order, so the table is read whole (never keyed
    incrementally against them); the arm that changed nothing answers the old rows."""
    tables = Tables(tmp_path)
    tables.write("delta", rows(0, 5))
    store = str(workdir / "store")
    (workdir / "orch.yaml").write_text(SWEEP)
    assert prepare_table(store, "sw", tables.uri("delta")) == 0
    answer_all(store, "sw")
    assert main(["collect", "--run", "sw", "--store", store, "--out", str(workdir / "sw.jsonl")]) == 0
    tables.write("delta", rows(5, 2))
    (workdir / "orch.yaml").write_text("sampling: {max_tokens: 16, temperature: 0}\n")
    capsys.readouterr()
    assert prepare_table(store, "one", tables.uri("delta"), "--reuse-from", "sw") == 0
    said = capsys.readouterr().err
    assert "the whole table is read and keyed again (run sw is of several models or a sweep)" in said
    assert "5 of 7 rows answered by sw" in said
    assert [line["custom_id"] for line in chunk_lines(store, "one")] == ["r5", "r6"]
