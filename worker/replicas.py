"""Data parallel on one machine: a worker process per engine replica, outputs relayed, exits combined."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Sequence
from typing import IO, Any

from orchestrator.core.exits import WorkerExit, WorkerStatus


def run_replicas(count: int, gpus: Sequence[str], argv: Sequence[str]) -> int:
    """Start `count` replicas of this worker (`python -m worker ARGV --replica i`), each on its own
    share of `gpus`, pass SIGTERM/SIGINT on to all, and return their combined exit code after
    printing one summary line for the machine."""
    per = len(gpus) // count if gpus else 0
    procs = []
    for i in range(count):
        env = dict(os.environ)
        if per:
            env["CUDA_VISIBLE_DEVICES"] = ",".join(gpus[i * per : (i + 1) * per])
        cmd = [sys.executable, "-m", "worker", *argv, "--replica", str(i)]
        procs.append(subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, text=True))

    def forward(signum: int, _frame: Any) -> None:
        for p in procs:
            if p.poll() is None:
                p.send_signal(signum)

    signal.signal(signal.SIGTERM, forward)
    signal.signal(signal.SIGINT, forward)
    summaries = relay_outputs(procs)
    codes = [p.wait() for p in procs]
    print(json.dumps(combined_summary(summaries, codes)), flush=True)
    return combined_exit_code(codes)


def relay_outputs(procs: Sequence[subprocess.Popen[str]], out: IO[str] | None = None) -> list[dict[str, Any]]:
    """Every replica's stdout passed on to ours as it comes, all at once: a replica whose pipe
    nobody reads blocks once the pipe is full (64 KiB of engine logs), so reading one after
    another could stall a replica for as long as the one before it runs. Each replica's last
    line is its JSON summary: held back and returned, in the replicas' order (absent where a
    replica printed none)."""
    target = out if out is not None else sys.stdout
    lock = threading.Lock()
    last: list[str | None] = [None] * len(procs)

    def relay(i: int, stream: IO[str]) -> None:
        for line in stream:
            if not line.strip():
                continue
            held, last[i] = last[i], line.rstrip("\n")
            if held is not None:
                with lock:
                    print(held, file=target, flush=True)

    threads = [
        threading.Thread(target=relay, args=(i, p.stdout), name=f"replica-{i}-stdout", daemon=True)
        for i, p in enumerate(procs)
        if p.stdout is not None
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    summaries = []
    for line in last:
        if line is None:
            continue
        try:
            summaries.append(json.loads(line))
        except ValueError:
            print(line, file=target, flush=True)  # no summary: a crash's last words, kept for the log
    return summaries


def combined_summary(summaries: Sequence[dict[str, Any]], codes: Sequence[int]) -> dict[str, Any]:
    """The machine's summary line: the replicas' counts added up."""
    total: dict[str, Any] = {
        k: sum(s.get(k, 0) for s in summaries)
        for k in ("requests", "errors", "tokens_in", "tokens_out", "tokens_cached", "chunks_done", "chunks_lost")
    }
    wall = max((s.get("wall_s", 0.0) for s in summaries), default=0.0)
    code = combined_exit_code(codes)
    total.update(
        status=WorkerStatus.of_exit(code),
        replicas=len(codes),
        tokens_per_s=round(total["tokens_out"] / wall, 2) if wall else 0.0,
        wall_s=wall,
    )
    return total


def combined_exit_code(codes: Sequence[int]) -> int:
    """One exit code for the machine, the most serious first: a real failure (which must not be
    relaunched for free), then a stop, then a store outage (relaunched without spending a
    retry), then success."""
    milder = (WorkerExit.STOPPED, WorkerExit.STORE_UNREACHABLE)
    failures = [c for c in codes if c != WorkerExit.DONE and c not in milder]
    if failures:
        return failures[0]
    for code in milder:
        if code in codes:
            return code
    return WorkerExit.DONE
