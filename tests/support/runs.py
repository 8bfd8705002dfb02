"""Building small runs straight into a store (spec, chunks, manifest, plan), for worker and controller tests."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from orchestrator.core.frozen_spec import freeze_spec
from orchestrator.core.layout import RunLayout, chunk_id
from orchestrator.core.lines import BatchError, BatchOutputLine, BatchResponse
from orchestrator.core.records import ManifestEntry, PlanRecord, WorkerAssignment, write_jsonl
from orchestrator.core.spec_load import load_spec
from orchestrator.core.store import Store

ROOT = Path(__file__).resolve().parents[2]


def chat_request(custom_id: str, content: str, **params: Any) -> dict[str, Any]:
    body = {"model": "orch", "messages": [{"role": "user", "content": content}], **params}
    return {"custom_id": custom_id, "method": "POST", "url": "/v1/chat/completions", "body": body}


def completion_request(custom_id: str, prompt: str, **params: Any) -> dict[str, Any]:
    body = {"model": "orch", "prompt": prompt, **params}
    return {"custom_id": custom_id, "method": "POST", "url": "/v1/completions", "body": body}


def make_run(
    store: Store,
    run: str,
    chunks: Sequence[Sequence[dict[str, Any] | bytes]],
    *,
    model: str,
    workers: int = 1,
    spec_flags: dict[str, Any] | None = None,
    lists: Sequence[Sequence[int]] | None = None,
) -> RunLayout:
    """Write a prepared and planned run: one chunk per element of `chunks` (request dicts, or raw
    bytes for deliberately bad lines). `lists` assigns chunk indices to workers (default: round robin)."""
    layout = RunLayout(run)
    flags = {"run": run, "store": store.uri, "model.name": model, **(spec_flags or {})}
    spec = load_spec(None, flags, env={}, default_file=False)
    freeze_spec(store, layout, spec)
    entries = []
    for i, requests in enumerate(chunks):
        cid = chunk_id(i, len(chunks))
        data = b"".join((r if isinstance(r, bytes) else json.dumps(r).encode()) + b"\n" for r in requests)
        store.put(layout.chunk(cid), data)
        max_tokens = sum(
            (r.get("body", {}).get("max_tokens") or spec.sampling.max_tokens) if isinstance(r, dict) else 0
            for r in requests
        )
        entries.append(
            ManifestEntry(
                chunk=cid,
                key=layout.chunk_path(cid),
                rows=len(requests),
                bytes=len(data),
                est_prompt_tokens=len(data) // 4,
                max_output_tokens=max_tokens,
            )
        )
    store.put(layout.manifest, write_jsonl(entries))
    store.put(layout.metadata, "".join(f"{e.key}\n" for e in entries).encode())
    lists = lists or [[i for i in range(len(entries)) if i % workers == w] for w in range(workers)]
    plan = PlanRecord(
        workers=[
            WorkerAssignment(
                worker=w,
                chunks=[entries[i].chunk for i in idx],
                rows=sum(entries[i].rows for i in idx),
                est_tokens=sum(entries[i].est_tokens for i in idx),
            )
            for w, idx in enumerate(lists)
        ],
        chunks=len(entries),
        rows=sum(e.rows for e in entries),
        est_tokens=sum(e.est_tokens for e in entries),
        created_at=time.time(),
    )
    store.put(layout.plan, plan.to_bytes())
    for a in plan.workers:
        store.put(layout.worker_list(str(a.worker)), "".join(f"{layout.chunk_path(c)}\n" for c in a.chunks).encode())
    return layout


class Answer:
    """An output row as a worker would flush it (what ChunkJob and the part codecs need)."""

    def __init__(
        self, index: int, custom_id: str | None, text: str | None = None, *, error: str | None = None, cached: int = 0
    ):
        self.index = index
        self.error = error is not None
        self.tokens_in, self.tokens_out, self.tokens_cached = 3, 2, cached
        body = {
            "object": "chat.completion",
            "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}],
            "usage": {
                "prompt_tokens": 3,
                "completion_tokens": 2,
                "total_tokens": 5,
                "prompt_tokens_details": {"cached_tokens": cached},
            },
        }
        self.line = (
            BatchOutputLine(custom_id=custom_id, response=BatchResponse(status_code=200, request_id="r", body=body))
            if error is None
            else BatchOutputLine(
                custom_id=custom_id,
                response=BatchResponse(status_code=400, request_id="r"),
                error=BatchError(code=error, message=error),
            )
        )


def answer_chunk(
    store: Store,
    layout: RunLayout,
    chunk: str,
    parts: Sequence[Sequence[Answer]],
    *,
    worker: str = "0",
    output_format: str = "jsonl",
    accelerator: str = "NVIDIA L4",
    seconds: float = 10.0,
) -> None:
    """Finish a chunk through the protocol's own objects: lease, checkpointed parts, done marker."""
    from orchestrator.core.protocol.checkpoints import ChunkJob
    from orchestrator.core.protocol.leases import LeaseKeeper, acquire
    from orchestrator.core.protocol.parts import part_codec

    clock = [1_000.0]
    held = acquire(store, layout, chunk, worker=worker, holder=f"{worker}.test", ttl=600, now=clock[0])
    assert held is not None
    keeper = LeaseKeeper(store, layout, held, ttl=600, clock=lambda: clock[0])
    rows = sum(len(p) for p in parts)
    job = ChunkJob(store, layout, keeper, part_codec(output_format, chunk), lambda: clock[0], chunk_rows=rows)
    job.resume()
    for part in parts:
        job.checkpoint(list(part))
    clock[0] += seconds
    assert job.complete(worker=worker, model="m", spec_hash="h", accelerator=accelerator) is not None


def orch_process(workdir: Path, *args: str, env: dict[str, str] | None = None) -> subprocess.Popen[str]:
    """`orch` as the user runs it, a process of its own (stderr read as it comes), Ctrl-C delivered
    as a terminal delivers it: where these tests run in the background of a shell without job
    control, SIGINT is ignored, and a child inherits that (a handler, unlike SIG_IGN, is reset at
    exec), so orch would never see the tests' Ctrl-C. `env`: variables set beside the tests' own."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), **(env or {})}
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        return subprocess.Popen(
            [str(ROOT / ".venv" / "bin" / "orch"), *args],
            cwd=workdir,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
    finally:
        signal.signal(signal.SIGINT, previous)
