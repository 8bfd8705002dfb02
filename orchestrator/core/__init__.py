"""The shared core: what the controller and the GPU worker both need, and nothing heavier.

errors (and how they reach a user), the run spec, the store contract and its backends, the run's
typed documents (records), and the exactly-once protocol (layout, leases, claims, checkpoints,
parts, heartbeats). It imports no CLI framework, no SkyPilot, no vLLM: `lint-imports` checks it.
"""
