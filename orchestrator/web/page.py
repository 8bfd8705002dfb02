"""A run's web page: the status object (`orchestrator.runview.status.derive_status`) as HTML,
with the details read beside it (each worker's log tail and last error, sample answers, error rows:
web/details.py).

One template (templates/run.html, Jinja2 with autoescape: a run or worker named `<script>`, a log
line or a model's answer are shown as text), the run's state in the word `orch status` shows
(RUNNING, COMPLETE...), a chart drawn here as inline SVG, and a few lines of inline script that fetch the page
again and swap its body every `refresh_s` (a `<noscript>` meta refresh without JavaScript), the
only script the Content-Security-Policy lets run (by its hash). No
build step and nothing fetched from elsewhere: clusters without internet see the same page.
"""

from __future__ import annotations

import base64
import hashlib
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from typing import Any

import jinja2
from markupsafe import Markup

from orchestrator.backends.base import JobState
from orchestrator.core.context import RunContext
from orchestrator.runview.sections import RunStatus, WorkerView
from orchestrator.runview.tokens import tokens_line
from orchestrator.runview.words import doing, duration, recovery_line, state_words
from orchestrator.web.details import RunDetails, read_details
from orchestrator.web.snapshots import Snapshot

#: The chart's drawing area, in SVG units.
WIDTH, HEIGHT, LEFT, BOTTOM, TOP, RIGHT = 1200.0, 260.0, 64.0, 30.0, 14.0, 16.0
#: Job states shown as trouble (red) or on their way (amber); the rest is neutral or green.
BAD = frozenset(s for s in JobState if s.value.startswith(("FAILED", "CANCELLED")))
PENDING = frozenset({JobState.PENDING, JobState.STARTING, JobState.RECOVERING, JobState.UNKNOWN})


#: The page's one script: fetch the page again every REFRESH ms and swap its body, until complete.
SCRIPT = """
(function () {
  function again() {
    fetch(location.href, {cache: "no-store", credentials: "same-origin"}).then(function (r) {
      if (!r.ok) { throw new Error(r.status); }
      return r.text();
    }).then(function (text) {
      var next = new DOMParser().parseFromString(text, "text/html").getElementById("status");
      if (next) { document.getElementById("status").replaceWith(next); }
      if (next) { document.getElementById("state").textContent = next.dataset.state; }
      if (next && next.dataset.complete === "true") { return; }
      setTimeout(again, REFRESH);
    }).catch(function () { setTimeout(again, REFRESH); });
  }
  setTimeout(again, REFRESH);
})();
"""


@dataclass(frozen=True)
class Page:
    html: str
    #: The hash of the page's script: the Content-Security-Policy allows that script and no other
    #: (none without one).
    script_hash: str

    @property
    def headers(self) -> dict[str, str]:
        return {
            "Content-Security-Policy": (
                f"default-src 'none'; script-src '{self.script_hash or 'none'}'; style-src 'unsafe-inline'; "
                "img-src 'self' data:; connect-src 'self'; base-uri 'none'; form-action 'none'"
            ),
            "Cache-Control": "no-store",
            "X-Content-Type-Options": "nosniff",
        }


@cache
def template(name: str) -> jinja2.Template:
    """One of templates/: autoescaped (every value shown as text), strict about missing names."""
    env = jinja2.Environment(
        loader=jinja2.PackageLoader("orchestrator.web", "templates"),
        autoescape=True,
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters["duration"] = duration
    return env.get_template(name)


def page_of(snap: Snapshot, context: Callable[[], RunContext | None], refresh_s: float) -> Page:
    """The page of a reading, made once per reading with its details (log tails, samples, error
    rows: web/details.py) read from the run's `context()` (None: the status alone)."""

    def make(s: Snapshot) -> Page:
        ctx = context()
        details = read_details(ctx, s.status) if ctx is not None else None
        return render_page(s.status, details=details, refresh_s=refresh_s, taken_at=s.taken_at, problem=s.problem)

    return snap.view("page", make)


def render_page(
    status: RunStatus,
    *,
    details: RunDetails | None = None,
    now: float | None = None,
    refresh_s: float = 5.0,
    taken_at: float | None = None,
    problem: str | None = None,
) -> Page:
    """The page of one run, as of `taken_at` (when its status was read; `problem`: why a later
    reading failed). The same status gives the same page: a server renders a reading once, however
    many views it answers."""
    now = time.time() if now is None else now
    script = SCRIPT.replace("REFRESH", str(int(refresh_s * 1000)))
    script_hash = "sha256-" + base64.b64encode(hashlib.sha256(script.encode()).digest()).decode()
    html = template("run.html").render(
        s=status,
        d=details or RunDetails(),
        per_m=_per_m(status),
        pct=100 * status.chunks.done / status.chunks.total if status.chunks.total else 100.0,
        chart=chart(status, now),
        workers=[_worker_row(w) for w in status.workers],
        by_state=_by_state(status),
        script=Markup(script),
        refresh_s=max(int(refresh_s), 1),
        taken=time.strftime("%H:%M:%S", time.localtime(taken_at if taken_at is not None else now)),
        taken_at=f"{taken_at if taken_at is not None else now:.3f}",
        problem=problem,
    )
    return Page(html, script_hash)


def _per_m(status: RunStatus) -> dict[str, Any] | None:
    """What a million tokens cost, and `orch status`'s tokens line (runview/tokens.py)."""
    if not (status.tokens.prompt_tokens or status.tokens.generated_tokens):
        return None
    rate = status.cost_per_m_tokens.all.usd_per_m_tokens
    return {
        "value": f"${rate:,.4f}" if rate is not None else "-",
        "line": tokens_line(status.tokens, status.cost_per_m_tokens),
    }


def _worker_row(w: WorkerView) -> dict[str, Any]:
    tone = "bad" if w.state in BAD else "wait" if w.state in PENDING or not isinstance(w.state, JobState) else "ok"
    return {
        "v": w,
        "state": state_words(w),
        "tone": tone,
        "recovery": recovery_line(w),
        "where": "/".join(x for x in (w.cloud, w.region) if x) or "-",
        "spot": {True: "spot", False: "on-demand", None: "-"}[w.spot],
        "progress": f"{w.chunk_rows_done}/{w.chunk_rows}" if w.chunk else "-",
        "beat": duration(w.heartbeat_age_s) + " ago" if w.heartbeat_age_s is not None else "-",
        "doing": doing(w),
    }


def _by_state(status: RunStatus) -> list[tuple[str, int]]:
    counts: dict[str, int] = {}
    for w in status.workers:
        counts[w.state_word] = counts.get(w.state_word, 0) + 1
    return sorted(counts.items())


def chart(status: RunStatus, now: float) -> dict[str, Any]:
    """Chunks done over time as SVG coordinates: a step line from the timeline, the total as a
    ceiling, and with a deadline the uniform line from the run's start to all chunks at the deadline."""
    total = max(status.chunks.total, 1)
    points = status.timeline
    d = status.deadline
    start = points[0][0] if points else now
    if d:
        start = min(start, d.at - d.elapsed_s)
    end = max([now] + [p[0] for p in points])
    deadline_at = start + d.deadline_s if d else None
    if deadline_at is not None and not status.complete:
        end = max(end, deadline_at)
    span = max(end - start, 1.0)

    def x(t: float) -> float:
        return round(LEFT + (t - start) / span * (WIDTH - LEFT - RIGHT), 1)

    def y(chunks: float) -> float:
        return round(HEIGHT - BOTTOM - chunks / total * (HEIGHT - BOTTOM - TOP), 1)

    steps: list[str] = []
    for i, (t, done) in enumerate(points):
        if i:
            steps.append(f"{x(t)},{y(points[i - 1][1])}")
        steps.append(f"{x(t)},{y(done)}")
    if points and not status.complete:
        steps.append(f"{x(now)},{y(points[-1][1])}")  # flat to now: nothing finished since
    return {
        "width": WIDTH,
        "height": HEIGHT,
        "line": " ".join(steps),
        "left": LEFT,
        "right": WIDTH - RIGHT,
        "top": y(total),
        "bottom": y(0),
        "total": status.chunks.total,
        "half": y(total / 2),
        "half_label": f"{total / 2:,.0f}" if total > 1 else "",
        "span": duration(span),
        "deadline": (
            {"x1": x(start), "y1": y(0), "x2": x(deadline_at), "y2": y(total)} if deadline_at is not None else None
        ),
        "empty": not points,
    }
