"""Several models in one run (issue 36): lines routed by body.model, chunks and worker pools per model, a kill storm."""

from __future__ import annotations

import json
import random
import time
from pathlib import Path

import pytest

from orchestrator.cli import main
from orchestrator.core.context import RunContext
from orchestrator.core.layout import RunLayout
from orchestrator.core.pools import pool_workers
from orchestrator.core.protocol.claims import pool_of, pool_share
from orchestrator.core.records import read_manifest, read_marker, read_plan
from orchestrator.core.spec_load import load_spec
from orchestrator.core.store import open_store
from orchestrator.planning.pricing import load_gpu_table
from orchestrator.runview.status import status_of
from orchestrator.web.metrics import exposition
from tests.support.cli import collect_lines, mid_chunk, orch_ok
from tests.support.datasets import batch_lines
from tests.support.events import STORE_PACE, wait_for
from tests.support.models import MODELS
from tests.support.run_states import running_beat
from tests.support.runs import Answer, answer_chunk
from worker.engine.scripted import STEP_ENV


def test_pool_workers_split_by_rows_unless_a_model_sets_its_own():
    spec = load_spec(None, {"models": {"a": "x/a", "b": "x/b", "c": "x/c"}}, env={}, default_file=False)
    assert pool_workers(spec, {"a": 300, "b": 100}, 4) == {"a": 3, "b": 1}  # c has no rows: no workers
    assert pool_workers(spec, {"a": 1, "b": 1000}, 1) == {"a": 1, "b": 1}  # at least one each
    spec = load_spec(None, {"models": {"a": {"name": "x/a", "workers": 2}, "b": "x/b"}}, env={}, default_file=False)
    assert pool_workers(spec, {"a": 10, "b": 10}, 5) == {"a": 2, "b": 3}


def test_prepare_and_plan_put_each_model_in_its_own_chunks_and_pool(tmp_path, capsys):
    """Lines name tiny, smol, nothing (-> the first model) or a model the run does not serve (an error
    row `model_not_found`, in its input place); chunks never mix models; each model gets its own
    workers, and a worker's share of the plan holds only its model's chunks."""
    data = batch_lines(tmp_path / "in.jsonl", ["tiny", "smol", None, "nope"], rows=16)
    store, run = str(tmp_path / "store"), "mm"
    args = ["--run", run, "--store", store, "--model", f"tiny={MODELS / 'tiny-llama'}"]
    args += ["--model", f"smol={MODELS / 'tiny-think'}"]
    assert main(["prepare", str(data), *args, "--format", "openai-batch", "--rows-per-chunk", "3"]) == 0
    client, layout = open_store(store), RunLayout(run)
    manifest = read_manifest(client, layout)
    by_model: dict[str, list[str]] = {}
    for entry in manifest:
        assert entry.model in ("tiny", "smol") and entry.positions is not None
        for line in client.get(layout.chunk(entry.chunk)).data.splitlines():
            request = json.loads(line)
            assert request["body"].get("model", "tiny") == entry.model
            by_model.setdefault(entry.model, []).append(request["custom_id"])
    assert sorted(by_model["tiny"], key=lambda c: int(c[1:])) == [f"r{i}" for i in range(16) if i % 4 in (0, 2)]
    assert by_model["smol"] == [f"r{i}" for i in range(16) if i % 4 == 1]
    errors = [json.loads(x) for x in client.get(layout.prepare_errors).data.splitlines()]
    assert [(e["custom_id"], e["code"]) for e in errors] == [(f"r{i}", "model_not_found") for i in (3, 7, 11, 15)]
    assert "'nope' is not served by this run (models: tiny, smol)" in capsys.readouterr().out

    assert main(["plan", *args, "--workers", "3"]) == 0
    plan = read_plan(client, layout)
    assert plan is not None and [a.model for a in plan.workers] == ["tiny", "tiny", "smol"]
    models = {e.chunk: e.model for e in manifest}
    for a in plan.workers:
        assert {models[c] for c in a.chunks} == {a.model}
        share, chunks = pool_share(plan, manifest, pool_of(plan, a.worker))
        assert {w.model for w in share.workers} == {a.model} and {e.model for e in chunks} == {a.model}
    assert main(["plan", *args, "--workers", "2"]) == 0  # planned again: still a pool per model
    plan = read_plan(client, layout)
    assert plan is not None and [a.model for a in plan.workers] == ["tiny", "smol"]
    assert sorted(c for a in plan.workers for c in a.chunks) == sorted(e.chunk for e in manifest)


#: SmolLM2's worker's scripted pace in the kill storm: a step (a token of every running row) in this
#: many seconds, against 0.05 s for the tiny Llama's.
SMOL_STEP_S = 0.25


@pytest.mark.slow
@pytest.mark.orch_yaml(
    "sampling:\n  max_tokens: 48\n  temperature: 0\n"
    "workers:\n  heartbeat_interval: 1\n  checkpoint_interval: 1\n  lease_ttl: 60\n"
    "store_settings:\n  worker_attempts: 2\n"
)
@pytest.mark.scripted_engine(step_s=0.05)
def test_kill_storm_on_two_models_answers_each_row_once_by_its_model(tmp_path, workdir, hand_workers):
    """Two pools (the tiny Llama, SmolLM2), one worker each; SIGKILLs land mid-chunk on both pools'
    workers, each started again at once (its lease taken over as a death's). Every row is answered
    exactly once, in input order, by the model it named (body.model carries the served name). The
    subject is the pools' protocol, so the workers run the scripted engine; the real-engine tier
    answers a batch naming two models with vLLM (tests/test_serve.py)."""
    store, run = str(tmp_path / "store"), "storm2"
    # SmolLM2 stops at its end token: ignore_eos keeps every answer long enough for kills to land mid-chunk.
    # The tiny Llama answers about twenty times as fast: it gets nineteen rows for SmolLM2's one. The
    # scripted engine paces both alike unless told: SmolLM2's six chunks then took a few seconds, and
    # a loaded machine's slow restarts of the other pool's worker could outlast them. Its worker
    # steps SMOL_STEP_S, so that it is still mid-run at each kill whatever the load.
    pattern: list[str | None] = ["tiny"] * 19 + ["smol"]
    data = batch_lines(workdir / "in.jsonl", pattern, rows=1200, max_tokens=24, ignore_eos=True)
    models = ["--model", f"tiny={MODELS / 'tiny-llama'}", "--model", f"smol={MODELS / 'smollm2-135m-instruct'}"]
    orch_ok("prepare", data, "--run", run, "--store", store, *models, "--format", "openai-batch",
            "--rows-per-chunk", "10", cwd=workdir)  # fmt: skip
    orch_ok("plan", "--run", run, "--store", store, *models, "--workers", "2", cwd=workdir)
    plan = read_plan(open_store(store), RunLayout(run))
    assert plan is not None and [a.model for a in plan.workers] == ["tiny", "smol"]
    pace = {"0": {}, "1": {STEP_ENV: f"{SMOL_STEP_S:g}"}}
    workers = {w: hand_workers(store, run, w, workdir, **pace[w]) for w in ("0", "1")}
    rng, killed = random.Random(36), set()
    for kill, pool in enumerate(["0", "1", "0", "1"]):  # both pools, each twice

        def in_pool(pool: str = pool, kill: int = kill) -> list[tuple[str, str, bool]]:
            # A worker that finished its pool's chunks is never mid-chunk again: said at once.
            assert workers[pool].proc.poll() is None, f"worker {pool} ended before kill {kill + 1}: run too short"
            return [w for w in mid_chunk(store, run, killed) if w[0] == pool]

        try:
            _, holder, _ = wait_for(f"worker {pool} mid-chunk for kill {kill + 1}", in_pool, every=STORE_PACE)[0]
        except AssertionError as e:  # what the worker said, for a failure on a machine that kept no logs
            raise AssertionError(f"{e}\nworker {pool}'s log:\n{workers[pool].log.read_text()[-3000:]}") from None
        time.sleep(rng.uniform(0.0, 1.0))  # the moment of the kill, not a wait for anything
        assert workers[pool].proc.poll() is None, f"worker {pool} ended before kill {kill + 1}: run too short"
        workers[pool].proc.kill()
        workers[pool].proc.wait()
        killed.add(holder)
        workers[pool] = hand_workers(store, run, pool, workdir, **pace[pool])
    assert [hand.proc.wait(900) for hand in workers.values()] == [0, 0]
    lines = collect_lines(workdir, run, store)
    assert [x["custom_id"] for x in lines] == [f"r{i}" for i in range(1200)]  # every row, exactly once, in order
    assert [x["response"]["body"]["model"] for x in lines] == pattern * 60
    assert all(x["response"]["status_code"] == 200 for x in lines)
    # Status and /metrics, model by model.
    status = json.loads(orch_ok("status", "--run", run, "--store", store, "--json", cwd=workdir))
    rows = {name: (m["rows"]["done"], m["rows"]["total"]) for name, m in status["models"].items()}
    assert rows == {"tiny": (1140, 1140), "smol": (60, 60)}
    assert status["models"]["smol"]["tokens"]["generated_tokens"] == 60 * 24
    metrics = exposition(
        lambda: [status_of(open_store(store), RunLayout(run), None, now=time.time(), prices=load_gpu_table())]
    )
    assert b'orch_model_rows_done_total{model="smol",run="storm2"} 60.0' in metrics


SWEEP_SPEC = """
input: {format: text, id_column: id, template: "Q: {question}"}
sampling: {max_tokens: 6, temperature: 0}
workers: {count: 1, heartbeat_interval: 1, checkpoint_interval: 1}
sweep:
  arms:
    plain: {}
    terse: {system_prompt: "Answer in one word.", sampling: {max_tokens: 3}}
"""


@pytest.mark.slow
def test_sweep_answers_every_row_once_per_arm_and_collects_arms_side_by_side(tmp_path):
    """One model, two prompt arms: each arm is a request of its own (`<id>#<arm>`, its own system
    prompt and sampling in the body), answered once, in input order; the Parquet table has one
    row per input row with each arm's columns beside the other's."""
    import pyarrow.parquet as pq

    (tmp_path / "orch.yaml").write_text(SWEEP_SPEC)
    data = tmp_path / "q.jsonl"
    data.write_text("".join(json.dumps({"id": f"q{i}", "question": f"What is {i}+{i}?"}) + "\n" for i in range(5)))
    data.write_text(data.read_text() + "not json\n")  # set aside once per arm, at its place
    model = str(MODELS / "tiny-llama")
    orch_ok("run", data, "--run", "sw", "--model", model, "--rows-per-chunk", "3", "--out", "sw.jsonl",
            "--max-error-rate", "1", cwd=tmp_path)  # fmt: skip
    lines = [json.loads(x) for x in (tmp_path / "sw.jsonl").read_text().splitlines()]
    ids = [f"q{i}#{arm}" for i in range(5) for arm in ("plain", "terse")] + ["line-6#plain", "line-6#terse"]
    assert [x["custom_id"] for x in lines] == ids
    terse = [x["response"]["body"]["usage"]["completion_tokens"] for x in lines[1:10:2]]
    assert all(tokens <= 3 for tokens in terse)  # the arm's own max_tokens, not the run's 6
    orch_ok("collect", "--run", "sw", "--out", "sw.parquet", "--max-error-rate", "1", cwd=tmp_path)
    table = pq.read_table(tmp_path / "sw.parquet").to_pylist()
    assert [row["id"] for row in table] == [f"q{i}" for i in range(5)] + ["line-6"]
    assert [row["text_plain"] for row in table[:5]] == [
        x["response"]["body"]["choices"][0]["message"]["content"] for x in lines[:10:2]
    ]
    assert [row["text_terse"] for row in table[:5]] == [
        x["response"]["body"]["choices"][0]["message"]["content"] for x in lines[1:10:2]
    ]
    assert table[5]["error_code_plain"] == table[5]["error_code_terse"] == "invalid_request"


def test_serve_batch_names_several_models_when_the_server_allows_it(tmp_path):
    """`serve.several_models`: a batch whose lines name two served models is valid, and its run is a
    run of two models (a pool each, under the names the lines give); off, the second is model_mismatch."""
    import io

    from orchestrator.serve.driver import BatchSteps
    from orchestrator.serve.settings import load_settings
    from orchestrator.serve.validate import validate_input

    data = batch_lines(tmp_path / "in.jsonl", ["tiny", "smol", "tiny"]).read_bytes()
    runners = {"tiny": "generate", "smol": "generate"}
    one = validate_input(io.BytesIO(data), endpoint="/v1/chat/completions", models=runners, max_requests=10)
    assert [(e.code, e.line) for e in one.errors] == [("model_mismatch", 2)]
    both = validate_input(
        io.BytesIO(data), endpoint="/v1/chat/completions", models=runners, max_requests=10, several=True
    )
    assert both.errors == [] and both.named == ["tiny", "smol"]

    spec = load_spec(None, {"store": str(tmp_path / "store"), "serve.several_models": True}, env={}, default_file=False)
    flags = [f"tiny={MODELS / 'tiny-llama'}", f"smol={MODELS / 'tiny-think'}"]
    settings = load_settings(spec, flags, host="127.0.0.1", api_keys=None, api_keys_file=None)
    ctx = BatchSteps(settings).run_context("batch_1", {n: settings.models[n] for n in both.named})
    assert ctx is not None and list(ctx.spec.models) == ["tiny", "smol"]
    assert ctx.spec.models["smol"].name == str((MODELS / "tiny-think").resolve())


def _two_pool_run(tmp_path: Path, resources: str = "", smol_on: str = "cpu", backend: str = "local") -> list[str]:
    """A prepared and planned run of two models, tiny (rows 0, 2, ...) and smol (1, 3, ...), with a
    worker each, and one finished chunk per pool: tiny's in 1 s, smol's in 40 s (both 2 tokens a row)."""
    (tmp_path / "orch.yaml").write_text(
        f"backend: {backend}\n"
        f"models:\n  tiny: {MODELS / 'tiny-llama'}\n  smol: {{name: {MODELS / 'tiny-think'}{resources}}}\n"
    )
    data = batch_lines(tmp_path / "in.jsonl", ["tiny", "smol"], rows=24, max_tokens=8)
    store_uri = str(tmp_path / "store")
    args = ["-f", str(tmp_path / "orch.yaml"), "--run", "two", "--store", store_uri]
    assert main(["prepare", str(data), *args, "--format", "openai-batch", "--rows-per-chunk", "4"]) == 0
    assert main(["plan", *args, "--workers", "2"]) == 0
    store, layout = open_store(store_uri), RunLayout("two")
    for pool, seconds in (("tiny", 1.0), ("smol", 40.0)):
        entry = next(e for e in read_manifest(store, layout) if e.model == pool)
        ids = [json.loads(x)["custom_id"] for x in store.get(layout.chunk(entry.chunk)).data.splitlines()]
        answers = [Answer(i, cid, "x") for i, cid in enumerate(ids)]
        accelerator = smol_on if pool == "smol" else "cpu"
        answer_chunk(store, layout, entry.chunk, [answers], accelerator=accelerator, seconds=seconds)
    return args


def test_status_estimate_counts_each_pools_work_at_its_own_speed(tmp_path, capsys):
    """Two pools with the same work left, one 40x slower: the run's time is the slow pool's (not a
    blend of both speeds over all workers), its cost the pools' summed."""
    args = _two_pool_run(tmp_path)
    capsys.readouterr()
    assert main(["status", *args, "--json"]) == 0
    est = json.loads(capsys.readouterr().out)["estimate"]
    tiny, smol = est["pools"]["tiny"], est["pools"]["smol"]
    assert (tiny["tokens_per_s"], smol["tokens_per_s"]) == (8.0, 0.2)  # 4 rows x 2 tokens in 1 s / 40 s
    assert tiny["rows_left"] == smol["rows_left"] == 8 and tiny["workers"] == smol["workers"] == 1
    assert est["slowest_pool"] == "smol" and est["spot_hours"] == smol["spot_hours"] > tiny["spot_hours"]
    # smol's 16 tokens left at 0.2 tok/s on its one worker, plus a start-up.
    assert smol["on_demand_hours"] == pytest.approx((16 / 0.2 + 600) / 3600, abs=1e-3)
    assert est["on_demand_usd"] == pytest.approx(tiny["on_demand_usd"] + smol["on_demand_usd"])
    assert (est["gpu"], est["basis"], est["workers"]) == ("cpu", "measured 0 tok/s on cpu", 2)
    assert main(["status", *args]) == 0
    assert "estimate by pool (the run ends with smol): tiny 1 x cpu" in capsys.readouterr().out


def test_plan_estimate_prices_each_pool_on_its_own_machines(tmp_path, capsys):
    """A pool on 2 x A100 per worker costs its A100 time at twice the A100's price, at the speed its
    finished chunk measured; the quote shows each pool and ends with the slowest."""
    resources = ", resources: {gpus: [A100], gpus_per_worker: 2}"
    args = _two_pool_run(tmp_path, resources, smol_on="NVIDIA A100", backend="skypilot")
    capsys.readouterr()
    assert main(["plan", *args, "--workers", "2", "--estimate", "--json"]) == 0
    quote = json.loads(capsys.readouterr().out)["estimate"]
    smol = {c["spot"]: c for c in quote["pools"]["smol"]["candidates"]}
    assert {c["gpu"] for c in smol.values()} == {"A100"} and set(smol) == {True, False}
    assert "measured on A100 by this run's 1 finished chunk(s)" in smol[False]["basis"]
    price = load_gpu_table().get("A100").on_demand_usd_h
    on_demand = smol[False]
    assert on_demand["cost_usd"]["p50"] == pytest.approx(on_demand["duration_s"]["p50"] / 3600 * price * 2, abs=0.01)
    assert "the run ends with its slowest" in quote["candidates"][0]["basis"]
    assert main(["plan", *args, "--workers", "2", "--estimate"]) == 0
    assert "pool smol: 1 worker(s) on A100" in capsys.readouterr().out


@pytest.mark.slow
def test_estimate_probe_measures_each_model_on_a_worker_of_its_pool_and_the_run_answers_every_row_once(
    tmp_path, monkeypatch, capsys
):
    """`orch estimate --probe` on two models: a probe chunk per pool (its own rows, in a chunk of its
    model), first on a worker of that pool, answered by that model; each pool forecast from its own
    probe, the run ending with the slower. Then the run answers every other row once, in input order,
    each by the model it named, and leaves the probes' chunks as they were."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "orch.yaml").write_text(
        "sampling: {temperature: 0}\nworkers: {heartbeat_interval: 1, checkpoint_interval: 1, lease_ttl: 20}\n"
    )
    pattern: list[str | None] = ["tiny", "smol"]
    data = batch_lines(tmp_path / "in.jsonl", pattern, rows=48, max_tokens=4)
    args = ["--run", "mp", "--store", str(tmp_path / "store"), "--model", f"tiny={MODELS / 'tiny-llama'}"]
    args += ["--model", f"smol={MODELS / 'tiny-think'}"]
    shape = ["--format", "openai-batch", "--rows-per-chunk", "6", "--workers", "2"]
    assert main(["prepare", str(data), *args, *shape[:4]]) == 0
    capsys.readouterr()
    assert main(["estimate", *args, "--workers", "2", "--probe", "--probe-rows", "4", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["kind"] == "probe" and [(p["model"], p["rows"]) for p in doc["probes"]] == [("tiny", 4), ("smol", 4)]
    assert all(p["engine_s"] for p in doc["probes"]) and {r["kind"] for r in doc["pools"].values()} == {"probe"}
    (run,) = doc["candidates"]
    assert run["basis"].startswith("each pool measured alone; the run ends with its slowest")
    pools = [next(c for c in r["candidates"] if c["gpu"] == "cpu") for r in doc["pools"].values()]
    assert run["duration_s"]["p50"] == max(c["duration_s"]["p50"] for c in pools)
    store, layout = open_store(str(tmp_path / "store")), RunLayout("mp")
    entries = {e.chunk: e for e in read_manifest(store, layout)}
    plan = read_plan(store, layout)
    assert plan is not None
    markers = {}
    for probe in doc["probes"]:
        assert entries[probe["chunk"]].model == probe["model"]
        (worker,) = [a for a in plan.workers if a.chunks[:1] == [probe["chunk"]]]
        assert worker.model == probe["model"]
        markers[probe["chunk"]] = read_marker(store, layout, probe["chunk"])
        assert markers[probe["chunk"]] is not None and markers[probe["chunk"]].rows == 4
    assert main(["run", str(data), *args, *shape, "--out", "out.jsonl", "--interval", "1"]) == 0
    lines = [json.loads(x) for x in (tmp_path / "out.jsonl").read_text().splitlines()]
    assert [x["custom_id"] for x in lines] == [f"r{i}" for i in range(48)]  # every row, exactly once, in order
    assert [x["response"]["body"]["model"] for x in lines] == pattern * 24
    assert {chunk: read_marker(store, layout, chunk) for chunk in markers} == markers


def test_estimate_guesses_each_pool_on_its_own_machines_and_the_run_ends_with_the_slowest(tmp_path, capsys):
    """`orch estimate` of two models: each pool guessed alone (its rows, its workers, its machines:
    smol on 2 x A100 a worker costs twice the A100 time); the run's duration band is the slower
    pool's, quantile by quantile, and its cost the two summed."""
    args = _two_pool_run(tmp_path, ", resources: {gpus: [A100], gpus_per_worker: 2}", smol_on="NVIDIA A100")
    with open(tmp_path / "orch.yaml", "a") as spec:
        spec.write("backend: skypilot\n")  # priced machines; nothing is launched
    capsys.readouterr()
    assert main(["estimate", *args, "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    pools = {
        name: next(c for c in r["candidates"] if c["gpu"] + "/spot" == r["fleet"]) for name, r in doc["pools"].items()
    }
    assert set(pools) == {"tiny", "smol"} and pools["smol"]["gpu"] == "A100" and pools["tiny"]["gpu"] != "A100"
    (run,) = doc["candidates"]
    for q in ("p10", "p50", "p90"):
        assert run["duration_s"][q] == max(p["duration_s"][q] for p in pools.values())
        assert run["cost_usd"][q] == pytest.approx(sum(p["cost_usd"][q] for p in pools.values()), abs=0.02)
    smol = pools["smol"]
    price = load_gpu_table().get("A100").spot_usd_h
    assert smol["cost_usd"]["p50"] == pytest.approx(smol["duration_s"]["p50"] / 3600 * price * 2, rel=0.02)
    assert main(["estimate", *args]) == 0
    assert "pool smol: 1 worker(s) on A100" in capsys.readouterr().out


def test_deadline_policy_adds_on_demand_workers_to_the_pool_that_is_late(tmp_path, monkeypatch):
    """Five hours into a six-hour deadline, tiny's worker covers its rows left and smol's is far too
    slow: the run as a whole has the rate it needs (tiny's surplus), but the policy decides pool by
    pool and launches an on-demand worker for smol, loading smol, recorded as smol's."""
    from orchestrator.backends.skypilot import SkyPilotLauncher
    from orchestrator.core.context import RunContext
    from orchestrator.core.records import read_jobs
    from orchestrator.fleet.launch import launch_workers
    from orchestrator.fleet.reconcile import Reconciler
    from orchestrator.planning.deadline import DeadlineSettings
    from tests.support.fake_sky import ScriptedSky

    monkeypatch.setenv("HOME", str(tmp_path / "home"))  # SkyPilot's loader writes under HOME
    monkeypatch.setenv("SKYPILOT_DISABLE_USAGE_COLLECTION", "1")
    _two_pool_run(tmp_path)
    models = {"tiny": str(MODELS / "tiny-llama"), "smol": str(MODELS / "tiny-think")}
    overrides = {"run": "two", "store": "r2://bucket/orch", "backend": "skypilot", "models": models}
    ctx = RunContext(
        load_spec(None, overrides, env={}, default_file=False), open_store(tmp_path / "store"), RunLayout("two")
    )
    plan = read_plan(ctx.store, ctx.layout)
    assert plan is not None and [a.model for a in plan.workers] == ["tiny", "smol"]
    sky = ScriptedSky()
    launcher = SkyPilotLauncher(ctx.spec, sdk=sky)
    launch_workers(ctx, launcher, [0, 1], clock=lambda: time.time() - 5 * 3600)
    running_beat(ctx, 0, rows_per_s=1.0)  # tiny: 8 rows left, done in seconds
    running_beat(ctx, 1, rows_per_s=1e-4)  # smol: 8 rows left, 22 hours away
    settings = DeadlineSettings(deadline_s=6 * 3600, restart_overhead_s=600, max_on_demand=2)
    report = Reconciler(ctx, launcher, deadline=settings).tick()

    assert report.decision is not None and report.decision.action == "launch", report.decision
    assert report.decision.pool == "smol"
    assert report.decision.reason.startswith("pool smol: ")
    record, _ = read_jobs(ctx.store, ctx.layout)
    extra = [w for w in record.workers.values() if w.worker >= 2]
    assert [(w.current.pool, w.current.use_spot) for w in extra if w.current] == [("smol", False)] * len(extra) != []
    names = {name: task for _, task, name in sky.launched}
    assert all(names[f"orch-two-w{w.worker}"].envs["ORCH_POOL"] == "smol" for w in extra)
    shown = status_of(ctx.store, ctx.layout, launcher, now=time.time(), prices=load_gpu_table(), spec=ctx.spec)
    assert (shown.models["tiny"].workers, shown.models["smol"].workers) == (1, 1 + len(extra))


def _answer(index: int, custom_id: str, generated: int) -> Answer:
    """An answer of 3 prompt tokens and `generated` tokens (usage and the chunk's stats agree)."""
    answer = Answer(index, custom_id, "x")
    answer.tokens_out = generated
    body = answer.line.response.body if answer.line.response is not None else None
    assert body is not None
    body["usage"] = {**body["usage"], "completion_tokens": generated, "total_tokens": 3 + generated}
    return answer


def test_status_shows_each_sweep_arm_with_its_share_of_its_pools_cost(tmp_path, capsys):
    """Three arms on two pools (a on tiny; b and c on smol, c's answers 3x longer): each arm's rows,
    errors and tokens from its output lines, and its pool's $ shared among the pool's arms by tokens."""
    (tmp_path / "orch.yaml").write_text(
        "input: {format: text, id_column: id, template: 'Q: {question}'}\n"
        f"models: {{tiny: {MODELS / 'tiny-llama'}, smol: {MODELS / 'tiny-think'}}}\n"
        "sweep: {arms: {a: {model: tiny}, b: {model: smol}, c: {model: smol, system_prompt: 'Be terse.'}}}\n"
    )
    data = tmp_path / "q.jsonl"
    data.write_text("".join(json.dumps({"id": f"q{i}", "question": f"{i}+{i}?"}) + "\n" for i in range(4)))
    args = ["-f", str(tmp_path / "orch.yaml"), "--run", "sw", "--store", str(tmp_path / "store")]
    assert main(["prepare", str(data), *args, "--rows-per-chunk", "4"]) == 0
    assert main(["plan", *args, "--workers", "2"]) == 0
    store, layout = open_store(tmp_path / "store"), RunLayout("sw")
    for entry in read_manifest(store, layout):
        ids = [json.loads(x)["custom_id"] for x in store.get(layout.chunk(entry.chunk)).data.splitlines()]
        answers = [_answer(i, cid, 6 if cid.endswith("#c") else 2) for i, cid in enumerate(ids)]
        answer_chunk(store, layout, entry.chunk, [answers], worker=str(0 if entry.model == "tiny" else 1))
    ctx = RunContext(load_spec(None, {"run": "sw"}, env={}, default_file=False), store, layout)
    running_beat(ctx, 0, rows_per_s=1.0)  # an hour of an L4 each: what the pools cost so far
    running_beat(ctx, 1, rows_per_s=1.0)
    capsys.readouterr()
    assert main(["status", *args, "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    arms, models = doc["arms"], doc["models"]
    assert {arm: (a["model"], a["rows"]["done"]) for arm, a in arms.items()} == {
        "a": ("tiny", 4),
        "b": ("smol", 4),
        "c": ("smol", 4),
    }
    assert arms["c"]["tokens"] == {"prompt_tokens": 12, "cached_tokens": 0, "generated_tokens": 24}
    assert arms["a"]["usd"] == pytest.approx(models["tiny"]["usd"]) and models["smol"]["usd"] > 0
    assert arms["b"]["usd"] + arms["c"]["usd"] == pytest.approx(models["smol"]["usd"], abs=1e-3)
    assert arms["c"]["usd"] / arms["b"]["usd"] == pytest.approx(36 / 20, rel=1e-2)  # (12+24) vs (12+8) tokens
    assert arms["b"]["usd_per_m_tokens"] == pytest.approx(arms["c"]["usd_per_m_tokens"], rel=1e-2)
    assert main(["status", *args]) == 0
    out = capsys.readouterr().out
    rows = [line.split() for line in out.splitlines()]
    assert ["arm", "model", "rows", "errors", "tokens", "$", "$/1M", "tok"] in rows, out
    assert ["c", "smol", "4", "0", "36", f"{arms['c']['usd']:.4f}"] in [r[:6] for r in rows], out
    assert main(["collect", *args, "--out", str(tmp_path / "sw.jsonl"), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["arms"] == arms  # collect's report: the same per arm
