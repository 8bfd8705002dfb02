"""Ports for servers a test starts on a port it names (SkyPilot's API server, SeaweedFS, `orch serve`).

They are picked below the kernel's ephemeral range: a port in that range can be taken at any time by
an outgoing connection of another test (the kernel hands them out), and a server given one then fails
to bind ("Port 46580 is not available", SkyPilot's default, seen in CI). Below the range only another
test picking the same port can collide, and a random pick among ~20,000 makes that rare."""

from __future__ import annotations

import random
import socket
from pathlib import Path

#: Ports below this are left alone: well-known and registered services (Slurm's 6817, ...).
LOWEST = 10000


def ephemeral_range() -> tuple[int, int]:
    """The kernel's range for automatically assigned ports (Linux's default when it cannot be read)."""
    try:
        low, high = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
        return int(low), int(high)
    except (OSError, ValueError):
        return 32768, 60999


def free_ports(count: int = 1, twin_offset: int = 0) -> list[int]:
    """`count` consecutive free ports outside the ephemeral range; with `twin_offset`, each port's
    twin `port + twin_offset` is free and outside it too (SeaweedFS's gRPC ports)."""
    top = ephemeral_range()[0] - twin_offset - count
    if top <= LOWEST:
        raise RuntimeError(f"no room for {count} ports below the ephemeral range {ephemeral_range()}")
    for _ in range(200):
        base = random.randrange(LOWEST, top)
        ports = list(range(base, base + count))
        if all(_free(p) and (not twin_offset or _free(p + twin_offset)) for p in ports):
            return ports
    raise RuntimeError(f"no {count} free ports below the ephemeral range {ephemeral_range()}")


def free_port() -> int:
    return free_ports(1)[0]


def _free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


if __name__ == "__main__":  # scripts/local-slurm picks its daemons' ports by the same rule
    print(free_port())
