"""A sweep of one model over three system prompts against three separate runs (issue 36's second target).

ROWS questions (`--format text`), each asked under three system prompts of about 150 words (a
prefix shared by every row of an arm), greedy, at most MAX_TOKENS tokens each, prefixes
grouped (`chunking.group_by_prefix`), one local worker with one engine thread:
(a) one run with `sweep.arms` (one arm per system prompt);
(b) one run per system prompt (`input.system_prompt`), one after the other.
Reported: engine time (the workers' busy seconds; start-up excluded), wall time, and whether every
arm's answers are byte-identical to its separate run's.
Target (issue 36): engine time (a) <= 1.05x (b)'s sum.

    python -m bench.sweep_bench [--rows N] [--quick]
"""

from __future__ import annotations

import argparse
import random
import sys
import tempfile
from pathlib import Path
from typing import Any

from bench.common import save, sized, table
from bench.models_bench import MAX_TOKENS, MODELS, orch_run

ARMS = ("formal", "terse", "teacher")


def system_prompts() -> dict[str, str]:
    from tests.support.datasets import WORDS

    rng = random.Random(36)
    return {arm: f"You are {arm}. " + " ".join(rng.choice(WORDS) for _ in range(150)) for arm in ARMS}


def write_questions(path: Path, rows: int) -> None:
    import json

    from tests.support.datasets import WORDS

    rng = random.Random(7)
    with open(path, "w") as f:
        for i in range(rows):
            question = " ".join(rng.choice(WORDS) for _ in range(rng.randint(5, 20)))
            f.write(json.dumps({"id": f"q{i}", "question": question}) + "\n")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1000)
    parser.add_argument("--quick", action="store_true", help="60 rows")
    parser.add_argument("--smoke", action="store_true", help="8 rows, nothing saved")
    args = parser.parse_args()
    rows = sized(args.rows, 60, 8)
    prompts = system_prompts()
    base: dict[str, Any] = {
        "model": {"name": str(MODELS / "tiny-llama")},
        "input": {"id_column": "id", "text_column": "question"},
        "sampling": {"max_tokens": MAX_TOKENS, "temperature": 0},
        "workers": {"count": 1, "heartbeat_interval": 1, "checkpoint_interval": 5},
        "chunking": {"rows_per_chunk": max(10, rows * len(ARMS) // 4), "group_by_prefix": True},
    }
    with tempfile.TemporaryDirectory(prefix="orch-sweep-bench-") as tmp:
        work = Path(tmp)
        data = work / "questions.jsonl"
        write_questions(data, rows)
        sweep = {**base, "sweep": {"arms": {arm: {"system_prompt": prompts[arm]} for arm in ARMS}}}
        together = orch_run(work, "sweep", data, sweep, [], fmt="text")
        apart = {}
        for arm in ARMS:
            spec = {**base, "input": {**base["input"], "system_prompt": prompts[arm]}}
            apart[arm] = orch_run(work, f"apart-{arm}", data, spec, [], fmt="text")
    engine_apart = sum(r["busy_s"] for r in apart.values())
    identical = {
        arm: all(together["answers"][f"{cid}#{arm}"] == answer for cid, answer in r["answers"].items())
        for arm, r in apart.items()
    }
    results = {
        "rows": rows,
        "arms": list(ARMS),
        "sweep": {"wall_s": round(together["wall_s"], 1), "busy_s": round(together["busy_s"], 2)},
        "apart": {a: {"wall_s": round(r["wall_s"], 1), "busy_s": round(r["busy_s"], 2)} for a, r in apart.items()},
        "engine_time_ratio": round(together["busy_s"] / engine_apart, 3) if engine_apart else None,
        "wall_ratio": round(together["wall_s"] / sum(r["wall_s"] for r in apart.values()), 3),
        "identical_answers": identical,
    }
    print(
        table(
            [
                ["one run, a sweep of 3 arms", round(together["busy_s"], 2), round(together["wall_s"], 1)],
                *[[f"alone: {a}", round(r["busy_s"], 2), round(r["wall_s"], 1)] for a, r in apart.items()],
            ],
            ["variant", "engine s", "wall s"],
        )
    )
    print(
        f"engine time ratio {results['engine_time_ratio']} (target <= 1.05); wall vs the three runs one "
        f"after another {results['wall_ratio']}; identical answers: {identical}"
    )
    save("sweep_bench", results)
    return 0 if all(identical.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
