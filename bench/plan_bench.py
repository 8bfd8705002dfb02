"""`orch plan` of 100,000 chunks over 1,000 workers, chunk sizes varying 10x.

Side by side: orch's balanced planner and the SkyPilot example's contiguous split
(len(chunks) // workers per worker). Reported: seconds, largest worker load / mean load, chunks
left out. Targets: under 2 s, largest load <= 1.05x the mean.
"""

from __future__ import annotations

import random
import time

from bench.common import save, sized, table
from orchestrator.core.layout import chunk_id
from orchestrator.core.records import ManifestEntry
from orchestrator.planning.plan import plan_chunks, skypilot_example_split


def main() -> None:
    chunks, workers = sized((100_000, 1_000), (10_000, 100), (1_000, 10))
    rng = random.Random(0)
    entries = []
    for i in range(chunks):
        rows = rng.randint(500, 5000)  # 10x variation
        entries.append(
            ManifestEntry(
                chunk=chunk_id(i, chunks),
                key=f"chunks/{chunk_id(i, chunks)}.jsonl",
                rows=rows,
                bytes=rows * 300,
                est_prompt_tokens=rows * 60,
                max_output_tokens=rows * 256,
            )
        )
    work = {e.chunk: e.est_tokens for e in entries}
    mean = sum(work.values()) / workers

    started = time.perf_counter()
    plan = plan_chunks(entries, workers)
    orch_s = time.perf_counter() - started
    orch_max = max(a.est_tokens for a in plan.workers) / mean

    started = time.perf_counter()
    split = skypilot_example_split([e.chunk for e in entries], workers)
    sky_s = time.perf_counter() - started
    sky_loads = [sum(work[c] for c in lst) for lst in split]
    sky_max = max(sky_loads) / mean
    dropped = chunks - sum(len(lst) for lst in split)

    print(
        table(
            [
                ["orch (balanced by est. tokens)", orch_s, orch_max, 0],
                ["SkyPilot example (len // n)", sky_s, sky_max, dropped],
            ],
            ["", "seconds", "max load / mean", "chunks dropped"],
        )
    )
    save(
        "plan_bench",
        {
            "chunks": chunks,
            "workers": workers,
            "size_variation": "500-5000 rows (10x)",
            "orch": {"seconds": round(orch_s, 3), "max_over_mean": round(orch_max, 4), "dropped": 0},
            "skypilot_example": {"seconds": round(sky_s, 3), "max_over_mean": round(sky_max, 4), "dropped": dropped},
            "targets": {"seconds": 2.0, "max_over_mean": 1.05},
        },
    )


if __name__ == "__main__":
    main()
