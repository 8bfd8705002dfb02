"""The probe's sample size follows the engine the run uses: each engine bounds its batch by its own engine_args key."""

from __future__ import annotations

from pathlib import Path

import pytest

from orchestrator.core.context import RunContext
from orchestrator.core.layout import RunLayout
from orchestrator.core.spec import RunSpec
from orchestrator.core.store import open_store
from orchestrator.planning.probe_work import ENGINE_BATCH_DEFAULT, engine_batch


def _context(tmp_path: Path, model: dict[str, object]) -> RunContext:
    spec = RunSpec.model_validate({"run": "r", "store": str(tmp_path), "model": model})
    return RunContext(spec, open_store(str(tmp_path)), RunLayout("r"))


@pytest.mark.parametrize(
    ("model", "batch"),
    [
        ({"name": "m", "engine_args": {"max_num_seqs": 8}}, 8),
        ({"name": "m", "engine": "transformers", "engine_args": {"max_batch_size": 32}}, 32),
        # The other engine's key bounds nothing here: the engine's default holds.
        ({"name": "m", "engine": "transformers", "engine_args": {"max_num_seqs": 8}}, ENGINE_BATCH_DEFAULT),
        ({"name": "m", "engine_args": {"max_batch_size": 32}}, ENGINE_BATCH_DEFAULT),
    ],
)
def test_engine_batch_reads_the_batch_bound_of_the_runs_engine(tmp_path, model, batch):
    assert engine_batch(_context(tmp_path, model)) == batch
