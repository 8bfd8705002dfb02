"""Answers already paid for: the keys that decide an answer, the index collect writes, the filter reusing them."""
