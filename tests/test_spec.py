"""The run spec: layered file < environment < flags, strict fields, frozen into the run."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from orchestrator.cli import main
from orchestrator.core.errors import SpecConflict, SpecError
from orchestrator.core.frozen_spec import freeze_spec, read_stored_spec, spec_hash
from orchestrator.core.layout import RunLayout
from orchestrator.core.spec_load import load_spec
from orchestrator.core.store import open_store


def write(tmp_path, text: str, name: str = "orch.yaml"):
    path = tmp_path / name
    path.write_text(text)
    return path


def test_spec_defaults_without_any_file(tmp_path):
    spec = load_spec(None, {"run": "r1"}, env={}, cwd=tmp_path)
    assert spec.run == "r1"
    assert spec.store == "./.orch"
    assert spec.backend == "local"
    assert spec.resources.gpus == ["L4", "L40S", "A10G", "A100", "A100-80GB"]


def test_spec_precedence_file_then_env_then_flags(tmp_path):
    write(tmp_path, "run: from-file\nsampling:\n  max_tokens: 100\n  temperature: 0.5\nworkers:\n  count: 3\n")
    env = {"ORCH_SAMPLING__MAX_TOKENS": "200", "ORCH_RUN": "from-env", "ORCH_WORKERS__COUNT": "5"}
    spec = load_spec(None, {"run": "from-flag"}, env=env, cwd=tmp_path)
    assert spec.run == "from-flag"
    assert spec.sampling.max_tokens == 200
    assert spec.sampling.temperature == 0.5
    assert spec.workers.count == 5


def test_spec_file_flag_overrides_default_file(tmp_path):
    write(tmp_path, "run: default\n")
    other = write(tmp_path, "run: other\n", "other.yaml")
    assert load_spec(other, {}, env={}, cwd=tmp_path).run == "other"


def test_spec_unknown_key_named_with_file_and_line(tmp_path):
    write(tmp_path, "run: r\nsampling:\n  max_tokens: 10\n  temprature: 0.2\n")
    with pytest.raises(SpecError) as err:
        load_spec(None, {}, env={}, cwd=tmp_path)
    assert "sampling.temprature" in str(err.value)
    assert "unknown field" in str(err.value) and "temperature" in str(err.value)
    assert err.value.where.endswith("orch.yaml:4")


def test_spec_wrong_type_names_the_field(tmp_path):
    write(tmp_path, "run: r\nworkers:\n  count: many\n")
    with pytest.raises(SpecError) as err:
        load_spec(None, {}, env={}, cwd=tmp_path)
    assert "workers.count" in str(err.value) and err.value.where.endswith("orch.yaml:3")


def test_spec_bad_environment_variable_is_named(tmp_path):
    with pytest.raises(SpecError) as err:
        load_spec(None, {}, env={"ORCH_SAMPLING__MAX_TOKENS": "lots"}, cwd=tmp_path)
    assert err.value.where == "ORCH_SAMPLING__MAX_TOKENS"
    with pytest.raises(SpecError, match="names no spec field"):
        load_spec(None, {}, env={"ORCH_SAMPLNG__MAX_TOKENS": "1"}, cwd=tmp_path)


def test_spec_invalid_yaml_reports_line(tmp_path):
    write(tmp_path, "run: r\nsampling: [unclosed\n")
    with pytest.raises(SpecError) as err:
        load_spec(None, {}, env={}, cwd=tmp_path)
    assert "orch.yaml:" in err.value.where


def test_spec_missing_file_flag_is_an_error(tmp_path):
    with pytest.raises(SpecError, match="does not exist"):
        load_spec(tmp_path / "nope.yaml", {}, env={}, cwd=tmp_path)


@pytest.mark.parametrize("name", ["../escape", "nl\n", "tab\tin", "a b", "-dash", "", "x" * 101, "bell\x07"])
def test_spec_run_name_one_pattern_wherever_a_name_comes_from(tmp_path, name):
    """Flags, the environment, a spec file, --reuse-from and a run's layout (serve's pages, a
    store's listing) all hold a name to one pattern, matched whole: `nl\n` made runs/nl\n/ before."""
    with pytest.raises(SpecError, match="not a run name"):
        load_spec(None, {"run": name}, env={}, cwd=tmp_path)
    with pytest.raises(SpecError, match="not a run name"):
        load_spec(None, {}, env={"ORCH_RUN": name}, cwd=tmp_path)
    (tmp_path / "orch.yaml").write_text(json.dumps({"run": name}))
    with pytest.raises(SpecError, match="not a run name") as err:
        load_spec(None, {}, env={}, cwd=tmp_path)
    assert "orch.yaml:1" in str(err.value)
    (tmp_path / "orch.yaml").unlink()
    with pytest.raises(SpecError, match="not a run name"):
        load_spec(None, {"run": "ok", "reuse.from": ["earlier", name]}, env={}, cwd=tmp_path)
    with pytest.raises(SpecError, match="not a run name"):
        RunLayout(name)
    assert RunLayout("a.b_c-9").root == "runs/a.b_c-9/"
    (tmp_path / "rows.jsonl").write_text('{"text": "hi"}\n')
    store = tmp_path / "store"
    args = ["prepare", str(tmp_path / "rows.jsonl"), "--format", "text", "--store", str(store), "--num-chunks", "1"]
    assert main([*args, "--run", name]) == 2
    assert main([*args, "--run", "ok", "--reuse-from", name]) == 2
    assert not store.exists()


def test_freeze_spec_records_then_accepts_same_spec(tmp_path):
    store = open_store(tmp_path / "s")
    spec = load_spec(None, {"run": "r", "model.name": "m1"}, env={}, cwd=tmp_path)
    layout = RunLayout("r")
    freeze_spec(store, layout, spec)
    stored, _ = read_stored_spec(store, layout)
    assert stored["model"]["name"] == "m1"
    again = load_spec(None, {"run": "r"}, env={}, cwd=tmp_path, stored=stored)
    assert freeze_spec(store, layout, again).model.name == "m1"
    assert spec_hash(again) == spec_hash(spec)


def test_freeze_spec_refuses_changed_output_fields_and_names_them(tmp_path):
    store = open_store(tmp_path / "s")
    layout = RunLayout("r")
    freeze_spec(store, layout, load_spec(None, {"run": "r", "model.name": "m1"}, env={}, cwd=tmp_path))
    changed = load_spec(None, {"run": "r", "model.name": "m2", "sampling.max_tokens": 64}, env={}, cwd=tmp_path)
    with pytest.raises(SpecConflict) as err:
        freeze_spec(store, layout, changed)
    text = str(err.value)
    assert 'model.name: "m1" (frozen) != "m2" (now)' in text
    assert "sampling.max_tokens: 256 (frozen) != 64 (now)" in text
    # Nothing was overwritten.
    assert read_stored_spec(store, layout)[0]["model"]["name"] == "m1"


def test_freeze_spec_fills_a_model_left_unset_at_prepare(tmp_path):
    store = open_store(tmp_path / "s")
    layout = RunLayout("r")
    freeze_spec(store, layout, load_spec(None, {"run": "r"}, env={}, cwd=tmp_path))
    merged = freeze_spec(store, layout, load_spec(None, {"run": "r", "model.name": "m"}, env={}, cwd=tmp_path))
    assert merged.model.name == "m"
    assert read_stored_spec(store, layout)[0]["model"]["name"] == "m"


def test_freeze_spec_allows_operational_changes(tmp_path):
    store = open_store(tmp_path / "s")
    layout = RunLayout("r")
    freeze_spec(store, layout, load_spec(None, {"run": "r", "workers.count": 2}, env={}, cwd=tmp_path))
    merged = freeze_spec(store, layout, load_spec(None, {"run": "r", "workers.count": 8}, env={}, cwd=tmp_path))
    assert merged.workers.count == 8


def test_freeze_spec_chunking_is_compared_as_a_whole(tmp_path):
    store = open_store(tmp_path / "s")
    layout = RunLayout("r")
    freeze_spec(store, layout, load_spec(None, {"run": "r", "chunking.num_chunks": 10}, env={}, cwd=tmp_path))
    stored = read_stored_spec(store, layout)[0]
    rechunk = load_spec(
        None,
        {"run": "r", "chunking.rows_per_chunk": 5, "chunking.num_chunks": None},
        env={},
        cwd=tmp_path,
        stored=stored,
    )
    with pytest.raises(SpecConflict, match="chunking"):
        freeze_spec(store, layout, rechunk)


@pytest.mark.parametrize(
    ("model", "field"),
    [
        ("{engine: transformers, runner: pooling}", "model.runner"),
        ("{engine: transformers, lora: {fr: ./fr}}", "model.lora"),
        ("{engine: transformers, tool_parser: hermes}", "model.tool_parser"),
        ("{engine: transformers, reasoning_parser: deepseek_r1}", "model.reasoning_parser"),
    ],
)
def test_spec_refuses_what_the_transformers_engine_cannot_run(tmp_path, model, field):
    (tmp_path / "orch.yaml").write_text(f"model: {model}\n")
    with pytest.raises(SpecError, match=f"{field} needs the vLLM engine"):
        load_spec(None, {}, env={}, cwd=tmp_path)


def test_spec_adapters_runner_and_tool_parser_are_frozen_with_the_run(tmp_path):
    store, layout = open_store(tmp_path / "s"), RunLayout("r")
    first = {"run": "r", "model.lora": {"fr": "./fr"}, "model.tool_parser": "hermes"}
    freeze_spec(store, layout, load_spec(None, first, env={}, default_file=False))
    for flags in ({"model.lora": {"fr": "./other"}}, {"model.runner": "pooling"}, {"model.tool_parser": "mistral"}):
        with pytest.raises(SpecConflict):
            freeze_spec(store, layout, load_spec(None, {**first, **flags}, env={}, default_file=False))


def test_sampling_flags_on_prepare_are_frozen_and_once_answered_a_changed_one_is_refused_naming_both(
    tmp_path, monkeypatch, capsys
):
    from orchestrator.cli import main

    monkeypatch.chdir(tmp_path)
    (tmp_path / "d.jsonl").write_text('{"id": "a", "q": "x"}\n')
    tiny = str(Path(__file__).resolve().parents[1] / ".cache" / "models" / "tiny-llama")
    args = ["prepare", "d.jsonl", "--run", "r", "--store", "s", "--model", tiny, "--format", "text"]
    args += ["--text-column", "q", "--id-column", "id"]
    assert main([*args, "--max-tokens", "7", "--temperature", "0", "--top-p", "0.5", "--seed", "3"]) == 0
    stored = read_stored_spec(open_store("s"), RunLayout("r"))
    assert stored is not None
    sampling = stored[0]["sampling"]
    assert (sampling["max_tokens"], sampling["temperature"], sampling["top_p"], sampling["seed"]) == (7, 0.0, 0.5, 3)
    assert main([*args, "--max-tokens", "7"]) == 0  # the same again, or without the others: nothing changes
    # Once a chunk has outputs, a changed sampling flag would mix two kinds of answers: refused.
    from orchestrator.core.records import read_manifest
    from tests.support.runs import Answer, answer_chunk

    store, layout = open_store("s"), RunLayout("r")
    answer_chunk(store, layout, read_manifest(store, layout)[0].chunk, [[Answer(0, "a", "x")]])
    capsys.readouterr()
    assert main([*args, "--max-tokens", "8"]) == 3
    assert "sampling.max_tokens: 7 (frozen) != 8 (now)" in capsys.readouterr().err
