"""The commands the README and the docs pages show run: every `$ ` line of a ```console block, in a
project laid out as the pages assume, exits 0, unless the block is marked `<!-- not run: why -->` on
the line before it (a cloud, a Slurm cluster, a server that runs until stopped).

The pages build on each other (the quickstart's run is the one the operations page's worker and
`orch status -f examples/demo.yaml` read), so they run in one project, in the order of PAGES:
- `.cache/demo/data` holds one LMSys-shaped conversation (one chunk: a local launch starts one worker,
  one vLLM engine), `.cache/models/smollm2-135m-instruct`, `.venv-worker` and `examples/` are the
  repository's own;
- the default store is make demo's (`ORCH_STORE=.cache/demo/store`), and answers are short
  (`ORCH_SAMPLING__MAX_TOKENS`), both through the environment layer every command reads;
- a file a page shows with `cat FILE` or `head -N FILE` is written from the lines it shows;
- `orch launch` returns while its workers go on: the test then waits as a user would, with `orch watch`.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
#: Pages whose runs later pages read come first; any other page runs after them.
PAGES = ["README.md", "docs/quickstart.md", "docs/labelling.md", "docs/operations.md"]
DEMO_MODEL = ROOT / ".cache" / "models" / "smollm2-135m-instruct"
NOT_RUN = re.compile(r"<!-- not run: (.+?) -->")
BLOCK = re.compile(r"^(?:(<!-- not run: .+? -->)\n)?```console\n(.*?)^```", flags=re.S | re.M)
SHOWN_FILE = re.compile(r"(?:cat|head -\d+) (\S+)$")
COMMAND_TIMEOUT_S = 600  # a guard against a hang, not a pace: the slowest command takes about a minute


@dataclass
class Command:
    """One `$ ` line of a page (continuations joined), and the lines the page shows it print."""

    page: str
    line: str
    shown: list[str]


def pages() -> list[Path]:
    others = sorted(p.relative_to(ROOT).as_posix() for p in DOCS.glob("*.md"))
    return [ROOT / name for name in dict.fromkeys([*PAGES, *others])]


def commands(page: Path) -> list[Command]:
    """The commands of the page's console blocks that are not marked `not run`, in page order."""
    name = page.relative_to(ROOT).as_posix()
    found: list[Command] = []
    for mark, body in BLOCK.findall(page.read_text()):
        if mark:
            continue
        lines = body.splitlines()
        while lines:
            line = lines.pop(0)
            if not line.startswith("$ "):
                continue
            command = line[2:]
            while command.endswith("\\") and lines:
                command = command[:-1] + " " + lines.pop(0).strip()
            shown = []
            while lines and not lines[0].startswith("$ "):
                shown.append(lines.pop(0))
            found.append(Command(name, command, shown))
    return found


def write_demo_data(directory: Path) -> None:
    """One conversation in the demo's shape (make demo writes 200 with scripts/demo_data.py)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    directory.mkdir(parents=True)
    turn = [{"role": "user", "content": "What is the capital of France?"}]
    table = pa.table({"conversation_id": ["demo-0000"], "conversation": [turn]})
    pq.write_table(table, directory / "train-00000-of-00001.parquet")


@pytest.fixture
def project(tmp_path: Path) -> Path:
    """A folder laid out as the repository root after `make demo`'s data step."""
    assert (DEMO_MODEL / "config.json").exists(), f"{DEMO_MODEL}: build it with `make models`"
    (tmp_path / ".cache" / "models").mkdir(parents=True)
    (tmp_path / ".cache" / "models" / DEMO_MODEL.name).symlink_to(DEMO_MODEL)
    (tmp_path / ".cache" / "models" / "tiny-llama").symlink_to(DEMO_MODEL.parent / "tiny-llama")  # a second model
    (tmp_path / ".venv-worker").symlink_to(ROOT / ".venv-worker")
    (tmp_path / "examples").symlink_to(ROOT / "examples")
    write_demo_data(tmp_path / ".cache" / "demo" / "data")
    return tmp_path


def environment(project: Path) -> dict[str, str]:
    env = dict(os.environ)
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"  # this environment's `orch`
    env["PYTHONPATH"] = str(ROOT)
    env["ORCH_HOME"] = str(project / "home")
    env["ORCH_STORE"] = ".cache/demo/store"
    env["ORCH_SAMPLING__MAX_TOKENS"] = "24"
    return env


def wait_command(launch: str) -> str | None:
    """`orch watch` for the run a detached `orch launch` started, or None for any other command."""
    words = shlex.split(launch, comments=True)
    if words[:2] != ["orch", "launch"] or {"--follow", "--dry-run"} & set(words):
        return None
    kept = [w for i, w in enumerate(words) if {w, words[i - 1]} & {"--run", "--store", "-f"}]
    return shlex.join(["orch", "watch", *kept, "--interval", "1"])


def run(command: str, where: str, project: Path, env: dict[str, str]) -> None:
    done = subprocess.run(
        ["bash", "-c", command],
        cwd=project,
        env=env,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=COMMAND_TIMEOUT_S,
    )
    said = (done.stdout + done.stderr)[-3000:]
    assert done.returncode == 0, f"{where}: `{command}` exited {done.returncode}:\n{said}"


@pytest.mark.slow
@pytest.mark.real_engine  # the demo path: the docs' commands on SmolLM2
def test_docs_every_unmarked_console_command_runs(project):
    env = environment(project)
    ran = 0
    for page in pages():
        for command in commands(page):
            shown_file = SHOWN_FILE.search(command.line)
            if shown_file and not (project / shown_file[1]).exists():
                (project / shown_file[1]).write_text("".join(f"{line}\n" for line in command.shown))
            run(command.line, command.page, project, env)
            then = wait_command(command.line)
            if then:
                run(then, f"{command.page} (waiting for the launch)", project, env)
            ran += 1
    assert ran >= 10, ran  # the quickstart alone shows a whole run


def test_docs_not_run_marks_each_stand_before_a_console_block():
    for page in pages():
        text = page.read_text()
        marks = NOT_RUN.findall(text)
        marked = [mark for mark, _ in BLOCK.findall(text) if mark]
        assert len(marks) == len(marked), f"{page.name}: a `not run` mark not right before a ```console block"


def test_docs_commands_parse_continuations_and_shown_files():
    page = DOCS / "labelling.md"
    shown = {c.line.split()[-1]: c for c in commands(page) if c.line.startswith(("cat", "head"))}
    assert shown["label.json"].shown[0].startswith('{"type": "object"')
    runs = [c.line for c in commands(page) if c.line.startswith("orch run")]
    assert len(runs) == 3  # the first day, week 2, the comparison
    assert all("--template" in line and "\\" not in line.replace("\\n", "") for line in runs)
