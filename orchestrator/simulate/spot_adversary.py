"""Adversarial spot traces: capacity that comes and goes exactly when a given policy pays the most for it.

Against any policy that decides the same way on the same past (a deterministic one), a trace can be
written after watching it (ROSS, arXiv 2601.14612, proves every deterministic policy Omega(K) times
the hindsight optimum this way, K the on-demand/spot price ratio). `against` writes one for a
single zone, tick by tick, from the policy's last choice:
1. the policy waits for spot: no capacity (the outage goes on until it gives up and pays);
2. it runs on on-demand: capacity (spot is back the tick after it paid for the on-demand start);
3. it has just launched spot: no capacity (the spot it returned to vanishes within its start-up).
The hindsight optimum (spot_optimum) waits one tick longer and runs the rest on spot; the policy
watched ends up on on-demand. A randomized policy, its threshold drawn from a seed the trace cannot
know, is caught only when its draw falls where the watched one's did.
"""

from __future__ import annotations

from orchestrator.simulate.spot_replay import Choice, PolicyFactory, View, deadline_ticks, replay
from orchestrator.simulate.spot_traces import Job, Trace


class _Recorder:
    """Wraps a policy and keeps every choice it makes."""

    def __init__(self, make: PolicyFactory, seed: str) -> None:
        self.policy = make(seed)
        self.choices: list[Choice] = []

    def choose(self, view: View) -> Choice:
        choice = self.policy.choose(view)
        self.choices.append(choice)
        return choice


def _capacity_after(choices: list[Choice]) -> bool:
    """Rules 1-3 of the module docstring: capacity in the next tick, from the choices so far."""
    if not choices or choices[-1].market == "none":
        return False
    if choices[-1].market == "on-demand":
        return True
    returned = len(choices) < 2 or choices[-2].market != "spot"
    return not returned


def against(make: PolicyFactory, job: Job, gap_s: float, *, seed: str = "adversary") -> Trace:
    """A one-zone trace written against the policy `make(seed)` (module docstring). The policy sees
    tick t's capacity before choosing in it, so its choices up to t depend on ticks 0..t only: each
    tick is fixed by replaying the prefix, the ticks after it padded (their choices are not read)."""
    limit = deadline_ticks(job, gap_s)
    up: list[bool] = []
    for _ in range(limit):
        padded = tuple(up + [False] * (limit - len(up)))
        recorder = _Recorder(make, seed)
        replay(job, Trace("adversary", ("z0",), gap_s, (padded,)), recorder)
        up.append(_capacity_after(recorder.choices[: len(up)]))
    return Trace(f"adversary of {seed}", ("z0",), gap_s, (tuple(up),))
