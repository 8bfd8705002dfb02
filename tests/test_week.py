"""A labelling user's week, end to end (issue 50's acceptance): week 1 labelled into a Delta table;
week 2 (new tickets and edited ones) reusing week 1, merged into the table on the ticket id; then two
models compared, the baseline arm reusing week 2's answers. Each step through `orch` as the user runs
it; the answers are written through the worker protocol's own objects (the subject is the run's
bookkeeping, not a model: tests/worker and the real-engine tier run the model)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from orchestrator.cli import main
from orchestrator.core.layout import RunLayout
from orchestrator.core.records import PrepareRecord, read_manifest, read_record
from orchestrator.core.store import Store, open_store
from tests.support.datasets import write_jsonl
from tests.support.runs import Answer, answer_chunk

ROOT = Path(__file__).resolve().parents[1]
TINY = ROOT / ".cache" / "models" / "tiny-llama"
THINK = ROOT / ".cache" / "models" / "tiny-think"
SCHEMA = {
    "type": "object",
    "properties": {"urgency": {"type": "string", "enum": ["low", "high"]}, "words": {"type": "integer"}},
    "required": ["urgency", "words"],
    "additionalProperties": False,
}
TEMPLATE = "Label this ticket.\nSubject: {subject}\nBody: {body}"


def tickets(path: Path, count: int, edited: frozenset[int] = frozenset()) -> Path:
    rows = []
    for i in range(count):
        body = f"the printer on floor {i} is down" + (", URGENT: payroll is blocked" if i in edited else "")
        rows.append({"ticket": f"T{i:03d}", "subject": f"ticket {i}", "body": body})
    return write_jsonl(path, rows)


def label(request: dict) -> str:
    """What the 'model' answers: a label read off the prompt (a changed ticket gets another label)."""
    text = request["body"]["messages"][-1]["content"]
    return json.dumps({"urgency": "high" if "URGENT" in text else "low", "words": len(text.split())})


def answer_every_chunk(store: Store, run: str) -> int:
    """Every chunk of the run answered; the rows answered (what the week paid for)."""
    layout, paid = RunLayout(run), 0
    for entry in read_manifest(store, layout):
        if store.head(layout.done(entry.chunk)) is not None:
            continue
        requests = [json.loads(x) for x in store.get(layout.chunk(entry.chunk)).data.splitlines()]
        answer_chunk(
            store, layout, entry.chunk, [[Answer(i, r["custom_id"], label(r)) for i, r in enumerate(requests)]]
        )
        paid += len(requests)
    return paid


def delta_rows(path: Path) -> dict[str, dict]:
    from deltalake import DeltaTable

    rows = DeltaTable(str(path)).to_pyarrow_table().to_pylist()
    return {row["ticket"]: row for row in rows}


def test_week_label_grow_merge_and_compare_pays_only_for_new_and_edited_rows(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "label.json").write_text(json.dumps(SCHEMA))
    (tmp_path / "orch.yaml").write_text("sampling: {max_tokens: 32, temperature: 0}\n")
    store = open_store(str(tmp_path / ".orch"))
    lake = tmp_path / "lake" / "labels"
    flags = ["--model", str(TINY), "--format", "text", "--template", TEMPLATE, "--json-schema", "label.json"]
    flags += ["--id-column", "ticket", "--rows-per-chunk", "10"]

    # Monday, week 1: 30 tickets labelled, into the analysts' Delta table.
    assert main(["prepare", str(tickets(tmp_path / "week1.jsonl", 30)), "--run", "w1", *flags]) == 0
    assert answer_every_chunk(store, "w1") == 30
    assert main(["collect", "--run", "w1", "--out", f"delta:{lake}", "--merge-on", "ticket"]) == 0
    assert len(delta_rows(lake)) == 30

    # Week 2: the same file grown by 5 tickets, 3 of the old ones edited. Only those 8 are paid for.
    week2 = tickets(tmp_path / "week2.jsonl", 35, edited=frozenset({3, 7, 11}))
    capsys.readouterr()
    assert main(["prepare", str(week2), "--run", "w2", *flags, "--reuse-from", "w1", "--check"]) == 0
    assert "reuse: 27 request(s) answered by earlier runs, 8 to run and pay for" in capsys.readouterr().out
    assert main(["prepare", str(week2), "--run", "w2", *flags, "--reuse-from", "w1"]) == 0
    assert answer_every_chunk(store, "w2") == 8
    assert main(["prepare", str(week2), "--run", "w2", *flags, "--reuse-from", "w1"]) == 0  # repeats cleanly
    assert main(["collect", "--run", "w2", "--out", f"delta:{lake}", "--merge-on", "ticket"]) == 0
    table = delta_rows(lake)
    assert len(table) == 35  # one row per ticket
    assert {t for t, row in table.items() if row["urgency"] == "high"} == {"T003", "T007", "T011"}
    assert all(table[f"T{i:03d}"]["reused"] for i in range(30) if i not in (3, 7, 11))
    # Collecting week 2 again commits nothing.
    from deltalake import DeltaTable

    version = DeltaTable(str(lake)).version()
    assert main(["collect", "--run", "w2", "--out", f"delta:{lake}", "--merge-on", "ticket"]) == 0
    assert DeltaTable(str(lake)).version() == version

    # Two models compared on week 2's tickets: the baseline arm is week 2's model, so it reuses all
    # 35 answers; only the other arm's rows are paid for.
    (tmp_path / "compare.yaml").write_text(
        "sampling: {max_tokens: 32, temperature: 0}\n"
        f"models: {{base: {TINY}, other: {THINK}}}\n"
        "sweep: {arms: {base: {model: base}, other: {model: other}}}\n"
    )
    compare = [f for f in flags if f not in ("--model", str(TINY))]
    args = ["prepare", str(week2), "--run", "cmp", "-f", "compare.yaml", *compare, "--reuse-from", "w2"]
    assert main(args) == 0
    found = read_record(store, RunLayout("cmp").prepare_record, PrepareRecord)
    assert found is not None and found[0].reused == 35
    assert answer_every_chunk(store, "cmp") == 35
    capsys.readouterr()
    assert main(["collect", "--run", "cmp", "--out", str(tmp_path / "cmp.parquet"), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["reused"] == 35 and report["comparison"]["first"] == "base"
    assert set(report["comparison"]["arms"]) == {"base", "other"}


@pytest.fixture(autouse=True)
def _built_models():
    if not (TINY / ".built").exists() or not (THINK / ".built").exists():
        pytest.fail("the test models are missing: run `make models`")
