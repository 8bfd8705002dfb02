"""`orch serve`: the OpenAI Batch API (files, batches) over orch runs, with all its state in the store."""
