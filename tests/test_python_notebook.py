"""examples/labelling.ipynb runs in a real kernel (`jupyter nbconvert --execute`), on the demo's model.

Apart from test_python_api.py so that the suite's workers (one test file each) run them side by side.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DEMO_MODEL = ROOT / ".cache" / "models" / "smollm2-135m-instruct"


@pytest.mark.slow
def test_the_labelling_notebook_runs_in_a_real_kernel(tmp_path):
    """examples/labelling.ipynb, executed by `jupyter nbconvert --execute` in a project laid out as
    the repository (the demo's model under .cache): its table holds every ticket, typed."""
    if not (DEMO_MODEL / ".built").exists():
        pytest.fail("the demo's model is missing: run `make models` (make test does it)")
    (tmp_path / "examples").mkdir()
    (tmp_path / ".cache").symlink_to(ROOT / ".cache")
    notebook = tmp_path / "examples" / "labelling.ipynb"
    notebook.write_bytes((ROOT / "examples" / "labelling.ipynb").read_bytes())
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [str(ROOT / ".venv" / "bin" / "jupyter"), "nbconvert", "--to", "notebook", "--execute", "--inplace",
         "--ExecutePreprocessor.timeout=1500", str(notebook)],
        env=env, capture_output=True, text=True, timeout=1800,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-4000:]
    cells = json.loads(notebook.read_text())["cells"]
    shown = [
        "".join(output.get("data", {}).get("text/plain", "")) + "".join(output.get("text", ""))
        for cell in cells
        if cell["cell_type"] == "code"
        for output in cell.get("outputs", [])
    ]
    assert not any(o.get("output_type") == "error" for c in cells for o in c.get("outputs", []))
    table = next(text for text in shown if "category" in text and "urgent" in text)
    assert all(ticket in table for ticket in ("T1", "T2", "T3", "T4")), table
    assert "labelled 4 tickets" in "\n".join(shown)
