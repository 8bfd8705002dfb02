"""A Gantt chart per policy: one row per worker, work, lost (redone later), restart, waiting, idle tail."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from orchestrator.core.tempfiles import AtomicFile
from orchestrator.simulate.results import FleetResult

COLOURS = {"work": "#4c9f70", "lost": "#d1495b", "restart": "#edae49", "wait": "#8d99ae", "idle": "#e9ecef"}
LABELS = {
    "work": "work",
    "lost": "lost (redone later)",
    "restart": "restart (provision, setup, load)",
    "wait": "waiting for capacity",
    "idle": "idle tail (exited, not billed)",
}


def plot_gantt(results: Sequence[FleetResult], path: str | Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    horizon = max(r.makespan_s for r in results) / 3600
    workers = max(len(r.workers) for r in results)
    fig, axes = plt.subplots(
        len(results), 1, figsize=(12, 1.2 + 0.28 * workers * len(results)), sharex=True, squeeze=False
    )
    for ax, result in zip(axes[:, 0], results, strict=True):
        for seg in result.segments:
            ax.barh(
                seg.worker,
                (seg.end - seg.start) / 3600,
                left=seg.start / 3600,
                height=0.7,
                color=COLOURS[seg.kind],
                linewidth=0,
            )
        for w in result.workers:
            if w["exited_at"] is not None and w["exited_at"] < result.makespan_s:
                ax.barh(
                    w["worker"],
                    (result.makespan_s - w["exited_at"]) / 3600,
                    left=w["exited_at"] / 3600,
                    height=0.7,
                    color=COLOURS["idle"],
                    linewidth=0,
                )
        ax.axvline(result.lower_bound_s / 3600, color="black", linestyle="--", linewidth=1)
        ax.set_yticks(range(len(result.workers)), [f"{w['worker']} {w['gpu']}" for w in result.workers], fontsize=7)
        ax.invert_yaxis()
        ax.set_title(
            f"{result.policy}: makespan {result.makespan_s / 3600:.1f} h = {result.ratio:.2f}x the lower bound"
            f" (dashed), {result.lost_gpu_h:.1f} GPU-h lost, ${result.cost_usd:,.0f}",
            fontsize=9,
        )
        ax.set_xlim(0, horizon * 1.02)
    axes[-1, 0].set_xlabel("hours")
    fig.legend(
        handles=[Patch(color=COLOURS[k], label=LABELS[k]) for k in COLOURS], loc="lower center", ncol=5, fontsize=8
    )
    fig.tight_layout(rect=(0, 0.04, 1, 1))
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with AtomicFile(path) as out:  # never a half-drawn PNG under the name
        fig.savefig(out.file, dpi=110, format="png")
    plt.close(fig)
    return path
