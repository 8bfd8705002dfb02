"""Several models in one run against one run per model: engine time, makespan, and the same answers.

ROWS rows, each asked of every model (a line per model naming it in body.model; greedy,
MAX_TOKENS tokens each, ignore_eos). Variants, each through `orch run` with local workers:
(a) one run of all the lines, `--model NAME=PATH` per model: a pool of one worker per model,
    all at once;
(b) one run per model (`--model PATH`, one worker), one after the other;
(c) the same runs as (b) started together, each in its own folder: separate runs on the same
    workers at once, which is what (a) replaces. On a machine with fewer cores than engines,
    (b) gives each engine the machine alone and (c) does not; (a) against (c) isolates what pooling
    costs from what sharing the cores costs.
Every engine gets one thread (OMP_NUM_THREADS=1), alone or beside another.
Reported: engine time (the workers' busy seconds, from their summary lines; start-up excluded),
the makespan (the `orch run` command's wall time), and whether each model's answers in (a) are
byte-identical to its own run's in (b). Each ratio is printed against (b) and against (c).
Targets (issue 36): engine time (a) <= 1.05x (b)'s sum;
makespan (a) <= 1.1x the best split of (b)'s runs over the same workers (each on its own worker
at once: the longest of them, measured alone); answers identical.

The models: the tiny Llama, the tiny reasoning Llama (tiny-think) and, with `--models 3`, the
tiny Llama again under another chat template (a third base model to the run, a third engine).
The defaults are the issue's size: 3 models x 1,000 rows (`--models 2`, `--rows N`, `--quick`: 20 rows).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.common import ROOT, save, sized, table

MODELS = ROOT / ".cache" / "models"
MAX_TOKENS = 16
#: A chat template of its own: the third model's prompts (and so answers) differ from the first's.
OTHER_TEMPLATE = "{% for m in messages %}<<{{ m.role }}>> {{ m.content }}\n{% endfor %}<<assistant>> "


def model_entries(count: int) -> dict[str, dict[str, Any]]:
    entries: dict[str, dict[str, Any]] = {
        "llama": {"name": str(MODELS / "tiny-llama")},
        "think": {"name": str(MODELS / "tiny-think")},
        "llama-tpl": {"name": str(MODELS / "tiny-llama"), "chat_template": OTHER_TEMPLATE},
    }
    return dict(list(entries.items())[:count])


def write_lines(path: Path, models: list[str], rows: int) -> None:
    with open(path, "w") as f:
        for i in range(rows):
            for model in models:
                body = {
                    "model": model,
                    "messages": [{"role": "user", "content": f"Question {i}: what follows {i}?"}],
                    "max_tokens": MAX_TOKENS,
                    "temperature": 0,
                    "ignore_eos": True,
                }
                line = {"custom_id": f"{model}-{i}", "method": "POST", "url": "/v1/chat/completions", "body": body}
                f.write(json.dumps(line) + "\n")


def orch_run(
    work: Path, run: str, data: Path, spec: dict[str, Any], flags: list[str], fmt: str = "openai-batch"
) -> dict[str, Any]:
    """`orch run` in `work` with its own orch.yaml: the wall time, the workers' busy seconds, the answers."""
    import yaml

    (work / "orch.yaml").write_text(yaml.safe_dump(spec))
    out = work / f"{run}.jsonl"
    # One thread per engine in every variant: the local launcher would give a lone worker both
    # cores and two workers one each, and engine seconds would compare thread counts, not runs.
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "orchestrator", "run", str(data), "--run", run, "--format", fmt,
         "--out", str(out), *flags],
        cwd=work, env=env, capture_output=True, text=True,
    )  # fmt: skip
    wall = time.monotonic() - started
    if done.returncode != 0:
        raise SystemExit(f"orch run {run} failed:\n{done.stdout}\n{done.stderr}")
    busy = sum(worker_summary(log)["busy_s"] for log in (work / ".orch" / "logs" / run).glob("*.log"))
    answers = {}
    for line in out.read_text().splitlines():
        x = json.loads(line)
        answers[x["custom_id"]] = json.dumps(x["response"]["body"]["choices"], sort_keys=True)
    return {"wall_s": wall, "busy_s": busy, "answers": answers}


def separate_runs_at_once(
    work: Path, entries: dict[str, dict[str, Any]], base: dict[str, Any], rows: int
) -> dict[str, Any]:
    """(c): one run per model, all started together, each in its own folder (its own orch.yaml and store)."""
    from concurrent.futures import ThreadPoolExecutor

    def one(name: str) -> dict[str, Any]:
        folder = work / f"at-once-{name}"
        folder.mkdir()
        lines = folder / f"{name}.jsonl"
        write_lines(lines, [name], rows)
        entry = entries[name]
        model = {k: v for k, v in entry.items() if k != "name"}
        spec = {**base, "model": model, "workers": {**base["workers"], "count": 1}}
        return orch_run(folder, f"at-once-{name}", lines, spec, ["--model", entry["name"]])

    started = time.monotonic()
    with ThreadPoolExecutor(len(entries)) as pool:
        runs = dict(zip(entries, pool.map(one, entries), strict=True))
    return {"wall_s": time.monotonic() - started, "runs": runs}


def worker_summary(log: Path, timeout_s: float = 300.0) -> dict[str, Any]:
    """The worker's summary line (its last on stdout): `orch run` returns once every chunk is done,
    which can be before a worker has printed it, so it is waited for."""
    deadline = time.monotonic() + timeout_s
    while True:
        for line in reversed(log.read_text(errors="replace").splitlines()):
            if line.startswith("{") and '"busy_s"' in line:
                summary: dict[str, Any] = json.loads(line)
                return summary
        if time.monotonic() > deadline:
            raise SystemExit(f"{log}: no summary line after {timeout_s:.0f}s")
        time.sleep(0.5)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1000)
    parser.add_argument("--models", type=int, default=3, choices=(2, 3))
    parser.add_argument("--quick", action="store_true", help="20 rows")
    parser.add_argument("--smoke", action="store_true", help="8 rows, nothing saved")
    args = parser.parse_args()
    rows = sized(args.rows, 20, 8)
    entries = model_entries(args.models)
    base = {
        "workers": {"heartbeat_interval": 1, "checkpoint_interval": 5},
        "chunking": {"rows_per_chunk": max(10, rows // 4)},
    }
    with tempfile.TemporaryDirectory(prefix="orch-models-bench-") as tmp:
        work = Path(tmp)
        data = work / "all.jsonl"
        write_lines(data, list(entries), rows)
        together = orch_run(
            work,
            "together",
            data,
            {**base, "models": entries, "workers": {**base["workers"], "count": len(entries)}},
            [],
        )
        apart = {}
        for name, entry in entries.items():
            lines = work / f"{name}.jsonl"
            write_lines(lines, [name], rows)
            model = {k: v for k, v in entry.items() if k != "name"}
            spec = {**base, "model": model, "workers": {**base["workers"], "count": 1}}
            apart[name] = orch_run(work, f"apart-{name}", lines, spec, ["--model", entry["name"]])
        concurrent = separate_runs_at_once(work, entries, base, rows)
    engine_apart = sum(r["busy_s"] for r in apart.values())
    engine_at_once = sum(r["busy_s"] for r in concurrent["runs"].values())
    best_split = max(r["wall_s"] for r in apart.values())
    identical = {
        name: all(together["answers"][cid] == answer for cid, answer in r["answers"].items())
        for name, r in apart.items()
    }
    at_once: dict[str, Any] = {
        "wall_s": round(concurrent["wall_s"], 1),
        "busy_s": round(engine_at_once, 2),
        "engine_time_ratio": round(together["busy_s"] / engine_at_once, 3) if engine_at_once else None,
        "makespan_ratio": round(together["wall_s"] / concurrent["wall_s"], 3),
    }
    results = {
        "rows": rows,
        "models": list(entries),
        "together": {"wall_s": round(together["wall_s"], 1), "busy_s": round(together["busy_s"], 2)},
        "apart": {n: {"wall_s": round(r["wall_s"], 1), "busy_s": round(r["busy_s"], 2)} for n, r in apart.items()},
        "engine_time_ratio": round(together["busy_s"] / engine_apart, 3) if engine_apart else None,
        "makespan_vs_best_split": round(together["wall_s"] / best_split, 3) if best_split else None,
        "at_once": at_once,
        "identical_answers": identical,
    }
    print(
        table(
            [
                ["one run, a pool per model", round(together["busy_s"], 2), round(together["wall_s"], 1)],
                *[[f"alone: {n}", round(r["busy_s"], 2), round(r["wall_s"], 1)] for n, r in apart.items()],
                ["separate runs at once", round(engine_at_once, 2), round(concurrent["wall_s"], 1)],
            ],
            ["variant", "engine s", "wall s"],
        )
    )
    print(
        f"engine time ratio {results['engine_time_ratio']} (target <= 1.05); makespan / best split "
        f"{results['makespan_vs_best_split']} (target <= 1.1); identical answers: {identical}"
    )
    print(
        f"against the separate runs at once: engine time {at_once['engine_time_ratio']}, "
        f"makespan {at_once['makespan_ratio']}"
    )
    save("models_bench", results)
    return 0 if all(identical.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
