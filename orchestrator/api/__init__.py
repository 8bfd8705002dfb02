"""orch as a library: what the CLI's commands call, and the Python API built on it (docs/python.md)."""
