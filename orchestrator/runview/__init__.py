"""The read model: what a run is, read once from the store (and the backend's job list) into typed sections.

Every view derives from it: `orch status`, `orch runs`, collect's report, the web page, `/metrics`
and serve's batch counts. Nothing here writes to the store or decides what to do next.
"""
