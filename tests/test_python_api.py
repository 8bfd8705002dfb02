"""orch from Python (docs/python.md): orchestrator.run / attach / estimate and Run, as a notebook or a pipeline uses them.

The fast tests prepare real runs in real stores and answer their chunks with the protocol's own
objects (a worker's lease, parts and done marker); the slow ones run real workers on vLLM:
the labelling job against the CLI's table, a kernel killed with SIGKILL mid-run (the notebook:
test_python_notebook.py).
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import subprocess
import threading
import time
from pathlib import Path

import pandas as pd
import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import orchestrator
from orchestrator.cli import main
from orchestrator.core.errors import InputError, OrchError, RunNotFound, SpecError
from orchestrator.core.layout import RunLayout
from orchestrator.core.records import read_jobs, read_manifest
from orchestrator.core.store import open_store
from tests.support.runs import Answer, answer_chunk

ROOT = Path(__file__).resolve().parents[1]
MODELS = ROOT / ".cache" / "models"
PYTHON = ROOT / ".venv" / "bin" / "python"

TICKETS = [
    {"ticket": "T1", "subject": "Refund", "body": "I was charged twice", "priority": "high"},
    {"ticket": "T2", "subject": "Login", "body": "I cannot sign in since Monday", "priority": "low"},
    {"ticket": "T3", "subject": "Invoice", "body": "Please send the March invoice again", "priority": "low"},
    {"ticket": "T4", "subject": "Password", "body": "The reset mail never arrives", "priority": "high"},
]
SCHEMA = {
    "type": "object",
    "properties": {"category": {"enum": ["billing", "account", "other"]}, "urgent": {"type": "boolean"}},
    "required": ["category", "urgent"],
    "additionalProperties": False,
}
TEMPLATE = "Classify this support ticket.\nSubject: {subject}\nBody: {body}"


def model(name: str) -> str:
    path = MODELS / name
    if not (path / ".built").exists():
        pytest.fail(f"the model {name} is missing: run `make models` (make test does it)")
    return str(path)


@pytest.fixture
def workdir(tmp_path, monkeypatch):
    """A project directory with small, quick workers (orch.yaml, read by Python and the CLI alike)."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "orch.yaml").write_text(
        "workers:\n  count: 1\n  heartbeat_interval: 1\n  checkpoint_interval: 1\n  lease_ttl: 20\n"
    )
    return tmp_path


def answer_every_chunk(store_uri: str, run: str) -> list[str]:
    """Every chunk of the run answered through the protocol's own objects (lease, parts, done
    marker), as a worker answers it; returns the custom_ids in chunk order."""
    store, layout = open_store(store_uri), RunLayout(run)
    ids = []
    for entry in read_manifest(store, layout):
        lines = [json.loads(line) for line in store.get(layout.chunk(entry.chunk)).data.splitlines()]
        answers = [Answer(i, line["custom_id"], f"answer to {line['custom_id']}") for i, line in enumerate(lines)]
        answer_chunk(store, layout, entry.chunk, [answers])
        ids += [line["custom_id"] for line in lines]
    return ids


# -- import ------------------------------------------------------------------------------------


def test_import_orchestrator_is_cheap_and_loads_no_engine_nor_cloud_sdk():
    """`python -X importtime -c 'import orchestrator'`: the package's own cumulative time, the best
    of three processes (a loaded machine's noise left out), under 0.3 s; neither vLLM nor SkyPilot
    loaded, even once the API itself is (`orchestrator.run`)."""
    probe = (
        "import sys, json, orchestrator; before = sorted(sys.modules); orchestrator.run; "
        "print(json.dumps([sorted(m for m in mods if m.split('.')[0] in ('vllm', 'sky', 'torch')) "
        "for mods in (before, sys.modules)]))"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    costs = []
    for _ in range(3):
        done = subprocess.run(
            [str(PYTHON), "-X", "importtime", "-c", probe], env=env, capture_output=True, text=True, check=True
        )
        line = next(x for x in done.stderr.splitlines() if re.search(r"\|\s+orchestrator$", x))
        costs.append(int(line.split("|")[1]) / 1e6)
        assert json.loads(done.stdout) == [[], []]
    assert min(costs) < 0.3, costs


def test_the_cli_loads_only_click_until_a_command_runs():
    """Every `orch` command starts by importing the CLI: its modules import their services inside
    the commands (orchestrator/commands/__init__.py), so `orch --version` loads click and nothing
    else outside the standard library (a top-level import of the run context made every command
    pay 0.8 s for it)."""
    probe = (
        "import sys, json, orchestrator.cli; "
        "print(json.dumps(sorted({m.split('.')[0] for m in sys.modules if not m.startswith('_')} "
        "- set(sys.stdlib_module_names))))"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run([str(PYTHON), "-c", probe], env=env, capture_output=True, text=True, check=True)
    assert json.loads(done.stdout) == ["click", "orchestrator"]


def test_the_public_names_are_the_api_and_orch_error_is_the_clis():
    assert {"run", "attach", "estimate", "Run", "Forecast", "OrchError"} <= set(dir(orchestrator))
    assert orchestrator.OrchError is OrchError
    assert (ROOT / "orchestrator" / "py.typed").exists()
    with pytest.raises(AttributeError):
        orchestrator.no_such_name  # noqa: B018


# -- errors ------------------------------------------------------------------------------------


def test_python_errors_are_the_clis_named_by_the_keyword(workdir):
    tiny = model("tiny-llama")
    frame = pd.DataFrame(TICKETS)
    with pytest.raises(SpecError) as bad_model:
        orchestrator.run(frame, model=str(workdir / "no-model"), template=TEMPLATE)
    assert bad_model.value.where == "model=" and "does not exist" in bad_model.value.message
    with pytest.raises(SpecError) as typo:
        orchestrator.run(frame, model=tiny, template=TEMPLATE, temprature=0)
    assert typo.value.where == "temprature=" and "max_tokens" in (typo.value.hint or "")
    with pytest.raises(SpecError) as workers:
        orchestrator.run(frame, model=tiny, template=TEMPLATE, workers=0)
    assert workers.value.where == "workers=" and str(workers.value).startswith("workers=: ")
    with pytest.raises(SpecError) as schema:
        orchestrator.run(frame, model=tiny, template=TEMPLATE, json_schema={"type": 3})
    assert "not a valid JSON Schema" in str(schema.value)
    with pytest.raises(InputError) as not_rows:
        orchestrator.run(42, model=tiny)
    assert "DataFrame" in (not_rows.value.hint or "")
    with pytest.raises(InputError) as not_a_dict:
        orchestrator.run([{"a": 1}, "b"], model=tiny)
    assert "row 1 is a str" in str(not_a_dict.value)
    with pytest.raises(RunNotFound) as missing:
        orchestrator.attach("nothing-here", store=workdir / "store")
    assert missing.value.where == "run=" and "nothing-here" in str(missing.value)
    assert not (workdir / "store" / "runs").exists()  # nothing refused left anything behind


# -- the same data, the same run ---------------------------------------------------------------


def test_the_same_data_again_is_the_same_run_and_other_data_is_refused(workdir):
    """A DataFrame is kept in the run's input folder of the store; the same call names the same run
    and keeps that file (prepared once), and other data for a prepared run is refused, saying so."""
    tiny, store = model("tiny-llama"), str(workdir / "store")
    frame = pd.DataFrame(TICKETS)
    first = orchestrator.estimate(frame, model=tiny, template=TEMPLATE, json_schema=SCHEMA, store=store)
    runs = list((workdir / "store" / "runs").iterdir())
    assert len(runs) == 1 and re.fullmatch(r"data-[0-9a-f]{12}", runs[0].name)
    kept = runs[0] / "input" / "data.parquet"
    assert pq.read_table(kept).to_pylist() == TICKETS
    written = kept.stat().st_mtime_ns
    # The same rows from polars, Hugging Face and pyarrow (other writers, other string types, other
    # metadata) are the same input.
    again = orchestrator.estimate(pl.DataFrame(TICKETS), model=tiny, template=TEMPLATE, json_schema=SCHEMA, store=store)
    assert again.record.prompt_tokens == first.record.prompt_tokens
    from datasets import Dataset

    hugging_face = Dataset.from_list(TICKETS)
    orchestrator.estimate(hugging_face, model=tiny, template=TEMPLATE, json_schema=SCHEMA, store=store)
    arrow = pa.Table.from_pylist(TICKETS)
    orchestrator.estimate(arrow, model=tiny, template=TEMPLATE, json_schema=SCHEMA, store=store, run=runs[0].name)
    assert [r.name for r in (workdir / "store" / "runs").iterdir()] == [runs[0].name]
    assert kept.stat().st_mtime_ns == written
    # Other options name another run; other data for this one is refused, and the file is untouched.
    orchestrator.estimate(frame, model=tiny, template=TEMPLATE, store=store)
    assert len(list((workdir / "store" / "runs").iterdir())) == 2
    with pytest.raises(InputError) as refused:
        orchestrator.estimate(
            frame.head(2), model=tiny, template=TEMPLATE, json_schema=SCHEMA, run=runs[0].name, store=store
        )
    assert "was prepared from other data (data.parquet, 4 rows)" in str(refused.value)
    assert "run=" in (refused.value.hint or "")
    assert kept.stat().st_mtime_ns == written


def test_rows_as_dicts_are_read_as_a_jsonl_file_would_be(workdir):
    """An iterable of dicts (here a generator) is written as JSONL lines: nested values stay JSON."""
    tiny, store = model("tiny-llama"), str(workdir / "store")
    rows = ({"id": f"c{i}", "conversation": [{"role": "user", "content": f"Hi {i}"}]} for i in range(3))
    orchestrator.estimate(rows, model=tiny, id_column="id", store=store, run="chats")
    kept = workdir / "store" / "runs" / "chats" / "input" / "rows.jsonl"
    assert [json.loads(line)["conversation"][0]["content"] for line in kept.read_text().splitlines()] == [
        "Hi 0",
        "Hi 1",
        "Hi 2",
    ]
    chunk = next((workdir / "store" / "runs" / "chats" / "chunks").glob("*.jsonl")).read_text().splitlines()
    assert [json.loads(line)["custom_id"] for line in chunk] == ["c0", "c1", "c2"]


# -- estimate ----------------------------------------------------------------------------------


def test_estimate_from_python_is_the_forecast_orch_estimate_prints(workdir, capsys):
    tiny, store = model("tiny-llama"), str(workdir / "store")
    forecast = orchestrator.estimate(
        pd.DataFrame(TICKETS), model=tiny, template=TEMPLATE, store=store, run="est", workers=2
    )
    assert forecast.record.kind == "guess" and forecast.record.workers == 2
    assert main(["estimate", "--run", "est", "--store", store, "--workers", "2", "--json"]) == 0
    printed = json.loads(capsys.readouterr().out)
    ours = forecast.to_dict()
    assert {k: v for k, v in ours.items() if k != "at"} == {k: v for k, v in printed.items() if k != "at"}
    # A prepared run is estimated by name, as `orch estimate --run` does.
    named = orchestrator.estimate(run="est", store=store, workers=2)
    assert named.to_dict()["candidates"] == ours["candidates"]
    with pytest.raises(SpecError):
        orchestrator.estimate(store=store)


# -- attach, wait, read ------------------------------------------------------------------------


def test_attach_follows_a_run_answered_elsewhere_and_reads_its_table_in_input_order(workdir):
    """A run prepared from Python (estimate, not launched) and answered by another process: attach
    finds it, wait launches nothing (no chunk is left), the table comes in input order in pandas,
    polars and Arrow; no thread is left behind by wait or wait_async."""
    tiny, store = model("tiny-llama"), str(workdir / "store")
    rows = [{"id": f"r{i:02d}", "q": f"Question {i}?"} for i in range(25)]
    orchestrator.estimate(
        rows, model=tiny, template="Answer: {q}", id_column="id", rows_per_chunk=10, store=store, run="elsewhere"
    )
    ids = answer_every_chunk(store, "elsewhere")
    assert ids == [r["id"] for r in rows]

    threads = set(threading.enumerate())
    run = orchestrator.attach("elsewhere", store=store)
    assert run.wait(progress=True, interval=0.2) is run
    assert set(threading.enumerate()) == threads
    assert asyncio.run(run.wait_async(progress=False, interval=0.2)) is run
    assert set(threading.enumerate()) == threads
    assert read_jobs(open_store(store), RunLayout("elsewhere"))[0].workers == {}  # nothing was launched

    frame = run.to_pandas(keep_columns=["q"])
    assert frame["id"].tolist() == ids and frame["q"].tolist() == [r["q"] for r in rows]
    assert frame["text"].tolist() == [f"answer to {i}" for i in ids]
    assert run.report is not None and run.report.rows_written == 25 and run.report.errors == 0
    assert run.to_polars()["id"].to_list() == ids
    table = run.to_arrow()
    collected = workdir / "collected.parquet"
    assert main(["collect", "--run", "elsewhere", "--store", store, "--out", str(collected)]) == 0
    assert table.equals(pq.read_table(collected))  # the columns and rows of `orch collect --out x.parquet`
    status = run.status()
    assert status.complete and status.rows.done == 25


def test_wait_async_leaves_the_event_loop_free_and_no_thread_when_cancelled(workdir):
    """While a run is followed, the loop goes on; cancelling the awaiting task ends the follow thread."""
    tiny, store = model("tiny-llama"), str(workdir / "store")
    orchestrator.estimate([{"q": "Hi"}], model=tiny, template="{q}", store=store, run="pending")
    run = orchestrator.attach("pending", store=store)
    threads = set(threading.enumerate())

    async def follow_then_cancel() -> int:
        task = asyncio.create_task(run.wait_async(progress=False, interval=0.2))
        beats = 0
        for _ in range(10):  # the loop runs while the run is followed
            await asyncio.sleep(0.05)
            beats += 1
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        return beats

    try:
        assert asyncio.run(follow_then_cancel()) == 10
        assert set(threading.enumerate()) == threads
    finally:
        run.cancel()  # the worker the wait launched


# -- real workers ------------------------------------------------------------------------------

#: The labelling job of docs/labelling.md, in Python: 10 lines (the target), run as a program.
LABELLING_JOB = """\
import json, sys
import pandas as pd
import orchestrator

tickets = pd.read_json("tickets.jsonl", lines=True)
schema = json.load(open("label.json"))
template = "Classify this support ticket.\\nSubject: {subject}\\nBody: {body}"
run = orchestrator.run(tickets, model=sys.argv[1], template=template, json_schema=schema, id_column="ticket", temperature=0, max_tokens=24)
labels = run.wait(progress=False).to_pandas(keep_columns=["subject", "priority"])
labels.to_parquet("python.parquet")
"""


@pytest.mark.slow
def test_the_labelling_job_in_ten_lines_of_python_gives_the_rows_of_the_clis_table(workdir, capsys):
    assert len(LABELLING_JOB.strip().splitlines()) <= 10
    tiny = model("tiny-llama")
    (workdir / "tickets.jsonl").write_text("".join(json.dumps(t) + "\n" for t in TICKETS))
    (workdir / "label.json").write_text(json.dumps(SCHEMA))
    cli = [
        *("run", "tickets.jsonl", "--run", "labels", "--model", tiny, "--format", "text", "--id-column", "ticket"),
        *("--template", TEMPLATE, "--json-schema", "label.json", "--out", "cli.parquet"),
        *("--keep-columns", "subject,priority", "--interval", "1"),
    ]
    env = {"ORCH_SAMPLING__TEMPERATURE": "0", "ORCH_SAMPLING__MAX_TOKENS": "24"}
    os.environ.update(env)
    try:
        assert main(cli) == 0, capsys.readouterr()
    finally:
        for name in env:
            del os.environ[name]
    (workdir / "job.py").write_text(LABELLING_JOB)
    done = subprocess.run(
        [str(PYTHON), "job.py", tiny],
        cwd=workdir,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr
    python, cli_table = pd.read_parquet(workdir / "python.parquet"), pd.read_parquet(workdir / "cli.parquet")
    assert python.columns.tolist() == cli_table.columns.tolist()
    assert {"category", "urgent", "parse_error", "prompt_tokens", "completion_tokens", "model"} <= set(python.columns)
    pd.testing.assert_frame_equal(python, cli_table)
    assert python["ticket"].tolist() == ["T1", "T2", "T3", "T4"]


#: A kernel: starts a run over 96 rows and follows it (killed mid-way by the test).
KERNEL = """\
import sys
import orchestrator
rows = [{"id": f"q{i:03d}", "q": f"Question number {i}, answered at length?"} for i in range(96)]
run = orchestrator.run(rows, model=sys.argv[1], template="{q}", id_column="id", run="killed", rows_per_chunk=8, temperature=0, max_tokens=48)
print("started", flush=True)
run.wait(progress=False, interval=0.5)
"""
#: A new kernel: attaches to the run and finishes it.
NEW_KERNEL = """\
import orchestrator
orchestrator.attach("killed").wait(progress=False, interval=0.5).to_pandas().to_parquet("answers.parquet")
"""


@pytest.mark.slow
def test_a_kernel_killed_mid_run_loses_nothing_and_attach_answers_every_row_exactly_once(workdir):
    tiny = model("tiny-llama")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    (workdir / "kernel.py").write_text(KERNEL)
    (workdir / "new_kernel.py").write_text(NEW_KERNEL)
    store, layout = open_store(str(workdir / ".orch")), RunLayout("killed")
    kernel = subprocess.Popen([str(PYTHON), "kernel.py", tiny], cwd=workdir, env=env, stderr=subprocess.PIPE, text=True)
    try:
        # 1. Killed once the worker has finished some chunks and not all of them.
        deadline = time.monotonic() + 900
        while not any(True for _ in store.list(layout.done_prefix)):
            assert kernel.poll() is None, kernel.stderr.read() if kernel.stderr else ""
            assert time.monotonic() < deadline, "no chunk finished in 15 minutes"
            time.sleep(0.1)
        kernel.send_signal(signal.SIGKILL)
        kernel.wait()
        chunks = [e.chunk for e in read_manifest(store, layout)]
        done_at_kill = len(list(store.list(layout.done_prefix)))
        assert done_at_kill < len(chunks), "the run ended before the kill: nothing was tested"
        # 2. A new kernel attaches and finishes the run.
        finished = subprocess.run(
            [str(PYTHON), "new_kernel.py"], cwd=workdir, env=env, capture_output=True, text=True, timeout=1200
        )
        assert finished.returncode == 0, finished.stderr
    finally:
        if kernel.poll() is None:
            kernel.kill()
    answers = pd.read_parquet(workdir / "answers.parquet")
    assert answers["id"].tolist() == [f"q{i:03d}" for i in range(96)]
    assert answers["error_code"].isna().all()
    # 3. The engine answered each row once: every line of every part in the store (the markers'
    #    and any left over), not only the collected output.
    answered = []
    for info in store.list(layout.outputs_root):
        answered += [json.loads(line)["custom_id"] for line in store.get(info.key).data.splitlines() if line]
    assert sorted(answered) == [f"q{i:03d}" for i in range(96)]
    # 4. The worker outlived the kernel: the new one launched no second one.
    jobs = read_jobs(store, layout)[0]
    assert [len(w.attempts) for w in jobs.workers.values()] == [1]
