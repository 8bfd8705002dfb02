"""The README's commands are real: every `orch <command> --flag` it shows is one the CLI takes."""

from __future__ import annotations

import re
from pathlib import Path

from orchestrator.cli import cli

README = Path(__file__).resolve().parents[1] / "README.md"


def readme_command_lines() -> list[str]:
    """The text after each `orch ` in the README's code (fenced blocks and inline spans), one
    command line each (backslash continuations joined)."""
    text = README.read_text().replace("\\\n", " ")
    code = re.findall(r"```[a-z]*\n(.*?)```", text, flags=re.S)
    code += re.findall(r"`([^`\n]+)`", re.sub(r"```.*?```", "", text, flags=re.S))
    command = r"(?:^|[\s$/])orch ([a-z][a-z-]*(?![\w:.-])[^\n]*)"  # not `orch serve:` in the store's layout
    return [m for block in code for m in re.findall(command, block, flags=re.M)]


def test_readme_every_orch_command_and_flag_exists():
    lines = readme_command_lines()
    assert len(lines) > 20, lines  # the README shows a whole run
    for line in lines:
        name = line.split()[0]
        assert name in cli.commands, f"README: `orch {line}`: no command {name!r}"
        taken = {opt for p in cli.commands[name].params for opt in (*p.opts, *p.secondary_opts)}
        for flag in re.findall(r"(?<![\w-])--[a-z][a-z0-9-]*", line.split("#")[0]):
            assert flag in taken, f"README: `orch {line}`: orch {name} takes no {flag}"
