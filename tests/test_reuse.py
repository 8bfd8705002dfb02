"""Answer reuse (`--reuse-from`): answer keys at prepare, the answer index at collect, reused rows in place."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

import pytest

from orchestrator.cli import main
from orchestrator.core.frozen_spec import read_stored_spec
from orchestrator.core.layout import RunLayout
from orchestrator.core.records import read_manifest
from orchestrator.core.store import open_store
from tests.support.datasets import text_questions, write_jsonl
from tests.support.models import TINY
from tests.support.run_states import collect_json, reused_rows
from tests.support.runs import Answer, answer_chunk

pytestmark = pytest.mark.orch_yaml("sampling:\n  max_tokens: 16\n  temperature: 0\n")


def prepare(store: str, run: str, data: Path, *args: str, model: Path | str = TINY, code: int = 0) -> None:
    """`model`: a path, or NAME=PATH for a run whose one model is named."""
    flags = ["--format", "text", "--text-column", "question", "--id-column", "id", "--rows-per-chunk", "10"]
    assert main(["prepare", str(data), "--run", run, "--store", store, "--model", str(model), *flags, *args]) == code


def finish(store: str, run: str) -> None:
    """Every chunk answered through the worker protocol's own objects (an answer naming its prompt)."""
    s, layout = open_store(store), RunLayout(run)
    for entry in read_manifest(s, layout):
        lines = s.get(layout.chunk(entry.chunk)).data.splitlines()
        requests = [json.loads(line) for line in lines]
        answers = [
            Answer(i, r["custom_id"], f"answer to {r['body']['messages'][-1]['content']}")
            for i, r in enumerate(requests)
        ]
        answer_chunk(s, layout, entry.chunk, [answers])


def run_rows(store: str, run: str) -> int:
    return sum(e.rows for e in read_manifest(open_store(store), RunLayout(run)))


@pytest.mark.parametrize("store_kind", ["local", pytest.param("seaweedfs", marks=pytest.mark.slow)])
def test_reuse_grown_input_runs_only_the_new_rows_and_keeps_old_answers_byte_identical(
    workdir, store_kind, request, capsys
):
    from tests.support.s3servers import make_store_uri

    store = make_store_uri(store_kind, request, workdir)
    prepare(store, "first", text_questions(workdir / "q.jsonl", 40))
    finish(store, "first")
    first = collect_json(store, "first", workdir / "first.jsonl", capsys)
    assert first["rows_written"] == 40 and first["reused"] == 0

    prepare(store, "second", text_questions(workdir / "grown.jsonl", 44), "--reuse-from", "first")
    assert reused_rows(store, "second") == 40 and run_rows(store, "second") == 4
    capsys.readouterr()
    assert main(["status", "--run", "second", "--store", store, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["rows"] | {"done": 0} == {
        "total": 4,
        "done": 0,
        "finished": 0,
        "checkpointed": 0,
        "in_progress": 0,
        "errors": 0,
        "set_aside": 0,
        "reused": 40,
    }
    finish(store, "second")
    second = collect_json(store, "second", workdir / "second.jsonl", capsys)
    assert second["complete"] and second["rows_total"] == 44 and second["reused"] == 40 and second["rows_run"] == 4
    assert second["tokens_saved"]["prompt_tokens"] == 40 * 3
    # Every row the first run answered, in its 4 chunks of 10 s each: 40 s of worker time saved.
    assert second["engine_s_saved"] == pytest.approx(40.0)
    old = (workdir / "first.jsonl").read_bytes().splitlines()
    new = (workdir / "second.jsonl").read_bytes().splitlines()
    assert new[:40] == old  # in input order, byte for byte
    assert [json.loads(line)["custom_id"] for line in new] == [f"q{i}" for i in range(44)]
    assert "answer to Question 43?" in new[43].decode()


def test_reuse_changed_template_max_tokens_or_model_reuses_nothing_and_unchanged_reuses_all(workdir, tmp_path, capsys):
    store = str(workdir / "store")
    data = text_questions(workdir / "q.jsonl", 20)
    prepare(store, "base", data)
    finish(store, "base")
    collect_json(store, "base", workdir / "base.jsonl", capsys)

    prepare(store, "same", data, "--reuse-from", "base")
    assert reused_rows(store, "same") == 20 and run_rows(store, "same") == 0
    prepare(store, "template", data, "--reuse-from", "base", "--template", "Q: {question}")
    assert reused_rows(store, "template") == 0 and run_rows(store, "template") == 20
    (workdir / "orch.yaml").write_text("sampling:\n  max_tokens: 17\n  temperature: 0\n")
    prepare(store, "max-tokens", data, "--reuse-from", "base")
    assert reused_rows(store, "max-tokens") == 0
    (workdir / "orch.yaml").write_text("sampling:\n  max_tokens: 16\n  temperature: 0\n")
    other = tmp_path / "other-model" / "tiny-llama"
    shutil.copytree(TINY, other)
    (other / "generation_config.json").write_text(json.dumps({"temperature": 0.0, "max_length": 99}))
    prepare(store, "model", data, "--reuse-from", "base", model=other)
    assert reused_rows(store, "model") == 0


def test_reuse_sampled_rows_run_again_unless_asked(workdir, capsys):
    store = str(workdir / "store")
    (workdir / "orch.yaml").write_text("sampling:\n  max_tokens: 16\n  temperature: 0.7\n")
    data = text_questions(workdir / "q.jsonl", 10)
    prepare(store, "sampled", data)
    finish(store, "sampled")
    collect_json(store, "sampled", workdir / "s.jsonl", capsys)
    capsys.readouterr()
    prepare(store, "again", data, "--reuse-from", "sampled")
    assert reused_rows(store, "again") == 0 and run_rows(store, "again") == 10
    said = "0 of 10 rows answered by sampled; 10 more were, but they sample (temperature > 0, no seed) and run again"
    assert f"{said} (--reuse-sampled, or reuse.sampled: true, reuses them)" in capsys.readouterr().err
    prepare(store, "asked", data, "--reuse-from", "sampled", "--reuse-sampled")
    assert reused_rows(store, "asked") == 10


def test_reuse_a_corrupt_or_missing_index_is_a_clear_error_and_nothing_is_reused(workdir, capsys, monkeypatch):
    store = str(workdir / "store")
    data = text_questions(workdir / "q.jsonl", 10)
    prepare(store, "src", data)
    finish(store, "src")
    capsys.readouterr()
    temp = workdir / "tmp"
    temp.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(temp))
    prepare(store, "early", data, "--reuse-from", "src", code=4)
    assert "has no answer index" in capsys.readouterr().err
    assert not list(temp.iterdir())  # the refused prepare's temporary files went with it
    collect_json(store, "src", workdir / "src.jsonl", capsys)
    s = open_store(store)
    index = json.loads(s.get(RunLayout("src").answer_index).data)
    part = index["parts"][0]["key"]
    s.put(part, s.get(part).data[:-26])  # a part cut short, as by a crash mid-write
    prepare(store, "cut", data, "--reuse-from", "src", code=8)
    err = capsys.readouterr().err
    assert part in err and "no answer was reused" in err
    assert s.head(RunLayout("cut").prepare_record) is None
    assert not list(temp.iterdir())


def test_reuse_a_consistent_forgery_of_the_index_is_taken(workdir, capsys):
    """The store is the trust boundary (docs/failure-model.md): a part changed without its SHA-256 in
    index.json is refused, but one rewritten with its SHA-256 updated is an index like any other.
    Here the forger swaps which rows two keys point at: the later run takes each answer for the
    other question. What guards a run is who may write its store, not a checksum."""
    import hashlib

    import numpy as np

    from orchestrator.prepare.answers.answer_index import record_dtype

    store = str(workdir / "store")
    data = text_questions(workdir / "q.jsonl", 10)
    prepare(store, "src", data)
    finish(store, "src")
    collect_json(store, "src", workdir / "src.jsonl", capsys)
    s, layout = open_store(store), RunLayout("src")
    index = json.loads(s.get(layout.answer_index).data)
    part = index["parts"][0]
    records = np.frombuffer(s.get(part["key"]).data, dtype=record_dtype()).copy()
    first, second = (int(np.flatnonzero(records["row"] == row)[0]) for row in (0, 1))
    records["row"][[first, second]] = records["row"][[second, first]]
    forged = records.tobytes()
    s.put(part["key"], forged)
    prepare(store, "refused", data, "--reuse-from", "src", code=8)  # the checksum catches a change alone
    assert part["key"] in capsys.readouterr().err
    part["sha256"] = hashlib.sha256(forged).hexdigest()  # ...not a writer who updates it too
    s.put(layout.answer_index, json.dumps(index).encode())
    prepare(store, "taken", data, "--reuse-from", "src")
    assert reused_rows(store, "taken") == 10
    collect_json(store, "taken", workdir / "taken.jsonl", capsys)
    answers = [json.loads(line) for line in (workdir / "taken.jsonl").read_text().splitlines()]
    content = [a["response"]["body"]["choices"][0]["message"]["content"] for a in answers]
    assert content[:3] == ["answer to Question 1?", "answer to Question 0?", "answer to Question 2?"]


def test_reuse_table_output_marks_reused_rows(workdir, capsys):
    store = str(workdir / "store")
    prepare(store, "t1", text_questions(workdir / "q.jsonl", 10))
    finish(store, "t1")
    collect_json(store, "t1", workdir / "t1.jsonl", capsys)
    prepare(store, "t2", text_questions(workdir / "q2.jsonl", 12), "--reuse-from", "t1")
    finish(store, "t2")
    capsys.readouterr()
    assert (
        main(["collect", "--run", "t2", "--store", store, "--out", str(workdir / "t2.jsonl"), "--format", "table"]) == 0
    )
    assert "reused 10 row(s) from earlier runs, ran 2, 12 in all" in capsys.readouterr().out
    rows = [json.loads(line) for line in (workdir / "t2.jsonl").read_text().splitlines()]
    assert [r["reused"] for r in rows] == [True] * 10 + [False] * 2


@pytest.mark.slow
def test_reuse_orch_run_with_the_tiny_model_answers_only_the_new_rows(workdir, capsys):
    """The whole path with real workers: the second `orch run` gives the engine only the new rows."""
    (workdir / "orch.yaml").write_text(
        "sampling:\n  max_tokens: 8\n  temperature: 0\nworkers:\n  count: 1\n  heartbeat_interval: 1\n"
        "  checkpoint_interval: 1\n"
    )
    flags = ["--model", str(TINY), "--format", "text", "--text-column", "question", "--id-column", "id"]
    flags += ["--rows-per-chunk", "10", "--interval", "1"]
    first, grown = text_questions(workdir / "q.jsonl", 20), text_questions(workdir / "grown.jsonl", 22)
    assert main(["run", str(first), "--run", "one", *flags, "--out", str(workdir / "one.jsonl")]) == 0
    capsys.readouterr()
    args = ["run", str(grown), "--run", "two", *flags, "--reuse-from", "one", "--out", str(workdir / "two.jsonl")]
    assert main(args) == 0
    assert "reused 20 row(s) from earlier runs, ran 2, 22 in all" in capsys.readouterr().out
    assert run_rows(str(workdir / ".orch"), "two") == 2
    old = (workdir / "one.jsonl").read_bytes().splitlines()
    new = (workdir / "two.jsonl").read_bytes().splitlines()
    assert new[:20] == old and [json.loads(line)["custom_id"] for line in new] == [f"q{i}" for i in range(22)]


def test_reuse_lookup_spilled_in_many_key_ranges_parts_and_chunk_ranges_reuses_every_old_row(
    workdir, monkeypatch, capsys
):
    """The lookup as it runs on a large input, at a small scale: the new keys spilled into 32 key
    ranges, an index of 10 parts, the matches into one file per source chunk; a reordered input."""
    from orchestrator.prepare import spill
    from orchestrator.prepare.answers import answer_index, reuse

    monkeypatch.setattr(answer_index, "PART_ROWS", 32)
    monkeypatch.setattr(reuse, "PARTITION_ROWS", 16)
    monkeypatch.setattr(reuse, "BUFFER_ROWS", 7)
    monkeypatch.setattr(spill, "BUFFER_ROWS", 5)
    store = str(workdir / "store")
    prepare(store, "first", text_questions(workdir / "q.jsonl", 300))
    finish(store, "first")
    old = collect_json(store, "first", workdir / "first.jsonl", capsys)
    assert old["rows_written"] == 300
    index = json.loads(open_store(store).get(RunLayout("first").answer_index).data)
    assert len(index["parts"]) == 10
    rows = [{"id": f"q{i}", "question": f"Question {i}?"} for i in range(330)]
    prepare(store, "second", write_jsonl(workdir / "grown.jsonl", rows[::-1]), "--reuse-from", "first")
    assert reused_rows(store, "second") == 300 and run_rows(store, "second") == 30
    finish(store, "second")
    new = collect_json(store, "second", workdir / "second.jsonl", capsys)
    assert new["complete"] and new["reused"] == 300 and new["rows_total"] == 330
    by_id = {json.loads(line)["custom_id"]: line for line in (workdir / "first.jsonl").read_bytes().splitlines()}
    lines = (workdir / "second.jsonl").read_bytes().splitlines()
    assert [json.loads(line)["custom_id"] for line in lines] == [f"q{i}" for i in range(329, -1, -1)]
    assert all(by_id[json.loads(line)["custom_id"]] == line for line in lines[30:])


def test_reuse_an_edited_chat_template_file_reuses_nothing_and_its_copy_elsewhere_reuses_all(workdir, capsys):
    store = str(workdir / "store")
    data = text_questions(workdir / "q.jsonl", 20)
    template = workdir / "chat.jinja"
    template.write_text("{% for m in messages %}{{ m['content'] }}\n{% endfor %}")
    spec = (workdir / "orch.yaml").read_text()
    (workdir / "orch.yaml").write_text(spec + f"model:\n  chat_template: {template}\n")
    prepare(store, "base", data)
    finish(store, "base")
    collect_json(store, "base", workdir / "base.jsonl", capsys)

    copy = workdir / "elsewhere" / "same.jinja"
    copy.parent.mkdir()
    shutil.copy(template, copy)
    (workdir / "orch.yaml").write_text(spec + f"model:\n  chat_template: {copy}\n")
    prepare(store, "same-text", data, "--reuse-from", "base")
    assert reused_rows(store, "same-text") == 20
    template.write_text("{% for m in messages %}USER: {{ m['content'] }}\n{% endfor %}")
    (workdir / "orch.yaml").write_text(spec + f"model:\n  chat_template: {template}\n")
    prepare(store, "edited", data, "--reuse-from", "base")
    assert reused_rows(store, "edited") == 0 and run_rows(store, "edited") == 20
    # The run keeps the template's text, not its path: a worker elsewhere needs no copy of the file.
    frozen = read_stored_spec(open_store(store), RunLayout("edited"))
    assert frozen is not None and frozen[0]["model"]["chat_template"].startswith("{% for m in messages %}USER:")


def _big_weights_model(path: Path) -> Path:
    """The tiny Llama with a weight file over 32 MiB beside its own (once keyed by name and size only)."""
    shutil.copytree(TINY, path)
    with (path / "model-00002-of-00002.safetensors").open("wb") as f:
        f.write(bytes(33 << 20))
    return path


def test_reuse_weights_changed_at_the_same_size_reuse_nothing_and_a_copy_under_another_path_reuses_all(
    workdir, tmp_path, capsys
):
    store = str(workdir / "store")
    data = text_questions(workdir / "q.jsonl", 20)
    ckpt1 = _big_weights_model(tmp_path / "ckpt1")
    prepare(store, "base", data, model=ckpt1)
    finish(store, "base")
    collect_json(store, "base", workdir / "base.jsonl", capsys)

    moved = tmp_path / "copied" / "elsewhere"
    shutil.copytree(ckpt1, moved)
    prepare(store, "moved", data, "--reuse-from", "base", model=moved)
    assert reused_rows(store, "moved") == 20
    ckpt2 = tmp_path / "ckpt2"
    shutil.copytree(ckpt1, ckpt2)
    weights = ckpt2 / "model-00002-of-00002.safetensors"
    stat = weights.stat()
    with weights.open("r+b") as f:  # one byte deep in the file, size and mtime kept
        f.seek(20 << 20)
        f.write(b"\x01")
    os.utime(weights, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    prepare(store, "changed", data, "--reuse-from", "base", model=ckpt2)
    assert reused_rows(store, "changed") == 0


def test_reuse_keys_a_named_model_by_content_not_by_its_name(workdir, tmp_path, capsys):
    """`--model ft=ckpt1` then `ft=ckpt2`: two fine-tunes under one name share no key; the same
    weights plain, named or under an alias share all of them."""
    store = str(workdir / "store")
    data = text_questions(workdir / "q.jsonl", 20)
    ckpt1 = _big_weights_model(tmp_path / "ckpt1")
    ckpt2 = tmp_path / "ckpt2"
    shutil.copytree(ckpt1, ckpt2)
    with (ckpt2 / "model-00002-of-00002.safetensors").open("r+b") as f:
        f.seek(1 << 20)
        f.write(b"\x02")
    prepare(store, "ft1", data, model=f"ft={ckpt1}")
    finish(store, "ft1")
    collect_json(store, "ft1", workdir / "ft1.jsonl", capsys)

    prepare(store, "ft2", data, "--reuse-from", "ft1", model=f"ft={ckpt2}")
    assert reused_rows(store, "ft2") == 0
    prepare(store, "plain", data, "--reuse-from", "ft1", model=ckpt1)
    assert reused_rows(store, "plain") == 20
    prepare(store, "alias", data, "--reuse-from", "ft1", model=f"other-name={ckpt1}")
    assert reused_rows(store, "alias") == 20


def test_reuse_run_repeats_its_own_commands_and_refuses_another_source_naming_both(workdir, capsys):
    store = str(workdir / "store")
    data = text_questions(workdir / "q.jsonl", 12)
    prepare(store, "base", data)
    finish(store, "base")
    collect_json(store, "base", workdir / "base.jsonl", capsys)
    prepare(store, "other", data)
    prepare(store, "w2", data, "--reuse-from", "base")
    prepare(store, "w2", data, "--reuse-from", "base")  # the same command again
    prepare(store, "w2", data)  # without the flag: the run's own reuse stands
    capsys.readouterr()
    prepare(store, "w2", data, "--reuse-from", "other", code=3)
    err = capsys.readouterr().err
    assert 'reuse: {"runs": ["base"]' in err and '{"runs": ["other"]' in err


def test_reuse_check_says_how_many_requests_would_be_reused_and_how_many_paid(workdir, capsys):
    store = str(workdir / "store")
    prepare(store, "base", text_questions(workdir / "q.jsonl", 20))
    finish(store, "base")
    collect_json(store, "base", workdir / "base.jsonl", capsys)
    grown = text_questions(workdir / "grown.jsonl", 26)
    capsys.readouterr()
    prepare(store, "next", grown, "--reuse-from", "base", "--check")
    assert "reuse: 20 request(s) answered by earlier runs, 6 to run and pay for" in capsys.readouterr().out
    prepare(store, "next", grown, "--reuse-from", "base", "--check", "--json")
    report = json.loads(capsys.readouterr().out)
    assert (report["reused"], report["to_run"]) == (20, 6)
    assert open_store(store).head(RunLayout("next").prepare_record) is None  # a check writes nothing


def test_reuse_a_pilot_samples_every_kind_of_row_and_the_full_run_pays_only_for_the_rest(workdir, capsys):
    """`--limit 20`: a stratified sample (prompt length, output budget, prefix); the whole input's
    run with --reuse-from the pilot answers the pilot's rows from it and runs the others."""
    store = str(workdir / "store")
    kinds = ["Short?", "A much longer question " * 30 + "?"]
    rows = [{"id": f"q{i}", "question": f"{kinds[i % 2]} {i}"} for i in range(200)]
    data = write_jsonl(workdir / "q.jsonl", rows)
    prepare(store, "pilot", data, "--limit", "20")
    pilot = read_manifest(open_store(store), RunLayout("pilot"))
    lines = [
        json.loads(x) for e in pilot for x in open_store(store).get(RunLayout("pilot").chunk(e.chunk)).data.splitlines()
    ]
    assert len(lines) == 20
    picked = [int(line["custom_id"][1:]) for line in lines]
    assert sum(i % 2 for i in picked) == 10  # both kinds, in proportion
    assert picked == sorted(picked)  # input order
    capsys.readouterr()
    prepare(store, "pilot", data, "--limit", "20")  # the same command: the same sample, already prepared
    assert "already prepared" in capsys.readouterr().out
    finish(store, "pilot")
    assert collect_json(store, "pilot", workdir / "pilot.jsonl", capsys)["rows_written"] == 20

    prepare(store, "full", data, "--reuse-from", "pilot")
    assert reused_rows(store, "full") == 20 and run_rows(store, "full") == 180
