"""Images in chat messages: data:, http:// and s3:// image_url parts on a tiny vision-language model; bad images fail their row only."""

from __future__ import annotations

import base64
import contextlib
import http.server
import io
import socket
import threading
import time

import pytest

from tests.support.engines import body_of, requests, run
from worker import images

pytestmark = pytest.mark.slow


def png(color: tuple[int, int, int], size: int = 32) -> bytes:
    from PIL import Image

    out = io.BytesIO()
    Image.new("RGB", (size, size), color).save(out, format="PNG")
    return out.getvalue()


def noise_png(size: int) -> bytes:
    """Random pixels: a PNG that does not compress (about 3 bytes a pixel)."""
    import os

    from PIL import Image

    out = io.BytesIO()
    Image.frombytes("RGB", (size, size), os.urandom(size * size * 3)).save(out, format="PNG")
    return out.getvalue()


def data_url(data: bytes) -> str:
    return "data:image/png;base64," + base64.b64encode(data).decode()


def ask(url: str, text: str = "What is in the image?") -> dict:
    content = [{"type": "text", "text": text}, {"type": "image_url", "image_url": {"url": url}}]
    return {"messages": [{"role": "user", "content": content}], "max_tokens": 6, "ignore_eos": True}


@pytest.fixture
def image_server():
    """A real HTTP server on 127.0.0.1: /red.png, /big.png, and /slow.png that answers after 3 s."""
    files = {"/red.png": png((255, 0, 0)), "/big.png": noise_png(128)}

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            if self.path == "/slow.png":
                time.sleep(3)
            data = files.get(self.path, files["/red.png"] if self.path == "/slow.png" else None)
            if data is None:
                self.send_error(404)
                return
            self.send_response(200)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            with contextlib.suppress(BrokenPipeError, ConnectionResetError):  # the slow image's reader gave up
                self.wfile.write(data)

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


@pytest.fixture
def image_bucket(seaweedfs_server, seaweedfs_bucket, monkeypatch):
    """A real S3 server (SeaweedFS, its own process: moto's in-process Flask trips vLLM's start-up)."""
    seaweedfs_server.client().put_object(Bucket=seaweedfs_bucket, Key="img/red.png", Body=png((255, 0, 0)))
    monkeypatch.setenv("ORCH_S3_ENDPOINT_URL", seaweedfs_server.endpoint)
    return seaweedfs_bucket


def test_images_from_data_http_and_s3_urls_reach_the_model(vlm_engine, image_server, image_bucket):
    red = png((255, 0, 0))
    out = run(
        vlm_engine,
        requests(
            ask(data_url(red)),
            ask(f"{image_server}/red.png"),
            ask(f"s3://{image_bucket}/img/red.png"),
            {"messages": [{"role": "user", "content": "What is in the image?"}], "max_tokens": 6, "ignore_eos": True},
        ),
    )
    assert not any(row.error for row in out.values()), [row.line.error for row in out.values()]
    texts = [body_of(out[f"r{i}"])["choices"][0]["message"]["content"] for i in range(3)]
    assert texts[0] == texts[1] == texts[2]  # the same image, however it came
    # The image's tokens are in the prompt: the processor's placeholders, beyond the text row's.
    with_image, text_only = out["r0"].tokens_in, out["r3"].tokens_in
    assert with_image > text_only


def test_images_bad_or_unreachable_image_is_an_error_row_for_that_line_only(
    vlm_engine, image_server, image_bucket, monkeypatch
):
    monkeypatch.setattr(images, "FETCH_TIMEOUT_S", 1.0)
    monkeypatch.setattr(images, "MAX_IMAGE_BYTES", 2000)  # the one-colour PNG fits, the 49 kB noise does not
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        closed = s.getsockname()[1]
    cases = {
        "r0": (ask(f"{image_server}/red.png"), None),
        "r1": (ask(f"{image_server}/slow.png"), "image_fetch_failed"),  # times out
        "r2": (ask(f"{image_server}/big.png"), "image_too_large"),
        "r3": (ask(f"http://127.0.0.1:{closed}/x.png"), "image_fetch_failed"),
        "r4": (ask(f"{image_server}/missing.png"), "image_fetch_failed"),
        "r5": (ask(data_url(b"not an image")), "invalid_image"),
        "r6": (ask(f"s3://{image_bucket}/img/missing.png"), "image_fetch_failed"),
        "r7": (ask("ftp://example.com/x.png"), "invalid_image"),
    }
    out = run(vlm_engine, requests(*(body for body, _ in cases.values())))
    for custom_id, (_, code) in cases.items():
        row = out[custom_id]
        if code is None:
            assert not row.error
        else:
            assert row.error and row.line.error.code == code, (custom_id, row.line.error)
            assert row.line.response.body["error"]["param"] == "messages"


def test_images_a_text_model_refuses_an_image_row(tiny_engine):
    row = run(tiny_engine, requests(ask(data_url(png((0, 255, 0))))))["r0"]
    assert row.error and row.line.response.status_code == 400
