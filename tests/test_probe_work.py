"""What a probe's few batches cost against a run's full ones: slot-steps, cache hits, shared cores."""

from __future__ import annotations

import io
import random
import statistics

import pytest

from orchestrator.core.records.forecast import ProbeRecord, RowSample, StratumCount
from orchestrator.planning import forecast
from orchestrator.planning.forecast import local_parallelism, probe_units, work_seconds
from orchestrator.planning.probe_work import (
    StaticRow,
    run_cached_share,
    slot_schedule,
    static_batches,
    static_units,
    units_until,
)


def test_slot_schedule_admits_rows_in_order_as_slots_free():
    # Two slots: rows of 5, 1, 1, 3 steps. The third row takes the slot the second freed at step 1.
    assert slot_schedule([5, 1, 1, 3], 2) == [(0, 5), (0, 1), (1, 2), (2, 5)]


def test_units_until_counts_a_part_empty_step_as_a_full_one_where_the_step_is_all_fixed():
    # 8 slots, one row of 160 tokens and seven of 10: 160 steps, 230 tokens.
    lengths = [160] + [10] * 7
    assert units_until(lengths, 8, 1.0) == 8 * 160
    assert units_until(lengths, 8, 0.0) == 230  # all per row: a token is a token
    assert units_until(lengths, 8, 0.5) == pytest.approx(0.5 * 1280 + 0.5 * 230)
    # Full batches cost one unit a token whatever the fixed share.
    assert units_until([16] * 16, 8, 1.0) == units_until([16] * 16, 8, 0.3) == 256
    # Up to the step the 8th row finished: the 7 short rows end at 10, the next row starts at 10.
    assert units_until([*lengths, 10], 8, 1.0, rows_done=8) == 8 * 20


def _sample(stratum: str, completion: int, cached: int = 0, prompt: int = 100) -> RowSample:
    return RowSample(
        stratum=stratum,
        est_prompt_tokens=prompt,
        prompt_tokens=prompt,
        cached_tokens=cached,
        completion_tokens=completion,
        max_tokens=completion,
        hit_max=True,
    )


def _heavy_tailed_probe(busy_s: float, **update: object) -> ProbeRecord:
    """16 probe rows, one of 160 tokens and fifteen of 10, run 8 at a time, of a run of 1,600 such rows."""
    return ProbeRecord(
        chunk="p",
        rows=16,
        share=0.01,
        strata={"s": StratumCount(rows=1600, max_tokens=31000, est_prompt_tokens=160000)},
        created_at=0.0,
        busy_s=busy_s,
        engine_batch=8,
        samples=[_sample("s", 160)] + [_sample("s", 10)] * 15,
    ).model_copy(update=update)


def test_heavy_tailed_probe_forecasts_the_rate_of_full_batches():
    # 16 probe rows: one of 160 tokens, fifteen of 10, run at 8 at a time. The engine took 1 ms a
    # full step (8 tokens): the 160-step probe took 0.16 s. Counted in tokens (what the forecast did
    # before) the rate is 0.16 s / 310 tokens, 4x the 1/8 ms a token of a run at full batches.
    probe = _heavy_tailed_probe(0.16 + 0.05 * 1600 / 8000)
    assert probe_units(probe, 1.0) == pytest.approx(8 * 160 + 0.05 * 1600)
    draws = [work_seconds(probe, random.Random(seed))[0] for seed in range(200)]
    # The rows left: 1,584 rows of 31000 * 1584 / 1600 tokens in all, at 1/8 ms a token (+ prefill).
    full = (31000 - 310) / 8000 + 0.05 * (160000 - 1600) / 8000
    assert 0.8 * full < statistics.median(draws) < 1.6 * full
    untouched = probe.model_copy(update={"engine_batch": None})
    assert statistics.median(work_seconds(untouched, random.Random(s))[0] for s in range(200)) > 3 * full


def test_static_batches_replay_picks_by_length_from_a_pool_of_two_batches():
    # Batches of 2 from a pool of 4. Sent: short, long, short, long, short, short. The first batch is
    # the oldest (short) and the closest in length (the other short); the long rows go together
    # once the pool refills, not in send order (which would give two batches of 20 steps).
    short, long = (10, 2, 2), (10, 20, 20)
    rows = [StaticRow(*r) for r in (short, long, short, long, short, short)]
    assert static_batches(rows, 2) == [(2, 2), (2, 20), (2, 2)]
    assert static_units(rows, 2, 1.0) == 2 * 2 + 2 * 20 + 2 * 2
    assert static_units(rows, 2, 1.0, rows_done=2) == 2 * 2  # the first batch alone
    # A part-empty batch costs its fixed share of the full batch.
    assert static_units(rows[:1], 2, 0.5) == 2 * (0.5 * 2 + 0.5 * 1)


def test_a_static_batch_probe_forecasts_the_batches_its_run_will_run():
    # The transformers engine runs a batch until its longest row ends. 16 probe rows, 8 a batch, in
    # one pool: the 160-token row holds its batch of 8 for 160 steps, the other batch runs 10 (85
    # steps a row). In the run, one row in 16 is that long: about 64% of its pools of 16 hold one
    # (1 - (15/16)^16), so a row costs more than the 19.4 tokens it makes on average and less than
    # the probe's 85 steps. Counted as a continuous engine (vLLM refills a finished row's slot) the
    # run's rows would cost their tokens alone.
    probe = _heavy_tailed_probe(1.0, static_batches=True)
    per_row = statistics.median(work_seconds(probe, random.Random(seed))[0] for seed in range(100)) / 1584
    assert 0.4 / 16 < per_row < 0.9 / 16  # the probe: 1 s for 16 rows
    continuous = probe.model_copy(update={"static_batches": False})
    assert statistics.median(work_seconds(continuous, random.Random(s))[0] for s in range(100)) / 1584 < 0.75 * per_row


def test_run_cached_share_counts_the_hits_the_run_will_have_not_the_probes():
    # 4 prefix groups; the probe's 16 rows hit on 12 (512 of 640 tokens each); the run has 1,100
    # rows of those groups on 2 workers: all but 8 hit.
    samples = [_sample(f"p9.m4.g{i % 4}", 24, cached=0 if i < 4 else 512, prompt=640) for i in range(16)]
    strata = {f"p9.m4.g{g}": StratumCount(rows=275) for g in range(4)}
    assert run_cached_share(samples, strata, 2) == pytest.approx(0.8 * 1092 / 1100)
    # Rows that share nothing: the probe's own share (a chat template's head) is kept.
    lone = [_sample(f"p9.m4.x{i}", 24, cached=16 * (i > 0)) for i in range(4)]
    assert run_cached_share(lone, {x.stratum: StratumCount(rows=1) for x in lone}, 2) == pytest.approx(0.12)
    assert run_cached_share([_sample("s", 24)], {"s": StratumCount(rows=9)}, 2) == 0.0


def test_local_parallelism_charges_oversubscribed_cores(monkeypatch):
    monkeypatch.setattr(forecast.os, "cpu_count", lambda: 2)
    assert local_parallelism(1, 1) == 1.0
    low, high = forecast.SHARED_CORE_EFFICIENCY
    assert local_parallelism(2, 1, (0.0, 0.0)) == pytest.approx(2 * low)
    assert local_parallelism(2, 1, (1.0, 0.0)) == pytest.approx(2 * high)
    assert local_parallelism(2, 1) == pytest.approx(low + high)  # the middle of the range
    # Four single-thread workers on two cores: two at a time, and what switching costs (drawn too).
    over_low = forecast.OVERSUBSCRIBED_EFFICIENCY[0]
    assert local_parallelism(4, 1, (0.0, 0.0)) == pytest.approx(2 * low * over_low)
    assert local_parallelism(4, 1, (0.0, 0.0)) < local_parallelism(4, 1, (0.0, 1.0)) == local_parallelism(2, 1, (0, 0))


def test_probe_work_replays_the_rows_in_the_order_the_worker_fed_its_engine():
    """The worker sends a chunk's rows by prefix (worker/chunks.py), not as written: a probe whose
    longest row went in last ran part-empty at its end, one whose longest went in first did not.
    Counted in the order as written, the heavy-tailed bench's forecast was +82% (run 7)."""
    from orchestrator.core.prefix import feed_order
    from worker.chunks import _windows

    # Written: short rows, then the long one; their prefixes send the long one first.
    lines = [b'{"body": {"messages": "b%d"}}' % i for i in range(8)] + [b'{"body": {"messages": "a"}}']
    order = feed_order(lines)
    assert order[0] == 8
    (window,) = _windows(io.BytesIO(b"\n".join(lines) + b"\n"), set(), 4096)
    assert [index for index, _ in window] == order  # the worker's own order
    rank = {row: place for place, row in enumerate(order)}
    samples = [_sample("s", 10) for _ in range(8)] + [_sample("s", 160)]
    ranked = [x.model_copy(update={"feed_rank": rank[i]}) for i, x in enumerate(samples)]
    probe = ProbeRecord(chunk="c", rows=9, share=0.01, strata={}, created_at=0.0, engine_batch=8, busy_s=1.0)
    as_written = probe_units(probe.model_copy(update={"samples": samples}), fixed=1.0)
    as_fed = probe_units(probe.model_copy(update={"samples": ranked}), fixed=1.0)
    fed_first, fed_last = units_until([160] + [10] * 8, 8, 1.0), units_until([10] * 8 + [160], 8, 1.0)
    assert fed_first < fed_last and as_written - as_fed == pytest.approx(fed_last - fed_first)


def test_probe_size_stays_within_its_share_unless_asked_for_more():
    from orchestrator.planning.probe_work import probe_size

    assert probe_size(3_000, 0.01, None, 256) == 45  # two batches would be 17%: 1.5% of the run
    assert probe_size(100_000, 0.01, None, 256) == 1_000  # --probe-share's 1% is more than two batches
    assert probe_size(40_000, 0.01, None, 256) == 512  # two batches, 1.28%
    assert probe_size(3_000, 0.01, 512, 256) == 512  # --probe-rows asks for more
    assert probe_size(20, 0.01, None, 256) == 1
    assert all(probe_size(n, 0.01, None, 256) <= max(1, 0.015 * n) for n in range(1, 200_000, 997))
