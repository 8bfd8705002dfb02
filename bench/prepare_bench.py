"""`orch prepare` of an LMSys-shaped dataset (1,000,000 conversations, 6 parquet files) into 200 chunks.

Side by side, in one run: orch's streaming prepare, the same with `--group-by-prefix` (rows
sorted by prompt prefix through an external sort; LMSys first turns hardly share any, so this is
its cost, not its gain), and the straightforward script the recipe suggests (read every file
whole, then split rows into chunk files). Reported: rows/s and the peak RSS of each, as a
separate process. Targets, for both of orch's: >= 50,000 rows/s, <= 1 GiB.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time

from bench.common import CACHE, ROOT, save, sized, table

NAIVE = r"""
import json, math, sys, pathlib, pyarrow.parquet as pq
src, out, chunks = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2]), int(sys.argv[3])
rows = []
for f in sorted(src.glob("*.parquet")):
    rows += pq.read_table(f).to_pylist()
per = math.ceil(len(rows) / chunks)
out.mkdir(parents=True, exist_ok=True)
for i in range(chunks):
    with open(out / f"part_{i}.jsonl", "w") as fh:
        for row in rows[i * per:(i + 1) * per]:
            fh.write(json.dumps({"id": row["conversation_id"], "messages": row["conversation"][:1]}) + "\n")
"""


def measure(cmd: list[str]) -> tuple[float, float]:
    """Wall seconds and peak RSS (MiB) of one child process: its own usage from wait4, not
    RUSAGE_CHILDREN's, which is the largest of every child waited for so far (the dataset
    generator's included)."""
    started = time.monotonic()
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.DEVNULL)
    _, status, usage = os.wait4(proc.pid, 0)
    seconds = time.monotonic() - started
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode:
        raise subprocess.CalledProcessError(proc.returncode, cmd)
    return seconds, usage.ru_maxrss / 1024


def main() -> None:
    rows = sized(1_000_000, 100_000, 2_000)
    data = CACHE / f"lmsys-{rows}"
    if not (data / ".done").exists():
        shutil.rmtree(data, ignore_errors=True)
        print(f"generating {rows:,} conversations in {data} ...", flush=True)
        # In a child process: a child's peak RSS counts what it inherited at fork, so this process
        # must stay small for the measurements below to be each command's own.
        subprocess.run(
            [
                sys.executable,
                "-c",
                "import sys; from tests.support.datasets import write_lmsys_parquet; "
                f"write_lmsys_parquet({str(data)!r}, {rows}, files=6)",
            ],
            check=True,
            cwd=ROOT,
        )
        (data / ".done").write_text("ok")
    results = {}
    # Each in its own process, so peak RSS is each one's own.
    store = CACHE / "prepare-store"
    shutil.rmtree(store, ignore_errors=True)
    orch = [
        sys.executable,
        "-m",
        "orchestrator",
        "prepare",
        str(data),
        "--run",
        "bench",
        "--store",
        str(store),
        "--num-chunks",
        "200",
        "--id-column",
        "conversation_id",
    ]
    grouped = [*orch[:6], "bench-grouped", *orch[7:], "--group-by-prefix"]
    naive_out = CACHE / "naive-chunks"
    shutil.rmtree(naive_out, ignore_errors=True)
    naive = [sys.executable, "-c", NAIVE, str(data), str(naive_out), "200"]
    variants = (
        ("orch prepare (streaming)", orch),
        ("orch prepare --group-by-prefix", grouped),
        ("load-all-then-split script", naive),
    )
    for name, cmd in variants:
        seconds, peak = measure(cmd)
        results[name] = {"seconds": round(seconds, 2), "rows_per_s": round(rows / seconds), "peak_rss_mib": round(peak)}
    shutil.rmtree(store, ignore_errors=True)
    shutil.rmtree(naive_out, ignore_errors=True)
    o, n = results["orch prepare (streaming)"], results["load-all-then-split script"]
    print(
        table(
            [[k, v["seconds"], v["rows_per_s"], v["peak_rss_mib"]] for k, v in results.items()],
            ["", "seconds", "rows/s", "peak RSS MiB"],
        )
    )
    ratios = {
        "speed_orch_over_naive": round(o["rows_per_s"] / n["rows_per_s"], 2),
        "memory_orch_over_naive": round(o["peak_rss_mib"] / n["peak_rss_mib"], 2),
        "speed_grouped_over_orch": round(results["orch prepare --group-by-prefix"]["rows_per_s"] / o["rows_per_s"], 2),
    }
    print(json.dumps(ratios))
    save(
        "prepare_bench",
        {
            "rows": rows,
            "chunks": 200,
            "results": results,
            "ratios": ratios,
            "targets": {"rows_per_s": 50_000, "peak_rss_mib": 1024},
        },
    )


if __name__ == "__main__":
    main()
