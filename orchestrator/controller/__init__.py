"""The controller: launching workers, reconciling them until the run is complete, cancelling them."""
