"""Our engine: the one round loop, the run that drives it, and its Ray sharding."""
