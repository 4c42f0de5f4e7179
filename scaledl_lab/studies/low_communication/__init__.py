"""The low-communication family's study (notebook 10): synchronous SGD against DiLoCo and
Streaming DiLoCo on a simulated cross-data-centre link, with the verdicts (:mod:`.study`); the
technique itself is :mod:`scaledl_lab.strategies.low_communication`."""
