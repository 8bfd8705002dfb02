"""A probe's defaults: the share of a run's rows it takes and what all its candidates may spend.

Kept apart from the probe's launcher (fleet/probe_launch.py) so that the CLI can show them as its
options' defaults without importing the launcher (every `orch` command reads this module)."""

#: The spending cap of all candidates' probes together, in USD (`--probe-budget`).
PROBE_BUDGET_USD = 20.0
#: The share of the run's rows a probe takes by default (`--probe-share`; at least `--probe-rows`).
PROBE_SHARE = 0.01
