"""`orch serve` as the tests run it: the server in its own process on a free port, two API keys, and the
official openai SDK's calls a test makes against it, every object parsed with the SDK's own types."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import openai
import pytest
from openai.types import Batch, FileObject

from orchestrator.cli import main
from orchestrator.core.store import open_store
from tests.support.models import REPO, TINY, TINY_EMBED, scripted_engine
from tests.support.ports import free_port
from worker.engine.scripted import TEST_ENGINE_ENV

KEY, OTHER_KEY = "sk-orch-test-first-key", "sk-orch-test-second-key"
CHAT = "/v1/chat/completions"
RESPONSES = "/v1/responses"
FINAL = {"completed", "failed", "expired", "cancelled"}
#: Completion windows short enough for a test (OpenAI accepts only 24h; this server's spec adds these):
#: the expiry test picks one from how long this machine takes to start a worker right now.
SHORT_WINDOWS = {f"{s}s": s for s in (45, 60, 90, 120, 180, 240, 360)}
#: Small limits, so that exceeding them is cheap.
MAX_REQUESTS, MAX_FILE_BYTES = 400, 100_000

SERVED = f"{{tiny: {TINY}, tiny-embed: {{name: {TINY_EMBED}, runner: pooling}}}}"
SPEC = f"""\
sampling: {{max_tokens: 8}}
workers: {{count: 1, heartbeat_interval: 1, checkpoint_interval: 1, lease_ttl: 20, max_in_flight: 2}}
serve:
  models: {SERVED}
  rows_per_chunk: 4
  poll_interval: 0.5
  completion_windows: ["24h", {", ".join(f'"{w}"' for w in SHORT_WINDOWS)}]
  max_requests: {MAX_REQUESTS}
  max_file_bytes: {MAX_FILE_BYTES}
"""


# -- the server ---------------------------------------------------------------------------------
@dataclass
class Server:
    """A running `orch serve`: its process, port, store and folder."""

    proc: subprocess.Popen
    port: int
    store_uri: str
    workdir: Path

    def client(self, key: str = KEY) -> openai.OpenAI:
        return openai.OpenAI(base_url=f"http://127.0.0.1:{self.port}/v1", api_key=key, timeout=60)

    def stop(self, sig: int = signal.SIGTERM) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


#: OpenAI code naming OpenAI's model runs unchanged: the shared servers answer it with `tiny`.
ALIAS = "gpt-4o-mini"
ALIAS_FLAG = ("--model-alias", f"{ALIAS}=tiny")


#: Tries of a server's start: a port free when picked can be taken before the server binds it (by
#: another test's server picking at the same moment), and the next try picks another.
START_TRIES = 3


def start_server(workdir: Path, store_uri: str, spec: str = SPEC, env: Mapping[str, str] | None = None) -> Server:
    """`orch serve` in its own process, with two keys and an alias of `tiny`; returns once it accepts connections.

    Its workers run the engine of the test that starts it (tests/conftest.py sets it); a server a
    module shares, started before any test sets one, runs the scripted engine unless `env` says
    otherwise (REAL_ENGINE: vLLM)."""
    if not all((model / ".built").exists() for model in (TINY, TINY_EMBED)):
        pytest.fail("the tiny models are missing: run `make models` (make test does it)")
    workdir.mkdir(parents=True, exist_ok=True)
    (workdir / "orch.yaml").write_text(spec)
    env = {
        **os.environ,
        **({} if TEST_ENGINE_ENV in os.environ else scripted_engine()),
        "PYTHONPATH": str(REPO),
        "ORCH_API_KEYS": f"{KEY},{OTHER_KEY}",
        "ORCH_HOME": ".orch",
        **(env or {}),
    }
    server_log = workdir / "server.log"
    for tries_left in reversed(range(START_TRIES)):
        port = free_port()
        logged = server_log.stat().st_size if server_log.exists() else 0
        log = open(server_log, "ab")  # noqa: SIM115 - the server process writes it until stopped
        proc = subprocess.Popen(
            [sys.executable, "-m", "orchestrator", "serve", "--store", store_uri, "--port", str(port), *ALIAS_FLAG],
            cwd=workdir,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        deadline = time.time() + 600  # a hang guard: a loaded machine takes minutes to start Python's imports
        while time.time() < deadline:
            said = server_log.read_bytes()[logged:].decode(errors="replace")
            if proc.poll() is not None:
                if tries_left and "address already in use" in said.lower():
                    log.close()
                    break  # the port was free when picked, and taken before the server bound it
                pytest.fail(f"orch serve exited with {proc.returncode}:\n{said[-3000:]}")
            # Ready once it says it holds the port (a connection alone could reach whoever took it) and accepts.
            if "orch serve: listening on" in said:
                with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=1):
                    return Server(proc, port, store_uri, workdir)
            time.sleep(0.2)
        else:
            proc.kill()
            pytest.fail("orch serve did not accept connections within 600 s")
    raise AssertionError("unreachable: the last try returns or fails")


@contextlib.contextmanager
def running_server(
    workdir: Path, store_uri: str, spec: str = SPEC, env: Mapping[str, str] | None = None
) -> Iterator[Server]:
    """start_server's server for a `with` block; stopped after it, and the workers its batches left too."""
    server = start_server(workdir, store_uri, spec, env)
    try:
        yield server
    finally:
        server.stop()
        stop_workers(store_uri)


def stop_workers(store_uri: str) -> None:
    """Whatever workers the batches left running (a test that failed halfway), stopped with `orch cancel`."""
    store = open_store(store_uri)
    for run in {info.key.split("/")[1] for info in store.list("runs/")}:
        main(["cancel", "--run", run, "--store", store_uri])


# -- the client's side, every object parsed with the SDK's own types --------------------------------
def upload(client: openai.OpenAI, path: Path) -> FileObject:
    """The file uploaded for a batch, as the SDK's FileObject."""
    with open(path, "rb") as f:
        raw = client.files.with_raw_response.create(file=f, purpose="batch")
    return FileObject.model_validate(json.loads(raw.text))


def create(client: openai.OpenAI, file_id: str, window: str = "24h", **kwargs: Any) -> Batch:
    """A batch of the file (chat completions unless `endpoint` says otherwise)."""
    raw = client.batches.with_raw_response.create(
        input_file_id=file_id, endpoint=kwargs.pop("endpoint", CHAT), completion_window=window, **kwargs
    )
    return Batch.model_validate(json.loads(raw.text))


def retrieve(client: openai.OpenAI, batch_id: str) -> Batch:
    """The batch as the server says it is now."""
    return Batch.model_validate(json.loads(client.batches.with_raw_response.retrieve(batch_id).text))


def wait_for(client: openai.OpenAI, batch_id: str, done: Any, timeout: float = 300) -> tuple[Batch, list[Batch]]:
    """Poll until `done(batch)`; returns the batch then and every batch object seen on the way."""
    seen: list[Batch] = []
    deadline = time.time() + timeout
    while time.time() < deadline:
        batch = retrieve(client, batch_id)
        seen.append(batch)
        if done(batch):
            return batch, seen
        time.sleep(0.5)
    pytest.fail(f"batch {batch_id} still {seen[-1].status} after {timeout:.0f} s: {seen[-1]}")


def final(batch: Batch) -> bool:
    """Whether the batch has ended (completed, failed, expired or cancelled)."""
    return batch.status in FINAL


def lines_of(client: openai.OpenAI, file_id: str | None) -> list[dict[str, Any]]:
    """The lines of an output or error file (none for no file)."""
    if file_id is None:
        return []
    meta = FileObject.model_validate(json.loads(client.files.with_raw_response.retrieve(file_id).text))
    assert meta.purpose == "batch_output"
    return [json.loads(line) for line in client.files.content(file_id).text.split("\n") if line]


def chat_line(custom_id: str, content: str, model: str = "tiny", url: str = CHAT, **params: Any) -> dict[str, Any]:
    """A batch input line: one user message to `model`."""
    body = {"model": model, "messages": [{"role": "user", "content": content}], **params}
    return {"custom_id": custom_id, "method": "POST", "url": url, "body": body}


def write_requests(path: Path, requests: list[dict[str, Any]]) -> Path:
    """The request lines as a JSONL file to upload."""
    path.write_text("".join(json.dumps(r) + "\n" for r in requests))
    return path
