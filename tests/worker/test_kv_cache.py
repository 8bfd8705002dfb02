"""vLLM's KV cache on a CPU, sized from the memory free at start (model.kv_cache_fraction), overridable."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from orchestrator.core.spec import ModelSpec
from worker.engine.vllm_engine import (
    KV_CACHE_MAX_BYTES,
    KV_CACHE_MIN_BYTES,
    cpu_kv_cache_size,
    memory_available,
)

GiB = 2**30


def meminfo_available() -> int:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no MemAvailable in /proc/meminfo")


def test_memory_available_is_the_kernels_memavailable():
    before = meminfo_available()
    read = memory_available()
    after = meminfo_available()
    # Other processes allocate meanwhile: the read lies within what the kernel said around it.
    assert min(before, after) - 256 * 2**20 <= read <= max(before, after) + 256 * 2**20
    assert read > 0


def test_kv_cache_is_a_fraction_of_the_free_memory_in_whole_mib():
    size = cpu_kv_cache_size(ModelSpec(name="m", kv_cache_fraction=0.05), available=20 * GiB + 12345)
    assert size.bytes == int((20 * GiB + 12345) * 0.05) // 2**20 * 2**20 == 1024 * 2**20
    assert "0.05 of 20.0 GiB available" in size.why


def test_kv_cache_from_a_real_meminfo_read():
    free = meminfo_available()
    size = cpu_kv_cache_size(ModelSpec(name="m"))  # the default fraction, read now
    expected = min(max(free * ModelSpec(name="m").kv_cache_fraction, KV_CACHE_MIN_BYTES), KV_CACHE_MAX_BYTES)
    assert size.bytes % 2**20 == 0
    assert abs(size.bytes - expected) <= 64 * 2**20  # memory moves between the two reads


def test_kv_cache_bounds_and_the_engine_args_override():
    big = cpu_kv_cache_size(ModelSpec(name="m", kv_cache_fraction=0.5), available=1024 * GiB)
    assert big.bytes == KV_CACHE_MAX_BYTES and "capped at 8 GiB" in big.why
    small = cpu_kv_cache_size(ModelSpec(name="m", kv_cache_fraction=0.01), available=1 * GiB)
    assert small.bytes == KV_CACHE_MIN_BYTES and "64 MiB minimum" in small.why
    fixed = cpu_kv_cache_size(
        ModelSpec(name="m", kv_cache_fraction=0.5, engine_args={"kv_cache_memory_bytes": 300 * 2**20}),
        available=1024 * GiB,
    )
    assert fixed.bytes == 300 * 2**20 and fixed.why == "engine_args.kv_cache_memory_bytes"


def test_kv_cache_fraction_out_of_range_is_refused():
    with pytest.raises(ValueError, match="kv_cache_fraction"):
        ModelSpec(name="m", kv_cache_fraction=0.95)


@pytest.mark.slow
def test_the_engine_gets_the_cache_it_was_given(tiny_model, caplog, keep_alive):
    """The size logged is the size vLLM used: its cache config says so, and its block count is that
    size over the tiny Llama's block (2 layers x K and V x 4 heads x 32 dims x 4 bytes x 128 tokens)."""
    from worker.engine.vllm_engine import VllmEngine

    free = meminfo_available()
    with caplog.at_level(logging.INFO, logger="orch.worker.vllm"):
        engine = VllmEngine(ModelSpec(name=tiny_model, kv_cache_fraction=0.01))
    keep_alive(engine)
    try:
        (note,) = [r.getMessage() for r in caplog.records if r.name == "orch.worker.vllm"]
        mib = int(note.split("vLLM KV cache: ")[1].split(" MiB")[0])
        assert "model.kv_cache_fraction 0.01" in note
        assert abs(mib * 2**20 - 0.01 * free) < 0.01 * 4 * GiB  # other work moves memory by a few GiB at most
        cache = engine.llm.llm_engine.vllm_config.cache_config
        block = 2 * 2 * 4 * 32 * 4 * cache.block_size
        assert cache.kv_cache_memory_bytes == mib * 2**20
        assert cache.num_gpu_blocks == mib * 2**20 // block
    finally:
        engine.close()
