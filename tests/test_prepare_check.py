"""`orch prepare`'s request check from the user's side: every request the workers would refuse, found before anything is written."""

from __future__ import annotations

import json
import os

import pytest

from orchestrator.cli import main
from tests.support.datasets import write_jsonl

CHAT = "/v1/chat/completions"
BAD_SCHEMA = {"type": "json_schema", "json_schema": {"name": "label", "schema": {"type": "strng"}}}


def line(i: int, **body):
    messages = [{"role": "user", "content": f"ticket {i}"}]
    return {"custom_id": f"t{i}", "method": "POST", "url": CHAT, "body": {"messages": messages, **body}}


def mistakes_file(path, rows=40):
    """Every 10 rows: a typo on line 4, -5 max_tokens on line 6, a schema that does not compile on line 8."""
    out = []
    for i in range(rows):
        extra = {3: {"temprature": 0.2}, 5: {"max_tokens": -5}, 7: {"response_format": BAD_SCHEMA}}.get(i % 10, {})
        out.append(line(i, **{"max_tokens": 32, **extra}))
    write_jsonl(path, out)
    return path


def prepare(store, source, *args):
    return main(["prepare", str(source), "--format", "openai-batch", "--run", "r", "--store", store, *args])


@pytest.fixture
def store_dir(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # no stray orch.yaml from elsewhere
    return str(tmp_path / "store")


def written(store_dir):
    return sorted(os.path.relpath(os.path.join(d, f), store_dir) for d, _, fs in os.walk(store_dir) for f in fs)


def test_prepare_check_lists_every_mistake_by_field_with_counts_and_lines(store_dir, tmp_path, capsys):
    source = mistakes_file(tmp_path / "tickets.jsonl")
    assert prepare(store_dir, source, "--check") == 10
    err = capsys.readouterr().err
    assert "12 of 40 request(s) would be refused by the workers (3 field(s))" in err
    assert "temprature: 4 row(s)" in err and "did you mean 'temperature'?" in err
    assert "max_tokens: 4 row(s)" in err and f"{source}:6: max_tokens=-5: expected an integer >= 1" in err
    assert "response_format: 4 row(s)" in err and f"{source}:8: response_format's JSON schema" in err
    assert f"{source}:4:" in err and f"{source}:14:" in err and f"{source}:24:" in err
    assert "... and 1 more" in err  # three examples per field, then the count of the rest
    assert written(store_dir) == []


@pytest.mark.parametrize("grouping", [[], ["--group-by-prefix"]])
def test_prepare_refuses_before_writing_any_chunk(store_dir, tmp_path, capsys, grouping):
    source = mistakes_file(tmp_path / "tickets.jsonl")
    assert prepare(store_dir, source, "--num-chunks", "4", *grouping) == 10
    assert "temprature: 4 row(s)" in capsys.readouterr().err
    assert written(store_dir) == []
    # Skipped on purpose, the rows go to the workers, which answer them with error rows.
    assert prepare(store_dir, source, "--num-chunks", "4", "--no-check", *grouping) == 0
    assert "runs/r/prepare.json" in written(store_dir)


def test_prepare_check_passes_a_clean_file_and_writes_nothing(store_dir, tmp_path, capsys):
    source = tmp_path / "clean.jsonl"
    write_jsonl(source, [line(i, max_tokens=16, temperature=0.5) for i in range(30)])
    assert prepare(store_dir, source, "--check") == 0
    assert "checked 30 request(s)" in capsys.readouterr().out
    assert written(store_dir) == []


def test_prepare_check_fails_when_a_row_would_be_set_aside_saying_how_many_and_why(store_dir, tmp_path, capsys):
    source = tmp_path / "one-bad.jsonl"
    write_jsonl(source, [line(i, max_tokens=16, temperature=0.5) for i in range(30)] + [{"custom_id": "x"}])
    assert prepare(store_dir, source, "--check") == 4
    captured = capsys.readouterr()
    assert "checked 30 request(s)" in captured.out and "1 bad row(s) would be set aside" in captured.out
    assert f"ERROR 1 of 31 row(s) would be set aside, e.g. {source}:31" in captured.err
    assert written(store_dir) == []
    assert prepare(store_dir, source, "--check", "--json") == 4
    report = json.loads(capsys.readouterr().out)
    assert report["requests"] == {"checked": 30, "refused": 0, "fields": {}} and report["set_aside"] == 1
    assert prepare(store_dir, source) == 0
    assert "runs/r/prepare.json" in written(store_dir)


def test_prepare_check_names_a_model_neither_the_run_nor_its_adapters(store_dir, tmp_path, capsys):
    spec = tmp_path / "orch.yaml"
    spec.write_text("model:\n  name: org/base\n  lora:\n    support-v2: org/support-v2\n")
    source = tmp_path / "tickets.jsonl"
    models = ["org/base", "support-v2", "support-v3", None]
    write_jsonl(source, [line(i, **({"model": m} if m else {})) for i, m in enumerate(models)])
    assert prepare(store_dir, source, "--check", "-f", spec) == 10
    err = capsys.readouterr().err
    assert "model: 1 row(s)" in err and f"{source}:3: model 'support-v3'" in err
    assert "did you mean 'support-v2'?" in err


def test_prepare_check_finds_a_typo_in_completion_rows_and_a_bad_prompt(store_dir, tmp_path, capsys):
    source = tmp_path / "completions.jsonl"
    rows = [{"prompt": "a", "max_tokns": 3}, {"prompt": "b"}, {"prompt": "c", "temperature": 9}]
    write_jsonl(source, rows)
    args = ["prepare", str(source), "--format", "completion", "--run", "r", "--store", store_dir, "--check"]
    assert main(args) == 10
    err = capsys.readouterr().err
    assert "max_tokns: 1 row(s)" in err and "did you mean 'max_tokens'?" in err
    assert f"{source}:3: temperature=9: expected a number from 0 to 2" in err


def test_spec_with_three_typos_lists_all_three(store_dir, tmp_path, capsys):
    spec = tmp_path / "orch.yaml"
    spec.write_text("sampling:\n  max_tokns: 10\n  temprature: 0.5\nworkers:\n  cout: 3\n")
    source = mistakes_file(tmp_path / "tickets.jsonl", rows=3)
    assert prepare(store_dir, source, "-f", spec) == 2
    err = capsys.readouterr().err
    assert "3 problems" in err
    assert f"{spec}:2: sampling.max_tokns: unknown field; did you mean sampling.max_tokens?" in err
    assert f"{spec}:3: sampling.temprature: unknown field; did you mean sampling.temperature?" in err
    assert f"{spec}:5: workers.cout: unknown field; did you mean workers.count?" in err
