"""Ports for servers a test starts on a port it names (SkyPilot's API server, SeaweedFS, `orch serve`).

They are picked below the kernel's ephemeral range: a port in that range can be taken at any time by
an outgoing connection of another test (the kernel hands them out), and a server given one then fails
to bind ("Port 46580 is not available", SkyPilot's default, seen in CI). Below the range only another
test picking the same port can collide. A random pick among ~20,000 made that rare, not impossible: a
server binds its ports a moment after they were picked, and with the suites' servers starting at once
another test found the same port free in between ("Port allocation failed: port 16311 for Master").
So a picked port is also reserved, by a lock on a file named after it that the picking process holds
until it exits; no other test process picks it while that lasts."""

from __future__ import annotations

import fcntl
import random
import socket
from pathlib import Path
from typing import IO

#: Ports below this are left alone: well-known and registered services (Slurm's 6817, ...).
LOWEST = 10000
#: Where the suites' processes reserve the ports they picked: a file per port, locked by its picker. A
#: fixed place, not $TMPDIR, so that every picker sees every reservation whatever its environment.
RESERVATIONS = Path("/tmp/orch-test-ports")
#: The reservations this process holds (their locks go when it exits).
_held: list[IO[bytes]] = []


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
        wanted = ports + [p + twin_offset for p in ports] if twin_offset else ports
        if all(map(_free, wanted)) and _reserve(wanted):
            return ports
    raise RuntimeError(f"no {count} free ports below the ephemeral range {ephemeral_range()}")


def free_port() -> int:
    return free_ports(1)[0]


def _reserve(ports: list[int]) -> bool:
    """Reserve every one of `ports` for this process, or none if another process holds one of them."""
    RESERVATIONS.mkdir(exist_ok=True)
    got: list[IO[bytes]] = []
    for port in ports:
        lock = (RESERVATIONS / str(port)).open("ab")
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            lock.close()
            for other in got:
                other.close()
            return False
        got.append(lock)
    _held.extend(got)
    return True


def _free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


if __name__ == "__main__":  # scripts/local-slurm picks its daemons' ports by the same rule
    print(free_port())
