"""Writes the demo's dataset: ~200 LMSys-Chat-1M-shaped conversations (parquet, Hugging Face layout).

The questions are simple on purpose: the demo model (SmolLM2-135M-Instruct on the CPU) answers
them sensibly, so the sample answers printed at the end can be read, not just counted.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

COUNTRIES = [
    "France",
    "Germany",
    "Italy",
    "Spain",
    "Portugal",
    "Japan",
    "China",
    "India",
    "Brazil",
    "Canada",
    "Mexico",
    "Egypt",
    "Kenya",
    "Australia",
    "Norway",
    "Sweden",
    "Finland",
    "Poland",
    "Greece",
    "Turkey",
    "Argentina",
    "Chile",
    "Peru",
    "Ireland",
    "Austria",
    "Belgium",
    "Netherlands",
    "Denmark",
    "Russia",
    "Thailand",
]
TOPICS = [
    "the ocean",
    "autumn leaves",
    "a cup of coffee",
    "the moon",
    "a mountain lake",
    "city lights",
    "a rainy morning",
    "a cat asleep",
    "the first snow",
    "a library",
    "a garden",
    "the desert wind",
]
CONCEPTS = [
    "photosynthesis",
    "gravity",
    "a black hole",
    "inflation",
    "the water cycle",
    "machine learning",
    "democracy",
    "evolution",
    "electricity",
    "the internet",
    "vaccines",
    "climate change",
    "a volcano",
    "an atom",
    "DNA",
    "the stock market",
    "recycling",
    "the solar system",
]
WORDS = ["happy", "big", "fast", "cold", "bright", "quiet", "strong", "old", "simple", "brave"]
TASKS = [
    "Give me three tips for a good night's sleep.",
    "How do I boil an egg?",
    "What are the primary colors?",
    "Suggest a name for a pet goldfish.",
    "What should I pack for a weekend hiking trip?",
    "How many days are there in a leap year?",
    "Write a short thank-you note to a teacher.",
    "What is the boiling point of water in Celsius?",
    "List three fruits that are red.",
    "How can I improve my handwriting?",
]


def questions() -> list[str]:
    out = [f"What is the capital of {c}?" for c in COUNTRIES]
    out += [f"Write a haiku about {t}." for t in TOPICS]
    out += [f"Explain {c} in one or two sentences." for c in CONCEPTS]
    out += [f"Give me a synonym for the word '{w}'." for w in WORDS]
    out += TASKS
    out += [f"What is {a} plus {b}?" for a, b in zip(range(3, 63, 3), range(7, 87, 4), strict=True)]
    out += [f"Tell me one interesting fact about {c}." for c in COUNTRIES]
    out += [f"What language is spoken in {c}?" for c in COUNTRIES]
    out += [f"What is the opposite of '{w}'?" for w in WORDS]
    out += [f"Describe {t} in one sentence." for t in TOPICS]
    out += [f"Why is {c} important?" for c in CONCEPTS]
    return out


def write(directory: Path, files: int = 2) -> int:
    rows = questions()
    directory.mkdir(parents=True, exist_ok=True)
    per = -(-len(rows) // files)
    for i in range(files):
        part = rows[i * per : (i + 1) * per]
        table = pa.table(
            {
                "conversation_id": [f"demo-{i * per + j:04d}" for j in range(len(part))],
                "model": ["demo"] * len(part),
                "conversation": [[{"content": q, "role": "user"}] for q in part],
                "turn": [1] * len(part),
                "language": ["English"] * len(part),
            }
        )
        pq.write_table(table, directory / f"train-{i:05d}-of-{files:05d}.parquet")
    return len(rows)


if __name__ == "__main__":
    target = Path(sys.argv[1] if len(sys.argv) > 1 else ".cache/demo/data")
    print(f"{write(target)} conversations written to {target}")
