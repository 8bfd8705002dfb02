"""The probe forecast's calibration study (issue 35): on small local workloads, how right `orch estimate --probe` is.

Each workload, in a fresh store with the tiny test model (.cache/models/tiny-llama, CPU):
`orch prepare`, `orch estimate` (the guess, no probe), `orch estimate --probe`, `orch run`,
`orch collect` (which writes the actual figures into the forecast record). Rows are openai-batch
lines, so each row's `max_tokens` (and `ignore_eos`, for output lengths the workload decides)
reaches the engine as written. The engine batch is `max_num_seqs` ENGINE_BATCH: the probe runs at
least two full batches (the first warms the engine up), so the run must be ~70x that for a probe
within 1.5% of its rows; at the default 1% share the probe of 8,800 rows is 88 rows (11 batches, about
a second of engine time). Smaller runs give probes too short to measure a rate on a shared machine:
a 16-row probe (1,100 rows) measured the engine still warming up past its first batch (+45% on short
outputs), and 44-row probes (4,400 rows, 0.3-1 s) carried the machine's second-to-second swings (up
to +55%) and spent up to 1.7% on heavy-tailed outputs, whose longest rows decode alone
(docs/BENCHMARKS.md, runs 7-9).

Reported per workload: forecast p50 and p10-p90 of the fleet's engine time against the actual
(the busiest worker's engine seconds), inside the band or not, the guess's band and whether it
holds the actual, the probe's engine time as a share of the run's (all workers' engine seconds),
and that no row was answered twice (one output line per input row, markers' rows add up).
The same in CPU seconds (`cpu error`: the probe's rate in CPU terms against the busiest worker's
CPU time): this machine is shared, and wall time carries the neighbours' load, which comes and goes.
Targets: median |error| <= 10%, >= 80% inside the band, probe <= 1.5%, guess band holds >= 80%.

The study runs ROUNDS rounds of every workload (`--rounds N`), one after the other, each in a fresh
store, and measures the machine's own floor beside the probe: a forecast that knew each workload's
engine time from the other rounds (the median of their actuals) and nothing of the machine's state at
the time. Its error is what the same run moves from one round to the next on this machine; a probe,
taken minutes before its run, cannot be expected to do better than that.
`--quick`: the first three workloads at a third of the rows, two rounds; `--smoke`: the first at a tenth, once.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.common import CACHE, ROOT, save, sized, table

MODEL = ROOT / ".cache" / "models" / "tiny-llama"
#: Where each workload runs and its store is kept (a folder per workload, emptied first). Each
#: benchmark that measures through this module has its own: two of them at once must not empty
#: each other's (forecast_gpu_bench sets its own).
WORKDIR = CACHE / "forecast"
ENGINE_BATCH = 8
#: Rounds of the whole study: two or more measure the machine's floor (the module's docstring).
ROUNDS = 3
SPEC = f"""input:
  format: openai-batch
sampling:
  temperature: 0
model:
  engine_args:
    max_num_seqs: {ENGINE_BATCH}
    kv_cache_memory_bytes: {64 * 2**20}
workers:
  heartbeat_interval: 1
  checkpoint_interval: 2
"""


def _words(rng: random.Random, lo: int, hi: int) -> str:
    from tests.support.datasets import WORDS

    return " ".join(rng.choice(WORDS) for _ in range(rng.randint(lo, hi)))


def _line(i: int, content: str, max_tokens: int, system: str | None = None) -> dict[str, Any]:
    messages = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": content}]
    body = {"model": "tiny", "messages": messages, "max_tokens": max_tokens, "ignore_eos": True}
    return {"custom_id": f"r{i}", "method": "POST", "url": "/v1/chat/completions", "body": body}


def _heavy_tail(rng: random.Random) -> int:
    return min(160, int(6 * rng.paretovariate(1.3)))


#: (workers, rows, row maker(i, rng)).
Workload = tuple[int, int, Callable[[int, random.Random], dict[str, Any]]]
#: name -> its workload.
WORKLOADS: dict[str, Workload] = {
    "short prompts, short outputs": (2, 8800, lambda i, r: _line(i, _words(r, 5, 20), 16)),
    "long prompts, short outputs": (2, 8800, lambda i, r: _line(i, _words(r, 120, 200), 16)),
    "short prompts, long outputs": (2, 8800, lambda i, r: _line(i, _words(r, 5, 20), 64)),
    "heavy-tailed outputs": (2, 8800, lambda i, r: _line(i, _words(r, 10, 40), _heavy_tail(r))),
    "shared prefixes": (
        2,
        8800,
        lambda i, r: _line(i, _words(r, 5, 15), 24, system=_words(random.Random(i % 4), 150, 150)),
    ),
    "mixed max_tokens, 4 workers": (4, 9600, lambda i, r: _line(i, _words(r, 10, 60), r.choice([8, 24, 48]))),
}


def _orch(cwd: Path, *args: str) -> str:
    # This tree first, then whatever the caller's path holds (a GPU machine's carried wheels).
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    done = subprocess.run(
        [sys.executable, "-m", "orchestrator", *args], cwd=cwd, env=env, capture_output=True, text=True
    )
    if done.returncode:
        raise SystemExit(f"orch {' '.join(args)} failed ({done.returncode}):\n{done.stderr[-3000:]}")
    return done.stdout


def measure(name: str, workers: int, rows: int, make: Callable[[int, random.Random], dict[str, Any]]) -> dict[str, Any]:
    from orchestrator.core.layout import RunLayout
    from orchestrator.core.records import read_manifest, read_marker
    from orchestrator.core.store import open_store
    from orchestrator.planning.forecast import local_parallelism

    # Each workload's store is kept (WORKDIR/<n>) for a look at what the workers measured.
    cwd = WORKDIR / name.replace(" ", "-").replace(",", "")
    shutil.rmtree(cwd, ignore_errors=True)
    cwd.mkdir(parents=True)
    (cwd / "orch.yaml").write_text(SPEC)
    rng = random.Random(name)
    (cwd / "q.jsonl").write_text("".join(json.dumps(make(i, rng)) + "\n" for i in range(rows)))
    common = ["--run", "b", "--model", str(MODEL)]
    _orch(cwd, "prepare", "q.jsonl", *common, "--num-chunks", str(4 * workers))
    guess = json.loads(_orch(cwd, "estimate", *common, "--workers", str(workers), "--json"))
    started = time.monotonic()
    probe = json.loads(_orch(cwd, "estimate", *common, "--workers", str(workers), "--probe", "--json"))
    probe_wall = time.monotonic() - started
    started = time.monotonic()
    _orch(cwd, "run", "q.jsonl", *common, "--workers", str(workers), "--out", "out.jsonl", "--interval", "2")
    run_wall = time.monotonic() - started
    _orch(cwd, "collect", "--run", "b", "--out", "out.jsonl")
    store, layout = open_store(str(cwd / ".orch")), RunLayout("b")
    record = json.loads(store.get(layout.forecast).data)
    ids = [json.loads(x)["custom_id"] for x in (cwd / "out.jsonl").read_text().splitlines()]
    markers = [read_marker(store, layout, e.chunk) for e in read_manifest(store, layout)]
    beats = _final_beats(cwd)
    run_engine = sum(float(b["busy_s"]) for b in beats)
    # The same comparison in CPU seconds: the probe's rate taken in CPU terms, without the wall-time
    # slowdown of workers sharing cores (CPU seconds do not stretch), against the busiest worker's CPU time.
    p = probe["probe"]
    slowdown = workers / local_parallelism(workers, max(1, (os.cpu_count() or 1) // workers))
    to_cpu = (p["engine_cpu_s"] or 0.0) / p["engine_s"] / slowdown if p["engine_s"] else 0.0
    actual_cpu = max(float(b.get("busy_cpu_s", 0.0)) for b in beats)
    band = record["candidates"][0]["engine_s"]
    gband = guess["candidates"][0]["engine_s"]
    actual = record["actual"]["engine_s"]
    return {
        "workload": name,
        "workers": workers,
        "rows": rows,
        "probe_rows": probe["probe"]["rows"],
        "forecast": band,
        "actual_engine_s": actual,
        "error": round(band["p50"] / actual - 1, 3),
        "inside": band["p10"] <= actual <= band["p90"],
        "guess": gband,
        "guess_inside": gband["p10"] <= actual <= gband["p90"],
        "cpu_error": round(band["p50"] * to_cpu / actual_cpu - 1, 3) if actual_cpu else None,
        "cpu_inside": band["p10"] * to_cpu <= actual_cpu <= band["p90"] * to_cpu,
        "probe_cpu_per_wall": round(to_cpu * slowdown, 3),
        "run_cpu_per_wall": round(actual_cpu / actual, 3) if actual else None,
        "probe_engine_s": probe["probe"]["engine_s"],
        "probe_share": round(probe["probe"]["engine_s"] / max(run_engine, 1e-9), 4),
        "answered_once": sorted(ids) == sorted(f"r{i}" for i in range(rows))
        and sum(m.rows for m in markers if m is not None) == rows,
        "probe_wall_s": round(probe_wall, 1),
        "run_wall_s": round(run_wall, 1),
    }


def _final_beats(cwd: Path) -> list[dict[str, Any]]:
    """Every process's last heartbeat body (the probe's is replaced by its worker id's next process)."""
    beats = []
    for path in (cwd / ".orch" / "runs" / "b" / "heartbeats").glob("*/*"):
        beats.append(json.loads(path.read_text()))
    return beats


def study(workloads: list[tuple[str, Workload]], scale: float = 1.0) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Each workload measured in turn (its rows times `scale`), printed as it ends; the results and their summary."""
    results = []
    for name, (workers, rows, make) in workloads:
        started = time.monotonic()
        r = measure(name, workers, int(rows * scale), make)
        print(f"{name}: {json.dumps(r)} ({time.monotonic() - started:.0f} s)", flush=True)
        results.append(r)
    return results, summarise(results)


def summarise(results: list[dict[str, Any]]) -> dict[str, Any]:
    floors = [abs(r["floor_error"]) for r in results if r.get("floor_error") is not None]
    return {
        "median_abs_error": round(statistics.median(abs(r["error"]) for r in results), 3),
        "inside_band": round(sum(r["inside"] for r in results) / len(results), 2),
        "median_abs_cpu_error": round(statistics.median(abs(r["cpu_error"] or 0.0) for r in results), 3),
        "cpu_inside_band": round(sum(r["cpu_inside"] for r in results) / len(results), 2),
        "guess_inside_band": round(sum(r["guess_inside"] for r in results) / len(results), 2),
        "probe_share_max": max(r["probe_share"] for r in results),
        "answered_once": all(r["answered_once"] for r in results),
        **({"floor_median_abs_error": round(statistics.median(floors), 3)} if floors else {}),
    }


def add_floor(rounds: list[list[dict[str, Any]]]) -> None:
    """Each result gets `floor_error`: the error of a forecast that took its workload's engine time as the
    median of the other rounds' actuals (the module's docstring), a figure only two rounds or more give."""
    for i, results in enumerate(rounds):
        for r in results:
            others = [
                o["actual_engine_s"]
                for j, rs in enumerate(rounds)
                if j != i
                for o in rs
                if o["workload"] == r["workload"]
            ]
            r["floor_error"] = round(statistics.median(others) / r["actual_engine_s"] - 1, 3) if others else None


def floor_summary(rounds: list[list[dict[str, Any]]], summaries: list[dict[str, Any]]) -> dict[str, Any]:
    """The study over every round: the probe's figures, and the floor's beside them."""
    out = {**summarise([r for rs in rounds for r in rs]), "rounds": len(rounds)}
    out["rounds_median_met"] = sum(s["median_abs_error"] <= 0.10 for s in summaries)
    if "floor_median_abs_error" in out:
        out["floor_rounds_median_met"] = sum(s["floor_median_abs_error"] <= 0.10 for s in summaries)
    return out


def report(results: list[dict[str, Any]], summary: dict[str, Any]) -> None:
    rows = [
        [
            r["workload"],
            r["workers"],
            r["rows"],
            r["probe_rows"],
            f"{r['forecast']['p50']:.1f} ({r['forecast']['p10']:.1f}-{r['forecast']['p90']:.1f})",
            r["actual_engine_s"],
            f"{r['error']:+.0%}",
            "yes" if r["inside"] else "no",
            f"{r['cpu_error']:+.0%}" if r["cpu_error"] is not None else "-",
            f"{r['guess']['p10']:.0f}-{r['guess']['p90']:.0f}",
            f"{r['probe_share']:.1%}",
            f"{r['floor_error']:+.0%}" if r.get("floor_error") is not None else "-",
        ]
        for r in results
    ]
    heads = [
        "workload",
        "workers",
        "rows",
        "probe",
        "forecast s",
        "actual s",
        "error",
        "in",
        "cpu error",
        "guess",
        "probe",
        "floor",
    ]
    print(table(rows, heads))
    print(json.dumps(summary))


def main(argv: list[str]) -> int:
    n = int(argv[argv.index("--rounds") + 1]) if "--rounds" in argv else sized(ROUNDS, 2, 1)
    chosen = list(WORKLOADS.items())[: sized(len(WORKLOADS), 3, 1)]
    rounds = []
    for i in range(n):
        print(f"--- round {i + 1} of {n} ---", flush=True)
        rounds.append(study(chosen, sized(1.0, 1 / 3, 1 / 10))[0])
    add_floor(rounds)
    summaries = [summarise(results) for results in rounds]
    for i, (results, summary) in enumerate(zip(rounds, summaries, strict=True)):
        print(f"--- round {i + 1} of {n} ---")
        report(results, summary)
    overall = floor_summary(rounds, summaries)
    print(f"--- all {n} rounds ---")
    print(json.dumps(overall))
    save(
        "forecast_bench",
        {
            "engine_batch": ENGINE_BATCH,
            "rounds": [{"workloads": rs, "summary": s} for rs, s in zip(rounds, summaries, strict=True)],
            "summary": overall,
        },
    )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
