"""A sweep's collect compares its arms: parse errors, tokens and $ per row, agreement with the first arm."""

from __future__ import annotations

import json

from orchestrator.cli import main
from orchestrator.core.layout import RunLayout
from orchestrator.core.records import read_manifest
from orchestrator.core.store import open_store
from tests.support.datasets import write_jsonl
from tests.support.runs import Answer, answer_chunk

SCHEMA = {
    "type": "object",
    "properties": {"label": {"enum": ["x", "y"]}, "n": {"type": "integer"}},
    "required": ["label", "n"],
    "additionalProperties": False,
}
#: Each arm's answer per row: None for an error line.
ANSWERS = {
    "a": {"q0": '{"label": "x", "n": 1}', "q1": '{"label": "y", "n": 2}', "q2": '{"label": "x", "n": 3}', "q3": None},
    "b": {
        "q0": '{"label": "x", "n": 1}',
        "q1": '{"label": "x", "n": 2}',  # the label differs
        "q2": '{"label": "x", "n": ',  # not JSON: a parse error
        "q3": '{"label": "y", "n": 4}',  # the first arm failed here
    },
}


def test_collect_sweep_compares_each_arm_with_the_first(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "orch.yaml").write_text(
        "input: {format: text, id_column: id, template: 'Q: {question}'}\n"
        "sweep: {arms: {a: {}, b: {system_prompt: 'Be terse.'}}}\n"
    )
    (tmp_path / "label.json").write_text(json.dumps(SCHEMA))
    write_jsonl(tmp_path / "q.jsonl", [{"id": f"q{i}", "question": f"{i}+{i}?"} for i in range(4)])
    store_uri = str(tmp_path / "store")
    args = ["--run", "sw", "--store", store_uri]
    assert main(["prepare", "q.jsonl", *args, "--model", "m", "--json-schema", "label.json"]) == 0
    store, layout = open_store(store_uri), RunLayout("sw")
    for entry in read_manifest(store, layout):
        ids = [json.loads(x)["custom_id"] for x in store.get(layout.chunk(entry.chunk)).data.splitlines()]
        answers = []
        for i, cid in enumerate(ids):
            row, _, arm = cid.rpartition("#")
            text = ANSWERS[arm][row]
            answers.append(Answer(i, cid, text) if text is not None else Answer(i, cid, error="server_error"))
        answer_chunk(store, layout, entry.chunk, [answers])
    capsys.readouterr()
    out = ["--out", str(tmp_path / "sw.parquet"), "--max-error-rate", "1"]
    assert main(["collect", *args, *out, "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    comparison = report["comparison"]
    assert comparison["first"] == "a" and comparison["fields"] == ["label", "n"]
    a, b = comparison["arms"]["a"], comparison["arms"]["b"]
    assert (a["rows"], a["errors"], a["parse_errors"], a["parse_error_rate"]) == (4, 1, 0, 0.0)
    assert (b["rows"], b["errors"], b["parse_errors"], b["parse_error_rate"]) == (4, 0, 1, 0.25)
    assert a["agreement"] is None and a["rows_differ"] is None  # the first arm is the baseline
    # q0 and q1 both parsed: the labels agree on one, n on both; q1, q2 and q3 differ.
    assert b["compared"] == 2 and b["agreement"] == {"label": 0.5, "n": 1.0}
    assert b["rows_differ"] == 3 and b["differ_examples"] == ["q1", "q2", "q3"]
    assert a["tokens_per_row"] == 5.0 and b["tokens_per_row"] == 5.0  # 3 prompt + 2 generated, error lines aside
    for name, arm in report["arms"].items():  # runview's per-arm cost, per row the arm ran
        assert comparison["arms"][name]["usd_per_row"] == arm["usd"] / arm["rows"]["done"]
    # The same in the terminal, a row per arm.
    assert main(["collect", *args, *out]) == 0
    rows = [line.split() for line in capsys.readouterr().out.splitlines()]
    assert ["b", "-", "4", "0", "1", "(25.0%)", "5.0"] in [r[:7] for r in rows], rows
    assert any(r[:1] == ["b"] and "label" in r and "50%," in r and "(q1," in r for r in rows), rows
