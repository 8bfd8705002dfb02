"""The transformers engine: for machines without vLLM. Same interface, same output lines; correct first.

Requests are taken a window at a time and generated in padded batches of requests that share
their sampling parameters (and seed), so per-request parameters are honoured exactly.
Differences from vLLM, each an error row rather than a different answer: presence/frequency
penalties (transformers has no equivalent), constrained decoding (`response_format` json_object /
json_schema, `structured_outputs`) and `tools`, which need vLLM's grammar backends and tool
parsers. `logit_bias` is honoured (transformers' sequence bias over single tokens).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Generator, Iterator
from typing import Any

from orchestrator.core.spec import ModelSpec
from worker.engine.base import RowResult, take_window
from worker.outputs import Choice, TokenLogprob, error_line, success_line
from worker.requests import EngineRequest, GenerationParams, for_template


class TransformersEngine:
    name = "transformers"

    def __init__(self, spec: ModelSpec, *, max_in_flight: int | None = None, batch_size: int = 16):
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        if not spec.name:
            raise ValueError("no model to load")
        self.torch = torch
        self.model_name = spec.name
        self.device = "cuda" if torch.cuda.is_available() else "cpu"
        dtype = {
            "auto": torch.float32 if self.device == "cpu" else "auto",
            "float32": torch.float32,
            "bfloat16": torch.bfloat16,
            "float16": torch.float16,
        }.get(spec.dtype, "auto")
        self.tokenizer = AutoTokenizer.from_pretrained(spec.name)
        self.tokenizer.padding_side = "left"
        if self.tokenizer.pad_token_id is None:
            self.tokenizer.pad_token = self.tokenizer.eos_token
        self.model = AutoModelForCausalLM.from_pretrained(spec.name, dtype=dtype).to(self.device).eval()
        self.chat_template = spec.chat_template
        self.max_model_len: int = spec.max_model_len or int(getattr(self.model.config, "max_position_embeddings", 2048))
        self.batch_size = batch_size
        # Requests taken (and generated) a window at a time: the window is what it works on at once.
        self.capacity = max_in_flight or 4 * batch_size
        self.accelerator = torch.cuda.get_device_name(0) if self.device == "cuda" else "cpu"
        self._aborted = False
        self._dropped: set[str] = set()

    def run(self, requests: Iterator[EngineRequest | None]) -> Generator[list[RowResult], None, None]:
        self._aborted = False
        while not self._aborted:
            window = take_window(requests, self.capacity)
            if window is None:
                return
            # Chunks given up while this window generates; the worker may take one back later,
            # and then its rows come in a later window.
            self._dropped = set()
            groups: dict[GenerationParams, list[tuple[EngineRequest, list[int]]]] = defaultdict(list)
            errors: list[RowResult] = []
            for request in window:
                prepared = self._prepare(request)
                if isinstance(prepared, RowResult):
                    errors.append(prepared)
                else:
                    groups[request.params].append((request, prepared))
            if errors:
                yield errors
            for params, members in groups.items():
                for start in range(0, len(members), self.batch_size):
                    if self._aborted:
                        return
                    batch = [m for m in members[start : start + self.batch_size] if m[0].chunk not in self._dropped]
                    if batch:
                        yield self._generate(params, batch)

    def abort(self, chunk: str | None = None) -> None:
        if chunk is None:
            self._aborted = True
        else:
            self._dropped.add(chunk)  # its rows still queued in this window are skipped

    def close(self) -> None:
        self.abort()

    def _prepare(self, request: EngineRequest) -> list[int] | RowResult:
        if request.kind == "embedding":
            return _error(request, "unsupported_url", "/v1/embeddings needs the vLLM engine with model.runner: pooling")
        if any(isinstance(m["content"], list) for m in request.messages or []):
            return _error(request, "unsupported_content", "images need the vLLM engine", "messages")
        p = request.params
        if p.presence_penalty or p.frequency_penalty:
            return _error(
                request,
                "unsupported_parameter",
                "presence/frequency penalties need the vLLM engine",
                "presence_penalty" if p.presence_penalty else "frequency_penalty",
            )
        if p.constraint is not None or request.tools is not None:
            param = "tools" if request.tools is not None else p.constraint.source if p.constraint else None
            return _error(
                request,
                "unsupported_parameter",
                f"{param} needs the vLLM engine (model.engine: vllm): transformers cannot constrain or parse output",
                param,
            )
        vocab = self.model.config.vocab_size
        if any(not 0 <= token < vocab for token, _ in p.logit_bias):
            return _error(request, "invalid_parameter", f"logit_bias: token ids are 0 to {vocab - 1}", "logit_bias")
        try:
            if request.kind == "chat":
                template = self.chat_template or getattr(self.tokenizer, "chat_template", None)
                text = self.tokenizer.apply_chat_template(
                    for_template(request.messages or [], template),
                    add_generation_prompt=True,
                    tokenize=False,
                    chat_template=self.chat_template,
                )
                ids = self.tokenizer.encode(text, add_special_tokens=False)
            else:
                ids = self.tokenizer.encode(request.prompt)
        except Exception as e:  # a template that fails on this conversation fails this row only
            return _error(request, "template_error", f"cannot apply the chat template: {e}")
        if len(ids) + p.max_tokens > self.max_model_len:
            return _error(
                request,
                "context_length_exceeded",
                f"this model's maximum context length is {self.max_model_len} tokens; the request has "
                f"{len(ids)} prompt tokens and asks for {p.max_tokens} more",
                "max_tokens",
            )
        return list(ids)

    def _generate(self, p: GenerationParams, members: list[tuple[EngineRequest, list[int]]]) -> list[RowResult]:
        torch = self.torch
        batch = self.tokenizer.pad({"input_ids": [ids for _, ids in members]}, return_tensors="pt").to(self.device)
        if p.seed is not None:
            torch.manual_seed(p.seed)
        kwargs: dict[str, Any] = dict(
            max_new_tokens=p.max_tokens,
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
        with torch.inference_mode():
            out = self.model.generate(**batch, **kwargs)
        prompt_len = batch["input_ids"].shape[1]
        new_tokens = out.sequences[:, prompt_len:]
        logprobs = torch.stack(out.scores, dim=1).float().log_softmax(-1) if p.logprobs is not None else None
        results = []
        for i, (request, ids) in enumerate(members):
            choices = [
                self._choice(p, new_tokens[i * p.n + j], logprobs[i * p.n + j] if logprobs is not None else None)
                for j in range(p.n)
            ]
            line = success_line(request, choices, len(ids), self.model_name)
            results.append(
                RowResult(
                    request.index,
                    request.custom_id,
                    line,
                    len(ids),
                    sum(c.tokens for c in choices),
                    False,
                    request.chunk,
                )
            )
        return results

    def _choice(self, p: GenerationParams, tokens: Any, logprobs: Any) -> Choice:
        eos, pad = self.tokenizer.eos_token_id, self.tokenizer.pad_token_id
        ids = tokens.tolist()
        ended = False
        if not p.ignore_eos and eos in ids:
            ids, ended = ids[: ids.index(eos)], True
        elif pad != eos and pad in ids:
            ids = ids[: ids.index(pad)]
        text = self.tokenizer.decode(ids, skip_special_tokens=True)
        for stop in p.stop:
            at = text.find(stop)
            if at >= 0:
                text, ended = text[:at], True
                ids = self.tokenizer.encode(text, add_special_tokens=False)
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


def _error(request: EngineRequest, code: str, message: str, param: str | None = None) -> RowResult:
    return RowResult(
        request.index,
        request.custom_id,
        error_line(request.custom_id, code, message, param=param),
        0,
        0,
        True,
        request.chunk,
    )
