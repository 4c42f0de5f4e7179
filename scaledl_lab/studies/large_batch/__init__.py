"""The large-batch family's study (notebook 07): the claims and figures (:mod:`.report`) and the
reproductions that run them (:mod:`.study`); the technique itself is
:mod:`scaledl_lab.strategies.large_batch`."""
