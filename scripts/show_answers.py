"""Prints a few questions of the demo next to the answers `orch collect` returned."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pyarrow.parquet as pq


def main(data: str, answers: str, count: int = 8) -> None:
    questions = {}
    for path in sorted(Path(data).glob("*.parquet")):
        for row in pq.read_table(path, columns=["conversation_id", "conversation"]).to_pylist():
            questions[row["conversation_id"]] = row["conversation"][0]["content"]
    lines = [json.loads(line) for line in Path(answers).read_text().splitlines()]
    step = max(1, len(lines) // count)
    print(f"\n{len(lines)} answers in {answers}; a few of them:\n")
    for line in lines[::step][:count]:
        body = (line.get("response") or {}).get("body") or {}
        answer = body["choices"][0]["message"]["content"] if not line.get("error") else f"(error) {line['error']}"
        print(f"Q: {questions.get(line['custom_id'], '?')}\nA: {' '.join(answer.split())}\n")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
