"""What answer reuse keeps in a run: the answer index collect writes, the reuse record prepare writes."""

from __future__ import annotations

from pydantic import Field

from orchestrator.core.records.base import Record


class IndexPart(Record):
    """One object of an answer index: fixed-size records sorted by key (prepare/answers/answer_index.py)."""

    key: str = Field(description="the object's key in the store")
    rows: int
    first: str = Field(description="the first answer key in it, hex")
    last: str = Field(description="the last answer key in it, hex")
    sha256: str = Field(description="SHA-256 of the object as written: a part that differs is refused")


class AnswerIndex(Record):
    """answers/index.json: where the run's answered rows are, by answer key. Written by collect
    after its parts (a new generation each time), so an index.json names only parts written whole."""

    version: int = Field(description="answer_keys.KEY_VERSION of the keys it holds")
    generation: str
    context: str = Field(description="the run's key context digest (hex): for diagnosis only")
    runs: list[str] = Field(description="the runs answers live in: a record's run number indexes this list")
    rows: int
    parts: list[IndexPart]
    chunks_done: int = Field(description="chunks with a done marker when it was written")
    created_at: float


class ReuseSource(Record):
    run: str
    rows: int = Field(description="rows of this run answered from it")


class ReuseRecord(Record):
    """reuse.json, written by prepare before its prepare record: rows answered from earlier runs.
    reused/sources.bin and reused/ids.jsonl say which rows and where their answers are."""

    runs: list[str] = Field(description="the runs a reused row's answer comes from (sources.bin's run numbers)")
    sources: list[ReuseSource] = Field(default_factory=list, description="the runs named by --reuse-from")
    rows: int = Field(description="input rows answered from earlier runs")
    sampled_allowed: bool = False
    sampled_skipped: int = Field(0, description="rows whose key was answered, run again because they sample")
    sources_sha256: str
    ids_sha256: str
