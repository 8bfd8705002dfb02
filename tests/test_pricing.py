"""The GPU table: prices per cloud, spot and on-demand, names as machines report them, overrides."""

from __future__ import annotations

import pytest

from orchestrator.core.errors import SpecError
from orchestrator.planning.pricing import load_gpu_table


def test_gpu_table_has_the_default_candidates_with_dated_prices():
    table = load_gpu_table()
    assert table.date.startswith("20")
    for name in ["L4", "L40S", "A10G", "A100", "A100-80GB"]:
        gpu = table.get(name)
        assert 0 < gpu.spot_usd_h < gpu.on_demand_usd_h
    assert table.get("A100").relative_speed / table.get("L4").relative_speed == pytest.approx(3.6)


def test_gpu_price_is_the_named_clouds_or_the_cheapest():
    l4 = load_gpu_table().get("L4")
    assert l4.price(spot=False, cloud="aws") == 0.80
    assert l4.price(spot=False) == 0.71  # gcp is cheaper


def test_gpu_names_reported_by_machines_are_recognised():
    table = load_gpu_table()
    assert table.find("NVIDIA L4").name == "L4"
    assert table.find("NVIDIA A100-SXM4-80GB").name == "A100-80GB"
    assert table.find("NVIDIA A100-SXM4-40GB").name == "A100"
    assert table.find("NVIDIA L40S").name == "L40S"
    assert table.find("cpu") is None


def test_price_table_override_is_validated(tmp_path):
    bad = tmp_path / "p.yaml"
    bad.write_text(
        "date: x\nsource: y\ngpus:\n  T4:\n    relative_speed: 0.5\n    memory_gb: 16\n    prices:\n      aws: {on_demand: 0.5, spt: 0.2}\n"
    )
    with pytest.raises(SpecError, match=r"gpus\.T4\.prices\.aws"):
        load_gpu_table(bad)
    good = tmp_path / "g.yaml"
    good.write_text(
        "date: x\nsource: y\ngpus:\n  T4:\n    relative_speed: 0.5\n    memory_gb: 16\n    prices:\n      aws: {on_demand: 0.5, spot: 0.2}\n"
    )
    assert load_gpu_table(good).price("T4", spot=True) == 0.2
    with pytest.raises(SpecError, match="unknown GPU type"):
        load_gpu_table(good).get("L4")
