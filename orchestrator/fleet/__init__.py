"""While paying: starting a run, launching and reconciling workers, following it to its end, deadline
control, zone records, probes and cascade stages in flight."""
