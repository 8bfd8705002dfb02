"""Prepare's stages composed as a user combines its features: one model, several models or a sweep;
streamed or grouped by prefix; with or without reuse; a probe carved after. Every composition keeps
the same invariants, and repeating its own command changes nothing."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

from orchestrator.cli import main
from orchestrator.core.context import resolve_spec
from orchestrator.core.layout import RunLayout
from orchestrator.core.records import PrepareRecord, read_manifest, read_record
from orchestrator.core.store import Store, open_store
from orchestrator.prepare.probe_carve import carve_probe_chunk, run_rows, sample_rows
from tests.support.datasets import write_jsonl
from tests.support.runs import Answer, answer_chunk

ROOT = Path(__file__).resolve().parents[1]
TINY = ROOT / ".cache" / "models" / "tiny-llama"
THINK = ROOT / ".cache" / "models" / "tiny-think"
ROWS = 24
#: Rows of the first run a later one reuses: every composition's rows 0..REUSED-1.
REUSED = 16

MODELS = {
    "one": [f"--model={TINY}"],
    "several": [f"--model=small={TINY}", f"--model=large={THINK}"],
    "sweep": [f"--model={TINY}"],
}
SWEEP_SPEC = "sweep:\n  arms:\n    plain: {}\n    short:\n      sampling: {max_tokens: 4}\n"


def tickets(path: Path, rows: int) -> Path:
    """Chat requests (openai-batch lines), every other one naming the second model of a run of
    several, a third sharing a system prompt; and one unreadable line."""
    lines: list[dict[str, object]] = []
    for i in range(rows):
        system = [{"role": "system", "content": "You label support tickets. " * 8}] if i % 3 else []
        body = {"model": "large" if i % 2 else "small", "messages": [*system, {"role": "user", "content": f"Q{i}?"}]}
        lines.append({"custom_id": f"t{i}", "method": "POST", "url": "/v1/chat/completions", "body": body})
    write_jsonl(path, lines)
    with path.open("a") as f:
        f.write("{not json\n")
    return path


def prepare_args(store: str, run: str, data: Path, models: str, grouped: bool, reuse: str | None) -> list[str]:
    args = ["prepare", str(data), "--run", run, "--store", store, *MODELS[models], "--format", "openai-batch"]
    args += ["--rows-per-chunk", "5"]
    if grouped:
        args += ["--group-by-prefix"]
    if reuse:
        args += ["--reuse-from", reuse]
    return args


def answer_every_chunk(store: Store, run: str) -> None:
    layout = RunLayout(run)
    for entry in read_manifest(store, layout):
        lines = [json.loads(line) for line in store.get(layout.chunk(entry.chunk)).data.splitlines()]
        answers = [Answer(i, r["custom_id"], f"answer to {r['custom_id']}") for i, r in enumerate(lines)]
        answer_chunk(store, layout, entry.chunk, [answers])


def check_invariants(store: Store, run: str, slots: int) -> PrepareRecord:
    """Every request (a row, or a row x arm) is in one chunk once, reused once, or set aside once;
    a chunk holds one model's rows; positions files name each chunk row's distinct input place."""
    layout = RunLayout(run)
    found = read_record(store, layout.prepare_record, PrepareRecord)
    assert found is not None
    record = found[0]
    ids: Counter[str] = Counter()
    places: Counter[int] = Counter()
    for entry in read_manifest(store, layout):
        lines = [json.loads(line) for line in store.get(layout.chunk(entry.chunk)).data.splitlines()]
        assert len(lines) == entry.rows
        ids.update(line["custom_id"] for line in lines)
        if entry.model:  # several models: a chunk holds the rows of the one its manifest entry names
            assert {line["body"]["model"] for line in lines} == {entry.model}
        if entry.positions:
            positions = [int(p) for p in store.get(layout.root + entry.positions).data.split()]
            assert len(positions) == entry.rows
            places.update(positions)
    reused = [json.loads(line) for line in store.get(layout.reused_ids).data.splitlines()] if record.reused else []
    assert max(ids.values(), default=1) == 1 and max(places.values(), default=1) == 1
    assert not set(reused) & set(ids)
    assert sum(ids.values()) + len(reused) + record.errors == slots
    assert record.reused == len(reused)
    return record


@pytest.fixture
def workdir(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "orch.yaml").write_text("sampling:\n  max_tokens: 8\n  temperature: 0\n")
    return tmp_path


@pytest.mark.parametrize("models", ["one", "several", "sweep"])
@pytest.mark.parametrize("grouped", [False, True], ids=["streamed", "grouped"])
def test_prepare_compositions_keep_every_request_once_and_repeat_cleanly(workdir, capsys, models, grouped):
    if models == "sweep":
        (workdir / "orch.yaml").write_text((workdir / "orch.yaml").read_text() + SWEEP_SPEC)
    arms = 2 if models == "sweep" else 1
    store = str(workdir / "store")
    first = tickets(workdir / "week1.jsonl", REUSED)
    grown = tickets(workdir / "week2.jsonl", ROWS)

    args = prepare_args(store, "week1", first, models, grouped, None)
    assert main(args) == 0
    check_invariants(open_store(store), "week1", (REUSED + 1) * arms)
    answer_every_chunk(open_store(store), "week1")
    assert main(["collect", "--run", "week1", "--store", store, "--out", str(workdir / "w1.jsonl")]) == 0

    week2 = prepare_args(store, "week2", grown, models, grouped, "week1")
    assert main(week2) == 0
    record = check_invariants(open_store(store), "week2", (ROWS + 1) * arms)
    assert record.reused == REUSED * arms  # every request week 1 answered, on every model or arm
    before = {i.key: i.etag for i in open_store(store).list(RunLayout("week2").root)}

    # The same command again: nothing changes, whatever flags the run was made with.
    capsys.readouterr()
    assert main(week2) == 0
    assert "already prepared" in capsys.readouterr().out
    assert {i.key: i.etag for i in open_store(store).list(RunLayout("week2").root)} == before

    # A probe carved out of the reusing run keeps every request once too.
    ctx = resolve_spec(None, {"run": "week2", "store": store}, check=True)
    entries = read_manifest(ctx.store, ctx.layout)
    pool = entries[0].model
    rows = run_rows(ctx, [e for e in entries if e.model == pool])
    carve_probe_chunk(ctx, sample_rows(rows, 0.2, 2, "seed"), pool)
    check_invariants(ctx.store, "week2", (ROWS + 1) * arms)
