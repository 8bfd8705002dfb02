"""Datasets shaped like the real ones, generated locally: LMSys-Chat-1M parquet files, small JSONL inputs."""

from __future__ import annotations

import json
import random
from collections.abc import Sequence
from pathlib import Path
from typing import Any

WORDS = [
    "the",
    "model",
    "data",
    "answer",
    "question",
    "write",
    "explain",
    "summary",
    "code",
    "python",
    "error",
    "please",
    "help",
    "how",
    "what",
    "why",
    "when",
    "list",
    "table",
    "number",
    "value",
    "train",
    "test",
    "cloud",
    "price",
    "batch",
    "token",
    "chunk",
    "worker",
    "spot",
    "instance",
    "region",
    "quick",
    "brown",
    "fox",
    "jumps",
    "over",
    "lazy",
    "dog",
    "capital",
    "city",
    "country",
    "river",
    "mountain",
    "history",
    "science",
    "music",
    "story",
    "poem",
    "letter",
]


def _sentence(rng: random.Random, words: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(words)).capitalize() + "?"


def write_lmsys_parquet(
    directory: str | Path, rows: int, *, files: int = 6, seed: int = 0, turns: Sequence[int] = (1, 1, 1, 2, 2, 3)
) -> list[Path]:
    """`train-0000i-of-0000N.parquet` files with LMSys-Chat-1M's columns: conversation_id, model,
    conversation (list of {content, role}), turn, language, openai_moderation, redacted."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    rng = random.Random(seed)
    # Pools of texts keep generation fast for a million rows. Sizes follow LMSys-Chat-1M's shape:
    # user turns of tens of words (varying about 10x), assistant answers of a few hundred words.
    users = [_sentence(rng, rng.randint(6, 60)) for _ in range(20000)]
    answers = [" ".join(_sentence(rng, rng.randint(8, 20)) for _ in range(rng.randint(3, 25))) for _ in range(20000)]
    paths = []
    per = -(-rows // files)
    for f in range(files):
        n = max(0, min(per, rows - f * per))
        conversations, ids, turn_counts = [], [], []
        for i in range(n):
            k = rng.choice(turns)
            conv = []
            for _ in range(k):
                conv.append({"content": rng.choice(users), "role": "user"})
                conv.append({"content": rng.choice(answers), "role": "assistant"})
            conversations.append(conv)
            ids.append(f"{f:02d}{i:08x}")
            turn_counts.append(k)
        table = pa.table(
            {
                "conversation_id": ids,
                "model": ["vicuna-13b"] * n,
                "conversation": conversations,
                "turn": turn_counts,
                "language": ["English"] * n,
                "openai_moderation": [[{"flagged": False}]] * n,
                "redacted": [False] * n,
            }
        )
        path = directory / f"train-{f:05d}-of-{files:05d}-{seed:04x}.parquet"
        pq.write_table(table, path)
        paths.append(path)
    return paths


def write_jsonl(path: str | Path, records: Sequence[Any], *, gz: bool = False) -> Path:
    """Lines of JSON (dicts are encoded; bytes/str are written as they are, for bad lines)."""
    import gzip

    path = Path(path)
    data = b"".join(
        (r if isinstance(r, bytes) else r.encode() if isinstance(r, str) else json.dumps(r).encode()) + b"\n"
        for r in records
    )
    path.write_bytes(gzip.compress(data) if gz else data)
    return path


def batch_lines(path: Path, models: list[str | None], **params: object) -> Path:
    """openai-batch chat lines r0, r1, ... each naming models[i % len(models)] (None: no body.model)."""
    with open(path, "w") as f:
        for i in range(len(models) if not params.get("rows") else int(str(params["rows"]))):
            body: dict[str, object] = {"messages": [{"role": "user", "content": f"Question {i}?"}]}
            body.update({k: v for k, v in params.items() if k != "rows"})
            model = models[i % len(models)]
            if model is not None:
                body["model"] = model
            line = {"custom_id": f"r{i}", "method": "POST", "url": "/v1/chat/completions", "body": body}
            f.write(json.dumps(line) + "\n")
    return path


def text_questions(path: Path, n: int, **extra: object) -> Path:
    """`n` questions, q0 to q{n-1}, in a `question` column beside their `id` (and `extra` columns)."""
    return write_jsonl(path, [{"id": f"q{i}", "question": f"Question {i}?", **extra} for i in range(n)])
