"""The probe's sample: its size follows the engine the run uses (each engine bounds its batch by its
own engine_args key), and its rows go to the engine longest first."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from orchestrator.controller.probe_carve import ENGINE_BATCH_DEFAULT, SampledRow, engine_batch, sample_rows
from orchestrator.controller.probe_work import units_until
from orchestrator.core.context import RunContext
from orchestrator.core.protocol.layout import RunLayout
from orchestrator.core.spec import RunSpec
from orchestrator.core.store import open_store


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


def test_probe_rows_go_longest_first_so_the_longest_does_not_run_on_alone_at_the_end():
    # A heavy-tailed run: max_tokens of 6 x a Pareto draw, up to 160 (bench/forecast_bench.py).
    rng = random.Random(7)
    lengths = [min(160, int(6 * rng.paretovariate(1.3))) for _ in range(4400)]
    rows = [SampledRow("c", i, i, b"{}", m, "s") for i, m in enumerate(lengths)]
    picked = sample_rows(rows, 0.01, 16, seed="r")
    assert len(picked) == 44 and len({r.position for r in picked}) == 44
    assert [r.max_tokens for r in picked] == sorted((r.max_tokens for r in picked), reverse=True)
    ties = [r.position for r in picked if r.max_tokens == picked[-1].max_tokens]
    assert ties == sorted(ties)  # input order among equals
    # Fewer engine steps (all-fixed steps: an emptied engine's step costs a full one) than in input order.
    longest_first = units_until([r.max_tokens for r in picked], 8, 1.0)
    input_order = units_until([r.max_tokens for r in sorted(picked, key=lambda r: r.position)], 8, 1.0)
    assert longest_first < input_order
