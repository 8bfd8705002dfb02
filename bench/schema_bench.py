"""The JSON schema check's cost at prepare: the same rows prepared with and without a schema.

Two pairs, each side by side in its own processes, the same input file for both sides of a pair:
1. text rows (about 130 bytes each), prepared plain and with `--json-schema` (a 20-property
   schema of 2.4 KB: checked once, stored once in the run, each line carrying its reference);
2. OpenAI Batch chat lines, a tenth of them with their own 2.4 KB schema (checked once per
   distinct schema, as the workers will), prepared with the default check and with `--no-check`.
Each side runs twice, alternating; the faster run of each counts (a machine shared with others
adds noise only upward). Measured: CPU seconds (user + system) of each prepare process, which a
machine loaded by others changes far less than wall time, and wall time beside it. Target:
schema side <= 1.1x plain side on 1,000,000 rows.
Usage: python -m bench.schema_bench [--rows N] [--quick]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import subprocess
import sys
import time
from pathlib import Path

from bench.check_bench import WORDS
from bench.common import CACHE, ROOT, save, sized, table

SCHEMA = {
    "type": "object",
    "properties": {
        f"field_{i}": {"type": "string", "description": f"what the ticket says about aspect {i} of the order"}
        for i in range(20)
    },
    "required": ["field_0", "field_1"],
}


def write_rows(path: Path, rows: int, openai: bool) -> None:
    rng = random.Random(0)
    response_format = {"type": "json_schema", "json_schema": {"name": "ticket", "schema": SCHEMA}}
    with open(path, "w") as f:
        for i in range(rows):
            text = " ".join(rng.choice(WORDS) for _ in range(25))
            if not openai:
                f.write(json.dumps({"id": f"t{i}", "text": text}) + "\n")
                continue
            body: dict[str, object] = {"messages": [{"role": "user", "content": text}], "max_tokens": 64}
            if i % 10 == 0:
                body["response_format"] = response_format
            f.write(json.dumps({"custom_id": f"t{i}", "method": "POST", "url": "/v1/chat/completions", "body": body}))
            f.write("\n")


def timed(args: list[str], store: Path, run: str) -> tuple[float, float]:
    """Wall seconds and CPU seconds (user + system, from wait4: this child's own) of one `orch prepare`."""
    cmd = [sys.executable, "-m", "orchestrator", "prepare", *args, "--run", run, "--store", str(store)]
    started = time.monotonic()
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    assert proc.stderr is not None
    err = proc.stderr.read()
    _, status, usage = os.wait4(proc.pid, 0)
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"{' '.join(cmd)} failed:\n{err[-2000:].decode(errors='replace')}")
    return time.monotonic() - started, usage.ru_utime + usage.ru_stime


def input_file(rows: int, openai: bool) -> Path:
    data = CACHE / f"schema-{'openai' if openai else 'text'}-{rows}.jsonl"
    if not data.exists():
        print(f"generating {rows:,} rows in {data} ...", flush=True)
        data.parent.mkdir(parents=True, exist_ok=True)
        write_rows(data.with_suffix(".tmp"), rows, openai)
        data.with_suffix(".tmp").rename(data)
    return data


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--quick", action="store_true", help="100,000 rows")
    parser.add_argument("--smoke", action="store_true", help="2,000 rows, nothing saved")
    opts = parser.parse_args()
    rows = sized(opts.rows, 100_000, 2_000)
    schema = CACHE / "schema-bench.json"
    schema.parent.mkdir(parents=True, exist_ok=True)
    schema.write_text(json.dumps(SCHEMA, indent=2))
    store = CACHE / "schema-store"
    text, openai = input_file(rows, False), input_file(rows, True)
    text_args = [str(text), "--format", "text", "--id-column", "id", "--num-chunks", "50"]
    openai_args = [str(openai), "--format", "openai-batch", "--num-chunks", "50"]
    pairs = {
        "text rows": (("plain", text_args), ("--json-schema", [*text_args, "--json-schema", str(schema)])),
        "openai-batch lines, 10% with a schema": (
            ("--no-check", [*openai_args, "--no-check"]),
            ("checked", openai_args),
        ),
    }
    results = {}
    for pair, sides in pairs.items():
        best = {name: (float("inf"), float("inf")) for name, _ in sides}
        for attempt in range(2):
            for name, args in sides:
                shutil.rmtree(store, ignore_errors=True)
                wall, cpu = timed(args, store, f"r{attempt}")
                best[name] = (min(best[name][0], wall), min(best[name][1], cpu))
        (base, (base_wall, base_cpu)), (other, (other_wall, other_cpu)) = best.items()
        results[pair] = {
            base: {"wall_s": round(base_wall, 2), "cpu_s": round(base_cpu, 2)},
            other: {"wall_s": round(other_wall, 2), "cpu_s": round(other_cpu, 2)},
            "cpu_ratio": round(other_cpu / base_cpu, 3),
            "wall_ratio": round(other_wall / base_wall, 3),
        }
    shutil.rmtree(store, ignore_errors=True)
    rows_out = []
    for pair, r in results.items():
        (base, b), (other, o) = [(k, v) for k, v in r.items() if isinstance(v, dict)]
        rows_out.append([pair, f"{base} {b['cpu_s']}s", f"{other} {o['cpu_s']}s", r["cpu_ratio"], r["wall_ratio"]])
    print(table(rows_out, ["", "plain side (CPU)", "schema side (CPU)", "CPU ratio", "wall ratio"]))
    save("schema_bench", {"rows": rows, "results": results, "target_ratio": 1.1})


if __name__ == "__main__":
    main()
