"""Answer keys: a 16-byte key per request from what decides its answer, so a later run can reuse it.

A row's key is a keyed BLAKE2b of its canonical request line without the custom_id (method, url
and body: messages or prompt, every sampling and structured-output field the row sets), under a
run-wide context digest of everything else that decides the answer:

- the spec's sampling defaults (what the worker applies to fields a body leaves unset) and how
  unknown body fields are treated;
- the model: its served name and the content identity of its weights (a local directory: the
  bytes of every small file, config.json, generation_config.json, the tokenizer and its chat
  template, and the names and sizes of the weight files; a hub id: the revision cached locally
  or asked for in engine_args, else the id itself);
- every LoRA adapter (same identity), and the engine settings that change answers (engine,
  dtype, max_model_len, chat template, runner, tool and reasoning parsers, engine_args other than
  memory and speed knobs).

Nothing else: the row's position, file, custom_id and chunking do not enter. Two rows that differ
only in the order of their body's keys get two keys (no reuse between them, never a wrong one).
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

from orchestrator.core.model_source import is_bucket_url, is_local_path, served_name
from orchestrator.core.pools import spec_for_pool
from orchestrator.core.spec import RunSpec
from orchestrator.prepare.formats import Request

KEY_BYTES = 16
#: Bumped when what a key covers changes: keys of another version never match.
KEY_VERSION = 1
#: Files of a model directory up to this size are hashed whole; larger ones (weights) by name and size.
SMALL_FILE = 32 << 20
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
#: Below this temperature sampling is greedy (vLLM's threshold, as the worker applies it).
GREEDY_BELOW = 1e-5
_METHOD = b',"method":'


def content_identity(name: str, engine_args: dict[str, Any] | None = None) -> dict[str, Any]:
    """What a model or adapter is, by content: a local directory's files, a hub id's revision."""
    if not name:
        return {"unnamed": True}  # keys without a model are not recorded (AnswerKeys.usable)
    if is_bucket_url(name) or not is_local_path(name):
        revision = (engine_args or {}).get("revision") or _cached_revision(name)
        return {"hub": name, "revision": revision}
    path = Path(name).expanduser()
    if path.is_file():
        return {"file": path.name, "bytes": path.stat().st_size}
    files: dict[str, Any] = {}
    for file in sorted(p for p in path.rglob("*") if p.is_file() and not p.name.startswith(".")):
        size = file.stat().st_size
        rel = file.relative_to(path).as_posix()
        files[rel] = hashlib.sha256(file.read_bytes()).hexdigest() if size <= SMALL_FILE else size
    return {"files": files}


def _cached_revision(hub_id: str) -> str | None:
    """The commit the local Hugging Face cache resolves `main` to, if the model is cached here."""
    home = Path(os.environ.get("HF_HUB_CACHE") or Path(os.environ.get("HF_HOME", "~/.cache/huggingface")) / "hub")
    ref = home.expanduser() / f"models--{hub_id.replace('/', '--')}" / "refs" / "main"
    return ref.read_text().strip() if ref.is_file() else None


def key_context(spec: RunSpec) -> dict[str, Any]:
    """Everything run-wide that decides an answer (see the module docstring), as plain data."""
    model = spec.model
    name = model.name or ""
    return {
        "version": KEY_VERSION,
        "model": {"served": served_name(name, model.engine_args), **content_identity(name, model.engine_args)},
        "engine": {
            "engine": model.engine,
            "dtype": model.dtype,
            "max_model_len": model.max_model_len,
            "chat_template": model.chat_template,
            "runner": model.runner,
            "tool_parser": model.tool_parser,
            "reasoning_parser": model.reasoning_parser,
            "max_lora_rank": model.max_lora_rank,
            "engine_args": {k: v for k, v in sorted(model.engine_args.items()) if k not in _NOT_ANSWERS},
        },
        "lora": {n: content_identity(p) for n, p in sorted(model.lora.items())},
        "sampling": spec.sampling.model_dump(mode="json"),
        "unknown_fields": spec.requests.unknown_fields,
    }


def context_digest(context: dict[str, Any]) -> bytes:
    return hashlib.blake2b(json.dumps(context, sort_keys=True, default=str).encode(), digest_size=32).digest()


class LineKeys:
    """The key of each request line of one run, under the run's context digest (recorded at prepare,
    so collect keys the chunks' lines without the model at hand)."""

    def __init__(self, digest: bytes):
        self.digest = digest
        self.base = hashlib.blake2b(digest_size=KEY_BYTES, key=digest)  # copied per line: cheaper than a new one

    def of_line(self, line: bytes) -> bytes:
        """The key of a canonical request line (prepare writes `{"custom_id":…,"method":…}`: the
        first `,"method":` is structural, as a quote inside a JSON string is always escaped)."""
        h = self.base.copy()
        h.update(memoryview(line)[line.find(_METHOD) :])
        return h.digest()


class AnswerKeys(LineKeys):
    """LineKeys for a spec, and whether a request samples (for reuse)."""

    def __init__(self, spec: RunSpec):
        self.context = key_context(spec)
        super().__init__(context_digest(self.context))
        #: A model named only at launch is not in the keys: such a run keeps no key digest.
        self.usable = bool(spec.model.name)
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
