"""What a web page the user visits can make a browser send to `orch serve` (and `orch status --web`) on
127.0.0.1, and what the servers answer: nothing read, stored or started.

The attacks are made as a page would make them, against the real servers in their own processes: a
DNS-rebinding page's forged Host, a form's `text/plain` JSON body and cross-site multipart upload,
credentials a browser keeps for the run page (HTTP Basic) riding along on the API, and, at the end, a
page of another origin loaded in a real headless Chromium that auto-submits both forms.
"""

from __future__ import annotations

import base64
import html
import http.client
import json
import socket
import subprocess
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from orchestrator.cli import main
from orchestrator.core.errors import SpecError
from orchestrator.core.store import open_store
from orchestrator.web.hosts import AllowedHosts, foreign_origin
from tests.support import raw_http
from tests.support.models import TINY
from tests.support.raw_http import MiB
from tests.support.run_states import run_under_way
from tests.support.serving import (
    CHAT,
    KEY,
    Server,
    chat_line,
    final,
    running_server,
    upload,
    wait_for,
    write_requests,
)
from tests.support.web import chromium, status_web

pytestmark = pytest.mark.xdist_group("serve_guard")  # one xdist worker: its tests share the module's servers

BOUNDARY = "orch-guard-boundary"
#: More names the open server answers to, as an operator sets them.
EXTRA_HOSTS = "orch.example, .corp.example"


# -- the rules, unit by unit --------------------------------------------------------------------------
def test_hosts_allow_loopback_names_at_any_port_and_only_the_names_given():
    hosts = AllowedHosts.parse(["orch.example", ".corp.example", "*.lab.example", "10.0.0.5", "fe80::1"], where="x")
    allowed = ["localhost", "localhost:8000", "127.0.0.1:1", "[::1]:8000", "LOCALHOST.", "127.0.0.2"]
    allowed += ["orch.example:443", "corp.example", "a.b.corp.example", "x.lab.example", "10.0.0.5:80", "[fe80::1]"]
    refused = ["attacker.example", "localhost.attacker.example", "127.0.0.1.nip.io", "evilorch.example", ""]
    refused += ["xcorp.example", "10.0.0.6", "[::2]:80", "localhost:port", "user@localhost", "::1", None]
    assert [h for h in allowed if not hosts.allows(h)] == []
    assert [h for h in refused if hosts.allows(h)] == []
    assert not AllowedHosts().allows("orch.example") and AllowedHosts.parse(["*"], where="x").allows("any.where")


@pytest.mark.parametrize("entry", ["http://orch.example", "orch.example:8000", "*orch.example", "a/b", "[::1"])
def test_hosts_refuse_an_entry_that_is_not_a_host_name_saying_which(entry):
    with pytest.raises(SpecError, match="is not a host name") as refused:
        AllowedHosts.parse(["ok.example", entry], where="--allowed-host")
    assert repr(entry) in str(refused.value) and "--allowed-host" in str(refused.value)


def test_foreign_origin_refuses_changes_from_other_origins_and_lets_reads_and_other_clients_pass():
    own = "127.0.0.1:8000"
    assert foreign_origin("POST", own, "http://127.0.0.1:8000", None) is None
    assert foreign_origin("POST", own, None, None) is None  # curl, the SDK: no page behind them
    assert foreign_origin("POST", own, None, "same-origin") is None
    assert foreign_origin("GET", own, "http://attacker.example", "cross-site") is None
    for origin in ("http://127.0.0.1:8001", "http://localhost:8000", "http://attacker.example", "null"):
        assert foreign_origin("POST", own, origin, None), origin
    assert foreign_origin("DELETE", own, None, "cross-site") and foreign_origin("POST", own, None, "same-site")


def test_serve_refuses_a_bad_allowed_host_saying_where(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("ORCH_SERVE_ALLOWED_HOSTS", "ok.example,http://bad.example")
    with socket.socket() as taken:  # were the setting not checked first, the server could not listen either
        taken.bind(("127.0.0.1", 0))
        port = str(taken.getsockname()[1])
        code = main(["serve", "--model", f"tiny={TINY}", "--store", str(tmp_path / "store"), "--port", port])
    err = capsys.readouterr().err
    assert code == 2 and "'http://bad.example' is not a host name" in err and "ORCH_SERVE_ALLOWED_HOSTS" in err


@pytest.mark.parametrize("planted", ["a file", "another user's folder"])
def test_serve_refuses_a_spool_folder_it_does_not_own_before_saying_it_listens(tmp_path, planted):
    """`$TMPDIR/orch-serve-uploads-<uid>` planted by someone else: the server said `listening on`,
    then died in a traceback. Now one ERROR line naming the folder, exit 1, nothing announced."""
    import os
    import sys

    temp = tmp_path / "tmp"
    temp.mkdir()
    parent = temp / f"orch-serve-uploads-{os.getuid()}"
    if planted == "a file":
        parent.write_text("")
    else:
        if os.getuid() != 0:
            pytest.skip("giving a folder to another user takes root")
        parent.mkdir(mode=0o777)
        os.chown(parent, 65534, 65534)
    serve = [sys.executable, "-m", "orchestrator", "serve", "--model", f"tiny={TINY}", "--port", "0"]
    done = subprocess.run(
        [*serve, "--store", str(tmp_path / "store")],
        env={**os.environ, "TMPDIR": str(temp), "PYTHONPATH": str(Path(__file__).resolve().parents[1])},
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,  # a hang guard: the refusal comes before the server starts
    )
    assert done.returncode == 1, done.stderr
    assert f"ERROR {parent} is not a directory of this user" in done.stderr
    assert "listening on" not in done.stderr and "Traceback" not in done.stderr
    assert not (tmp_path / "store").exists() or not any((tmp_path / "store").rglob("*.json"))


# -- the servers, attacked ---------------------------------------------------------------------------
def spooling_server(workdir: Path, env: dict[str, str]) -> Iterator[Server]:
    (workdir / "tmp").mkdir(parents=True)
    with running_server(workdir, str(workdir / "store"), env={"TMPDIR": str(workdir / "tmp"), **env}) as server:
        yield server


@pytest.fixture(scope="module")
def open_server(tmp_path_factory) -> Iterator[Server]:
    """Without keys (the case the issue found open), answering to two more names besides loopback's."""
    env = {"ORCH_API_KEYS": "", "ORCH_SERVE_ALLOWED_HOSTS": EXTRA_HOSTS}
    yield from spooling_server(tmp_path_factory.mktemp("serve-open"), env)


@pytest.fixture(scope="module")
def keyed_server(tmp_path_factory) -> Iterator[Server]:
    yield from spooling_server(tmp_path_factory.mktemp("serve-keyed"), {})


def send(port: int, method: str, path: str, headers: dict[str, str], body: bytes = b"") -> tuple[int, dict[str, Any]]:
    """One request as given (a Host in `headers` replaces the one http.client would send)."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    try:
        conn.request(method, path, body=body or None, headers=headers)
        answer = conn.getresponse()
        data = answer.read()
    finally:
        conn.close()
    return answer.status, json.loads(data) if data.startswith(b"{") else {}


def stored(server: Server) -> set[str]:
    """Every object in the server's store: files, batches, runs."""
    return {info.key for info in open_store(server.store_uri).list("")}


def form_upload(port: int, headers: dict[str, str]) -> raw_http.Answer:
    """A whole, valid upload of 16 MiB, as a form sends it (a server that took it would store it), sent
    a MiB at a time and cut short once answered: what was spooled by then was read before the answer."""
    head, tail = raw_http.multipart(BOUNDARY, "form.jsonl")
    size = 16 * MiB
    headers = {
        "Content-Type": f"multipart/form-data; boundary={BOUNDARY}",
        "Content-Length": str(len(head) + size + len(tail)),
        **headers,
    }
    return raw_http.post(port, "/v1/files", headers, [head, *raw_http.pieces(size, MiB), tail], chunked=False)


def create_body(file_id: str) -> bytes:
    return json.dumps({"input_file_id": file_id, "endpoint": CHAT, "completion_window": "24h"}).encode()


def one_request_file(server: Server, tmp_path: Path) -> str:
    """A file a batch could really run (a request would start a worker): uploaded as a client does."""
    return upload(server.client(), write_requests(tmp_path / "one.jsonl", [chat_line("r0", "hi")])).id


@pytest.mark.slow
def test_serve_refuses_a_forged_host_before_reading_anything(open_server, tmp_path):
    """The names a DNS-rebinding page's requests carry: 400 for reads, uploads and batches alike."""
    port, spool = open_server.port, open_server.workdir / "tmp"
    file_id = one_request_file(open_server, tmp_path)
    before = stored(open_server)
    forged = ["attacker.example", f"attacker.example:{port}", "127.0.0.1.nip.io", "localhost.attacker.example", ""]
    for host in forged:
        for path in ("/v1/files", f"/v1/files/{file_id}/content", "/v1/batches", "/metrics"):
            code, body = send(port, "GET", path, {"Host": host})
            assert (code, body["error"]["code"]) == (400, "invalid_host"), (host, path, code, body)
    with raw_http.FolderPeak(spool) as peak:
        refused = form_upload(port, {"Host": f"attacker.example:{port}"})
    assert refused.status == 400 and "Invalid Host header" in refused.message, refused
    assert peak.bytes < MiB, f"{peak.bytes:,} bytes spooled for a forged Host"
    code, _ = send(
        port,
        "POST",
        "/v1/batches",
        {"Host": "attacker.example", "Content-Type": "application/json"},
        create_body(file_id),
    )
    assert code == 400
    assert stored(open_server) == before, "a request with a forged Host changed the store"
    for host in (f"localhost:{port}", f"[::1]:{port}", f"127.0.0.1:{port}", f"orch.example:{port}", "a.corp.example"):
        assert send(port, "GET", "/v1/files", {"Host": host})[0] == 200, host


@pytest.mark.slow
def test_serve_takes_a_batch_only_as_application_json(open_server, tmp_path):
    """A form can post text/plain (or its own types) to any site without asking: such a body is
    refused unread (415), though it holds a valid request for a file that would start a worker."""
    port, client = open_server.port, open_server.client()
    body = create_body(one_request_file(open_server, tmp_path))
    before = stored(open_server)
    for content_type in ("text/plain", "text/plain;charset=UTF-8", "application/x-www-form-urlencoded", None):
        headers = {"Content-Type": content_type} if content_type else {}
        code, answer = send(port, "POST", "/v1/batches", headers, body)
        assert code == 415 and "application/json" in answer["error"]["message"], (content_type, code, answer)
    code, answer = send(port, "POST", "/v1/batches/batch_x/cancel", {"Content-Type": "text/plain"}, b"{}")
    assert code == 415, answer
    assert stored(open_server) == before and client.batches.list().data == [], "a batch was made from a non-JSON body"
    # The same route, sent as JSON, works: an empty file's batch (it launches nothing).
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    code, answer = send(
        port,
        "POST",
        "/v1/batches",
        {"Content-Type": "application/json; charset=utf-8"},
        create_body(upload(client, empty).id),
    )
    assert code == 200, answer
    assert wait_for(client, answer["id"], final)[0].status == "completed"


@pytest.mark.slow
def test_serve_refuses_changes_from_another_origin_and_writes_nothing(open_server, tmp_path):
    port, spool = open_server.port, open_server.workdir / "tmp"
    file_id = one_request_file(open_server, tmp_path)
    before = stored(open_server)
    foreign = [
        {"Origin": f"http://127.0.0.1:{port + 1}"},  # another server on this machine
        {"Origin": f"http://localhost:{port}"},  # this port under another name: another origin
        {"Origin": "http://attacker.example"},
        {"Origin": "null"},  # a sandboxed frame, a file:// page
        {"Sec-Fetch-Site": "cross-site"},
        {"Sec-Fetch-Site": "same-site"},
    ]
    for headers in foreign:
        with raw_http.FolderPeak(spool) as peak:
            refused = form_upload(port, headers)
        assert refused.status == 403 and refused.body["error"]["code"] == "cross_origin", (headers, refused)
        assert peak.bytes < MiB, f"{peak.bytes:,} bytes spooled for {headers}"
        json_headers = {"Content-Type": "application/json", **headers}
        assert send(port, "POST", "/v1/batches", json_headers, create_body(file_id))[0] == 403, headers
        assert send(port, "DELETE", f"/v1/files/{file_id}", headers)[0] == 403, headers
        assert send(port, "POST", "/v1/batches/batch_x/cancel", json_headers)[0] == 403, headers
        assert (
            send(port, "GET", f"/v1/files/{file_id}", headers)[0] == 200
        )  # a read: the browser keeps it from the page
    assert stored(open_server) == before, "a request from another origin changed the store"
    # Its own page's requests pass.
    own = {"Origin": f"http://127.0.0.1:{port}", "Sec-Fetch-Site": "same-origin"}
    assert send(port, "DELETE", f"/v1/files/{file_id}", own)[0] == 200


@pytest.mark.slow
def test_serve_api_refuses_basic_auth_which_only_the_run_page_takes(keyed_server, open_server, tmp_path):
    """A browser sends the Basic credentials it keeps for the run page with any request to the
    server, a cross-site form's included: the API takes a Bearer key only."""
    port, spool = keyed_server.port, keyed_server.workdir / "tmp"
    basic = {"Authorization": "Basic " + base64.b64encode(f"me:{KEY}".encode()).decode()}
    code, answer = send(port, "GET", "/v1/files", basic)
    assert code == 401 and answer["error"]["code"] == "basic_auth_refused", answer
    assert "WWW-Authenticate" not in http_headers(port, "/v1/files", basic)  # so a browser never asks for it here
    file_id = one_request_file(keyed_server, tmp_path)
    before = stored(keyed_server)
    code, _ = send(port, "POST", "/v1/batches", {"Content-Type": "application/json", **basic}, create_body(file_id))
    assert code == 401
    with raw_http.FolderPeak(spool) as peak:
        assert form_upload(port, basic).status == 401
    assert peak.bytes < MiB
    assert stored(keyed_server) == before and keyed_server.client().batches.list().data == []
    assert send(port, "GET", "/v1/files", {"Authorization": f"Bearer {KEY}"})[0] == 200
    assert send(port, "GET", "/runs/batch_nope", basic)[0] == 404  # the page takes the key (an unknown run: 404)
    assert send(open_server.port, "GET", "/v1/files", basic)[0] == 401  # without keys too


def http_headers(port: int, path: str, headers: dict[str, str]) -> dict[str, str]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    try:
        conn.request("GET", path, headers=headers)
        answer = conn.getresponse()
        answer.read()
        return dict(answer.getheaders())
    finally:
        conn.close()


# -- a real browser, a page of another origin ---------------------------------------------------------
ATTACK_PAGE = """<!doctype html><html><body>
<iframe name="upload-frame"></iframe><iframe name="batch-frame"></iframe>
<form id="upload" method="post" enctype="multipart/form-data" action="{api}/files" target="upload-frame">
  <input name="purpose" value="batch"><input type="file" name="file" id="file">
</form>
<form id="batch" method="post" enctype="text/plain" action="{api}/batches" target="batch-frame">
  <input name="{json_name}" value='"}}}}'>
</form>
<script>
function submitted(form) {{
  const frame = document.querySelector(`iframe[name="${{form.target}}"]`);
  return new Promise(done => {{ frame.addEventListener("load", done, {{once: true}}); form.submit(); }});
}}
window.onload = async () => {{
  const files = new DataTransfer();
  files.items.add(new File([{line}], "evil.jsonl", {{type: "application/octet-stream"}}));
  document.getElementById("file").files = files.files;
  await submitted(document.getElementById("upload"));
  await submitted(document.getElementById("batch"));
  await fetch("/done");
}};
</script></body></html>"""


@contextmanager
def attack_site(page: str) -> Iterator[tuple[str, threading.Event]]:
    """A site of its own origin (another port on this machine) serving `page`; the event is set once the
    page says both of its forms were answered."""
    done = threading.Event()

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = page.encode() if self.path == "/" else b"ok"
            if self.path == "/done":
                done.set()
            self.send_response(200 if self.path in ("/", "/done") else 404)
            self.send_header("Content-Type", "text/html; charset=utf-8")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", done
    finally:
        server.shutdown()
        server.server_close()


@pytest.mark.slow
def test_serve_a_page_of_another_origin_in_chromium_cannot_upload_or_start_a_batch(open_server, tmp_path):
    """The classic attacks on a keyless server on 127.0.0.1, from a page the user visits: a multipart
    form carrying a file, and a text/plain form whose one field spells a JSON body. Chromium sends
    both (the server's log shows them refused); nothing is stored and no batch starts."""
    file_id = one_request_file(open_server, tmp_path)
    before = stored(open_server)
    # text/plain encodes a field as `name=value`: name and value around the `=` make one JSON object.
    json_name = json.dumps(
        {"input_file_id": file_id, "endpoint": CHAT, "completion_window": "24h", "metadata": {"x": ""}}
    )[:-3]
    line = json.dumps(json.dumps(chat_line("evil", "hi")) + "\n")  # a JavaScript string: the file's one line
    api = f"http://127.0.0.1:{open_server.port}/v1"
    page = ATTACK_PAGE.format(api=api, json_name=html.escape(json_name), line=line)
    with attack_site(page) as (site, done):
        browser = subprocess.Popen(
            [
                chromium(),
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--disable-quic",
                "--no-first-run",
                "--disable-background-networking",
                "--disable-component-update",
                "--disable-sync",
                f"--user-data-dir={tmp_path / 'profile'}",
                f"{site}/",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            answered = done.wait(timeout=120)  # a bound for a failure, not a pace: the event ends the wait
        finally:
            browser.terminate()
            browser.wait(timeout=30)
    assert answered, "the page never saw both forms answered"
    assert stored(open_server) == before, "the page's forms stored a file or made a batch"
    log = (open_server.workdir / "server.log").read_text()
    for path in ("/v1/files", "/v1/batches"):
        assert f"refused POST {path}: a page of {site} may not change anything here" in log, path


# -- orch status --web ---------------------------------------------------------------------------------
@pytest.mark.slow
def test_status_web_answers_only_to_loopback_names(tmp_path):

    run_under_way(str(tmp_path / "store"))
    with status_web("s", tmp_path, "--store", str(tmp_path / "store")) as url:
        port = int(url.split(":")[2].split("/")[0])
        for host in ("attacker.example", f"attacker.example:{port}", "127.0.0.1.nip.io", ""):
            for path in ("/runs/s", "/runs/s/status.json", "/metrics"):
                assert send(port, "GET", path, {"Host": host})[0] == 400, (host, path)
        for host in (f"127.0.0.1:{port}", f"localhost:{port}", f"[::1]:{port}"):
            assert send(port, "GET", "/runs/s/status.json", {"Host": host})[0] == 200, host
