"""`orch prices`: the table in use, and its refresh from SkyPilot's catalog (read by SkyPilot's own loader)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from orchestrator.backends.base import Offering
from orchestrator.planning.pricing import load_gpu_table, table_from_offerings
from tests.support.cli import orch

# Rows in the shape of SkyPilot's v8 catalog (`~/.sky/catalogs/v8/<cloud>/vms.csv`).
AWS_VMS = """InstanceType,AcceleratorName,AcceleratorCount,vCPUs,MemoryGiB,GpuInfo,Price,SpotPrice,Region,AvailabilityZone
g6.xlarge,L4,1.0,4.0,16.0,,0.8048,0.3216,us-east-1,use1-az1
g6.xlarge,L4,1.0,4.0,16.0,,0.9776,0.2900,eu-west-1,euw1-az1
g6.12xlarge,L4,4.0,48.0,192.0,,4.6016,1.2000,us-east-1,use1-az1
g5.xlarge,A10G,1.0,4.0,16.0,,1.006,0.4500,us-east-1,use1-az1
p4de.24xlarge,A100-80GB,8.0,96.0,1152.0,,40.96,,us-east-1,use1-az1
m5.large,,,2.0,8.0,,0.096,0.0400,us-east-1,use1-az1
"""
GCP_VMS = """InstanceType,AcceleratorName,AcceleratorCount,vCPUs,MemoryGiB,GpuInfo,Price,SpotPrice,Region,AvailabilityZone
g2-standard-4,L4,1.0,4.0,16.0,L4,0.7068,0.2828,us-central1,us-central1-a
,T4,1.0,,,T4,0.35,0.11,us-central1,us-central1-a
a2-highgpu-1g,A100,1.0,12.0,85.0,A100,3.6731,1.1733,us-central1,us-central1-a
a2-highgpu-1g,A100,1.0,12.0,85.0,A100,4.0490,1.2900,europe-west4,europe-west4-a
"""


def test_prices_from_offerings_are_the_cheapest_gpu_hour_on_the_smallest_machines():
    base = load_gpu_table()
    fresh = table_from_offerings(
        base,
        [
            Offering("L4", "aws", "us-east-1", 1, 0.90, 0.30),
            Offering("L4", "aws", "us-west-2", 1, 0.85, 0.35),
            Offering("L4", "aws", "us-east-1", 4, 3.00, 1.00),  # cheaper per GPU, but a 4-GPU machine
            Offering("a100-80gb", "aws", "us-east-1", 8, 40.96, 16.40),  # only 8-GPU machines
            Offering("L4", "azure", "eastus", 1, 1.00, None),  # a cloud the table did not have, no spot price
            Offering("T4", "aws", "us-east-1", 1, 0.50, 0.20),  # a GPU orch does not know
        ],
        date="2026-11-22",
        source="test",
    )
    l4 = fresh.gpus["L4"]
    assert (l4.prices["aws"].on_demand, l4.prices["aws"].spot) == (0.85, 0.30)  # regions mixed: cheapest of each
    assert (l4.prices["azure"].on_demand, l4.prices["azure"].spot) == (1.00, 1.00)
    assert l4.prices["gcp"] == base.gpus["L4"].prices["gcp"]  # not in the offerings: as it was
    assert (fresh.gpus["A100-80GB"].prices["aws"].on_demand, fresh.gpus["A100-80GB"].prices["aws"].spot) == (5.12, 2.05)
    assert "T4" not in fresh.gpus and l4.relative_speed == base.gpus["L4"].relative_speed
    assert (fresh.date, fresh.source) == ("2026-11-22", "test")


@pytest.fixture
def homes(tmp_path):
    """A HOME for SkyPilot and an ORCH_HOME, with no proxy bypass and usage collection off."""
    env = {k: v for k, v in os.environ.items() if k.lower() not in ("no_proxy", "https_proxy", "http_proxy")}
    env.update(
        HOME=str(tmp_path / "home"), ORCH_HOME=str(tmp_path / "orch-home"), SKYPILOT_DISABLE_USAGE_COLLECTION="1"
    )
    (tmp_path / "home").mkdir()
    return env, tmp_path


@pytest.mark.slow  # SkyPilot's catalog, in its own process
def test_prices_refresh_builds_the_table_from_skypilots_catalog(homes):
    env, tmp = homes
    catalogs = Path(env["HOME"]) / ".sky" / "catalogs" / "v8"
    for cloud, text in (("aws", AWS_VMS), ("gcp", GCP_VMS)):
        (catalogs / cloud).mkdir(parents=True)
        (catalogs / cloud / "vms.csv").write_text(text)  # a catalog in place: SkyPilot reads it as it is
    before = orch("prices", cwd=tmp, env=env)
    assert before.returncode == 0 and f"prices of {load_gpu_table().date}" in before.stdout

    refreshed = orch("prices", "--refresh", "--clouds", "aws,gcp", cwd=tmp, env=env)
    assert refreshed.returncode == 0, refreshed.stderr
    assert "SkyPilot catalog (aws, gcp)" in refreshed.stdout and "(was 0.800 / 0.320)" in refreshed.stdout
    written = Path(env["ORCH_HOME"]) / "prices.yaml"
    assert written.is_file()
    table = load_gpu_table(written)
    # The cheapest region per cloud; 8-GPU machines priced per GPU; no spot listed: the old spot.
    assert (table.gpus["L4"].prices["aws"].on_demand, table.gpus["L4"].prices["aws"].spot) == (0.8048, 0.29)
    assert (table.gpus["L4"].prices["gcp"].on_demand, table.gpus["L4"].prices["gcp"].spot) == (0.7068, 0.2828)
    assert table.gpus["A100"].prices["gcp"].on_demand == 3.6731
    assert (
        table.gpus["A100-80GB"].prices["aws"].on_demand == 5.12 and table.gpus["A100-80GB"].prices["aws"].spot == 2.05
    )
    assert table.gpus["A100"].prices["azure"] == load_gpu_table().gpus["A100"].prices["azure"]  # not refreshed

    # From now on the refreshed table is the one in use.
    after = orch("prices", cwd=tmp, env=env)
    assert "SkyPilot catalog (aws, gcp)" in after.stdout


@pytest.mark.slow  # SkyPilot's catalog, in its own process
def test_prices_refresh_without_a_reachable_catalog_keeps_the_table(homes):
    env, tmp = homes
    # No catalog on disk, and the network refused: SkyPilot cannot fetch one.
    env.update(HTTPS_PROXY="http://127.0.0.1:9", HTTP_PROXY="http://127.0.0.1:9")
    result = orch("prices", "--refresh", "--clouds", "aws", cwd=tmp, env=env)
    assert result.returncode != 0
    assert "aws: SkyPilot's catalog cannot be read" in result.stderr
    assert f"prices stay as in the table of {load_gpu_table().date}" in result.stderr
    assert not (Path(env["ORCH_HOME"]) / "prices.yaml").exists()
    # Said once, plainly: none of SkyPilot's spinner markup or its own log lines.
    everything = result.stdout + result.stderr
    assert "<sky-payload>" not in everything and "Please check your internet" not in everything
    assert "cannot reach raw.githubusercontent.com (no network?)" in result.stderr
    assert result.stderr.count("ERROR") == 1 and result.stdout == ""
