"""collect's part of answer reuse: the rows prepare answered from earlier runs, and the run's index.

ReusedAnswers puts each reused row's answer in its input place: the source run's output line (read
from the parts its done marker lists, one source chunk at a time: reused/sources.bin is in source
order), under this row's own custom_id (reused/ids.jsonl, in input order, applied as the lines are
written in input order), marked reused in a table. AnswerIndexBuilder gathers the keys of the rows
answered without error (this run's and the reused ones) and writes the run's answer index, so a
later run can reuse them in turn.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

import orjson

from orchestrator.collect.input_order import InputOrder
from orchestrator.core.errors import CorruptOutput
from orchestrator.core.layout import RunLayout
from orchestrator.core.lines import BatchOutputLine
from orchestrator.core.records import ManifestEntry, PrepareRecord, ReuseRecord, read_manifest, read_record
from orchestrator.core.store import NotFound, Store
from orchestrator.prepare.answers.answer_index import keys_of, record_dtype, run_number, write_index
from orchestrator.prepare.answers.answer_keys import LineKeys
from orchestrator.prepare.answers.reuse import sources_dtype
from orchestrator.runview.chunk_answers import chunk_answers
from orchestrator.runview.positions import InputPositions
from orchestrator.runview.tokens import TokenCounts

if TYPE_CHECKING:
    import numpy.typing as npt

    from orchestrator.collect.report import CollectReport
    from orchestrator.planning.pricing import GpuTable

Write = Callable[..., None]


class ReusedAnswers:
    """The run's reused rows (None from `load` when prepare reused nothing)."""

    def __init__(self, store: Store, layout: RunLayout, record: ReuseRecord):
        import numpy as np

        self.store, self.layout, self.record = store, layout, record
        self.rows = self._read(layout.reused_sources, record.sources_sha256)
        self.rows = np.frombuffer(self.rows, dtype=sources_dtype())
        self.ids = self._read(layout.reused_ids, record.ids_sha256)
        self.saved = [TokenCounts() for _ in record.runs]

    @classmethod
    def load(cls, store: Store, layout: RunLayout) -> ReusedAnswers | None:
        found = read_record(store, layout.reuse_record, ReuseRecord)
        return cls(store, layout, found[0]) if found is not None and found[0].rows else None

    def _read(self, key: str, sha256: str) -> Any:
        try:
            data = self.store.get(key).data
        except NotFound:
            raise self._damaged(key, "is missing") from None
        if hashlib.sha256(data).hexdigest() != sha256:
            raise self._damaged(key, "does not match the checksum in reuse.json")
        return data

    def _damaged(self, key: str, what: str) -> CorruptOutput:
        return CorruptOutput(
            f"{key} {what}: collect cannot place the rows answered by earlier runs",
            where=self.layout.reuse_record,
            hint="prepare the input again under a new --run name (with the same --reuse-from)",
        )

    def sink(self, write: Write) -> Callable[[BatchOutputLine, int | None], None]:
        """What InputOrder writes through: a reused row's line gets the row's own custom_id."""
        import numpy as np

        positions = iter(np.sort(self.rows["position"]).tolist())
        ids = iter(self.ids.splitlines())
        upcoming = [next(positions, None)]

        def add(line: BatchOutputLine, position: int | None) -> None:
            if position is None or position != upcoming[0]:
                write(line, position)
                return
            custom_id = orjson.loads(next(ids))
            upcoming[0] = next(positions, None)
            write(line.model_copy(update={"custom_id": custom_id}), position, reused=True)

        return add

    def place(self, ordered: InputOrder, positions: InputPositions, report: CollectReport) -> None:
        """Each reused row's answer at its position, read one source chunk at a time."""
        positions.reserve(self.rows["position"].tolist())
        manifests: dict[str, list[ManifestEntry]] = {}  # a source run's, read once
        for source, chunk_number, group in self._groups():
            layout = RunLayout(self.record.runs[source])
            answers = self._source_answers(layout, chunk_number, manifests)
            for row, position in group:
                line = answers.get(row)
                if line is None or line.failed:
                    raise self._gone(layout, f"row {row} of chunk {chunk_number} has no answer")
                ordered.add(line, position)
                usage = line.usage()
                self.saved[source].add(usage.prompt_tokens, usage.cached_tokens, usage.completion_tokens)
            ordered.end_run()
        report.reused = len(self.rows)
        report.rows_total += len(self.rows)
        report.rows_written += len(self.rows)
        for saved in self.saved:
            report.tokens_saved.add(saved.prompt_tokens, saved.cached_tokens, saved.generated_tokens)

    def usd_saved(self, prices: GpuTable, default_spot: bool) -> float | None:
        """The saved tokens at each source run's realised $ per million tokens (None: no price known)."""
        from orchestrator.runview.status import cost_so_far

        usd: float | None = None
        for run, saved in zip(self.record.runs, self.saved, strict=True):
            if not saved.total:
                continue
            _, bought = cost_so_far(self.store, RunLayout(run), prices=prices, default_spot=default_spot)
            rate = bought.all.usd_per_m_tokens
            if rate is not None:
                usd = (usd or 0.0) + saved.total * rate / 1e6
        return usd

    def engine_s_saved(self) -> float | None:
        """The worker time the reused rows took their source runs: each run's engine seconds per
        generated token (its finished chunks' stats) times the tokens it saved (None: none measured)."""
        from orchestrator.core.protocol.checkpoints import read_chunk_stats

        seconds: float | None = None
        for run, saved in zip(self.record.runs, self.saved, strict=True):
            stats = [s for _, s in read_chunk_stats(self.store, RunLayout(run)).values()]
            generated = sum(s.tokens_out for s in stats)
            if saved.generated_tokens and generated:
                seconds = (seconds or 0.0) + saved.generated_tokens * sum(s.seconds for s in stats) / generated
        return seconds

    def _groups(self) -> Iterator[tuple[int, int, list[tuple[int, int]]]]:
        """(run, chunk, [(row, position), ...]) for each source chunk, in sources.bin's order."""
        import itertools

        rows = self.rows
        columns = (rows["run"].tolist(), rows["chunk"].tolist(), rows["row"].tolist(), rows["position"].tolist())
        records = zip(*columns, strict=True)
        for (run, chunk), group in itertools.groupby(records, key=lambda r: (r[0], r[1])):
            yield run, chunk, [(row, position) for _, _, row, position in group]

    def _source_answers(
        self, layout: RunLayout, chunk_number: int, manifests: dict[str, list[ManifestEntry]]
    ) -> dict[int, BatchOutputLine]:
        if layout.run not in manifests:
            manifests[layout.run] = read_manifest(self.store, layout)
        manifest = manifests[layout.run]
        if chunk_number >= len(manifest):
            raise self._gone(layout, f"its manifest has no chunk number {chunk_number}")
        answers = chunk_answers(self.store, layout, manifest[chunk_number])
        if answers is None:
            raise self._gone(layout, f"{manifest[chunk_number].chunk} has no done marker")
        return answers

    def _gone(self, layout: RunLayout, what: str) -> CorruptOutput:
        return CorruptOutput(
            f"run {layout.run!r}, whose answers this run reuses, changed: {what}",
            where=self.layout.reuse_record,
            hint="prepare the input again under a new --run name (the reuse is then looked up anew)",
        )


def _line_keys(store: Store, layout: RunLayout) -> dict[str, LineKeys]:
    """Each model pool's line keys as the run's prepare recorded them (several models, a sweep), or the
    run's one model's under "" (none: prepared by an orch that kept no key digest)."""
    found = read_record(store, layout.prepare_record, PrepareRecord)
    if found is None:
        return {}
    record = found[0]
    digests = dict(record.key_digests)
    if record.key_digest:
        digests[""] = record.key_digest
    return {pool: LineKeys(bytes.fromhex(d), record.key_adapters.get(pool, ())) for pool, d in digests.items()}


class AnswerIndexBuilder:
    """The keys of the rows answered without error, gathered chunk by chunk, written at the end."""

    def __init__(self, store: Store, layout: RunLayout, reused: ReusedAnswers | None):
        self.store, self.layout, self.reused = store, layout, reused
        self.parts: list[npt.NDArray[Any]] = []
        self.keys = _line_keys(store, layout)
        self.runs = [layout.run]

    def add_chunk(
        self,
        number: int,
        answered: list[tuple[int, bytes]],
        model: str | None = None,
        *,
        keys: dict[str, LineKeys] | None = None,
        run: int = 0,
    ) -> None:
        """Chunk `number` of the manifest (of `model`'s pool): its rows answered without an error,
        with their request lines; `keys` and `run` for another run's chunk (add_run)."""
        import numpy as np

        keys_of_pool = (self.keys if keys is None else keys).get(model or "")
        if keys_of_pool is None or not answered:
            return
        found = keys_of(b"".join(keys_of_pool.of_line(line) for _, line in answered))
        records = np.zeros(len(found), dtype=record_dtype())
        records["hi"], records["lo"], records["chunk"], records["run"] = found["hi"], found["lo"], number, run
        records["row"] = [row for row, _ in answered]
        self.parts.append(records)

    def add_run(self, layout: RunLayout) -> None:
        """Another run's answered rows, keyed under its own models' contexts: a cascade's later stage
        (a run of its own, never collected alone), so a later run reuses its answers as it reuses
        this one's."""
        keys = _line_keys(self.store, layout)
        if not keys:
            return
        self.runs.append(layout.run)
        for number, entry in enumerate(read_manifest(self.store, layout)):
            lines = chunk_answers(self.store, layout, entry)
            if lines is None:
                continue
            requests = self.store.get(layout.chunk(entry.chunk)).data.splitlines(keepends=True)
            answered = [(row, requests[row]) for row, line in sorted(lines.items()) if not line.failed]
            self.add_chunk(number, answered, entry.model, keys=keys, run=len(self.runs) - 1)

    def write(self, chunks_done: int) -> None:
        import numpy as np

        if not self.keys:
            return  # prepared by an orch that kept no key digest
        if self.reused is not None:
            rows = self.reused.rows
            numbers = np.array([run_number(self.runs, run) for run in self.reused.record.runs], dtype=np.uint16)
            records = np.zeros(len(rows), dtype=record_dtype())
            for name in ("hi", "lo", "chunk", "row"):
                records[name] = rows[name]
            records["run"] = numbers[rows["run"]]
            self.parts.append(records)
        merged = np.concatenate(self.parts) if self.parts else np.zeros(0, dtype=record_dtype())
        write_index(self.store, self.layout, merged, self.runs, self._context(), chunks_done)

    def _context(self) -> str:
        """The index's context (for diagnosis): the key digest, or a digest of each pool's."""
        if list(self.keys) == [""]:
            return self.keys[""].digest.hex()[:32]
        pools = sorted((pool, keys.digest.hex()) for pool, keys in self.keys.items())
        return hashlib.blake2b(orjson.dumps(pools), digest_size=16).hexdigest()
