"""A run's web page and its Prometheus metrics, looked at as their users do: the page in a real
headless Chromium (Debian's package) during a real local run, /metrics scraped from a real
`orch serve` and parsed with the Prometheus client's own parser."""

from __future__ import annotations

import base64
import hashlib
import html.parser
import json
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from orchestrator.cli import main
from orchestrator.planning.pricing import load_gpu_table
from orchestrator.runview.status import derive_status, gather
from orchestrator.web.page import render_page
from tests.support.datasets import write_jsonl
from tests.support.events import wait_for as wait_for_event
from tests.support.models import TINY
from tests.support.run_states import run_under_way
from tests.support.runs import chat_request
from tests.support.serving import KEY, OTHER_KEY, create, running_server, upload, wait_for, write_requests
from tests.support.web import chromium, status_web

REPO = Path(__file__).resolve().parents[1]


def browse(url: str, *extra: str) -> str:
    """What a headless Chromium shows at `url` once loaded (its DOM, scripts run), or writes (--screenshot)."""
    out = subprocess.run(
        [chromium(), "--headless", "--no-sandbox", "--disable-gpu", "--window-size=1280,900", *extra, url],
        capture_output=True,
        text=True,
        timeout=600,  # a hang guard: a loaded machine may take minutes to start a browser
        check=True,
    )
    return out.stdout


VOID = {"meta", "link", "br", "img", "input", "hr", "col", "area", "base", "source", "wbr"}


class Shown(html.parser.HTMLParser):
    """The facts a page shows: the text and attributes of elements by id, each worker row's state,
    and every script's attributes."""

    def __init__(self, dom: str):
        super().__init__()
        self.text: dict[str, str] = {}
        self.attrs_of: dict[str, dict[str, str | None]] = {}
        self.workers: dict[str, str] = {}
        self.scripts: list[dict[str, str | None]] = []
        self.links: list[str] = []
        self.runs: dict[str, str] = {}  # the runs index: each row's state, by run
        self._run: str | None = None
        self._open: list[str | None] = []  # every open element's id (None without one)
        self._worker: str | None = None
        self.feed(dom)

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = dict(attrs)
        if tag == "script":
            self.scripts.append(a)
        if tag == "a" and a.get("href"):
            self.links.append(str(a["href"]))
        if tag == "tr":
            self._worker, self._run = a.get("data-worker"), a.get("data-run")
        if tag == "td" and a.get("data-state") is not None and self._worker is not None:
            self.workers[self._worker] = str(a["data-state"])
        if tag == "td" and a.get("data-state") is not None and self._run is not None:
            self.runs[self._run] = str(a["data-state"])
        if tag in VOID:
            return
        ident = a.get("id")
        if ident:
            self.attrs_of[ident], self.text[ident] = a, ""
        self._open.append(ident)

    def handle_startendtag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.handle_starttag(tag, attrs)
        if tag not in VOID:
            self._open.pop()

    def handle_data(self, data: str) -> None:
        for ident in self._open:
            if ident:
                self.text[ident] += data

    def handle_endtag(self, tag: str) -> None:
        if tag not in VOID and self._open:
            self._open.pop()

    def chunks(self) -> tuple[int, int]:
        done, total = self.text["chunks"].strip().split("/")
        return int(done), int(total)


# -- the page, unit by unit -------------------------------------------------------------------------
def test_names_are_shown_as_text_never_run_as_markup(tmp_path):

    store, layout = run_under_way(str(tmp_path / "store"))
    status = derive_status(gather(store, layout, None), now=time.time(), prices=load_gpu_table())
    worker = status.workers[0].model_copy(
        update={"worker": '"><img src=x onerror=alert(1)>', "failure_reason": "<b>bold</b>"}
    )
    status = status.model_copy(
        update={"run": "<script>alert('run')</script>", "workers": [worker, *status.workers[1:]]}
    )
    page = render_page(status)
    shown = Shown(page.html)
    assert len(shown.scripts) == 1  # the page's own script, nothing else
    script = page.html.split("<script>")[1].split("</script>")[0]
    assert page.script_hash == "sha256-" + base64.b64encode(hashlib.sha256(script.encode()).digest()).decode()
    assert "<script>alert" not in page.html and "<img src=x" not in page.html
    assert shown.text["run"] == "run <script>alert('run')</script>"
    assert '"><img src=x onerror=alert(1)>' in shown.workers
    assert f"script-src '{page.script_hash}'" in page.headers["Content-Security-Policy"]


def details_run(tmp_path: Path, answer: str, log_line: str) -> tuple[Any, Any]:
    """A run whose first chunk answered `answer` (and one error row), and worker 0's log ending in
    `log_line`, an ERROR line and a last line; returns (its context, its status)."""
    from orchestrator.core.context import RunContext
    from orchestrator.core.layout import RunLayout
    from orchestrator.core.spec import RunSpec
    from orchestrator.core.store import open_store
    from tests.support.runs import Answer, answer_chunk, make_run

    uri = str(tmp_path / "store")
    store = open_store(uri)
    layout = make_run(store, "d", [[chat_request(f"c{c}-{i}", "q") for i in range(4)] for c in range(2)], model="m")
    later = [Answer(1, "c0-1", "plain"), Answer(2, "c0-2", error="<i>bad</i> row"), Answer(3, "c0-3", "last")]
    answer_chunk(store, layout, "part_00000", [[Answer(0, "c0-0", answer)], later], worker="0")  # two parts
    logs = tmp_path / "store" / "logs" / "d"
    logs.mkdir(parents=True)
    (logs / "worker-0-100.log").write_text("an older attempt\n")
    lines = [f"line {i}" for i in range(40)] + [log_line, "ERROR worker 0: <b>engine</b> died", "exiting"]
    (logs / "worker-0-200.log").write_text("\n".join(lines) + "\n")
    status = derive_status(gather(store, RunLayout("d"), None), now=time.time(), prices=load_gpu_table())
    return RunContext(RunSpec(run="d", store=uri), store, layout), status


def test_page_details_show_log_tail_last_error_samples_and_error_rows_as_text(tmp_path):
    from orchestrator.web.details import LOG_LINES, read_details

    ctx, status = details_run(tmp_path, "<script>alert('answer')</script>", "<script>alert('log')</script>")
    details = read_details(ctx, status)
    page = render_page(status, details=details)
    shown = Shown(page.html)
    assert len(shown.scripts) == 1  # the page's own, none of the user's
    assert "<script>alert" not in page.html and "<b>engine" not in page.html and "<i>bad" not in page.html
    tail = shown.text["log-0"].splitlines()
    assert tail[-3:] == ["<script>alert('log')</script>", "ERROR worker 0: <b>engine</b> died", "exiting"]
    assert len(tail) == LOG_LINES and "an older attempt" not in page.html  # the newest attempt's end only
    assert shown.text["last-error-0"] == "last error: ERROR worker 0: <b>engine</b> died"
    samples = shown.text["samples"]
    assert "<script>alert('answer')</script>" in samples and "plain" in samples and "last" not in samples
    assert "c0-2" in shown.text["error-rows"] and "<i>bad</i> row" in shown.text["error-rows"]
    assert shown.text["per-m"].startswith("$") and "generated" in shown.text["tokens-line"]


def test_page_state_is_the_word_orch_status_shows(tmp_path):

    store, layout = run_under_way(str(tmp_path / "store"))
    status = derive_status(gather(store, layout, None), now=time.time(), prices=load_gpu_table())
    assert status.state == "running"
    shown = Shown(render_page(status).html)
    assert shown.text["state"] == "RUNNING" == shown.attrs_of["status"]["data-state"]


def local_run(tmp_path: Path, *, reused: int = 0) -> tuple[Any, Any]:
    """A prepared local run of two CPU workers (jobs recorded on the local backend, as `orch run`
    records them), worker 0 loading: its store and layout."""
    from orchestrator.core.protocol.heartbeats import HeartbeatPublisher
    from orchestrator.core.records import Heartbeat, JobAttempt, PrepareRecord, update_jobs
    from orchestrator.core.store import open_store
    from tests.support.runs import make_run

    store = open_store(str(tmp_path / "store"))
    layout = make_run(
        store, "cpu", [[chat_request(f"c{c}-{i}", "q") for i in range(3)] for c in range(4)], model="m", workers=2
    )
    store.put(
        layout.prepare_record,
        PrepareRecord(identity={}, chunks=4, rows=12, errors=0, reused=reused, created_at=time.time()).to_bytes(),
    )
    now = time.time()
    update_jobs(
        store,
        layout,
        lambda rec: [
            rec.worker(w).attempts.append(JobAttempt(job_id=f"local-{w}", backend="local", launched_at=now))
            for w in (0, 1)
        ],
    )
    HeartbeatPublisher(
        store, layout, Heartbeat(worker="0", holder="0.x", state="loading", started_at=now - 5, updated_at=now)
    ).publish()
    return store, layout


def test_page_of_a_cpu_run_prices_no_gpu_says_its_backend_and_counts_reused_rows(tmp_path):
    """A local CPU run's page: its backend beside RUNNING (never `not launched`), no estimate on
    the spec's GPUs before its workers measure a speed (then on the cpu they measured), and the rows
    answered by earlier runs."""
    from tests.support.runs import Answer, answer_chunk

    store, layout = local_run(tmp_path, reused=7)
    prices = load_gpu_table()
    status = derive_status(gather(store, layout, None), now=time.time(), prices=prices, gpus=["L4"], workers_planned=2)
    shown = Shown(render_page(status).html)
    assert status.state == "running" and status.backend == "local" and status.estimate is None
    assert "not launched" not in render_page(status).html and "L4" not in render_page(status).html
    assert shown.text["reused"] == "7" and shown.text["state"] == "RUNNING"
    answer_chunk(store, layout, "part_00000", [[Answer(i, f"c0-{i}", "x") for i in range(3)]], accelerator="cpu")
    status = derive_status(gather(store, layout, None), now=time.time(), prices=prices, gpus=["L4"], workers_planned=2)
    assert status.estimate is not None and status.estimate.gpu == "cpu" and status.estimate.measured
    assert "2 x cpu" in Shown(render_page(status).html).text["estimate"]


def test_probe_workers_that_beat_without_a_launch_record_run_on_the_specs_backend(tmp_path):
    """Workers started outside `orch launch` (a probe's, or by hand) beat with no jobs record: the
    status names the spec's backend, not none (the page said `not launched` beside RUNNING)."""
    from orchestrator.core.protocol.heartbeats import HeartbeatPublisher
    from orchestrator.core.records import Heartbeat
    from orchestrator.core.store import open_store
    from tests.support.runs import make_run

    store = open_store(str(tmp_path / "store"))
    layout = make_run(store, "p", [[chat_request("c0", "q")]], model="m")
    assert derive_status(gather(store, layout, None), now=time.time(), prices=load_gpu_table()).backend is None
    now = time.time()
    HeartbeatPublisher(
        store, layout, Heartbeat(worker="0", holder="0.p", state="running", started_at=now, updated_at=now)
    ).publish()
    status = derive_status(gather(store, layout, None), now=now, prices=load_gpu_table())
    assert (status.state, status.backend) == ("running", "local")


def test_runs_index_refreshes_while_a_run_goes_on_and_says_an_old_reading_is_old(tmp_path):
    """The index reads itself again while a run goes on (a finished run no longer reads RUNNING
    0/51 until a reload), says when each run was read, and a reading that failed after an earlier
    one shows the earlier one as such, on the index and on the run's page."""
    from orchestrator.web.page import page_of
    from orchestrator.web.runs_index import index_rows, render_index
    from orchestrator.web.snapshots import Snapshots

    store, layout = local_run(tmp_path)
    clock, failing = [1000.0], [False]

    def read(run: str) -> Any:
        if failing[0]:
            raise ConnectionError(f"store of {run} out of reach")
        return derive_status(gather(store, layout, None), now=time.time(), prices=load_gpu_table())

    snapshots = Snapshots(read, max_age=5.0, wait_s=30.0, clock=lambda: clock[0])
    page = render_index(index_rows(["cpu"], snapshots.get), "store", 5.0)
    assert '<meta http-equiv="refresh" content="5">' in page.html
    assert Shown(page.html).runs == {"cpu": "RUNNING"}
    assert time.strftime("%H:%M:%S", time.localtime(1000.0)) in page.html
    clock[0], failing[0] = 1010.0, True
    snap = snapshots.get("cpu")
    assert snap.taken_at == 1000.0 and snap.problem == "ConnectionError: store of cpu out of reach"
    index = render_index(index_rows(["cpu"], snapshots.get), "store", 5.0).html
    assert "the latest reading failed (ConnectionError: store of cpu out of reach): this is an older one" in index
    assert "store of cpu out of reach" in Shown(page_of(snap, lambda: None, 5.0).html).text["stale"]
    failing[0] = False
    from tests.support.runs import Answer, answer_chunk

    for c in range(4):
        answer_chunk(store, layout, f"part_0000{c}", [[Answer(i, f"c{c}-{i}", "x") for i in range(3)]])
    clock[0] = 1020.0
    done = render_index(index_rows(["cpu"], snapshots.get), "store", 5.0).html
    assert Shown(done).runs == {"cpu": "COMPLETE"} and "http-equiv" not in done and "reading failed" not in done


# -- the page in Chromium during a real run (`orch status --web`) ----------------------------------


#: The project directory of a run the page is watched during: one sequence at a time, so it lasts.
PAGE_RUN_SPEC = (
    "sampling:\n  max_tokens: 24\n  temperature: 0\nworkers:\n  heartbeat_interval: 1\n  checkpoint_interval: 1\n  lease_ttl: 20\n"
    "model:\n  engine_args: {max_num_seqs: 1}\n"
)


def status_json(run: str, capsys: pytest.CaptureFixture[str]) -> dict[str, Any]:
    capsys.readouterr()
    assert main(["status", "--run", run, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


@pytest.mark.slow
@pytest.mark.orch_yaml(PAGE_RUN_SPEC)
@pytest.mark.scripted_engine(step_s=0.03)  # about 2.5 minutes of rows, one at a time
def test_page_in_chromium_during_a_real_run_shows_what_orch_status_says(workdir, capsys):
    if not (TINY / ".built").exists():
        pytest.fail("the tiny model is missing: run `make models` (make test does it)")
    rows = [chat_request(f"r{i}", f"Item {i}", max_tokens=32, ignore_eos=True) for i in range(320)]
    write_jsonl(workdir / "b.jsonl", rows)
    assert main(["prepare", "b.jsonl", "--run", "web", "--format", "openai-batch", "--num-chunks", "16"]) == 0
    assert main(["launch", "--run", "web", "--model", str(TINY), "--workers", "2"]) == 0
    try:
        with status_web("web", workdir) as url:
            assert url.endswith("/runs/web")
            during, asked = None, []
            while during is None:  # until a page shows the run half-way, read after a status we have
                asked.append((time.time(), status_json("web", capsys)))
                assert not asked[-1][1]["complete"], "the run ended before the page saw it under way"
                shown = Shown(browse(url, "--dump-dom"))
                after = status_json("web", capsys)
                read_at = float(str(shown.attrs_of["status"]["data-read-at"]))
                earlier = [doc for at, doc in asked if at <= read_at]
                working = [w for w in after["workers"] if w["chunk"]]
                if earlier and 0 < shown.chunks()[0] < shown.chunks()[1] and working:
                    during = (earlier[-1], shown, after)
            before, shown, after = during
            done, total = shown.chunks()
            assert total == before["chunks"]["total"] == 16
            assert before["chunks"]["done"] <= done <= after["chunks"]["done"], (
                before["chunks"],
                done,
                after["chunks"],
            )
            assert set(shown.workers) == {w["worker"] for w in after["workers"]} == {"0", "1"}
            for w in after["workers"]:
                seen = {x["state"] for x in before["workers"] + after["workers"] if x["worker"] == w["worker"]}
                assert shown.workers[w["worker"]] in seen, (shown.workers, seen)
            assert shown.text["state"] in {x["state"].upper() for x in (before, after)}  # RUNNING, as orch status
            # The README's screenshot (docs/run-page.png) is this one: ORCH_PAGE_SCREENSHOT=PATH keeps it.
            screenshot = Path(os.environ.get("ORCH_PAGE_SCREENSHOT") or workdir / "page.png")
            browse(url, f"--screenshot={screenshot}", "--window-size=1280,1700")
            assert screenshot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
            while not status_json("web", capsys)["complete"]:  # the page's own end: COMPLETE, all chunks
                time.sleep(0.5)
            final = status_json("web", capsys)
            shown = Shown(browse(url, "--dump-dom"))
            while shown.text["state"] != "COMPLETE":  # the page's reading may be one interval old
                shown = Shown(browse(url, "--dump-dom"))
            assert shown.chunks() == (final["chunks"]["done"], final["chunks"]["total"]) == (16, 16)
            assert shown.text["rows"].strip() == "320/320"
            per_m = final["cost_per_m_tokens"]["all"]["usd_per_m_tokens"]
            assert shown.text["per-m"] == f"${per_m:,.4f}" and "generated" in shown.text["tokens-line"]
            assert {"log-0", "log-1"} <= set(shown.text) and len(shown.text["samples"]) > 0
            metrics = urllib.request.urlopen(url.rsplit("/runs/", 1)[0] + "/metrics", timeout=30).read().decode()
            families = {f.name: f for f in text_string_to_metric_families(metrics)}
            assert families["orch_chunks_done"].samples[0].value == 16
    finally:
        main(["cancel", "--run", "web"])


@pytest.mark.orch_yaml(PAGE_RUN_SPEC)
def test_runs_index_in_chromium_lists_the_stores_runs_and_links_to_their_pages(tmp_path, workdir):
    ctx, _ = details_run(tmp_path, "<script>alert('answer')</script>", "<script>alert('log')</script>")
    write_jsonl(workdir / "tickets.jsonl", [chat_request("o-0", "q")])
    prepare = ["prepare", "tickets.jsonl", "--run", "other", "--store", ctx.spec.store, "--format", "openai-batch"]
    assert main([*prepare, "--num-chunks", "1"]) == 0
    with status_web("d", workdir, "--store", ctx.spec.store) as url:
        base = url.rsplit("/runs/", 1)[0]
        index = Shown(browse(f"{base}/runs/", "--dump-dom"))
        assert index.runs == {"d": status_json_of("d", ctx.spec.store)["state"].upper(), "other": "PREPARED"}
        assert "/runs/d" in index.links and "/runs/other" in index.links
        assert index.text["model-d"] == "m" and index.text["input-other"] == "tickets.jsonl"
        page = Shown(browse(base + "/runs/other", "--dump-dom"))  # a link followed: the other run's page
        assert page.text["run"] == "run other" and page.text["state"] == "PREPARED" and "/runs/" in page.links
        page = Shown(browse(base + "/runs/d", "--dump-dom"))
        assert len(page.scripts) == 1 and "alert('answer')" not in str(page.scripts)
        assert page.text["log-0"].splitlines()[-3] == "<script>alert('log')</script>"
        assert page.text["last-error-0"] == "last error: ERROR worker 0: <b>engine</b> died"
        assert "<script>alert('answer')</script>" in page.text["samples"]
        assert "<i>bad</i> row" in page.text["error-rows"]
        assert get(f"{base}/runs/nope")[0] == 404


def status_json_of(run: str, store: str) -> dict[str, Any]:
    out = subprocess.run(
        [sys.executable, "-m", "orchestrator", "status", "--run", run, "--store", store, "--json"],
        env={**os.environ, "PYTHONPATH": str(REPO)},
        capture_output=True,
        text=True,
        check=True,
    )
    return dict(json.loads(out.stdout))


# -- orch serve: the page behind keys, /metrics scraped and parsed ---------------------------------
def get(url: str, headers: dict[str, str] | None = None) -> tuple[int, dict[str, str], str]:
    request = urllib.request.Request(url, headers=headers or {})
    try:
        with urllib.request.urlopen(request, timeout=60) as r:
            return r.status, dict(r.headers), r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, dict(e.headers), e.read().decode()


def samples(text: str) -> dict[str, list[Any]]:
    return {f.name: f.samples for f in text_string_to_metric_families(text)}


@pytest.mark.slow
def test_serve_shows_a_batchs_page_to_its_key_and_metrics_prometheus_can_parse(tmp_path):
    with running_server(tmp_path / "serve", str(tmp_path / "serve" / "store")) as server:
        client = server.client()
        requests = [
            {
                "custom_id": f"r{i}",
                "method": "POST",
                "url": "/v1/chat/completions",
                "body": {"model": "tiny", "messages": [{"role": "user", "content": f"Item {i}"}], "max_tokens": 8},
            }
            for i in range(12)
        ]
        batch = create(client, upload(client, write_requests(tmp_path / "in.jsonl", requests)).id)
        base = f"http://127.0.0.1:{server.port}"
        page = f"{base}/runs/{batch.id}"
        code, headers, _ = get(page)
        assert code == 401 and headers["www-authenticate"].startswith("Basic")
        assert get(page, {"Authorization": f"Bearer {OTHER_KEY}"})[0] == 404  # another key's run: not there
        wait_for(client, batch.id, lambda b: b.status == "in_progress" or b.status in {"completed", "failed"})
        basic = "Basic " + base64.b64encode(f"me:{KEY}".encode()).decode()
        code, headers, body = get(page, {"Authorization": basic})  # as a browser sends it
        assert code == 200 and headers["content-type"].startswith("text/html"), body
        assert f"run {batch.id}" in Shown(body).text["run"]
        index = Shown(get(f"{base}/runs/", {"Authorization": basic})[2])  # the key's runs, each a link
        assert batch.id in index.runs and f"/runs/{batch.id}" in index.links
        assert get(f"{base}/runs/")[0] == 401
        assert batch.id not in get(f"{base}/runs/", {"Authorization": f"Bearer {OTHER_KEY}"})[2]
        code, _, text = get(f"{base}/metrics", {"Authorization": f"Bearer {KEY}"})
        assert code == 200
        _, _, doc = get(f"{page}/status.json", {"Authorization": f"Bearer {KEY}"})
        status = json.loads(doc)
        found = samples(text)
        run = {"run": batch.id}
        assert [s.value for s in found["orch_chunks"] if s.labels == run] == [status["chunks"]["total"]]
        assert sum(s.value for s in found["orch_workers"] if s.labels["run"] == batch.id) == len(status["workers"])
        for name in (
            "orch_rows_done",
            "orch_row_errors",
            "orch_prompt_tokens",
            "orch_cached_tokens",
            "orch_generated_tokens",
        ):
            assert any(s.labels == run for s in found[name]), name
        assert any(s.labels == run for s in found["orch_cost_usd"])
        assert get(f"{base}/metrics", {"Authorization": f"Bearer {OTHER_KEY}"})[2].count(batch.id) == 0
        done, _ = wait_for(client, batch.id, lambda b: b.status in {"completed", "failed", "expired", "cancelled"})
        assert done.status == "completed"
        _, _, doc = get(f"{page}/status.json", {"Authorization": f"Bearer {KEY}"})
        while not json.loads(doc)["complete"]:  # the reading may be one poll interval old
            _, _, doc = get(f"{page}/status.json", {"Authorization": f"Bearer {KEY}"})
        status = json.loads(doc)
        assert status["rows"]["done"] == 12 and status["tokens"]["generated_tokens"] > 0


# -- readings shared by every view ------------------------------------------------------------------
def test_views_share_one_reading_per_interval_and_the_first_views_error_is_its_own(tmp_path):
    import threading

    from orchestrator.web.snapshots import Snapshots

    store, layout = run_under_way(str(tmp_path / "store"))
    clock, reads, gate = [1000.0], [], threading.Event()

    def read(run):
        reads.append(run)
        gate.wait(30)  # the reading is slow: every view asks meanwhile
        return derive_status(gather(store, layout, None), now=time.time(), prices=load_gpu_table())

    snapshots = Snapshots(read, max_age=5.0, clock=lambda: clock[0])
    got = []
    views = [threading.Thread(target=lambda: got.append(snapshots.get("s"))) for _ in range(20)]
    for v in views:
        v.start()
    gate.set()
    for v in views:
        v.join(30)
    assert len(reads) == 1 and len(got) == 20 and len({id(s) for s in got}) == 1
    clock[0] += 4.0
    assert snapshots.get("s") is got[0] and len(reads) == 1  # young enough: no reading
    clock[0] += 2.0
    gate.clear()  # older than max_age: a reading starts; while it is slow, the last one answers
    assert snapshots.get("s") is got[0] and snapshots.get("s") is got[0]
    wait_for_event("the second reading to begin", lambda: len(reads) == 2)
    gate.set()
    fresh = wait_for_event("the second reading", lambda: (s := snapshots.get("s")).taken_at == 1006.0 and s)
    assert len(reads) == 2 and fresh is not got[0]
    clock[0] += 6.0
    snapshots.wait_s = 30.0  # a reading that ends within wait_s is waited for, not answered stale
    assert snapshots.get("s").taken_at == 1012.0 and len(reads) == 3

    def broken(run):
        raise RuntimeError(f"store down for {run}")

    with pytest.raises(RuntimeError, match="store down for s"):
        Snapshots(broken, max_age=5.0).get("s")


def test_status_web_on_a_run_that_is_not_there_says_so_before_serving(tmp_path, capsys):

    run_under_way(str(tmp_path / "store"))
    code = main(["status", "--run", "nope", "--store", str(tmp_path / "store"), "--web", "--port", "0"])
    out = capsys.readouterr()
    assert code != 0 and "nope" in out.err and "http://" not in out.out
