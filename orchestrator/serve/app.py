"""The HTTP API: OpenAI's Files and Batches endpoints (and the served models), with OpenAI's shapes and codes.

    POST   /v1/files                  multipart: file, purpose=batch
    GET    /v1/files                  after, limit, order, purpose
    GET    /v1/files/{id}             DELETE /v1/files/{id}     GET /v1/files/{id}/content
    POST   /v1/batches                input_file_id, endpoint, completion_window, metadata; Idempotency-Key
    GET    /v1/batches                after, limit (newest first)
    GET    /v1/batches/{id}           POST /v1/batches/{id}/cancel
    GET    /v1/models                 the names a batch's `model` may take
    GET    /runs/{run}, /runs/{run}/status.json, /metrics: a run's page and metrics (serve/pages.py)

Before any route, a request must name this server in its Host header, and one that changes
something must not come from another origin's page (serve/guard.py: what a web page the user
visits could otherwise do to a server on 127.0.0.1). Every route needs `Authorization: Bearer KEY`
(unless the server runs without keys; never HTTP Basic, the run page's) and sees only the key's own
files and batches; a JSON route takes only `Content-Type: application/json`, which no page can send
to another origin unasked; a route reads its body only after all that, a read at a time and
bounded (serve/uploads.py). The routes only read and write the store; the driver thread does
the batches' work. Errors take OpenAI's shape, so the official SDK raises its usual exceptions.
"""

from __future__ import annotations

import logging
import socket
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Annotated, Any, Literal, TypeVar

from fastapi import APIRouter, Depends, FastAPI, Header, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, StreamingResponse
from pydantic import BaseModel, ConfigDict, ValidationError
from python_multipart.multipart import parse_options_header
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException

from orchestrator.core.errors import OrchError
from orchestrator.core.records import StoredFile
from orchestrator.core.store import Store, StoreError
from orchestrator.prepare.sources import loads_json
from orchestrator.serve.batch_api import BatchAPI, batch_object
from orchestrator.serve.driver import BatchSteps, Driver
from orchestrator.serve.errors import APIError, not_found
from orchestrator.serve.files import (
    delete_file,
    file_object,
    iter_content,
    list_files,
    owned_file,
    save_file,
)
from orchestrator.serve.guard import RequestGuard
from orchestrator.serve.pages import router as pages_router
from orchestrator.serve.pages import run_snapshots
from orchestrator.serve.settings import ServeSettings
from orchestrator.serve.spool import Spool, open_spool
from orchestrator.serve.uploads import read_body, receive_upload

log = logging.getLogger("orch.serve")
M = TypeVar("M", bound=BaseModel)
#: At shutdown, how long the driver's step under way may take to end (after serve.shutdown_timeout).
DRIVER_STOP_S = 3.0
#: The longest Idempotency-Key taken (Stripe's limit; a UUID takes 36).
MAX_IDEMPOTENCY_KEY = 255
#: The most a POST /v1/batches body may hold: four short fields and at most 16 metadata pairs.
MAX_JSON_BYTES = 1024**2


class CreateBatch(BaseModel):
    """The body of POST /v1/batches. Unknown fields are refused, as OpenAI refuses them."""

    model_config = ConfigDict(extra="forbid")

    input_file_id: str
    endpoint: str
    completion_window: str
    metadata: dict[str, str] | None = None


def create_app(settings: ServeSettings, spool: Spool) -> FastAPI:
    """The app, its routes, and the driver thread that runs while it serves. Uploads are spooled in
    `spool`, the server's own folder (opened before the server says it listens: a folder it must
    refuse is one error, never a traceback after `listening on`), removed at shutdown."""
    batches = BatchAPI(settings)
    driver = Driver(BatchSteps(settings), settings.poll_interval)

    @asynccontextmanager
    async def lifespan(api: FastAPI) -> AsyncIterator[None]:
        # The spool goes at shutdown with whatever the uploads cut off there left: uvicorn re-raises
        # SIGTERM once shut down, so their own cleanup never runs. What a killed server left is
        # removed as the next one starts (spool.py).
        api.state.spool = spool.path
        driver.start()
        try:
            yield
        finally:
            # A step cut short is taken again by the next server (driver.py): no need to wait it out.
            driver.stop(timeout=DRIVER_STOP_S)
            spool.close()

    app = FastAPI(title="orch serve", summary="The OpenAI Batch API over orch runs", lifespan=lifespan)
    app.state.settings, app.state.batches, app.state.driver = settings, batches, driver
    app.state.snapshots = run_snapshots(settings)
    _error_handlers(app)
    app.add_middleware(RequestGuard, hosts=settings.allowed_hosts)
    app.include_router(router)
    app.include_router(pages_router)
    return app


def _owner(request: Request, authorization: Annotated[str | None, Header()] = None) -> str:
    """The owner the request's key stands for (401 without a known key)."""
    settings: ServeSettings = request.app.state.settings
    return settings.keys.owner(authorization, basic=False)


def _json_only(request: Request, *, required: bool) -> None:
    """415 unless the body is declared JSON (or, where `required` is False, no type is declared).

    A page may post text/plain and form types to any site without asking it first (no CORS preflight);
    a JSON body parsed whatever its declared type would take such a post as an API call."""
    declared = request.headers.get("content-type")
    if declared is None and not required:
        return
    kind, _ = parse_options_header(declared)
    if kind != b"application/json":
        raise APIError(
            415,
            f"Unsupported Content-Type {declared!r}: send the body as JSON, with Content-Type: application/json.",
        )


def _store(request: Request) -> Store:
    settings: ServeSettings = request.app.state.settings
    return settings.store


def _batches(request: Request) -> BatchAPI:
    batches: BatchAPI = request.app.state.batches
    return batches


def _driver(request: Request) -> Driver:
    driver: Driver = request.app.state.driver
    return driver


Owner = Annotated[str, Depends(_owner)]
StoreDep = Annotated[Store, Depends(_store)]
BatchesDep = Annotated[BatchAPI, Depends(_batches)]
DriverDep = Annotated[Driver, Depends(_driver)]
router = APIRouter(prefix="/v1")


# -- files ----------------------------------------------------------------------------------------
@router.post("/files")
async def upload_file(request: Request, who: Owner, store: StoreDep) -> dict[str, Any]:
    """The body is read here, after `Owner` checked the key: FastAPI's File() and Form() would have
    spooled the whole body to disk before any check ran."""
    settings: ServeSettings = request.app.state.settings
    async with receive_upload(request, settings.upload_limits, request.app.state.spool) as upload:
        purpose = upload.fields.get("purpose")
        if purpose is None:
            raise APIError(400, "Missing required parameter: 'purpose'.", param="purpose")
        if purpose != "batch":
            raise APIError(
                400, f"Invalid value for 'purpose': {purpose!r}. This server accepts 'batch'.", param="purpose"
            )
        record = await run_in_threadpool(
            save_file, store, owner=who, filename=upload.filename or "upload.jsonl", purpose="batch", path=upload.path
        )
    log.info("%s: uploaded (%d bytes)", record.id, record.bytes)
    return file_object(record)


@router.get("/files")
def get_files(
    who: Owner,
    store: StoreDep,
    after: str | None = None,
    limit: Annotated[int, Query(ge=1, le=10_000)] = 10_000,
    order: Literal["asc", "desc"] = "desc",
    purpose: str | None = None,
) -> dict[str, Any]:
    mark = _file(store, who, after) if after is not None else None
    page, more = list_files(store, who, after=mark, limit=limit, newest_first=order == "desc", purpose=purpose)
    return _page([file_object(f) for f in page], more)


@router.get("/files/{file_id}")
def get_file(file_id: str, who: Owner, store: StoreDep) -> dict[str, Any]:
    return file_object(_file(store, who, file_id))


@router.get("/files/{file_id}/content")
def get_file_content(file_id: str, who: Owner, store: StoreDep) -> StreamingResponse:
    return StreamingResponse(iter_content(store, _file(store, who, file_id)), media_type="application/octet-stream")


@router.delete("/files/{file_id}")
def remove_file(file_id: str, who: Owner, store: StoreDep) -> dict[str, Any]:
    record = _file(store, who, file_id)
    delete_file(store, record)
    return {"id": record.id, "object": "file", "deleted": True}


def _file(store: Store, who: str, file_id: str) -> StoredFile:
    record = owned_file(store, who, file_id)
    if record is None:
        raise not_found("File", file_id)
    return record


# -- batches --------------------------------------------------------------------------------------
@router.post("/batches")
async def create_batch(
    request: Request,
    who: Owner,
    batches: BatchesDep,
    driver: DriverDep,
    idempotency_key: Annotated[str | None, Header(max_length=MAX_IDEMPOTENCY_KEY)] = None,
) -> dict[str, Any]:
    """The body is read here, after `Owner` checked the key (as for uploads), and at most MAX_JSON_BYTES of it.
    A request resent with the same Idempotency-Key gets the batch the first one made (batch_api.py)."""
    settings: ServeSettings = request.app.state.settings
    _json_only(request, required=True)
    body = _json_body(CreateBatch, await read_body(request, settings.upload_limits, MAX_JSON_BYTES))
    batch = await run_in_threadpool(
        batches.create,
        who,
        input_file_id=body.input_file_id,
        endpoint=body.endpoint,
        completion_window=body.completion_window,
        metadata=body.metadata,
        idempotency_key=idempotency_key or None,
    )
    driver.wake()
    return batch_object(batch)


@router.get("/batches")
def get_batches(
    who: Owner, batches: BatchesDep, after: str | None = None, limit: Annotated[int, Query(ge=1, le=100)] = 20
) -> dict[str, Any]:
    page, more = batches.page(who, after=after, limit=limit)
    return _page([batch_object(b) for b in page], more)


@router.get("/batches/{batch_id}")
def get_batch(batch_id: str, who: Owner, batches: BatchesDep) -> dict[str, Any]:
    return batch_object(batches.get(who, batch_id))


@router.post("/batches/{batch_id}/cancel")
def cancel_batch(batch_id: str, request: Request, who: Owner, batches: BatchesDep, driver: DriverDep) -> dict[str, Any]:
    """No body is read; one declared of a type a form sends is refused all the same."""
    _json_only(request, required=False)
    batch = batches.cancel(who, batch_id)
    driver.wake()
    return batch_object(batch)


# -- models ---------------------------------------------------------------------------------------
@router.get("/models")
def get_models(_who: Owner, request: Request) -> dict[str, Any]:
    settings: ServeSettings = request.app.state.settings
    data = [{"id": name, "object": "model", "created": 0, "owned_by": "orch"} for name in sorted(settings.models)]
    return {"object": "list", "data": data}


def _json_body(model: type[M], raw: bytes) -> M:
    """The body as `model`: invalid JSON as OpenAI words it, invalid fields as FastAPI's own checks report them."""
    try:
        data = loads_json(raw)
    except ValueError:
        data = None
    if not isinstance(data, dict):
        raise APIError(400, "We could not parse the JSON body of your request: send a JSON object.")
    try:
        return model.model_validate(data)
    except ValidationError as e:
        raise RequestValidationError(e.errors()) from None


def _page(data: list[dict[str, Any]], has_more: bool) -> dict[str, Any]:
    return {
        "object": "list",
        "data": data,
        "first_id": data[0]["id"] if data else None,
        "last_id": data[-1]["id"] if data else None,
        "has_more": has_more,
    }


def _error_handlers(app: FastAPI) -> None:
    """Every error in OpenAI's shape: refusals as they are, bad parameters as 400 (OpenAI's status, not
    FastAPI's 422), unknown routes as OpenAI words them, the store's failures as 500s the SDK retries."""

    @app.exception_handler(APIError)
    async def api_error(_request: Request, e: APIError) -> JSONResponse:
        return JSONResponse(e.body(), status_code=e.status, headers=e.headers or None)

    @app.exception_handler(RequestValidationError)
    async def bad_parameters(_request: Request, e: RequestValidationError) -> JSONResponse:
        first = e.errors()[0]
        where = [str(p) for p in first.get("loc", ()) if p not in ("body", "query", "path", "header")]
        param = ".".join(where) or None
        if first.get("type") == "extra_forbidden":
            message = f"Unrecognized request argument supplied: {param}"
        elif first.get("type") == "missing":
            message = f"Missing required parameter: '{param}'."
        else:
            message = f"Invalid value for '{param}': {first.get('msg')}."
        return JSONResponse(APIError(400, message, param=param).body(), status_code=400)

    @app.exception_handler(HTTPException)
    async def http_error(request: Request, e: HTTPException) -> JSONResponse:
        message = f"Invalid URL ({request.method} {request.url.path})" if e.status_code == 404 else str(e.detail)
        return JSONResponse(APIError(e.status_code, message).body(), status_code=e.status_code)

    @app.exception_handler(OrchError)
    async def orch_error(_request: Request, e: OrchError) -> JSONResponse:
        # The store unreachable or a document that does not parse: the server's problem, not the request's.
        kind = "store" if isinstance(e, StoreError) else "server"
        log.warning("%s error: %s", kind, e)
        body = APIError(500, f"The server could not complete the request: {e}", type="server_error").body()
        return JSONResponse(body, status_code=500)

    @app.exception_handler(Exception)
    async def unexpected(_request: Request, e: Exception) -> JSONResponse:
        log.error("unexpected error", exc_info=e)
        body = APIError(500, "The server had an error while processing your request.", type="server_error").body()
        return JSONResponse(body, status_code=500)


def serve(settings: ServeSettings, host: str, port: int, announce: Callable[[str], None] = print) -> None:
    """Run the API with uvicorn until stopped (Ctrl-C, SIGTERM); the batches' workers run on.
    `announce` is told the base URL clients give the SDK, once the port is held (`--port 0`: the
    port the system chose)."""
    import uvicorn

    spool = open_spool()  # refused (not this user's folder) before anything is announced
    try:
        sock = listening_socket(host, port)
    except OrchError:
        spool.close()
        raise
    bound = sock.getsockname()[1]
    announce(f"http://{f'[{host}]' if ':' in host else host or '0.0.0.0'}:{bound}/v1")
    # A request still under way at shutdown (an upload trickling in) is cut off after the grace period:
    # uvicorn would otherwise wait for it as long as its client keeps sending.
    config = uvicorn.Config(
        create_app(settings, spool),
        host=host,
        port=port,
        log_level="info",
        timeout_graceful_shutdown=settings.spec.serve.shutdown_timeout,
    )
    uvicorn.Server(config).run(sockets=[sock])


def listening_socket(host: str, port: int) -> socket.socket:
    """The server's socket, bound here so that a port in use is one ERROR line, not uvicorn's log."""
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn does: a restart reuses the port
    try:
        sock.bind((host, port))
    except OSError as e:
        sock.close()
        raise OrchError(
            f"cannot listen on {host}:{port}: {e.strerror or e}",
            where="--port",
            hint="another program (another orch serve?) holds the port: stop it, or choose another with --port",
        ) from None
    return sock
