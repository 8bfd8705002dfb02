"""After: a run's answers into one output in input order (a file, a table, a lake), the answer index
later runs reuse, and the error-rate policy."""
