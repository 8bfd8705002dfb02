"""The scripted engine: answers each request from its own text, without a model, for tests of everything but the LLM.

A test that checks the controller's protocol, recovery or status needs real worker processes
(the store, the leases, the checkpoints, the heartbeats, the kills) but not a model's words:
this engine runs inside the real worker in a model's place, and imports neither vLLM nor torch,
so a worker starts in a second instead of a minute. It is chosen only by the worker's
environment, `ORCH_TEST_ENGINE=scripted` (worker/engine/__init__.py), never by a run's spec.

What it answers, the same for the same request:
- the text is "Scripted answer to: " followed by the last user message (a completion's prompt),
  one token per word, said again and again up to max_tokens (finish_reason "length"), as the
  tests' tiny random-weight model, which never stops early, answers; cut at the first stop string
  (finish_reason "stop"); `n` identical choices;
- its usage counts words: the prompt's words in, the answer's words out;
- /v1/embeddings, /v1/score and /v1/rerank lines are error rows (it answers no pooling runner),
  and so is a prompt whose words and max_tokens pass the model's context, as vLLM refuses it.
How fast it answers: rows run side by side as in vLLM's continuous batching, `capacity` at
once (`model.engine_args.max_num_seqs`, else DEFAULT_CAPACITY); each engine step writes one
word of every running row and takes `ORCH_TEST_ENGINE_STEP_S` seconds (default 0: no pause,
the rows then finish as soon as they are pulled), and loading it takes `ORCH_TEST_ENGINE_LOAD_S`
seconds (default 0). A test that must land a kill or a SIGTERM mid-chunk, or see a worker
loading, sets a pace, so a chunk lasts long enough to checkpoint in between.
It loads a model as an engine would begin to: a local directory must hold a config.json that
names a `model_type`, else the load fails (EngineLoadError), as a model no engine can load fails.
"""

from __future__ import annotations

import json
import os
import time
from collections import deque
from collections.abc import Generator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from orchestrator.core.errors import EngineLoadError
from orchestrator.core.model_source import is_local_path, served_name
from orchestrator.core.spec import ModelSpec
from worker.engine.vllm_engine import CPU_MAX_MODEL_LEN
from worker.outputs import Choice, success_line
from worker.wire import POOLING_KINDS, EngineRequest, GenerationParams, RowResult, error_row

#: The environment variable that selects a test engine for the worker (the one value: "scripted").
TEST_ENGINE_ENV = "ORCH_TEST_ENGINE"
#: Seconds one engine step takes (one word of every running row); unset or 0: no pause.
STEP_ENV = "ORCH_TEST_ENGINE_STEP_S"
#: Seconds loading the engine takes (what a worker spends "loading"); unset or 0: none.
LOAD_ENV = "ORCH_TEST_ENGINE_LOAD_S"
#: Rows generated side by side when the spec sets no `max_num_seqs`.
DEFAULT_CAPACITY = 64
#: Every answer starts with these words, so that an answer is never the question alone.
ANSWER_OPENING = ("Scripted", "answer", "to:")
_END: Any = object()


@dataclass
class _Running:
    """A request being answered: its words, and how many of them are written so far."""

    request: EngineRequest
    words: list[str]
    finish_reason: str
    written: int = 0


class ScriptedEngine:
    """The engine interface (worker/engine/base.py) answered from each request's own text."""

    name = "scripted"
    accelerator = "cpu"

    def __init__(
        self,
        spec: ModelSpec,
        *,
        max_in_flight: int | None = None,
        step_s: float | None = None,
        load_s: float | None = None,
    ):
        """The pace, `step_s` and `load_s`, is the environment's (STEP_ENV, LOAD_ENV) unless given."""
        if not spec.name:
            raise ValueError("no model to load")
        config = _model_config(spec.name)
        time.sleep(_seconds(LOAD_ENV) if load_s is None else load_s)
        #: As vLLM on a CPU: the spec's, else the model's own context, at most CPU_MAX_MODEL_LEN.
        self.max_model_len = spec.max_model_len or min(
            int(config.get("max_position_embeddings") or CPU_MAX_MODEL_LEN), CPU_MAX_MODEL_LEN
        )
        self.model_name = served_name(spec.name, spec.engine_args)
        self.capacity = self.batch_rows = int(spec.engine_args.get("max_num_seqs") or DEFAULT_CAPACITY)
        # As the vLLM engine: more waiting than running, so a finished row is replaced at the next step.
        self.max_in_flight = max_in_flight or max(4 * self.capacity, 256)
        self.sampling_defaults: dict[str, Any] = {}
        self.step_s = _seconds(STEP_ENV) if step_s is None else step_s
        self._waiting: deque[_Running] = deque()
        self._running: list[_Running] = []
        self._aborted = False

    # -- Engine ------------------------------------------------------------------------------
    def run(self, requests: Iterator[EngineRequest | None]) -> Generator[list[RowResult], None, None]:
        self._aborted = False
        exhausted = False
        while not self._aborted:
            refused: list[RowResult] = []
            # 1. Pull requests while there is room, the worker has more for now, and some are left.
            while not exhausted and len(self._waiting) + len(self._running) < self.max_in_flight:
                request = next(requests, _END)
                if request is _END:
                    exhausted = True
                    break
                if request is None:
                    break
                row = self._admit(request)
                if isinstance(row, RowResult):
                    refused.append(row)
                else:
                    self._waiting.append(row)
            if not self._waiting and not self._running:
                if refused or not exhausted:
                    yield refused  # the worker sends "nothing for now" only while rows are unfinished
                if exhausted:
                    return
                continue
            # 2. One step: every running row writes a word; or, with no pace, all of them finish now.
            yield refused + self._step()

    def abort(self, chunk: str | None = None) -> None:
        if chunk is None:
            self._aborted = True
        self._waiting = deque(r for r in self._waiting if chunk is not None and r.request.chunk != chunk)
        self._running = [r for r in self._running if chunk is not None and r.request.chunk != chunk]

    def close(self) -> None:
        self.abort()

    # -- one request ---------------------------------------------------------------------------
    def _admit(self, request: EngineRequest) -> _Running | RowResult:
        if request.kind in POOLING_KINDS:
            return error_row(
                request, "unsupported_url", "the scripted engine answers chat, completion and response lines only"
            )
        prompt_tokens, max_tokens = len(_prompt_text(request).split()), request.params.max_tokens
        if prompt_tokens + max_tokens > self.max_model_len:  # as worker/prompts.py words it
            return error_row(
                request,
                "context_length_exceeded",
                f"this model's maximum context length is {self.max_model_len} tokens; the request has "
                f"{prompt_tokens} prompt tokens and asks for {max_tokens} more",
                param="max_tokens" if prompt_tokens < self.max_model_len else "messages",
            )
        words, finish = answer_words(request.params, _question(request))
        return _Running(request, words, finish)

    def _step(self) -> list[RowResult]:
        while self._waiting and len(self._running) < self.capacity:
            self._running.append(self._waiting.popleft())
        if self.step_s > 0:
            time.sleep(self.step_s)
            for row in self._running:
                row.written += 1
        else:
            for row in self._running:
                row.written = len(row.words)
        finished = [row for row in self._running if row.written >= len(row.words)]
        self._running = [row for row in self._running if row.written < len(row.words)]
        return [self._result(row) for row in finished]

    def _result(self, row: _Running) -> RowResult:
        request = row.request
        text = " ".join(row.words)
        choices = [Choice(text, row.finish_reason, len(row.words)) for _ in range(request.params.n)]
        if request.params.echo and request.kind == "completion":
            for choice in choices:
                choice.echo = _prompt_text(request)
        prompt_tokens = len(_prompt_text(request).split())
        line = success_line(request, choices, prompt_tokens, self.model_name)
        tokens_out = sum(c.tokens for c in choices)
        return RowResult(request.index, request.custom_id, line, prompt_tokens, tokens_out, False, request.chunk)


def answer_words(params: GenerationParams, question: str) -> tuple[list[str], str]:
    """The scripted answer to `question` under `params`: its words and its finish reason."""
    said = [*ANSWER_OPENING, *question.split()]
    words = (said * (params.max_tokens // len(said) + 1))[: params.max_tokens]
    text = " ".join(words)
    stops = [at for at in (text.find(stop) for stop in params.stop) if at >= 0]
    if stops:
        return text[: min(stops)].split(), "stop"
    return words, "length"


def _question(request: EngineRequest) -> str:
    """The last user message's text (a chat, a Responses line), or a completion's prompt."""
    if request.messages is not None:
        users = [m for m in request.messages if m.get("role") == "user"] or request.messages
        return _content_text(users[-1].get("content")) if users else ""
    return _prompt_text(request)


def _prompt_text(request: EngineRequest) -> str:
    if request.messages is not None:
        return " ".join(_content_text(m.get("content")) for m in request.messages)
    prompt = request.prompt
    if isinstance(prompt, tuple):
        return " ".join(str(token) for token in prompt)
    return prompt or ""


def _content_text(content: Any) -> str:
    """A message's text: a string, or the text parts of a list of parts (images are left out)."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return " ".join(str(p.get("text", "")) for p in content if isinstance(p, dict) and p.get("type") == "text")
    return ""


def _model_config(name: str) -> dict[str, Any]:
    """The model's config.json: a local model directory must hold a readable one naming a
    `model_type` (what an engine reads first); a name that is no local path is no model here (tests
    run without a hub)."""
    if not is_local_path(name):
        raise EngineLoadError(f"the scripted engine cannot load {name!r}: it loads local model directories only")
    config = Path(name).expanduser() / "config.json"
    try:
        document = json.loads(config.read_text())
    except (OSError, ValueError) as e:
        raise EngineLoadError(f"the scripted engine cannot load {name!r}: {config}: {e}") from None
    if not isinstance(document, dict) or not document.get("model_type"):
        raise EngineLoadError(f"the scripted engine cannot load {name!r}: {config} names no model_type")
    return document


def _seconds(variable: str) -> float:
    given = os.environ.get(variable, "").strip()
    try:
        seconds = float(given) if given else 0.0
    except ValueError:
        raise EngineLoadError(f"{variable}={given!r}: expected seconds, e.g. 0.05") from None
    if seconds < 0:
        raise EngineLoadError(f"{variable}={given!r}: expected seconds, 0 or more")
    return seconds
