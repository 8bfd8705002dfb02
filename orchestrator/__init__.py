"""orch: offline LLM batch inference on spot GPUs across clouds, every row answered exactly once."""

__version__ = "0.1.0"
