"""collect's temporary files and folders, and the removal of those a killed collect left.

A collect writes its output beside it under a temporary name (core/tempfiles.AtomicFile) and
spills to folders of the temp dir (TMPDIR): lines put back in input order (input_order.py), a
table's rows before they are committed (sinks.py), up to a whole copy of the output. A collect
stopped by SIGKILL removes none of it; each name carries its collect's pid and start time, so the
next collect, as it starts, removes what dead collects left, and never the files of one running
at the same moment (core/tempfiles.remove_abandoned).
"""

from __future__ import annotations

import os

from orchestrator.core.tempfiles import Removed, owned_temp_dir, remove_abandoned, remove_abandoned_beside

#: The start of a collect's folders in the temp dir: `orch-collect-<pid>-<start ticks>-<host>.<random>`.
LEAD = "orch-collect-"


def scratch_dir() -> str:
    """A new folder of this collect's in the temp dir (its caller removes it)."""
    return owned_temp_dir(LEAD)


def remove_leftovers(*outputs: str | os.PathLike[str] | None) -> list[Removed]:
    """Remove what killed collects left in the temp dir, and the temporary files killed processes
    left beside each of `outputs` (files, not tables)."""
    import tempfile

    removed = remove_abandoned(tempfile.gettempdir(), LEAD)
    for out in outputs:
        if out is not None:
            removed += remove_abandoned_beside(out)
    return removed
