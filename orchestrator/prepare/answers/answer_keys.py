"""Answer keys: a 16-byte key per request from what decides its answer, so a later run can reuse it.

A row's key is a keyed BLAKE2b of its canonical request line without the custom_id and without
`body.model` (method, url and the rest of the body: messages or prompt, every sampling and
structured-output field the row sets), under a run-wide context digest of everything else that
decides the answer:

- the spec's sampling defaults (what the worker applies to fields a body leaves unset) and how
  unknown body fields are treated;
- the model by content alone: a local directory's every file (config, tokenizer, chat template,
  weights) by SHA-256 (core/file_digests.py remembers a file's digest while it is unchanged); a
  single .gguf file likewise; a hub id by its revision (asked for in engine_args, else the one
  the local cache resolves), else the id itself;
- every LoRA adapter (same identity), and the engine settings that change answers (engine,
  dtype, max_model_len, the chat template's text, runner, tool and reasoning parsers, engine_args
  other than memory, speed and naming knobs);
- the spec's response_format with its JSON schema's text (the lines carry only the schema's
  reference, core/request/json_schema.py).

Nothing that only names a thing: not the model's path, its served name, a `models:` name, an
alias or a sweep arm's name (the same weights under two names or paths share their keys), nor the
row's position, file, custom_id or chunking. Two rows that differ only in the order of their
body's keys get two keys (no reuse between them, never a wrong one).
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import orjson

from orchestrator.core.file_digests import file_sha256
from orchestrator.core.model_source import is_bucket_url, is_local_path
from orchestrator.core.pools import spec_for_pool
from orchestrator.core.request.json_schema import schema_text
from orchestrator.core.spec import RunSpec
from orchestrator.prepare.formats import Request

KEY_BYTES = 16
#: Bumped when what a key covers changes: keys of another version never match.
#: 2: weights by content, the chat template's text, no model name or path (body.model) in a key.
KEY_VERSION = 2
#: engine_args that change memory use or speed, not answers.
_NOT_ANSWERS = {
    "gpu_memory_utilization",
    "kv_cache_memory_bytes",
    "max_num_seqs",
    "max_num_batched_tokens",
    "enforce_eager",
    "swap_space",
    "cpu_offload_gb",
    "served_model_name",
    "disable_log_stats",
    "enable_prefix_caching",
    "download_dir",
}
#: engine_args that name files: keyed by the files' content, not the path.
_PATH_ARGS = {"tokenizer"}
#: Below this temperature sampling is greedy (vLLM's threshold, as the worker applies it).
GREEDY_BELOW = 1e-5
_METHOD = b',"method":'
_URL = b'"url":"'
_BODY = b',"body":{'
_BODY_MODEL = _BODY + b'"model":"'


def content_identity(name: str, engine_args: dict[str, Any] | None = None) -> dict[str, Any]:
    """What a model or adapter is, by content: a local file's or directory's bytes, a hub id's revision."""
    if not name:
        return {"unnamed": True}  # keys without a model are not recorded (AnswerKeys.usable)
    if is_bucket_url(name) or not is_local_path(name):
        revision = (engine_args or {}).get("revision") or _cached_revision(name)
        return {"hub": name, "revision": revision}
    path = Path(name).expanduser()
    if path.is_file():
        return {"file": file_sha256(path)}  # a .gguf: its bytes, not its name
    files = sorted(p for p in path.rglob("*") if p.is_file() and not p.name.startswith("."))
    return {"files": {file.relative_to(path).as_posix(): file_sha256(file) for file in files}}


def _cached_revision(hub_id: str) -> str | None:
    """The commit the local Hugging Face cache resolves `main` to, if the model is cached here."""
    home = Path(os.environ.get("HF_HUB_CACHE") or Path(os.environ.get("HF_HOME", "~/.cache/huggingface")) / "hub")
    ref = home.expanduser() / f"models--{hub_id.replace('/', '--')}" / "refs" / "main"
    return ref.read_text().strip() if ref.is_file() else None


def key_context(spec: RunSpec) -> dict[str, Any]:
    """Everything run-wide that decides an answer (see the module docstring), as plain data."""
    model = spec.model
    name = model.name or ""
    context: dict[str, Any] = {
        "version": KEY_VERSION,
        "model": content_identity(name, model.engine_args),
        "engine": {
            "engine": model.engine,
            "dtype": model.dtype,
            "max_model_len": model.max_model_len,
            # The text (spec_load reads a template's file): editing the file changes every key.
            "chat_template": _text_digest(model.chat_template),
            "runner": model.runner,
            "tool_parser": model.tool_parser,
            "reasoning_parser": model.reasoning_parser,
            "max_lora_rank": model.max_lora_rank,
            "engine_args": {
                k: content_identity(v) if k in _PATH_ARGS and isinstance(v, str) else v
                for k, v in sorted(model.engine_args.items())
                if k not in _NOT_ANSWERS
            },
        },
        # A line's body.model naming an adapter stays in its key (LineKeys.adapters): the name picks these bytes.
        "lora": {n: content_identity(p) for n, p in sorted(model.lora.items())},
        "sampling": spec.sampling.model_dump(mode="json"),
        "unknown_fields": spec.requests.unknown_fields,
    }
    if spec.input.response_format is not None:
        # The lines hold the schema's reference (its digest: a key covers it already); the context
        # holds the whole response_format's text too, so no key ever stands for a schema it did not
        # see. Only when set: a run without one keys as before, its earlier runs' answers still found.
        context["response_format"] = _text_digest(schema_text(spec.input.response_format))
    return context


def _text_digest(text: str | None) -> str | None:
    return None if text is None else hashlib.sha256(text.encode()).hexdigest()


def context_digest(context: dict[str, Any]) -> bytes:
    return hashlib.blake2b(json.dumps(context, sort_keys=True, default=str).encode(), digest_size=32).digest()


class LineKeys:
    """The key of each request line of one run, under the run's context digest (recorded at prepare,
    so collect keys the chunks' lines without the model at hand). `adapters`: the LoRA adapter names
    of the run's model, the only values of body.model that stay in a key (they pick the weights)."""

    def __init__(self, digest: bytes, adapters: Iterable[str] = ()):
        self.digest = digest
        self.base = hashlib.blake2b(digest_size=KEY_BYTES, key=digest)  # copied per line: cheaper than a new one
        # As they appear between the quotes of a line written by orjson.
        self.adapters = {orjson.dumps(name)[1:-1] for name in adapters}

    def of_line(self, line: bytes) -> bytes:
        """The key of a canonical request line: `{"custom_id":…,"method":…,"url":…,"body":{…}}`, with
        a string body.model first in the body (formats.encode_request). The first `,"method":` is
        structural, as a quote inside a JSON string is always escaped; a URL holds no quote."""
        h = self.base.copy()
        view = memoryview(line)
        start = line.find(_METHOD)
        url = line.find(_URL, start) + len(_URL)
        body = line.find(b'"', url) + 1
        if line.startswith(_BODY_MODEL, body):
            value = body + len(_BODY_MODEL)
            end = _string_end(line, value)
            if line[value:end] not in self.adapters:
                # The model's name or path: the context digest holds what it is, by content.
                h.update(view[start : body + len(_BODY)])
                h.update(view[end + 2 if line[end + 1 : end + 2] == b"," else end + 1 :])
                return h.digest()
        h.update(view[start:])
        return h.digest()


def _string_end(line: bytes, at: int) -> int:
    """Where the JSON string that starts at `at` ends: its closing quote, one no backslash escapes."""
    end = line.find(b'"', at)
    while end > 0:
        before = end - 1
        while line[before] == 0x5C:  # a backslash
            before -= 1
        if (end - 1 - before) % 2 == 0:
            return end
        end = line.find(b'"', end + 1)
    raise ValueError("a request line whose body.model string does not end")


class AnswerKeys(LineKeys):
    """LineKeys for a spec, and whether a request samples (for reuse)."""

    def __init__(self, spec: RunSpec):
        self.context = key_context(spec)
        super().__init__(context_digest(self.context), spec.model.lora)
        #: A model named only at launch is not in the keys: such a run keeps no key digest.
        self.usable = bool(spec.model.name)
        self.adapter_names = sorted(spec.model.lora)
        sampling = spec.sampling
        self.default_temperature = sampling.temperature
        if self.default_temperature is None:  # the worker takes the model's own, else OpenAI's 1.0
            self.default_temperature = _model_temperature(spec.model.name or "")
        self.default_seeded = sampling.seed is not None

    @property
    def samples_by_default(self) -> bool:
        """A request that names no temperature or seed samples."""
        return _samples(self.default_temperature, self.default_seeded)

    def of_request(self, request: Request) -> bytes:
        return self.of_line(request.line)

    def sampled(self, request: Request) -> bool:
        """temperature > 0 without a seed, with the worker's defaults resolved."""
        temperature = request.temperature if request.temperature is not None else self.default_temperature
        return _samples(temperature, request.seeded if request.seeded is not None else self.default_seeded)


class PoolKeys:
    """The answer keys of a run of several models or a sweep: each model pool keys its rows under its
    own context (its served name, weights and engine settings, as a run of that model alone would),
    chosen by the request's pool. An arm's prompt and sampling are in its request body already."""

    def __init__(self, spec: RunSpec):
        #: `models:` names; "" for a sweep of the run's one model (what Request.pool is then).
        self.pools = {name: AnswerKeys(spec_for_pool(spec, name or None)) for name in list(spec.models) or [""]}
        self.usable = all(keys.usable for keys in self.pools.values())

    @property
    def digests(self) -> dict[str, str]:
        """Each pool's context digest (hex), as the prepare record keeps them for collect."""
        return {name: keys.digest.hex() for name, keys in self.pools.items()} if self.usable else {}

    @property
    def adapters(self) -> dict[str, list[str]]:
        """Each pool's adapter names, as the prepare record keeps them (PrepareRecord.key_adapters)."""
        return {name: keys.adapter_names for name, keys in self.pools.items() if keys.adapter_names}

    def of_request(self, request: Request) -> bytes:
        return self.pools[request.pool or ""].of_line(request.line)

    def sampled(self, request: Request) -> bool:
        return self.pools[request.pool or ""].sampled(request)


def _samples(temperature: float | None, seeded: bool) -> bool:
    """temperature > 0 (None: OpenAI's 1.0) without a seed."""
    return (temperature is None or temperature >= GREEDY_BELOW) and not seeded


def _model_temperature(name: str) -> float | None:
    """generation_config.json's temperature of a local model (None: OpenAI's 1.0 applies)."""
    config = Path(name).expanduser() / "generation_config.json"
    if not (name and is_local_path(name) and config.is_file()):
        return None
    try:
        value = json.loads(config.read_text()).get("temperature")
        return float(value) if value is not None else None
    except (ValueError, TypeError, AttributeError):
        return None
