"""Images in chat messages: `image_url` parts parsed, fetched (data:, http(s)://, s3://) and decoded for the engine.

A message whose content has `image_url` parts keeps its parts, as a vision-language model's chat
template expects them (`{"type": "image"}` where the image goes, `{"type": "text", ...}`), and
the worker fetches each image when the row reaches the engine: `data:` URLs are decoded,
`http(s)://` URLs fetched with a timeout, `s3://` through the same S3 client as the run's store
(ORCH_S3_ENDPOINT_URL for other endpoints). Every image is refused above a size limit. An image
that cannot be fetched or decoded fails its row only, with an error naming `messages`.
"""

from __future__ import annotations

import base64
import binascii
import io
import os
import urllib.error
import urllib.request
from typing import Any

from worker.wire import BadRequest

#: Seconds an http(s) image may take to answer (ORCH_IMAGE_TIMEOUT).
FETCH_TIMEOUT_S = float(os.environ.get("ORCH_IMAGE_TIMEOUT", "10"))
#: Bytes an image may have, encoded (ORCH_IMAGE_MAX_BYTES); OpenAI's limit is 20 MB.
MAX_IMAGE_BYTES = int(os.environ.get("ORCH_IMAGE_MAX_BYTES", str(20 * 2**20)))


def content_parts(parts: list[Any], message: int) -> str | list[dict[str, Any]]:
    """A message's content parts: joined text when all are text, else the parts as a template reads them."""
    if all(isinstance(p, dict) and p.get("type") == "text" for p in parts):
        return "".join(str(p.get("text", "")) for p in parts)
    out: list[dict[str, Any]] = []
    for j, part in enumerate(parts):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind == "text":
            out.append({"type": "text", "text": str(part.get("text", ""))})
        elif kind == "image_url":
            image = part.get("image_url")
            url = image.get("url") if isinstance(image, dict) else image
            if not isinstance(url, str) or not url:
                raise BadRequest("invalid_image", f"messages[{message}].content[{j}].image_url needs a url", "messages")
            out.append({"type": "image", "url": url})
        else:
            raise BadRequest(
                "unsupported_content",
                f"messages[{message}].content[{j}]: only text and image_url parts are supported",
                "messages",
            )
    return out


def image_urls(messages: list[dict[str, Any]]) -> list[str]:
    return [
        part["url"]
        for m in messages
        if isinstance(m["content"], list)
        for part in m["content"]
        if part["type"] == "image"
    ]


def load_images(urls: list[str]) -> list[Any]:
    """The images as PIL images, in order; BadRequest naming the first that cannot be had."""
    from PIL import Image, UnidentifiedImageError

    images = []
    for i, url in enumerate(urls):
        data = fetch(url, i)
        try:
            image = Image.open(io.BytesIO(data))
            image.load()
        except (UnidentifiedImageError, OSError, ValueError) as e:
            raise BadRequest(
                "invalid_image", f"image {i + 1} ({_short(url)}) is not an image: {e}", "messages"
            ) from None
        images.append(image.convert("RGB"))
    return images


def fetch(url: str, i: int = 0) -> bytes:
    """The bytes behind an image URL, at most MAX_IMAGE_BYTES."""
    where = f"image {i + 1} ({_short(url)})"
    if url.startswith("data:"):
        header, _, payload = url.partition(",")
        if not header.endswith(";base64"):
            raise BadRequest("invalid_image", f"{where}: a data URL must be base64", "messages")
        if len(payload) * 3 // 4 > MAX_IMAGE_BYTES:
            raise BadRequest("image_too_large", f"{where} is larger than {MAX_IMAGE_BYTES:,} bytes", "messages")
        try:
            return base64.b64decode(payload, validate=True)
        except (binascii.Error, ValueError) as e:
            raise BadRequest("invalid_image", f"{where}: bad base64: {e}", "messages") from None
    if url.startswith(("http://", "https://")):
        try:
            with urllib.request.urlopen(url, timeout=FETCH_TIMEOUT_S) as response:
                data = response.read(MAX_IMAGE_BYTES + 1)
        except (urllib.error.URLError, OSError, ValueError) as e:  # timeouts are OSErrors
            raise BadRequest("image_fetch_failed", f"{where} could not be fetched: {e}", "messages") from None
        return _within_limit(data, where)
    if url.startswith("s3://"):
        return _fetch_s3(url, where)
    raise BadRequest("invalid_image", f"{where}: the URL must be data:, http(s):// or s3://", "messages")


def _fetch_s3(url: str, where: str) -> bytes:
    from orchestrator.core.store import StoreError, open_store

    bucket, _, key = url.removeprefix("s3://").partition("/")
    try:
        store = open_store(f"s3://{bucket}")
        info = store.head(key)
        if info is None:
            raise BadRequest("image_fetch_failed", f"{where} does not exist", "messages")
        if info.size > MAX_IMAGE_BYTES:
            raise BadRequest("image_too_large", f"{where} is larger than {MAX_IMAGE_BYTES:,} bytes", "messages")
        return _within_limit(store.get(key).data, where)
    except StoreError as e:
        raise BadRequest("image_fetch_failed", f"{where} could not be fetched: {e}", "messages") from None


def _within_limit(data: bytes, where: str) -> bytes:
    if len(data) > MAX_IMAGE_BYTES:
        raise BadRequest("image_too_large", f"{where} is larger than {MAX_IMAGE_BYTES:,} bytes", "messages")
    return data


def _short(url: str) -> str:
    return url if len(url) <= 60 else url[:57] + "..."
