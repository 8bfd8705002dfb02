"""Prometheus metrics of runs, read from their status at scrape time (no counters kept in between).

A custom collector: each scrape asks `statuses()` for the runs to show (through the snapshots, so
a scrape costs the store what a page view does) and turns each `RunStatus` into metric families,
every series labelled with its `run`. Names (all prefixed `orch_`):

    orch_run_complete{run}                       1 once every chunk is done and none damaged
    orch_chunks{run}, orch_chunks_done{run}      chunks in the run, chunks with a done marker
    orch_rows{run}                               rows in the run
    orch_rows_done_total{run}                    rows kept: in finished chunks, or checkpointed (counter)
    orch_rows_in_progress{run}                   rows answered, in workers' memory until their next checkpoint
    orch_row_errors_total{run}                   error rows in finished chunks (counter)
    orch_rows_set_aside{run}                     input rows prepare set aside
    orch_rows_reused{run}                        input rows answered by earlier runs (--reuse-from)
    orch_prompt_tokens_total{run}                prompt tokens of finished chunks (counter)
    orch_cached_tokens_total{run}                of those, the ones the engines' prefix caches held
    orch_generated_tokens_total{run}             generated tokens of finished chunks
    orch_usd_per_m_tokens{run,market}            realised $ per million tokens; market: all | spot | on_demand
    orch_rows_per_second{run}, orch_tokens_per_second{run}   live, summed over working workers
    orch_eta_seconds{run}                        absent while unknown
    orch_cost_usd{run}, orch_worker_hours{run}   so far
    orch_estimate_left_usd{run,market}           market: spot | on_demand (with GPU candidates)
    orch_estimate_left_seconds{run,market}
    orch_workers{run,state}                      workers by job state (RUNNING, RECOVERING, ...)
    orch_workers_by_activity{run,activity}       workers by what they do (loading, working, draining...)
    orch_worker_rows_per_second{run,worker}, orch_worker_tokens_per_second{run,worker}
    orch_worker_recoveries{run,worker}           times the worker's job was recovered or relaunched

Each count in the status's `tokens` ({prompt,cached,generated}_tokens) is `orch_<its key>_total`:
a kind status learns later gets its metric without a change here.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from orchestrator.runview.sections import RunStatus, Tokens

#: The exposition's content type (text format 0.0.4).
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


class StatusCollector(Collector):
    def __init__(self, statuses: Callable[[], Iterable[RunStatus]]):
        self.statuses = statuses

    def collect(self) -> Iterator[Metric]:
        runs = list(self.statuses())
        yield from _run_families(runs)
        yield from _model_families(runs)
        yield from _worker_families(runs)


def _gauge(name: str, doc: str, labels: Iterable[str] = ("run",)) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, doc, labels=list(labels))


def _run_families(runs: list[RunStatus]) -> Iterator[Metric]:
    complete = _gauge("orch_run_complete", "1 once every chunk is done and none is damaged")
    chunks = _gauge("orch_chunks", "chunks in the run")
    chunks_done = _gauge("orch_chunks_done", "chunks with a done marker")
    rows = _gauge("orch_rows", "rows in the run")
    rows_done = CounterMetricFamily(
        "orch_rows_done", "rows kept: in finished chunks, or checkpointed in unfinished ones", labels=["run"]
    )
    in_progress = _gauge("orch_rows_in_progress", "rows answered, held in workers' memory until their next checkpoint")
    errors = CounterMetricFamily("orch_row_errors", "error rows in finished chunks", labels=["run"])
    set_aside = _gauge("orch_rows_set_aside", "input rows prepare set aside (answered with error lines)")
    reused = _gauge("orch_rows_reused", "input rows answered by earlier runs (--reuse-from)")
    kinds = sorted(Tokens.model_fields)
    tokens = {
        kind: CounterMetricFamily(f"orch_{kind}", f"{kind.replace('_', ' ')} of finished chunks", labels=["run"])
        for kind in kinds
    }
    per_m = _gauge("orch_usd_per_m_tokens", "realised $ per million tokens so far", ("run", "market"))
    rows_per_s = _gauge("orch_rows_per_second", "rows/s, summed over the working workers")
    tokens_per_s = _gauge("orch_tokens_per_second", "output tokens/s, summed over the working workers")
    eta = _gauge("orch_eta_seconds", "seconds left at the live pace (absent while unknown)")
    cost = _gauge("orch_cost_usd", "cost so far: each worker's uptime at its GPU's price")
    hours = _gauge("orch_worker_hours", "worker-hours so far")
    left_usd = _gauge("orch_estimate_left_usd", "estimated cost of what is left", ("run", "market"))
    left_s = _gauge("orch_estimate_left_seconds", "estimated time for what is left", ("run", "market"))
    for s in runs:
        run = [s.run]
        complete.add_metric(run, 1.0 if s.complete else 0.0)
        chunks.add_metric(run, s.chunks.total)
        chunks_done.add_metric(run, s.chunks.done)
        rows.add_metric(run, s.rows.total)
        rows_done.add_metric(run, s.rows.done)
        in_progress.add_metric(run, s.rows.in_progress)
        errors.add_metric(run, s.rows.errors)
        set_aside.add_metric(run, s.rows.set_aside)
        reused.add_metric(run, s.rows.reused)
        counts = s.tokens.model_dump()
        for kind, family in tokens.items():
            family.add_metric(run, counts[kind])
        for market in ("all", "on_demand", "spot"):
            rate = getattr(s.cost_per_m_tokens, market).usd_per_m_tokens
            if rate is not None:
                per_m.add_metric([s.run, market], rate)
        rows_per_s.add_metric(run, s.throughput.rows_per_s)
        tokens_per_s.add_metric(run, s.throughput.tokens_per_s)
        if s.eta_s is not None:
            eta.add_metric(run, s.eta_s)
        cost.add_metric(run, s.cost.so_far_usd)
        hours.add_metric(run, s.cost.worker_hours)
        if s.estimate and not s.complete:
            left_usd.add_metric([s.run, "spot"], s.estimate.spot_usd)
            left_usd.add_metric([s.run, "on_demand"], s.estimate.on_demand_usd)
            left_s.add_metric([s.run, "spot"], s.estimate.spot_hours * 3600)
            left_s.add_metric([s.run, "on_demand"], s.estimate.on_demand_hours * 3600)
    yield from (complete, chunks, chunks_done, rows, rows_done, in_progress, errors, set_aside, reused)
    yield from tokens.values()
    yield from (rows_per_s, tokens_per_s, eta, cost, hours, per_m, left_usd, left_s)


def _model_families(runs: list[RunStatus]) -> Iterator[Metric]:
    """A run of several models, by model (a `model` label): what each model did and cost."""
    labels = ("run", "model")
    rows = _gauge("orch_model_rows", "rows of the model in the run", labels)
    rows_done = CounterMetricFamily("orch_model_rows_done", "rows of the model in finished chunks", labels=labels)
    tokens = CounterMetricFamily(
        "orch_model_tokens", "prompt and generated tokens of the model's finished chunks", labels=labels
    )
    cost = _gauge("orch_model_cost_usd", "cost so far of the model's workers", labels)
    per_m = _gauge("orch_model_usd_per_m_tokens", "realised $ per million tokens of the model", labels)
    for s in runs:
        for model, m in s.models.items():
            at = [s.run, model]
            rows.add_metric(at, m.rows.total)
            rows_done.add_metric(at, m.rows.done)
            tokens.add_metric(at, m.tokens.prompt_tokens + m.tokens.generated_tokens)
            cost.add_metric(at, m.usd)
            if m.usd_per_m_tokens is not None:
                per_m.add_metric(at, m.usd_per_m_tokens)
    yield from (rows, rows_done, tokens, cost, per_m)


def _worker_families(runs: list[RunStatus]) -> Iterator[Metric]:
    by_state = _gauge("orch_workers", "workers by job state", ("run", "state"))
    by_activity = _gauge(
        "orch_workers_by_activity", "workers by what they do, as orch status says", ("run", "activity")
    )
    rows_per_s = _gauge("orch_worker_rows_per_second", "a working worker's rows/s", ("run", "worker"))
    tokens_per_s = _gauge("orch_worker_tokens_per_second", "a working worker's output tokens/s", ("run", "worker"))
    recoveries = _gauge(
        "orch_worker_recoveries", "times the worker's job was recovered or relaunched", ("run", "worker")
    )
    for s in runs:
        states: dict[str, int] = {}
        activities: dict[str, int] = {}
        for w in s.workers:
            states[w.state_word] = states.get(w.state_word, 0) + 1
            activities[str(w.activity)] = activities.get(str(w.activity), 0) + 1
            rows_per_s.add_metric([s.run, w.worker], w.rows_per_s)
            tokens_per_s.add_metric([s.run, w.worker], w.tokens_per_s)
            recoveries.add_metric([s.run, w.worker], w.recovery_count)
        for state, n in sorted(states.items()):
            by_state.add_metric([s.run, state], n)
        for activity, n in sorted(activities.items()):
            by_activity.add_metric([s.run, activity], n)
    yield from (by_state, by_activity, rows_per_s, tokens_per_s, recoveries)


def exposition(statuses: Callable[[], Iterable[RunStatus]]) -> bytes:
    """The text exposition of these runs' metrics (a registry of their own: nothing global)."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(StatusCollector(statuses))
    return generate_latest(registry)
