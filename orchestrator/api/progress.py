"""`Run.wait`'s progress bar: rows answered of the run's rows, their rate and the time left, errors and cost.

tqdm draws it: a widget in Jupyter (with ipywidgets), a line redrawn in place in a terminal, one
line now and then in a log. Each reconcile tick hands it the run's status (runview); a cascade's
later stage starts a bar of its own. Without tqdm, or with `progress=False`, nothing is drawn and
events go to the `orchestrator` logger.
"""

from __future__ import annotations

import logging
from collections import Counter
from typing import Any

from orchestrator.runview.status import RunStatus

log = logging.getLogger("orchestrator")

#: Worker activities not worth a word beside the bar: nothing of theirs runs.
_IDLE = ("not launched", "finished", "exited", "gone")


def _bar_class() -> Any:
    """tqdm.auto's bar (a widget in Jupyter, text elsewhere) without its monitor thread: a wait
    leaves no thread behind."""
    from tqdm.auto import tqdm

    class Bar(tqdm):  # type: ignore[type-arg]
        monitor_interval = 0

    return Bar


class ProgressBar:
    """One bar per run followed (a cascade's stages each get theirs), made at the first status."""

    def __init__(self, enabled: bool = True):
        self._factory: Any = None
        if enabled:
            try:
                self._factory = _bar_class()
            except ImportError:
                log.warning("no progress bar: tqdm is not installed (pip install tqdm)")
        self._bar: Any = None
        self._run: str | None = None

    def show(self, status: RunStatus) -> None:
        """The bar at the run's status: rows answered (finished, checkpointed or held by live
        workers) of its rows, errors in finished chunks, what its machines cost so far."""
        if self._factory is None:
            return
        answered = status.rows.done + status.rows.in_progress
        total = status.rows.total
        if self._bar is None or self._run != status.run:
            self.close()
            # The rows answered before this wait are its start, not its pace.
            self._bar = self._factory(desc=status.run, total=total, initial=answered, unit="row", dynamic_ncols=True)
            self._run = status.run
        self._bar.total = total
        self._bar.update(answered - self._bar.n)
        said = [f"errors {status.rows.errors:,}", f"${status.cost.so_far_usd:,.2f}"]
        # What the workers do: while they load their model, no row moves and the rate says nothing.
        doing = Counter(w.activity for w in status.workers if w.activity not in _IDLE)
        said.extend(f"{count} {activity}" for activity, count in sorted(doing.items()))
        self._bar.set_postfix_str(", ".join(said), refresh=True)

    def say(self, line: str) -> None:
        """An event (a worker relaunched, a stage begun): under the bar when there is one."""
        if self._bar is not None:
            self._bar.write(line)
        else:
            log.info(line)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None
