"""`orch prepare --check` against plain prepare, on the same OpenAI Batch file with three kinds of mistakes.

The file: chat request lines of about 600 bytes (a few models, temperatures and max_tokens, a
fifth of them with a JSON schema response_format), with a typo (`temprature`), `max_tokens: -5`
and a JSON schema that does not compile each on 0.1% of the lines. Side by side, each in its own
process: plain prepare (`--no-check`: what prepare did before the check, chunks written), `prepare
--check` (every request checked as the workers will, nothing written) and the default prepare
(checks while it reads; stops before uploading any chunk). Target: `--check` in <= 1.5x plain
prepare's time, reporting every mistake by field with its count.
Usage: python -m bench.check_bench [--rows N] [--quick]
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import subprocess
import sys
import time
from pathlib import Path

from bench.common import CACHE, ROOT, save, sized, table

SCHEMA = {"type": "object", "properties": {"label": {"enum": ["bug", "billing", "other"]}}, "required": ["label"]}
MISTAKES: dict[str, dict[str, object]] = {  # field -> what a mistaken line carries instead
    "temprature": {"temprature": 0.2},
    "max_tokens": {"max_tokens": -5},
    "response_format": {
        "response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": 3}}}
    },
}
EVERY = 1000  # each kind of mistake on one line in EVERY
#: The words of a ticket's text.
WORDS = [
    "the",
    "order",
    "arrived",
    "late",
    "and",
    "the",
    "invoice",
    "shows",
    "a",
    "charge",
    "twice",
    "please",
    "refund",
    "my",
    "account",
]


def write_input(path: Path, rows: int) -> None:
    rng = random.Random(0)
    with open(path, "w") as f:
        for i in range(rows):
            text = " ".join(rng.choice(WORDS) for _ in range(100))
            body: dict[str, object] = {
                "model": rng.choice(["org/base", "org/base", "org/other"]),
                "messages": [{"role": "system", "content": "Label the ticket."}, {"role": "user", "content": text}],
                "max_tokens": rng.choice([16, 32, 64]),
                "temperature": rng.choice([0, 0.2, 0.7]),
            }
            if i % 5 == 0:
                body["response_format"] = {"type": "json_schema", "json_schema": {"name": "label", "schema": SCHEMA}}
            for k, mistake in enumerate(MISTAKES.values()):
                if i % EVERY == 100 * (k + 1):
                    body.update(mistake)
            f.write(json.dumps({"custom_id": f"t{i}", "method": "POST", "url": "/v1/chat/completions", "body": body}))
            f.write("\n")


def timed(args: list[str], store: Path, run: str) -> tuple[float, int, str]:
    """Wall seconds, exit code and stderr of one `orch prepare` in its own process."""
    cmd = [sys.executable, "-m", "orchestrator", "prepare", *args, "--run", run, "--store", str(store)]
    started = time.monotonic()
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    return time.monotonic() - started, proc.returncode, proc.stderr


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, default=200_000)
    parser.add_argument("--quick", action="store_true", help="50,000 rows")
    parser.add_argument("--smoke", action="store_true", help="2,000 rows, nothing saved")
    opts = parser.parse_args()
    rows = sized(opts.rows, 50_000, 2_000)
    data = CACHE / f"check-{rows}.jsonl"
    if not data.exists():
        print(f"generating {rows:,} request lines in {data} ...", flush=True)
        data.parent.mkdir(parents=True, exist_ok=True)
        write_input(data.with_suffix(".tmp"), rows)
        data.with_suffix(".tmp").rename(data)
    store = CACHE / "check-store"
    shutil.rmtree(store, ignore_errors=True)
    common = [str(data), "--format", "openai-batch", "--num-chunks", "50"]
    results = {}
    for name, run, flags in (
        ("prepare --no-check (plain)", "plain", ["--no-check"]),
        ("prepare --check", "check", ["--check"]),
        ("prepare (checks, stops)", "default", []),
    ):
        seconds, code, err = timed([*common, *flags], store, run)
        reported = {field: f"{field}: {rows // EVERY:,} row(s)" in err for field in MISTAKES}
        results[name] = {"seconds": round(seconds, 2), "rows_per_s": round(rows / seconds), "exit": code}
        if flags != ["--no-check"]:
            results[name]["every_mistake_reported"] = all(reported.values())
    shutil.rmtree(store, ignore_errors=True)
    plain = results["prepare --no-check (plain)"]["seconds"]
    ratios = {k: round(v["seconds"] / plain, 2) for k, v in results.items()}
    print(
        table(
            [[k, v["seconds"], v["rows_per_s"], v["exit"], ratios[k]] for k, v in results.items()],
            ["", "seconds", "rows/s", "exit", "x plain"],
        )
    )
    save("check_bench", {"rows": rows, "results": results, "ratio_to_plain": ratios, "target_ratio": 1.5})


if __name__ == "__main__":
    main()
