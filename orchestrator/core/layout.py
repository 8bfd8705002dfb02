"""Where each object of a run lives in the store: the one place key names are spelled out."""

from __future__ import annotations

import functools
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote, unquote

#: A run's name, the one pattern every path that takes one holds it to (flags, spec files, the
#: environment, `--reuse-from`, serve's batch ids, a store's listing): matched whole, so no
#: trailing newline or other control character gets in (`$` would match before a final "\n").
_RUN_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,99}")
RUN_NAME_RULE = "letters, digits, '.', '_' and '-' (at most 100), starting with a letter or digit"


def run_name_problem(name: object) -> str | None:
    """What is wrong with `name` as a run's name (the rule it breaks), or None."""
    if isinstance(name, str) and _RUN_NAME.fullmatch(name):
        return None
    return f"not a run name: {RUN_NAME_RULE}"


def check_run_name(name: str) -> str:
    """`name`, or a SpecError saying what is wrong with it."""
    problem = run_name_problem(name)
    if problem is not None:
        from orchestrator.core.errors import SpecError

        raise SpecError(f"{name!r} is {problem}", where="run")
    return name


def chunk_id(index: int, total: int) -> str:
    """`part_00042`: zero-padded so that listings come back in chunk order."""
    return f"part_{index:0{max(5, len(str(max(total - 1, 0))))}d}"


@dataclass(frozen=True)
class RunLayout:
    """Keys of one run, all under `runs/<run>/`. The prefixes every claim and listing uses are
    made once per layout (a frozen dataclass: `cached_property` stores them beside the fields)."""

    run: str

    def __post_init__(self) -> None:
        check_run_name(self.run)

    @functools.cached_property
    def root(self) -> str:
        return f"runs/{self.run}/"

    # Written by prepare and plan.
    @property
    def spec(self) -> str:
        return f"{self.root}spec.yaml"

    @property
    def manifest(self) -> str:
        return f"{self.root}manifest.jsonl"

    @property
    def metadata(self) -> str:
        return f"{self.root}metadata.txt"

    @property
    def prepare_errors(self) -> str:
        return f"{self.root}prepare-errors.jsonl"

    @property
    def prepare_record(self) -> str:
        return f"{self.root}prepare.json"

    @property
    def plan(self) -> str:
        return f"{self.root}plan.json"

    def chunk(self, chunk: str) -> str:
        return f"{self.root}chunks/{chunk}.jsonl"

    def handed_input(self, name: str) -> str:
        """Data a Python caller handed over in memory (a DataFrame, rows), kept as the run's input
        file: prepare reads it from here, and any process (attach, collect's kept columns) finds it."""
        return f"{self.root}input/{name}"

    def schema(self, digest: str) -> str:
        """The spec's JSON schema, by its SHA-256: spec.yaml and request lines reference it (core/request/)."""
        return f"{self.root}schemas/{digest}.json"

    # Written by `orch estimate`.
    @property
    def probe(self) -> str:
        """ProbeRecord: the probe chunk, its rows' strata and what it measured (the first candidate's)."""
        return f"{self.root}probe.json"

    def probe_of(self, target: str) -> str:
        """ProbeRecord of a further candidate, each probed on its own: an accelerator (SkyPilot), a
        model pool, or both (`<pool>-<gpu>`)."""
        return f"{self.probes_prefix}{target}.json"

    @property
    def probes_prefix(self) -> str:
        return f"{self.root}probe-"

    @property
    def forecast(self) -> str:
        """ForecastRecord: the forecast the run was launched on, and how right it was."""
        return f"{self.root}forecast.json"

    def chunk_positions(self, chunk: str) -> str:
        """Grouped by prefix: the input position of each of the chunk's rows, one a line."""
        return f"{self.root}chunks/{chunk}.positions"

    @property
    def reuse_record(self) -> str:
        """ReuseRecord: the rows prepare answered from earlier runs (prepare/answers/reuse.py)."""
        return f"{self.root}reuse.json"

    @property
    def reused_sources(self) -> str:
        """Reused rows: (input position, source run, chunk, row), binary, in source order."""
        return f"{self.root}reused/sources.bin"

    @property
    def reused_ids(self) -> str:
        """Reused rows' custom_ids, one JSON string a line, in input order."""
        return f"{self.root}reused/ids.jsonl"

    @property
    def answer_index(self) -> str:
        """AnswerIndex: the run's sorted answer keys, written by collect (prepare/answers/answer_index.py)."""
        return f"{self.root}answers/index.json"

    @property
    def answer_index_prefix(self) -> str:
        return f"{self.root}answers/"

    def answer_index_part(self, generation: str, part: int) -> str:
        """One partition of an index generation; only the generation index.json names is read."""
        return f"{self.root}answers/{generation}/{part:05d}.bin"

    def chunk_path(self, chunk: str) -> str:
        """The chunk's path relative to the run, as metadata.txt and workers/<i>.txt list it."""
        return f"chunks/{chunk}.jsonl"

    def worker_list(self, worker: str) -> str:
        return f"{self.root}workers/{worker}.txt"

    # Written by workers.
    @functools.cached_property
    def leases_prefix(self) -> str:
        return f"{self.root}leases/"

    def lease(self, chunk: str) -> str:
        return f"{self.leases_prefix}{chunk}.json"

    @functools.cached_property
    def outputs_root(self) -> str:
        return f"{self.root}outputs/"

    def outputs_prefix(self, chunk: str) -> str:
        return f"{self.outputs_root}{chunk}/"

    def output_part(self, chunk: str, holder: str, seq: int, ext: str = "jsonl", rows: int | None = None) -> str:
        """`<holder>-<seq>.<rows>rows.<ext>`: the row count in the name lets `status` count the
        checkpointed rows of unfinished chunks from one listing (`part_rows`)."""
        counted = f".{rows}rows" if rows is not None else ""
        return f"{self.outputs_prefix(chunk)}{holder}-{seq:05d}{counted}.{ext}"

    @functools.cached_property
    def done_prefix(self) -> str:
        return f"{self.root}done/"

    def done(self, chunk: str) -> str:
        return f"{self.done_prefix}{chunk}.json"

    @functools.cached_property
    def stats_prefix(self) -> str:
        return f"{self.root}stats/"

    def stats(self, chunk: str, summary: Sequence[Any], finished_at: float) -> str:
        """`stats/<finished ms>.<chunk>.<summary>`: flat and in time order, so a worker lists only
        the chunks finished since it last looked (`stats_since`), and `status` reads every
        chunk's numbers from listings alone."""
        return f"{self.stats_prefix}{int(finished_at * 1000):013d}.{chunk}.{encode_key_record(summary)}"

    def stats_since(self, t: float) -> str:
        """A `start_after` key for listing the stats of chunks finished at or after time `t`."""
        return f"{self.stats_prefix}{max(int(t * 1000) - 1, 0):013d}/"

    def parse_stats(self, key: str) -> tuple[float, str, str]:
        """(finished_at, chunk, encoded summary) from a stats key. Raises ValueError for other keys."""
        millis, chunk, encoded = key[len(self.stats_prefix) :].split(".", 2)
        return int(millis) / 1000, chunk, encoded

    @functools.cached_property
    def heartbeats_prefix(self) -> str:
        return f"{self.root}heartbeats/"

    def heartbeat(self, worker: str, summary: Sequence[Any]) -> str:
        return f"{self.heartbeats_prefix}{worker}/{encode_key_record(summary)}"

    # Written by the controller.
    def adapter_manifest(self, name: str) -> str:
        """A LoRA adapter shipped with the run: the list of its files (AdapterManifest), written last."""
        return f"{self.root}adapters/{quote(name, safe='')}.json"

    def adapter_file(self, name: str, path: str) -> str:
        """One file of a shipped adapter, at its path relative to the adapter's directory."""
        return f"{self.root}adapters/{quote(name, safe='')}/{path}"

    @property
    def jobs(self) -> str:
        return f"{self.root}jobs.json"

    @property
    def zones(self) -> str:
        """What each zone did for the run's spot workers (records/zones.py)."""
        return f"{self.root}zones.json"

    @property
    def cancel(self) -> str:
        """Present from `orch cancel` until the next launch: every worker of the run stops."""
        return f"{self.root}cancel.json"

    @property
    def decisions_prefix(self) -> str:
        return f"{self.root}decisions/"

    def decision(self, at: float) -> str:
        """The deadline policy's log: one object per decision, in time order."""
        return f"{self.decisions_prefix}{int(at * 1000):013d}.json"

    # Reading keys back.
    def chunk_of(self, key: str, prefix: str) -> str:
        """The chunk id in `<prefix><chunk>.json` or `<prefix><chunk>/...`."""
        rest = key[len(prefix) :]
        return rest.split("/", 1)[0].removesuffix(".json")


#: Index keys sort newest first: this minus the creation time in milliseconds, zero-padded.
_NEWEST_FIRST = 10**13


@dataclass(frozen=True)
class ServeLayout:
    """Keys of `orch serve`'s own objects, all under `serve/`. A batch is also a run: its run's keys
    are those of `RunLayout(<batch id>)`.

    Ownership: every file and batch document names its owner (a hash of the API key that made it,
    never the key), and `owners/<owner>/<kind>/` lists each owner's objects, newest first, so a
    listing reads only that owner's documents.
    """

    root: str = "serve/"

    def file(self, file_id: str) -> str:
        """A file's document (its OpenAI file object and owner)."""
        return f"{self.root}files/{file_id}.json"

    def file_content(self, file_id: str) -> str:
        """A file's bytes, as uploaded (or as the server wrote a batch's output)."""
        return f"{self.root}files/{file_id}.content"

    def batch(self, batch_id: str) -> str:
        return f"{self.root}batches/{batch_id}.json"

    @property
    def active_prefix(self) -> str:
        """One empty object per batch not yet in a final state: what the server drives after a restart."""
        return f"{self.root}active/"

    def active(self, batch_id: str) -> str:
        return f"{self.active_prefix}{batch_id}"

    def idempotency(self, owner: str, key_hash: str) -> str:
        """The batch a POST /v1/batches with this Idempotency-Key (by its hash) made for this owner."""
        return f"{self.root}idempotency/{owner}/{key_hash}.json"

    def owned_prefix(self, owner: str, kind: str) -> str:
        """`kind` is `files` or `batches`."""
        return f"{self.root}owners/{owner}/{kind}/"

    def owned(self, owner: str, kind: str, created_ms: int, object_id: str) -> str:
        """An owner's index entry for one object: flat, newest first, so `start_after` pages through it."""
        return f"{self.owned_prefix(owner, kind)}{_NEWEST_FIRST - created_ms:013d}.{object_id}"

    @staticmethod
    def id_of(key: str) -> str:
        """The object id at the end of an index or active key."""
        return key.rsplit("/", 1)[-1].split(".", 1)[-1]


def part_rows(key: str) -> int | None:
    """The row count an output part's name carries (`output_part`); None for a name without one."""
    parts = key.rsplit("/", 1)[-1].rsplit(".", 2)
    count = parts[1] if len(parts) == 3 else ""
    return int(count[:-4]) if count.endswith("rows") and count[:-4].isdigit() else None


#: Separates the values of a key record. `quote(..., safe="")` always escapes it, so it never
#: appears inside a value, and it is on S3's list of characters safe in keys.
_SEP = "!"
_KEY_RECORD_VERSION = "v1"
#: Values made only of these need no escaping (most do: ids, states, numbers).
_PLAIN = re.compile(r"[A-Za-z0-9._~-]*\Z")
#: A path component longer than 255 bytes is refused by local file systems.
_MAX_KEY_RECORD = 200


def encode_key_record(values: Sequence[Any]) -> str:
    """A small record packed into a key name: `v1!value!value...`, percent-encoded, positional.

    Used for objects `status` and the claimers must read for every worker and chunk: one list
    request returns 1,000 keys, where reading bodies would cost one request per object.
    """
    parts = [_KEY_RECORD_VERSION]
    for value in values:
        if value is None:
            parts.append("")
        elif isinstance(value, bool):
            parts.append("1" if value else "0")
        elif isinstance(value, float):
            parts.append(f"{value:.6g}" if abs(value) < 1e6 else f"{value:.1f}")
        else:
            text = str(value)[:64]
            parts.append(text if _PLAIN.match(text) else quote(text, safe=""))
    text = _SEP.join(parts)
    if len(text) > _MAX_KEY_RECORD:
        raise ValueError(f"key record too long ({len(text)} characters): {text[:80]}...")
    return text


def decode_key_record(text: str, fields: Sequence[str]) -> dict[str, Any]:
    """The values of a key record by field name, as strings (None for empty); a model validates them.

    A record written before later fields were appended simply lacks them (the model's defaults
    apply). Raises ValueError for a record of another version, or with more values than fields."""
    version, *values = text.split(_SEP)
    if version != _KEY_RECORD_VERSION or len(values) > len(fields):
        raise ValueError(f"not a {_KEY_RECORD_VERSION} key record of {len(fields)} fields: {text[:60]}")
    return {f: (unquote(v) if v else None) for f, v in zip(fields, values, strict=False)}
