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


def test_a_local_lora_adapter_that_is_not_there_is_refused_naming_it(project, capsys):
    run = prepared_run(project)
    (project / "ok").mkdir()
    (project / "ok" / "config.json").write_text("{}")
    (project / "orch.yaml").write_text("model:\n  lora: {sql: ./adapters/sql}\n")
    assert main(["launch", *run, "--model", "./ok", "--workers", "1"]) == 2
    assert one_error(capsys.readouterr().err).startswith("ERROR model.lora.sql: ./adapters/sql is not a directory")


@pytest.mark.slow  # renders SkyPilot tasks
def test_a_hub_id_and_a_gguf_file_are_left_to_the_worker(project):
    from orchestrator.core.model_source import local_model_problem

    (project / "m.gguf").write_bytes(b"GGUF")
    (project / "ok").mkdir()
    (project / "ok" / "config.json").write_text("{}")
    for fine in ("org/name", "gpt2", "m.gguf", "ok", str(project / "ok")):
        assert local_model_problem(fine) is None, fine
    assert local_model_problem("a/b/c") is not None  # two slashes: only a path can be that
    run = prepared_run(project)
    assert (
        main(["launch", *run, "--model", "org/name", "--workers", "1", "--dry-run", "--out", "tasks"]) == 1
    )  # not refused (2): a dry run missing prerequisites here


def answered_run(project: Path, run: str, errors: int = 0):
    """A run of one chunk of 4 rows, answered (`errors` of them with error rows) in the default store."""
    from orchestrator.core.store import open_store
    from tests.support.runs import Answer, answer_chunk, chat_request, make_run

    store = open_store(str(project / ".orch"))
    layout = make_run(store, run, [[chat_request(f"r{i}", "q") for i in range(4)]], model="m")
    rows = [Answer(i, f"r{i}", "x") if i >= errors else Answer(i, f"r{i}", error="boom") for i in range(4)]
    answer_chunk(store, layout, "part_00000", [rows])
    return store, layout


def error_paths(project: Path) -> list[tuple[list[str], int, str, str]]:
    """What docs/operations.md's "When something goes wrong" lists, each exit code by a mistake that gets
    it: (argv, exit code, in the ERROR line, in the hint line)."""
    data = write_jsonl(project / "d.jsonl", [{"text": "a"}, {"text": "b"}])
    body = {"messages": [{"role": "user", "content": "a"}], "temprature": 0.2}
    refused = write_jsonl(project / "r.jsonl", [{"custom_id": "a", "url": "/v1/chat/completions", "body": body}])
    (project / "typo.yaml").write_text("chunking:\n  num_chunk: 3\n")
    (project / "negative.yaml").write_text("chunking:\n  num_chunks: -3\n")
    text = ["--format", "text"]
    assert main(["prepare", str(data), "--run", "frozen", *text, "--num-chunks", "1"]) == 0
    store, layout = answered_run(project, "corrupt")
    (part,) = [o.key for o in store.list(layout.outputs_root)]
    store.put(part, store.get(part).data.replace(b'"x"', b'"y"'))
    answered_run(project, "errors", errors=2)
    from orchestrator.core.store import open_store
    from tests.support.runs import chat_request, make_run

    make_run(open_store(str(project / ".orch")), "unanswered", [[chat_request("a", "q")]], model="m")
    return [
        (["prepare", str(data), "--run", "a", *text, "--num-chunks", "-3"], 2, "ERROR --num-chunks: ", "--num-chunks"),
        (["prepare", str(data), "--run", "a", "-f", "typo.yaml"], 2, "chunking.num_chunk: unknown", "did you mean"),
        (
            ["prepare", str(data), "--run", "a", "-f", "negative.yaml"],
            2,
            "negative.yaml:2: chunking.num_chunks",
            "docs/spec.md",
        ),
        (["prepare", str(data), "--run", "a", "--format", "nope"], 2, "'--format'", "--help"),
        (["launch", "--run", "frozen", "--model", "/no/model", "--workers", "1"], 2, "ERROR --model: ", "config.json"),
        (["prepare", str(data), "--run", "frozen", *text, "--num-chunks", "2"], 3, "a different spec", "--run NEW"),
        (
            ["prepare", "missing.jsonl", "--run", "a", *text, "--num-chunks", "1"],
            4,
            "missing.jsonl does not exist",
            "SOURCES are",
        ),
        (
            ["prepare", str(data), "--run", "a", "--num-chunks", "1"],
            4,
            "no column 'conversation' (the row has text)",
            "--format text",
        ),
        (["status", "--run", "nope"], 5, "run 'nope' has no manifest", "orch prepare"),
        (["status", "--run", "frozn"], 5, "run 'frozn' has no manifest", "did you mean --run frozen?"),
        (["collect", "--run", "unanswered", "--out", "o.jsonl"], 7, "1 row(s) missing", "orch resume"),
        (["collect", "--run", "corrupt", "--out", "o.jsonl"], 8, "does not match the checksum", "orch redo"),
        (["collect", "--run", "errors", "--out", "o.jsonl"], 9, "2 of 4 rows are errors", "error.message"),
        (
            ["prepare", str(refused), "--run", "a", "--format", "openai-batch", "--check"],
            10,
            "1 of 1 request(s) would be refused by the workers",
            "nothing was written",
        ),
    ]


def test_every_error_path_the_docs_list_gives_an_error_line_and_a_hint(project, capsys):
    paths = error_paths(project)
    capsys.readouterr()
    for argv, code, said, hinted in paths:
        assert main(argv) == code, (argv, capsys.readouterr())
        err = capsys.readouterr().err
        first = one_error(err)
        assert said in first, (argv, err)
        assert hinted in err.strip().splitlines()[-1], (argv, err)
    # 6: the backend refused: the local workers' log folder cannot be made (a file is in its way).
    (project / ".orch" / "logs").write_text("")
    assert main(["launch", "--run", "frozen", "--model", "org/model", "--workers", "1"]) == 6
    err = capsys.readouterr().err
    assert "1 worker(s) not submitted" in one_error(err) and "make it a folder orch may write to" in err


@pytest.mark.usefixtures("project")
def test_serve_on_a_busy_port_is_one_error_line(capsys):
    import socket

    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        assert main(["serve", "--port", str(port), "--model", "m=org/model"]) == 1
    first = one_error(capsys.readouterr().err)
    assert first.startswith(f"ERROR --port: cannot listen on 127.0.0.1:{port}: ") and "in use" in first


def test_a_skypilot_dry_run_warns_of_what_no_cloud_machine_can_reach(project, capsys):
    run = prepared_run(project)
    (project / "model").mkdir()
    (project / "model" / "config.json").write_text("{}")
    assert (
        main(["launch", *run, "--backend", "skypilot", "--model", "./model", "--dry-run", "--out", "t"]) == 1
    )  # prerequisites missing
    err = capsys.readouterr().err
    assert "warning: the store ./.orch is a directory on this machine: no cloud machine can reach it" in err
    assert "warning: --model ./model is a path: a cloud machine reads it from its own disk" in err
    assert (
        main(["launch", *run, "--backend", "skypilot", "--model", "org/model", "--dry-run", "--out", "t"]) == 1
    )  # prerequisites missing
    assert "--model" not in capsys.readouterr().err  # a hub id: nothing to warn of
