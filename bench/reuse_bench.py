"""Answer reuse (issue 34): a grown input, the key lookup at 10 million rows, and prepare's cost of keys.

Side by side, in one run:
(a) grown input: `orch run` over N questions with the tiny model on the local backend, then over
    the same N plus 10% new with `--reuse-from` the first: engine tokens (prompt + generated, from
    collect) and wall time of each, and whether every old answer is byte-identical;
(b) key lookup: an answer index of K random keys in a local store, and K new keys of which 90% are
    in it, looked up by a separate process through prepare's own path (spilled by key range, merged
    a range at a time, sources.bin written): wall time and peak RSS (wait4);
(b2) prepare --reuse-from end to end on a small and a 10x larger JSONL input (an index of the
    first 90% of the rows, built from the source run's chunks): peak RSS with and without reuse;
(c) prepare rows/s (no reuse) of the same JSONL input by this tree and by the base branch's
    orchestrator/ (`git archive $(git merge-base HEAD main)`), alternated, median of 3.
Targets: (a) <= 0.11x engine work; (b) <= 60 s, <= 1.5 GiB at 10M; (c) >= 0.95x.
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.common import ROOT, save, sized, table

PYTHON = sys.executable
ORCH = [PYTHON, "-m", "orchestrator"]
ENV = {"PYTHONPATH": str(ROOT)}
TINY = ROOT / ".cache" / "models" / "tiny-llama"

LOOKUP = r"""
import sys, time, numpy as np
from orchestrator.core.context import RunContext
from orchestrator.core.layout import RunLayout
from orchestrator.core.spec import RunSpec
from orchestrator.core.store import open_store
from orchestrator.prepare.answers.answer_keys import AnswerKeys
from orchestrator.prepare.answers.reuse import KeyCollector, plan_reuse, spilled_key_dtype
store, n, old = open_store(sys.argv[1]), int(sys.argv[2]), np.load(sys.argv[3], mmap_mode="r")
spec = RunSpec.model_validate({"run": "new", "model": {"name": "bench/model"}, "reuse": {"from": ["src"]}})
ctx = RunContext(spec, store, RunLayout("new"))
rng = np.random.default_rng(1)
started = time.monotonic()
collected = KeyCollector(AnswerKeys(spec), n)
for start in range(0, n, 1 << 16):  # the keys of prepare's first pass, in its blocks
    block = np.zeros(min(1 << 16, n - start), dtype=spilled_key_dtype())
    block["position"] = np.arange(start, start + len(block))
    known = old[start : start + len(block)]
    block["hi"][: len(known)], block["lo"][: len(known)] = known["hi"], known["lo"]
    block["hi"][len(known) :], block["lo"][len(known) :] = rng.integers(0, 2**63, (2, len(block) - len(known)))
    collected.add_records(block)
plan = plan_reuse(ctx, collected, n)
plan.upload(ctx)
print(time.monotonic() - started, plan.count)
plan.discard(); collected.discard()
"""

BUILD = r"""
import sys, numpy as np
from orchestrator.core.store import open_store
from orchestrator.core.layout import RunLayout
from orchestrator.prepare.answers.answer_index import record_dtype, write_index
store, n = open_store(sys.argv[1]), int(sys.argv[2])
rng = np.random.default_rng(0)
records = np.zeros(n, dtype=record_dtype())
records["hi"], records["lo"] = rng.integers(0, 2**63, n), rng.integers(0, 2**63, n)
records["row"] = np.arange(n) % 1000
records["chunk"] = np.arange(n) // 1000
write_index(store, RunLayout("src"), records, ["src"], "bench", n // 1000)
pick = rng.permutation(n)[: int(n * 0.9)]
np.save(sys.argv[3], records[["hi", "lo"]][pick].astype([("hi", "<u8"), ("lo", "<u8")]))
"""

PREPARE = r"""
import sys, time
from orchestrator.core.context import RunContext
from orchestrator.core.layout import RunLayout
from orchestrator.core.spec import RunSpec
from orchestrator.core.store import open_store
from orchestrator.prepare import prepare_run
spec = RunSpec.model_validate({"run": sys.argv[2], "input": {"format": "text", "text_column": "question",
    "id_column": "id"}, "chunking": {"rows_per_chunk": 10000}, "sampling": {"temperature": 0}})
ctx = RunContext(spec, open_store(sys.argv[1]), RunLayout(sys.argv[2]))
started = time.monotonic()
report = prepare_run(ctx, [sys.argv[3]])
print(report.record.rows / (time.monotonic() - started))
"""


PREPARE_REUSE = r"""
import sys
from orchestrator.core.context import RunContext
from orchestrator.core.layout import RunLayout
from orchestrator.core.spec import RunSpec
from orchestrator.core.store import open_store
from orchestrator.prepare import prepare_run
store, run, data, reuse = open_store(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4:]
spec = RunSpec.model_validate({"run": run, "model": {"name": "bench/model"}, "reuse": {"from": reuse},
    "input": {"format": "text", "text_column": "question", "id_column": "id"},
    "chunking": {"rows_per_chunk": 10000}, "sampling": {"temperature": 0}})
report = prepare_run(RunContext(spec, store, RunLayout(run)), [data])
print(report.record.rows, report.record.reused, report.seconds)
"""

INDEX_OF_RUN = r"""
import json, sys, numpy as np
from orchestrator.core.layout import RunLayout
from orchestrator.core.records import read_manifest
from orchestrator.core.store import open_store
from orchestrator.prepare.answers.answer_index import keys_of, record_dtype, write_index
from orchestrator.prepare.answers.answer_keys import LineKeys
store, layout = open_store(sys.argv[1]), RunLayout(sys.argv[2])
keys = LineKeys(bytes.fromhex(json.loads(store.get(layout.prepare_record).data)["key_digest"]))
parts = []
for number, entry in enumerate(read_manifest(store, layout)):
    lines = store.get(layout.chunk(entry.chunk)).data.splitlines(keepends=True)  # as prepare keys them
    found = keys_of(b"".join(keys.of_line(line) for line in lines))
    records = np.zeros(len(found), dtype=record_dtype())
    records["hi"], records["lo"], records["chunk"] = found["hi"], found["lo"], number
    records["row"] = np.arange(len(found))
    parts.append(records)
write_index(store, layout, np.concatenate(parts), [layout.run], "bench", len(parts))
"""


def measure(
    cmd: list[str], env: dict[str, str] | None = None, cwd: Path = ROOT, cpu: list[float] | None = None
) -> tuple[float, float, str]:
    """Wall seconds, peak RSS (MiB) and stdout of one child process (its own wait4 usage); its CPU
    seconds appended to `cpu` (what a loaded, shared machine's figures can still compare)."""
    started = time.monotonic()
    proc = subprocess.Popen(cmd, cwd=cwd, stdout=subprocess.PIPE, env={**os.environ, **(env or {})})
    out = proc.stdout.read().decode() if proc.stdout else ""
    _, status, usage = os.wait4(proc.pid, 0)
    if cpu is not None:
        cpu.append(usage.ru_utime + usage.ru_stime)
    if os.waitstatus_to_exitcode(status):
        raise subprocess.CalledProcessError(os.waitstatus_to_exitcode(status), cmd)
    return time.monotonic() - started, usage.ru_maxrss / 1024, out


def questions(path: Path, n: int) -> Path:
    with path.open("w") as f:
        for i in range(n):
            f.write(json.dumps({"id": f"q{i}", "question": f"Question number {i}: what comes after {i}?"}) + "\n")
    return path


def engine_seconds(store: Path, run: str) -> dict[str, float]:
    """The run's workers' engine time (busy_s) and engine start-up (load_s), from the JSON summary
    line each worker prints last into its log (the local backend keeps them in <store>/logs/<run>/)."""
    busy = load = 0.0
    for log in sorted((store / "logs" / run).glob("*.log")):
        summaries = [line for line in log.read_text(errors="replace").splitlines() if line.startswith('{"status"')]
        if summaries:
            last = json.loads(summaries[-1])
            busy, load = busy + last["busy_s"], load + last["load_s"]
    return {"busy_s": busy, "load_s": load}


def grown_input(work: Path, n: int) -> dict[str, Any]:
    """(a)"""
    store = str(work / "store")
    (work / "orch.yaml").write_text("sampling:\n  max_tokens: 16\n  temperature: 0\nworkers:\n  count: 1\n")
    flags = ["--model", str(TINY), "--store", store, "--format", "text", "--text-column", "question"]
    flags += ["--id-column", "id", "--rows-per-chunk", str(max(n // 4, 1)), "--interval", "1"]
    runs = {}
    for name, rows, extra in (("first", n, []), ("grown", n + n // 10, ["--reuse-from", "first"])):
        data = questions(work / f"{name}.jsonl", rows)
        run_out, out = str(work / f"{name}.run.jsonl"), str(work / f"{name}.out.jsonl")
        seconds, _, _ = measure([*ORCH, "run", str(data), "--run", name, *flags, *extra, "--out", run_out], ENV, work)
        _, _, printed = measure([*ORCH, "collect", "--run", name, "--store", store, "--out", out, "--json"], ENV, work)
        report = json.loads(printed)
        tokens = report["tokens"]["prompt_tokens"] + report["tokens"]["generated_tokens"]
        runs[name] = {"seconds": seconds, "tokens": tokens, "report": report, **engine_seconds(Path(store), name)}
    old = (work / "first.out.jsonl").read_bytes().splitlines()
    new = (work / "grown.out.jsonl").read_bytes().splitlines()
    return {
        "rows": [n, n + n // 10],
        "engine_tokens": [runs["first"]["tokens"], runs["grown"]["tokens"]],
        "tokens_ratio": runs["grown"]["tokens"] / runs["first"]["tokens"],
        "seconds": [runs["first"]["seconds"], runs["grown"]["seconds"]],
        "wall_ratio": runs["grown"]["seconds"] / runs["first"]["seconds"],
        "engine_busy_s": [runs["first"]["busy_s"], runs["grown"]["busy_s"]],
        "busy_ratio": runs["grown"]["busy_s"] / runs["first"]["busy_s"],
        "engine_load_s": [runs["first"]["load_s"], runs["grown"]["load_s"]],
        "reused": runs["grown"]["report"]["reused"],
        "old_answers_identical": new[:n] == old,
        "missing": runs["grown"]["report"]["missing"],
        "duplicates": runs["grown"]["report"]["duplicates"],
    }


def key_lookup(work: Path, n: int) -> dict[str, Any]:
    """(b)"""
    store, old = str(work / "index-store"), str(work / "old.npy")
    env = ENV
    cpu_seconds: list[float] = []
    build_s, build_mib, _ = measure([PYTHON, "-c", BUILD, store, str(n), old], env)
    wall, peak, out = measure([PYTHON, "-c", LOOKUP, store, str(n), old], env, cpu=cpu_seconds)
    lookup_s, found = out.split()
    return {
        "keys": n,
        "index_build_s": build_s,
        "index_build_mib": build_mib,
        "process_s": wall,
        "lookup_s": float(lookup_s),
        "peak_mib": peak,
        "process_cpu_s": cpu_seconds[0],
        "found": int(found),
        "expected": int(n * 0.9),
    }


def prepare_memory(work: Path, sizes: list[int]) -> list[dict[str, Any]]:
    """(b2): peak RSS of prepare over N + 10% rows, with --reuse-from a run over the first N, and without."""
    out = []
    for n in sizes:
        store = str(work / f"mem-{n}")
        measure([PYTHON, "-c", PREPARE_REUSE, store, "src", str(questions(work / f"src-{n}.jsonl", n))], ENV)
        measure([PYTHON, "-c", INDEX_OF_RUN, store, "src"], ENV)
        grown = str(questions(work / f"grown-{n}.jsonl", n + n // 10))
        plain_s, plain_mib, _ = measure([PYTHON, "-c", PREPARE_REUSE, store, "plain", grown], ENV)
        reuse_s, reuse_mib, printed = measure([PYTHON, "-c", PREPARE_REUSE, store, "grown", grown, "src"], ENV)
        rows, reused, _ = printed.split()
        out.append(
            {
                "rows": n + n // 10,
                "reused": int(reused),
                "ran": int(rows),
                "peak_mib_reuse": reuse_mib,
                "peak_mib_plain": plain_mib,
                "seconds_reuse": reuse_s,
                "seconds_plain": plain_s,
            }
        )
        shutil.rmtree(store, ignore_errors=True)
    return out


def merge_base() -> str:
    """This tree's merge-base with main (a local branch, else the clone's origin/main), else HEAD itself:
    a clone of another branch, or a detached one as CI checks out, may have no branch named main."""
    for main in ("main", "origin/main"):
        found = subprocess.run(["git", "merge-base", "HEAD", main], cwd=ROOT, capture_output=True, text=True)
        if found.returncode == 0:
            return found.stdout.strip()[:12]
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, check=True, capture_output=True, text=True)
    return head.stdout.strip()[:12]


def prepare_speed(work: Path, n: int) -> dict[str, Any]:
    """(c): this tree's prepare against its base's (ORCH_BENCH_BASE, default the merge-base with main)."""
    data = questions(work / "prepare.jsonl", n)
    base = work / "base"
    base.mkdir()
    ref = os.environ.get("ORCH_BENCH_BASE") or merge_base()
    archive = subprocess.run(["git", "archive", ref, "orchestrator"], cwd=ROOT, check=True, capture_output=True)
    subprocess.run(["tar", "-x", "-C", str(base)], input=archive.stdout, check=True)
    trees = {"this tree": {"PYTHONPATH": str(ROOT)}, ref: {"PYTHONPATH": str(base)}}
    rates: dict[str, list[float]] = {name: [] for name in trees}
    for round_ in range(3):
        for name in list(trees) if round_ % 2 == 0 else list(trees)[::-1]:
            store = str(work / f"p-{round_}-{len(rates[name])}-{name.replace(' ', '-')}")
            cmd = [PYTHON, "-c", PREPARE, store, f"p{round_}", str(data)]
            _, _, out = measure(cmd, trees[name], base if name == ref else ROOT)
            rates[name].append(float(out.split()[-1]))
            shutil.rmtree(store, ignore_errors=True)
    now, before = statistics.median(rates["this tree"]), statistics.median(rates[ref])
    return {
        "rows": n,
        "base": ref,
        "rows_per_s": now,
        "rows_per_s_base": before,
        "ratio": now / before,
        "rounds": rates,
    }


def main() -> None:
    with tempfile.TemporaryDirectory(prefix="orch-reuse-bench-") as tmp:
        work = Path(tmp)
        os.chdir(work)
        grown = grown_input(work, sized(2000, 200, 20))
        lookup_ = key_lookup(work, sized(10_000_000, 1_000_000, 10_000))
        memory = prepare_memory(work, sized([200_000, 2_000_000], [20_000, 200_000], [500, 5_000]))
        prepare = prepare_speed(work, sized(300_000, 50_000, 1_000))
    os.chdir(ROOT)
    rows = [
        ["grown input: engine tokens", *grown["engine_tokens"], f"{grown['tokens_ratio']:.3f}x"],
        ["grown input: wall s", *grown["seconds"], f"{grown['wall_ratio']:.3f}x"],
        ["grown input: engine busy s", *grown["engine_busy_s"], f"{grown['busy_ratio']:.3f}x"],
        ["grown input: engine load s", *grown["engine_load_s"], ""],
        ["prepare rows/s (this / base)", prepare["rows_per_s"], prepare["rows_per_s_base"], prepare["ratio"]],
        ["lookup s / peak MiB", lookup_["lookup_s"], lookup_["peak_mib"], f"{lookup_['keys']:,} keys"],
        *(
            [f"prepare {m['rows']:,} rows: peak MiB", m["peak_mib_reuse"], m["peak_mib_plain"], "reuse / plain"]
            for m in memory
        ),
    ]
    print(table(rows, ["measure", "first / with", "second / without", "ratio"]))
    identical, found = grown["old_answers_identical"], f"{lookup_['found']:,} of {lookup_['expected']:,}"
    print(f"old answers byte-identical: {identical}, reused {grown['reused']}, lookup found {found}")
    save("reuse_bench", {"grown": grown, "lookup": lookup_, "memory": memory, "prepare": prepare})


if __name__ == "__main__":
    main()
