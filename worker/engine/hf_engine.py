"""The transformers engine: for machines without vLLM. Same interface, same output lines, the device kept full.

transformers' own continuous batching (`generate_batch`, `init_continuous_batching`) was measured
against this (docs/BENCHMARKS.md): tuned, it ran at 0.47x of one `generate` call on a CPU; with
defaults, at 0.48-0.70x on an H100, where static batches of 256 ran at 0.84-0.86x. It honours
temperature, top-k and top-p per request but not seed, n, min_tokens, repetition penalty or top
logprobs. So:
1. Requests are pulled into a pool of up to `capacity` prompts, refilled after every batch.
2. The next batch is built around the oldest request in the pool: the requests that generate
   alike (same parameters; max_tokens and stop strings aside), the closest to it in length, as
   many as `max_batch_size` sequences and `max_batch_tokens` padded tokens allow
   (orchestrator/core/static_batches.py, which the forecast replays).
3. One `model.generate` call runs the batch; each row stops at its own max_tokens.
Per-request parameters are honoured exactly: a sampled request with a seed is generated alone,
so its answer depends on the request only, never on what shared its batch. Differences from
vLLM, each an error row rather than a different answer: presence/frequency penalties
(transformers has no equivalent), constrained decoding (`response_format` json_object /
json_schema, `structured_outputs`) and `tools`, which need vLLM's grammar backends and tool
parsers. `logit_bias` is honoured (transformers' sequence bias over single tokens).

Limits come from the spec (`model.engine_args`: max_batch_size, max_batch_tokens; every other key
goes to `from_pretrained`); by default they fill about half the device memory left after the weights.

On a GPU, PyTorch's cuDNN attention is turned off for the worker's process: it builds a plan for
every new (batch size, length) it meets, about 3 s each on an H100, and this engine's batches are
seldom the same shape twice. Measured on an H100 (docs/BENCHMARKS.md): a batch of a new size took
5.0 s against 2.1 s once its plans were built; with the flash and memory-efficient kernels instead,
2.1-2.6 s every time.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Generator, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, StoppingCriteria

from orchestrator.core.errors import SpecError
from orchestrator.core.model_source import served_name
from orchestrator.core.spec import ModelSpec
from orchestrator.core.static_batches import POOL_BATCHES, BatchLimits, pick_batch
from worker.outputs import Choice, TokenLogprob, success_line
from worker.prompts import PromptBuilder
from worker.wire import POOLING_KINDS, EngineRequest, GenerationParams, RowResult, error_row

#: engine_args this engine reads itself; the others are keyword arguments of `from_pretrained`.
BATCH_ARGS = ("max_batch_size", "max_batch_tokens")
#: Sequences per batch when the spec sets none: past this, a bigger batch gains little on a GPU
#: and much on neither side of a CPU's cache.
DEFAULT_BATCH_SIZE = {"cuda": 1024, "cpu": 256}
#: Share of the memory left after the weights that one batch may take (its KV cache, activations,
#: logits); the rest absorbs what the estimate misses.
MEMORY_SHARE = 0.5
#: A CPU's memory is shared with everything else on the machine: at most this much per batch.
CPU_MEMORY_CAP = 4 * 2**30
_END: Any = object()


@dataclass(eq=False)
class _Ready:
    """A request in the pool, its prompt built."""

    request: EngineRequest
    ids: list[int]
    key: tuple[Any, ...]

    # What the batch picker reads (orchestrator/core/static_batches.py).
    @property
    def prompt_len(self) -> int:
        return len(self.ids)

    @property
    def max_tokens(self) -> int:
        return self.request.params.max_tokens

    @property
    def sequences(self) -> int:
        return self.request.params.n

    @property
    def logprobs(self) -> bool:
        return self.request.params.logprobs is not None


class TransformersEngine:
    name = "transformers"

    def __init__(self, spec: ModelSpec, *, max_in_flight: int | None = None, batch_size: int | None = None):
        if not spec.name:
            raise ValueError("no model to load")
        self.model_name = served_name(spec.name, spec.engine_args)  # what outputs say in body.model
        batch_args, load_args = _split_engine_args(spec.engine_args)
        self.device = "cuda" if torch.cuda.is_available() else "cpu"
        if self.device == "cuda":
            torch.backends.cuda.enable_cudnn_sdp(False)  # a plan per new shape: the module docstring
        self.tokenizer = AutoTokenizer.from_pretrained(spec.name)
        self.tokenizer.padding_side = "left"
        if self.tokenizer.pad_token_id is None:
            self.tokenizer.pad_token = self.tokenizer.eos_token
        # Loaded, then moved: a `device_map` needs accelerate, which a machine with only PyTorch and
        # transformers lacks (the spec's engine_args may still give one, accelerate installed).
        model = AutoModelForCausalLM.from_pretrained(
            spec.name, dtype=_dtype(spec.dtype, spec.name, self.device), **load_args
        )
        self.model = (model if "device_map" in load_args else model.to(self.device)).eval()
        # generate stops at any of the model's end tokens (an instruct model often has several).
        stops = self.model.generation_config.eos_token_id
        self.eos_ids = {self.tokenizer.eos_token_id, *(stops if isinstance(stops, list) else [stops])} - {None}
        self.sampling_defaults = _sampling_defaults(self.model.generation_config)
        self.max_model_len: int = spec.max_model_len or int(getattr(self.model.config, "max_position_embeddings", 2048))
        self.prompts = PromptBuilder(self.tokenizer, spec.chat_template, self.max_model_len)
        self.limits = _limits(self.model, self.device, batch_args, batch_size)
        self.capacity = max_in_flight or POOL_BATCHES * self.limits.max_batch_size
        self.batch_rows = self.limits.max_batch_size
        self.accelerator = torch.cuda.get_device_name(0) if self.device == "cuda" else "cpu"
        self._pool: list[_Ready] = []
        self._aborted = False
        self._alone = 0  # a distinct key for each request generated alone
        self._warm_up()

    def _warm_up(self) -> None:
        """One small `generate` at load: a GPU's first call loads its kernels and sets up cuBLAS and
        the allocator. Left to the first batch, that is engine time on the first rows, which a probe
        measures its rate from (planning/forecast.py): on an H200 a probe's 64 rows took 1.71 s
        where its run's rows took 13-18 ms each (0.9 s for 64). Paid here, it is part of the load.
        On a CPU it costs 10-20 ms (tiny Llama), and what it saves the first batch there is within
        the noise; it runs there too, so that every test of this engine runs it."""
        ids = torch.full((2, 8), self.tokenizer.pad_token_id, device=self.device)
        with torch.inference_mode():
            self.model.generate(
                input_ids=ids,
                attention_mask=torch.ones_like(ids),
                max_new_tokens=4,
                min_new_tokens=4,
                do_sample=False,
                pad_token_id=self.tokenizer.pad_token_id,
            )

    # -- Engine ------------------------------------------------------------------------------
    def run(self, requests: Iterator[EngineRequest | None]) -> Generator[list[RowResult], None, None]:
        self._aborted = False
        exhausted = False
        while not self._aborted:
            errors: list[RowResult] = []
            # Step 1: refill the pool until it is full, the worker has nothing more for now, or the end.
            while not exhausted and len(self._pool) < self.capacity:
                request = next(requests, _END)
                if request is _END:
                    exhausted = True
                elif request is None:
                    break
                else:
                    failed = self._admit(request)
                    if failed is not None:
                        errors.append(failed)
            if not self._pool:
                if errors or not exhausted:
                    yield errors  # the worker sends None only while rows are unfinished: these
                if exhausted:
                    return
                continue
            # Steps 2 and 3.
            batch = pick_batch(self._pool, self.limits)
            taken = {id(r) for r in batch}
            self._pool = [r for r in self._pool if id(r) not in taken]
            yield errors + self._generate(batch)

    def abort(self, chunk: str | None = None) -> None:
        if chunk is None:
            self._aborted = True
        self._pool = [r for r in self._pool if chunk is not None and r.request.chunk != chunk]

    def close(self) -> None:
        self.abort()

    # -- one request ---------------------------------------------------------------------------
    def _admit(self, request: EngineRequest) -> RowResult | None:
        """Into the pool, or the row's error."""
        if request.kind in POOLING_KINDS:
            return error_row(
                request,
                "unsupported_url",
                "/v1/embeddings, /v1/score and /v1/rerank need the vLLM engine with model.runner: pooling",
            )
        if any(isinstance(m["content"], list) for m in request.messages or []):
            return error_row(request, "unsupported_content", "images need the vLLM engine", "messages")
        p = request.params
        if p.presence_penalty or p.frequency_penalty:
            return error_row(
                request,
                "unsupported_parameter",
                "presence/frequency penalties need the vLLM engine",
                "presence_penalty" if p.presence_penalty else "frequency_penalty",
            )
        if p.constraint is not None or request.tools is not None:
            param = "tools" if request.tools is not None else p.constraint.source if p.constraint else None
            return error_row(
                request,
                "unsupported_parameter",
                f"{param} needs the vLLM engine (model.engine: vllm): transformers cannot constrain or parse output",
                param,
            )
        refused = "prompt" if request.prompts else _vllm_only(p)
        if refused is not None:
            return error_row(request, "unsupported_parameter", f"{refused} needs the vLLM engine", refused)
        vocab = self.model.config.vocab_size
        if any(not 0 <= token < vocab for token, _ in p.logit_bias):
            return error_row(request, "invalid_parameter", f"logit_bias: token ids are 0 to {vocab - 1}", "logit_bias")
        if isinstance(request.prompt, tuple) and any(token >= vocab for token in request.prompt):
            return error_row(request, "invalid_prompt", f"prompt: token ids are 0 to {vocab - 1}", "prompt")
        prompt = self.prompts.build(request)
        if isinstance(prompt, RowResult):
            return prompt
        key = batch_key(p)
        if key is None:  # a seeded sample: alone, so that the seed alone decides it
            self._alone += 1
            key = ("alone", self._alone)
        self._pool.append(_Ready(request, prompt.token_ids, key))
        return None

    # -- one batch -------------------------------------------------------------------------------
    def _generate(self, batch: list[_Ready]) -> list[RowResult]:
        p = batch[0].request.params  # the batch shares all but max_tokens and stop (batch_key)
        inputs = self.tokenizer.pad({"input_ids": [r.ids for r in batch]}, return_tensors="pt").to(self.device)
        limits = [r.request.params.max_tokens for r in batch]
        if p.seed is not None and p.temperature > 0:
            torch.manual_seed(p.seed)
        kwargs: dict[str, Any] = dict(
            max_new_tokens=max(limits),
            min_new_tokens=p.min_tokens or None,
            num_return_sequences=p.n,
            do_sample=p.temperature > 0,
            repetition_penalty=p.repetition_penalty,
            pad_token_id=self.tokenizer.pad_token_id,
            return_dict_in_generate=True,
            output_scores=p.logprobs is not None,
        )
        if p.temperature > 0:
            kwargs.update(temperature=p.temperature, top_p=p.top_p, top_k=p.top_k or None, min_p=p.min_p or None)
        if p.logit_bias:
            kwargs["sequence_bias"] = {(token,): bias for token, bias in p.logit_bias}
        if p.ignore_eos:
            kwargs["eos_token_id"] = None
            kwargs["suppress_tokens"] = [self.tokenizer.eos_token_id]
        prompt_len = inputs["input_ids"].shape[1]
        if min(limits) < max(limits):  # each row stops at its own max_tokens, not the batch's largest
            kwargs["stopping_criteria"] = [_RowLimits(prompt_len, torch.tensor(limits, device=self.device), p.n)]
        with torch.inference_mode():
            out = self.model.generate(**inputs, **kwargs)
        new_tokens = out.sequences[:, prompt_len:].tolist()
        logprobs = torch.stack(out.scores, dim=1).float().log_softmax(-1) if p.logprobs is not None else None
        results = []
        for i, ready in enumerate(batch):
            request = ready.request
            limit = request.params.max_tokens
            choices = [
                self._choice(
                    request.params,
                    new_tokens[i * p.n + j][:limit],
                    logprobs[i * p.n + j] if logprobs is not None else None,
                )
                for j in range(p.n)
            ]
            for choice in choices:
                choice.echo = self.prompts.echo_text(request)
            line = success_line(request, choices, len(ready.ids), self.model_name)
            results.append(
                RowResult(
                    request.index,
                    request.custom_id,
                    line,
                    len(ready.ids),
                    sum(c.tokens for c in choices),
                    False,
                    request.chunk,
                )
            )
        return results

    def _choice(self, p: GenerationParams, ids: list[int], logprobs: Any) -> Choice:
        # `ids` stops at the row's own max_tokens; past an end of sequence, generate pads. A pad
        # token before either is a token the model chose, and stays (it cut answers short before).
        ended = False
        if not p.ignore_eos:
            end = next((at for at, token in enumerate(ids) if token in self.eos_ids), None)
            if end is not None:
                ids, ended = ids[:end], True
        text = self.tokenizer.decode(ids, skip_special_tokens=True)
        # The full text, decoded once, tells whether a stop string is there at all: most rows have none.
        stopped = self._stop_string_at(ids, p.stop) if any(s in text for s in p.stop) else None
        if stopped is not None:
            # The tokens generated up to the one that completed the stop string, as vLLM counts
            # them; re-encoding the cut text would give other tokens, and logprobs of tokens
            # never generated.
            kept, at = stopped
            ids, ended = ids[:kept], True
            text = self.tokenizer.decode(ids, skip_special_tokens=True)[:at]
        token_logprobs = None
        if logprobs is not None:
            token_logprobs = []
            for step, token_id in enumerate(ids):
                row = logprobs[step]
                top = row.topk(p.logprobs) if p.logprobs else None
                token_logprobs.append(
                    TokenLogprob(
                        token=self.tokenizer.decode([token_id]),
                        logprob=float(row[token_id]),
                        top=[(self.tokenizer.decode([int(t)]), float(v)) for v, t in zip(*top, strict=True)]
                        if top is not None
                        else [],
                    )
                )
        return Choice(text=text, finish_reason="stop" if ended else "length", tokens=len(ids), logprobs=token_logprobs)

    def _stop_string_at(self, ids: list[int], stops: Sequence[str]) -> tuple[int, int] | None:
        """(tokens, at): the fewest leading tokens whose text holds one of `stops`, and where the
        first stop string in that text begins. Generation stops on the token that completes a stop
        string, so it is found by bisection over prefixes (a longer prefix keeps what a shorter
        one holds)."""

        def first(count: int) -> int | None:
            text = self.tokenizer.decode(ids[:count], skip_special_tokens=True)
            found = [at for at in (text.find(s) for s in stops) if at >= 0]
            return min(found) if found else None

        lo, hi = 1, len(ids)  # the whole text holds one (the caller checked)
        while lo < hi:
            mid = (lo + hi) // 2
            if first(mid) is None:
                lo = mid + 1
            else:
                hi = mid
        at = first(lo)
        return (lo, at) if at is not None else None


def _vllm_only(p: GenerationParams) -> str | None:
    """The first parameter of the request only vLLM honours (its extensions; echo with logprobs;
    a list of prompts, checked by the caller)."""
    if p.echo and p.logprobs is not None:
        return "echo"
    extensions = p.extensions()
    return extensions[0] if extensions else None


def batch_key(p: GenerationParams) -> tuple[Any, ...] | None:
    """What requests must share to be generated in one call; None for a request generated alone.

    max_tokens is not in it (each row stops at its own), nor are stop strings and echo (applied to
    the text afterwards), nor the sampling settings of a greedy request (unused)."""
    sampled = p.temperature > 0
    if sampled and p.seed is not None:
        return None
    sampling = (p.temperature, p.top_p, p.top_k, p.min_p) if sampled else ()
    return (p.n, p.min_tokens, p.repetition_penalty, p.ignore_eos, p.logprobs is not None, p.logit_bias, *sampling)


# transformers is not installed where the types are checked: its base class is Any there.
class _RowLimits(StoppingCriteria):  # type: ignore[misc]
    """Each row stops after its own number of new tokens."""

    def __init__(self, prompt_len: int, limits: torch.Tensor, n: int):
        self.prompt_len = prompt_len
        self.limits = limits.repeat_interleave(n)  # generate lays a request's n sequences side by side

    def __call__(self, input_ids: torch.Tensor, _scores: Any, **_kwargs: Any) -> torch.Tensor:
        return (input_ids.shape[1] - self.prompt_len) >= self.limits


def _sampling_defaults(config: Any) -> dict[str, Any]:
    """The sampling defaults the model's generation_config.json sets, as vLLM reads them
    (`ModelConfig.get_diff_sampling_param`): only what the file itself sets."""
    keys = ("temperature", "top_p", "top_k", "min_p", "repetition_penalty", "presence_penalty", "frequency_penalty")
    given = config.to_diff_dict()
    return {k: given[k] for k in keys if given.get(k) is not None}


def _split_engine_args(engine_args: dict[str, Any]) -> tuple[dict[str, int], dict[str, Any]]:
    batch, load = {}, {}
    for key, value in engine_args.items():
        if key == "served_model_name":
            continue  # the name outputs carry (served_name), not an argument of from_pretrained
        if key in BATCH_ARGS:
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise SpecError(f"model.engine_args.{key}: expected a positive integer, got {value!r}")
            batch[key] = value
        else:
            load[key] = value
    return batch, load


def _dtype(dtype: str, model: str, device: str) -> torch.dtype:
    """The spec's dtype; "auto" is float32 on a CPU (bfloat16 is slower there) and, on a GPU, the
    checkpoint's half precision, or bfloat16 for a float32 checkpoint (as vLLM does)."""
    named = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
    if dtype in named:
        return named[dtype]
    if device == "cpu":
        return torch.float32
    stored = getattr(AutoConfig.from_pretrained(model), "dtype", None)
    if stored in (torch.bfloat16, torch.float16, "bfloat16", "float16"):
        return named[str(stored).removeprefix("torch.")]
    return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16


def _limits(model: Any, device: str, args: dict[str, int], batch_size: int | None) -> BatchLimits:
    """The spec's limits, and for those it leaves out what fits in MEMORY_SHARE of the memory left."""
    config = model.config.get_text_config()
    elem = next(model.parameters()).element_size()
    layers = config.num_hidden_layers
    heads = config.num_attention_heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
    kv_heads = getattr(config, "num_key_value_heads", None) or heads
    # A token's KV cache in every layer, and the activations one layer holds for it at prefill.
    per_token = elem * (2 * layers * kv_heads * head_dim + 4 * config.hidden_size + 3 * config.intermediate_size)
    budget = int(_free_memory(device) * MEMORY_SHARE)
    # Logprobs keep every step's scores over the vocabulary (float32, then their log-softmax).
    per_step = 8 * config.vocab_size
    return BatchLimits(
        max_batch_size=args.get("max_batch_size") or batch_size or DEFAULT_BATCH_SIZE[device],
        max_batch_tokens=args.get("max_batch_tokens") or max(budget // per_token, 1),
        max_logprob_steps=max(budget // per_step, 1),
    )


def _free_memory(device: str) -> int:
    if device == "cuda":
        free, _total = torch.cuda.mem_get_info()
        return int(free)
    available = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_AVPHYS_PAGES")
    with contextlib.suppress(OSError), open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemAvailable:"):
                available = int(line.split()[1]) * 1024
    return min(available, CPU_MEMORY_CAP)
