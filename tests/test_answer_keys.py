"""Answer keys by content: what a line's key leaves out (a model's name or path) and keeps (an adapter's
name, which picks its weights), and the file digests behind a model's identity."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

from orchestrator.core import file_digests
from orchestrator.core.spec_load import load_spec
from orchestrator.prepare.answers.answer_keys import AnswerKeys, LineKeys, content_identity
from orchestrator.prepare.formats import encode_line

ROOT = Path(__file__).resolve().parents[1]
TINY = ROOT / ".cache" / "models" / "tiny-llama"


def line(model: object, content: str = "hi", **body: object) -> bytes:
    return encode_line(
        {
            "custom_id": "x",
            "method": "POST",
            "url": "/v1/chat/completions",
            "body": {"model": model, "messages": [{"role": "user", "content": content}], **body},
        }
    )


def test_answer_keys_a_line_key_leaves_out_the_model_name_and_keeps_an_adapter_name():
    keys = LineKeys(b"d" * 32, adapters=["sql-lora"])
    assert keys.of_line(line("/models/a")) == keys.of_line(line("served-name")) == keys.of_line(line('a"q\\'))
    assert keys.of_line(line("sql-lora")) != keys.of_line(line("/models/a"))
    assert keys.of_line(line("m", "hi")) != keys.of_line(line("m", "ho"))
    assert keys.of_line(line("m", temperature=0)) != keys.of_line(line("m"))
    # A body.model that is not a string stays in the key (too tight at worst, never wrong).
    assert keys.of_line(line(None)) != keys.of_line(line("m"))


def test_answer_keys_the_same_model_under_two_paths_or_names_has_one_context(tmp_path):
    copy = tmp_path / "elsewhere"
    shutil.copytree(TINY, copy)
    plain = AnswerKeys(load_spec(None, {"model.name": str(TINY)}, env={}, default_file=False))
    moved = AnswerKeys(load_spec(None, {"model.name": str(copy)}, env={}, default_file=False))
    named = load_spec(None, {"model.name": str(copy), "model.engine_args": {"served_model_name": "x"}}, env={})
    assert plain.digest == moved.digest == AnswerKeys(named).digest
    (copy / "tokenizer.json").write_text((copy / "tokenizer.json").read_text() + " ")
    assert AnswerKeys(load_spec(None, {"model.name": str(copy)}, env={}, default_file=False)).digest != plain.digest


def test_file_digests_are_remembered_until_the_file_is_written_again(tmp_path, monkeypatch):
    monkeypatch.setenv("ORCH_DIGEST_CACHE", str(tmp_path / "cache.json"))
    weights = tmp_path / "model.safetensors"
    weights.write_bytes(bytes(1 << 20))
    first = file_digests.file_sha256(weights)
    cached = json.loads((tmp_path / "cache.json").read_text())
    assert [entry["sha256"] for entry in cached.values()] == [first]

    reads = []
    real_open = Path.open

    def counted_open(self, *args, **kwargs):
        if self.name == weights.name:
            reads.append(self)
        return real_open(self, *args, **kwargs)

    monkeypatch.setattr(Path, "open", counted_open)
    assert file_digests.file_sha256(weights) == first and reads == []  # from the cache

    stat = weights.stat()
    with real_open(weights, "r+b") as f:
        f.seek(1000)
        f.write(b"\x01")
    os.utime(weights, ns=(stat.st_atime_ns, stat.st_mtime_ns))  # size and mtime as they were
    assert file_digests.file_sha256(weights) != first and reads == [weights.resolve()]


def test_file_digests_a_damaged_or_unwritable_cache_still_gives_the_digest(tmp_path, monkeypatch):
    cache = tmp_path / "cache.json"
    cache.write_text("{not json")
    monkeypatch.setenv("ORCH_DIGEST_CACHE", str(cache))
    data = tmp_path / "w.bin"
    data.write_bytes(b"abc")
    expected = "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
    assert file_digests.file_sha256(data) == expected
    monkeypatch.setenv("ORCH_DIGEST_CACHE", str(tmp_path / "file-not-dir" / "cache.json"))
    (tmp_path / "file-not-dir").write_text("")
    assert file_digests.file_sha256(data) == expected
    assert content_identity(str(data)) == {"file": expected}
