"""LoRA adapters shipped with the run: copied once from the launching machine, fetched and checked by workers."""

from __future__ import annotations

import pytest

from orchestrator.core.errors import OrchError, SpecConflict
from orchestrator.core.layout import RunLayout
from orchestrator.core.protocol.adapters import fetch_adapters, ship_adapters
from orchestrator.core.store import open_store

L = RunLayout("r")


@pytest.fixture(params=["local", pytest.param("seaweedfs", marks=pytest.mark.slow)])
def store(request, tmp_path):
    from tests.support.s3servers import make_store_uri

    return open_store(make_store_uri(request.param, request, tmp_path))


def adapter(directory, weights=b"\x00\x01weights"):
    (directory / "nested").mkdir(parents=True)
    (directory / "adapter_config.json").write_text('{"r": 8}')
    (directory / "adapter_model.safetensors").write_bytes(weights)
    (directory / "nested" / "extra.txt").write_text("kept")
    return str(directory)


def test_adapters_shipped_once_reach_the_worker_byte_for_byte(store, tmp_path):
    source = adapter(tmp_path / "mine")
    spec = {"mine": source, "hub": "org/some-adapter"}
    assert ship_adapters(store, L, spec) == ["mine"]
    assert ship_adapters(store, L, spec) == []  # launched again: nothing to copy
    paths = fetch_adapters(store, L, spec, tmp_path / "cache")
    assert paths["hub"] == "org/some-adapter"  # a hub id is downloaded where it runs, like the model
    local = tmp_path / "cache" / "r"
    assert paths["mine"].startswith(str(local)) and paths["mine"] != source
    for name in ("adapter_config.json", "adapter_model.safetensors", "nested/extra.txt"):
        assert (tmp_path / "cache" / paths["mine"] / name).read_bytes() == (tmp_path / "mine" / name).read_bytes()
    # A restarted worker reuses its copy.
    assert fetch_adapters(store, L, spec, tmp_path / "cache") == paths


def test_adapters_changed_after_shipping_are_refused(store, tmp_path):
    source = adapter(tmp_path / "mine")
    ship_adapters(store, L, {"mine": source})
    (tmp_path / "mine" / "adapter_model.safetensors").write_bytes(b"retrained")
    with pytest.raises(SpecConflict, match=r"'mine'.*changed since it was shipped"):
        ship_adapters(store, L, {"mine": source})


def test_adapters_whose_shipped_bytes_changed_are_not_loaded(store, tmp_path):
    ship_adapters(store, L, {"mine": adapter(tmp_path / "mine")})
    store.put(L.adapter_file("mine", "adapter_model.safetensors"), b"tampered")
    with pytest.raises(OrchError, match="does not match its manifest"):
        fetch_adapters(store, L, {"mine": "ignored"}, tmp_path / "cache")
