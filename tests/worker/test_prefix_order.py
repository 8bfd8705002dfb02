"""The worker hands a chunk's rows to the engine grouped by prompt prefix; outputs stay exactly once."""

from __future__ import annotations

import itertools
import random

from orchestrator.collect.collect import collect
from orchestrator.core.layout import chunk_id
from orchestrator.core.records import DoneMarker
from orchestrator.core.store import open_store
from tests.support.runs import make_run

SYSTEMS = [f"System {s}: answer as assistant number {s}. " * 30 for s in range(4)]


def test_rows_of_one_prefix_are_fed_together_and_answered_once(tiny_engine, tiny_model, tmp_path, monkeypatch):
    from orchestrator.core.spec import ModelSpec
    from orchestrator.core.spec_load import load_spec
    from worker import runner
    from worker.engine.vllm_engine import VllmEngine
    from worker.wire import EngineRequest, RowResult

    fed: list[str] = []

    class Watched(VllmEngine):
        """The session's vLLM engine, noting each request as it is added to vLLM."""

        def _add(self, request: EngineRequest) -> RowResult | None:
            fed.append(request.custom_id)
            return super()._add(request)

    rng = random.Random(7)
    rows = []
    for i in range(48):
        system = SYSTEMS[i % 4]
        messages = [{"role": "system", "content": system}, {"role": "user", "content": f"question {i} " * (1 + i % 5)}]
        body = {"model": "orch", "messages": messages, "max_tokens": 1 + i % 12, "ignore_eos": True}
        rows.append({"custom_id": f"r{i}", "method": "POST", "url": "/v1/chat/completions", "body": body})
    rng.shuffle(rows)
    store = open_store(str(tmp_path / "store"))
    layout = make_run(store, "order", [rows[:24], rows[24:]], model=tiny_model)
    flags = {"run": "order", "store": store.uri, "model.name": tiny_model, "workers.checkpoint_interval": 3600}
    spec = load_spec(None, flags, env={}, default_file=False)
    engine = Watched(ModelSpec(name=tiny_model), llm=tiny_engine.llm)
    monkeypatch.setattr(runner, "MAX_BUFFERED_ROWS", 5)  # several checkpoints per chunk
    summary = runner.Worker(store, spec, runner.WorkerIdentity.new("0", 0), lambda: engine).run()
    assert summary["requests"] == 48
    system_of = {r["custom_id"]: r["body"]["messages"][0]["content"] for r in rows}
    by_id = {r["custom_id"]: r for r in rows}
    for chunk_rows in (rows[:24], rows[24:]):
        ids = {r["custom_id"] for r in chunk_rows}
        order = [c for c in fed if c in ids]
        systems = [system_of[c] for c in order]
        # Each prefix's rows handed over one after another: as many runs as distinct prefixes.
        runs = 1 + sum(a != b for a, b in itertools.pairwise(systems))
        assert runs == len(set(systems)) == 4, systems
        # Within a prefix (the same first 1,024 bytes), the longest prompt first.
        for system in set(systems):
            lengths = [len(by_id[c]["body"]["messages"][1]["content"]) for c in order if system_of[c] == system]
            assert lengths == sorted(lengths, reverse=True)
    # Checkpoints went on as usual (several parts per chunk), and every row is answered exactly once.
    for index in range(2):
        marker = DoneMarker.model_validate_json(store.get(layout.done(chunk_id(index, 2))).data)
        assert len(marker.parts) >= 2 and sum(p.rows for p in marker.parts) == 24
    report = collect(store, layout, tmp_path / "out.jsonl")
    assert report.complete and report.rows_written == 48 and report.duplicates == 0
    written = [
        line.split('"custom_id":"')[1].split('"')[0] for line in (tmp_path / "out.jsonl").read_text().splitlines()
    ]
    assert written == [r["custom_id"] for r in rows]
