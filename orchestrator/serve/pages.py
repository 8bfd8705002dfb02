"""What a person and Prometheus see of the server's runs: a page per run, its JSON, and /metrics.

    GET /runs/                    the runs index: the viewer's runs, a row and a link each (web/runs_index.py)
    GET /runs/{run}               the run's page (orchestrator/web/page.py), refreshing itself
    GET /runs/{run}/status.json   `orch status --json` of the run
    GET /metrics                  Prometheus metrics of the active batches' runs (orchestrator/web/metrics.py)

Who sees what, as for the API: with keys, a key sees the runs of its own batches (another key's
run answers 404, as an unknown one does); the key goes in `Authorization: Bearer KEY` (scripts,
Prometheus' `authorization`), or as the password of HTTP Basic auth, which a browser asks for
(the user name is not checked); Basic auth is taken here only, never by the API (serve/auth.py).
Without keys (loopback only) every run in the store is shown, batches or not. Statuses come from
the snapshots (orchestrator/web/snapshots.py): a request costs the store nothing when a reading
younger than the poll interval is there.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Annotated

from fastapi import APIRouter, Depends, Header, Request
from fastapi.responses import HTMLResponse, Response

from orchestrator.core.errors import OrchError, RunNotFound
from orchestrator.core.layout import RunLayout
from orchestrator.core.records import BatchDocument, read_batch
from orchestrator.core.records.run import run_names
from orchestrator.core.store import Store
from orchestrator.runview.status import RunStatus, current_status, to_json
from orchestrator.serve.auth import OPEN_OWNER
from orchestrator.serve.batch_states import LAYOUT
from orchestrator.serve.driver import BatchSteps
from orchestrator.serve.errors import APIError, not_found
from orchestrator.serve.files import valid_id
from orchestrator.serve.settings import ServeSettings
from orchestrator.web.metrics import CONTENT_TYPE, exposition
from orchestrator.web.page import page_of
from orchestrator.web.runs_index import index_rows, render_index
from orchestrator.web.snapshots import Snapshot, Snapshots

#: How often an open page fetches itself again.
REFRESH_S = 5.0

router = APIRouter()


def run_snapshots(settings: ServeSettings) -> Snapshots:
    """The server's statuses: each read as `orch status` reads it, at most once per poll interval."""
    steps = BatchSteps(settings)

    def read(run: str) -> RunStatus:
        ctx = steps.run_context(run)
        if ctx is None:
            raise not_found("run", run)
        try:
            return current_status(ctx)
        except RunNotFound:  # a batch still validating: its run is not prepared yet
            raise not_found("run", run) from None

    return Snapshots(read, max_age=min(settings.poll_interval, REFRESH_S))


def _viewer(request: Request, authorization: Annotated[str | None, Header()] = None) -> str:
    """The owner of the request's key; a 401 asks a browser for it (HTTP Basic: the key as password)."""
    settings: ServeSettings = request.app.state.settings
    try:
        return settings.keys.owner(authorization, basic=True)
    except APIError as e:
        e.headers = {"WWW-Authenticate": 'Basic realm="orch serve", charset="UTF-8"'}
        raise


Viewer = Annotated[str, Depends(_viewer)]


def _visible(request: Request, who: str, run: str) -> None:
    """404 unless `who` may see `run`: its own batch's, or any run on a server without keys."""
    settings: ServeSettings = request.app.state.settings
    if who == OPEN_OWNER and settings.keys.open:
        try:
            RunLayout(run)
        except OrchError:
            raise not_found("run", run) from None
        return
    batch = read_batch(settings.store, LAYOUT, run) if valid_id(run) else None
    if batch is None or batch.owner != who:
        raise not_found("run", run)


def _snapshots(request: Request) -> Snapshots:
    snapshots: Snapshots = request.app.state.snapshots
    return snapshots


@router.get("/runs/", response_class=HTMLResponse)
@router.get("/runs", response_class=HTMLResponse, include_in_schema=False)
def runs_index(who: Viewer, request: Request) -> HTMLResponse:
    """The viewer's batches' runs, newest first; on a server without keys every run in the store."""
    settings: ServeSettings = request.app.state.settings
    store = settings.store
    names = run_names(store) if settings.keys.open else _owned_runs(store, who)
    snapshots = _snapshots(request)

    def snapshot(run: str) -> Snapshot:
        try:
            return snapshots.get(run)
        except APIError as e:  # a batch whose run was never prepared (it failed validation)
            raise RunNotFound(f"batch {run} has no run: {e.message}") from None

    page = render_index(index_rows(names, snapshot), "orch serve", REFRESH_S)
    return HTMLResponse(page.html, headers=page.headers)


def _owned_runs(store: Store, who: str) -> Iterator[str]:
    """The runs of `who`'s batches, newest first (their owner's index), once past validating."""
    for info in store.list(LAYOUT.owned_prefix(who, "batches")):
        batch = read_batch(store, LAYOUT, LAYOUT.id_of(info.key))
        if _has_run(batch):
            yield LAYOUT.id_of(info.key)


def _has_run(batch: BatchDocument | None) -> bool:
    return batch is not None and batch.status != "validating"


@router.get("/runs/{run}", response_class=HTMLResponse)
def run_page(run: str, who: Viewer, request: Request) -> HTMLResponse:
    _visible(request, who, run)
    snap = _snapshots(request).get(run)
    steps = BatchSteps(request.app.state.settings)
    page = page_of(snap, lambda: steps.run_context(run), REFRESH_S)
    return HTMLResponse(page.html, headers=page.headers)


@router.get("/runs/{run}/status.json")
def run_status(run: str, who: Viewer, request: Request) -> Response:
    _visible(request, who, run)
    body = json.dumps(to_json(_snapshots(request).get(run).status))
    return Response(body, media_type="application/json", headers={"Cache-Control": "no-store"})


@router.get("/metrics")
def metrics(who: Viewer, request: Request) -> Response:
    """The runs of the viewer's batches not yet final (every active batch on a server without keys)."""
    settings: ServeSettings = request.app.state.settings
    snapshots = _snapshots(request)
    runs = []
    for info in settings.store.list(LAYOUT.active_prefix):
        batch = read_batch(settings.store, LAYOUT, LAYOUT.id_of(info.key))
        if batch is not None and (settings.keys.open or batch.owner == who) and _has_run(batch):
            runs.append(batch.id)

    def statuses() -> list[RunStatus]:
        found = []
        for run in runs:
            try:
                found.append(snapshots.get(run).status)
            except (OrchError, APIError):  # a batch between states, its run not written yet
                continue
        return found

    return Response(exposition(statuses), media_type=CONTENT_TYPE)
