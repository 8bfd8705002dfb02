"""The README's and docs pages' commands are real: every `orch <command> --flag` they show is one the CLI takes."""

from __future__ import annotations

import re
from pathlib import Path

from orchestrator.cli import cli

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def readme_command_lines() -> list[str]:
    """The text after each `orch ` in the pages' code (fenced blocks and inline spans), one
    command line each (backslash continuations joined)."""
    text = "\n".join(page.read_text() for page in PAGES).replace("\\\n", " ")
    code = re.findall(r"```[a-z]*\n(.*?)```", text, flags=re.S)
    code += re.findall(r"`([^`\n]+)`", re.sub(r"```.*?```", "", text, flags=re.S))
    command = r"(?:^|[\s$/])orch ([a-z][a-z-]*(?![\w:./-])[^\n]*)"  # not `orch serve:` in the store's layout
    return [m for block in code for m in re.findall(command, block, flags=re.M)]


def test_readme_every_orch_command_and_flag_exists():
    lines = readme_command_lines()
    assert len(lines) > 20, lines  # the pages show a whole run
    for line in lines:
        name = line.split()[0]
        assert name in cli.commands, f"docs: `orch {line}`: no command {name!r}"
        taken = {opt for p in cli.commands[name].params for opt in (*p.opts, *p.secondary_opts)}
        for flag in re.findall(r"(?<![\w-])--[a-z][a-z0-9-]*", line.split("#")[0]):
            assert flag in taken, f"docs: `orch {line}`: orch {name} takes no {flag}"
