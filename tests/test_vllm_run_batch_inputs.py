"""Files shaped like the inputs of vLLM's own run_batch tests (tests/entrypoints/openai/
test_run_batch.py: chat lines with a system prompt, a line naming a model that is not served, a
line for a URL nobody serves, a `stream` given as a string; a file whose line has no custom_id),
through `orch run`, checked for what those tests assert: the run succeeds, every answered line is
a valid `BatchRequestOutput` (vLLM's own type, read in the worker's environment), every line a
valid line for the openai SDK, and each custom_id comes back once.

Where orch answers otherwise, on purpose: a line naming another model is answered by the run's
model (no adapters: docs/requests.md); a line without a custom_id does not fail the
whole file as in vLLM (its test expects a non-zero exit): it is set aside at prepare and answered
with an `invalid_request` line naming file and line, and the other lines are answered; error lines
carry OpenAI's error body in `response.body`, where vLLM's carry none.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from orchestrator.backends.local import default_worker_python
from orchestrator.cli import main
from tests.support.datasets import write_jsonl
from tests.support.openai_lines import check_line

pytestmark = [
    pytest.mark.slow,
    pytest.mark.orch_yaml("workers:\n  heartbeat_interval: 1\n  checkpoint_interval: 1\n"),
]

MODELS = Path(__file__).resolve().parents[1] / ".cache" / "models"


def chat(custom_id, system, *, model="tiny", url="/v1/chat/completions", **body):
    messages = [{"role": "system", "content": system}, {"role": "user", "content": "Good morning!"}]
    return {
        "custom_id": custom_id,
        "method": "POST",
        "url": url,
        "body": {"model": model, "messages": messages, "max_tokens": 40, **body},
    }


def run(workdir: Path, name: str, rows: list[dict]) -> tuple[int, str, list[dict]]:
    data = write_jsonl(workdir / f"{name}.jsonl", rows)
    args = ["run", str(data), "--run", name, "--format", "openai-batch", "--model", str(MODELS / "tiny-llama")]
    args += [
        "--num-chunks",
        "1",
        "--workers",
        "1",
        "--max-error-rate",
        "1.0",
        "--out",
        str(workdir / f"{name}.out.jsonl"),
        "--interval",
        "1",
    ]
    code = main(args)
    assert code == 0
    text = (workdir / f"{name}.out.jsonl").read_text()
    return code, text, [json.loads(line) for line in text.split("\n") if line]


def valid_for_vllm(text: str) -> None:
    """Every answered line read by vLLM's own `BatchRequestOutput`, as its tests read run_batch's
    output. An error line is OpenAI's shape (the error body in `response.body`, as the openai SDK
    reads it), which vLLM's type, with a null body and the error beside it, does not take."""
    text = "".join(line + "\n" for line in text.split("\n") if line and json.loads(line)["error"] is None)
    script = (
        "import sys\nfrom vllm.entrypoints.launchers.run_batch import BatchRequestOutput\n"
        "for line in sys.stdin.read().splitlines():\n    BatchRequestOutput.model_validate_json(line)\n"
    )
    done = subprocess.run([default_worker_python(), "-c", script], input=text, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]


@pytest.mark.real_engine  # what vLLM's run_batch answers, answered alike
def test_vllm_run_batch_inputs_through_orch(workdir, capsys):
    rows = [
        chat("first", "You answer briefly."),
        chat("second", "You answer at length."),
        chat("other-model", "You answer briefly.", model="NoSuchModel"),
        chat("bad-url", "You answer briefly.", url="/no_such_url"),
        chat("streamed", "You answer briefly.", stream="True"),
    ]
    code, text, lines = run(workdir, "vllm-shapes", rows)
    out = capsys.readouterr().out
    assert code == 0, out
    assert [line["custom_id"] for line in lines] == [r["custom_id"] for r in rows]  # each once, in order
    for line in lines:
        check_line(line)
    valid_for_vllm(text)
    errors = {line["custom_id"]: line["error"] for line in lines if line["error"] is not None}
    assert set(errors) == {"bad-url"} and errors["bad-url"]["code"] == "invalid_request"
    assert "/no_such_url" in errors["bad-url"]["message"]


@pytest.mark.real_engine  # what vLLM's run_batch answers, answered alike
def test_vllm_run_batch_invalid_line_is_answered_not_fatal(workdir, capsys):
    good = chat("kept", "You answer briefly.")
    no_id = {k: v for k, v in chat("x", "You answer briefly.").items() if k != "custom_id"}
    code, text, lines = run(workdir, "vllm-invalid", [{"not_custom_id": "x", **no_id}, good])
    out = capsys.readouterr().out
    assert code == 0, out
    assert len(lines) == 2 and lines[1]["custom_id"] == "kept" and lines[1]["error"] is None
    assert lines[0]["error"]["code"] == "invalid_request" and "vllm-invalid.jsonl:1" in lines[0]["error"]["message"]
    for line in lines:
        check_line(line)
    valid_for_vllm(text)
