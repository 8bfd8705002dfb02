"""The server's driver: each active batch's next step, from what the store says, through the table of moves.

Each round reads the active batches from the store and takes the step each state calls for; an
in_progress step is one tick of the reconcile loop behind `orch watch`. Every step may be taken
again (prepare, plan and launch skip what is done; files are written under ids and times fixed
by the batch), so a server killed at any point and started again carries on.
"""

from __future__ import annotations

import json
import logging
import shutil
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from orchestrator.backends import backend_for
from orchestrator.collect.collect import collect
from orchestrator.core.context import RunContext
from orchestrator.core.errors import InputError, OrchError, SpecError
from orchestrator.core.frozen_spec import freeze_spec, read_stored_spec
from orchestrator.core.layout import RunLayout
from orchestrator.core.lines import BatchError, BatchOutputLine
from orchestrator.core.records import (
    BatchCounts,
    BatchDocument,
    BatchRequestError,
    BatchTokens,
    PrepareRecord,
    cas_update,
    read_batch,
    read_file_record,
    read_record,
)
from orchestrator.core.spec import ModelSpec, RunSpec
from orchestrator.fleet.launch import cancel_workers
from orchestrator.fleet.reconcile import Reconciler
from orchestrator.fleet.start import start_run
from orchestrator.runview.status import answered_so_far
from orchestrator.serve.batch_states import LAYOUT, Outcome, ending_state, transition
from orchestrator.serve.files import save_file
from orchestrator.serve.reuse import earlier_runs, reused_custom_ids
from orchestrator.serve.settings import ServeSettings
from orchestrator.serve.validate import Validation, too_large, validate_input

log = logging.getLogger("orch.serve")

#: The error line for a request never run, by how its batch ended (OpenAI's codes for the first two).
UNANSWERED = {
    "expired": ("batch_expired", "This request could not be executed before the completion window expired."),
    "cancelled": ("batch_cancelled", "This request was not executed because the batch was cancelled."),
    "failed": ("batch_failed", "This request was not executed: the batch's workers failed (see the batch's errors)."),
}


class BatchSteps:
    """The driver's side of the batches of one store: the step each active batch's state calls for."""

    def __init__(self, settings: ServeSettings, clock: Callable[[], float] = time.time):
        self.settings = settings
        self.store = settings.store
        self.clock = clock

    def active_ids(self) -> list[str]:
        return [LAYOUT.id_of(info.key) for info in self.store.list(LAYOUT.active_prefix)]

    def step(self, batch_id: str) -> None:
        """The next step of one active batch, from what the store says now."""
        batch = read_batch(self.store, LAYOUT, batch_id)
        if batch is None or batch.final:
            self.store.delete(LAYOUT.active(batch_id))
            return
        if batch.status == "cancelling":
            self._end(batch, "cancelled")
        elif batch.status == "finalizing":
            self._end(batch, "completed")
        elif batch.ending is not None:
            self._end(batch, batch.ending)
        elif self.clock() >= batch.expires_at:
            ending = self._decide_end(batch, "expired")
            if ending is not None:
                log.info("%s: the completion window (%s) is over", batch_id, batch.completion_window)
                self._end(ending, "expired")
        elif batch.status == "validating":
            self._validate(batch)
        else:
            self._progress(batch)

    def run_context(
        self, batch_id: str, served: dict[str, ModelSpec] | None = None, owner: str | None = None
    ) -> RunContext | None:
        """The batch's run: from the spec frozen into it, or (given the models its lines name) a new
        run's spec frozen now from the server's own (backend, workers, sampling...), the model, and
        openai-batch input. Several models (serve.several_models) make a run of several models:
        each a pool of its own, under the name the lines give (core/pools.py). With serve.reuse, the
        new run reuses the answers of `owner`'s earlier batches (serve/reuse.py)."""
        layout = RunLayout(batch_id)
        stored = read_stored_spec(self.store, layout)
        if stored is not None:
            spec = RunSpec.model_validate({**stored[0], "store": self.settings.spec.store})
            return RunContext(spec, self.store, layout)
        if served is None:
            return None
        # The spec's reuse.from is dropped: a server's batches belong to many API keys, and answers
        # never cross them; only the owner's own batches are reused from (serve.reuse).
        data = self.settings.spec.model_dump(mode="json", exclude={"serve", "reuse"})
        if owner is not None and self.settings.spec.serve.reuse:
            data["reuse"] = {
                "from": earlier_runs(self.store, owner, batch_id),
                "sampled": self.settings.spec.reuse.sampled,
            }
        first = next(iter(served.values()))
        if len(served) > 1:
            data["models"] = {name: model.model_dump(mode="json") for name, model in served.items()}
        data.update(
            run=batch_id,
            model=first.model_dump(mode="json"),
            input={"format": "openai-batch", "max_line_bytes": self.settings.spec.input.max_line_bytes},
            chunking={"rows_per_chunk": self.settings.spec.serve.rows_per_chunk},
        )
        spec = freeze_spec(self.store, layout, RunSpec.model_validate(data))
        return RunContext(spec, self.store, layout)

    def _validate(self, batch: BatchDocument) -> None:
        """1. Check the input file (its size first, then every line). 2. Problems: failed, nothing run.
        3. Otherwise prepare, plan and launch the run, then in_progress."""
        limits = self.settings.spec.serve
        record = read_file_record(self.store, LAYOUT, batch.input_file_id)
        if record is None:
            message = f"The input file {batch.input_file_id} was deleted before the batch could read it."
            self._fail(batch, [BatchRequestError(code="invalid_request", message=message, param="input_file_id")])
            return
        oversize = too_large(record.bytes, limits.max_file_bytes)
        if oversize is not None:
            self._fail(batch, [oversize])
            return
        with tempfile.TemporaryDirectory(prefix="orch-serve-") as tmp:
            path = Path(tmp) / "input.jsonl"
            with self.store.open(LAYOUT.file_content(record.id)) as src, open(path, "wb") as dst:
                shutil.copyfileobj(src, dst)
            result = self._check_lines(batch, path)
            if result is None:
                return
            if result.errors:
                self._fail(batch, result.errors)
                return
            if result.model is None:  # no request line: nothing to run
                self._complete_empty(batch)
                return
            try:
                served = {name: self.settings.models[name] for name in result.named}
                workers = self._start_run(batch, served, path)
            except (InputError, SpecError) as e:
                # Retrying will not help: the request is one this server cannot run.
                self._fail(batch, [BatchRequestError(code="invalid_request", message=str(e))])
                return
        model, total = ", ".join(result.named), result.requests
        # Recorded whatever happened meanwhile: a cancelled batch's files need the model and the total too.
        self._update(batch.id, lambda doc: _set(doc, model=model, request_counts=BatchCounts(total=total)))
        transition(self.store, batch.id, "in_progress", now=int(self.clock()))  # not if cancelled meanwhile
        log.info("%s: %d requests for %s; %d worker(s) launched", batch.id, total, model, workers)

    def _check_lines(self, batch: BatchDocument, path: Path) -> Validation | None:
        """The file's problems, line by line; None when checking it failed, the batch then failed:
        the file would fail the same way at every round, so it is not checked again."""
        spec = self.settings.spec
        try:
            with open(path, "rb") as f:
                return validate_input(
                    f,
                    endpoint=batch.endpoint,
                    models=self.settings.runners,
                    max_requests=spec.serve.max_requests,
                    max_line_bytes=spec.input.max_line_bytes,
                    several=spec.serve.several_models,
                )
        except Exception as e:
            log.exception("%s: checking the input file failed", batch.id)
            message = f"The input file could not be checked ({type(e).__name__}: {e}); nothing was run."
            self._fail(batch, [BatchRequestError(code="invalid_request", message=message)])
            return None

    def _complete_empty(self, batch: BatchDocument) -> None:
        """A batch of 0 requests completes at once, with no files and no run, as OpenAI's does."""
        self._update(batch.id, lambda doc: _set(doc, request_counts=BatchCounts(total=0)))
        transition(self.store, batch.id, "in_progress", now=int(self.clock()))
        ending = self._advance(batch, "finalizing")
        if ending is not None:
            self._end(ending, "completed")

    def _start_run(self, batch: BatchDocument, served: dict[str, ModelSpec], path: Path) -> int:
        """Prepare (once), plan and launch the batch's run; returns the workers launched now."""
        ctx = self.run_context(batch.id, served, batch.owner)
        assert ctx is not None  # made from the served model when new
        # As OpenAI's Batch API does, a request with a bad parameter is that row's error, not the batch's.
        return len(start_run(ctx, [str(path)], check=False, at_most_one_worker_per_chunk=True).launched)

    def _progress(self, batch: BatchDocument) -> None:
        """One reconcile tick; then the end when every chunk is done (or nothing can run), else fresh counts."""
        ctx = self.run_context(batch.id)
        if ctx is None:
            raise OrchError(f"batch {batch.id} is in progress but has no run", where=RunLayout(batch.id).spec)
        report = Reconciler(ctx, backend_for(ctx), on_event=lambda m: log.info("%s: %s", batch.id, m)).tick()
        if report.complete:
            ending = self._advance(batch, "finalizing")
            if ending is not None:
                self._end(ending, "completed")
        elif report.cancelled:  # `orch cancel` on the batch's run: the batch is cancelled too
            ending = self._advance(batch, "cancelling")
            if ending is not None:
                self._end(ending, "cancelled")
        elif report.stuck:
            why = "; ".join(f"worker {w}: {reason}" for w, reason in sorted(report.exhausted.items()))
            error = BatchRequestError(code="workers_failed", message=f"No worker can run the batch: {why}")
            ending = self._decide_end(batch, "failed", [error])
            if ending is not None:
                self._end(ending, "failed")
        else:
            counts, usage = self._live_counts(ctx, batch.request_counts.total)
            if (counts, usage) != (batch.request_counts, batch.usage):
                self._update(batch.id, lambda doc: _set(doc, request_counts=counts, usage=usage))

    def _live_counts(self, ctx: RunContext, total: int) -> tuple[BatchCounts, BatchTokens]:
        """The batch's counts from what its run answered so far, counted as `orch status` counts them
        (runview/status.answered_so_far: chunks with a done marker, the rows set aside and reused at prepare)."""
        answered = answered_so_far(self.store, ctx.layout)
        # Rows answered from earlier batches (serve.reuse) are completed requests that no chunk holds.
        completed = answered.rows - answered.errors + answered.reused
        counts = BatchCounts(total=total, completed=completed, failed=answered.errors + answered.set_aside)
        tokens = answered.tokens
        usage = BatchTokens(
            input_tokens=tokens.prompt_tokens, output_tokens=tokens.generated_tokens, cached_tokens=tokens.cached_tokens
        )
        return counts, usage

    def _end(self, batch: BatchDocument, outcome: str) -> None:
        """1. Stop the workers (unless every chunk is done). 2. Write the output and error files from the
        markers. 3. The final status, its time, the files and the counts. 4. No longer active."""
        ctx = self.run_context(batch.id)
        files: dict[str, Any] = {}
        if ctx is not None and read_record(self.store, ctx.layout.prepare_record, PrepareRecord) is not None:
            if outcome != "completed":
                cancel_workers(ctx)
            files = self._write_files(batch, ctx, outcome)
        transition(self.store, batch.id, outcome, now=int(self.clock()), changes=files)
        self.store.delete(LAYOUT.active(batch.id))
        log.info("%s: %s", batch.id, outcome)

    def _write_files(self, batch: BatchDocument, ctx: RunContext, outcome: str) -> dict[str, Any]:
        """Collect the run (markers only, input order), then split it as OpenAI does: successful lines to
        the output file, failed ones to the error file, with a line for each request never run."""
        ended = {"completed": batch.finalizing_at, "cancelled": batch.cancelling_at}.get(outcome, batch.ending_at)
        created_ms = int(ended if ended is not None else self.clock()) * 1000
        counts = BatchCounts(total=batch.request_counts.total)
        with tempfile.TemporaryDirectory(prefix="orch-serve-") as tmp:
            merged, retry = Path(tmp) / "merged.jsonl", Path(tmp) / "retry.jsonl"
            good, bad = Path(tmp) / "output.jsonl", Path(tmp) / "errors.jsonl"
            tokens = collect(self.store, ctx.layout, merged, retry_out=retry).tokens
            reused = reused_custom_ids(self.store, ctx.layout) if ctx.spec.reuse.runs else set()
            answered: set[str] = set()
            with open(merged, "rb") as lines, open(good, "wb") as good_out, open(bad, "wb") as bad_out:
                for raw in lines:
                    line = BatchOutputLine.model_validate_json(raw)
                    answered.add(str(line.custom_id))
                    body = line.response.body if line.response is not None else None
                    if body is not None and "model" in body and batch.model and not ctx.spec.models:
                        body["model"] = batch.model  # the name the client asked for, not the weights' path
                    if line.failed:
                        counts.failed += 1
                        bad_out.write(line.to_json() + b"\n")
                    else:
                        counts.completed += 1
                        reuse_id = (
                            f"batch_req_{batch.id}-reused-{counts.completed}" if line.custom_id in reused else None
                        )
                        good_out.write(_output_line(line, reuse_id) + b"\n")
                if outcome in UNANSWERED:
                    counts.failed += _unanswered(batch.id, outcome, retry, answered, bad_out)
            return {
                "output_file_id": self._save(batch, good, "output", counts.completed, created_ms),
                "error_file_id": self._save(batch, bad, "errors", counts.failed, created_ms),
                "request_counts": counts,
                "usage": BatchTokens(
                    input_tokens=tokens.prompt_tokens,
                    output_tokens=tokens.generated_tokens,
                    cached_tokens=tokens.cached_tokens,
                ),
            }

    def _save(self, batch: BatchDocument, path: Path, kind: str, lines: int, created_ms: int) -> str | None:
        """A batch's output or error file (none when it would be empty, as OpenAI does), under an id
        fixed by the batch: writing it again after a restart rewrites the same file."""
        if lines == 0:
            return None
        file_id = f"file-{batch.id.removeprefix('batch_')}-{kind}"
        save_file(
            self.store,
            owner=batch.owner,
            filename=f"{batch.id}_{kind}.jsonl",
            purpose="batch_output",
            path=path,
            file_id=file_id,
            created_ms=created_ms,
        )
        return file_id

    def _fail(self, batch: BatchDocument, errors: list[BatchRequestError]) -> None:
        """Validation failed: the batch is failed with its problems, and nothing was launched."""
        failed = transition(self.store, batch.id, "failed", now=int(self.clock()), changes={"errors": errors})
        if failed.outcome is Outcome.APPLIED:  # not if cancelled meanwhile: that is next
            self.store.delete(LAYOUT.active(batch.id))
            first = errors[0].message if errors else "none listed"
            log.info("%s: failed validation (%d problem(s), first: %s)", batch.id, len(errors), first)

    def _decide_end(
        self, batch: BatchDocument, ending: str, errors: list[BatchRequestError] | None = None
    ) -> BatchDocument | None:
        """Record an end (expired, failed) while the status still reads in_progress; None when the
        batch moved meanwhile."""
        changes = {"errors": errors} if errors else None
        decided = transition(self.store, batch.id, ending_state(ending), now=int(self.clock()), changes=changes)
        return decided.batch if decided.outcome.there else None

    def _advance(self, batch: BatchDocument, status: str) -> BatchDocument | None:
        """in_progress -> finalizing or cancelling; None when the batch moved meanwhile."""
        moved = transition(self.store, batch.id, status, now=int(self.clock()))
        return moved.batch if moved.outcome.there else None

    def _update(self, batch_id: str, change: Callable[[BatchDocument], object]) -> BatchDocument:
        """Fields other than the status (counts, usage, the model), unless the batch is final."""

        def apply(doc: BatchDocument | None) -> BatchDocument | None:
            if doc is None or doc.final:
                return None
            change(doc)
            return doc

        doc, _ = cas_update(self.store, LAYOUT.batch(batch_id), BatchDocument, apply)
        if doc is None:
            raise OrchError(f"batch {batch_id} has no document", where=LAYOUT.batch(batch_id))
        return doc


class Driver:
    """The server's loop: a round over the active batches every poll interval, or sooner when woken."""

    def __init__(self, batches: BatchSteps, interval: float):
        self.batches = batches
        self.interval = interval
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="orch-serve-driver", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 10.0) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout)

    def wake(self) -> None:
        self._wake.set()

    def _run(self) -> None:
        while not self._stop.is_set():
            self.round()
            self._wake.wait(self.interval)
            self._wake.clear()

    def round(self) -> None:
        """Each active batch's next step. A failing step is logged and tried again next round: a store
        or backend that is unreachable now may answer then."""
        try:
            active = self.batches.active_ids()
        except OrchError as e:
            log.warning("cannot list the active batches: %s (trying again)", e)
            return
        for batch_id in active:
            if self._stop.is_set():
                return
            try:
                self.batches.step(batch_id)
            except OrchError as e:
                log.warning("%s: %s%s (trying again)", batch_id, e, f"; hint: {e.hint}" if e.hint else "")
            except Exception:
                log.exception("%s: unexpected error (trying again)", batch_id)


def _unanswered(batch_id: str, outcome: str, retry: Path, answered: set[str], out: Any) -> int:
    """An error line for each request of the retry file (failed or missing) that no line answered."""
    code, message = UNANSWERED[outcome]
    count = 0
    with open(retry, "rb") as requests:
        for n, raw in enumerate(requests):
            custom_id = json.loads(raw).get("custom_id")
            if custom_id in answered:
                continue
            line = BatchOutputLine(
                id=f"batch_req_{batch_id}-{n}", custom_id=custom_id, error=BatchError(code=code, message=message)
            )
            out.write(line.to_json() + b"\n")
            count += 1
    return count


def _output_line(line: BatchOutputLine, reuse_id: str | None) -> bytes:
    """A line of the output file; one answered by an earlier batch says so (`"reused": true`) under
    an `id` of this batch (the earlier one's could equal the id of a line this batch ran)."""
    if reuse_id is None:
        return line.to_json()
    # The field goes last, spliced in, so the rest of the line is byte for byte the earlier one's.
    return line.model_copy(update={"id": reuse_id}).to_json()[:-1] + b',"reused":true}'


def _set(doc: BatchDocument, **fields: Any) -> BatchDocument:
    for name, value in fields.items():
        setattr(doc, name, value)
    return doc
