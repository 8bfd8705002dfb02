"""The suite's own layout: no test module (nor a benchmark) imports a test module or a conftest; what
they share lives in tests/support/ and tests/conftest.py. (import-linter's module patterns take whole
names only, so no contract can say "any test_* module": the imports are read here instead.) And
the suite's own machinery: xdist's grouping, and a test server's start."""

from __future__ import annotations

import ast
import random
import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.models import REPO
from tests.support.ports import free_port
from tests.support.s3servers import SeaweedFS
from tests.support.schedule import LONGEST_FIRST


def imported_modules(path: Path) -> set[str]:
    """Every module the file imports, at its top or inside a function, by its absolute name."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
    return names


def is_test_module(name: str) -> bool:
    parts = name.split(".")
    return parts[0] == "tests" and any(p.startswith("test_") or p == "conftest" for p in parts[1:])


def test_suite_no_test_module_or_benchmark_imports_a_test_module_or_a_conftest():
    files = [*(REPO / "tests").rglob("*.py"), *(REPO / "bench").glob("*.py")]
    found = {
        str(path.relative_to(REPO)): sorted(name for name in imported_modules(path) if is_test_module(name))
        for path in files
    }
    assert {path: names for path, names in found.items() if names} == {}
    assert len(files) > 50  # the walk saw the suite


def test_suite_reading_imports_sees_what_a_file_imports(tmp_path):
    """The check above can fail: a test module importing another, at the top and inside a function."""
    module = tmp_path / "test_x.py"
    module.write_text("from tests.test_faults import orch\n\ndef f():\n    import tests.worker.conftest\n")
    assert sorted(filter(is_test_module, imported_modules(module))) == [
        "tests.test_faults",
        "tests.test_faults.orch",
        "tests.worker.conftest",
    ]
    assert not is_test_module("tests.support.cli") and not is_test_module("orchestrator.test_like")


def test_suite_schedule_names_only_test_files_that_exist():
    """A file renamed or removed would silently drop out of the longest-first order."""
    missing = [name for name in LONGEST_FIRST if not (REPO / "tests" / name).is_file()]
    assert not missing, f"tests/support/schedule.py's LONGEST_FIRST names files that are not there: {missing}"


def test_suite_xdist_group_keeps_a_group_on_one_worker(tmp_path):
    """`make test` keeps each module that shares a server of its own on one xdist worker with
    `--dist loadgroup` and the module's `xdist_group` mark. pytest 9.2 undid that silently (xdist
    3.8 still writes the old node id, pytest-dev/pytest-xdist#1386): every worker then started
    the module's server. Two groups of tests here, each of which must run on a single worker."""
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    (tmp_path / "test_grouped.py").write_text(
        "import pytest, time\n"
        "@pytest.mark.xdist_group('one')\n@pytest.mark.parametrize('i', range(6))\n"
        "def test_one(i):\n    time.sleep(0.05)\n"
        "@pytest.mark.xdist_group('two')\n@pytest.mark.parametrize('i', range(6))\n"
        "def test_two(i):\n    time.sleep(0.05)\n"
    )
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-n", "2", "--dist", "loadgroup", "-v", "-p", "no:cacheprovider"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    workers: dict[str, set[str]] = {"one": set(), "two": set()}
    for worker, test in re.findall(r"\[(gw\d+)\] .*PASSED test_grouped\.py::test_(one|two)\[", done.stdout):
        workers[test].add(worker)
    assert [len(w) for w in workers.values()] == [1, 1], (workers, done.stdout[-3000:])


@pytest.mark.slow
def test_suite_seaweedfs_first_start_moves_off_ports_taken_after_they_were_picked(tmp_path):
    """A test's SeaweedFS picks free ports, then `weed` binds them: another server picking at the
    same moment can take one in between (seen once at the suites' start, "Port allocation failed:
    port 16311 for Master"). Its first start then moves to new ports; a restart keeps them."""
    weed = SeaweedFS(tmp_path / "weed")
    picked = list(weed.ports)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", picked[0]))  # the master's port, taken before `weed` binds it
        taken.listen()
        try:
            server = weed.start()
            assert weed.ports != picked
            server.client().list_buckets()
            weed.stop()
            assert weed.start().endpoint == server.endpoint  # a restart: the same ports
        finally:
            weed.stop()
    assert b"Port allocation failed" in (tmp_path / "weed" / "weed.log").read_bytes()


@pytest.mark.slow
def test_suite_orch_serve_start_moves_off_a_port_taken_after_it_was_picked(tmp_path, monkeypatch):
    """The same race for `orch serve` (tests/support/serving.py): the port it was given is taken, so
    it exits at once, and its start tries another."""
    from tests.support import serving

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        first = taken.getsockname()[1]
        picks = iter([first])
        monkeypatch.setattr(serving, "free_port", lambda: next(picks, None) or free_port())
        with serving.running_server(tmp_path / "serve", str(tmp_path / "store")) as server:
            assert server.port != first
            assert server.client().models.list().data
    assert b"address already in use" in (tmp_path / "serve" / "server.log").read_bytes().lower()


def test_suite_a_port_picked_by_one_test_process_is_not_picked_by_another_until_it_exits(monkeypatch):
    """The picker itself keeps two of the suites' processes off one port (tests/support/ports.py): a
    port another process picked, and has not bound yet, is passed over while that process lives."""
    from tests.support import ports

    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys; from tests.support.ports import free_port; print(free_port(), flush=True); sys.stdin.read()",
        ],
        cwd=REPO,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdin is not None
        held = int(holder.stdout.readline())
        tried: list[int] = []
        draw = random.Random().randrange

        def held_first(low: int, high: int) -> int:
            tried.append(held if not tried else draw(low, high))
            return tried[-1]

        monkeypatch.setattr(ports.random, "randrange", held_first)
        picked = ports.free_port()
        assert tried[0] == held and picked != held  # free to bind, but another's
        holder.stdin.close()
        assert holder.wait(timeout=60) == 0
    finally:
        holder.kill()
    tried.clear()
    assert ports.free_port() == held  # its picker has exited: the port is free again
