"""The model-parallel family's studies (notebook 11): the pipeline schedules side by side, and
tensor against sequence parallelism (:mod:`.study`); the technique itself is
:mod:`scaledl_lab.strategies.model_parallel`."""
