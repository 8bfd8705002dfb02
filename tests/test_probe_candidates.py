"""`orch estimate --probe` on SkyPilot: one probe per candidate GPU type, pinned to it on spot, under a
budget. Everything is real (the task template, SkyPilot's own YAML loader and Task objects, the S3
store, the protocol) but the API server and the GPU machines, which cannot be reached from here: the
scripted server records the launches, and a GPU worker is played by the protocol's own objects
answering the chunk its list starts with, as the worker would."""

from __future__ import annotations

import threading
import time

import pytest

from orchestrator.backends.skypilot import SkyPilotLauncher
from orchestrator.core.context import RunContext
from orchestrator.core.errors import OrchError
from orchestrator.core.layout import RunLayout
from orchestrator.core.records import read_manifest, read_marker
from orchestrator.core.records.forecast import read_probes
from orchestrator.core.spec_load import load_spec
from orchestrator.core.store import open_store
from orchestrator.fleet import probe_launch
from orchestrator.fleet.probe import run_probes
from orchestrator.planning.forecast import forecast_from_probes
from orchestrator.simulate import fleet_outcome
from tests.support.events import wait_for
from tests.support.fake_sky import ScriptedSky
from tests.support.runs import Answer, answer_chunk, chat_request, make_run
from tests.support.s3servers import make_store_uri

#: What each candidate's machine reports as its accelerator (nvidia-smi's names).
REPORTED = {"L4": "NVIDIA L4", "A100": "NVIDIA A100-SXM4-40GB"}


@pytest.fixture(autouse=True)
def sky_home(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path_factory.mktemp("home")))
    monkeypatch.setenv("SKYPILOT_DISABLE_USAGE_COLLECTION", "1")


@pytest.fixture
def ctx(request, tmp_path):
    """A run of 4 chunks x 50 rows in a real S3 store (moto), for 2 workers on L4 or A100."""
    uri = make_store_uri("moto", request, tmp_path)
    store = open_store(uri)
    chunks = [[chat_request(f"c{c}-{i}", f"question {c} {i}", max_tokens=16) for i in range(50)] for c in range(4)]
    make_run(store, "pc", chunks, model="m", workers=2)
    flags = {"run": "pc", "store": uri, "backend": "skypilot", "resources.gpus": ["L4", "A100"], "workers.count": 2}
    spec = load_spec(None, flags, env={}, default_file=False)
    return RunContext(spec, store, RunLayout("pc"))


def pinned(task):
    """(GPU type, spot) of a SkyPilot task the loader built, which must name exactly one."""
    (resources,) = task.resources
    (gpu,) = resources.accelerators
    return gpu, resources.use_spot


class GpuWorkers(threading.Thread):
    """The candidates' machines: each launched task's worker answers the first chunk of its list (its
    probe chunk, ORCH_MAX_CHUNKS=1), reporting its GPU, and its job ends; tasks in `stall` never answer."""

    def __init__(self, ctx: RunContext, sky: ScriptedSky, stall: set[str] = frozenset()):
        super().__init__(daemon=True)
        self.ctx, self.sky, self.stall = ctx, sky, stall
        self.answered: dict[str, str] = {}  # chunk -> GPU type
        self.done = threading.Event()
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            self._serve()
        except BaseException as e:  # a task not as expected: its job fails, and the probe with it
            self.error = e
            for job_id, _task, _name in self.sky.launched:
                self.sky.script_job(job_id, ["FAILED"])

    def _serve(self) -> None:
        seen: set[int] = set()
        while not self.done.is_set():
            for job_id, task, _name in list(self.sky.launched):
                if job_id in seen:
                    continue
                seen.add(job_id)
                gpu, _ = pinned(task)
                if gpu in self.stall:
                    continue
                assert task.envs["ORCH_MAX_CHUNKS"] == "1"
                listed = self.ctx.store.get(self.ctx.layout.root + task.envs["ORCH_WORKER_LIST"]).data.decode()
                chunk = listed.split()[0].rsplit("/", 1)[-1].removesuffix(".jsonl")
                entry = next(e for e in read_manifest(self.ctx.store, self.ctx.layout) if e.chunk == chunk)
                assert entry.model == task.envs.get("ORCH_POOL"), (chunk, entry.model, task.envs.get("ORCH_POOL"))
                rows = len(self.ctx.store.get(self.ctx.layout.chunk(chunk)).data.splitlines())
                answers = [Answer(i, f"{chunk}-{i}", "a") for i in range(rows)]
                worker = task.envs["ORCH_WORKER"]
                answer_chunk(
                    self.ctx.store, self.ctx.layout, chunk, [answers], worker=worker, accelerator=REPORTED[gpu]
                )
                self.answered[chunk] = gpu
                self.sky.script_job(job_id, ["SUCCEEDED"])
            time.sleep(0.05)


def test_each_candidate_gpu_is_probed_on_its_own_spot_machine_and_forecast_from_it(ctx):
    sky = ScriptedSky(script=["STARTING", "RUNNING"])
    workers = GpuWorkers(ctx, sky)
    workers.start()
    rows_before = sum(e.rows for e in read_manifest(ctx.store, ctx.layout))
    try:
        probes = run_probes(ctx, 0.05, min_rows=8, launcher=SkyPilotLauncher(ctx.spec, sdk=sky))
    finally:
        workers.done.set()
        assert workers.error is None, workers.error
    # One launch per candidate: pinned to its GPU type, on spot, named for it.
    assert sorted((name, *pinned(task)) for _, task, name in sky.launched) == [
        ("orch-pc-probe-a100", "A100", True),
        ("orch-pc-probe-l4", "L4", True),
    ]
    # Each probe measured on its own machine, its own rows: disjoint samples of the run, 5% each.
    assert [(p.gpu, p.rows, p.accelerator) for p in probes] == [("L4", 10, "NVIDIA L4"), ("A100", 10, REPORTED["A100"])]
    assert workers.answered == {probes[0].chunk: "L4", probes[1].chunk: "A100"}
    manifest = read_manifest(ctx.store, ctx.layout)
    assert sum(e.rows for e in manifest) == rows_before  # rows moved, none copied
    assert read_probes(ctx.store, ctx.layout) == probes
    # Each candidate forecast from its own probe; a second estimate reuses them, launching nothing.
    record = forecast_from_probes(ctx, probes, manifest, 2, time.time(), fleet_outcome)
    basis = {c.gpu: c.basis for c in record.candidates}
    assert basis == {"L4": "measured on L4 (10 probe rows)", "A100": "measured on A100 (10 probe rows)"}
    assert run_probes(ctx, 0.05, min_rows=8, launcher=SkyPilotLauncher(ctx.spec, sdk=sky)) == probes
    assert len(sky.launched) == 2


def test_a_candidate_past_its_share_of_the_budget_is_cancelled_and_its_rows_left_to_the_run(ctx, monkeypatch):
    # The A100's machine never answers (capacity lost, a slow start): its share of the budget runs out.
    from orchestrator.planning import estimate

    monkeypatch.setattr(estimate, "RESTART_OVERHEAD_S", 0.0)  # no start-up to fit in a budget this small
    sky = ScriptedSky(script=["STARTING", "RUNNING"])
    workers = GpuWorkers(ctx, sky, stall={"A100"})
    workers.start()
    budget = 0.002  # $0.001 each: about a second of an A100 at spot prices
    try:
        probes = run_probes(ctx, 0.05, min_rows=8, budget_usd=budget, launcher=SkyPilotLauncher(ctx.spec, sdk=sky))
    finally:
        workers.done.set()
        assert workers.error is None, workers.error
    l4, a100 = probes
    assert l4.busy_s is not None and a100.busy_s is None
    assert a100.stopped is not None and a100.stopped.startswith("cancelled at its budget ($0.00:"), a100.stopped
    (a100_job,) = [job for job, task, _ in sky.launched if pinned(task)[0] == "A100"]
    assert sky.cancelled == [a100_job]
    # Nothing lost: the A100 probe's chunk is not done, and it heads worker 1's list for the run.
    assert read_marker(ctx.store, ctx.layout, a100.chunk) is None
    listed = ctx.store.get(ctx.layout.worker_list("1")).data.decode().split()
    assert listed[0] == ctx.layout.chunk_path(a100.chunk)
    # The A100 is forecast from the L4's probe by the table, and the record says why.
    record = forecast_from_probes(ctx, probes, read_manifest(ctx.store, ctx.layout), 2, time.time(), fleet_outcome)
    basis = {c.gpu: c.basis for c in record.candidates}
    assert basis["L4"].startswith("measured on L4") and basis["A100"].startswith("scaled from the probe on NVIDIA L4")
    assert "the probe on A100 measured nothing (cancelled at its budget" in record.note
    # A spent budget is not spent again: the next estimate launches nothing.
    assert run_probes(ctx, 0.05, min_rows=8, budget_usd=budget, launcher=SkyPilotLauncher(ctx.spec, sdk=sky)) == probes
    assert len(sky.launched) == 2


def test_a_probe_waited_on_again_keeps_the_budget_clock_of_its_launch(ctx, monkeypatch):
    # An estimate is interrupted (Ctrl-C) while the A100's machine stalls: its job goes on, paid by
    # the second. The next estimate waits on that job rather than launch another, and its share of
    # the budget counts from the launch: a job launched long enough ago is cancelled at once, not
    # given a fresh share (before, the clock started again at every estimate).
    from orchestrator.planning import estimate

    monkeypatch.setattr(estimate, "RESTART_OVERHEAD_S", 0.0)
    sky = ScriptedSky(script=["STARTING", "RUNNING"])
    workers = GpuWorkers(ctx, sky, stall={"A100"})
    workers.start()
    budget = 2.0  # $1 each: 51 minutes of an A100 at $1.17/h spot, the whole $2 would be 103

    def ctrl_c_once_the_a100_is_launched(line: str) -> None:
        if "on A100: worker 1 launched" in line:
            raise KeyboardInterrupt

    launcher = SkyPilotLauncher(ctx.spec, sdk=sky)
    try:
        with pytest.raises(KeyboardInterrupt):
            run_probes(
                ctx, 0.05, min_rows=8, budget_usd=budget, echo=ctrl_c_once_the_a100_is_launched, launcher=launcher
            )
        l4, a100 = read_probes(ctx.store, ctx.layout)
        assert a100.gpu == "A100" and a100.job is not None and a100.launched_at is not None
        # The L4's probe finishes meanwhile: the A100's share is still half the budget, not the whole.
        wait_for("the L4's probe answered", lambda: l4.chunk in workers.answered)
        # As if that estimate had been an hour ago: the job has been paid for since.
        ctx.store.put(
            ctx.layout.probe_of("A100"), a100.model_copy(update={"launched_at": a100.launched_at - 3600}).to_bytes()
        )
        probes = run_probes(ctx, 0.05, min_rows=8, budget_usd=budget, timeout_s=60, launcher=launcher)
    finally:
        workers.done.set()
        assert workers.error is None, workers.error
    assert probes[1].stopped is not None and probes[1].stopped.startswith("cancelled at its budget ($1.00:"), probes[
        1
    ].stopped
    assert [str(job) for job in sky.cancelled] == [a100.job]
    assert len(sky.launched) == 2  # the A100's job was waited on, not launched again
    assert probes[0].busy_s is not None  # the L4's probe measured


@pytest.mark.slow  # SkyPilot's loader over an S3 server
def test_each_model_is_probed_on_each_of_its_own_candidates_by_a_worker_of_its_pool(request, tmp_path):
    """Two models, tiny on L4 or A100, smol on 2 x A100 a worker: three probes, each a chunk of its
    model's rows first on a worker of its pool, launched with that pool's model, pinned to its GPU
    on spot; the budget is shared by the three, a 2-GPU worker paying twice; each pool is forecast
    from its own probes and the run ends with the slower."""
    from orchestrator.cli import main
    from orchestrator.core.pools import POOL_ENV
    from orchestrator.core.records import read_plan
    from orchestrator.planning.forecast_pools import forecast_pools
    from tests.support.datasets import batch_lines

    uri = make_store_uri("moto", request, tmp_path)
    (tmp_path / "orch.yaml").write_text(
        "backend: skypilot\nworkers: {count: 2}\nmodels:\n  tiny: {name: org/tiny, resources: {gpus: [L4, A100]}}\n"
        "  smol: {name: org/smol, resources: {gpus: [A100], gpus_per_worker: 2}}\n"
    )
    data = batch_lines(tmp_path / "in.jsonl", ["tiny", "smol"], rows=160, max_tokens=16)
    args = ["-f", str(tmp_path / "orch.yaml"), "--run", "pm", "--store", uri]
    assert main(["prepare", str(data), *args, "--format", "openai-batch", "--rows-per-chunk", "20"]) == 0
    spec = load_spec(str(tmp_path / "orch.yaml"), {"run": "pm", "store": uri}, env={})
    ctx = RunContext(spec, open_store(uri), RunLayout("pm"))
    sky = ScriptedSky(script=["STARTING", "RUNNING"])
    workers = GpuWorkers(ctx, sky)
    workers.start()
    try:
        probes = run_probes(ctx, 0.05, min_rows=4, budget_usd=3.0, launcher=SkyPilotLauncher(ctx.spec, sdk=sky))
    finally:
        workers.done.set()
        assert workers.error is None, workers.error
    assert [(p.model, p.gpu, p.rows, p.accelerator) for p in probes] == [
        ("tiny", "L4", 4, "NVIDIA L4"),
        ("tiny", "A100", 4, REPORTED["A100"]),
        ("smol", "A100", 4, REPORTED["A100"]),
    ]
    assert [(p.model, p.gpu) for p in read_probes(ctx.store, ctx.layout)] == [(p.model, p.gpu) for p in probes]
    launched = sorted((name, task.envs[POOL_ENV], *pinned(task)) for _, task, name in sky.launched)
    assert launched == [
        ("orch-pm-probe-smol-a100", "smol", "A100", True),
        ("orch-pm-probe-tiny-a100", "tiny", "A100", True),
        ("orch-pm-probe-tiny-l4", "tiny", "L4", True),
    ]
    models = {e.chunk: e.model for e in read_manifest(ctx.store, ctx.layout)}
    plan = read_plan(ctx.store, ctx.layout)
    assert plan is not None
    for p in probes:
        assert models[p.chunk] == p.model
        assert [a.model for a in plan.workers if a.chunks[:1] == [p.chunk]] == [p.model]
    caps = probe_launch.budget_caps(ctx, probes, 3.0)
    assert [round(caps[p.chunk].usd(), 2) for p in probes] == [1.0, 1.0, 1.0]
    assert caps[probes[2].chunk].seconds == pytest.approx(caps[probes[1].chunk].seconds / 2)
    record = forecast_pools(ctx, read_manifest(ctx.store, ctx.layout), probes, 0.0, fleet_outcome)
    assert record.kind == "probe" and set(record.pools) == {"tiny", "smol"}
    assert {pool: r.kind for pool, r in record.pools.items()} == {"tiny": "probe", "smol": "probe"}
    (run,) = record.candidates
    fleets = [r.fleet_candidate() for r in record.pools.values()]
    assert run.duration_s.p90 == max(f.duration_s.p90 for f in fleets if f is not None)


@pytest.mark.slow  # SkyPilot's loader over an S3 server
def test_a_model_with_too_few_rows_to_probe_is_forecast_from_the_table_and_the_others_are_probed(request, tmp_path):
    """160 rows of tiny, 3 of smol: a probe takes at most a quarter of a pool's rows, so smol is
    left out (said, and guessed in the forecast) and tiny's candidates are probed; a pool of 4 rows
    holds one probe of its two candidates. A run too small for any probe says so, naming its pools."""
    from orchestrator.cli import main
    from orchestrator.fleet.probe import probe_plan, probes_held
    from orchestrator.planning.forecast_pools import forecast_pools
    from tests.support.datasets import batch_lines

    assert [probes_held(n, 2) for n in (3, 4, 5, 160)] == [0, 1, 2, 2]  # 5 rows: 1 of 5, then 1 of 4
    uri = make_store_uri("moto", request, tmp_path)
    (tmp_path / "orch.yaml").write_text(
        "backend: skypilot\nworkers: {count: 2}\nmodels:\n  tiny: {name: org/tiny, resources: {gpus: [L4, A100]}}\n"
        "  smol: {name: org/smol, resources: {gpus: [A100]}}\n"
    )

    def prepared(run: str, models: list[str]) -> RunContext:
        data = batch_lines(tmp_path / f"{run}.jsonl", models, max_tokens=16)
        args = ["-f", str(tmp_path / "orch.yaml"), "--run", run, "--store", uri, "--format", "openai-batch"]
        assert main(["prepare", str(data), *args, "--rows-per-chunk", "20"]) == 0
        spec = load_spec(str(tmp_path / "orch.yaml"), {"run": run, "store": uri}, env={})
        return RunContext(spec, open_store(uri), RunLayout(run))

    ctx = prepared("small", ["tiny"] * 160 + ["smol"] * 3)
    sky = ScriptedSky(script=["STARTING", "RUNNING"])
    workers = GpuWorkers(ctx, sky)
    workers.start()
    said: list[str] = []
    try:
        probes = run_probes(
            ctx, 0.05, min_rows=4, budget_usd=3.0, launcher=SkyPilotLauncher(ctx.spec, sdk=sky), echo=said.append
        )
    finally:
        workers.done.set()
        assert workers.error is None, workers.error
    assert [(p.model, p.gpu, p.rows) for p in probes] == [("tiny", "L4", 8), ("tiny", "A100", 8)]
    assert "probe of smol on A100: too few rows (3) to probe: forecast from the table" in said, said
    record = forecast_pools(ctx, read_manifest(ctx.store, ctx.layout), probes, 0.0, fleet_outcome)
    assert {pool: r.kind for pool, r in record.pools.items()} == {"tiny": "probe", "smol": "guess"}
    assert "guessed from the table (smol)" in record.note, record.note

    four = prepared("four", ["tiny"] * 4 + ["smol"] * 2)
    assert probe_plan(four) == ([("tiny", "L4")], [("tiny", "A100", 4), ("smol", "A100", 2)])
    none = prepared("none", ["tiny"] * 3 + ["smol"] * 2)
    with pytest.raises(OrchError, match=r"too few rows to probe \(3 of model 'tiny', 2 of model 'smol'; "):
        run_probes(none, 0.05, launcher=SkyPilotLauncher(none.spec, sdk=ScriptedSky()))


def test_a_budget_too_small_for_a_start_up_launches_no_candidate_and_says_so(ctx):
    sky = ScriptedSky()
    # $0.01 each: 129 s of an L4 at $0.28/h, 31 s of an A100; a start-up takes 600 s.
    with pytest.raises(
        OrchError, match=r"not launched: its share of the budget \(\$0\.01\) buys 129 s of a spot L4"
    ) as e:
        run_probes(ctx, 0.05, min_rows=8, budget_usd=0.02, launcher=SkyPilotLauncher(ctx.spec, sdk=sky))
    assert e.value.hint == probe_launch.BUDGET_HINT
    assert sky.launched == []
    assert [p.stopped is not None for p in read_probes(ctx.store, ctx.layout)] == [True, True]


def test_a_cluster_of_cpus_is_one_candidate_with_an_allocation_per_worker(ctx):
    from orchestrator.core.records.forecast import ProbeRecord, RowSample, StratumCount
    from orchestrator.fleet.probe import probe_candidates
    from orchestrator.planning.forecast import guess

    resources = ctx.spec.resources.model_copy(update={"gpus": []})
    cpus = RunContext(ctx.spec.model_copy(update={"resources": resources}), ctx.store, ctx.layout)
    assert probe_candidates(cpus) == [None]  # one probe, on whatever the workers run on
    manifest = read_manifest(ctx.store, ctx.layout)
    (guessed,) = guess(cpus, manifest, 2, 0.0).candidates
    assert (guessed.gpu, guessed.spot, guessed.cost_usd.p90) == ("cpu", False, 0.0)
    row = RowSample(
        stratum="s",
        est_prompt_tokens=4,
        prompt_tokens=4,
        cached_tokens=0,
        completion_tokens=16,
        max_tokens=16,
        hit_max=True,
    )
    strata = {"s": StratumCount(rows=200, max_tokens=3200, est_prompt_tokens=800)}
    probe = ProbeRecord(
        chunk="part_00009",
        rows=8,
        share=0.04,
        strata=strata,
        created_at=0.0,
        busy_s=1.0,
        accelerator="cpu",
        samples=[row] * 8,
    )
    (cluster,) = forecast_from_probes(cpus, [probe], manifest, 2, 0.0, fleet_outcome).candidates
    assert cluster.basis == "measured on cpu (8 rows, 2 workers, one allocation each)"
    # The same probe on this machine: two workers share its cores, each slower than one alone.
    local = RunContext(cpus.spec.model_copy(update={"backend": "local"}), ctx.store, ctx.layout)
    (shared,) = forecast_from_probes(local, [probe], manifest, 2, 0.0, fleet_outcome).candidates
    assert shared.engine_s.p50 > cluster.engine_s.p50
