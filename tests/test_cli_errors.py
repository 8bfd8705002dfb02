"""Mistakes a user makes in the first hour: each one ERROR line with a hint, no traceback, nothing left behind."""

from __future__ import annotations

from pathlib import Path

import pytest

from orchestrator.cli import main
from tests.support.datasets import write_jsonl


@pytest.fixture
def project(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    return tmp_path


def one_error(err: str) -> str:
    lines = err.strip().splitlines()
    lines = lines[next((i for i, line in enumerate(lines) if line.startswith("ERROR")), 0) :]  # after progress
    assert "Traceback" not in err and lines[0].startswith("ERROR ") and lines[-1].startswith("hint: "), err
    assert sum(line.startswith("ERROR") for line in lines) == 1, err
    return lines[0]


def test_status_of_a_mistyped_store_creates_nothing(project, capsys):
    typo = project / "no" / "such" / "store"
    assert main(["status", "--run", "r", "--store", str(typo)]) == 5
    assert f"the store {typo} holds no runs at all" in one_error(capsys.readouterr().err)
    assert not (project / "no").exists()


def test_a_store_orch_may_not_write_is_one_error_line(project, capsys):
    data = write_jsonl(project / "d.jsonl", [{"text": "a"}])
    # /sys refuses new files even to root: a real unwritable place on any Linux machine.
    assert (
        main(["prepare", str(data), "--run", "r", "--store", "/sys/orch", "--format", "text", "--num-chunks", "1"]) == 1
    )
    assert "cannot write to the store at /sys/orch" in one_error(capsys.readouterr().err)
    assert main(["status", "--run", "r", "--store", "/sys/orch"]) == 5
    one_error(capsys.readouterr().err)


def test_a_store_path_that_is_a_file_is_named_as_one(project, capsys):
    data = write_jsonl(project / "d.jsonl", [{"text": "a"}])
    under = data / "sub"
    args = ["prepare", str(data), "--run", "r", "--format", "text", "--num-chunks", "1", "--store", str(under)]
    assert main(args) == 1
    assert f"the store {under} lies under {data}, which is a file" in one_error(capsys.readouterr().err)
    assert main(["status", "--run", "r", "--store", str(data)]) == 1
    assert f"the store {data} is a file" in one_error(capsys.readouterr().err)
    assert data.read_text().strip() == '{"text": "a"}'  # the data file untouched


@pytest.mark.parametrize("flag", ["--seeds", "--workers", "--chunks", "--rows-per-chunk"])
@pytest.mark.usefixtures("project")
def test_simulate_refuses_zero_with_one_error_line(capsys, flag):
    assert main(["simulate", flag, "0"]) == 2
    first = one_error(capsys.readouterr().err)
    assert f"Invalid value for '{flag}': 0 is not in the range x>=1" in first


def test_run_refuses_an_output_it_would_not_write_before_any_work(project, capsys):
    data = write_jsonl(project / "d.jsonl", [{"text": "a"}])
    args = ["run", str(data), "--run", "r", "--model", "m", "--format", "text", "--num-chunks", "1"]
    assert main([*args, "--out", "answers.csv"]) == 1
    assert "orch writes .jsonl, .ndjson, .parquet files, not .csv" in one_error(capsys.readouterr().err)
    assert main([*args, "--out", "/sys/answers.jsonl"]) == 1
    assert "cannot write /sys/answers.jsonl" in one_error(capsys.readouterr().err)
    assert not Path(".orch").exists()  # refused before prepare


def prepared_run(project: Path, run: str = "r") -> list[str]:
    data = write_jsonl(project / "d.jsonl", [{"text": "a"}, {"text": "b"}])
    assert main(["prepare", str(data), "--run", run, "--format", "text", "--num-chunks", "1"]) == 0
    return ["--run", run]


def store_files(project: Path) -> dict[str, bytes]:
    return {str(p): p.read_bytes() for p in sorted((project / ".orch").rglob("*")) if p.is_file()}


@pytest.mark.parametrize(
    ("model", "problem"),
    [
        ("/does/not/exist", "/does/not/exist does not exist"),
        ("./models/typo", "./models/typo does not exist"),
        ("d.jsonl", "d.jsonl is a file, not a model directory or a .gguf file"),
        ("empty", "empty has no config.json"),
    ],
)
def test_launch_refuses_a_local_model_path_that_holds_no_model_and_records_nothing(project, capsys, model, problem):
    run = prepared_run(project)
    (project / "empty").mkdir()
    before = store_files(project)
    capsys.readouterr()
    assert main(["launch", *run, "--model", model, "--workers", "1"]) == 2
    first = one_error(capsys.readouterr().err)
    assert first.startswith("ERROR --model: ") and problem in first
    assert store_files(project) == before  # nothing frozen, no plan, no job
    (project / "orch.yaml").write_text(f"model:\n  name: {model}\n")
    assert main(["run", "d.jsonl", *run, "--format", "text", "--out", "o.jsonl"]) == 2
    assert one_error(capsys.readouterr().err).startswith("ERROR model.name: ")
    assert store_files(project) == before


def test_a_hub_id_and_a_gguf_file_are_left_to_the_worker(project):
    from orchestrator.core.model_source import local_model_problem

    (project / "m.gguf").write_bytes(b"GGUF")
    (project / "ok").mkdir()
    (project / "ok" / "config.json").write_text("{}")
    for fine in ("org/name", "gpt2", "m.gguf", "ok", str(project / "ok")):
        assert local_model_problem(fine) is None, fine
    assert local_model_problem("a/b/c") is not None  # two slashes: only a path can be that
    run = prepared_run(project)
    assert main(["launch", *run, "--model", "org/name", "--workers", "1", "--dry-run", "--out", "tasks"]) == 0
