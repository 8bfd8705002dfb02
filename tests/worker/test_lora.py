"""LoRA adapters per row: body.model picks an adapter the run declares, the base model, or an error row."""

from __future__ import annotations

import os
import shutil

import pytest

from orchestrator.core.protocol.adapters import ship_adapters
from orchestrator.core.spec_load import load_spec
from orchestrator.core.store import open_store
from tests.support.runs import chat_request, make_run
from tests.support.worker_process import WorkerProcess, answered_lines

pytestmark = pytest.mark.slow


def test_lora_rows_use_the_adapter_they_name_in_the_same_run(tiny_model, tiny_lora_adapter, tmp_path):
    """The adapter ships with the run as launch ships it (its local directory is gone before the
    worker starts), and one worker answers base, adapter and typo rows side by side."""
    adapter = tmp_path / "french"
    shutil.copytree(tiny_lora_adapter, adapter)
    store_uri = str(tmp_path / "store")
    store = open_store(store_uri)
    questions = ["Hello", "What is the capital of France?", "Write a haiku"]
    rows = [
        *(chat_request(f"base-{i}", q, model=tiny_model, max_tokens=8) for i, q in enumerate(questions)),
        *(chat_request(f"lora-{i}", q, model="french", max_tokens=8) for i, q in enumerate(questions)),
        chat_request("typo", "Hello", model="frnech", max_tokens=8),
        {
            "custom_id": "unnamed",
            "url": "/v1/chat/completions",
            "body": {"messages": [{"role": "user", "content": "Hello"}], "max_tokens": 8},
        },
    ]
    flags = {"model.lora": {"french": str(adapter)}, "model.max_lora_rank": 8, "sampling.temperature": 0}
    layout = make_run(store, "lora", [rows], model=tiny_model, spec_flags=flags)
    spec = load_spec(
        None, {"run": "lora", "store": store_uri, "model.name": tiny_model, **flags}, env={}, default_file=False
    )
    assert ship_adapters(store, layout, spec.model.lora) == ["french"]
    shutil.rmtree(adapter)

    code, summary = WorkerProcess(
        store_uri, "lora", "0", tmp_path, env={"XDG_CACHE_HOME": str(tmp_path / "cache")}
    ).finish(timeout=900)
    assert code == 0 and summary["errors"] == 1, summary
    out = {line.custom_id: line for line in answered_lines(store, layout)}
    for i in range(len(questions)):
        assert out[f"lora-{i}"].text() == "Bonjour!"
        assert out[f"base-{i}"].text() != "Bonjour!"
        assert out[f"lora-{i}"].response.body["model"] == "french"
        # The served name (the model directory's), never the worker's path to the weights.
        assert out[f"base-{i}"].response.body["model"] == os.path.basename(tiny_model)
    assert out["unnamed"].text() == out["base-0"].text()  # no model named: the base model
    typo = out["typo"]
    assert typo.error.code == "model_not_found" and "'frnech'" in typo.error.message and "french" in typo.error.message
    assert typo.response.body["error"]["param"] == "model"
