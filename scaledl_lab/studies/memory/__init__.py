"""The memory family's studies (notebook 09): mixed precision's underflow and accuracy
(:mod:`.precision_study`) and activation recomputation's memory against its extra compute
(:mod:`.recompute_study`); the techniques themselves are :mod:`scaledl_lab.strategies.memory`
and :mod:`scaledl_lab.training.precision`."""
