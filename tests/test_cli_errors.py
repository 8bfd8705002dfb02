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
